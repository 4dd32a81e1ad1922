//! Time-driven replay: waiting, re-activation on departures, priority, backfill, metrics, and the
//! scenario format's errors; then the real openb default trace with its creation/deletion times.

use std::sync::Arc;

use wasmsched_core::{NativePlugin, PolicySet};
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_sim::timed::{self, Job, Scenario};
use wasmsched_sim::trace;

fn set() -> PolicySet {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .build()
}

const SCENARIO: &str = r#"{
  "nodes": [{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 1, "model": "T4"}],
  "queues": ["a", "b"],
  "jobs": [
    {"name": "first",  "queue": "a", "arrival": 0, "duration": 10, "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
    {"name": "low",    "queue": "a", "arrival": 1, "duration": 5,  "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
    {"name": "high",   "queue": "b", "arrival": 2, "duration": 5,  "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "priority": 10},
    {"name": "huge",   "queue": "b", "arrival": 3, "duration": 5,  "cpu_milli": 1000, "gpus": 2, "gpu_milli": 1000, "priority": 20},
    {"name": "cpu",    "queue": "a", "arrival": 4, "duration": 1,  "cpu_milli": 1000}
  ]
}"#;

#[test]
fn jobs_wait_and_start_when_capacity_frees_in_priority_order_with_backfill() {
    let s = Scenario::parse("s.json", SCENARIO).unwrap();
    let r = timed::run(&set(), &s.node_table(), &s.jobs);
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
    assert_eq!((a.jobs, a.started, a.waiting), (3, 3, 0));
    assert_eq!(a.delay_p99, 14, "low waited 1 → 15");
    assert_eq!(r.queues["b"].delay_p50, 8);
    assert_eq!(r.horizon, 20);
    // The GPU is busy from 0 to 20: 100 % all along.
    assert!((r.utilisation_mean - 100.0).abs() < 1e-9, "{}", r.utilisation_mean);
    // Queue b got `high` but never `huge`: its service ratio is below a's, so fairness < 1.
    assert!(r.queues["b"].service_ratio < r.queues["a"].service_ratio);
    assert!(r.jain_fairness < 1.0 && r.jain_fairness > 0.5, "{}", r.jain_fairness);
}

#[test]
fn malformed_scenarios_are_rejected_with_a_reason() {
    let e = Scenario::parse("s.json", "{\"nodes\": [}").unwrap_err().to_string();
    assert!(e.starts_with("s.json:1:"), "{e}");
    for (bad, why) in [
        (SCENARIO.replace("\"queue\": \"b\", \"arrival\": 2", "\"queue\": \"c\", \"arrival\": 2"), "unknown queue"),
        (SCENARIO.replace("\"name\": \"low\"", "\"name\": \"first\""), "appears twice"),
        (
            SCENARIO.replace("\"gpus\": 2, \"gpu_milli\": 1000", "\"gpus\": 2, \"gpu_milli\": 500"),
            "not a valid GPU request",
        ),
        (SCENARIO.replace("\"priority\": 10", "\"priority\": 10, \"colour\": 1"), "unknown field"),
    ] {
        let e = Scenario::parse("s.json", &bad).unwrap_err().to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
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
    let r = timed::run(&set(), &table, &jobs);
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
