//! `wasmsched scenario from-events`: a replay's own events, turned back into a scenario and
//! replayed with the same policy, give the same placements and the same report — for the shipped
//! scenarios the stream describes whole and for the openb replay — and a stream that cannot say
//! everything (flavors, affinity, topologies, DRA, a window cut mid-run, holes, unknown types)
//! says what it assumed.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::wasmsched;

fn scenario(name: &str) -> String {
    format!("examples/scenarios/{name}")
}

/// Replay `args` with events published to `events`; the report without its timing keys.
fn replay(args: &[&str], events: &Path) -> Value {
    let mut all = vec!["replay", "--native", "--json", "--quiet", "--events", events.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = wasmsched(&all);
    assert!(o.status.success(), "replay {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    let mut report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let fields = report.as_object_mut().unwrap();
    fields.remove("replay_seconds");
    fields.remove("events");
    report
}

/// `scenario from-events` on `args`; whether it exited 0, and its standard error.
fn from_events(args: &[&str]) -> (bool, String) {
    let mut all = vec!["scenario", "from-events"];
    all.extend_from_slice(args);
    let o = wasmsched(&all);
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Every placement of a stream: (virtual ms, task, node, GPU shares), in order.
fn placements(events: &Path) -> Vec<(String, String, String, String)> {
    lines(events)
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "io.wasmsched.task.scheduled.v1")
        .map(|e| {
            let d = &e["data"];
            (e["time"].to_string(), d["task"]["id"].to_string(), d["node"].to_string(), d["gpus"].to_string())
        })
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

fn write(path: PathBuf, lines: &[String]) -> PathBuf {
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_replay_s_events_replay_again_to_the_same_placements_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        ("two-queues", vec!["--scenario".into(), scenario("two-queues.json")], vec![]),
        // Gangs, an elastic job, checkpoints, priority preemption, a gang timing out, a capability.
        ("queues-gangs-preemption", vec!["--scenario".into(), scenario("queues-gangs-preemption.yaml")], vec![]),
        // Gangs that prefer one NVLink domain, then one block, gangs split across domains running
        // 1.5 times as long: the levels and the fabric are the scheduler's settings, given again,
        // and the split gangs' measured run times are divided back (else slowed twice).
        (
            "nvl72",
            vec!["--scenario".into(), scenario("nvl72.yaml")],
            vec![
                "--topology-levels",
                "example.com/block,nvidia.com/gpu.clique",
                "--fabric",
                "nvidia.com/gpu.clique",
                "--spanning-slowdown",
                "1.5",
            ],
        ),
        // NVIDIA and AMD nodes, jobs of each kind, a queue's AMD quota: the kinds, their resources
        // and the quota come back from the stream.
        ("two-vendors", vec!["--scenario".into(), scenario("two-vendors.yaml")], vec![]),
        // 8,152 jobs of the openb trace on half its cluster, contended, with reclaim.
        ("openb", vec![], vec![]),
    ];
    for (name, args, topology) in runs {
        let (first_events, second_events) =
            (dir.path().join(format!("{name}-1.jsonl")), dir.path().join(format!("{name}-2.jsonl")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let first = replay(&args, &first_events);
        let rebuilt = dir.path().join(format!("{name}.yaml"));
        let mut rebuild = vec!["--file", first_events.to_str().unwrap(), "--out", rebuilt.to_str().unwrap()];
        rebuild.extend_from_slice(&topology);
        let (ok, stderr) = from_events(&rebuild);
        assert!(ok, "{name}: {stderr}");
        assert!(!stderr.contains("jobs have") && !stderr.contains("flavors"), "{name}: nothing to assume: {stderr}");
        assert_eq!(stderr.contains("measured run times are divided by 1.5"), name == "nvl72", "{name}: {stderr}");
        let second = replay(&["--scenario", rebuilt.to_str().unwrap()], &second_events);
        assert_eq!(second, first, "{name}: the report of the rebuilt scenario");
        let (a, b) = (placements(&first_events), placements(&second_events));
        assert!(a.len() > 4, "{name}: {} placements", a.len());
        assert_eq!(a, b, "{name}: placements");
    }
}

#[test]
fn work_withdrawn_while_it_waited_is_withdrawn_again_in_the_rebuilt_scenario() {
    // `gang` and `whole` wait behind `first` and are withdrawn (pods deleted) at 40 and 60 s;
    // `late` runs when its withdrawal falls due and runs on.
    let dir = tempfile::tempdir().unwrap();
    let original = scenario("withdrawn.yaml");
    let (first_events, second_events) = (dir.path().join("1.jsonl"), dir.path().join("2.jsonl"));
    let first = replay(&["--scenario", &original], &first_events);
    let withdrawn: Vec<(String, String, u64)> = lines(&first_events)
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "io.wasmsched.task.withdrawn.v1")
        .map(|e| {
            let d = &e["data"];
            (
                e["time"].as_str().unwrap().into(),
                d["task"]["id"].as_str().unwrap().into(),
                d["waited_seconds"].as_u64().unwrap(),
            )
        })
        .collect();
    let at = |s: u64| format!("1970-01-01T00:{:02}:{:02}.000Z", s / 60, s % 60);
    assert_eq!(
        withdrawn,
        [(at(40), "gang-0".into(), 40), (at(40), "gang-1".into(), 40), (at(60), "whole".into(), 40)],
        "one event per pod, when it went"
    );
    let rebuilt = dir.path().join("rebuilt.json");
    let (ok, stderr) = from_events(&["--file", first_events.to_str().unwrap(), "--out", rebuilt.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("2 jobs were withdrawn while they waited"), "{stderr}");
    let scenario: Value = serde_json::from_str(&std::fs::read_to_string(&rebuilt).unwrap()).unwrap();
    let withdraw_at: Vec<(&str, Option<u64>)> = scenario["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["name"].as_str().unwrap(), j["withdraw_at"].as_u64()))
        .collect();
    assert_eq!(
        withdraw_at,
        [("first", None), ("gang", Some(40)), ("small", None), ("whole", Some(60)), ("late", None)],
        "a job that ran was not withdrawn"
    );
    let second = replay(&["--scenario", rebuilt.to_str().unwrap()], &second_events);
    assert_eq!(second, first, "the report of the rebuilt scenario");
    assert_eq!(placements(&first_events), placements(&second_events));
}

#[test]
fn what_the_stream_does_not_carry_is_said_as_assumed() {
    let dir = tempfile::tempdir().unwrap();
    for (file, assumed) in [
        ("flavors.yaml", "use resource flavors"),
        ("pod-affinity.yaml", "inter-pod affinity"),
        ("topology.json", "have a GPU topology"),
        ("dra.yaml", "DRA devices"),
    ] {
        let events = dir.path().join(format!("{file}.jsonl"));
        replay(&["--scenario", &scenario(file)], &events);
        let out = dir.path().join(format!("{file}.json"));
        let (ok, stderr) = from_events(&["--file", events.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert!(ok, "{file}: {stderr}");
        assert!(stderr.contains("assumed: ") && stderr.contains(assumed), "{file}: {stderr}");
        // What it wrote is a scenario the replay reads.
        let o = wasmsched(&["replay", "--native", "--json", "--quiet", "--scenario", out.to_str().unwrap()]);
        assert!(o.status.success(), "{file}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn a_window_cut_mid_run_holes_and_unknown_types_are_said_and_bad_lines_refused() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("qgp.jsonl");
    replay(&["--scenario", &scenario("queues-gangs-preemption.yaml")], &events);
    let all = lines(&events);

    // From virtual second 30: batch-fill (0–100 s) and prod-train (10–60 s) are running.
    let out = dir.path().join("cut.json");
    let (ok, stderr) = from_events(&[
        "--file",
        events.to_str().unwrap(),
        "--from",
        "1970-01-01T00:00:30Z",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("assumed: 2 jobs were running when the window opened"), "{stderr}");
    let cut: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let job = |name: &str| cut["jobs"].as_array().unwrap().iter().find(|j| j["name"] == name).cloned();
    let fill = job("batch-fill").expect("a run going at the cut is in the scenario");
    assert_eq!((fill["arrival"].as_u64(), fill["duration"].as_u64()), (Some(0), Some(70)), "{fill}");
    assert_eq!(job("prod-high").unwrap()["arrival"], 190, "arrivals count from the window's start");
    // Taken over where it ran: the replay of the cut starts it there at 0, without an attempt.
    let ran_on = |events: &[String], task: &str| -> Option<String> {
        events.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()).find_map(|e| {
            let d = &e["data"];
            let on = if e["type"] == "io.wasmsched.task.scheduled.v1" { &d["node"] } else { &d["running"]["node"] };
            (d["task"]["id"] == task).then(|| on.as_str().map(str::to_owned)).flatten()
        })
    };
    let fill_nodes: Vec<String> =
        fill["running_on"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().into()).collect();
    assert_eq!(fill_nodes.len(), 1, "one member of the elastic job ran at 30 s: {fill}");
    let rerun = dir.path().join("cut-events.jsonl");
    let report = replay(&["--scenario", out.to_str().unwrap()], &rerun);
    let rerun = lines(&rerun);
    let ran: Vec<Option<String>> = ["batch-fill-0", "batch-fill-1"].iter().map(|t| ran_on(&all, t)).collect();
    assert!(ran.contains(&Some(fill_nodes[0].clone())), "{fill_nodes:?} {ran:?}");
    assert_eq!(ran_on(&rerun, "batch-fill-0"), Some(fill_nodes[0].clone()), "taken over on its node");
    assert!(report["queues"]["batch"]["started"].as_u64().unwrap() >= 1);

    // Holes: the submissions of one gang lost. Its request comes from its placements.
    let holes: Vec<String> =
        all.iter().filter(|l| !(l.contains("task.submitted") && l.contains("\"prod-train-"))).cloned().collect();
    let holed = write(dir.path().join("holes.jsonl"), &holes);
    let (ok, stderr) =
        from_events(&["--file", holed.to_str().unwrap(), "--out", dir.path().join("h.json").to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("assumed: 2 tasks have no task-submitted event"), "{stderr}");

    // A newer scheduler's event type: counted and skipped. A line that is no event: refused,
    // naming its line, unless --lenient.
    let mut newer = all.clone();
    let submitted = all.iter().position(|l| l.contains("io.wasmsched.task.submitted.v1")).unwrap();
    newer.insert(submitted, all[submitted].replace("io.wasmsched.task.submitted.v1", "io.wasmsched.task.submitted.v9"));
    let newer = write(dir.path().join("newer.jsonl"), &newer);
    let (ok, stderr) =
        from_events(&["--file", newer.to_str().unwrap(), "--out", dir.path().join("n.json").to_str().unwrap()]);
    assert!(ok && stderr.contains("skipped: 1 events of types this version does not know"), "{stderr}");
    let mut broken = all.clone();
    broken.insert(5, "{\"specversion\": \"1.0\", \"type\": \"io.wasmsched.task.ended.v1\"}".into());
    let broken = write(dir.path().join("broken.jsonl"), &broken);
    let target = dir.path().join("b.json");
    let (ok, stderr) = from_events(&["--file", broken.to_str().unwrap(), "--out", target.to_str().unwrap()]);
    assert!(!ok && stderr.contains("broken.jsonl:6: not an event"), "{stderr}");
    assert!(!target.exists(), "nothing written on a refused stream");
    let (ok, stderr) =
        from_events(&["--file", broken.to_str().unwrap(), "--lenient", "--out", target.to_str().unwrap()]);
    assert!(ok && stderr.contains("skipped: 1 lines that are not events") && target.exists(), "{stderr}");
}

/// Each task's first placement in a stream: task → (time, node, GPUs).
fn first_placements(events: &Path) -> std::collections::BTreeMap<String, (String, String, String)> {
    let mut out = std::collections::BTreeMap::new();
    for (time, task, node, gpus) in placements(events) {
        out.entry(task.trim_matches('"').to_string()).or_insert((time, node, gpus));
    }
    out
}

#[test]
fn a_comparison_s_figures_are_those_of_the_two_replays_and_its_differences_those_of_their_events() {
    let dir = tempfile::tempdir().unwrap();
    let topology = scenario("topology.json");
    let o = wasmsched(&[
        "replay",
        "--native",
        "--quiet",
        "--scenario",
        &topology,
        "--policy",
        "gpu-topology",
        "--compare",
        "best-fit",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cmp: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((cmp["a"].as_str(), cmp["b"].as_str()), (Some("gpu-topology"), Some("best-fit")));
    let (ea, eb) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let a = replay(&["--scenario", &topology, "--policy", "gpu-topology"], &ea);
    let b = replay(&["--scenario", &topology, "--policy", "best-fit"], &eb);
    let figure = |name: &str| {
        let f =
            cmp["figures"].as_array().unwrap().iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("{name}"));
        (f["a"].as_f64().unwrap(), f["b"].as_f64().unwrap())
    };
    let lost = |r: &Value| {
        r["usage"].as_object().unwrap().values().map(|u| u["lost_gpu_milli_seconds"].as_u64().unwrap()).sum::<u64>()
            as f64
            / 3.6e6
    };
    assert_eq!(figure("pods evicted"), (a["evictions"].as_f64().unwrap(), b["evictions"].as_f64().unwrap()));
    assert_eq!(
        figure("GPU allocation while work waited (%)"),
        (
            a["utilisation_mean_while_waiting_percent"].as_f64().unwrap(),
            b["utilisation_mean_while_waiting_percent"].as_f64().unwrap()
        )
    );
    assert_eq!(figure("GPU-hours lost to evictions"), (lost(&a), lost(&b)));
    assert_eq!(figure("horizon (s)"), (a["horizon_seconds"].as_f64().unwrap(), b["horizon_seconds"].as_f64().unwrap()));
    for (queue, delays) in cmp["queue_delay_mean"].as_object().unwrap() {
        assert_eq!(delays[0], a["queues"][queue]["delay_mean"], "{queue}");
        assert_eq!(delays[1], b["queues"][queue]["delay_mean"], "{queue}");
    }
    // The differences, recomputed from the two replays' own events.
    let (pa, pb) = (first_placements(&ea), first_placements(&eb));
    let both: Vec<&String> = pa.keys().filter(|t| pb.contains_key(*t)).collect();
    let differ = both.iter().filter(|t| pa[**t] != pb[**t]).count();
    let other_node = both.iter().filter(|t| pa[**t].1 != pb[**t].1).count();
    assert!(differ > 0 && differ < both.len(), "{differ} of {}", both.len());
    assert_eq!(cmp["placements_differ"].as_u64(), Some(differ as u64));
    assert_eq!(cmp["placements_same"].as_u64(), Some((both.len() - differ) as u64));
    assert_eq!(cmp["placements_other_node"].as_u64(), Some(other_node as u64));
    let example = &cmp["differing"][0];
    let task = example["task"].as_str().unwrap();
    assert_eq!(example["a"]["node"].as_str().map(|n| format!("\"{n}\"")), Some(pa[task].1.clone()));
}

/// Recorded from `wasmsched run --events` on a real kube-apiserver and kubelet (Kubernetes 1.36,
/// one node with the agent's device plugin and two of the cluster's other nodes kept): six pods
/// in two queues, one deleted while it ran, a queue's weight changed midway.
const RECORDED: &str = "host/cli/tests/fixtures/kube-1.36-events.jsonl";

#[test]
fn a_stream_recorded_on_a_real_cluster_becomes_a_scenario_with_its_measured_run_times() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("recorded.json");
    let (ok, stderr) = from_events(&["--file", RECORDED, "--out", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(s["nodes"].as_array().unwrap().len(), 3);
    let node = s["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "gpu-node-0").unwrap();
    assert_eq!(
        (node["gpus"].as_u64(), node["cpu_milli"].as_u64(), node["model"].as_str()),
        (Some(8), Some(2000), Some("unknown"))
    );
    let queues: Vec<&str> = s["queues"].as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(queues, ["prod", "research", "default"]);
    // The weight research had when the work began (it changed to 3 midway, which is said).
    assert_eq!(s["queues"][1]["weight"], 2);
    assert_eq!(s["queues"][0]["guarantee"]["gpus"], 2.0);
    assert!(stderr.contains("assumed: queues research changed inside the window"), "{stderr}");
    // Pods are created at whole seconds (the API server's creationTimestamp); run times are what
    // the kubelet ran them, from bind to the end the scheduler saw.
    let job = |name: &str| s["jobs"].as_array().unwrap().iter().find(|j| j["name"] == name).unwrap().clone();
    let a = job("hist1/a");
    assert_eq!((a["arrival"].as_u64(), a["duration"].as_u64(), a["gpus"].as_u64()), (Some(7), Some(23), Some(4)));
    assert_eq!(a["queue"], "research");
    assert_eq!(job("hist1/e")["arrival"], 33);
    assert_eq!(job("hist1/d")["duration"], 14, "deleted after running 14 s");
    assert!(stderr.contains("assumed: 1 jobs ended deleted or failed"), "{stderr}");
    assert!(stderr.contains("6 jobs may go only to some nodes"), "{stderr}");
    assert!(stderr.contains("do not say their GPU model"), "{stderr}");
    assert!(!stderr.contains("joined inside the window"), "described at start-up, before any work: {stderr}");
    let o = wasmsched(&["replay", "--native", "--json", "--quiet", "--scenario", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["jobs"], 6);
}

#[test]
fn a_stream_read_from_a_real_nats_server_gives_the_scenario_its_file_gives() {
    let dir = tempfile::tempdir().unwrap();
    let nats = super::support::NatsServer::start(&[]);
    let url = nats.url();
    let file = dir.path().join("qgp.jsonl");
    let qgp = scenario("queues-gangs-preemption.yaml");
    // The same deterministic replay published to NATS and to a file.
    let o = wasmsched(&["replay", "--native", "--quiet", "--scenario", &qgp, "--nats", &url, "--cluster", "test"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    replay(&["--scenario", &qgp], &file);
    let (from_file, from_nats) = (dir.path().join("file.json"), dir.path().join("nats.json"));
    let (ok, stderr) = from_events(&["--file", file.to_str().unwrap(), "--out", from_file.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let (ok, stderr) = from_events(&["--nats", &url, "--cluster", "test", "--out", from_nats.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let read = |p: &Path| serde_json::from_str::<Value>(&std::fs::read_to_string(p).unwrap()).unwrap();
    let (a, b) = (read(&from_file), read(&from_nats));
    assert_eq!(a["jobs"].as_array().map(Vec::len), Some(8));
    assert_eq!(a, b, "the same stream through NATS and through a file");
}

#[test]
fn a_fabric_without_a_sane_slowdown_or_a_slowdown_without_a_fabric_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("e.jsonl");
    replay(&["--scenario", &scenario("two-queues.json")], &events);
    let file = events.to_str().unwrap();
    let (ok, stderr) = from_events(&["--file", file, "--fabric", "rack", "--spanning-slowdown", "0.5"]);
    assert!(!ok && stderr.contains("--spanning-slowdown 0.5 is not between 1 and 10"), "{stderr}");
    let (ok, stderr) = from_events(&["--file", file, "--spanning-slowdown", "2"]);
    assert!(!ok && stderr.contains("--fabric"), "{stderr}");
}
