//! The event schema: a CloudEvents 1.0 JSON envelope around one typed, versioned payload.
//!
//! The wire types live here, apart from the scheduler's internal model, so that the published
//! contract changes only on purpose: a breaking change to a payload is a new `type` (`…v2`), and
//! consumers match on `type`. `docs/events.schema.json` is generated from these types
//! ([`json_schema`]) and a test keeps it current.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The CloudEvents specification version of the envelope.
pub const SPEC_VERSION: &str = "1.0";

/// One published event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// Always `"1.0"`.
    pub specversion: Cow<'static, str>,
    /// Unique per event and stable across retries: JetStream de-duplicates on it (`Nats-Msg-Id`)
    /// and consumers may too.
    pub id: String,
    /// Who decided: `wasmsched/<cluster>/<component>`, e.g. `wasmsched/prod-a/scheduler`.
    pub source: String,
    /// When it was decided (virtual time in the simulator).
    pub time: Timestamp,
    /// What the event is about: a task id, group, queue, policy set, plugin or node.
    pub subject: String,
    /// The Kubernetes namespace of the workload, absent for cluster-scoped events (a CloudEvents
    /// extension attribute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Always `"application/json"`.
    pub datacontenttype: Cow<'static, str>,
    /// `type` and `data`.
    #[serde(flatten)]
    pub payload: Payload,
}

/// The versioned event types. Serialised as CloudEvents `type` plus `data`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", content = "data")]
pub enum Payload {
    /// A task was bound to a node.
    #[serde(rename = "io.wasmsched.task.scheduled.v1")]
    TaskScheduled(TaskScheduled),
    /// A scheduling attempt found no node; the task stays pending.
    #[serde(rename = "io.wasmsched.task.unschedulable.v1")]
    TaskUnschedulable(TaskUnschedulable),
    /// A placement's GPUs span NUMA nodes, or its estimated collective time is over the threshold.
    #[serde(rename = "io.wasmsched.task.topology-alert.v1")]
    TaskTopologyAlert(TaskTopologyAlert),
    /// A running task was evicted to make room.
    #[serde(rename = "io.wasmsched.task.preempted.v1")]
    TaskPreempted(TaskPreempted),
    /// A running task was stopped for another reason than preemption: its gang fell below
    /// min-member, or its node went away.
    #[serde(rename = "io.wasmsched.task.evicted.v1")]
    TaskEvicted(TaskEvicted),
    /// A task's run is over and what it held is free again: it completed, failed, was deleted,
    /// or stopped after an eviction. With `task-scheduled`, what usage accounting bills.
    #[serde(rename = "io.wasmsched.task.ended.v1")]
    TaskEnded(TaskEnded),
    /// A gang did not reach min-member within its timeout.
    #[serde(rename = "io.wasmsched.group.timed-out.v1")]
    GroupTimedOut(GroupTimedOut),
    /// A queue's deserved share changed.
    #[serde(rename = "io.wasmsched.queue.share-changed.v1")]
    QueueShareChanged(QueueShareChanged),
    /// A policy set was compiled, instantiated and smoke-tested.
    #[serde(rename = "io.wasmsched.policy.loaded.v1")]
    PolicyLoaded(PolicyLoaded),
    /// A shadow policy set decided differently from the live one.
    #[serde(rename = "io.wasmsched.policy.shadow-diff.v1")]
    PolicyShadowDiff(PolicyShadowDiff),
    /// The live policy set was replaced.
    #[serde(rename = "io.wasmsched.policy.swapped.v1")]
    PolicySwapped(PolicySwapped),
    /// A new policy set misbehaved and the previous one was restored.
    #[serde(rename = "io.wasmsched.policy.rolled-back.v1")]
    PolicyRolledBack(PolicyRolledBack),
    /// A candidate policy set failed a gate (digest, load, smoke test, shadow run) and never went
    /// live.
    #[serde(rename = "io.wasmsched.policy.rejected.v1")]
    PolicyRejected(PolicyRejected),
    /// A plugin trapped, ran over a budget or returned garbage.
    #[serde(rename = "io.wasmsched.plugin.fault.v1")]
    PluginFault(PluginFault),
    /// A GPU's health changed (from the node agent).
    #[serde(rename = "io.wasmsched.node.gpu-health-changed.v1")]
    NodeGpuHealthChanged(NodeGpuHealthChanged),
    /// A node's GPU inventory or topology changed (from the node agent; also sent at its start).
    #[serde(rename = "io.wasmsched.node.inventory-changed.v1")]
    NodeInventoryChanged(NodeInventoryChanged),
    /// The outbox was full and events were dropped; published as soon as there is room again.
    #[serde(rename = "io.wasmsched.events.dropped.v1")]
    EventsDropped(EventsDropped),
    /// A task arrived: what it asks for, once, when the scheduler first sees it.
    #[serde(rename = "io.wasmsched.task.submitted.v1")]
    TaskSubmitted(TaskSubmitted),
    /// A node joined, changed what it offers, or left, as the scheduler counts it.
    #[serde(rename = "io.wasmsched.node.capacity-changed.v1")]
    NodeCapacityChanged(NodeCapacityChanged),
    /// A queue was created or its configuration changed.
    #[serde(rename = "io.wasmsched.queue.configured.v1")]
    QueueConfigured(QueueConfigured),
    /// A task left before it ran: its pod was deleted while it waited.
    #[serde(rename = "io.wasmsched.task.withdrawn.v1")]
    TaskWithdrawn(TaskWithdrawn),
}

/// The kind of an event, without its data: filters, subjects and counters use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// [`Payload::TaskScheduled`]
    TaskScheduled,
    /// [`Payload::TaskUnschedulable`]
    TaskUnschedulable,
    /// [`Payload::TaskTopologyAlert`]
    TaskTopologyAlert,
    /// [`Payload::TaskPreempted`]
    TaskPreempted,
    /// [`Payload::TaskEvicted`]
    TaskEvicted,
    /// [`Payload::TaskEnded`]
    TaskEnded,
    /// [`Payload::GroupTimedOut`]
    GroupTimedOut,
    /// [`Payload::QueueShareChanged`]
    QueueShareChanged,
    /// [`Payload::PolicyLoaded`]
    PolicyLoaded,
    /// [`Payload::PolicyShadowDiff`]
    PolicyShadowDiff,
    /// [`Payload::PolicySwapped`]
    PolicySwapped,
    /// [`Payload::PolicyRolledBack`]
    PolicyRolledBack,
    /// [`Payload::PolicyRejected`]
    PolicyRejected,
    /// [`Payload::PluginFault`]
    PluginFault,
    /// [`Payload::NodeGpuHealthChanged`]
    NodeGpuHealthChanged,
    /// [`Payload::NodeInventoryChanged`]
    NodeInventoryChanged,
    /// [`Payload::EventsDropped`]
    EventsDropped,
    /// [`Payload::TaskSubmitted`]
    TaskSubmitted,
    /// [`Payload::NodeCapacityChanged`]
    NodeCapacityChanged,
    /// [`Payload::QueueConfigured`]
    QueueConfigured,
    /// [`Payload::TaskWithdrawn`]
    TaskWithdrawn,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 21] = [
        Kind::TaskScheduled,
        Kind::TaskUnschedulable,
        Kind::TaskTopologyAlert,
        Kind::TaskPreempted,
        Kind::TaskEvicted,
        Kind::TaskEnded,
        Kind::GroupTimedOut,
        Kind::QueueShareChanged,
        Kind::PolicyLoaded,
        Kind::PolicyShadowDiff,
        Kind::PolicySwapped,
        Kind::PolicyRolledBack,
        Kind::PolicyRejected,
        Kind::PluginFault,
        Kind::NodeGpuHealthChanged,
        Kind::NodeInventoryChanged,
        Kind::EventsDropped,
        Kind::TaskSubmitted,
        Kind::NodeCapacityChanged,
        Kind::QueueConfigured,
        Kind::TaskWithdrawn,
    ];

    /// The short name used in subjects and CLI filters, e.g. `task-scheduled`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TaskScheduled => "task-scheduled",
            Kind::TaskUnschedulable => "task-unschedulable",
            Kind::TaskTopologyAlert => "task-topology-alert",
            Kind::TaskPreempted => "task-preempted",
            Kind::TaskEvicted => "task-evicted",
            Kind::TaskEnded => "task-ended",
            Kind::GroupTimedOut => "group-timed-out",
            Kind::QueueShareChanged => "queue-share-changed",
            Kind::PolicyLoaded => "policy-loaded",
            Kind::PolicyShadowDiff => "policy-shadow-diff",
            Kind::PolicySwapped => "policy-swapped",
            Kind::PolicyRolledBack => "policy-rolled-back",
            Kind::PolicyRejected => "policy-rejected",
            Kind::PluginFault => "plugin-fault",
            Kind::NodeGpuHealthChanged => "node-gpu-health-changed",
            Kind::NodeInventoryChanged => "node-inventory-changed",
            Kind::EventsDropped => "events-dropped",
            Kind::TaskSubmitted => "task-submitted",
            Kind::NodeCapacityChanged => "node-capacity-changed",
            Kind::QueueConfigured => "queue-configured",
            Kind::TaskWithdrawn => "task-withdrawn",
        }
    }
}

impl Kind {
    /// The CloudEvents `type` of this kind's events, e.g. `io.wasmsched.task.scheduled.v1`.
    pub fn event_type(self) -> &'static str {
        match self {
            Kind::TaskScheduled => "io.wasmsched.task.scheduled.v1",
            Kind::TaskUnschedulable => "io.wasmsched.task.unschedulable.v1",
            Kind::TaskTopologyAlert => "io.wasmsched.task.topology-alert.v1",
            Kind::TaskPreempted => "io.wasmsched.task.preempted.v1",
            Kind::TaskEvicted => "io.wasmsched.task.evicted.v1",
            Kind::TaskEnded => "io.wasmsched.task.ended.v1",
            Kind::GroupTimedOut => "io.wasmsched.group.timed-out.v1",
            Kind::QueueShareChanged => "io.wasmsched.queue.share-changed.v1",
            Kind::PolicyLoaded => "io.wasmsched.policy.loaded.v1",
            Kind::PolicyShadowDiff => "io.wasmsched.policy.shadow-diff.v1",
            Kind::PolicySwapped => "io.wasmsched.policy.swapped.v1",
            Kind::PolicyRolledBack => "io.wasmsched.policy.rolled-back.v1",
            Kind::PolicyRejected => "io.wasmsched.policy.rejected.v1",
            Kind::PluginFault => "io.wasmsched.plugin.fault.v1",
            Kind::NodeGpuHealthChanged => "io.wasmsched.node.gpu-health-changed.v1",
            Kind::NodeInventoryChanged => "io.wasmsched.node.inventory-changed.v1",
            Kind::EventsDropped => "io.wasmsched.events.dropped.v1",
            Kind::TaskSubmitted => "io.wasmsched.task.submitted.v1",
            Kind::NodeCapacityChanged => "io.wasmsched.node.capacity-changed.v1",
            Kind::QueueConfigured => "io.wasmsched.queue.configured.v1",
            Kind::TaskWithdrawn => "io.wasmsched.task.withdrawn.v1",
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown event kind `{s}` (expected one of: {})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Payload {
    /// This payload's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Payload::TaskScheduled(_) => Kind::TaskScheduled,
            Payload::TaskUnschedulable(_) => Kind::TaskUnschedulable,
            Payload::TaskTopologyAlert(_) => Kind::TaskTopologyAlert,
            Payload::TaskPreempted(_) => Kind::TaskPreempted,
            Payload::TaskEvicted(_) => Kind::TaskEvicted,
            Payload::TaskEnded(_) => Kind::TaskEnded,
            Payload::GroupTimedOut(_) => Kind::GroupTimedOut,
            Payload::QueueShareChanged(_) => Kind::QueueShareChanged,
            Payload::PolicyLoaded(_) => Kind::PolicyLoaded,
            Payload::PolicyShadowDiff(_) => Kind::PolicyShadowDiff,
            Payload::PolicySwapped(_) => Kind::PolicySwapped,
            Payload::PolicyRolledBack(_) => Kind::PolicyRolledBack,
            Payload::PolicyRejected(_) => Kind::PolicyRejected,
            Payload::PluginFault(_) => Kind::PluginFault,
            Payload::NodeGpuHealthChanged(_) => Kind::NodeGpuHealthChanged,
            Payload::NodeInventoryChanged(_) => Kind::NodeInventoryChanged,
            Payload::EventsDropped(_) => Kind::EventsDropped,
            Payload::TaskSubmitted(_) => Kind::TaskSubmitted,
            Payload::NodeCapacityChanged(_) => Kind::NodeCapacityChanged,
            Payload::QueueConfigured(_) => Kind::QueueConfigured,
            Payload::TaskWithdrawn(_) => Kind::TaskWithdrawn,
        }
    }

    /// The envelope's `subject` and `namespace` for this payload.
    pub fn subject(&self) -> (String, Option<String>) {
        let task = |t: &TaskRef| (t.id.clone(), Some(t.namespace.clone()));
        match self {
            Payload::TaskScheduled(e) => task(&e.task),
            Payload::TaskUnschedulable(e) => task(&e.task),
            Payload::TaskTopologyAlert(e) => task(&e.task),
            Payload::TaskPreempted(e) => task(&e.victim),
            Payload::TaskEvicted(e) => task(&e.task),
            Payload::TaskEnded(e) => task(&e.task),
            Payload::GroupTimedOut(e) => (e.group.clone(), Some(e.namespace.clone())),
            Payload::QueueShareChanged(e) => (e.queue.clone(), None),
            Payload::PolicyLoaded(e) => (e.policy_set.name.clone(), None),
            Payload::PolicyShadowDiff(e) => (e.shadow.name.clone(), None),
            Payload::PolicySwapped(e) => (e.to.name.clone(), None),
            Payload::PolicyRolledBack(e) => (e.to.name.clone(), None),
            Payload::PolicyRejected(e) => (e.policy_set.name.clone(), None),
            Payload::PluginFault(e) => (e.plugin.clone(), None),
            Payload::NodeGpuHealthChanged(e) => (e.node.clone(), None),
            Payload::NodeInventoryChanged(e) => (e.node.clone(), None),
            Payload::EventsDropped(_) => ("outbox".into(), None),
            Payload::TaskSubmitted(e) => task(&e.task),
            Payload::NodeCapacityChanged(e) => (e.node.clone(), None),
            Payload::QueueConfigured(e) => (e.queue.clone(), None),
            Payload::TaskWithdrawn(e) => task(&e.task),
        }
    }

    /// The task this event concerns, if any (the victim for a preemption).
    pub fn task(&self) -> Option<&TaskRef> {
        match self {
            Payload::TaskScheduled(e) => Some(&e.task),
            Payload::TaskUnschedulable(e) => Some(&e.task),
            Payload::TaskTopologyAlert(e) => Some(&e.task),
            Payload::TaskPreempted(e) => Some(&e.victim),
            Payload::TaskEvicted(e) => Some(&e.task),
            Payload::TaskEnded(e) => Some(&e.task),
            Payload::TaskSubmitted(e) => Some(&e.task),
            Payload::TaskWithdrawn(e) => Some(&e.task),
            _ => None,
        }
    }
}

impl Event {
    /// An event of `payload` (its subject and namespace from the payload).
    pub fn new(id: String, source: String, time: Timestamp, payload: Payload) -> Event {
        let (subject, namespace) = payload.subject();
        Event {
            specversion: Cow::Borrowed(SPEC_VERSION),
            id,
            source,
            time,
            subject,
            namespace,
            datacontenttype: Cow::Borrowed("application/json"),
            payload,
        }
    }

    /// The event's kind.
    pub fn kind(&self) -> Kind {
        self.payload.kind()
    }

    /// A one-line human summary, for `wasmsched events tail --format text`. Enumerations are
    /// spelled as in the JSON (`elastic-shrink`, not `ElasticShrink`).
    pub fn summary(&self) -> String {
        let body = match &self.payload {
            Payload::TaskScheduled(e) => {
                let gpus: Vec<String> = e.gpus.iter().map(|g| format!("{}:{}", g.gpu, g.milli)).collect();
                format!("{} on {} gpus [{}] score {}", e.task, e.node, gpus.join(" "), e.score.total)
            }
            Payload::TaskUnschedulable(e) => {
                let reasons: Vec<String> =
                    e.reasons.iter().map(|r| format!("{} nodes: {} ({})", r.nodes, r.reason, r.stage)).collect();
                format!("{} attempt {}: {}", e.task, e.attempt, reasons.join("; "))
            }
            Payload::TaskTopologyAlert(e) => {
                format!(
                    "{} on {} gpus {:?}: {} {}: {}",
                    e.task,
                    e.node,
                    e.gpus,
                    spelled(&e.severity),
                    e.alert,
                    e.message
                )
            }
            Payload::TaskPreempted(e) => {
                let (reason, checkpoint) = (spelled(&e.reason), spelled(&e.checkpoint));
                format!("{} on {} by {} ({reason}, checkpoint {checkpoint})", e.victim, e.node, e.preemptor)
            }
            Payload::TaskEvicted(e) => format!("{} from {} ({})", e.task, e.node, spelled(&e.reason)),
            Payload::TaskEnded(e) => {
                let kept = if e.work_kept { ", work kept" } else { "" };
                format!("{} on {} since {} ({}{kept})", e.task, e.node, e.started, spelled(&e.reason))
            }
            Payload::GroupTimedOut(e) => {
                format!(
                    "{}/{} placed {} of min {} after {} s",
                    e.namespace, e.group, e.placed, e.min_member, e.waited_seconds
                )
            }
            Payload::QueueShareChanged(e) => format!("{} deserved {} (was {})", e.queue, e.deserved, e.previous),
            Payload::PolicyLoaded(e) => format!("{} ({} plugins)", e.policy_set, e.plugins.len()),
            Payload::PolicyShadowDiff(e) => {
                format!("{} vs live {}: {} of {} decisions differ", e.shadow, e.live, e.differing, e.decisions)
            }
            Payload::PolicySwapped(e) => match &e.from {
                Some(from) => format!("{from} -> {}", e.to),
                None => format!("-> {}", e.to),
            },
            Payload::PolicyRolledBack(e) => format!("{} -> {}: {}", e.from, e.to, e.reason),
            Payload::PolicyRejected(e) => format!("{} from {} failed {}: {}", e.policy_set, e.origin, e.gate, e.reason),
            Payload::PluginFault(e) => format!("{} in {} ({}): {}", e.plugin, e.stage, spelled(&e.fault), e.message),
            Payload::NodeGpuHealthChanged(e) => {
                format!("{} gpu {} {} -> {}: {}", e.node, e.gpu, spelled(&e.from), spelled(&e.to), e.reason)
            }
            Payload::NodeInventoryChanged(e) => {
                let unhealthy = if e.unhealthy_gpus.is_empty() {
                    String::new()
                } else {
                    format!(", unhealthy {:?}", e.unhealthy_gpus)
                };
                format!("{} {} GPUs, {}, driver {}{unhealthy}", e.node, e.gpus, e.interconnect, e.driver)
            }
            Payload::EventsDropped(e) => {
                format!("{} events dropped ({}) between {} and {}", e.count, e.reason, e.first, e.last)
            }
            Payload::TaskSubmitted(e) => {
                let r = &e.request;
                let gang = e
                    .gang
                    .as_ref()
                    .map_or(String::new(), |g| format!(", gang {} of {} (min {})", g.name, g.members, g.min_member));
                format!(
                    "{} in {}: cpu {}m mem {} B gpus {}x{}m{gang}",
                    e.task, e.task.queue, r.cpu_milli, r.memory_bytes, r.gpus, r.gpu_milli
                )
            }
            Payload::NodeCapacityChanged(e) if e.removed => format!("{} removed", e.node),
            Payload::NodeCapacityChanged(e) => {
                let model = e.gpu_model.as_deref().unwrap_or("-");
                format!("{} cpu {}m mem {} B, {} GPUs {model}", e.node, e.cpu_milli, e.memory_bytes, e.gpus)
            }
            Payload::QueueConfigured(e) => {
                let parent = e.parent.as_deref().unwrap_or("-");
                format!("{} (parent {parent}, weight {}, guarantee {})", e.queue, e.weight, e.guarantee)
            }
            Payload::TaskWithdrawn(e) => {
                format!("{} in {}: withdrawn after {} s waiting", e.task, e.task.queue, e.waited_seconds)
            }
        };
        format!("{} {:<24} {}", self.time, self.kind().name(), body)
    }
}

/// A value as the JSON spells it (an enumeration's kebab-case name), for text output.
fn spelled<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// A task, as events name it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskRef {
    /// Task (pod) name, unique within its namespace.
    pub id: String,
    /// Kubernetes namespace (`default` in the simulator).
    pub namespace: String,
    /// Queue the task was submitted to.
    pub queue: String,
    /// Pod group, if the task is part of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Priority value.
    #[serde(default)]
    pub priority: i32,
}

impl std::fmt::Display for TaskRef {
    /// `namespace/name`. On Kubernetes the id is already `namespace/name` (a pod's key), so it is
    /// shown once, not `ns/ns/name`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.id.strip_prefix(self.namespace.as_str()).and_then(|rest| rest.strip_prefix('/')) {
            Some(_) => f.write_str(&self.id),
            None => write!(f, "{}/{}", self.namespace, self.id),
        }
    }
}

/// A policy set and its version, as loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicySetRef {
    /// Name of the policy set.
    pub name: String,
    /// Monotonic version assigned at load.
    pub version: u64,
}

impl std::fmt::Display for PolicySetRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// A quantity of resources, in the policy contract's base units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Quantity {
    /// CPU in milli-cores.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// GPUs in milli-GPUs (1000 = one device).
    pub gpu_milli: u64,
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cpu {}m mem {} B gpu {}m", self.cpu_milli, self.memory_bytes, self.gpu_milli)
    }
}

/// A share of one GPU device given to a task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuShare {
    /// Device index on the node.
    pub gpu: u32,
    /// Milli-GPUs of that device.
    pub milli: u32,
}

/// How the chosen node ranked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScoreSummary {
    /// Weighted total score of the chosen node.
    pub total: u64,
    /// Nodes that passed filtering.
    pub feasible: u32,
    /// Nodes evaluated (after sampling).
    pub evaluated: u32,
}

/// Data of `io.wasmsched.task.scheduled.v1`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskScheduled {
    /// The task.
    pub task: TaskRef,
    /// Node it was bound to.
    pub node: String,
    /// GPU shares it got (empty for a CPU-only task).
    pub gpus: Vec<GpuShare>,
    /// How the node ranked.
    pub score: ScoreSummary,
    /// The policy set that decided.
    pub policy_set: PolicySetRef,
    /// Scheduling attempts so far, this one included.
    pub attempt: u32,
    /// What the task holds while it runs: CPU and memory as requested, GPUs as allocated (the sum
    /// of `gpus`). Usage accounting bills this for as long as the run lasts.
    #[serde(default)]
    pub allocated: Quantity,
    /// Model of its GPUs (its first device's), absent for a CPU-only task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Accelerator kind of its devices (`amd`, `gaudi`, …), absent for NVIDIA GPUs and CPU-only
    /// tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_kind: Option<String>,
    /// The node's pool (see [`TaskEnded::node_pool`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pool: Option<String>,
    /// When the task was submitted (the pod created, the job arrived): with `time`, how long it
    /// queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted: Option<Timestamp>,
    /// For a member of a gang with topology levels: the domain its gang went to, and why there when
    /// it is not the first level asked for (e.g. `in example.com/block block-0: no
    /// nvidia.com/gpu.clique domain had room`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

impl TaskScheduled {
    /// `self` with `allocated.gpu_milli` the sum of its GPU shares.
    pub fn with_gpu_total(mut self) -> Self {
        self.allocated.gpu_milli = self.gpus.iter().map(|g| u64::from(g.milli)).sum();
        self
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EndReason {
    /// It finished its work (a pod that `Succeeded`, a replayed job's duration done).
    #[default]
    Completed,
    /// It stopped with an error (a pod that `Failed`).
    Failed,
    /// It was deleted before it finished (not by the scheduler).
    Deleted,
    /// It stopped after the scheduler preempted it.
    Preempted,
    /// It stopped after another eviction (a broken gang, a lost node).
    Evicted,
}

/// Data of `io.wasmsched.task.ended.v1`: one run of a task, from its placement to the instant what
/// it held was free again (an evicted pod holds its GPUs until it has stopped). The event's `time`
/// is that instant. It repeats what its `task-scheduled` said, so that it can be billed alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskEnded {
    /// The task.
    pub task: TaskRef,
    /// Node it ran on.
    pub node: String,
    /// When the run began: the `time` of its `task-scheduled` event.
    pub started: Timestamp,
    /// GPU shares it held.
    pub gpus: Vec<GpuShare>,
    /// What it held (as in `task-scheduled`).
    pub allocated: Quantity,
    /// Model of its GPUs, absent for a CPU-only task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Accelerator kind of its devices, absent for NVIDIA GPUs (as in `task-scheduled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_kind: Option<String>,
    /// The node's pool: its `wasmsched.io/node-pool` label, else the managed platform's node-pool
    /// label (GKE, EKS, AKS, Karpenter); absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pool: Option<String>,
    /// Why it ended.
    pub reason: EndReason,
    /// Whether an evicted run's work survived: it checkpointed first, or its job went on without
    /// it (an elastic job shrunk; a gang member whose gang checkpointed). A run that was preempted
    /// or evicted without its work kept lost its GPU time: usage reports it as lost.
    #[serde(default)]
    pub work_kept: bool,
}

/// A scheduling stage, as events name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Queue admission: quota, capability, fair share.
    Queue,
    /// Node filtering.
    Filter,
    /// Node scoring.
    Score,
    /// GPU device selection.
    SelectDevices,
    /// Victim selection.
    Preempt,
    /// Fair-share computation.
    FairShare,
    /// Gang placement (min-member, topology domain).
    Gang,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        f.write_str(&s)
    }
}

/// One reason a task could not be placed, aggregated over nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StageReason {
    /// The stage that rejected.
    pub stage: Stage,
    /// The reason, e.g. `insufficient GPU share` or `taint gpu=reserved`.
    pub reason: String,
    /// Nodes that gave this reason (0 for reasons that are not about nodes, such as a queue limit).
    pub nodes: u32,
}

/// Data of `io.wasmsched.task.unschedulable.v1`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskUnschedulable {
    /// The task.
    pub task: TaskRef,
    /// Why, per stage and reason, most frequent first.
    pub reasons: Vec<StageReason>,
    /// The policy set that decided.
    pub policy_set: PolicySetRef,
    /// Scheduling attempts so far, this one included.
    pub attempt: u32,
}

/// Why a task was preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptReason {
    /// A higher-priority task in the same queue needed room.
    Priority,
    /// A queue below its deserved share reclaimed resources.
    Reclaim,
    /// An elastic job was shrunk toward its minimum.
    ElasticShrink,
}

/// What happened to the victim's checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CheckpointOutcome {
    /// The victim cannot checkpoint; it was evicted at once.
    NotCheckpointable,
    /// The victim reported its checkpoint done within its grace period.
    Done,
    /// The grace period ran out first.
    TimedOut,
}

/// Data of `io.wasmsched.task.preempted.v1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskPreempted {
    /// The evicted task.
    pub victim: TaskRef,
    /// Node it ran on.
    pub node: String,
    /// The task that needed the room.
    pub preemptor: TaskRef,
    /// Why.
    pub reason: PreemptReason,
    /// The checkpoint protocol's outcome.
    pub checkpoint: CheckpointOutcome,
    /// Grace period the victim was given, in seconds.
    pub grace_seconds: u64,
    /// For a reclaim, the shares it moved and the work it cost: what an operator audits a
    /// reclaim by. Absent for the other reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<ReclaimCost>,
}

/// What one reclaim moved and cost. The queues' figures are for the whole decision (every
/// victim evicted for the same preemptor in the same cycle); the lost work is this victim's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReclaimCost {
    /// The victim's queue (named in `victim.queue`): it held more than its deserved share and
    /// keeps at least that share.
    pub victim_queue: QueueShareMove,
    /// The preemptor's queue (named in `preemptor.queue`): it stays within its deserved share.
    pub preemptor_queue: QueueShareMove,
    /// GPU-seconds of work the victim loses (its run time × its GPUs; 0 when it checkpoints).
    pub lost_gpu_seconds: u64,
}

/// One queue's GPUs (in thousandths) around a reclaim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueShareMove {
    /// Held before the reclaim.
    pub before_gpu_milli: u64,
    /// Held after it.
    pub after_gpu_milli: u64,
    /// The queue's deserved share when the reclaim was decided.
    pub deserved_gpu_milli: u64,
}

impl std::fmt::Display for ReclaimCost {
    /// `queue a 24 → 16 GPUs (deserved 16), queue b 0 → 8 (deserved 16), 12.5 GPU-h lost`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gpus = |m: u64| m as f64 / 1000.0;
        let (v, p) = (&self.victim_queue, &self.preemptor_queue);
        write!(
            f,
            "victim's queue {} → {} GPUs (deserved {}), preemptor's queue {} → {} (deserved {}), {:.1} GPU-h lost",
            gpus(v.before_gpu_milli),
            gpus(v.after_gpu_milli),
            gpus(v.deserved_gpu_milli),
            gpus(p.before_gpu_milli),
            gpus(p.after_gpu_milli),
            gpus(p.deserved_gpu_milli),
            self.lost_gpu_seconds as f64 / 3600.0
        )
    }
}

/// Data of `io.wasmsched.task.evicted.v1`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TaskEvicted {
    /// The evicted task.
    pub task: TaskRef,
    /// Node it ran on.
    pub node: String,
    /// Why.
    pub reason: EvictedReason,
}

/// Why a task was evicted other than by preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EvictedReason {
    /// Another member of its gang was evicted and the gang fell below min-member: the rest go
    /// too, so no half gang holds GPUs.
    GangBroken,
    /// Its node was removed or no longer has room for it.
    NodeLost,
}

/// Data of `io.wasmsched.group.timed-out.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GroupTimedOut {
    /// Pod group name.
    pub group: String,
    /// Its namespace.
    pub namespace: String,
    /// Its queue.
    pub queue: String,
    /// Members required.
    pub min_member: u32,
    /// Members that could be placed at the last attempt.
    pub placed: u32,
    /// Seconds the group waited.
    pub waited_seconds: u64,
}

/// Data of `io.wasmsched.queue.share-changed.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueShareChanged {
    /// Queue name.
    pub queue: String,
    /// New deserved share.
    pub deserved: Quantity,
    /// Deserved share before.
    pub previous: Quantity,
    /// Allocated now.
    pub allocated: Quantity,
}

/// A plugin of a policy set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PluginRef {
    /// Plugin name.
    pub name: String,
    /// Stages it serves in the set, e.g. `["filter"]`.
    pub stages: Vec<Stage>,
    /// SHA-256 of the component, hex.
    pub digest: String,
}

/// Data of `io.wasmsched.policy.loaded.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyLoaded {
    /// The policy set.
    pub policy_set: PolicySetRef,
    /// Its plugins.
    pub plugins: Vec<PluginRef>,
    /// Milliseconds spent compiling, instantiating and smoke-testing.
    pub prepare_ms: u64,
}

/// One decision on which a shadow set disagreed with the live one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DecisionDiff {
    /// The task.
    pub task: TaskRef,
    /// Node chosen by the live set (none: unschedulable).
    pub live: Option<String>,
    /// Node chosen by the shadow set.
    pub shadow: Option<String>,
    /// The live set's score of its node, 0..=100 (weighted mean over its score plugins).
    #[serde(default)]
    pub live_score: Option<u32>,
    /// The shadow set's score of its node, 0..=100.
    #[serde(default)]
    pub shadow_score: Option<u32>,
}

/// Data of `io.wasmsched.policy.shadow-diff.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyShadowDiff {
    /// The live set.
    pub live: PolicySetRef,
    /// The shadow set.
    pub shadow: PolicySetRef,
    /// Decisions compared in this report.
    pub decisions: u64,
    /// Decisions that differ.
    pub differing: u64,
    /// Mean absolute difference of the two sets' scores (0..=100) of their chosen nodes, in
    /// thousandths, over decisions both placed.
    #[serde(default)]
    pub mean_score_delta_milli: u64,
    /// Decisions on which a shadow plugin faulted.
    #[serde(default)]
    pub shadow_faults: u64,
    /// A bounded sample of differing decisions.
    pub examples: Vec<DecisionDiff>,
}

/// Data of `io.wasmsched.policy.swapped.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicySwapped {
    /// The set that was live (none at start-up).
    pub from: Option<PolicySetRef>,
    /// The set that is live now.
    pub to: PolicySetRef,
}

/// Data of `io.wasmsched.policy.rolled-back.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyRolledBack {
    /// The set that misbehaved.
    pub from: PolicySetRef,
    /// The set restored.
    pub to: PolicySetRef,
    /// What tripped the rollback, e.g. `trap rate 12% > 1%`.
    pub reason: String,
}

/// Data of `io.wasmsched.policy.rejected.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyRejected {
    /// The candidate set.
    pub policy_set: PolicySetRef,
    /// Where it came from, e.g. `file:/etc/wasmsched/policy/policy.yaml`.
    pub origin: String,
    /// The gate it failed: `digest`, `load`, `stage`, `smoke` or `shadow`.
    pub gate: String,
    /// Why.
    pub reason: String,
}

/// How a plugin call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The guest trapped (panic, unreachable, out-of-bounds).
    Trap,
    /// The call ran past its wall-clock deadline.
    Deadline,
    /// The call ran out of fuel.
    Fuel,
    /// The guest exceeded its memory limit.
    Memory,
    /// The result broke the contract (wrong length, out-of-range score, unknown index).
    BadOutput,
    /// The guest returned an error.
    GuestError,
    /// The plugin does not implement the stage it was called for.
    NotImplemented,
    /// The circuit breaker is open; the plugin was not called.
    CircuitOpen,
    /// A fresh instance could not be created or initialised.
    Instantiate,
}

/// Data of `io.wasmsched.plugin.fault.v1`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PluginFault {
    /// Plugin name.
    pub plugin: String,
    /// Stage being run.
    pub stage: Stage,
    /// What went wrong.
    pub fault: FaultKind,
    /// Detail, truncated by the host.
    pub message: String,
    /// The policy set the plugin belongs to.
    pub policy_set: PolicySetRef,
}

/// GPU health, as the node agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GpuHealth {
    /// Usable.
    Healthy,
    /// Usable with reduced capability (e.g. NVLink down).
    Degraded,
    /// Not usable.
    Unhealthy,
}

/// Data of `io.wasmsched.node.gpu-health-changed.v1`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeGpuHealthChanged {
    /// Node name.
    pub node: String,
    /// Device index.
    pub gpu: u32,
    /// Device UUID, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Health before.
    pub from: GpuHealth,
    /// Health now.
    pub to: GpuHealth,
    /// Why, e.g. `XID 79: GPU has fallen off the bus`.
    pub reason: String,
    /// The XID error code, if one caused the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
}

/// How bad a topology alert is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AlertSeverity {
    /// Worth a look (GPUs span NUMA nodes).
    Warning,
    /// Act (estimated collective time over the threshold).
    Critical,
}

/// Data of `io.wasmsched.task.topology-alert.v1`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskTopologyAlert {
    /// The task placed.
    pub task: TaskRef,
    /// Its node.
    pub node: String,
    /// Its GPUs.
    pub gpus: Vec<u32>,
    /// How bad.
    pub severity: AlertSeverity,
    /// `topology-mismatch` or `communication-bottleneck`.
    pub alert: String,
    /// For humans, e.g. `GPUs [0, 1, 4, 5] span NUMA nodes 0, 1`.
    pub message: String,
}

/// Data of `io.wasmsched.node.inventory-changed.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeInventoryChanged {
    /// Node name.
    pub node: String,
    /// GPUs on the node.
    pub gpus: u32,
    /// `nvswitch`, `nvlink` or `pcie`.
    pub interconnect: String,
    /// Driver version, empty when the topology came from `nvidia-smi` text.
    #[serde(default)]
    pub driver: String,
    /// The `wasmsched.io/gpu-topology` annotation value written on the node (JSON text; its format
    /// is documented in `docs/topology.md`).
    pub topology: String,
    /// The capability labels written on the node.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Indexes of GPUs the agent marked unhealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_gpus: Vec<u32>,
}

/// Data of `io.wasmsched.events.dropped.v1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EventsDropped {
    /// Events dropped since the previous report.
    pub count: u64,
    /// Time of the first dropped event.
    pub first: Timestamp,
    /// Time of the last dropped event.
    pub last: Timestamp,
    /// Why, e.g. `outbox full (100000 events in memory, spill disabled)`.
    pub reason: String,
}

/// What one task asks for (each member of a gang asks for the same in the simulator; on
/// Kubernetes each pod says what it asks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskRequest {
    /// CPU in milli-cores.
    pub cpu_milli: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// GPU devices (0 for a CPU-only task).
    pub gpus: u32,
    /// Share of each device in milli-GPUs (1000 = whole devices).
    #[serde(default)]
    pub gpu_milli: u32,
    /// Allowed GPU models; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// Its devices are of this accelerator kind, absent for NVIDIA GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
}

/// An accelerator kind other than NVIDIA's, as a node offers or a task asks for it: the kind and
/// the extended resource its devices are counted as (`{kind: amd, resource: amd.com/gpu}`), so a
/// scenario rebuilt from the stream asks for and offers the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Accelerator {
    /// The kind's name (`amd`, `gaudi`, …).
    pub kind: String,
    /// The extended resource (`amd.com/gpu`, `habana.ai/gaudi`, …).
    pub resource: String,
}

/// The gang a task is a member of, as submitted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GangSpec {
    /// The gang's name (its workload: a pod group, a job's name in the simulator).
    pub name: String,
    /// Members it has.
    pub members: u32,
    /// The fewest that may run (an elastic job grows above it).
    pub min_member: u32,
    /// How long it may wait unplaced before it times out, when it says (else the scheduler's
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Its topology levels (node labels), in the order they are tried: all members in one domain
    /// of the first with room, else of the next; empty when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology: Vec<String>,
    /// It never leaves one domain of the last of `topology` (else it finally goes anywhere).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub topology_required: bool,
    /// Not required: how long it waits for one domain of the first of `topology` before it
    /// falls back (s; 0: at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub topology_wait_seconds: u64,
    /// Kueue's slices: members in runs of this many, in order, each inside one domain of
    /// `slice_topology` (0: no slices).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub slice_size: u32,
    /// The level each slice stays in one domain of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_topology: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Data of `io.wasmsched.task.withdrawn.v1`: a task left the scheduler before it ran — its pod
/// was deleted while it waited (a replayed job withdrawn at its `withdraw_at`). Its `time` is
/// when the scheduler saw it go. What tells a recorded stream's waiting work that gave up from
/// work still waiting at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskWithdrawn {
    /// The task.
    pub task: TaskRef,
    /// Seconds since it arrived (its `task-submitted`).
    pub waited_seconds: u64,
}

/// Data of `io.wasmsched.task.submitted.v1`: a task arrived (a pod the scheduler will place was
/// created, a replayed job arrived). With `task-scheduled` and `task-ended`, what turns a recorded
/// stream back into a scenario (`wasmsched scenario from-events`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskSubmitted {
    /// The task.
    pub task: TaskRef,
    /// What it asks for.
    pub request: TaskRequest,
    /// Its gang, absent for a task on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSpec>,
    /// Others may evict it.
    pub preemptible: bool,
    /// It may evict others (`false`: Kubernetes' `preemptionPolicy: Never`).
    pub preempts: bool,
    /// It saves a checkpoint when asked to leave, and is given a grace period for it.
    #[serde(default)]
    pub checkpointable: bool,
    /// The grace period it asked for (s), when it asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<u64>,
    /// How long its checkpoint takes (s), when known (the simulator's jobs say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_seconds: Option<u64>,
    /// How long it takes to stop once evicted (s), when known (the simulator's jobs say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_seconds: Option<u64>,
    /// How long it runs once started (s), when it declared it (the simulator's jobs do; a pod
    /// does not, and its run time is measured from its runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
    /// Its labels (what other pods' affinity terms select).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// It has inter-pod affinity terms (not carried here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pod_affinity: bool,
    /// It may go only to some nodes: a node selector or required node affinity (not carried here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_constraints: bool,
    /// It asks for DRA devices through ResourceClaims (not carried here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claims: bool,
    /// It was already running when the scheduler first saw it — a pod bound before the scheduler
    /// started (taken over), or a bound pod in a snapshot: where, and since when. Its
    /// `task-scheduled` is the earlier process's, or was never published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<RunningSince>,
}

/// Where a task found running has run, and since when.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunningSince {
    /// Its node.
    pub node: String,
    /// When it was placed there (its pod's `PodScheduled` condition, else its creation).
    pub since: Timestamp,
}

/// Data of `io.wasmsched.node.capacity-changed.v1`: what a node offers, as the scheduler counts
/// it. Sent when the node is first seen, when its capacity, GPUs or labels change, and with
/// `removed` when it leaves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCapacityChanged {
    /// Node name.
    pub node: String,
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in bytes.
    pub memory_bytes: u64,
    /// GPU devices.
    pub gpus: u32,
    /// Their model (the first device's), absent without GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// The node's pool (see [`TaskEnded::node_pool`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pool: Option<String>,
    /// Its labels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its devices are of this accelerator kind (the first device's), absent for NVIDIA GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// The scheduler knows its GPU topology (the agent's annotation, a scenario's topology file);
    /// the topology itself is in the agent's `node-inventory-changed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub topology: bool,
    /// The node left: the other fields are its last state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// Admission limits of a queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueAdmission {
    /// Most workloads it holds at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
    /// Most GPUs one workload may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus_per_job: Option<u32>,
    /// Inclusive range of the priorities it accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_range: Option<[i32; 2]>,
}

/// Data of `io.wasmsched.queue.configured.v1`: a queue's configuration, sent when the scheduler
/// first reads it and whenever it changes (`removed` when it is gone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueConfigured {
    /// Queue name.
    pub queue: String,
    /// Its parent, absent for a top-level queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Share among siblings.
    pub weight: u32,
    /// Always obtainable.
    pub guarantee: Quantity,
    /// Most it may hold, absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Quantity>,
    /// How far above its guarantee it may go, absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Quantity>,
    /// How much of its unused guarantee others may use, absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Quantity>,
    /// Others may reclaim what it borrows.
    pub reclaimable: bool,
    /// Its runs' protection from reclaim (s), when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_min_runtime_seconds: Option<u64>,
    /// Its runs' age past which no reclaim above a guarantee takes them (s), when it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_max_runtime_seconds: Option<u64>,
    /// Its admission limits.
    #[serde(default)]
    pub admission: QueueAdmission,
    /// The resource flavors its work may use, in order; empty: its parent's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flavors: Vec<String>,
    /// It has quotas per flavor (not carried here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flavor_quotas: bool,
    /// Its quotas of extended resources by name — another accelerator kind's devices
    /// (`amd.com/gpu`), DRA classes — besides CPU, memory and NVIDIA GPUs above; flavors' own
    /// are left out. A name not here is unbounded.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub resources: std::collections::BTreeMap<String, ResourceQuota>,
    /// The queue was removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// A queue's quota of one extended resource, in its units (devices for an accelerator's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceQuota {
    /// Always obtainable.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub guarantee: u64,
    /// Most it may hold, absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<u64>,
    /// How far above its guarantee it may go, absent: unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<u64>,
    /// How much of its unused guarantee others may use, absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<u64>,
}

/// The JSON Schema (2020-12) of [`Event`], generated from the types.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Event)).unwrap_or_default()
}
