//! `wasmsched bench` at toy sizes: every scenario runs, the JSON report carries it, and the
//! queue-churn scenario decides identically with native and Wasm policies.

use std::process::Command;

#[test]
fn bench_reports_every_scenario_and_the_queue_churn_agrees_across_runtimes() {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmsched"))
        .env("WASMSCHED_CACHE_DIR", "off")
        .args(["bench", "--nodes", "40", "--existing", "10", "--pods", "50", "--repeat", "1", "--gangs", "2"])
        .args(["--gang-size", "3", "--queues", "40", "--queue-nodes", "12", "--queue-rounds", "30", "--json"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["runs"].as_array().unwrap().len(), 2, "native and wasm");
    assert_eq!(report["gangs"].as_array().unwrap().len(), 2);
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
