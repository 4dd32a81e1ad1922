//! Scheduling decisions as events: the core's placements and diagnoses in the event schema, the same
//! for the simulator, the benchmarks and the Kubernetes scheduler (feature `decisions`).

use crate::schema::{
    AlertSeverity, FaultKind, GpuShare, Payload, PluginFault, PolicySetRef, ScoreSummary, Stage, StageReason, TaskRef,
    TaskScheduled, TaskTopologyAlert, TaskUnschedulable,
};
use crate::{EventSink, Timestamp};
use wasmsched_api::{Stage as CoreStage, Task};
use wasmsched_core::{Diagnosis, FaultKind as CoreFault, Placement};

/// One placement decision.
pub struct Decision<'a> {
    /// The task decided.
    pub task: &'a Task,
    /// The placement and the chosen node's name, or why no node fit.
    pub outcome: Result<(&'a Placement, &'a str), &'a Diagnosis>,
    /// Nodes examined.
    pub evaluated: usize,
    /// Attempts for this task so far, this one included.
    pub attempt: u32,
}

/// Publish `d` on `sink` (if any), stamped with `time` (now when none): a `task-scheduled` event,
/// or `task-unschedulable` plus one `plugin-fault` per fault seen.
pub fn publish(sink: Option<&EventSink>, time: Option<Timestamp>, d: Decision<'_>, policy: &PolicySetRef) {
    let Some(sink) = sink else { return };
    let time = time.unwrap_or_else(Timestamp::now);
    match d.outcome {
        Ok((p, node)) => sink.emit_at(time, scheduled(d.task, node, p, d.evaluated, policy, d.attempt)),
        Err(diagnosis) => {
            for e in unschedulable(d.task, diagnosis, policy, d.attempt) {
                sink.emit_at(time, e);
            }
        }
    }
}

/// Publish a topology alert about a placement (S19 of the topology article).
pub fn publish_alert(
    sink: Option<&EventSink>,
    time: Timestamp,
    task: &Task,
    node: &str,
    placement: &Placement,
    alert: wasmsched_topology::alerts::Alert,
) {
    let Some(sink) = sink else { return };
    sink.emit_at(
        time,
        Payload::TaskTopologyAlert(TaskTopologyAlert {
            task: task_ref(task),
            node: node.to_owned(),
            gpus: placement.devices.iter().map(|d| d.gpu).collect(),
            severity: match alert.severity {
                wasmsched_topology::alerts::Severity::Warning => AlertSeverity::Warning,
                wasmsched_topology::alerts::Severity::Critical => AlertSeverity::Critical,
            },
            alert: alert.kind,
            message: alert.message,
        }),
    );
}

/// How events name a task.
pub fn task_ref(task: &Task) -> TaskRef {
    TaskRef {
        id: task.id.clone(),
        namespace: task.namespace.clone(),
        queue: task.queue.clone(),
        group: task.group.clone(),
        priority: task.priority,
    }
}

/// The `task-scheduled` event of a placement on `node`.
pub fn scheduled(
    task: &Task,
    node: &str,
    p: &Placement,
    evaluated: usize,
    policy: &PolicySetRef,
    attempt: u32,
) -> Payload {
    Payload::TaskScheduled(TaskScheduled {
        task: task_ref(task),
        node: node.to_owned(),
        gpus: p.devices.iter().map(|d| GpuShare { gpu: d.gpu, milli: d.milli }).collect(),
        score: ScoreSummary { total: p.score, feasible: p.feasible as u32, evaluated: evaluated as u32 },
        policy_set: policy.clone(),
        attempt,
    })
}

fn stage(s: CoreStage) -> Stage {
    match s {
        CoreStage::Filter => Stage::Filter,
        CoreStage::Score => Stage::Score,
        CoreStage::Preempt => Stage::Preempt,
        CoreStage::FairShare => Stage::FairShare,
        CoreStage::SelectDevices => Stage::SelectDevices,
    }
}

/// The unschedulable event (reasons aggregated over nodes, most frequent first) and one fault
/// event per plugin fault seen.
fn unschedulable(task: &Task, d: &Diagnosis, policy: &PolicySetRef, attempt: u32) -> Vec<Payload> {
    let mut reasons: Vec<StageReason> = d
        .rejections
        .iter()
        .map(|((plugin, reason), (nodes, _))| StageReason {
            stage: Stage::Filter,
            reason: format!("{reason} ({plugin})"),
            nodes: *nodes as u32,
        })
        .collect();
    for f in &d.faults {
        reasons.push(StageReason {
            stage: stage(f.stage),
            reason: format!("plugin {} failed: {}", f.plugin, f.kind.as_str()),
            nodes: 0,
        });
    }
    reasons.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
    let mut out = vec![Payload::TaskUnschedulable(TaskUnschedulable {
        task: task_ref(task),
        reasons,
        policy_set: policy.clone(),
        attempt,
    })];
    out.extend(d.faults.iter().map(|f| fault(f, policy)));
    out
}

fn fault(f: &wasmsched_core::PluginFault, policy: &PolicySetRef) -> Payload {
    Payload::PluginFault(PluginFault {
        plugin: f.plugin.clone(),
        stage: stage(f.stage),
        fault: match f.kind {
            CoreFault::Trap => FaultKind::Trap,
            CoreFault::Deadline => FaultKind::Deadline,
            CoreFault::Fuel => FaultKind::Fuel,
            CoreFault::Memory => FaultKind::Memory,
            CoreFault::BadOutput => FaultKind::BadOutput,
            CoreFault::GuestError => FaultKind::GuestError,
            CoreFault::NotImplemented => FaultKind::NotImplemented,
            CoreFault::CircuitOpen => FaultKind::CircuitOpen,
            CoreFault::Instantiate => FaultKind::Instantiate,
        },
        message: f.message.chars().take(1024).collect(),
        policy_set: policy.clone(),
    })
}
