//! What users submit: a workload is one pod, a gang, or an elastic job, always in one leaf queue.

use wasmsched_api::{GPU_MILLI, Resources, Task};

use crate::gang::TopologyConstraint;
use crate::queue::QueueTree;

/// Whether a workload may evict others to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PreemptionPolicy {
    /// Lower-priority work of its queue, borrowed capacity of other queues, elastic surplus.
    #[default]
    LowerPriority,
    /// Never evicts anyone (kube's `preemptionPolicy: Never`); it only waits.
    Never,
}

/// A unit of admission: its members are placed together (at least `min_member` of them) or not at
/// all. Members beyond `min_member` are elastic: placed when capacity is idle, evicted first under
/// pressure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Unique name (a pod's `namespace/name`, a pod group's name).
    pub name: String,
    /// The leaf queue it is charged to.
    pub queue: String,
    /// Higher is more important; copied onto every member.
    pub priority: i32,
    /// The tasks, in placement order.
    pub members: Vec<Task>,
    /// The fewest members that may run (1..=members). Equal to the member count for a rigid gang.
    pub min_member: usize,
    /// Keep the members inside one topology domain.
    pub topology: Option<TopologyConstraint>,
    /// How long a gang may wait before it is given up ([`super::CoreConfig::gang_timeout_seconds`]
    /// when `None`). Lone tasks wait indefinitely, as pods do.
    pub timeout_seconds: Option<u64>,
    /// Whether it may evict others.
    pub preemption: PreemptionPolicy,
    /// Whether others may evict it.
    pub preemptible: bool,
    /// It saves a checkpoint when asked, so it is given a grace period before eviction.
    pub checkpointable: bool,
    /// Grace period for the checkpoint ([`super::CoreConfig::checkpoint_grace_seconds`] when `None`).
    pub grace_seconds: Option<u64>,
}

impl Workload {
    /// One task as its own workload (named by the task id, in the task's queue, at its priority).
    pub fn single(task: Task) -> Self {
        Workload {
            name: task.id.clone(),
            queue: task.queue.clone(),
            priority: task.priority,
            members: vec![task],
            min_member: 1,
            topology: None,
            timeout_seconds: None,
            preemption: PreemptionPolicy::default(),
            preemptible: true,
            checkpointable: false,
            grace_seconds: None,
        }
    }

    /// A gang of `members` of which at least `min_member` must run.
    pub fn gang(name: &str, queue: &str, priority: i32, members: Vec<Task>, min_member: usize) -> Self {
        Workload {
            name: name.into(),
            queue: queue.into(),
            priority,
            members,
            min_member,
            ..Workload::single(Task::default())
        }
    }

    /// Whether it is a group (more than one member): groups time out, lone tasks do not.
    pub fn is_group(&self) -> bool {
        self.members.len() > 1
    }

    /// Check it against `queues` and give every member the workload's queue, priority and group.
    pub(crate) fn normalise(mut self, queues: &QueueTree) -> Result<Self, WorkloadError> {
        let name = self.name.clone();
        let err = |reason: String| WorkloadError::Invalid { workload: name.clone(), reason };
        if self.name.is_empty() {
            return Err(WorkloadError::EmptyName);
        }
        if self.members.is_empty() || self.min_member == 0 || self.min_member > self.members.len() {
            return Err(err(format!(
                "min-member {} must be between 1 and its {} members",
                self.min_member,
                self.members.len()
            )));
        }
        let queue = queues
            .index_of(&self.queue)
            .ok_or_else(|| WorkloadError::UnknownQueue { workload: name.clone(), queue: self.queue.clone() })?;
        if !queues.is_leaf(queue) {
            return Err(err(format!("queue {} has child queues; work is submitted to leaf queues", self.queue)));
        }
        let group = self.is_group().then(|| self.name.clone());
        for (i, m) in self.members.iter_mut().enumerate() {
            if m.id.is_empty() {
                m.id = format!("{}-{i}", self.name);
            }
            let g = &m.gpu;
            let shape_ok = g.count == 0
                || (g.milli_per_gpu == GPU_MILLI)
                || (g.count == 1 && g.milli_per_gpu > 0 && g.milli_per_gpu < GPU_MILLI);
            if !shape_ok {
                return Err(err(format!(
                    "member {}: {} GPUs of {} milli each; whole GPUs (1000) or one shared GPU (1..999)",
                    m.id, g.count, g.milli_per_gpu
                )));
            }
            m.node_affinity
                .validate()
                .and_then(|()| m.pod_terms().validate())
                .map_err(|e| err(format!("member {}: {e}", m.id)))?;
            // Plugins receive `In`/`NotIn` lists sorted (the contract), and bisect long ones.
            m.node_affinity.sort_values();
            m.queue = self.queue.clone();
            m.priority = self.priority;
            m.group = group.clone();
        }
        for (i, m) in self.members.iter().enumerate() {
            if self.members[..i].iter().any(|o| o.id == m.id) {
                return Err(err(format!("member id {} appears twice", m.id)));
            }
        }
        if self.members.iter().try_fold(Resources::default(), |sum, m| sum.checked_add(&demand(m))).is_none() {
            return Err(err("its requests overflow".into()));
        }
        Ok(self)
    }
}

/// Everything a task takes from its queue's quota: its CPU, memory and extended resources plus its
/// NVIDIA GPUs in milli-GPUs (another kind's devices are an extended resource of its request).
pub(crate) fn demand(task: &Task) -> Resources {
    let mut r = task.request.clone();
    r.gpu_milli = task.gpu.counted_milli();
    r
}

/// [`demand`] of a task placed with `flavor`: its plain demand plus the flavor's qualified copies
/// that some quota of `queues` names (the others bound nothing).
pub(crate) fn demand_in(task: &Task, flavor: Option<&str>, queues: &QueueTree) -> Resources {
    let mut r = demand(task);
    if let Some(f) = flavor {
        let plain = r.clone();
        crate::flavor::add_flavored(&mut r, f, &plain);
        r.extended.retain(|(n, _)| !queues.unbounded_flavored(n));
    }
    r
}

/// Why a workload is refused at submission. Nothing is changed when this is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// A workload needs a name.
    #[error("a workload has an empty name")]
    EmptyName,
    /// The name is taken by a workload the core still tracks.
    #[error("workload {0} already exists")]
    Duplicate(String),
    /// A member's task id belongs to another workload.
    #[error("workload {workload}: task {task} already belongs to workload {owner}")]
    TaskTaken {
        /// The refused workload.
        workload: String,
        /// The task id.
        task: String,
        /// Who has it.
        owner: String,
    },
    /// The queue is not configured.
    #[error("workload {workload}: unknown queue {queue}")]
    UnknownQueue {
        /// The workload.
        workload: String,
        /// The queue it named.
        queue: String,
    },
    /// Its queue's admission limits refuse it.
    #[error("workload {workload}: refused by queue {queue}: {reason}")]
    Refused {
        /// The workload.
        workload: String,
        /// The queue.
        queue: String,
        /// Which limit, e.g. `queue job limit reached: 2`.
        reason: String,
    },
    /// Malformed in itself.
    #[error("workload {workload}: {reason}")]
    Invalid {
        /// The workload.
        workload: String,
        /// What is wrong.
        reason: String,
    },
}
