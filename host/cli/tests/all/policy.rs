//! `wasmsched policy digest` and `policy check`: the offline half of a rollout.

use std::process::{Command, Output};

fn wasmsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched")).env("WASMSCHED_CACHE_DIR", "off").args(args).output().expect("run")
}

#[test]
fn a_pinned_set_passes_check_and_a_tampered_one_names_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("pack.wasm");
    std::fs::write(&wasm, wasmsched_plugins::MOST_ALLOCATED.wasm).unwrap();
    let out = wasmsched(&["policy", "digest", wasm.to_str().unwrap()]);
    assert!(out.status.success());
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");

    let spec = format!(
        "name: packing\nplugins:\n  fit: {{ source: \"builtin:resource-fit\" }}\n  pack: {{ source: \"file:pack.wasm\", digest: \"{digest}\", config: {{ strategy: most }} }}\nstages:\n  filter: [fit]\n  score: [{{ plugin: pack, weight: 2 }}]\n"
    );
    std::fs::write(dir.path().join("policy.yaml"), &spec).unwrap();
    let out = wasmsched(&["policy", "check", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("passes every gate") && stdout.contains(&digest), "{stdout}");

    // One byte less: the digest gate refuses it, by name.
    let bytes = std::fs::read(&wasm).unwrap();
    std::fs::write(&wasm, &bytes[..bytes.len() - 1]).unwrap();
    let out = wasmsched(&["policy", "check", dir.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("plugin pack: digest mismatch"), "{stderr}");

    // A typo in the spec: the field is named.
    std::fs::write(dir.path().join("policy.yaml"), spec.replace("weight: 2", "wieght: 2")).unwrap();
    let out = wasmsched(&["policy", "check", dir.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unknown field `wieght`"), "{stderr}");

    // Control without a scheduler: a clear error, not a hang.
    let out = wasmsched(&["policy", "status", "--nats", "nats://127.0.0.1:1"]);
    assert!(!out.status.success());
}

/// A built-in set printed by `policy builtin` is an operator's starting point: it passes every
/// gate as it is.
#[test]
fn a_printed_builtin_set_passes_every_gate() {
    let out = wasmsched(&["policy", "builtin", "gpu-topology", "--fair-share", "drf", "--preempt"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = String::from_utf8(out.stdout).unwrap();
    assert!(doc.contains("select_devices: gpu-topology") && doc.contains("fair_share: drf"), "{doc}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), &doc).unwrap();
    let out = wasmsched(&["policy", "check", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("policy set gpu-topology passes every gate"));

    let out = wasmsched(&["policy", "builtin", "fdg"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unknown score policy \"fdg\""), "{stderr}");
}

#[test]
fn the_example_policy_set_passes_every_gate() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/policies/packing");
    let out = wasmsched(&["policy", "check", example]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("policy set packing passes every gate"));
}

/// `plugin check` loads a component and calls every stage it exports, one line per stage.
#[test]
fn plugin_check_calls_every_stage_and_reports_each() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("fit.wasm");
    std::fs::write(&wasm, wasmsched_plugins::RESOURCE_FIT.wasm).unwrap();
    let out = wasmsched(&["plugin", "check", wasm.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("budgets  10ms CPU per call"), "{stdout}");
    assert!(stdout.contains("plugin   resource-fit (registered here as fit)\n"), "its own name first: {stdout}");
    let filter = stdout.lines().find(|l| l.trim_start().starts_with("filter")).expect("a line for the filter stage");
    assert!(filter.contains(" ok ") && filter.contains("nodes fit"), "{filter}");
    assert!(filter.contains(" ms, then "), "both calls' costs: {filter}");

    let named = wasmsched(&["plugin", "check", wasm.to_str().unwrap(), "--name", "resource-fit"]);
    assert!(String::from_utf8_lossy(&named.stdout).contains("plugin   resource-fit\n"));

    // Not a component: a clear error and a failure exit.
    std::fs::write(&wasm, b"not wasm").unwrap();
    let out = wasmsched(&["plugin", "check", wasm.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid WebAssembly component"));
}
