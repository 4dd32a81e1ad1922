//! Scheduling decisions as events: the core's placements and diagnoses in the event schema, the same
//! for the simulator, the benchmarks and the Kubernetes scheduler (feature `decisions`).

use crate::record::{HeldView, PackedScheduled, Record, ScheduledView, TaskView};
use crate::schema::{
    Accelerator, AlertSeverity, CheckpointOutcome, EndReason, EvictedReason, FaultKind, GangSpec, GpuShare,
    GroupTimedOut, NodeCapacityChanged, Payload, PluginFault, PolicySetRef, PreemptReason, Quantity, QueueAdmission,
    QueueConfigured, QueueShareChanged, QueueShareMove, ReclaimCost, ResourceQuota, RunningSince, ScoreSummary, Stage,
    StageReason, TaskEnded, TaskEvicted, TaskPreempted, TaskRef, TaskRequest, TaskScheduled, TaskSubmitted,
    TaskTopologyAlert, TaskUnschedulable, TaskWithdrawn,
};
use crate::{EventSink, Timestamp};
use wasmsched_api::accelerators::Kind;
use wasmsched_api::{DeviceShare, Node, Stage as CoreStage, Task};
use wasmsched_core::{
    Decision as CycleDecision, Diagnosis, EvictReason, Explanation, FaultKind as CoreFault, NodeTable, Placement,
    PreemptKind, QueueMove, QueueShare, QueueSpec, Workload, flavored_resource,
};

fn share_move(m: &QueueMove) -> QueueShareMove {
    QueueShareMove {
        before_gpu_milli: m.before_gpu_milli,
        after_gpu_milli: m.after_gpu_milli,
        deserved_gpu_milli: m.deserved_gpu_milli,
    }
}

/// One placement decision.
pub struct Decision<'a> {
    /// The task decided.
    pub task: &'a Task,
    /// The placement and the chosen node, or why no node fit.
    pub outcome: Result<(&'a Placement, &'a Node), &'a Diagnosis>,
    /// Nodes examined.
    pub evaluated: usize,
    /// Attempts for this task so far, this one included.
    pub attempt: u32,
    /// When the task was submitted, if known.
    pub submitted: Option<Timestamp>,
}

/// Labels that name a node's pool, most specific first: ours, then the managed platforms' (GKE,
/// EKS managed node groups, AKS, Karpenter).
pub const NODE_POOL_LABELS: [&str; 5] = [
    "wasmsched.io/node-pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
];

/// The pool `node` belongs to (see [`NODE_POOL_LABELS`]).
pub fn node_pool(node: &Node) -> Option<&str> {
    NODE_POOL_LABELS.iter().find_map(|key| node.label(key))
}

/// The model of the GPUs a placement holds, and their accelerator kind unless NVIDIA's: its first
/// device's, found once for both (every decision's event asks).
pub fn gpu_model_and_kind<'n>(node: &'n Node, devices: &[DeviceShare]) -> (Option<&'n str>, Option<&'n str>) {
    let Some(first) = devices.first() else { return (None, None) };
    match node.gpus.iter().find(|g| g.index == first.gpu) {
        Some(g) => (Some(g.model.as_str()), Some(g.kind.as_str()).filter(|k| !k.is_empty())),
        None => (None, None),
    }
}

/// What a placed task holds: CPU and memory as requested, GPUs as allocated.
pub fn allocated(task: &Task, devices: &[DeviceShare]) -> Quantity {
    Quantity {
        cpu_milli: task.request.cpu_milli,
        memory_bytes: task.request.memory_bytes,
        gpu_milli: devices.iter().map(|d| u64::from(d.milli)).sum(),
    }
}

/// The deserved shares last published, per queue, to publish only their changes.
#[derive(Clone, Debug, Default)]
pub struct Shares {
    last: std::collections::BTreeMap<String, Quantity>,
}

impl Shares {
    /// `queue-share-changed` for each queue whose deserved share moved since the last call (a
    /// queue's first deserved share too, from zero).
    pub fn changes(&mut self, shares: &[QueueShare]) -> Vec<Payload> {
        let quantity = |r: &wasmsched_api::Resources| Quantity {
            cpu_milli: r.cpu_milli,
            memory_bytes: r.memory_bytes,
            gpu_milli: r.gpu_milli,
        };
        let mut out = Vec::new();
        for share in shares {
            let Some(deserved) = share.deserved.as_ref().map(quantity) else { continue };
            let previous = self.last.get(&share.name).copied().unwrap_or_default();
            if self.last.contains_key(&share.name) && previous == deserved {
                continue;
            }
            self.last.insert(share.name.clone(), deserved);
            out.push(Payload::QueueShareChanged(QueueShareChanged {
                queue: share.name.clone(),
                deserved,
                previous,
                allocated: quantity(&share.allocated),
            }));
        }
        out
    }
}

/// One run of a task that is over: the `task-ended` event, stamped with when what it held was
/// freed. `started` is the time of its `task-scheduled` event.
pub struct Ended<'a> {
    /// The task.
    pub task: &'a Task,
    /// Its node, as the scheduler knows it (for the GPU model and the pool); `None` when the node
    /// is gone, then `node_name` alone names it.
    pub node: Option<&'a Node>,
    /// The node's name.
    pub node_name: &'a str,
    /// The GPUs it held.
    pub devices: &'a [DeviceShare],
    /// When it was placed.
    pub started: Timestamp,
    /// Why it ended.
    pub reason: EndReason,
    /// Whether an evicted run's work survived (see [`TaskEnded::work_kept`]).
    pub work_kept: bool,
}

/// The `task-ended` event of `e`.
pub fn ended(e: Ended<'_>) -> Payload {
    let (model, kind) = e.node.map(|n| gpu_model_and_kind(n, e.devices)).unwrap_or_default();
    Payload::TaskEnded(TaskEnded {
        task: task_ref(e.task),
        node: e.node_name.to_owned(),
        started: e.started,
        gpus: e.devices.iter().map(|d| GpuShare { gpu: d.gpu, milli: d.milli }).collect(),
        allocated: allocated(e.task, e.devices),
        gpu_model: model.map(str::to_owned),
        gpu_kind: kind.map(str::to_owned),
        node_pool: e.node.and_then(node_pool).map(str::to_owned),
        reason: e.reason,
        work_kept: e.work_kept,
    })
}

/// Publish `d` on `sink` (if any), stamped with `time` (when none, [`Timestamp::now_coarse`]: a
/// few milliseconds behind at most, and a clock read cheaper by ~30 ns on the hot path): a
/// `task-scheduled` event, or `task-unschedulable` plus one `plugin-fault` per fault seen.
#[inline]
pub fn publish(sink: Option<&EventSink>, time: Option<Timestamp>, d: Decision<'_>, policy: &PolicySetRef) {
    let Some(sink) = sink else { return };
    let time = time.unwrap_or_else(Timestamp::now_coarse);
    match d.outcome {
        Ok((p, node)) => {
            let (model, kind) = gpu_model_and_kind(node, &p.devices);
            // Packed: no allocation on this (the scheduling) thread for typical names, instead of
            // seven (see `record`).
            let view = ScheduledView {
                task: TaskView {
                    id: &d.task.id,
                    namespace: &d.task.namespace,
                    queue: &d.task.queue,
                    group: d.task.group.as_deref(),
                    priority: d.task.priority,
                },
                node: &node.name,
                score: score_summary(p, d.evaluated),
                policy,
                attempt: d.attempt,
                held: HeldView {
                    cpu_milli: d.task.request.cpu_milli,
                    memory_bytes: d.task.request.memory_bytes,
                    gpu_model: model,
                    gpu_kind: kind,
                    node_pool: node_pool(node),
                    submitted: d.submitted,
                },
            };
            let gpus = p.devices.iter().map(|d| GpuShare { gpu: d.gpu, milli: d.milli });
            sink.emit_record_at(time, Record::Scheduled(PackedScheduled::pack(view, gpus)));
        }
        Err(diagnosis) => {
            for e in unschedulable(d.task, diagnosis, policy, d.attempt) {
                sink.emit_at(time, e);
            }
        }
    }
}

/// Publish a topology alert about a placement (scenario S19 of docs/topology.md).
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
#[inline]
pub fn task_ref(task: &Task) -> TaskRef {
    TaskRef {
        id: task.id.clone(),
        namespace: task.namespace.clone(),
        queue: task.queue.clone(),
        group: task.group.clone(),
        priority: task.priority,
    }
}

/// What the scheduler knows of a task's timings beyond its workload: the simulator's jobs declare
/// them, a pod does not.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// How long its checkpoint takes (s).
    pub checkpoint_seconds: Option<u64>,
    /// How long it takes to stop once evicted (s).
    pub termination_seconds: Option<u64>,
    /// How long it runs once started (s).
    pub duration_seconds: Option<u64>,
}

/// The accelerator of `kind` (stored form) that `resources` count, by `kinds`' table: `None` for
/// NVIDIA's, or a kind the table does not know.
fn accelerator(kinds: &[Kind], kind: &str, resources: &wasmsched_api::Resources) -> Option<Accelerator> {
    if kind.is_empty() {
        return None;
    }
    let resource = kinds.iter().find(|k| k.name == kind)?.resources.iter().find(|r| resources.extended(r) > 0)?;
    Some(Accelerator { kind: kind.to_string(), resource: resource.clone() })
}

/// The `task-submitted` event of `task`, a member of `workload`; `kinds`: the accelerator kinds
/// besides NVIDIA's the scheduler knows (the table's [`NodeTable::accelerators`]).
pub fn submitted(task: &Task, workload: &Workload, timings: Timings, kinds: &[Kind]) -> Payload {
    let gpu = &task.gpu;
    let gang = (workload.members.len() > 1 || task.group.is_some()).then(|| GangSpec {
        name: task.group.clone().unwrap_or_else(|| workload.name.clone()),
        members: workload.members.len() as u32,
        min_member: workload.min_member as u32,
        timeout_seconds: workload.timeout_seconds,
        topology: workload.topology.as_ref().map(|t| t.tiers.clone()).unwrap_or_default(),
        topology_required: workload.topology.as_ref().is_some_and(|t| t.strict),
        topology_wait_seconds: workload.topology.as_ref().map_or(0, |t| t.wait_seconds),
        slice_size: workload.topology.as_ref().and_then(|t| t.slices.as_ref()).map_or(0, |s| s.size as u32),
        slice_topology: workload.topology.as_ref().and_then(|t| t.slices.as_ref()).map(|s| s.level.clone()),
    });
    Payload::TaskSubmitted(TaskSubmitted {
        task: TaskRef { priority: workload.priority, ..task_ref(task) },
        request: TaskRequest {
            cpu_milli: task.request.cpu_milli,
            memory_bytes: task.request.memory_bytes,
            gpus: gpu.count,
            gpu_milli: if gpu.count == 0 { 0 } else { gpu.milli_per_gpu },
            gpu_models: gpu.models.clone(),
            accelerator: accelerator(kinds, &gpu.kind, &task.request),
        },
        gang,
        preemptible: workload.preemptible,
        preempts: workload.preemption != wasmsched_core::PreemptionPolicy::Never,
        checkpointable: workload.checkpointable,
        grace_seconds: workload.grace_seconds,
        checkpoint_seconds: timings.checkpoint_seconds.filter(|_| workload.checkpointable),
        termination_seconds: timings.termination_seconds,
        duration_seconds: timings.duration_seconds,
        labels: task.labels.iter().cloned().collect(),
        pod_affinity: !task.pod_terms().is_empty(),
        node_constraints: !task.node_selector.is_empty() || !task.node_affinity.required.is_empty(),
        claims: task.request.extended.iter().any(|(name, _)| name.starts_with(DEVICE_CLASS_PREFIX)),
        running: None,
    })
}

/// [`submitted`] of a task found running on `node` since `since` (taken over, or in a snapshot).
pub fn submitted_running(
    task: &Task,
    workload: &Workload,
    timings: Timings,
    kinds: &[Kind],
    node: &str,
    since: Timestamp,
) -> Payload {
    let mut payload = submitted(task, workload, timings, kinds);
    if let Payload::TaskSubmitted(s) = &mut payload {
        s.running = Some(RunningSince { node: node.to_string(), since });
    }
    payload
}

/// The `task-withdrawn` event of `task`, after `waited_seconds`.
pub fn withdrawn(task: &Task, waited_seconds: u64) -> Payload {
    Payload::TaskWithdrawn(TaskWithdrawn { task: task_ref(task), waited_seconds })
}

/// Extended resources that count a DeviceClass's devices (DRA claims).
const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The `node-capacity-changed` event of `node` (`topology`: its GPU topology is known; `removed`:
/// it left).
pub fn node_capacity(node: &Node, topology: bool, removed: bool, kinds: &[Kind]) -> Payload {
    let first = node.gpus.iter().next();
    Payload::NodeCapacityChanged(NodeCapacityChanged {
        node: node.name.clone(),
        cpu_milli: node.allocatable.cpu_milli,
        memory_bytes: node.allocatable.memory_bytes,
        gpus: node.gpus.len() as u32,
        gpu_model: first.map(|g| g.model.clone()),
        node_pool: node_pool(node).map(str::to_owned),
        labels: node.labels.iter().cloned().collect(),
        accelerator: first.and_then(|g| accelerator(kinds, &g.kind, &node.allocatable)),
        topology,
        removed,
    })
}

/// The `queue-configured` event of `spec` (`removed`: it is gone).
pub fn queue_configured(spec: &QueueSpec, removed: bool) -> Payload {
    let quantity = |r: &wasmsched_api::Resources| Quantity {
        cpu_milli: r.cpu_milli,
        memory_bytes: r.memory_bytes,
        gpu_milli: r.gpu_milli,
    };
    // Per-flavor quotas are qualified resources (`flavored_resource`: `<flavor>/<resource>`); an
    // extended resource's own name may hold a `/` too (`nvidia.com/gpu`).
    let flavored = |r: &wasmsched_api::Resources| {
        r.extended.iter().any(|(name, _)| spec.flavors.iter().any(|f| name.starts_with(&flavored_resource(f, ""))))
    };
    let limits =
        [Some(&spec.guarantee), spec.capability.as_ref(), spec.borrowing_limit.as_ref(), spec.lending_limit.as_ref()];
    let a = &spec.admission;
    Payload::QueueConfigured(QueueConfigured {
        queue: spec.name.clone(),
        parent: spec.parent.clone(),
        weight: spec.weight,
        guarantee: quantity(&spec.guarantee),
        capability: spec.capability.as_ref().map(quantity),
        borrowing_limit: spec.borrowing_limit.as_ref().map(quantity),
        lending_limit: spec.lending_limit.as_ref().map(quantity),
        reclaimable: spec.reclaimable,
        reclaim_min_runtime_seconds: spec.reclaim_min_runtime_seconds,
        reclaim_max_runtime_seconds: spec.reclaim_max_runtime_seconds,
        admission: QueueAdmission {
            max_jobs: a.max_jobs,
            max_gpus_per_job: a.max_gpus_per_job,
            priority_range: a.priority_range.map(|(lo, hi)| [lo, hi]),
        },
        flavors: spec.flavors.clone(),
        flavor_quotas: limits.into_iter().flatten().any(flavored),
        resources: resource_quotas(spec),
        removed,
    })
}

/// `spec`'s quotas of extended resources by name (flavors' own left out: see `flavor_quotas`).
fn resource_quotas(spec: &QueueSpec) -> std::collections::BTreeMap<String, ResourceQuota> {
    let is_flavors = |name: &str| spec.flavors.iter().any(|f| name.starts_with(&flavored_resource(f, "")));
    let mut out: std::collections::BTreeMap<String, ResourceQuota> = Default::default();
    let mut each = |r: Option<&wasmsched_api::Resources>, set: fn(&mut ResourceQuota, u64)| {
        for (name, v) in r.iter().flat_map(|r| r.extended.iter()).filter(|(n, _)| !is_flavors(n)) {
            set(out.entry(name.to_string()).or_default(), *v);
        }
    };
    each(Some(&spec.guarantee), |q, v| q.guarantee = v);
    each(spec.capability.as_ref(), |q, v| q.capability = Some(v));
    each(spec.borrowing_limit.as_ref(), |q, v| q.borrowing_limit = Some(v));
    each(spec.lending_limit.as_ref(), |q, v| q.lending_limit = Some(v));
    out.retain(|_, q| *q != ResourceQuota::default());
    out
}

/// The `task-scheduled` event of a placement on `node` (the node by name when the table no longer
/// has it).
#[inline]
pub fn scheduled(
    task: &Task,
    node: Result<&Node, &str>,
    p: &Placement,
    evaluated: usize,
    policy: &PolicySetRef,
    attempt: u32,
    submitted: Option<Timestamp>,
) -> Payload {
    let (name, node) = match node {
        Ok(n) => (n.name.as_str(), Some(n)),
        Err(name) => (name, None),
    };
    let (model, kind) = node.map(|n| gpu_model_and_kind(n, &p.devices)).unwrap_or_default();
    Payload::TaskScheduled(TaskScheduled {
        task: task_ref(task),
        node: name.to_owned(),
        gpus: p.devices.iter().map(|d| GpuShare { gpu: d.gpu, milli: d.milli }).collect(),
        score: score_summary(p, evaluated),
        policy_set: policy.clone(),
        attempt,
        allocated: allocated(task, &p.devices),
        gpu_model: model.map(str::to_owned),
        gpu_kind: kind.map(str::to_owned),
        node_pool: node.and_then(node_pool).map(str::to_owned),
        submitted,
        topology: None,
    })
}

#[inline]
fn score_summary(p: &Placement, evaluated: usize) -> ScoreSummary {
    ScoreSummary { total: p.score, feasible: p.feasible as u32, evaluated: evaluated as u32 }
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
    let mut out = vec![Payload::TaskUnschedulable(TaskUnschedulable {
        task: task_ref(task),
        reasons: node_reasons(d),
        policy_set: policy.clone(),
        attempt,
    })];
    out.extend(d.faults.iter().map(|f| fault(f, policy)));
    out
}

/// A diagnosis' node rejections and faults as reasons, most frequent first.
fn node_reasons(d: &Diagnosis) -> Vec<StageReason> {
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
    reasons
}

/// The schema's mirrors of the core's enums: the schema is the published contract and says each
/// value in its own words; `mirrors` (tests) fails when either side gains a variant alone.
fn fault_kind(k: CoreFault) -> FaultKind {
    match k {
        CoreFault::Trap => FaultKind::Trap,
        CoreFault::Deadline => FaultKind::Deadline,
        CoreFault::Fuel => FaultKind::Fuel,
        CoreFault::Memory => FaultKind::Memory,
        CoreFault::BadOutput => FaultKind::BadOutput,
        CoreFault::GuestError => FaultKind::GuestError,
        CoreFault::NotImplemented => FaultKind::NotImplemented,
        CoreFault::CircuitOpen => FaultKind::CircuitOpen,
        CoreFault::Instantiate => FaultKind::Instantiate,
    }
}

fn preempt_reason(k: &PreemptKind) -> PreemptReason {
    match k {
        PreemptKind::Priority => PreemptReason::Priority,
        PreemptKind::Reclaim(_) => PreemptReason::Reclaim,
        PreemptKind::ElasticShrink => PreemptReason::ElasticShrink,
    }
}

/// Why an eviction that is not a preemption happened (a preempted gang's other members go as a
/// broken gang).
fn evicted_reason(r: &EvictReason) -> EvictedReason {
    match r {
        EvictReason::NodeLost => EvictedReason::NodeLost,
        EvictReason::GangBroken | EvictReason::Preempted { .. } => EvictedReason::GangBroken,
    }
}

fn fault(f: &wasmsched_core::PluginFault, policy: &PolicySetRef) -> Payload {
    Payload::PluginFault(PluginFault {
        plugin: f.plugin.clone(),
        stage: stage(f.stage),
        fault: fault_kind(f.kind),
        message: f.message.chars().take(1024).collect(),
        policy_set: policy.clone(),
    })
}

/// What an event about a decision of the scheduling cycle needs beyond the decision itself; the
/// driver knows it from its workloads.
#[derive(Clone, Copy, Debug)]
pub struct CycleFacts<'a> {
    /// The task the decision names; for workload-level decisions, the workload's first member.
    pub task: &'a Task,
    /// For a preemption: the preemptor's first member.
    pub preemptor: Option<&'a Task>,
    /// For a preemption: the grace period the victim had to checkpoint, if it could.
    pub grace_seconds: Option<u64>,
    /// Attempts for the workload so far, this one included.
    pub attempt: u32,
    /// For a gang's timeout: its min-member.
    pub min_member: u32,
    /// For a gang's timeout: members that fit at its last attempt.
    pub placed: u32,
    /// For a gang's timeout: how long it waited (s).
    pub waited_seconds: u64,
    /// For a binding: when the task was submitted, if known.
    pub submitted: Option<Timestamp>,
}

/// The events of one decision of [`wasmsched_core::SchedulerCore::schedule`]: `task-scheduled`,
/// `task-unschedulable` (with queue, gang and preemption reasons beside the node rejections),
/// `task-preempted` (with the rule and the checkpoint's outcome), `group-timed-out`, `plugin-fault`.
/// Checkpoint requests and evictions for other reasons (a broken gang, a lost node) have no event
/// of their own: the preemption that caused them has one.
pub fn cycle(d: &CycleDecision, facts: &CycleFacts<'_>, nodes: &NodeTable, policy: &PolicySetRef) -> Vec<Payload> {
    let mut out = decision(d, facts, nodes, policy);
    // One `plugin-fault` per fault the decision carries: the same count as every report's.
    out.extend(d.faults().iter().map(|f| fault(f, policy)));
    out
}

/// The events of the decision itself, without its faults.
fn decision(d: &CycleDecision, facts: &CycleFacts<'_>, nodes: &NodeTable, policy: &PolicySetRef) -> Vec<Payload> {
    match d {
        CycleDecision::Bound { node, devices, score, feasible, topology, .. } => {
            let placement = Placement {
                node: nodes.slot_of(node).unwrap_or_default(),
                devices: devices.clone(),
                score: *score,
                feasible: *feasible,
                skipped_faults: Vec::new(),
            };
            let on = nodes.slot_of(node).and_then(|s| nodes.get(s)).ok_or(node.as_str());
            let mut event = scheduled(facts.task, on, &placement, nodes.len(), policy, facts.attempt, facts.submitted);
            if let Payload::TaskScheduled(s) = &mut event {
                s.topology = topology.clone();
            }
            vec![event]
        }
        CycleDecision::Unschedulable { explanation, .. } => explained(facts.task, explanation, policy),
        CycleDecision::Evicted { node, reason: EvictReason::Preempted { kind, checkpointed, .. }, .. } => {
            vec![Payload::TaskPreempted(TaskPreempted {
                victim: task_ref(facts.task),
                node: node.clone(),
                preemptor: facts.preemptor.map(task_ref).unwrap_or_default(),
                reason: preempt_reason(kind),
                checkpoint: match (facts.grace_seconds, checkpointed) {
                    (None, _) => CheckpointOutcome::NotCheckpointable,
                    (Some(_), true) => CheckpointOutcome::Done,
                    (Some(_), false) => CheckpointOutcome::TimedOut,
                },
                grace_seconds: facts.grace_seconds.unwrap_or(0),
                reclaim: match kind {
                    PreemptKind::Reclaim(m) => Some(ReclaimCost {
                        victim_queue: share_move(&m.victim_queue),
                        preemptor_queue: share_move(&m.preemptor_queue),
                        lost_gpu_seconds: m.lost_gpu_seconds,
                    }),
                    _ => None,
                },
            })]
        }
        CycleDecision::TimedOut { workload } => {
            vec![Payload::GroupTimedOut(GroupTimedOut {
                group: workload.clone(),
                namespace: facts.task.namespace.clone(),
                queue: facts.task.queue.clone(),
                min_member: facts.min_member,
                placed: facts.placed,
                waited_seconds: facts.waited_seconds,
            })]
        }
        CycleDecision::Evicted { node, reason, .. } => vec![Payload::TaskEvicted(TaskEvicted {
            task: task_ref(facts.task),
            node: node.clone(),
            reason: evicted_reason(reason),
        })],
        CycleDecision::Fault(_) | CycleDecision::PreemptionRequested { .. } => Vec::new(),
    }
}

/// `task-unschedulable` from a cycle's explanation (node reasons, then the queue's, the gang's and
/// preemption's).
fn explained(task: &Task, e: &Explanation, policy: &PolicySetRef) -> Vec<Payload> {
    let mut reasons = e.nodes.as_ref().map(node_reasons).unwrap_or_default();
    let other = |stage: Stage, reason: String| StageReason { stage, reason, nodes: 0 };
    reasons.extend(e.queue.clone().map(|q| other(Stage::Queue, q)));
    reasons.extend(
        e.gang.map(|(placed, min)| other(Stage::Gang, format!("gang: {placed} of {min} required members fit"))),
    );
    reasons.extend(e.pod_affinity.clone().map(|a| other(Stage::Filter, a)));
    reasons.extend(e.preemption.clone().map(|p| other(Stage::Preempt, p)));
    vec![Payload::TaskUnschedulable(TaskUnschedulable {
        task: task_ref(task),
        reasons,
        policy_set: policy.clone(),
        attempt: e.attempts,
    })]
}

#[cfg(test)]
mod mirrors {
    //! Each schema variant is what some core value becomes. The forward mappings are exhaustive
    //! matches (a core variant added alone does not compile there); the reverse ones here are
    //! too, so a schema variant added alone does not compile here, and one the forward mapping
    //! never produces fails the round trip.
    use super::*;

    #[test]
    fn every_schema_variant_is_what_a_core_value_becomes() {
        let stages = [Stage::Filter, Stage::Score, Stage::Preempt, Stage::FairShare, Stage::SelectDevices];
        for s in stages {
            let core = match s {
                Stage::Filter => CoreStage::Filter,
                Stage::Score => CoreStage::Score,
                Stage::Preempt => CoreStage::Preempt,
                Stage::FairShare => CoreStage::FairShare,
                Stage::SelectDevices => CoreStage::SelectDevices,
                // The cycle's own steps, not a plugin's stage: what `explained` says of a queue's
                // admission and a gang (checked below).
                Stage::Queue | Stage::Gang => continue,
            };
            assert_eq!(stage(core), s);
        }
        let explanation =
            Explanation { queue: Some("queue team at capability".into()), gang: Some((1, 4)), ..Default::default() };
        let Payload::TaskUnschedulable(u) = &explained(&Task::default(), &explanation, &PolicySetRef::default())[0]
        else {
            panic!("not unschedulable")
        };
        let said: Vec<Stage> = u.reasons.iter().map(|r| r.stage).collect();
        assert_eq!(said, [Stage::Queue, Stage::Gang], "queue admission and gang placement say their stage");
        use FaultKind as F;
        let faults = [
            F::Trap,
            F::Deadline,
            F::Fuel,
            F::Memory,
            F::BadOutput,
            F::GuestError,
            F::NotImplemented,
            F::CircuitOpen,
            F::Instantiate,
        ];
        for f in faults {
            let core = match f {
                F::Trap => CoreFault::Trap,
                F::Deadline => CoreFault::Deadline,
                F::Fuel => CoreFault::Fuel,
                F::Memory => CoreFault::Memory,
                F::BadOutput => CoreFault::BadOutput,
                F::GuestError => CoreFault::GuestError,
                F::NotImplemented => CoreFault::NotImplemented,
                F::CircuitOpen => CoreFault::CircuitOpen,
                F::Instantiate => CoreFault::Instantiate,
            };
            assert_eq!(fault_kind(core), f);
        }
        for r in [PreemptReason::Priority, PreemptReason::Reclaim, PreemptReason::ElasticShrink] {
            let core = match r {
                PreemptReason::Priority => PreemptKind::Priority,
                PreemptReason::Reclaim => PreemptKind::Reclaim(Default::default()),
                PreemptReason::ElasticShrink => PreemptKind::ElasticShrink,
            };
            assert_eq!(preempt_reason(&core), r);
        }
        for r in [EvictedReason::GangBroken, EvictedReason::NodeLost] {
            let core = match r {
                EvictedReason::GangBroken => EvictReason::GangBroken,
                EvictedReason::NodeLost => EvictReason::NodeLost,
            };
            assert_eq!(evicted_reason(&core), r);
        }
    }
}
