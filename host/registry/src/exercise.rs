//! Call every stage a plugin serves, once each, on a sample cluster: the run-time half of the
//! gates. Loading only proves that a component compiles and initialises; a plugin whose filter
//! traps, whose preempt plan points nowhere or whose fair share answers garbage passes that and
//! faults in production. `plugin check` reports these calls stage by stage, and a policy set's
//! smoke test fails on any of their faults, for the stages (preempt, fair share) that placing the
//! sample tasks does not reach.

use std::time::{Duration, Instant};

use wasmsched_api::{GPU_MILLI, PreemptCandidate, QueueState, Resources, Stage, Task, Victim};
use wasmsched_core::{CallContext, FaultKind, PluginFault, PolicyPlugin};

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

/// One stage called the way the gates call it: [`StageTry::run`] is the call that counts, and
/// [`StageTry::overran`] the deadline fault of a first try that a second did not repeat.
#[derive(Debug)]
pub struct StageTry {
    /// The call that counts: the only one, or the retry after a deadline fault.
    pub run: StageRun,
    /// The first try's deadline fault, when the retry was needed and got an answer.
    pub overran: Option<PluginFault>,
}

/// Call `stage` of `plugin` on `sample` as [`exercise`] does, and once more if that call overran
/// its deadline.
///
/// Why a deadline fault, and only it, gets a second try: the CPU budget is read from the thread's
/// CPU clock, and on a busy or virtualised machine that clock can also charge the call for work
/// that is not the guest's (the kernel reclaiming memory for a page fault, a virtual CPU the
/// hypervisor paused): one CI run read 11.8 ms for a call that takes 0.5 ms. The instance that
/// overran is discarded, so the retry runs on a fresh one, as the scheduler's next call would
/// (and its breaker, too, forgives a single fault). A plugin that overruns twice in a row fails;
/// any other fault is the plugin's own answer and counts at once.
pub fn exercise_stage(plugin: &dyn PolicyPlugin, stage: Stage, sample: &Sample) -> StageTry {
    let once = || exercise(plugin, &[stage], sample).pop().expect("one run per stage asked for");
    let run = once();
    match run.outcome {
        Err(fault) if fault.kind == FaultKind::Deadline => {
            let retry = once();
            match retry.outcome {
                Ok(_) => StageTry { run: retry, overran: Some(fault) },
                Err(_) => StageTry { run: retry, overran: None },
            }
        }
        _ => StageTry { run, overran: None },
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use wasmsched_api::batch::FilterBatch;
    use wasmsched_api::{DeviceShare, Preemption, Rejection, ShareDecision};
    use wasmsched_core::{FailurePolicy, Slot};

    use super::*;

    /// A score plugin that answers its calls with `script` in order (a fault kind, or `None` for
    /// a score), then with scores; it counts its calls.
    struct Scripted {
        script: Mutex<Vec<Option<FaultKind>>>,
        calls: Mutex<usize>,
    }

    impl Scripted {
        fn new(script: &[Option<FaultKind>]) -> Self {
            Scripted { script: Mutex::new(script.iter().rev().copied().collect()), calls: Mutex::new(0) }
        }

        fn calls(&self) -> usize {
            *self.calls.lock().unwrap()
        }
    }

    impl PolicyPlugin for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn stages(&self) -> &[Stage] {
            &[Stage::Score]
        }
        fn failure_policy(&self) -> FailurePolicy {
            FailurePolicy::FailClosed
        }
        fn filter_until(&self, _: CallContext<'_>, _: &Task, _: &[Slot], _: usize) -> Result<FilterBatch, PluginFault> {
            unreachable!("only score is exercised")
        }
        fn score(&self, _: CallContext<'_>, _: &Task, candidates: &[Slot]) -> Result<Vec<u32>, PluginFault> {
            *self.calls.lock().unwrap() += 1;
            match self.script.lock().unwrap().pop().flatten() {
                Some(kind) => {
                    Err(PluginFault::new("scripted", Stage::Score, kind, format!("scripted {}", kind.as_str())))
                }
                None => Ok(vec![7; candidates.len()]),
            }
        }
        fn select_devices(
            &self,
            _: CallContext<'_>,
            _: &Task,
            _: Slot,
        ) -> Result<Result<Vec<DeviceShare>, Rejection>, PluginFault> {
            unreachable!("only score is exercised")
        }
        fn select_victims(
            &self,
            _: CallContext<'_>,
            _: &Task,
            _: &[PreemptCandidate],
        ) -> Result<Option<Preemption>, PluginFault> {
            unreachable!("only score is exercised")
        }
        fn fair_share(&self, _: usize, _: &[QueueState], _: &Resources) -> Result<ShareDecision, PluginFault> {
            unreachable!("only score is exercised")
        }
    }

    #[test]
    fn one_overrun_is_retried_and_reported_two_in_a_row_fail() {
        let sample = Sample::synthetic();
        let once = Scripted::new(&[Some(FaultKind::Deadline)]);
        let tried = exercise_stage(&once, Stage::Score, &sample);
        assert_eq!(once.calls(), 2);
        assert!(tried.run.outcome.as_ref().is_ok_and(|a| a.contains("scores 7..7")), "{:?}", tried.run.outcome);
        assert_eq!(tried.overran.map(|f| f.message), Some("scripted deadline".to_string()));

        let twice = Scripted::new(&[Some(FaultKind::Deadline), Some(FaultKind::Deadline)]);
        let tried = exercise_stage(&twice, Stage::Score, &sample);
        assert_eq!(twice.calls(), 2, "no third try");
        assert_eq!(tried.run.outcome.map_err(|f| f.kind).err(), Some(FaultKind::Deadline));
        assert!(tried.overran.is_none());

        // An overrun and then a different fault: the second is the answer.
        let then_trap = Scripted::new(&[Some(FaultKind::Deadline), Some(FaultKind::Trap)]);
        let tried = exercise_stage(&then_trap, Stage::Score, &sample);
        assert_eq!(tried.run.outcome.map_err(|f| f.kind).err(), Some(FaultKind::Trap));
    }

    #[test]
    fn other_faults_count_at_once() {
        let sample = Sample::synthetic();
        for kind in [FaultKind::Trap, FaultKind::BadOutput, FaultKind::Memory, FaultKind::Fuel] {
            let plugin = Scripted::new(&[Some(kind)]);
            let tried = exercise_stage(&plugin, Stage::Score, &sample);
            assert_eq!(plugin.calls(), 1, "{kind:?} is not retried");
            assert_eq!(tried.run.outcome.map_err(|f| f.kind).err(), Some(kind));
            assert!(tried.overran.is_none());
        }
        let fine = Scripted::new(&[]);
        let tried = exercise_stage(&fine, Stage::Score, &sample);
        assert_eq!((fine.calls(), tried.overran.is_none()), (1, true));
    }
}
