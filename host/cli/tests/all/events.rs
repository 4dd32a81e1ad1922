//! Events through the real command: `simulate` publishes every decision (to a JSONL file or a real
//! `nats-server`), and `events tail` reads and filters them back.

use crate::support;

use std::process::{Command, Output};

use support::{NatsServer, free_port};

use super::wasmsched;

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// A native simulation of the default trace (20 % of capacity unless `--tune` is given); returns
/// its JSON report.
fn simulate(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["simulate", "--native", "--json"];
    if !extra.contains(&"--tune") {
        args.extend(["--tune", "0.2"]);
    }
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(wasmsched(&args))).unwrap()
}

#[test]
fn simulate_writes_every_decision_and_tail_filters_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let f = file.to_str().unwrap();
    let report = simulate(&["--events", f, "--tune", "1.3"]);
    let (placed, failed) = (report["placed"].as_u64().unwrap(), report["failed"].as_u64().unwrap());
    assert!(placed > 100 && failed > 0, "{report}");
    assert_eq!(report["events"]["delivered"], placed + failed, "one event per decision: {report}");
    assert_eq!(report["events"]["dropped"], 0);

    let all = ok(wasmsched(&["events", "tail", "--file", f]));
    assert_eq!(all.lines().count() as u64, placed + failed);
    let unschedulable = ok(wasmsched(&["events", "tail", "--file", f, "--kind", "task-unschedulable"]));
    assert_eq!(unschedulable.lines().count() as u64, failed);
    for line in unschedulable.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(e["type"], "io.wasmsched.task.unschedulable.v1");
        let reasons = e["data"]["reasons"].as_array().unwrap();
        assert!(!reasons.is_empty() && reasons[0]["nodes"].as_u64().unwrap() > 0, "{line}");
    }
    let first: serde_json::Value = serde_json::from_str(all.lines().next().unwrap()).unwrap();
    let task = first["subject"].as_str().unwrap();
    let about = ok(wasmsched(&["events", "tail", "--file", f, "--task", task, "--format", "text"]));
    assert_eq!(about.lines().count(), 1, "{about}");
    assert!(about.contains(task) && about.contains("task-scheduled"), "{about}");
    assert_eq!(ok(wasmsched(&["events", "tail", "--file", f, "--limit", "5"])).lines().count(), 5);
    assert_eq!(ok(wasmsched(&["events", "tail", "--file", f, "--namespace", "elsewhere"])).lines().count(), 0);

    let bad = wasmsched(&["events", "tail", "--file", f, "--kind", "task-sheduled"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown event kind `task-sheduled`"));
}

#[test]
fn simulate_publishes_to_jetstream_and_tail_reads_the_stream() {
    let server = NatsServer::start(&[]);
    let url = server.url();
    let report = simulate(&["--nats", &url, "--cluster", "cli"]);
    let placed = report["placed"].as_u64().unwrap();
    assert_eq!(report["events"]["delivered"], placed + report["failed"].as_u64().unwrap());

    let scheduled =
        ok(wasmsched(&["events", "tail", "--nats", &url, "--cluster", "cli", "--all", "--kind", "task-scheduled"]));
    assert_eq!(scheduled.lines().count() as u64, placed);
    // `events why` reads the same stream from its start: the first scheduled task is scheduled.
    let first: serde_json::Value = serde_json::from_str(scheduled.lines().next().unwrap()).unwrap();
    let (task, node) = (first["data"]["task"]["id"].as_str().unwrap(), first["data"]["node"].as_str().unwrap());
    let answer = ok(wasmsched(&["events", "why", task, "--nats", &url, "--cluster", "cli"]));
    assert!(answer.starts_with(&format!("{task}: scheduled on {node} at ")), "{answer}");
    let other_cluster = wasmsched(&["events", "tail", "--nats", &url, "--cluster", "other", "--all"]);
    assert!(!other_cluster.status.success(), "no stream for that cluster");
    assert!(String::from_utf8_lossy(&other_cluster.stderr).contains("WASMSCHED_OTHER"));
}

#[test]
fn wrong_credentials_fail_fast_and_an_unreachable_server_does_not_stall_the_run() {
    let server = NatsServer::start(&["--auth", "right"]);
    let o = wasmsched(&["simulate", "--native", "--tune", "0.05", "--nats", &server.url(), "--nats-token", "wrong"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rejected the credentials"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    let started = std::time::Instant::now();
    let url = format!("nats://127.0.0.1:{}", free_port());
    let report = simulate(&["--nats", &url, "--spill-dir", spill.to_str().unwrap()]);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let decisions = report["placed"].as_u64().unwrap() + report["failed"].as_u64().unwrap();
    assert_eq!(report["events"]["delivered"], 0);
    assert_eq!(report["events"]["dropped"], 0, "kept on disk for the next run: {report}");
    assert_eq!(report["events"]["pending"], decisions);
    assert!(std::fs::read_dir(&spill).unwrap().count() > 0);
}

/// With the server away to the end and nowhere to keep the events, the run still reports, then
/// fails with the count of what was lost: a run that lost its events does not exit 0.
#[test]
fn a_run_that_drops_its_events_exits_non_zero_and_says_how_many() {
    let url = format!("nats://127.0.0.1:{}", free_port());
    let o = wasmsched(&["simulate", "--native", "--json", "--tune", "0.05", "--nats", &url, "--events-grace", "0.5"]);
    assert!(!o.status.success(), "exit status must tell the events were lost");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the report is printed first");
    let decisions = report["placed"].as_u64().unwrap() + report["failed"].as_u64().unwrap();
    assert_eq!(report["events"]["dropped"], decisions, "{report}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("events lost: {decisions} of {decisions} dropped")), "{err}");
}

#[test]
fn events_schema_prints_the_documented_schema() {
    let printed = ok(wasmsched(&["events", "schema"]));
    let documented =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/events.schema.json")).unwrap();
    assert_eq!(printed, documented);
}

/// `replay --json --events FILE` of `scenario` with `extra` flags: the report and the events file
/// (kept alive by the returned directory).
fn replay_with_events(scenario: &str, extra: &[&str]) -> (serde_json::Value, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replay.jsonl").to_str().unwrap().to_string();
    let mut args = vec!["replay", "--scenario", scenario, "--json", "--events", &file];
    args.extend_from_slice(extra);
    let report = serde_json::from_str(&ok(wasmsched(&args))).unwrap();
    (report, dir, file)
}

#[test]
fn replay_publishes_each_attempt_in_virtual_time() {
    let (report, _dir, f) = replay_with_events("examples/scenarios/two-queues.json", &["--native"]);
    let f = f.as_str();
    let attempts = report["placement_attempts"].as_u64().unwrap();
    // One event per attempt, one per run that ended, one per change of a queue's deserved share.
    let all = ok(wasmsched(&["events", "tail", "--file", f]));
    let count =
        |t: &str| all.lines().filter(|l| l.contains(&format!("\"type\":\"io.wasmsched.{t}.v1\""))).count() as u64;
    let (placed, refused) = (count("task.scheduled"), count("task.unschedulable"));
    assert_eq!(placed + refused, attempts, "one event per attempt: {report}");
    // Runs without a duration go on past the replay's end.
    assert!((1..=placed).contains(&count("task.ended")), "{all}");
    assert!(count("queue.share-changed") > 0);
    assert_eq!(report["events"]["delivered"], all.lines().count() as u64);

    // train-2 waits for the first training job to leave: unschedulable attempts, then scheduled,
    // numbered, in virtual time order.
    let lines = ok(wasmsched(&[
        "events",
        "tail",
        "--file",
        f,
        "--task",
        "train-2",
        "--kind",
        "task-scheduled,task-unschedulable",
    ]));
    let events: Vec<serde_json::Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(events.len() >= 2, "{lines}");
    let (last, waits) = events.split_last().unwrap();
    assert_eq!(last["type"], "io.wasmsched.task.scheduled.v1");
    for (i, e) in waits.iter().enumerate() {
        assert_eq!(e["type"], "io.wasmsched.task.unschedulable.v1");
        assert_eq!(e["data"]["attempt"], i + 1);
    }
    assert_eq!(last["data"]["attempt"], events.len());
    let times: Vec<&str> = events.iter().map(|e| e["time"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    assert!(times[0].starts_with("1970-01-01T"), "virtual time: {}", times[0]);
}

#[test]
fn replay_publishes_preemptions_with_their_rule_and_checkpoint_and_gang_timeouts() {
    // The gang is given up at its timeout (by default it would be submitted again, and time out
    // again every 60 s).
    let (report, _dir, file) =
        replay_with_events("examples/scenarios/queues-gangs-preemption.yaml", &["--drop-timed-out-gangs"]);
    assert_eq!(report["runtime"], "wasm");
    assert_eq!((report["evictions"].as_u64(), report["gangs_timed_out"].as_u64()), (Some(4), Some(1)), "{report}");
    // Pods evicted (4: a gang's members each) and job runs stopped (2), named apart.
    assert_eq!(report["job_evictions"], 2, "{report}");
    let text = std::fs::read_to_string(&file).unwrap();
    let events: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let preempted: Vec<(String, String, String, String)> = events
        .iter()
        .filter(|e| e["type"] == "io.wasmsched.task.preempted.v1")
        .map(|e| {
            let d = &e["data"];
            let s = |v: &serde_json::Value| v.as_str().unwrap().to_string();
            (s(&d["victim"]["id"]), s(&d["preemptor"]["id"]), s(&d["reason"]), s(&d["checkpoint"]))
        })
        .collect();
    let victims: Vec<&str> = preempted.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(preempted.len(), 3, "one per preemption: {preempted:?}");
    // The fourth eviction: the broken gang's other member, as its own event.
    let evicted: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["type"] == "io.wasmsched.task.evicted.v1").collect();
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(evicted[0]["data"]["reason"], "gang-broken");
    assert!(victims[0].starts_with("batch-fill-") && victims[1].starts_with("prod-low-"), "{victims:?}");
    assert_eq!(&preempted[0].1[..], "prod-train-0");
    assert_eq!((&preempted[0].2[..], &preempted[0].3[..]), ("elastic-shrink", "not-checkpointable"));
    assert_eq!((&preempted[1].1[..], &preempted[1].2[..], &preempted[1].3[..]), ("prod-high", "priority", "done"));
    assert_eq!((&preempted[2].1[..], &preempted[2].2[..]), ("prod-c", "reclaim"));
    // The reclaim says what it moved and cost: batch 8 → 4 GPUs of its deserved 4, prod 0 → 4 of
    // 4, and the victim's 100 s on 4 GPUs thrown away; the other preemptions carry no such figures.
    let reclaim = events
        .iter()
        .find(|e| e["type"] == "io.wasmsched.task.preempted.v1" && e["data"]["reason"] == "reclaim")
        .map(|e| &e["data"]["reclaim"])
        .unwrap();
    let gpus = |q: &str| {
        let m = &reclaim[q];
        (m["before_gpu_milli"].as_u64(), m["after_gpu_milli"].as_u64(), m["deserved_gpu_milli"].as_u64())
    };
    assert_eq!(gpus("victim_queue"), (Some(8000), Some(4000), Some(4000)), "{reclaim}");
    assert_eq!(gpus("preemptor_queue"), (Some(0), Some(4000), Some(4000)), "{reclaim}");
    assert_eq!(reclaim["lost_gpu_seconds"], 400, "{reclaim}");
    let others =
        events.iter().filter(|e| e["type"] == "io.wasmsched.task.preempted.v1" && e["data"]["reason"] != "reclaim");
    assert!(others.clone().count() == 2 && others.into_iter().all(|e| e["data"].get("reclaim").is_none()));
    let timed_out: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["type"] == "io.wasmsched.group.timed-out.v1").collect();
    assert_eq!(timed_out.len(), 1);
    assert_eq!(timed_out[0]["data"]["group"], "too-big");
    assert_eq!(timed_out[0]["data"]["waited_seconds"], 60);
    assert_eq!(timed_out[0]["time"], "1970-01-01T00:07:40.000Z");
    // The quota that kept it out is in its unschedulable event, at the queue stage.
    let why = events
        .iter()
        .find(|e| e["type"] == "io.wasmsched.task.unschedulable.v1" && e["data"]["task"]["id"] == "too-big-0")
        .unwrap();
    assert_eq!(why["data"]["task"]["group"], "too-big");
    assert_eq!(why["data"]["reasons"][0]["stage"], "queue");
    assert!(why["data"]["reasons"][0]["reason"].as_str().unwrap().contains("at capability"), "{why}");

    // The same replay with `--out`: per-job CSV, utilisation and per-queue delay figures.
    let out = tempfile::tempdir().unwrap();
    let out_arg = out.path().to_str().unwrap();
    ok(wasmsched(&["replay", "--scenario", "examples/scenarios/queues-gangs-preemption.yaml", "--out", out_arg]));
    let jobs = std::fs::read_to_string(out.path().join("jobs.csv")).unwrap();
    assert!(jobs.starts_with("job,queue,arrival,start,end,evictions,waiting_reason\n"), "{jobs}");
    assert_eq!(jobs.lines().count(), 1 + 8, "one row per job");
    let delay = std::fs::read_to_string(out.path().join("queue_delay.svg")).unwrap();
    assert!(delay.contains("Queueing delay by queue") && delay.contains("\nprod\n") && delay.contains("\nbatch\n"));
    assert!(std::fs::read_to_string(out.path().join("utilisation.svg")).unwrap().contains("GPU allocation"));

    // `events why` answers from the same file: the gang that never fit, a job that ran.
    let answer = ok(wasmsched(&["events", "why", "too-big-0", "--file", &file]));
    assert!(answer.starts_with("too-big-0: pending; attempt "), "{answer}");
    assert!(answer.contains("\n  queue: queue batch at capability"), "{answer}");
    assert!(answer.contains("its gang timed out at 1970-01-01T00:07:40.000Z after waiting 60 s"), "{answer}");
    let answer = ok(wasmsched(&["events", "why", "prod-high", "--file", &file]));
    assert!(answer.starts_with("prod-high: scheduled on a100-"), "{answer}");
    let unknown = wasmsched(&["events", "why", "nobody", "--file", &file]);
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success() && unknown.stdout.is_empty(), "{stderr}");
    assert!(stderr.contains("no events about task nobody in "), "{stderr}");
}

#[test]
fn replay_rolls_out_a_policy_set_mid_trace_through_the_gates_and_stamps_each_decision_with_its_version() {
    const SCENARIO: &str = "examples/scenarios/queues-gangs-preemption.yaml";
    const PACKING: &str = "examples/policies/packing";
    let (before, _d, _) = replay_with_events(SCENARIO, &["--policy-set", PACKING]);
    assert_eq!(
        (&before["policy"], &before["fair_share"], &before["preemption"]),
        (&"packing".into(), &"none".into(), &false.into())
    );
    assert_eq!(before["evictions"], 0, "packing alone never preempts: {before}");

    // Two broken rollouts: a component whose pinned digest does not match, and a missing set.
    let bad = tempfile::tempdir().unwrap();
    let spec =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/policies/packing/policy.yaml"))
            .unwrap()
            .replace("name: packing", "name: tampered")
            .replace(
                "source: \"builtin:resource-fit\"",
                &format!("source: \"builtin:resource-fit\"\n    digest: \"sha256:{}\"", "0".repeat(64)),
            );
    std::fs::write(bad.path().join("policy.yaml"), spec).unwrap();
    let bad = bad.path().to_str().unwrap();
    let (report, _dir, file) = replay_with_events(
        SCENARIO,
        &[
            "--policy-set",
            PACKING,
            "--rollout",
            "300=examples/policies/reclaim",
            "--rollout",
            &format!("200={bad}"),
            "--rollout",
            "400=/nonexistent/policy",
        ],
    );
    let versions = report["policy_versions"].as_array().unwrap();
    let summary: Vec<(&str, u64, u64)> = versions
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v["version"].as_u64().unwrap(), v["from_seconds"].as_u64().unwrap()))
        .collect();
    assert_eq!(summary, [("packing", 1, 0), ("reclaim", 2, 300)], "{report}");
    assert!(versions.iter().all(|v| v["decisions"].as_u64().unwrap() > 0), "{report}");
    let rejected: Vec<(u64, &str, &str)> = report["rejected_rollouts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["at_seconds"].as_u64().unwrap(), r["gate"].as_str().unwrap(), r["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(rejected.len(), 2, "{report}");
    assert_eq!((rejected[0].0, rejected[0].1), (200, "digest"));
    assert!(rejected[0].2.contains("digest mismatch"), "{rejected:?}");
    assert_eq!((rejected[1].0, rejected[1].1), (400, "fetch"));
    // The rollout preempts from 300 on (prod's high-priority job no longer waits for batch).
    assert!(report["evictions"].as_u64().unwrap() >= 1, "{report}");
    assert!(
        report["queues"]["prod"]["delay_mean"].as_f64() < before["queues"]["prod"]["delay_mean"].as_f64(),
        "{report}"
    );

    // Every decision names the set that made it; the swap and the rejections are events too.
    let events: Vec<serde_json::Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let at = |e: &serde_json::Value| e["time"].as_str().unwrap().to_string();
    let mut stamped = 0;
    for e in events.iter().filter(|e| e["type"].as_str().unwrap().starts_with("io.wasmsched.task.")) {
        let Some(version) = e["data"]["policy_set"]["version"].as_u64() else { continue };
        stamped += 1;
        assert_eq!(version, if at(e).as_str() < "1970-01-01T00:05:00" { 1 } else { 2 }, "{e}");
    }
    let decided: u64 = versions.iter().map(|v| v["decisions"].as_u64().unwrap()).sum();
    assert!(stamped > 0 && stamped as u64 <= decided, "{stamped} of {decided}");
    let of = |t: &str| events.iter().filter(|e| e["type"] == t).collect::<Vec<_>>();
    let swapped = of("io.wasmsched.policy.swapped.v1");
    assert_eq!(swapped.len(), 1);
    assert_eq!(
        (at(swapped[0]).as_str(), &swapped[0]["data"]["from"]["name"], &swapped[0]["data"]["to"]["version"]),
        ("1970-01-01T00:05:00.000Z", &"packing".into(), &2.into())
    );
    let gates: Vec<(String, &serde_json::Value, &serde_json::Value)> = of("io.wasmsched.policy.rejected.v1")
        .into_iter()
        .map(|e| (at(e), &e["data"]["gate"], &e["data"]["policy_set"]["name"]))
        .collect();
    assert_eq!(
        gates,
        [
            ("1970-01-01T00:03:20.000Z".to_string(), &"digest".into(), &"tampered".into()),
            ("1970-01-01T00:06:40.000Z".to_string(), &"fetch".into(), &"".into())
        ]
    );

    // Rejected rollouts change nothing.
    let (only_bad, _d, _) =
        replay_with_events(SCENARIO, &["--policy-set", PACKING, "--rollout", &format!("200={bad}")]);
    assert_eq!(only_bad["queues"], before["queues"]);
    assert_eq!(only_bad["policy_versions"].as_array().unwrap().len(), 1);
    // A starting set that fails a gate stops the replay before it begins, naming the gate.
    let o = wasmsched(&["replay", "--scenario", SCENARIO, "--policy-set", bad]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("digest gate") && err.contains("digest mismatch"), "{err}");
    let o = wasmsched(&["replay", "--scenario", SCENARIO, "--native", "--rollout", "10=examples/policies/reclaim"]);
    assert!(!o.status.success(), "rollouts run as Wasm components");
    let o = wasmsched(&["replay", "--scenario", SCENARIO, "--rollout", "soon=examples/policies/reclaim"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a whole number of seconds"));
}

#[test]
fn simulate_with_a_policy_set_file_places_exactly_as_the_same_built_in_policies() {
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["simulate", "--json", "--tune", "0.6"];
        args.extend_from_slice(extra);
        serde_json::from_str(&ok(wasmsched(&args))).unwrap()
    };
    // examples/policies/packing is resource-fit + most-allocated, as `--policy most-allocated`.
    let file = run(&["--policy-set", "examples/policies/packing"]);
    let builtin = run(&["--policy", "most-allocated"]);
    assert!(file["policies"].as_str().unwrap().starts_with("policy set packing"), "{file}");
    assert!(file["placed"].as_u64().unwrap() > 1000, "{file}");
    for key in ["placed", "failed", "by_arrived_percent"] {
        assert_eq!(file[key], builtin[key], "{key}");
    }
    // The series names its own columns: one row per percent arrived, 0 to 130.
    let rows = file["by_arrived_percent"].as_array().unwrap();
    assert_eq!(rows.len(), 131);
    assert_eq!(rows[50]["arrived_percent"], 50);
    assert!(rows[50]["gpu_allocated_percent"].as_f64().unwrap() > 0.0, "{}", rows[50]);
    assert!(rows[50].get("gpu_fragmented_percent").is_some(), "{}", rows[50]);
    let o = wasmsched(&["simulate", "--policy-set", "examples/policies/packing", "--native"]);
    assert!(!o.status.success(), "policy sets run as Wasm");
    let o = wasmsched(&["simulate", "--policy-set", "/nonexistent/policy"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("fetch gate") && err.contains("/nonexistent/policy"), "{err}");
}

#[test]
fn replay_refuses_a_malformed_job_and_with_lenient_leaves_it_out_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let good =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/two-queues.json"))
            .unwrap();
    let mut scenario: serde_json::Value = serde_json::from_str(&good).unwrap();
    let jobs = scenario["jobs"].as_array_mut().unwrap();
    let kept = jobs.len();
    jobs.push(serde_json::json!({"name": "nowhere", "queue": "no-such-queue", "arrival": 0}));
    let path = dir.path().join("s.json");
    std::fs::write(&path, scenario.to_string()).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["replay", "--native", "--json", "--scenario", path.to_str().unwrap()];
        args.extend(extra);
        Command::new(env!("CARGO_BIN_EXE_wasmsched")).args(&args).output().expect("run")
    };
    let strict = run(&[]);
    assert!(!strict.status.success());
    assert!(
        String::from_utf8_lossy(&strict.stderr).contains("unknown queue"),
        "{}",
        String::from_utf8_lossy(&strict.stderr)
    );
    let lenient = run(&["--lenient"]);
    assert!(lenient.status.success(), "{}", String::from_utf8_lossy(&lenient.stderr));
    let report: serde_json::Value = serde_json::from_slice(&lenient.stdout).unwrap();
    assert_eq!(report["jobs"], kept);
    let skipped = report["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].as_str().unwrap().contains("(nowhere)"), "{skipped:?}");
}
