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
