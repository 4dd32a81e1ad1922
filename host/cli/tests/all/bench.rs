//! `wasmsched bench` at toy sizes: every scenario runs, the JSON report carries it, and the
//! queue-churn scenario decides identically with native and Wasm policies.

use std::process::Command;

/// Time a run spent bringing plugin mirrors to its copy of the cluster, before its clock started.
fn sync_of(run: &serde_json::Value) -> f64 {
    run["mirror_sync_ms"].as_f64().unwrap()
}

#[test]
fn bench_reports_every_scenario_and_the_queue_churn_agrees_across_runtimes() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .args(["bench", "--nodes", "40", "--existing", "10", "--pods", "50", "--repeat", "1", "--gangs", "2"])
        .args(["--gang-size", "3", "--queues", "40", "--queue-nodes", "12", "--queue-rounds", "30", "--json"])
        .arg("--compare-placement")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let runs = report["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["runtime"].as_str().unwrap()).collect();
    assert_eq!(names, ["native", "wasm", "wasm, plain calls"]);
    for r in runs {
        // The same decisions whichever way the plugins are called.
        assert_eq!((&r["placed"], &r["unschedulable"]), (&runs[0]["placed"], &runs[0]["unschedulable"]), "{r}");
        // Mirrors are brought to each run's copy of the cluster before its clock starts; native
        // plugins have none to bring (the catch-up is a loop over them that does nothing).
        assert!(sync_of(r) >= sync_of(&runs[0]), "{r}");
    }
    assert!(sync_of(&runs[1]) > 10.0 * sync_of(&runs[0]), "every node sent to each Wasm plugin: {runs:?}");
    assert!(report["plain_calls_over_native"].as_f64().is_some_and(|r| r > 0.0));
    assert_eq!(report["gangs"].as_array().unwrap().len(), 3, "every policy set");
    let churn = report["queue_churn"].as_array().unwrap();
    assert_eq!(churn.len(), 2);
    let (native, wasm) = (&churn[0], &churn[1]);
    assert_eq!((native["runtime"].as_str(), wasm["runtime"].as_str()), (Some("native"), Some("wasm")));
    assert_eq!(native["queues"], 40);
    for key in ["submitted", "bound", "evicted", "unschedulable", "share_error_mean"] {
        assert_eq!(native[key], wasm[key], "{key} differs between runtimes");
    }
    assert!(native["bound"].as_u64().unwrap() > 0 && native["decisions_per_second"].as_f64().unwrap() > 0.0);
    let error = native["share_error_mean"].as_f64().unwrap();
    assert!((0.0..=2.0).contains(&error), "share error is a fraction of the cluster: {error}");
}

#[test]
fn the_queue_churn_with_borrowing_and_lending_limits_and_flavors_agrees_across_runtimes() {
    let churn = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmsched"));
        cmd.env("WASMSCHED_CACHE_DIR", "off")
            .args(["bench", "--nodes", "10", "--existing", "0", "--pods", "10", "--repeat", "1", "--gangs", "0"])
            .args(["--queues", "40", "--queue-nodes", "12", "--queue-rounds", "30", "--json"])
            .args(extra);
        let out = cmd.output().expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        report["queue_churn"].as_array().unwrap().clone()
    };
    let limited = churn(&["--queue-limits"]);
    let (native, wasm) = (&limited[0], &limited[1]);
    assert_eq!((native["limits"].as_bool(), wasm["limits"].as_bool()), (Some(true), Some(true)));
    for key in ["submitted", "bound", "evicted", "unschedulable"] {
        assert_eq!(native[key], wasm[key], "{key} differs between runtimes");
    }
    // The same arrivals: the limits change what is admitted.
    let free = churn(&[]);
    assert_eq!(free[0]["submitted"], native["submitted"]);
    assert_ne!(
        (&free[0]["bound"], &free[0]["evicted"], &free[0]["unschedulable"]),
        (&native["bound"], &native["evicted"], &native["unschedulable"]),
        "limits that change nothing at 12 nodes × 8 GPUs"
    );
    // Per-flavor quotas (3 flavors of 4 nodes): both runtimes agree, and the quotas bite.
    let flavored = churn(&["--queue-limits", "--queue-flavors", "3"]);
    let (native_f, wasm_f) = (&flavored[0], &flavored[1]);
    assert_eq!(native_f["flavors"], 3);
    for key in ["submitted", "bound", "evicted", "unschedulable"] {
        assert_eq!(native_f[key], wasm_f[key], "{key} differs between runtimes with flavors");
    }
    assert_eq!(native_f["submitted"], native["submitted"]);
    assert_ne!(
        (&native_f["bound"], &native_f["evicted"], &native_f["unschedulable"]),
        (&native["bound"], &native["evicted"], &native["unschedulable"]),
        "per-flavor quotas that change nothing"
    );
}

#[test]
fn events_on_and_off_are_measured_in_whole_runs_and_in_interleaved_blocks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .args(["bench", "--nodes", "40", "--existing", "10", "--pods", "50", "--repeat", "1", "--gangs", "0"])
        .args(["--queues", "0", "--json", "--events", file.to_str().unwrap()])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let interleaved = report["events_interleaved"].as_array().expect("interleaved measurement");
    assert_eq!(interleaved.len(), 2, "native and wasm");
    for i in interleaved {
        // One run asked for, rounded up to a pair that swaps the blocks; four blocks per run.
        assert_eq!((i["runs"].as_u64(), i["block_pods"].as_u64()), (Some(2), Some(13)), "{i}");
        let ratio = i["on_over_off"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{i}");
        assert!(i["pair_min"].as_f64().unwrap() <= i["pair_max"].as_f64().unwrap());
    }
    // Per runtime: one whole run with events (50 decisions), and the interleaved pair, which
    // publishes each of the 50 decisions once between its two runs.
    let lines = std::fs::read_to_string(&file).expect("events file").lines().count();
    assert_eq!(lines, 2 * (50 + 50));
}

#[test]
fn bench_measures_a_live_dashboard_with_open_pages_against_none() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .args(["bench", "--nodes", "300", "--existing", "0", "--pods", "3000", "--repeat", "2", "--gangs", "0"])
        .args(["--queues", "0", "--native-only", "--dashboard-clients", "2", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let d = &report["dashboard"][0];
    assert_eq!((d["runtime"].as_str(), d["clients"].as_u64()), (Some("native"), Some(2)), "{report}");
    // The live side really was live: views built from the run's table, pages answered.
    assert!(d["views"].as_u64().unwrap() > 0, "{d}");
    assert!(d["answers"].as_u64().unwrap() >= 2, "{d}");
    let r = d["on_over_off"].as_f64().unwrap();
    assert!(r > 0.0 && r.is_finite(), "{d}");
}
