//! Python policies through the real command: a replay that rolls out from the Rust
//! `gpu-model-affinity` to its Python version in the middle carries on under the new version, and
//! its events say which version made each decision.

use std::path::Path;
use std::process::Command;

use wasmsched_tests::{fixtures, python};

fn wasmsched(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched")).args(args).output().expect("run wasmsched")
}

/// A policy set `name` of resource-fit and the component at `wasm` as its score, in `dir`.
fn policy_set(dir: &Path, name: &str, wasm: &Path) -> String {
    let file = dir.join(format!("{name}.wasm"));
    std::fs::copy(wasm, &file).unwrap();
    let digest = wasmsched(&["policy", "digest", file.to_str().unwrap()]);
    assert!(digest.status.success());
    let digest = String::from_utf8(digest.stdout).unwrap();
    let yaml = format!(
        "name: {name}\nplugins:\n  fit: {{ source: \"builtin:resource-fit\" }}\n  models:\n    source: \"file:{name}.wasm\"\n    digest: \"{}\"\n    config: \"A100,V100\"\nstages:\n  filter: [fit]\n  score: [{{ plugin: models, weight: 1 }}]\n",
        digest.trim()
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_replay_rolls_out_from_the_rust_policy_to_its_python_version() {
    let dir = tempfile::tempdir().unwrap();
    let rust = policy_set(dir.path(), "gma-rust", Path::new(fixtures::GPU_MODEL_AFFINITY));
    let py = python::component(&python::root().join("examples/plugins/gpu-model-affinity-py"));
    let python = policy_set(dir.path(), "gma-python", &py);
    let events = dir.path().join("events.jsonl");
    let scenario = python::root().join("examples/scenarios/queues-gangs-preemption.yaml");
    let o = wasmsched(&[
        "replay",
        "--scenario",
        scenario.to_str().unwrap(),
        "--policy-set",
        &rust,
        "--rollout",
        &format!("300={python}"),
        "--events",
        events.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["plugin_faults"], 0, "{report}");

    // In order: decisions by the Rust set, the swap, then decisions by the Python set only.
    let mut swapped = false;
    let (mut by_rust, mut by_python) = (0, 0);
    for line in std::fs::read_to_string(&events).unwrap().lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = e["type"].as_str().unwrap();
        let set = e["data"]["policy_set"]["name"].as_str();
        if kind.ends_with(".swapped.v1") {
            swapped = true;
        }
        if kind.ends_with("task.scheduled.v1") {
            match (swapped, set) {
                (false, Some("gma-rust")) => by_rust += 1,
                (true, Some("gma-python")) => by_python += 1,
                other => panic!("a placement by {other:?}: {line}"),
            }
        }
    }
    assert!(swapped, "the rollout went live");
    assert!(by_rust > 0 && by_python > 0, "decisions on both sides of the rollout: {by_rust} / {by_python}");
}
