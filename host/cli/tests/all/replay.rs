//! `wasmsched replay` on its defaults, through the real command.

use super::wasmsched;

#[test]
fn replay_without_arguments_makes_the_queues_contend() {
    let o = wasmsched(&["replay", "--native", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let waited = r["utilisation_mean_while_waiting_percent"].as_f64().expect("jobs waited");
    // The recorded times never fill the cluster (~1 %); the defaults do, and the scheduler keeps it
    // mostly allocated while work waits.
    assert!(waited > 50.0, "{waited}");
    assert!(r["utilisation_peak_percent"].as_f64().unwrap() > 90.0);
    assert!(r["evictions"].as_u64().unwrap() > 0, "preemption acts under contention");
    let delay = r["queues"]["LS"]["delay_mean"].as_f64().unwrap();
    assert!(delay > 0.0, "work queued: {delay}");
}

#[test]
fn a_philly_log_converts_to_a_scenario_that_replays_and_bad_logs_fail_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.json");
    // Two teams; a 16-GPU job (2 × 8 on 8-GPU nodes) and a 4-GPU one, plus a record that never ran.
    std::fs::write(
        &log,
        r#"[{"jobid": "j1", "vc": "vision", "submitted_time": "2017-10-01 00:00:00",
             "attempts": [{"start_time": "2017-10-01 00:00:05", "end_time": "2017-10-01 01:00:05",
                           "detail": [{"ip": "a", "gpus": ["gpu0","gpu1","gpu2","gpu3","gpu4","gpu5","gpu6","gpu7"]},
                                      {"ip": "b", "gpus": ["gpu0","gpu1","gpu2","gpu3","gpu4","gpu5","gpu6","gpu7"]}]}]},
            {"jobid": "j2", "vc": "speech", "submitted_time": "2017-10-01 00:10:00",
             "attempts": [{"start_time": "2017-10-01 00:10:00", "end_time": "2017-10-01 00:20:00",
                           "detail": [{"ip": "c", "gpus": ["gpu0","gpu1","gpu2","gpu3"]}]}]},
            {"jobid": "j3", "vc": "speech", "submitted_time": "2017-10-01 00:10:00", "attempts": []}]"#,
    )
    .unwrap();
    let scenario = dir.path().join("scenario.json");
    let args = ["convert", "philly", log.to_str().unwrap(), "--nodes", "2", "--out", scenario.to_str().unwrap()];
    let o = wasmsched(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("2 jobs in 2 queues on 2 nodes of 8 GPUs; 1 records left out"), "{stderr}");
    let o = wasmsched(&["replay", "--scenario", scenario.to_str().unwrap(), "--native", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The gang holds the whole cluster for its hour; the 4-GPU job arrives 10 minutes in and waits.
    assert_eq!(r["queues"]["vision"]["started"], 1, "{r}");
    assert_eq!(r["queues"]["speech"]["delay_mean"], 3000.0, "{r}");
    assert_eq!(r["horizon_seconds"], 3600 + 600, "{r}");

    std::fs::write(&log, "[{\"jobid\": \"x\", \"submitted_time\": 7}]").unwrap();
    let o = wasmsched(&["convert", "philly", log.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.stdout.is_empty(), "{stderr}");
    assert!(stderr.contains("log.json:1:"), "{stderr}");
}

/// The two-vendor example through the real command and the default (Wasm) policy set: every job
/// runs on its own vendor's devices only, a queue's AMD quota holds back its third AMD job alone,
/// and the usage report splits GPU-hours by vendor.
#[test]
fn two_vendors_share_a_cluster_each_on_its_own_devices() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/two-vendors.yaml");
    let o = wasmsched(&["replay", "--scenario", scenario, "--json", "--quiet", "--events", events.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let peak = report["utilisation_peak_percent"].as_f64().unwrap();
    assert!(peak <= 100.0, "every vendor's devices count in the capacity: {peak}");
    let text = std::fs::read_to_string(&events).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let scheduled: Vec<&serde_json::Value> =
        lines.iter().filter(|e| e["type"] == "io.wasmsched.task.scheduled.v1").map(|e| &e["data"]).collect();
    let mut seen = std::collections::BTreeMap::new();
    for d in &scheduled {
        let (task, node) = (d["task"]["id"].as_str().unwrap(), d["node"].as_str().unwrap());
        let amd = task.starts_with("rocm");
        assert_eq!(node.starts_with("mi300x"), amd, "{task} on {node}");
        assert_eq!(d["gpu_kind"].as_str(), amd.then_some("amd"), "{task}: the event names the vendor");
        seen.insert(task.to_string(), d["time"].clone());
    }
    let start = |task: &str| {
        lines
            .iter()
            .find(|e| e["type"] == "io.wasmsched.task.scheduled.v1" && e["data"]["task"]["id"] == task)
            .map(|e| e["time"].as_str().unwrap().to_string())
    };
    assert_eq!(
        start("rocm-2").as_deref(),
        Some("1970-01-01T00:10:00.000Z"),
        "16 AMD GPUs for research: waits for rocm-0"
    );
    assert_eq!(start("cuda-0").as_deref(), Some("1970-01-01T00:00:20.000Z"), "the AMD quota holds no NVIDIA job back");
    assert_eq!(start("rocm-too-big"), None, "9 AMD GPUs fit no node, and NVIDIA's are never lent");
    assert_eq!(seen.len(), 10, "every other replica ran: {seen:?}");
    let o = wasmsched(&["usage", "--file", events.to_str().unwrap(), "--by", "kind", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let usage: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = usage["rows"].as_array().unwrap();
    let gpu_h =
        |kind: &str| rows.iter().find(|r| r["kind"] == kind).and_then(|r| r["gpu_hours"].as_f64()).unwrap_or_default();
    // AMD: 8 × (600 + 900 + 600) s + 2 × 2 × 300 s = 5 GPU-hours.
    assert!((gpu_h("amd") - 5.0).abs() < 1e-9, "{usage}");
    assert!(gpu_h("nvidia") > 2.0, "{usage}");
}
