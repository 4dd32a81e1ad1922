//! The reduced paper grid through the real command: the default openb trace × the six policies ×
//! one seed, as Wasm components and natively. Asserts the paper's ordering at 130 % arrived and
//! that results do not depend on the runtime or thread timing.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::wasmsched;

fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn grid(out: &Path, extra: &[&str]) -> serde_json::Value {
    let out_arg = out.to_str().unwrap();
    let mut args =
        vec!["experiment", "--traces", "default", "--seeds", "42", "--jobs", "2", "--json", "--out", out_arg];
    args.extend_from_slice(extra);
    let o = wasmsched(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("summary JSON")
}

#[test]
fn reduced_grid_orders_policies_like_the_paper_and_is_deterministic() {
    let wasm_dir = out_dir("grid-wasm");
    let summary = grid(&wasm_dir, &[]);
    assert_eq!(summary["experiments"], 6);
    assert_eq!(summary["runtime"], "wasm");
    assert_eq!(summary["fgd_not_best_at_130"], serde_json::json!([]), "FGD must lead at 130 % arrived");
    let at_130 = |policy: &str| {
        summary["table"].as_array().unwrap().iter().find(|r| r["policy"] == policy).unwrap()["alloc_130_mean"]
            .as_f64()
            .unwrap()
    };
    // The paper's Fig. 9(a) shape: FGD > BestFit > the packing family > DotProd > Random.
    assert!(at_130("fgd") > at_130("best-fit"));
    for p in ["gpu-packing", "gpu-clustering", "dot-prod"] {
        assert!(at_130("best-fit") > at_130(p), "best-fit vs {p}");
        assert!(at_130(p) > at_130("random"), "{p} vs random");
    }
    assert!(at_130("fgd") > 94.0 && at_130("random") < 90.0, "fgd {} random {}", at_130("fgd"), at_130("random"));
    let figures = ["allocation_default.svg", "allocation_default_zoom.svg", "fragmentation_default.svg"];
    for f in ["table.csv", "allocation.csv", "fragmentation.csv"].into_iter().chain(figures.map(|f| f)) {
        let path = if f.ends_with(".svg") { wasm_dir.join("figures").join(f) } else { wasm_dir.join(f) };
        assert!(path.is_file(), "{f} written");
    }
    let svg = std::fs::read_to_string(wasm_dir.join("figures/allocation_default.svg")).unwrap();
    assert!(svg.contains("fgd") && svg.matches("<polyline").count() >= 6, "one curve per policy with a legend");
    for f in figures {
        let svg = std::fs::read_to_string(wasm_dir.join("figures").join(f)).unwrap();
        assert!(svg.contains("openb default (1 seed, tune 1.3, Wasm)"), "every parameter in the title of {f}");
        let png = std::fs::read(wasm_dir.join("figures").join(f).with_extension("png")).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{f} as PNG too");
    }
    // `--redraw` draws the same figures from the CSVs alone, without running anything.
    let svg_before = std::fs::read(wasm_dir.join("figures/allocation_default_zoom.svg")).unwrap();
    for f in figures {
        std::fs::remove_file(wasm_dir.join("figures").join(f)).unwrap();
    }
    let o = wasmsched(&["experiment", "--redraw", "--out", wasm_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(wasm_dir.join("figures/allocation_default_zoom.svg")).unwrap(), svg_before);
    let o = wasmsched(&["experiment", "--redraw", "--out", "/nonexistent/run"]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("give --out the folder of an earlier run")
    );

    // Same experiments natively: every column of every series identical.
    let native_dir = out_dir("grid-native");
    let native = grid(&native_dir, &["--native"]);
    assert_eq!(native["runtime"], "native");
    for f in ["allocation.csv", "fragmentation.csv", "fragmentation_ratio.csv"] {
        let (a, b) = (std::fs::read(wasm_dir.join(f)).unwrap(), std::fs::read(native_dir.join(f)).unwrap());
        assert!(a == b, "{f} differs between Wasm and native");
    }
}

/// `fgd-cpu` (docs/openb/fgd-cpu.md) allocates more than FGD on the default trace, seed by seed,
/// the same as a component and natively.
#[test]
fn fgd_cpu_allocates_more_than_fgd_as_wasm_and_native() {
    let run = |out: &Path, native: bool| -> serde_json::Value {
        let mut args = vec!["experiment", "--traces", "default", "--policies", "fgd,fgd-cpu", "--seeds", "42-44"];
        args.extend(["--jobs", "2", "--json", "--out", out.to_str().unwrap()]);
        if native {
            args.push("--native");
        }
        let o = wasmsched(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("summary JSON")
    };
    let wasm_dir = out_dir("fgd-cpu-wasm");
    let wasm = run(&wasm_dir, false);
    let native_dir = out_dir("fgd-cpu-native");
    run(&native_dir, true);
    let (a, b) = (
        std::fs::read(wasm_dir.join("allocation.csv")).unwrap(),
        std::fs::read(native_dir.join("allocation.csv")).unwrap(),
    );
    assert!(a == b, "fgd-cpu's series differ between Wasm and native");
    let gain = &wasm["fgd_cpu_over_fgd_at_130"];
    let row = &gain["traces"][0];
    assert_eq!((row["workload"].as_str(), row["seeds"].as_u64()), (Some("default"), Some(3)), "{gain}");
    assert!(row["mean_difference"].as_f64().unwrap() > 0.1, "{gain}");
    assert_eq!(gain["better"], 1, "above the seeds' standard error: {gain}");
    // Seed by seed, not only on average.
    let csv = String::from_utf8(a).unwrap();
    let at_130 = |policy: &str, seed: &str| -> f64 {
        let row = csv.lines().find(|l| l.starts_with(&format!("default,{policy},1.3,{seed},"))).unwrap();
        row.rsplit(',').next().unwrap().parse().unwrap()
    };
    for seed in ["42", "43", "44"] {
        assert!(at_130("fgd-cpu", seed) > at_130("fgd", seed), "seed {seed}");
    }
}

#[test]
fn malformed_traces_fail_with_their_location_unless_lenient() {
    let data = out_dir("bad-trace");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/traces/openb/openb_node_list_gpu_node.csv"),
        data.join("openb_node_list_gpu_node.csv"),
    )
    .unwrap();
    std::fs::write(
        data.join("openb_pod_list_tiny.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\np2,1000,lots,1,500\np3,2000,1024,2,1000\n",
    )
    .unwrap();
    let d = data.to_str().unwrap();
    let out = data.join("out");
    let o = wasmsched(&[
        "experiment",
        "--data",
        d,
        "--traces",
        "tiny",
        "--policies",
        "fgd",
        "--seeds",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("openb_pod_list_tiny.csv:3:3: memory_mib"), "{err}");

    let o = wasmsched(&[
        "experiment",
        "--data",
        d,
        "--traces",
        "tiny",
        "--policies",
        "fgd,best-fit",
        "--seeds",
        "1",
        "--native",
        "--lenient",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let skipped = summary["skipped_rows"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].as_str().unwrap().contains(":3:3:"));

    for bad in [["--policies", "fastest"], ["--seeds", "9-1"]] {
        let o =
            wasmsched(&["experiment", "--data", d, "--traces", "tiny", bad[0], bad[1], "--out", out.to_str().unwrap()]);
        assert!(!o.status.success(), "{bad:?} accepted");
    }
}

#[test]
fn replay_runs_the_example_scenario_and_rejects_a_broken_one() {
    let o = wasmsched(&["replay", "--scenario", "examples/scenarios/two-queues.json", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["jobs"], 5);
    assert_eq!(r["runtime"], "wasm");
    // train-2 (4 A100s) waits for train-1 (all 8) to finish at 3600 s.
    assert_eq!(r["queues"]["research"]["delay_p99"], 3480);
    assert_eq!(r["queues"]["prod"]["started"], 2);

    let dir = out_dir("bad-scenario");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("s.json");
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/two-queues.json"))
            .unwrap()
            .replace("\"queue\": \"prod\", \"arrival\": 60", "\"queue\": \"ops\", \"arrival\": 60");
    std::fs::write(&bad, text).unwrap();
    let o = wasmsched(&["replay", "--scenario", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown queue \"ops\""));
}

#[test]
fn a_policy_set_of_ones_own_joins_the_grid_and_places_as_the_same_built_ins() {
    let dir = out_dir("grid-policy-set");
    // examples/policies/packing is resource-fit + most-allocated: the same curves as the built-in.
    let summary = grid(&dir, &["--policies", "most-allocated", "--policy-set", "mine=examples/policies/packing"]);
    assert_eq!(summary["policies"], serde_json::json!(["most-allocated", "mine"]));
    assert_eq!(summary["experiments"], 2);
    let rows = summary["table"].as_array().unwrap();
    let row = |p: &str| rows.iter().find(|r| r["policy"] == p).unwrap().clone();
    let (builtin, mine) = (row("most-allocated"), row("mine"));
    assert!(builtin["alloc_130_mean"].as_f64().unwrap() > 50.0, "{builtin}");
    for key in ["alloc_100_mean", "alloc_130_mean"] {
        assert_eq!(builtin[key], mine[key], "{key}");
    }
    let csv = std::fs::read_to_string(dir.join("allocation.csv")).unwrap();
    let series =
        |p: &str| csv.lines().find(|l| l.split(',').nth(1) == Some(p)).unwrap().split_once(p).unwrap().1.to_string();
    assert_eq!(series("most-allocated"), series("mine"), "every column of the series");

    // Refused before the grid starts, with the reason.
    let refused = |extra: &[&str], needle: &str| {
        let mut args = vec!["experiment", "--traces", "default", "--seeds", "42", "--out", "/nonexistent/out"];
        args.extend_from_slice(extra);
        let o = wasmsched(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{extra:?}: {err}");
    };
    refused(
        &["--policies", "fgd", "--policy-set", "fgd=examples/policies/packing"],
        "already has a policy of that name",
    );
    refused(&["--policy-set", "x=/nonexistent/policy"], "fetch gate");
    refused(&["--native", "--policy-set", "x=examples/policies/packing"], "cannot be used with");
    refused(&["--policy-set", "examples/policies/packing"], "expected NAME=PATH");
}

/// From any directory: the traces are found in the checkout the binary was built from; a wrong
/// `--data` names the file once and the flag.
#[test]
fn experiment_runs_from_any_directory_and_a_missing_trace_is_named_once() {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = out_dir("grid-elsewhere");
    let run = |extra: &[&str]| {
        let mut args = vec!["experiment", "--traces", "default", "--policies", "best-fit", "--seeds", "42"];
        args.extend_from_slice(&["--native", "--json", "--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_wasmsched")).current_dir(elsewhere.path()).args(&args).output().unwrap()
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--data", "/nonexistent"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.contains("/nonexistent/openb_node_list_gpu_node.csv"), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "the cause once: {stderr}");
}

/// A negative number is a value the command refuses by name, not an unknown flag.
#[test]
fn a_negative_tune_is_refused_by_name() {
    for command in ["simulate", "experiment"] {
        let o = wasmsched(&[command, "--tune", "-1", "--native"]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains("--tune must be a positive number"), "{command}: {stderr}");
    }
}
