//! What a replay reports and what its event stream says agree: every plugin fault a report
//! counts is a `plugin-fault` event and the other way round, and every eviction (a broken gang's
//! other members included) is an event.

use std::sync::Arc;

use wasmsched_api::Task;
use wasmsched_core::{FailurePolicy, NativePlugin, PolicySet};
use wasmsched_events::Payload;
use wasmsched_events::decisions::{self, CycleFacts};
use wasmsched_events::schema::PolicySetRef;
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_runtime::RuntimeConfig;
use wasmsched_sim::timed::{self, PolicyTimeline, Scenario, TimedRun};
use wasmsched_tests::fixtures;

/// Replay `scenario` under `set`, turning every decision into events as `wasmsched replay` does.
fn replay_with_events(set: &PolicySet, scenario: &Scenario) -> (TimedRun, Vec<Payload>) {
    let mut events = Vec::new();
    let none = Task::default();
    let run = timed::run_observed(
        &PolicyTimeline::new(set),
        &scenario.node_table(),
        &scenario.queue_tree().unwrap(),
        &scenario.jobs,
        timed::ReplaySettings::default(),
        |d| {
            let facts = CycleFacts {
                task: d.task.unwrap_or(&none),
                preemptor: None,
                grace_seconds: None,
                attempt: 0,
                min_member: 1,
                placed: 0,
                waited_seconds: 0,
                submitted: None,
            };
            events.extend(decisions::cycle(d.decision, &facts, d.nodes, &PolicySetRef::default()));
        },
    )
    .unwrap();
    (run, events)
}

fn count(events: &[Payload], pred: impl Fn(&Payload) -> bool) -> usize {
    events.iter().filter(|e| pred(e)).count()
}

/// A fail-open filter that panics on every task (`evil-…`): placements go on without it, and
/// each one carries the skipped fault. The report used to count only the cycle's own faults (0
/// here) while the stream held one event per skipped fault.
#[test]
fn fault_counts_in_the_report_equal_the_plugin_fault_events() {
    let (rt, _) = crate::runtime_with_faults(RuntimeConfig::default());
    let hostile = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            crate::unhurried("hostile-panic").with_config("panic").with_failure_policy(FailurePolicy::FailOpen),
        )
        .unwrap();
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    let set = PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .filter(Arc::new(hostile))
        .score(score.clone(), 1)
        .devices(score)
        .build();
    let scenario = Scenario::parse(
        "evil.json",
        r#"{
          "nodes": [{"name": "n1", "cpu_milli": 8000, "memory_mib": 65536, "gpus": 2, "model": "T4"}],
          "queues": ["a"],
          "jobs": [
            {"name": "evil-a", "queue": "a", "arrival": 0, "duration": 10, "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
            {"name": "evil-b", "queue": "a", "arrival": 1, "duration": 10, "cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000},
            {"name": "evil-c", "queue": "a", "arrival": 2, "duration": 10, "cpu_milli": 1000, "gpus": 2, "gpu_milli": 1000}
          ]
        }"#,
    )
    .unwrap();
    let (run, events) = replay_with_events(&set, &scenario);
    let fault_events = count(&events, |e| matches!(e, Payload::PluginFault(_)));
    assert!(run.faults > 0, "the hostile filter faulted on every task: {run:?}");
    assert_eq!(run.faults, fault_events, "report and stream disagree");
    assert!(run.jobs.iter().all(|j| j.start.is_some()), "fail-open: every job ran despite the faults");
}

/// The example scenario evicts four tasks, one of them the other member of a gang that fell
/// below min-member: four eviction events, three preemptions and one gang break.
#[test]
fn every_eviction_is_an_event_the_broken_gangs_members_included() {
    let score = Arc::new(NativePlugin::<GpuShareScore>::new(r#"{"policy":"best-fit"}"#, 1).unwrap());
    let set = PolicySet::builder()
        .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
        .score(score.clone(), 1)
        .devices(score)
        .fair_share(Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()))
        .preempt(Arc::new(NativePlugin::<PriorityPreempt>::new("", 1).unwrap()))
        .build();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenarios/queues-gangs-preemption.yaml");
    let scenario = Scenario::parse(path, &std::fs::read_to_string(path).unwrap()).unwrap();
    let (run, events) = replay_with_events(&set, &scenario);
    let preempted = count(&events, |e| matches!(e, Payload::TaskPreempted(_)));
    let evicted: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Payload::TaskEvicted(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(run.evictions, 4, "{run:?}");
    assert_eq!(preempted + evicted.len(), run.evictions, "one event per eviction");
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(evicted[0].reason, wasmsched_events::schema::EvictedReason::GangBroken);
    assert_eq!(run.faults, count(&events, |e| matches!(e, Payload::PluginFault(_))));
}
