//! Call every stage a plugin serves, once each, on a sample cluster: the run-time half of the
//! gates. Loading only proves that a component compiles and initialises; a plugin whose filter
//! traps, whose preempt plan points nowhere or whose fair share answers garbage passes that and
//! faults in production. `plugin check` reports these calls stage by stage, and a policy set's
//! smoke test fails on any of their faults, for the stages (preempt, fair share) that placing the
//! sample tasks does not reach.

use std::time::{Duration, Instant};

use wasmsched_api::{GPU_MILLI, PreemptCandidate, QueueState, Resources, Stage, Task, Victim};
use wasmsched_core::{CallContext, PluginFault, PolicyPlugin};

use crate::prepare::Sample;

/// One stage's call: what it answered (in words) or its fault, and how long it took.
#[derive(Debug)]
pub struct StageRun {
    /// The stage called.
    pub stage: Stage,
    /// A one-line summary of the answer, or the fault.
    pub outcome: Result<String, PluginFault>,
    /// Wall time of the call.
    pub took: Duration,
}

/// Call each of `stages` of `plugin` once on `sample` (a GPU task of the sample; for preempt, a
/// preemptor and candidate victims made from the sample tasks; for fair share, two queues under
/// a root). Stages the plugin does not implement are reported as its `NotImplemented` fault.
pub fn exercise(plugin: &dyn PolicyPlugin, stages: &[Stage], sample: &Sample) -> Vec<StageRun> {
    let nodes = &*sample.nodes;
    let ctx = CallContext { worker: 0, nodes };
    let slots: Vec<u32> = nodes.slots().collect();
    let fallback = Task { id: "check-1".into(), ..Default::default() };
    let task = sample.tasks.iter().find(|t| t.gpu.count > 0).or(sample.tasks.first()).unwrap_or(&fallback);
    stages
        .iter()
        .map(|&stage| {
            let started = Instant::now();
            let outcome = match stage {
                Stage::Filter => plugin.filter(ctx, task, &slots).map(|b| {
                    let fit = b.codes.iter().filter(|&&c| c == 0).count();
                    format!("{fit} of {} nodes fit task {}", slots.len(), task.id)
                }),
                Stage::Score => plugin.score(ctx, task, &slots).map(|s| {
                    let (lo, hi) = (s.iter().min().copied().unwrap_or(0), s.iter().max().copied().unwrap_or(0));
                    format!("scores {lo}..{hi} over {} nodes", s.len())
                }),
                Stage::SelectDevices => match slots.first() {
                    Some(&slot) => plugin.select_devices(ctx, task, slot).map(|r| match r {
                        Ok(shares) => format!("{} device shares on slot {slot}", shares.len()),
                        Err(rejection) => format!("no devices on slot {slot}: {}", rejection.reason),
                    }),
                    None => Ok("no node to select devices on".into()),
                },
                Stage::Preempt => {
                    let (preemptor, candidates) = preemption_case(task, &slots, sample);
                    plugin.select_victims(ctx, &preemptor, &candidates).map(|plan| match plan {
                        Some(p) => format!("evicts {} task(s) on candidate {}", p.victims.len(), p.candidate),
                        None => "no plan".into(),
                    })
                }
                Stage::FairShare => {
                    let (queues, cluster) = queue_case(nodes.slot_count() as u64);
                    plugin.fair_share(0, &queues, &cluster).map(|d| format!("serving order {:?}", d.order))
                }
            };
            StageRun { stage, outcome, took: started.elapsed() }
        })
        .collect()
}

/// A preemptor of high priority and, on every node, two running low-priority sample tasks.
fn preemption_case(task: &Task, slots: &[u32], sample: &Sample) -> (Task, Vec<PreemptCandidate>) {
    let preemptor = Task { id: format!("{}-preemptor", task.id), priority: 1_000, ..task.clone() };
    let victims: Vec<Victim> = sample
        .tasks
        .iter()
        .take(2)
        .map(|t| Victim {
            task: Task { priority: -10, ..t.clone() },
            running_seconds: 600,
            group_running: 1,
            group_min_member: 1,
            checkpointable: false,
        })
        .collect();
    let candidates = slots.iter().map(|&node| PreemptCandidate { node, victims: victims.clone() }).collect();
    (preemptor, candidates)
}

/// Two weighted queues under a root, one over its guarantee, on a cluster of `nodes` 8-GPU nodes.
fn queue_case(nodes: u64) -> (Vec<QueueState>, Resources) {
    let gpus = |n: u64| Resources { gpu_milli: n * u64::from(GPU_MILLI), ..Default::default() };
    let cluster = gpus(8 * nodes.max(1));
    let queue = |name: &str, parent, weight, allocated: u64, requested: u64| QueueState {
        name: name.into(),
        parent,
        weight,
        guarantee: gpus(1),
        capability: None,
        allocated: gpus(allocated),
        request: gpus(requested),
        decayed_usage: allocated as f64 * 3.6e6,
        reclaimable: true,
    };
    let queues =
        vec![queue("root", None, 1, 6, 12), queue("team-a", Some(0), 2, 5, 6), queue("team-b", Some(0), 1, 1, 6)];
    (queues, cluster)
}
