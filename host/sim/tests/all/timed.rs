//! Time-driven replay through the scheduling core: waiting, re-activation on departures, priority,
//! backfill, metrics; queues with fair share, elastic jobs, gangs and their timeout, preemption with
//! checkpoints and reclaim (the YAML example scenario); the scenario format's errors; then the real
//! openb default trace with its creation/deletion times.

use std::sync::Arc;

use wasmsched_core::{NativePlugin, PolicySet};
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_sim::timed::{self, Job, Scenario, flat_queues, queue_tree};
use wasmsched_sim::trace;

fn set() -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .build()
}

/// [`set`] with proportional fair share and priority preemption, as `wasmsched replay` runs.
fn full_set() -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build()
}

const SCENARIO: &str = r#"{
  "nodes": [{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 1, "model": "T4"}],
  "queues": ["a", "b"],
  "jobs": [
    {"name": "first",  "queue": "a", "arrival": 0, "duration": 10, "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
    {"name": "low",    "queue": "a", "arrival": 1, "duration": 5,  "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
    {"name": "high",   "queue": "a", "arrival": 2, "duration": 5,  "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "priority": 10},
    {"name": "huge",   "queue": "b", "arrival": 3, "duration": 5,  "cpu_milli": 1000, "gpus": 2, "gpu_milli": 1000, "priority": 20},
    {"name": "cpu",    "queue": "a", "arrival": 4, "duration": 1,  "cpu_milli": 1000}
  ]
}"#;

#[test]
fn jobs_wait_and_start_when_capacity_frees_in_priority_order_with_backfill() {
    let s = Scenario::parse("s.json", SCENARIO).unwrap();
    let r = timed::run(&set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    let at = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    assert_eq!((at("first").start, at("first").end), (Some(0), Some(10)));
    // At 10 the GPU frees: `high` (priority 10) goes before `low`, which waits for `high` to leave.
    assert_eq!((at("high").start, at("high").end), (Some(10), Some(15)));
    assert_eq!((at("low").start, at("low").end), (Some(15), Some(20)));
    // `huge` can never fit and does not block the CPU-only job behind it (backfill).
    assert_eq!(at("huge").start, None);
    assert!(at("huge").waiting_reason.as_deref().unwrap().contains("GPU"), "{:?}", at("huge").waiting_reason);
    assert_eq!(at("cpu").start, Some(4));
    assert_eq!(r.waiting_by_reason.values().sum::<usize>(), 1);

    let a = &r.queues["a"];
    assert_eq!((a.jobs, a.started, a.waiting), (4, 4, 0));
    assert_eq!(a.delay_p99, 14, "low waited 1 → 15");
    assert_eq!(a.delay_p50, 0, "first and cpu started at once");
    assert_eq!((r.queues["b"].started, r.queues["b"].waiting), (0, 1));
    assert_eq!(r.horizon, 20);
    // The GPU is busy from 0 to 20: 100 % all along.
    assert!((r.utilisation_mean - 100.0).abs() < 1e-9, "{}", r.utilisation_mean);
    // Queue b never got `huge`: its service ratio is 0, a's is 1, so fairness is 1/2.
    assert_eq!(r.queues["b"].service_ratio, 0.0);
    assert!((r.jain_fairness - 0.5).abs() < 1e-9, "{}", r.jain_fairness);
    assert_eq!((r.evictions, r.timed_out, r.faults), (0, 0, 0), "no preempt plugin, no gangs");
}

#[test]
fn a_policy_rolled_out_mid_replay_decides_from_its_time_on_and_retries_parked_work() {
    // v1 places without preemption; v2, from second 3 on, adds fair share and preemption.
    let stamped = |version: u64, preempt: bool| {
        let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
        let mut b = PolicySet::builder()
            .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
            .score(score.clone(), 1)
            .devices(score)
            .version(version);
        if preempt {
            b = b
                .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
                .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()));
        }
        b.build()
    };
    let (v1, v2) = (stamped(1, false), stamped(2, true));
    let s = Scenario::parse("s.json", SCENARIO).unwrap();
    let replay = |policies: &timed::PolicyTimeline<'_>| {
        let mut versions = Vec::new();
        let r = timed::run_observed(
            policies,
            &s.node_table(),
            &queue_tree(&s.queues).unwrap(),
            &s.jobs,
            timed::ReplaySettings::default(),
            |d| versions.push((d.at, d.policy_version)),
        )
        .unwrap();
        let high = r.jobs[s.jobs.iter().position(|j| j.name == "high").unwrap()].start;
        (r, high, versions)
    };
    // v1 throughout: `high` (parked at 2: nothing to preempt with) waits for `first` to leave at 10.
    let (r, high, versions) = replay(&timed::PolicyTimeline::new(&v1));
    assert_eq!((high, r.evictions), (Some(10), 0));
    assert!(versions.iter().all(|&(_, v)| v == 1));
    // v2 from 3: the rollout itself retries `high`, which preempts `first` at once.
    let (r, high, versions) = replay(&timed::PolicyTimeline::new(&v1).then_at(3, &v2));
    assert_eq!(high, Some(3), "{:?}", r.jobs);
    assert!(r.evictions >= 1, "{:?}", r.jobs);
    assert!(versions.iter().any(|&(at, _)| at < 3), "decisions before the rollout: {versions:?}");
    for (at, v) in versions {
        assert_eq!(v, if at < 3 { 1 } else { 2 }, "at {at}: every cycle runs the set live at its start");
    }
    // A rollout when no work waits does not stretch the replay.
    let quiet = replay(&timed::PolicyTimeline::new(&v1).then_at(500, &v2)).0;
    assert_eq!(quiet.horizon, replay(&timed::PolicyTimeline::new(&v1)).0.horizon);
}

#[test]
fn malformed_scenarios_are_rejected_with_a_reason() {
    let e = Scenario::parse("s.json", "{\"nodes\": [}").unwrap_err().to_string();
    assert!(e.starts_with("s.json:1:"), "{e}");
    for (bad, why) in [
        (SCENARIO.replace("\"queue\": \"b\", \"arrival\": 3", "\"queue\": \"c\", \"arrival\": 3"), "unknown queue"),
        (SCENARIO.replace("\"name\": \"low\"", "\"name\": \"first\""), "appears twice"),
        (
            SCENARIO.replace("\"gpus\": 2, \"gpu_milli\": 1000", "\"gpus\": 2, \"gpu_milli\": 500"),
            "not a valid GPU request",
        ),
        (SCENARIO.replace("\"priority\": 10", "\"priority\": 10, \"colour\": 1"), "unknown field"),
        // Times whose sums could overflow (found by `damaged_scenarios_are_refused_or_replayed` in tests/all/mutated.rs).
        (
            SCENARIO.replace("\"arrival\": 4", "\"arrival\": 18446744073709551615"),
            "arrival 18446744073709551615 s is beyond",
        ),
        (SCENARIO.replace("\"duration\": 1,", "\"duration\": 1000000000001,"), "duration 1000000000001 s is beyond"),
    ] {
        let e = Scenario::parse("s.json", &bad).unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn lenient_scenarios_leave_out_and_report_only_the_malformed_jobs() {
    // Four broken jobs of four kinds, and the original five intact.
    let bad = SCENARIO.replace("\"queue\": \"b\", \"arrival\": 3", "\"queue\": \"c\", \"arrival\": 3").replace(
        "\"jobs\": [",
        r#""jobs": [
    {"name": "typo", "queue": "a", "arrival": "soon", "duration": 1},
    {"name": "extra", "queue": "a", "arrival": 1, "colour": 1},
    {"name": "first", "queue": "a", "arrival": 1},"#,
    );
    assert!(Scenario::parse("s.json", &bad).is_err(), "strict parsing still refuses the file");
    let (s, skipped) = Scenario::parse_lenient("s.json", &bad, true).unwrap();
    let names: Vec<&str> = s.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["first", "low", "high", "cpu"], "{skipped:?}");
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(skipped[0].starts_with("job 1 (typo): ") && skipped[0].contains("invalid type"), "{skipped:?}");
    assert!(skipped[1].starts_with("job 2 (extra): ") && skipped[1].contains("unknown field"), "{skipped:?}");
    // The first "first" is kept, so the scenario's own "first" (job 4) is the duplicate.
    assert!(skipped[2].starts_with("job 4 (first): ") && skipped[2].contains("appears twice"), "{skipped:?}");
    assert!(skipped[3].starts_with("job 7 (huge): ") && skipped[3].contains("unknown queue"), "{skipped:?}");
    // The kept jobs replay; nodes and queues are never skipped.
    let r = timed::run(&set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    assert_eq!(r.jobs.len(), 4);
    let no_queues = bad.replace("\"queues\": [\"a\", \"b\"]", "\"queues\": [\"a\", \"a\"]");
    assert!(Scenario::parse_lenient("s.json", &no_queues, true).is_err());
    // YAML reads the same way.
    let yaml = "nodes: [{name: n, cpu_milli: 1000, memory_mib: 1024}]\nqueues: [a]\njobs:\n  - {name: ok, queue: a, arrival: 0}\n  - {name: bad, queue: a, arrival: 0, replicas: 0}\n";
    let (s, skipped) = Scenario::parse_lenient("s.yaml", yaml, true).unwrap();
    assert_eq!((s.jobs.len(), skipped.len()), (1, 1), "{skipped:?}");
    assert!(skipped[0].contains("replicas must be"), "{skipped:?}");
}

/// `s` replayed with the full policy set and the default settings, each decision shown to `observe`.
fn replay_full(s: &Scenario, observe: impl FnMut(timed::TimedDecision<'_>)) -> timed::TimedRun {
    let set = full_set();
    let timeline = timed::PolicyTimeline::new(&set);
    timed::run_observed(
        &timeline,
        &s.node_table(),
        &queue_tree(&s.queues).unwrap(),
        &s.jobs,
        timed::ReplaySettings::default(),
        observe,
    )
    .unwrap()
}

/// [`replay_full`], everything the replay observes shown to `observe`.
fn replay_seen(s: &Scenario, observe: impl FnMut(timed::Observed<'_>)) -> timed::TimedRun {
    let set = full_set();
    let timeline = timed::PolicyTimeline::new(&set);
    let tree = queue_tree(&s.queues).unwrap();
    timed::run_with_devices(&timeline, &s.node_table(), None, &tree, &s.jobs, timed::ReplaySettings::default(), observe)
        .unwrap()
}

const EXAMPLE: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/queues-gangs-preemption.yaml"));

#[test]
fn queues_gangs_elastic_jobs_preemption_checkpoints_and_reclaim_replay_as_documented() {
    let s = Scenario::parse("queues-gangs-preemption.yaml", EXAMPLE).unwrap();
    let mut log = Vec::new();
    let r = replay_full(&s, |d| log.push(format!("t={} {:?}", d.at, d.decision)));
    let at = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    let span = |name: &str| (at(name).start, at(name).end, at(name).evictions);
    // Act 1: the prod gang takes the elastic surplus; batch-fill keeps running at its minimum.
    assert_eq!(span("batch-fill"), (Some(0), Some(100), 0), "{log:#?}");
    assert_eq!(span("prod-train"), (Some(10), Some(60), 0));
    assert!(log.iter().any(|l| l.starts_with("t=60 Bound") && l.contains("batch-fill")), "grows back at 60");
    // Act 2: checkpointed at 225 (5 s after being asked), 25 s of progress kept: 75 s left from 255.
    assert_eq!(span("prod-high"), (Some(225), Some(255), 0));
    assert_eq!(span("prod-low"), (Some(200), Some(330), 1));
    assert!(log.iter().any(|l| l.starts_with("t=220 PreemptionRequested") && l.contains("prod-low")));
    assert!(log.iter().any(|l| l.starts_with("t=225 Evicted") && l.contains("checkpointed: true")));
    // Act 3: it times out, and is submitted again 10 s later, as `wasmsched run` does.
    assert_eq!(span("too-big"), (None, None, 0));
    let timeouts: Vec<&String> = log.iter().filter(|l| l.contains("TimedOut { workload: \"too-big\" }")).collect();
    assert!(
        timeouts.len() > 1 && timeouts[1].starts_with("t=530 "),
        "submitted again 10 s later, timed out 60 s after: {timeouts:?}"
    );
    assert!(log.iter().any(|l| l == "t=460 TimedOut { workload: \"too-big\" }"), "{log:#?}");
    // Act 4: prod reclaims its half; the evicted batch pod had no checkpoint and starts over.
    assert_eq!(span("prod-c"), (Some(600), Some(620), 0));
    let (a, b) = (span("batch-a"), span("batch-b"));
    let (kept, restarted) = if a.2 == 0 { (a, b) } else { (b, a) };
    assert_eq!(kept, (Some(500), Some(1500), 0));
    assert_eq!(restarted, (Some(500), Some(1620), 1), "restarted from scratch at 620");
    // Each eviction says which rule allowed it.
    let kind = |t: u64| -> Vec<&str> {
        let prefix = format!("t={t} Evicted");
        log.iter()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| {
                ["ElasticShrink", "Priority", "Reclaim", "GangBroken"].into_iter().find(|k| l.contains(k)).unwrap()
            })
            .collect()
    };
    assert_eq!(kind(10), ["ElasticShrink"]);
    assert_eq!(kind(225), ["Priority", "GangBroken"]);
    assert_eq!(kind(600), ["Reclaim"]);
    // 1 surplus member + 2 gang members + 1 reclaimed pod; nothing lost, nothing faulted.
    assert_eq!((r.evictions, r.timed_out, r.faults), (4, timeouts.len(), 0));
    assert_eq!(r.horizon, 1620);
    assert_eq!(r.queues["prod"].evictions, 1);
    assert_eq!(r.queues["batch"].evictions, 1);
    assert_eq!(r.waiting_by_reason.values().sum::<usize>(), 1);

    // The same inputs give the same decisions, and the JSON form of the scenario means the same.
    let mut again = Vec::new();
    let json = serde_json::to_string(&s).unwrap();
    let s2 = Scenario::parse("same.json", &json).unwrap();
    assert_eq!(s2, s);
    replay_full(&s2, |d| again.push(format!("t={} {:?}", d.at, d.decision)));
    assert_eq!(log, again);
}

#[test]
fn malformed_queues_and_jobs_in_yaml_are_rejected_with_a_reason() {
    let e = Scenario::parse("s.yaml", "nodes: [\n  {name: x\n").unwrap_err().to_string();
    assert!(e.starts_with("s.yaml:"), "{e}");
    for (from, to, why) in [
        ("{name: prod, parent: org, weight: 1}", "{name: prod, parent: nowhere}", "parent queue nowhere not found"),
        ("capability: {gpus: 8}", "capability: {gpus: -1}", "gpus must be a non-negative number"),
        ("capability: {gpus: 8}", "capability: {gpu: 8}", "unknown field `gpu`"),
        ("{name: prod, parent: org, weight: 1}", "{name: prod, parent: org, weight: 0}", "weight must be positive"),
        ("name: batch-a, queue: batch,", "name: batch-a, queue: org,", "has child queues"),
        ("replicas: 2, min_replicas: 1}", "replicas: 2, min_replicas: 3}", "min_replicas 3 must be 1..=2"),
        ("replicas: 3, timeout: 60}", "replicas: 0, timeout: 60}", "replicas must be"),
        ("{name: batch-b, queue: batch,", "{name: batch-fill-0, queue: batch,", "is taken by another job"),
        ("checkpoint_seconds: 5}", "checkpoint_seconds: -5}", "checkpoint_seconds: -5 s: a time is never negative"),
        (
            "checkpoint_seconds: 5}",
            "checkpoint_seconds: soon}",
            "a time in seconds (a number from 0 on, e.g. 30 or 1.5)",
        ),
    ] {
        assert!(EXAMPLE.contains(from), "{from}");
        let e = Scenario::parse("s.yaml", &EXAMPLE.replacen(from, to, 1)).unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn a_timed_out_gang_is_submitted_again_unless_the_replay_drops_it() {
    let s = Scenario::parse("queues-gangs-preemption.yaml", EXAMPLE).unwrap();
    let set = full_set();
    let replay = |drop_timed_out_gangs: bool| {
        let settings = timed::ReplaySettings { drop_timed_out_gangs, ..Default::default() };
        let timeline = timed::PolicyTimeline::new(&set);
        timed::run_observed(&timeline, &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs, settings, |_| {})
            .unwrap()
    };
    let too_big = s.jobs.iter().position(|j| j.name == "too-big").unwrap();
    // Dropped: given up once, at its 60 s timeout, with the reason.
    let dropped = replay(true);
    assert_eq!((dropped.timed_out, dropped.jobs[too_big].given_up), (1, Some(460)));
    assert_eq!(dropped.jobs[too_big].waiting_reason.as_deref(), Some("gang timed out after 60 s"));
    // Submitted again (the default): still waiting at the end, never given up, its demand still
    // counted; and a gang that can never be placed does not keep the replay going.
    let kept = replay(false);
    assert_eq!(kept.jobs[too_big].given_up, None);
    assert!(kept.timed_out > 1, "{}", kept.timed_out);
    assert_eq!(kept.horizon, dropped.horizon);
}

#[test]
fn fractional_times_are_rounded_to_the_replays_second_and_impossible_jobs_refused_at_arrival() {
    let scenario = SCENARIO
        .replace("\"arrival\": 1, \"duration\": 5", "\"arrival\": 1.4, \"duration\": 4.6")
        .replace("\"arrival\": 4, \"duration\": 1,", "\"arrival\": 4, \"duration\": 0.2,");
    let s = Scenario::parse("s.json", &scenario).unwrap();
    let job = |name: &str| s.jobs.iter().find(|j| j.name == name).unwrap();
    assert_eq!((job("low").arrival, job("low").duration), (1, Some(5)));
    assert_eq!(job("cpu").duration, Some(1), "a short job still takes a tick");
    let r = timed::run(&set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    let huge = &r.jobs[s.jobs.iter().position(|j| j.name == "huge").unwrap()];
    assert_eq!(
        huge.waiting_reason.as_deref(),
        Some("refused: no node could ever hold one replica: it asks 2 GPUs on one node, and no node has more than 1")
    );
}

#[test]
fn fairness_is_measured_while_queues_wait_not_only_at_the_end() {
    // Queue a fills the 4 GPUs at 0 with 8 jobs; b's 2 jobs arrive at 10 and wait (no preemption)
    // until a's first four leave at 100. Everything finishes.
    let mut jobs = Vec::new();
    for i in 0..8 {
        jobs.push(format!(
            r#"{{"name": "a{i}", "queue": "a", "arrival": 0, "duration": 100, "gpus": 1, "gpu_milli": 1000}}"#
        ));
    }
    for i in 0..2 {
        jobs.push(format!(
            r#"{{"name": "b{i}", "queue": "b", "arrival": 10, "duration": 50, "gpus": 1, "gpu_milli": 1000}}"#
        ));
    }
    let scenario = format!(
        r#"{{"nodes": [{{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "T4"}}],
             "queues": ["a", "b"], "jobs": [{}]}}"#,
        jobs.join(",")
    );
    let s = Scenario::parse("s.json", &scenario).unwrap();
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    let no_preemption = PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .build();
    let r = timed::run(&no_preemption, &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    // At the end every queue got all it asked for: the end-of-run index says "perfectly fair".
    assert!(r.jain_fairness > 0.999, "{}", r.jain_fairness);
    // While both waited (10–100; from 100 b's jobs run and it waits no more): a held 4 GPUs of
    // its deserved 2 and b none — an index of 0.5.
    let backlogged = r.jain_fairness_while_backlogged.unwrap();
    assert!((backlogged - 0.5).abs() < 1e-9, "{backlogged}");
    let b = |name: &str| r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()].start;
    assert_eq!((b("b0"), b("b1")), (Some(100), Some(100)), "b served first when GPUs free");
    // b was 2 GPUs short for 90 s: 0.05 GPU-hours.
    assert!((r.queues["b"].share_deficit_gpu_hours - 0.05).abs() < 1e-9, "{:?}", r.queues["b"]);
    assert_eq!(r.queues["a"].share_deficit_gpu_hours, 0.0);
}

#[test]
fn the_openb_default_trace_replays_in_time() {
    let text =
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/traces/openb/openb_pod_list_default.csv"));
    let nodes_text =
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/traces/openb/openb_node_list_gpu_node.csv"));
    let pods = trace::parse_pods("default", text).unwrap();
    let mut table = wasmsched_core::NodeTable::new();
    // Half the cluster, so that the trace's peak demand (≈ 98 % of the full cluster) must queue.
    for n in trace::parse_nodes("nodes", nodes_text).unwrap().into_iter().step_by(2) {
        table.upsert(n);
    }
    // Arrivals squeezed into ~13 s (durations as recorded): a burst twice the half-cluster.
    let jobs: Vec<Job> = pods.iter().map(|p| Job::from_trace(p, 1e6)).collect();
    let r = timed::run(&set(), &table, &queue_tree(&flat_queues(&jobs)).unwrap(), &jobs).unwrap();
    let started: usize = r.queues.values().map(|q| q.started).sum();
    let waiting: usize = r.queues.values().map(|q| q.waiting).sum();
    assert_eq!(started + waiting, pods.len());
    assert!(started > pods.len() * 9 / 10, "{started} of {} started", pods.len());
    assert!(r.queues.contains_key("LS") && r.queues.contains_key("BE"));
    assert!(r.queues.values().any(|q| q.delay_p99 > 0), "some work queued: {:?} util {}", r.queues, r.utilisation_mean);
    // The burst fills the half-cluster; the long tail of a few months-long pods drags the mean down.
    let peak = r.utilisation.iter().map(|u| u.1).fold(0.0, f64::max);
    assert!(peak > 80.0 && peak <= 100.0, "peak {peak}");
    assert!(r.utilisation_mean > 0.0 && r.utilisation_mean < peak);
    assert!(r.attempts < pods.len() * 200, "retries are bounded by shape: {} attempts", r.attempts);
    assert!((0.0..=1.0).contains(&r.jain_fairness));
}

/// Each job's start in a replay of the scenario `yaml` (named `file`) with the full policy set.
fn job_starts(file: &str, yaml: &str) -> Vec<Option<u64>> {
    let s = Scenario::parse(file, yaml).unwrap();
    let r = timed::run(&full_set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    r.jobs.iter().map(|j| j.start).collect()
}

#[test]
fn a_lending_limit_keeps_part_of_a_queue_s_guarantee_free_in_a_replay() {
    // `research` is guaranteed both GPUs and lends one: `batch` runs one job at a time until
    // research's job takes the reserved GPU at 70; without the limit batch takes both at once.
    let scenario = |lending: &str| {
        format!(
            r#"
nodes:
  - {{name: n1, cpu_milli: 8000, memory_mib: 65536, gpus: 1, model: T4}}
  - {{name: n2, cpu_milli: 8000, memory_mib: 65536, gpus: 1, model: T4}}
queues:
  - {{name: research, guarantee: {{gpus: 2}}{lending}}}
  - {{name: batch, borrowing_limit: {{gpus: 2}}}}
jobs:
  - {{name: b1, queue: batch, arrival: 0, duration: 100, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
  - {{name: b2, queue: batch, arrival: 0, duration: 100, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
  - {{name: r1, queue: research, arrival: 70, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
"#
        )
    };
    let starts = |yaml: String| job_starts("lend.yaml", &yaml);
    assert_eq!(starts(scenario(", lending_limit: {gpus: 1}")), [Some(0), Some(100), Some(70)]);
    // Without it batch borrows both GPUs, and research reclaims one (its guarantee) at 70, once
    // batch's runs have had the minute a reclaim leaves them.
    let free = starts(scenario(""));
    assert_eq!((free[0], free[2]), (Some(0), Some(70)), "{free:?}");
    assert_eq!(free[1], Some(0), "{free:?}");
}

#[test]
fn a_queue_s_reclaim_max_runtime_waits_out_its_old_runs_above_a_guarantee_only() {
    // batch's two runs hold both GPUs from 0; research (same weight, deserving one) wants one at
    // 7200, when both runs are two hours old.
    let scenario = |batch: &str, research: &str| {
        format!(
            r#"
nodes:
  - {{name: n1, cpu_milli: 8000, memory_mib: 65536, gpus: 1, model: T4}}
  - {{name: n2, cpu_milli: 8000, memory_mib: 65536, gpus: 1, model: T4}}
queues:
  - {{name: research{research}}}
  - {{name: batch{batch}}}
jobs:
  - {{name: b1, queue: batch, arrival: 0, duration: 10000, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
  - {{name: b2, queue: batch, arrival: 0, duration: 10000, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
  - {{name: r1, queue: research, arrival: 7200, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}}
"#
        )
    };
    let research_starts = |yaml: String| job_starts("max.yaml", &yaml)[2];
    // The default hour: batch's two-hour-old runs are waited out.
    assert_eq!(research_starts(scenario("", "")), Some(10000), "the default hour: waited out");
    assert_eq!(research_starts(scenario(", reclaim_max_runtime: 0", "")), Some(7200), "0: no limit");
    assert_eq!(research_starts(scenario(", reclaim_max_runtime: 9000", "")), Some(7200), "its own 2.5 h");
    assert_eq!(research_starts(scenario("", ", guarantee: {gpus: 1}")), Some(7200), "a guarantee: any age");
    let bad = Scenario::parse("max.yaml", &scenario(", reclaim_max_runtime: -1", "")).unwrap_err();
    let bad = bad.to_string();
    assert!(bad.contains("queues[1].reclaim_max_runtime") && bad.contains("never negative"), "{bad}");
}

#[test]
fn a_queue_s_admission_limits_turn_jobs_away_in_a_replay() {
    let yaml = r#"
nodes:
  - {name: n1, cpu_milli: 8000, memory_mib: 65536, gpus: 1, model: T4}
queues:
  - {name: q, admission: {max_jobs: 2, max_gpus_per_job: 1, priority_range: [0, 10]}}
jobs:
  - {name: a, queue: q, arrival: 0, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: b, queue: q, arrival: 1, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: c, queue: q, arrival: 2, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: big, queue: q, arrival: 25, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000, replicas: 2}
  - {name: vip, queue: q, arrival: 30, duration: 10, cpu_milli: 1000, priority: 11}
  - {name: d, queue: q, arrival: 30, duration: 10, cpu_milli: 1000}
"#;
    let s = Scenario::parse("admission.yaml", yaml).unwrap();
    let r = timed::run(&full_set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
    let at = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    // a runs, b waits for the GPU: the queue holds 2 jobs, so c is turned away, not queued.
    assert_eq!((at("a").start, at("b").start), (Some(0), Some(10)));
    assert_eq!(at("c").start, None);
    assert_eq!(at("c").waiting_reason.as_deref(), Some("refused: queue job limit reached: 2"));
    assert_eq!(at("big").waiting_reason.as_deref(), Some("refused: job GPU request 2 exceeds limit 1"));
    assert_eq!(at("vip").waiting_reason.as_deref(), Some("refused: job priority 11 out of allowed range [0, 10]"));
    assert_eq!(at("d").start, Some(30), "room again once a and b are done");
    let bad = yaml.replace("priority_range: [0, 10]", "priority_range: [10, 0]");
    let e = Scenario::parse("admission.yaml", &bad).unwrap_err().to_string();
    assert!(e.contains("queue q: priority range minimum above its maximum"), "{e}");
}

#[test]
fn flavor_quotas_bound_each_gpu_model_in_a_replay_and_bad_flavors_are_refused() {
    // team may hold 1 A100 GPU (no borrowing) and 2 V100 GPUs: of four 1-GPU jobs, one runs on
    // A100, two on V100, and the fourth waits for the first to finish at 10 although an A100 GPU
    // is idle all along.
    let yaml = r#"
nodes:
  - {name: a1, cpu_milli: 8000, memory_mib: 65536, gpus: 2, model: A100}
  - {name: v1, cpu_milli: 8000, memory_mib: 65536, gpus: 2, model: V100, labels: {zone: east}}
flavors:
  - {name: gpu-a100, node_labels: {gpu-model: A100}}
  - {name: gpu-v100, node_labels: {gpu-model: V100, zone: east}}
queues:
  - name: team
    flavors:
      - {name: gpu-a100, guarantee: {gpus: 1}, borrowing_limit: {gpus: 0}}
      - {name: gpu-v100, guarantee: {gpus: 2}}
jobs:
  - {name: j1, queue: team, arrival: 0, duration: 10, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: j2, queue: team, arrival: 0, duration: 20, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: j3, queue: team, arrival: 0, duration: 20, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
  - {name: j4, queue: team, arrival: 0, duration: 20, cpu_milli: 1000, gpus: 1, gpu_milli: 1000}
"#;
    let starts = |yaml: &str| {
        let s = Scenario::parse("flavors.yaml", yaml).unwrap();
        let r = timed::run(&full_set(), &s.node_table(), &s.queue_tree().unwrap(), &s.jobs).unwrap();
        r.jobs.iter().map(|j| j.start).collect::<Vec<_>>()
    };
    assert_eq!(starts(yaml), [Some(0), Some(0), Some(0), Some(10)]);
    // Unbounded borrowing on A100: the fourth job takes the idle A100 GPU at once.
    assert_eq!(starts(&yaml.replace(", borrowing_limit: {gpus: 0}", "")), [Some(0); 4]);

    for (from, to, why) in [
        ("- {name: gpu-v100, guarantee", "- {name: gpu-h100, guarantee", "queue team: unknown flavor gpu-h100"),
        (
            "- {name: gpu-v100, node_labels",
            "- {name: gpu/v100, node_labels",
            "flavor \"gpu/v100\": names must be unique",
        ),
        (
            "- {name: gpu-v100, node_labels",
            "- {name: gpu-a100, node_labels",
            "flavor \"gpu-a100\": names must be unique",
        ),
        ("- {name: gpu-v100, guarantee", "- {name: gpu-a100, guarantee", "flavor \"gpu-a100\": listed twice"),
        ("borrowing_limit: {gpus: 0}", "borrowing_limit: {gpus: -2}", "gpus must be a non-negative number"),
        ("node_labels: {gpu-model: A100}", "labels: {gpu-model: A100}", "unknown field `labels`"),
    ] {
        assert!(yaml.contains(from), "{from}");
        let e = Scenario::parse("flavors.yaml", &yaml.replacen(from, to, 1)).unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn the_flavors_example_replays_digest_k1_k2() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/flavors.yaml");
    let (s, _) = Scenario::load(std::path::Path::new(path)).unwrap();
    let r = timed::run(&full_set(), &s.node_table(), &s.queue_tree().unwrap(), &s.jobs).unwrap();
    let start = |name: &str| r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()].start;
    let at_once = (0..16).filter(|i| start(&format!("train-{i:02}")) == Some(0)).count();
    // 80 A100 GPUs (64 nominal + 16 borrowed) and 32 V100 GPUs: 14 jobs of 8 GPUs.
    assert_eq!(at_once, 14);
    // The lender's jobs run at once on the 16 A100 GPUs the cluster queue may not take.
    assert_eq!((start("lend-0"), start("lend-1")), (Some(600), Some(600)));
    // The two waiting jobs start when the first ones finish.
    assert!((0..16).all(|i| start(&format!("train-{i:02}")).is_some_and(|t| t == 0 || t == 3600)));
}

#[test]
fn pod_affinity_spreads_replicas_and_keeps_a_sidecar_waiting_for_its_peer_in_a_replay() {
    let yaml = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/pod-affinity.yaml"));
    let run = |s: &Scenario| timed::run(&full_set(), &s.node_table(), &s.queue_tree().unwrap(), &s.jobs).unwrap().jobs;
    let mut s = Scenario::parse("affinity.yaml", yaml).unwrap();
    let jobs = run(&s);
    let starts: Vec<_> = jobs.iter().map(|j| j.start).collect();
    // One web replica per node: the third waits for the first to leave (at 10; its back-off,
    // grown by a retry at 9 when the sidecar left, makes it 11). The sidecar waits for a db pod
    // in its zone: db starts at 3 and wakes it (no capacity freed, so without that wake-up it
    // would wait for web-1 to leave at 10); it starts in the next cycle. A gang of three that
    // must spread over two nodes never starts.
    assert_eq!(starts, [Some(0), Some(0), Some(11), Some(4), Some(3), None]);
    // It times out and is submitted again, waiting for the same reason.
    let ring = jobs[5].waiting_reason.as_deref().unwrap_or_default();
    assert!(ring.contains("affinity"), "{ring}");
    // Without the terms every pod fits at once (the nodes have room for all of them).
    for j in &mut s.jobs {
        j.pod_affinity = None;
    }
    assert_eq!(
        run(&s).iter().map(|j| j.start).collect::<Vec<_>>(),
        [Some(0), Some(0), Some(0), Some(0), Some(3), Some(0)]
    );

    for (from, to, why) in [
        ("operator: In", "operator: Gt", "unknown operator \"Gt\""),
        ("topology_key: zone", "topology_key: \"\"", "empty topologyKey"),
        ("anti_required: [{match_labels: {app: ring}", "anti_preferred: [{match_labels: {app: ring}", "needs a weight"),
        ("topology_key: zone}", "topology_key: zone, weight: 5}", "required term has no weight"),
        ("match_labels: {app: ring}", "match_label: {app: ring}", "unknown field `match_label`"),
    ] {
        assert!(yaml.contains(from), "{from}");
        let e = Scenario::parse("affinity.yaml", &yaml.replacen(from, to, 1)).unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn an_evicted_job_holds_its_gpu_while_it_terminates_and_its_preemptor_starts_after() {
    let scenario = |termination: u64| {
        format!(
            r#"{{
  "nodes": [{{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 1, "model": "T4"}}],
  "queues": ["a"],
  "jobs": [
    {{"name": "low",  "arrival": 0, "duration": 100, "gpus": 1, "gpu_milli": 1000, "queue": "a", "termination_seconds": {termination}}},
    {{"name": "high", "arrival": 5, "duration": 10,  "gpus": 1, "gpu_milli": 1000, "queue": "a", "priority": 10}},
    {{"name": "mid",  "arrival": 6, "duration": 10,  "gpus": 1, "gpu_milli": 1000, "queue": "a", "priority": 5}}
  ]
}}"#
        )
    };
    for (termination, high_starts) in [(0, 5), (20, 25)] {
        let s = Scenario::parse("s.json", &scenario(termination)).unwrap();
        let r = timed::run(&full_set(), &s.node_table(), &queue_tree(&s.queues).unwrap(), &s.jobs).unwrap();
        let at = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
        assert_eq!(at("high").start, Some(high_starts), "termination {termination} s: {:?}", r.jobs);
        // The lower-priority arrival never takes the room kept for the preemptor.
        assert!(at("mid").start.is_some_and(|t| t >= high_starts + 10), "{:?}", r.jobs);
        // While the victim terminates its GPU counts as in use.
        let busy = r.utilisation.iter().filter(|(t, _)| (5..high_starts).contains(t)).all(|(_, pct)| *pct == 100.0);
        assert!(busy, "{:?}", r.utilisation);
    }
}

/// The claims a replay allocated, by task, and the check that no device was ever held by two
/// running replicas at once (replicas leave at their job's end; none is evicted here).
fn replay_with_devices(
    s: &Scenario,
    objects: &wasmsched_dra::Objects,
) -> (timed::TimedRun, std::collections::BTreeMap<String, (String, Vec<wasmsched_dra::DeviceId>)>) {
    let mut given = std::collections::BTreeMap::new();
    let mut holding: Vec<(u64, wasmsched_dra::DeviceId)> = Vec::new();
    let ends: std::collections::HashMap<String, Option<u64>> =
        s.jobs.iter().flat_map(|j| j.task_ids().into_iter().map(|t| (t, j.duration))).collect();
    let r = timed::run_with_devices(
        &timed::PolicyTimeline::new(&full_set()),
        &s.node_table(),
        Some(objects),
        &s.queue_tree().unwrap(),
        &s.jobs,
        wasmsched_core::CoreConfig::default(),
        |o| {
            let timed::Observed::Decision(d) = o else { return };
            let (wasmsched_core::Decision::Bound { task, node, .. }, false) = (d.decision, d.claims.is_empty()) else {
                return;
            };
            holding.retain(|(until, _)| *until > d.at);
            let ids: Vec<_> = d.claims.iter().flat_map(|a| a.results.iter().map(|r| r.1.clone())).collect();
            for id in &ids {
                assert!(!holding.iter().any(|(_, h)| h == id), "{id} given twice at {}", d.at);
                holding.push((ends[task].map_or(u64::MAX, |t| d.at + t), id.clone()));
            }
            given.insert(task.clone(), (node.clone(), ids));
        },
    )
    .unwrap();
    (r, given)
}

#[test]
fn the_dra_example_allocates_claims_with_their_selectors_constraints_and_topology() {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/dra.yaml"));
    let loaded = Scenario::load_lenient(path, false).unwrap();
    let (s, objects) = (loaded.scenario, loaded.dra.expect("the scenario names DRA objects"));
    let (r, given) = replay_with_devices(&s, &objects);
    let job = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    let root = |id: &wasmsched_dra::DeviceId| -> String {
        let d = objects
            .slices
            .iter()
            .flat_map(|sl| sl.spec.devices.iter().flatten().map(move |d| (sl.spec.pool.name.clone(), d)))
            .find(|(pool, d)| **pool == *id.pool && *d.name == *id.device)
            .unwrap()
            .1;
        d.attributes.as_ref().unwrap()["resource.kubernetes.io/pcieRoot"].string.clone().unwrap()
    };
    assert_eq!(job("finetune").start, Some(0));
    let (node, ids) = &given["finetune"];
    assert_eq!((node.as_str(), ids.len()), ("dgx-a100-0", 4));
    assert_eq!(ids.iter().map(root).collect::<std::collections::BTreeSet<_>>().len(), 1, "{ids:?}");
    // Two free A100s on dgx-a100-1 and four on dgx-a100-0 do not make a gang of two fours.
    assert_eq!(job("ddp").start, Some(600), "{:?}", job("ddp"));
    let roots: Vec<std::collections::BTreeSet<String>> =
        ["ddp-0", "ddp-1"].iter().map(|t| given[*t].1.iter().map(root).collect()).collect();
    assert!(roots.iter().all(|r| r.len() == 1) && roots[0] != roots[1], "{roots:?}");
    assert_eq!((job("serve").start, given["serve"].0.as_str()), (Some(20), "h100-0"));
    let why = job("too-big").waiting_reason.as_deref().unwrap_or_default();
    assert!(job("too-big").start.is_none() && why.contains("0/3 nodes can serve its ResourceClaims"), "{why}");
}

#[test]
fn a_placement_whose_claim_the_devices_cannot_serve_is_taken_back_and_holds_nothing() {
    // One node, four GPUs: two under each PCIe root. `pair` takes one root's two; `apart` wants
    // two GPUs under different roots — the count says two are free, the constraint says no — and
    // must wait for `pair` to leave, holding nothing meanwhile: `one` still gets a GPU at once.
    let mut objects = wasmsched_dra::Objects::default();
    let devices: String = (0..4)
        .map(|i| {
            let r = if i < 2 { "pci0000:00" } else { "pci0000:80" };
            format!("  - {{name: gpu-{i}, attributes: {{resource.kubernetes.io/pcieRoot: {{string: '{r}'}}}}}}\n")
        })
        .collect();
    let text = format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: gpu}}\nspec: {{}}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: n1-gpus}}\n\
         spec:\n  driver: gpu.example.com\n  nodeName: n1\n  pool: {{name: n1, generation: 1, resourceSliceCount: 1}}\n  devices:\n{devices}"
    );
    objects.add(std::path::Path::new("objects.yaml"), &text).unwrap();
    let claim = |count: u32, constraint: &str| {
        format!(
            "[{{devices: {{requests: [{{name: g, exactly: {{deviceClassName: gpu, count: {count}}}}}], constraints: [{constraint}]}}}}]"
        )
    };
    let yaml = format!(
        "nodes: [{{name: n1, cpu_milli: 64000, memory_mib: 65536}}]\nqueues: [q]\njobs:\n\
         - {{name: pair, queue: q, arrival: 0, duration: 100, claims: {}}}\n\
         - {{name: apart, queue: q, arrival: 1, duration: 10, claims: {}}}\n\
         - {{name: one, queue: q, arrival: 2, duration: 10, claims: {}}}\n\
         - {{name: ghost, queue: q, arrival: 3, duration: 10, claims: [{{devices: {{requests: [{{name: g, exactly: {{deviceClassName: nope}}}}]}}}}]}}\n",
        claim(2, "{matchAttribute: resource.kubernetes.io/pcieRoot}"),
        claim(2, "{distinctAttribute: resource.kubernetes.io/pcieRoot}"),
        claim(1, ""),
    );
    let s = Scenario::parse("s.yaml", &yaml).unwrap();
    let (r, given) = replay_with_devices(&s, &objects);
    let job = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    assert_eq!(job("pair").start, Some(0));
    assert_eq!(job("one").start, Some(2), "the taken-back job held no device: {:?}", job("one"));
    let apart = job("apart").start.expect("apart runs once pair leaves");
    assert!(apart >= 100, "apart started at {apart}, while pair held a root");
    assert_eq!(given["apart"].1.len(), 2);
    // A claim naming a class that does not exist is refused with the reason; the rest ran.
    let why = job("ghost").waiting_reason.clone().unwrap_or_default();
    assert!(job("ghost").start.is_none() && why.contains("nope"), "{why}");
}

#[test]
fn the_replays_clock_never_goes_back_when_a_resubmitted_gang_falls_due_in_a_quiet_stretch() {
    // The gang can never run (two 8-GPU members, one node) and keeps timing out (every 61 s) and
    // coming back 10 s later; once nothing has changed for 1,200 s the replay skips ahead to the
    // next arrival, a day later, past a resubmission due at 1,217. A
    // resubmission that fell due in the stretch it skipped happens then, not back in the past
    // (where the clock went before: time-weighted figures came out as 10^16 %).
    let yaml = r#"
nodes:
  - {name: n, cpu_milli: 64000, memory_mib: 65536, gpus: 8, model: A100}
queues: [q]
jobs:
  - {name: long, queue: q, arrival: 0, duration: 200000, cpu_milli: 1000, gpus: 8, gpu_milli: 1000}
  - {name: pair, queue: q, arrival: 10, duration: 100, cpu_milli: 1000, gpus: 8, gpu_milli: 1000, replicas: 2, timeout: 61}
  - {name: later, queue: q, arrival: 86400, duration: 10, cpu_milli: 1000, gpus: 0}
"#;
    let s = Scenario::parse("quiet.yaml", yaml).unwrap();
    let mut times = Vec::new();
    let r = replay_full(&s, |d| times.push(d.at));
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "decisions out of order: {times:?}");
    assert!(r.timed_out >= 2, "{}", r.timed_out);
    assert_eq!(r.jobs[2].start, Some(86_400));
    for u in [r.utilisation_mean, r.utilisation_mean_while_arriving] {
        assert!((0.0..=100.0).contains(&u), "{u}");
    }
}

#[test]
fn a_job_running_on_a_node_is_taken_over_there_and_work_waits_for_what_it_holds() {
    // Two 4-GPU nodes. `held` runs on n2 when the replay starts; best-fit would have put it on n1
    // (the first node). `next` wants a whole node: n1 is free, so it starts at once; `after`
    // waits for `held` to end at 50 s.
    let text = r#"{
      "nodes": [{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "A100"},
                {"name": "n2", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "A100"}],
      "queues": ["a"],
      "jobs": [
        {"name": "held",  "queue": "a", "arrival": 0, "duration": 50, "gpus": 2, "gpu_milli": 1000, "running_on": ["n2"]},
        {"name": "next",  "queue": "a", "arrival": 0, "duration": 10, "gpus": 4, "gpu_milli": 1000},
        {"name": "after", "queue": "a", "arrival": 1, "duration": 10, "gpus": 4, "gpu_milli": 1000}
      ]
    }"#;
    let s = Scenario::parse("s.json", text).unwrap();
    let mut bound = Vec::new();
    let r = replay_full(&s, |d| {
        if let wasmsched_core::Decision::Bound { task, node, .. } = d.decision {
            bound.push((d.at, task.clone(), node.clone()));
        }
    });
    assert_eq!(r.jobs[0].start, Some(0), "taken over at its arrival");
    assert_eq!(r.jobs[0].end, Some(50), "its duration counts from then");
    assert!(bound.iter().all(|(_, t, _)| t != "held"), "a take-over is no decision of the core's: {bound:?}");
    assert_eq!(bound[0], (0, "next".to_string(), "n1".to_string()), "n2 is held: {bound:?}");
    assert_eq!(r.jobs[2].start, Some(10), "after waits for next's node, not held's");

    // A node it cannot run on stops the replay, naming the job.
    let bad = text.replace(r#""running_on": ["n2"]"#, r#""running_on": ["n9"]"#);
    let s = Scenario::parse("s.json", &bad).unwrap();
    let set = full_set();
    let timeline = timed::PolicyTimeline::new(&set);
    let e = timed::run_observed(
        &timeline,
        &s.node_table(),
        &queue_tree(&s.queues).unwrap(),
        &s.jobs,
        timed::ReplaySettings::default(),
        |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("held") && e.contains("n9"), "{e}");
    // More nodes than replicas is a malformed job.
    let two = text.replace(r#""running_on": ["n2"]"#, r#""running_on": ["n1", "n2"]"#);
    let e = Scenario::parse("s.json", &two).unwrap_err().to_string();
    assert!(e.contains("running_on names 2 nodes for 1 replicas"), "{e}");
}

#[test]
fn a_job_withdrawn_while_it_waits_leaves_the_queue_and_runs_no_more() {
    // The acts are told in the scenario's header.
    let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/withdrawn.yaml"));
    let s = Scenario::parse("s.yaml", text).unwrap();
    let mut withdrawn = Vec::new();
    let r = replay_seen(&s, |o| {
        if let timed::Observed::Withdrawn(at, job, _) = o {
            withdrawn.push((at, job.name.clone()));
        }
    });
    let by = |name: &str| &r.jobs[s.jobs.iter().position(|j| j.name == name).unwrap()];
    assert_eq!(withdrawn, [(40, "gang".to_string()), (60, "whole".to_string())]);
    for name in ["gang", "whole"] {
        let o = by(name);
        assert_eq!((o.start, o.end), (None, None), "{name}: {o:?}");
        assert!(o.waiting_reason.as_deref().is_some_and(|w| w.starts_with("withdrawn")), "{name}: {o:?}");
    }
    assert_eq!((by("gang").given_up, by("whole").given_up), (Some(40), Some(60)));
    assert_eq!(by("small").start, Some(100), "{:?}", by("small"));
    assert_eq!((by("late").start, by("late").end), (Some(30), Some(430)), "a job running at its withdraw_at runs on");
    assert!(by("late").given_up.is_none());
    // Without the gang's withdrawal, it takes two of the three GPUs free at 100 s.
    let kept = Scenario::parse("s.yaml", &text.replace(", withdraw_at: 40", "")).unwrap();
    let k = replay_seen(&kept, |_| {});
    assert_eq!((k.jobs[1].start, k.jobs[2].start), (Some(100), Some(200)), "{:?}", k.jobs);
    // Never started, and why.
    let why: Vec<(&String, &usize)> = r.waiting_by_reason.iter().collect();
    assert_eq!(why, [(&"withdrawn while it waited (its pods were deleted)".to_string(), &2)]);

    // Before the arrival, or for work taken over running, is malformed.
    let early = text.replace("withdraw_at: 60", "withdraw_at: 5");
    let e = Scenario::parse("s.yaml", &early).unwrap_err().to_string();
    assert!(e.contains("withdraw_at 5 s is before its arrival at 20 s"), "{e}");
    let running = text.replace("withdraw_at: 300", "withdraw_at: 300, running_on: [n1]");
    let e = Scenario::parse("s.yaml", &running).unwrap_err().to_string();
    assert!(e.contains("cannot be withdrawn"), "{e}");
}

/// How `s`'s gangs used its fabric's domains (the replay's own report).
fn fabric_report(s: &Scenario) -> timed::FabricStats {
    let set = full_set();
    let timeline = timed::PolicyTimeline::new(&set);
    let settings = timed::ReplaySettings { fabric: s.fabric.clone(), ..Default::default() };
    let tree = queue_tree(&s.queues).unwrap();
    let r = timed::run_observed(&timeline, &s.node_table(), &tree, &s.jobs, settings, |_| {}).unwrap();
    r.fabric.expect("the scenario has a fabric")
}

#[test]
fn gangs_that_prefer_one_nvlink_domain_get_one_where_a_topology_blind_placement_splits_them() {
    let aware_text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/nvl72.yaml"));
    let blind_text = aware_text.replace(", topology: {preferred: [nvidia.com/gpu.clique, example.com/block]}", "");
    assert_ne!(aware_text, blind_text);
    let aware = fabric_report(&Scenario::parse("nvl72.yaml", aware_text).unwrap());
    let blind = fabric_report(&Scenario::parse("nvl72.yaml", &blind_text).unwrap());
    let share = |f: &timed::FabricStats| f.gangs_in_one_domain as f64 / f.gangs_started.max(1) as f64;
    assert!(aware.gangs_started >= 50 && blind.gangs_started >= 50, "the gangs started: {aware:?} / {blind:?}");
    assert!(share(&aware) > share(&blind), "aware {aware:?} vs blind {blind:?}");
}

#[test]
fn a_gang_goes_to_its_preferred_level_then_the_next_and_never_leaves_a_required_one() {
    // Two racks of two 4-GPU nodes in one block; rack r0 has a GPU taken at 0.
    let text = |topology: &str| {
        format!(
            r#"{{
      "nodes": [
        {{"name": "a", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "H100", "labels": {{"rack": "r0", "block": "b"}}}},
        {{"name": "b", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "H100", "labels": {{"rack": "r0", "block": "b"}}}},
        {{"name": "c", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "H100", "labels": {{"rack": "r1", "block": "b"}}}},
        {{"name": "d", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 4, "model": "H100", "labels": {{"rack": "r1", "block": "b"}}}}
      ],
      "queues": ["q"],
      "jobs": [
        {{"name": "small", "queue": "q", "arrival": 0, "duration": 1000, "gpus": 1, "gpu_milli": 1000}},
        {{"name": "pair", "queue": "q", "arrival": 1, "duration": 100, "gpus": 4, "gpu_milli": 1000, "replicas": 2, "topology": {topology}}},
        {{"name": "three", "queue": "q", "arrival": 2, "duration": 100, "gpus": 4, "gpu_milli": 1000, "replicas": 3, "timeout": 50, "topology": {topology}}}
      ]
    }}"#
        )
    };
    let run = |topology: &str| {
        let s = Scenario::parse("s.json", &text(topology)).unwrap();
        let mut nodes: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let r = replay_full(&s, |d| {
            if let wasmsched_core::Decision::Bound { workload, node, .. } = d.decision {
                nodes.entry(workload.clone()).or_default().push(node.clone());
            }
        });
        (r, nodes)
    };
    // `small` sits on a node of r0 (best fit takes the first): the pair gets the whole rack r1,
    // and `three` (12 GPUs) fits no rack — preferring racks then the block, it goes to the block.
    let (r, nodes) = run(r#"{"preferred": ["rack", "block"]}"#);
    assert_eq!(nodes["pair"], ["c", "d"], "{nodes:?}");
    assert_eq!(r.jobs[2].start, Some(101), "when the pair ends: {:?}", r.jobs[2]);
    assert_eq!(nodes["three"].len(), 3, "{nodes:?}");
    // Required to stay in one rack, `three` never starts (its gang times out and comes back).
    let (r, nodes) = run(r#"{"required": "rack"}"#);
    assert_eq!(nodes["pair"], ["c", "d"]);
    assert_eq!(r.jobs[2].start, None, "{:?}", r.jobs[2]);
    assert!(!nodes.contains_key("three"), "{nodes:?}");
    // Slices of two, each in one rack, the whole anywhere: `three` is one pair in a rack and a
    // single, so it starts while `small` holds a GPU of r0 — when the pair ends.
    let (r, nodes) = run(r#"{"slices": {"size": 2, "level": "rack"}}"#);
    assert_eq!(r.jobs[2].start, Some(101), "{:?}", r.jobs[2]);
    let rack = |n: &str| if n == "a" || n == "b" { "r0" } else { "r1" };
    assert_eq!(rack(&nodes["three"][0]), rack(&nodes["three"][1]), "its first slice in one rack: {nodes:?}");
    // Malformed requests are refused with the job's name.
    for (bad, said) in [
        (r#"{}"#, "names no level"),
        (r#"{"preferred": ["rack", "rack"]}"#, "twice"),
        (r#"{"preferred": ["rack", "block"], "required": "rack"}"#, "could never be used"),
        (r#"{"required": "rack", "wait_seconds": 60}"#, "`wait_seconds` is for preferred levels"),
        (r#"{"slices": {"size": 0, "level": "rack"}}"#, "`slices` needs a `size` of at least 1"),
    ] {
        let e = Scenario::parse("s.json", &text(bad)).unwrap_err().to_string();
        assert!(e.contains("\"pair\"") && e.contains(said), "{bad}: {e}");
    }
}
