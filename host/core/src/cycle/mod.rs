//! The scheduling cycle: queues, quotas and fair share decide *which* workload goes next; filter →
//! score → device selection decide *where*; preemption makes room when nothing fits.
//!
//! [`SchedulerCore`] owns the cluster's accounting (a [`NodeTable`] and what every queue holds) and
//! the workloads. It does no I/O and reads no clock: drivers (the simulator, the Kubernetes
//! scheduler) feed it submissions, completions and node changes with their own notion of time, call
//! [`SchedulerCore::schedule`], and carry out the [`Decision`]s it returns (bind, ask for a
//! checkpoint, evict).
//!
//! # One cycle
//! 1. **Time passes** ([`SchedulerCore::schedule`]'s `now`): usage decays (half-life), checkpoint
//!    grace periods that ran out become evictions, gangs that waited past their timeout are given up.
//! 2. **Nominated first**: workloads whose victims have all left are tried before anyone else, so
//!    the room made for them is not taken by others.
//! 3. **Fair share picks the queue**: the fair-share plugin computes deserved shares and the serving
//!    order from every queue's allocation and pending requests; the head workload of the first
//!    queue in that order with work is tried, and the plugin is asked again (the order changes as
//!    allocations do). With one queue left it is served without asking. Within a queue: priority,
//!    then submission order; a workload that fails never blocks the ones behind it.
//! 4. **Quota, then place**: members that would push the queue (or an ancestor) past its
//!    capability are not placed; the rest go through [`place_group`], all-or-nothing at min-member.
//! 5. **Preempt** when it does not fit (module `preempt`), else it is **unschedulable**: its
//!    [`Explanation`] is kept, it backs off (1 s doubling to 10 s by default) and is parked until the
//!    cluster changes (capacity freed, node added) — never retried by polling.
//! 6. **Grow**: elastic workloads take idle capacity for members beyond min-member.
//!
//! # Preemption rules (why it cannot loop)
//! A workload may evict: lower-priority work of its own queue; elastic surplus (members beyond
//! min-member) of equal or lower priority anywhere; and, when its queue stays within its deserved
//! share after it is placed, work of *other* queues that hold more than their deserved share, are
//! reclaimable, and stay at or above their guarantee. Priority within a queue is a strict order and
//! reclaim only moves capacity from queues above their share to queues that remain within theirs,
//! so with stable deserved shares two workloads cannot evict each other back and forth. Shares move
//! with demand (submissions, completions), so the core also remembers who preempted whom and never
//! lets a workload evict one that evicted it. Evicted work re-enters its queue with the initial
//! back-off, never in the cycle that evicted it.
//!
//! Victims that can checkpoint are asked to ([`Decision::PreemptionRequested`]) and evicted when
//! they report [`SchedulerCore::checkpoint_done`] or their grace period ends; the preemptor waits
//! nominated meanwhile. A victim whose group would drop below min-member takes its whole group.
//! With [`CoreConfig::await_termination`] (Kubernetes: an eviction is a graceful deletion) an
//! evicted member's room stays in use until [`SchedulerCore::terminated`], and the preemptor waits
//! nominated for that too. Room freed for a nominated workload is held for it against equal and
//! lower priorities, not against higher ones; while it waits it may still be placed elsewhere
//! (without evicting more), and once its victims are gone it goes first.

mod explain;
mod failures;
mod live;
mod pod_affinity;
mod preempt;
mod workload;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ahash::AHashMap;
use tracing::{debug, warn};
use wasmsched_api::{DeviceShare, Node, Resources, ShareDecision};

use crate::alloc::{bind, bind_fact, release};
use crate::gang::{Adjust, GangError, GroupSpec, place_group};
use crate::node_table::{NodeTable, Slot};
use crate::placement::{Placement, PolicySet, feasible_nodes_to_find, place, place_among};
use crate::plugin::PluginFault;
use crate::queue::{QueueTree, UnusedReserves, fits};

pub use explain::Explanation;
use failures::Failures;
pub use pod_affinity::RunningPod;
pub use workload::{PreemptionPolicy, Workload, WorkloadError};
use workload::{demand, demand_in};

/// Tunables of the cycle. The defaults follow kube-scheduler, Volcano and Slurm where they have one.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreConfig {
    /// First back-off after a failed attempt (s); doubles per attempt.
    pub backoff_initial_seconds: u64,
    /// Longest back-off (s).
    pub backoff_max_seconds: u64,
    /// How long a gang may wait unplaced before it is given up (s); Volcano's default is 10 min.
    pub gang_timeout_seconds: u64,
    /// Grace period for a checkpointable victim to save its state (s).
    pub checkpoint_grace_seconds: u64,
    /// Half-life of the decayed usage that fair share over time reads (s); Slurm's default, 7 days.
    pub usage_half_life_seconds: u64,
    /// kube-scheduler's `percentageOfNodesToScore` for placement: `None` scores every feasible
    /// node; `Some(0)` is kube-scheduler's adaptive rule; `Some(p)` looks for `p` % of the nodes
    /// (see [`feasible_nodes_to_find`]).
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Most nodes offered to the preempt plugin per task (lowest slots among the nodes where
    /// preemption might help).
    pub max_preemption_candidates: usize,
    /// Within one cycle, a lone task identical to one that just failed (same requests, queue,
    /// priority, selectors; only the name differs) fails the same way without being tried, until
    /// something binds or leaves. Exact when filters and preempt plugins judge a task by what it
    /// asks for, not by its name; turn it off for plugins that do.
    pub reuse_failures: bool,
    /// Most workloads one cycle attempts (`None`: all that are ready). A live driver bounds the
    /// cycle so binds start and watch events are read while a large backlog is worked through;
    /// [`SchedulerCore::more_ready`] says when the next cycle should follow at once.
    pub max_attempts_per_cycle: Option<usize>,
    /// An evicted member's room stays in use until the driver reports it gone
    /// ([`SchedulerCore::terminated`]), and its preemptor waits nominated until then. A Kubernetes
    /// eviction is a graceful deletion (30 s by default, longer with finalizers): binding the
    /// preemptor at once would hand the victims' GPUs out twice. `false` treats an eviction as
    /// instant (trace replays that do not model termination).
    pub await_termination: bool,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            backoff_initial_seconds: 1,
            backoff_max_seconds: 10,
            gang_timeout_seconds: 600,
            checkpoint_grace_seconds: 30,
            usage_half_life_seconds: 7 * 24 * 3600,
            percentage_of_nodes_to_score: None,
            max_preemption_candidates: 100,
            reuse_failures: true,
            max_attempts_per_cycle: None,
            await_termination: false,
        }
    }
}

/// Where a workload stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting to be placed.
    Pending,
    /// Victims are leaving to make room; it goes first once they are gone.
    Preempting,
    /// At least min-member members run.
    Running,
    /// A gang that waited past its timeout; no longer scheduled.
    TimedOut,
}

/// Why a task was evicted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvictReason {
    /// To make room for `preemptor`; `checkpointed` when it reported a checkpoint first.
    Preempted {
        /// The workload it made room for.
        preemptor: String,
        /// Which rule allowed it.
        kind: PreemptKind,
        /// It saved a checkpoint before leaving.
        checkpointed: bool,
    },
    /// Another member of its group was evicted and the group fell below min-member.
    GangBroken,
    /// Its node was removed or no longer has room for it.
    NodeLost,
}

/// Which preemption rule let a victim go (module docs, "Preemption rules").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptKind {
    /// Higher-priority work of its own queue needed the room.
    Priority,
    /// A queue within its deserved share took back what the victim's queue borrowed.
    Reclaim,
    /// The victim's job was elastic and keeps running at or above its minimum.
    ElasticShrink,
}

/// What the driver must carry out, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Bind `task` to `node` with `devices`.
    Bound {
        /// Its workload.
        workload: String,
        /// The task.
        task: String,
        /// The node.
        node: String,
        /// GPUs.
        devices: Vec<DeviceShare>,
        /// The node's weighted total score.
        score: u64,
        /// Nodes that passed filtering for it.
        feasible: usize,
        /// Faults of fail-open plugins skipped while placing it.
        faults: Vec<PluginFault>,
    },
    /// An attempt failed; the explanation says why.
    Unschedulable {
        /// The workload.
        workload: String,
        /// Why.
        explanation: Explanation,
    },
    /// Ask `task` to checkpoint; it is evicted at `deadline` at the latest.
    PreemptionRequested {
        /// Its workload.
        workload: String,
        /// The task.
        task: String,
        /// Who needs the room.
        preemptor: String,
        /// Eviction time if it does not report a checkpoint first.
        deadline: u64,
    },
    /// Stop `task`. Its room is released here, or with [`CoreConfig::await_termination`] held
    /// until the driver reports it gone ([`SchedulerCore::terminated`]).
    Evicted {
        /// Its workload.
        workload: String,
        /// The task.
        task: String,
        /// The node it ran on.
        node: String,
        /// Why.
        reason: EvictReason,
    },
    /// A gang was given up after waiting past its timeout.
    TimedOut {
        /// The workload.
        workload: String,
    },
    /// A plugin failed; the cycle went on without it (fair share: tree order, no reclaim).
    Fault(PluginFault),
}

impl Decision {
    /// Every plugin fault this decision carries: its own (`Fault`), those of fail-open plugins
    /// skipped while placing (`Bound`), and those seen in a failed attempt (`Unschedulable`).
    /// Reports and event streams count faults through this one method, so they agree.
    pub fn faults(&self) -> &[PluginFault] {
        match self {
            Decision::Bound { faults, .. } => faults,
            Decision::Unschedulable { explanation, .. } => explanation.nodes.as_ref().map_or(&[], |d| &d.faults),
            Decision::Fault(f) => std::slice::from_ref(f),
            Decision::PreemptionRequested { .. } | Decision::Evicted { .. } | Decision::TimedOut { .. } => &[],
        }
    }
}

/// Errors of driver calls that name something the core does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// No such workload.
    #[error("unknown workload {0}")]
    UnknownWorkload(String),
    /// No such task, or it is not waiting to checkpoint.
    #[error("task {0} is not waiting for a checkpoint")]
    NotLeaving(String),
    /// No workload has this task.
    #[error("unknown task {0}")]
    UnknownTask(String),
    /// A queue change would leave a workload without its leaf queue.
    #[error("queue {queue} still holds workload {workload}")]
    QueueInUse {
        /// The queue missing (or no longer a leaf) in the new tree.
        queue: String,
        /// A workload in it.
        workload: String,
    },
}

/// What to do with a member that no longer fits its node when the node is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misfit {
    /// Evict it: the node lost capacity (the simulator's model).
    Evict,
    /// Count it anyway: it runs, and running pods are facts (a live cluster).
    Keep,
}

/// A workload's state, for status APIs and the CLI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadStatus {
    /// Phase.
    pub phase: Phase,
    /// Members placed (running or leaving), by node.
    pub nodes: Vec<String>,
    /// Members placed and not leaving.
    pub running: usize,
    /// Why it is not (fully) running, as of its last attempt.
    pub explanation: Explanation,
}

/// What a queue holds and deserves.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueShare {
    /// Queue name.
    pub name: String,
    /// Allocated to its subtree now.
    pub allocated: Resources,
    /// Deserved share from the last fair-share computation.
    pub deserved: Option<Resources>,
    /// Decayed usage (GPU-milli-seconds).
    pub decayed_usage: f64,
}

/// A placed member.
#[derive(Clone, Debug)]
struct Member {
    slot: Slot,
    node: String,
    devices: Vec<DeviceShare>,
    started: u64,
    /// Asked to checkpoint and leave.
    leaving: Option<Leaving>,
    /// The resource flavor it was placed with: its queue holds the flavor's quota until it leaves.
    flavor: Option<String>,
}

/// A member asked to checkpoint before it is evicted.
#[derive(Clone, Debug)]
struct Leaving {
    /// Evicted then at the latest.
    deadline: u64,
    /// For this workload.
    preemptor: String,
    /// Under this rule.
    kind: PreemptKind,
}

/// Capacity reserved for a nominated preemptor.
#[derive(Clone, Debug)]
struct Hold {
    node: String,
    task: wasmsched_api::Task,
    devices: Vec<DeviceShare>,
}

/// An evicted member still terminating ([`CoreConfig::await_termination`]): what it holds stays
/// bound on the table until the driver reports it gone.
#[derive(Clone, Debug)]
struct Terminating {
    hold: Hold,
    /// The workload it makes room for, while that one waits nominated: the room becomes its hold.
    preemptor: Option<String>,
}

#[derive(Clone, Debug)]
struct Entry {
    spec: Workload,
    leaf: usize,
    seq: u64,
    /// Submitted, or re-queued after eviction: the gang timeout counts from here.
    since: u64,
    phase: Phase,
    members: Vec<Option<Member>>,
    /// For `Preempting`: the victims it waits for.
    waiting_for: Vec<(String, usize)>,
    /// For `Preempting`: what victims that already left freed, kept bound on the table for it so
    /// nobody else takes the room meanwhile. Released just before it is tried.
    holds: Vec<Hold>,
    /// Workloads that preempted this one: it never preempts them in turn.
    preempted_by: Vec<String>,
    attempts: u32,
    not_before: u64,
    /// Parked at this cluster epoch: not tried again until the epoch moves (the cluster changed).
    parked_at: Option<u64>,
    explanation: Explanation,
}

impl Entry {
    fn running(&self) -> usize {
        self.members.iter().flatten().filter(|m| m.leaving.is_none()).count()
    }

    fn placed(&self) -> usize {
        self.members.iter().flatten().count()
    }

    /// Demand of the first `n` members.
    fn demand_of(&self, n: usize) -> Resources {
        let mut total = Resources::default();
        for m in &self.spec.members[..n.min(self.spec.members.len())] {
            total.saturating_add_assign(&demand(m));
        }
        total
    }

    /// What placed member `i` holds of its queue's quota (`queues`: the tree it is counted in).
    fn held(&self, i: usize, queues: &QueueTree) -> Resources {
        let flavor = self.members.get(i).and_then(|m| m.as_ref()?.flavor.as_deref());
        demand_in(&self.spec.members[i], flavor, queues)
    }

    /// The flavor its placed members use (an elastic workload grows within it).
    fn flavor(&self) -> Option<&str> {
        self.members.iter().flatten().find_map(|m| m.flavor.as_deref())
    }
}

/// The scheduling core; see the module docs.
#[derive(Debug)]
pub struct SchedulerCore {
    config: CoreConfig,
    queues: QueueTree,
    nodes: NodeTable,
    entries: BTreeMap<String, Entry>,
    owner: AHashMap<String, String>,
    seq: u64,
    /// Per queue, its subtree's allocation (running and leaving members).
    allocated: Vec<Resources>,
    usage: Vec<f64>,
    usage_at: u64,
    deserved: Option<Vec<Resources>>,
    /// Bumped on every change that may let parked work fit (capacity freed, node added).
    epoch: u64,
    /// The last cycle stopped at its attempt budget with work still ready.
    truncated: bool,
    /// Per node, the workloads with members on it and how many.
    on_node: AHashMap<String, AHashMap<String, u32>>,
    /// The nodes' allocatable total, taken at the start of each cycle: what lending queues'
    /// reserves are kept free of.
    capacity: Resources,
    /// With resource flavors: per flavor, then for nodes of none, the slots of its nodes (taken
    /// with `capacity`). Empty without flavors.
    flavor_nodes: Vec<Vec<Slot>>,
    /// Per node, the pods of others running there (for inter-pod affinity).
    foreign_pods: AHashMap<String, Vec<RunningPod>>,
    /// Of those, the ones with anti-affinity terms (every task is checked against them).
    foreign_anti: AHashMap<String, Vec<RunningPod>>,
    /// Workloads with a member with anti-affinity terms (every task is checked against them).
    anti_holders: ahash::AHashSet<String>,
    /// Parked workloads with required pod affinity: a pod starting may be the one they wait for,
    /// which no capacity change would signal.
    affinity_parked: ahash::AHashSet<String>,
    /// The unused reserves of lending queues and the roots' total allocation for the current
    /// `allocated` (`None` inside: no queue keeps a reserve): computed on first use, dropped by
    /// every change of `allocated`, so quota checks between two changes cost O(depth).
    reserves: OnceLock<Option<(UnusedReserves, Resources)>>,
    /// The version of the policy set the last cycle ran: parked work was judged by that set, so
    /// another one (a hot reload) may place it.
    policy_version: Option<u64>,
    /// The fair-share stage's input as last sent, refreshed in place: names, parents, weights,
    /// guarantees and limits change only with the tree (`set_queues` drops it), so a call copies
    /// only the allocations, requests and usage that changed instead of rebuilding every state
    /// (the stage is asked after every bind or eviction of a cycle).
    share_input: Option<Vec<wasmsched_api::QueueState>>,
    /// Evicted members still terminating, oldest first ([`CoreConfig::await_termination`]). A task
    /// may be there twice: evicted work is queued again and may be placed and evicted again before
    /// its first copy has stopped (a simulator's restart; on Kubernetes a new pod).
    terminating: Vec<Terminating>,
}

impl SchedulerCore {
    /// A core for `queues` with no nodes and no work.
    pub fn new(queues: QueueTree, config: CoreConfig) -> Self {
        let n = queues.len();
        SchedulerCore {
            config,
            queues,
            nodes: NodeTable::new(),
            entries: BTreeMap::new(),
            owner: AHashMap::new(),
            seq: 0,
            allocated: vec![Resources::default(); n],
            usage: vec![0.0; n],
            usage_at: 0,
            deserved: None,
            epoch: 0,
            truncated: false,
            on_node: AHashMap::new(),
            capacity: Resources::default(),
            flavor_nodes: Vec::new(),
            foreign_pods: AHashMap::new(),
            foreign_anti: AHashMap::new(),
            anti_holders: ahash::AHashSet::new(),
            affinity_parked: ahash::AHashSet::new(),
            reserves: OnceLock::new(),
            policy_version: None,
            share_input: None,
            terminating: Vec::new(),
        }
    }

    /// The nodes, with every placed member accounted.
    pub fn nodes(&self) -> &NodeTable {
        &self.nodes
    }

    /// The GPU topologies of the nodes, to change (static hardware facts: no member is affected).
    pub fn topologies_mut(&mut self) -> &mut crate::topology::Topologies {
        self.nodes.topologies_mut()
    }

    /// Sets or forgets one node's topology; nothing changes when it is the one already known.
    pub fn set_topology(&mut self, node: &str, topology: Option<wasmsched_topology::NodeTopology>) {
        self.nodes.set_topology(node, topology);
    }

    /// The queue tree.
    pub fn queues(&self) -> &QueueTree {
        &self.queues
    }

    /// Add a node or replace one (labels, taints, capacity, health). Members placed on it are
    /// accounted again; those that no longer fit are evicted. Capacity may have grown, so parked
    /// work is re-activated.
    pub fn upsert_node(&mut self, mut node: Node, now: u64) -> Vec<Decision> {
        node.allocated = Resources { extended: Vec::new(), ..Default::default() };
        node.gpus.update(|gpus| {
            for g in gpus.iter_mut() {
                g.free_milli = wasmsched_api::GPU_MILLI;
                g.free_memory_bytes = g.memory_bytes;
            }
        });
        self.put_node(node, now, Misfit::Evict)
    }

    fn put_node(&mut self, node: Node, now: u64, misfit: Misfit) -> Vec<Decision> {
        let name = node.name.clone();
        let slot = self.nodes.upsert(node);
        let mut out = Vec::new();
        // First every member that still fits is bound on the new node, then the misfits leave:
        // a misfit's gang may break and evict its other members, which must be bound by then
        // (an eviction releases what it held) and must not be evicted twice.
        let mut misfits = Vec::new();
        for (wl, idx) in self.members_on(&name) {
            let (task, devices) = {
                let e = &self.entries[&wl];
                let devices = e.members[idx].as_ref().map(|m| m.devices.clone()).unwrap_or_default();
                (&e.spec.members[idx], devices)
            };
            let ok = match misfit {
                Misfit::Evict => self.nodes.update_usage(slot, |n| bind(n, task, &devices)).is_some_and(|r| r.is_ok()),
                Misfit::Keep => self.nodes.update_usage(slot, |n| bind_fact(n, task, &devices)).is_some(),
            };
            if ok {
                if let Some(m) = self.entries.get_mut(&wl).and_then(|e| e.members[idx].as_mut()) {
                    m.slot = slot;
                }
            } else {
                misfits.push((wl, idx));
            }
        }
        for (wl, idx) in &misfits {
            // Not bound on the new node: forget it without releasing.
            let e = self.entries.get_mut(wl).expect("members_on lists tracked workloads");
            let held = e.held(*idx, &self.queues);
            e.members[*idx] = None;
            let (leaf, task) = (e.leaf, e.spec.members[*idx].id.clone());
            self.index_remove(&name, wl);
            self.account(leaf, &held, false);
            out.push(Decision::Evicted {
                workload: wl.clone(),
                task,
                node: name.clone(),
                reason: EvictReason::NodeLost,
            });
        }
        let mut broken: Vec<&String> = misfits.iter().map(|(wl, _)| wl).collect();
        broken.dedup();
        for wl in broken {
            self.after_eviction(wl, now, &mut out);
        }
        let holds: Vec<(String, usize)> = self
            .entries
            .iter()
            .flat_map(|(w, e)| {
                e.holds.iter().enumerate().filter(|(_, h)| h.node == name).map(move |(i, _)| (w.clone(), i))
            })
            .collect();
        for (w, i) in holds.into_iter().rev() {
            let h = self.entries[&w].holds[i].clone();
            if !matches!(self.nodes.update_usage(slot, |n| bind(n, &h.task, &h.devices)), Some(Ok(()))) {
                self.entries.get_mut(&w).expect("listed").holds.remove(i);
            }
        }
        // A terminating pod is still there, whatever the node now says it has room for.
        for t in self.terminating.iter().filter(|t| t.hold.node == name) {
            self.nodes.update_usage(slot, |n| bind_fact(n, &t.hold.task, &t.hold.devices));
        }
        self.unpark_all();
        out
    }

    /// Remove a node; everything on it is evicted (and gangs below min-member with it).
    pub fn remove_node(&mut self, name: &str, now: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        for (wl, idx) in self.members_on(name) {
            self.evict(&wl, idx, EvictReason::NodeLost, now, &mut out);
        }
        for e in self.entries.values_mut() {
            e.holds.retain(|h| h.node != name);
        }
        // Its pods are gone with it: a preemptor waiting for them only may go elsewhere.
        self.terminating.retain(|t| t.hold.node != name);
        self.foreign_pods.remove(name);
        self.foreign_anti.remove(name);
        self.nodes.remove(name);
        out
    }

    fn members_on(&self, node: &str) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        let Some(here) = self.on_node.get(node) else { return out };
        // In name order, as a walk of every workload would find them.
        let mut names: Vec<&String> = here.keys().collect();
        names.sort();
        for name in names {
            let Some(e) = self.entries.get(name) else { continue };
            for (i, m) in e.members.iter().enumerate() {
                if m.as_ref().is_some_and(|m| m.node == node) {
                    out.push((name.clone(), i));
                }
            }
        }
        out
    }

    /// Queue a workload. Refused (changing nothing) when malformed, in an unknown or non-leaf
    /// queue, clashing with a tracked workload or task, or outside its queue's admission limits.
    pub fn submit(&mut self, workload: Workload, now: u64) -> Result<(), WorkloadError> {
        self.enter(workload, now, true)
    }

    /// [`Self::submit`], with or without the admission limits (work already running is a fact).
    pub(super) fn enter(&mut self, workload: Workload, now: u64, admission: bool) -> Result<(), WorkloadError> {
        let workload = workload.normalise(&self.queues)?;
        if self.entries.contains_key(&workload.name) {
            return Err(WorkloadError::Duplicate(workload.name));
        }
        for m in &workload.members {
            if let Some(owner) = self.owner.get(&m.id) {
                return Err(WorkloadError::TaskTaken {
                    workload: workload.name.clone(),
                    task: m.id.clone(),
                    owner: owner.clone(),
                });
            }
        }
        let leaf = self.queues.index_of(&workload.queue).expect("normalise checked the queue");
        if admission {
            self.admit(&workload, leaf)?;
        }
        for m in &workload.members {
            self.owner.insert(m.id.clone(), workload.name.clone());
        }
        if workload.members.iter().any(|m| !m.pod_terms().anti_affinity.is_empty()) {
            self.anti_holders.insert(workload.name.clone());
        }
        self.seq += 1;
        let n = workload.members.len();
        self.entries.insert(
            workload.name.clone(),
            Entry {
                spec: workload,
                leaf,
                seq: self.seq,
                since: now,
                phase: Phase::Pending,
                members: vec![None; n],
                waiting_for: Vec::new(),
                holds: Vec::new(),
                preempted_by: Vec::new(),
                attempts: 0,
                not_before: now,
                parked_at: None,
                explanation: Explanation::default(),
            },
        );
        Ok(())
    }

    /// A workload completed (or was deleted): its resources are released and it is forgotten.
    pub fn finish(&mut self, workload: &str) -> Result<(), CoreError> {
        let e = self.entries.remove(workload).ok_or_else(|| CoreError::UnknownWorkload(workload.into()))?;
        self.anti_holders.remove(workload);
        for (i, m) in e.members.iter().enumerate() {
            if let Some(m) = m {
                self.index_remove(&m.node, workload);
                let task = &e.spec.members[i];
                self.nodes.update_usage(m.slot, |n| release(n, task, &m.devices));
                self.account(e.leaf, &e.held(i, &self.queues), false);
            }
        }
        self.release_holds(&e.holds);
        self.forget_nomination(workload);
        for t in &e.spec.members {
            self.owner.remove(&t.id);
        }
        self.unpark_all();
        Ok(())
    }

    /// A victim asked to checkpoint reports it is done: it is evicted now.
    pub fn checkpoint_done(&mut self, task: &str, now: u64) -> Result<Vec<Decision>, CoreError> {
        let not_leaving = || CoreError::NotLeaving(task.into());
        let wl = self.owner.get(task).cloned().ok_or_else(not_leaving)?;
        let e = &self.entries[&wl];
        let idx = e.spec.members.iter().position(|t| t.id == task).ok_or_else(not_leaving)?;
        let Some(Leaving { preemptor, kind, .. }) = e.members[idx].as_ref().and_then(|m| m.leaving.clone()) else {
            return Err(not_leaving());
        };
        let mut out = Vec::new();
        self.evict(&wl, idx, EvictReason::Preempted { preemptor, kind, checkpointed: true }, now, &mut out);
        Ok(out)
    }

    /// The state of a workload.
    pub fn status(&self, workload: &str) -> Option<WorkloadStatus> {
        let e = self.entries.get(workload)?;
        Some(WorkloadStatus {
            phase: e.phase,
            nodes: e.members.iter().flatten().map(|m| m.node.clone()).collect(),
            running: e.running(),
            explanation: e.explanation.clone(),
        })
    }

    /// Why a workload is pending, as of its last attempt.
    pub fn explain(&self, workload: &str) -> Option<&Explanation> {
        self.entries.get(workload).map(|e| &e.explanation)
    }

    /// Names of the workloads in a phase, in submission order.
    pub fn workloads_in(&self, phase: Phase) -> Vec<&str> {
        let mut v: Vec<&Entry> = self.entries.values().filter(|e| e.phase == phase).collect();
        v.sort_by_key(|e| e.seq);
        v.into_iter().map(|e| e.spec.name.as_str()).collect()
    }

    /// Every queue's allocation, deserved share and decayed usage.
    pub fn queue_shares(&self) -> Vec<QueueShare> {
        (0..self.queues.len())
            .map(|i| QueueShare {
                name: self.queues.get(i).map(|q| q.name.clone()).unwrap_or_default(),
                allocated: self.allocated[i].clone(),
                deserved: self.deserved.as_ref().and_then(|d| d.get(i).cloned()),
                decayed_usage: self.usage[i],
            })
            .collect()
    }

    /// Whether the last cycle stopped at [`CoreConfig::max_attempts_per_cycle`] with workloads
    /// still ready to be tried: run the next one without waiting.
    pub fn more_ready(&self) -> bool {
        self.truncated
    }

    /// The earliest time something happens without outside input (a back-off ends, a grace
    /// period runs out, a gang times out), so a driver can sleep until then instead of polling.
    pub fn next_wakeup(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        for e in self.entries.values() {
            match e.phase {
                Phase::Pending | Phase::Preempting if !self.is_parked(e) => at(e.not_before),
                _ => {}
            }
            if e.phase == Phase::Pending && e.spec.is_group() {
                at(e.since.saturating_add(self.timeout_of(e)));
            }
            for m in e.members.iter().flatten() {
                if let Some(l) = &m.leaving {
                    at(l.deadline);
                }
            }
        }
        next
    }

    fn timeout_of(&self, e: &Entry) -> u64 {
        e.spec.timeout_seconds.unwrap_or(self.config.gang_timeout_seconds)
    }

    /// Run one cycle at time `now` (seconds, never decreasing). A cycle runs one set from start
    /// to end; when `set` is another version than the last cycle's, everything parked may be tried
    /// again (after its back-off): its verdicts came from the old policies.
    pub fn schedule(&mut self, set: &PolicySet, now: u64) -> Vec<Decision> {
        if self.policy_version.replace(set.version()).is_some_and(|v| v != set.version()) {
            self.unpark_all();
        }
        let mut out = Vec::new();
        self.advance(now, &mut out);
        (self.capacity, self.flavor_nodes) = self.cluster_capacity();

        let mut nominated: Vec<&Entry> = self.entries.values().filter(|e| e.phase == Phase::Preempting).collect();
        nominated.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
        let nominated: Vec<(String, bool)> =
            nominated.into_iter().map(|e| (e.spec.name.clone(), self.victims_gone(e))).collect();
        for (name, gone) in nominated {
            let e = self.entries.get_mut(&name).expect("listed");
            if gone {
                // Its victims have left: it goes first, on the room kept for it, preempting
                // again if that room was taken by someone who outranks it.
                let holds = std::mem::take(&mut e.holds);
                e.phase = Phase::Pending;
                e.waiting_for.clear();
                self.release_holds(&holds);
                self.attempt(set, &name, now, &mut out, true);
            } else if e.parked_at != Some(self.epoch) && e.not_before <= now {
                // Still waiting (a long grace period, a finalizer): like kube-scheduler's nominated
                // pods, it takes room elsewhere if some appears, never evicting more meanwhile.
                self.attempt(set, &name, now, &mut out, false);
            }
        }

        // Eligible pending work by leaf queue, best first. Fair share sees the demand of *all*
        // waiting work (parked and backing-off too), so deserved shares move only when real demand
        // does, not with retry timing.
        let mut pending = vec![Resources::default(); self.queues.len()];
        let mut lists: BTreeMap<usize, Vec<&Entry>> = BTreeMap::new();
        for e in self.entries.values() {
            if matches!(e.phase, Phase::Pending | Phase::Preempting) {
                let d = self.wanted(e, e.demand_of(e.spec.members.len()));
                for q in self.queues.chain(e.leaf) {
                    pending[q].saturating_add_assign(&d);
                }
            }
            if e.phase == Phase::Pending && !self.is_parked(e) && e.not_before <= now {
                lists.entry(e.leaf).or_default().push(e);
            }
        }
        let mut lists: BTreeMap<usize, std::collections::VecDeque<String>> = lists
            .into_iter()
            .map(|(leaf, mut v)| {
                v.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
                (leaf, v.into_iter().map(|e| e.spec.name.clone()).collect())
            })
            .collect();
        let cluster = self.capacity.clone();
        // The plugin's answer depends only on allocations and pending demand, which change only
        // when something binds or leaves: until then its last order stands.
        let mut order: Option<Option<Vec<usize>>> = None;
        let mut failures = Failures::default();
        let mut budget = self.config.max_attempts_per_cycle.unwrap_or(usize::MAX);
        self.truncated = false;
        while !lists.is_empty() {
            if budget == 0 {
                self.truncated = true;
                break;
            }
            let leaf = if lists.len() == 1 && order.is_some() {
                *lists.keys().next().expect("not empty")
            } else {
                if order.is_none() {
                    order = Some(self.fair_share(set, &pending, &cluster, &mut out));
                }
                match order.as_ref().expect("asked above") {
                    Some(order) => match order.iter().copied().find(|q| lists.contains_key(q)) {
                        Some(q) => q,
                        None => {
                            self.not_served(&lists);
                            break;
                        }
                    },
                    None => *lists.keys().next().expect("not empty"),
                }
            };
            let list = lists.get_mut(&leaf).expect("chosen from the lists");
            let name = list.pop_front().expect("lists are never empty");
            if list.is_empty() {
                lists.remove(&leaf);
            }
            let key = self.config.reuse_failures.then(|| Failures::key(&self.entries[&name])).flatten();
            if let Some(explanation) = key.as_ref().and_then(|k| failures.get(k)) {
                self.unschedulable(&name, explanation.clone(), now, &mut out);
                continue;
            }
            let from = out.len();
            budget -= 1;
            self.attempt(set, &name, now, &mut out, true);
            let changed = out[from..].iter().any(|d| !matches!(d, Decision::Unschedulable { .. } | Decision::Fault(_)));
            if changed {
                order = None;
                failures.clear();
                self.move_demand(&mut pending, &out[from..]);
            } else if let Some(key) = key
                && self.entries[&name].preempted_by.is_empty()
            {
                // A workload with a preemption memo may have had fewer victims than an identical
                // one without; only memo-free failures speak for every identical workload.
                failures.insert(key, self.entries[&name].explanation.clone());
            }
        }

        self.grow(set, now, &mut out);
        out
    }

    /// Bound tasks' demand moves from pending to allocated, evicted ones' back.
    fn move_demand(&self, pending: &mut [Resources], decisions: &[Decision]) {
        for d in decisions {
            let (workload, task, bound) = match d {
                Decision::Bound { workload, task, .. } => (workload, task, true),
                Decision::Evicted { workload, task, .. } => (workload, task, false),
                _ => continue,
            };
            let Some(e) = self.entries.get(workload) else { continue };
            let Some(t) = e.spec.members.iter().find(|t| &t.id == task) else { continue };
            let d = self.wanted(e, demand(t));
            for q in self.queues.chain(e.leaf) {
                if bound {
                    pending[q] = pending[q].saturating_sub(&d);
                } else {
                    pending[q].saturating_add_assign(&d);
                }
            }
        }
    }

    /// Queues the fair-share plugin left out of its order wait for the next cycle.
    fn not_served(&mut self, lists: &BTreeMap<usize, std::collections::VecDeque<String>>) {
        for (leaf, names) in lists {
            let queue = self.queues.get(*leaf).map(|q| q.name.clone()).unwrap_or_default();
            for name in names {
                if let Some(e) = self.entries.get_mut(name) {
                    e.explanation.queue = Some(format!("queue {queue} not served by fair share this cycle"));
                }
            }
        }
    }

    /// The nodes' allocatable total (with each flavor's qualified copies) and, with flavors, the
    /// nodes of each flavor and then of none.
    fn cluster_capacity(&self) -> (Resources, Vec<Vec<Slot>>) {
        let flavors = self.queues.flavors();
        let mut total = Resources::default();
        let mut by_flavor = vec![Vec::new(); if flavors.is_empty() { 0 } else { flavors.len() + 1 }];
        for slot in self.nodes.slots() {
            let Some(n) = self.nodes.get(slot) else { continue };
            total.saturating_add_assign(&n.allocatable);
            if flavors.is_empty() {
                continue;
            }
            match self.queues.flavor_of(n) {
                Some(f) => {
                    crate::flavor::add_flavored(&mut total, &flavors[f].name, &n.allocatable);
                    by_flavor[f].push(slot);
                }
                None => by_flavor[flavors.len()].push(slot),
            }
        }
        // Only the qualified resources some quota names are dimensions worth counting.
        total.extended.retain(|(n, _)| !self.queues.unbounded_flavored(n));
        (total, by_flavor)
    }

    /// The flavors to try for work of `leaf`, in order; `None` is the nodes of no flavor (or,
    /// without flavors, every node).
    fn flavor_choices(&self, leaf: usize) -> Vec<Option<usize>> {
        if self.flavor_nodes.is_empty() {
            return vec![None];
        }
        let mut out: Vec<Option<usize>> = self.queues.flavors_for(leaf).iter().map(|&f| Some(f)).collect();
        out.push(None);
        out
    }

    /// The nodes of a flavor choice; `None` for every node when there are no flavors.
    fn nodes_of(&self, flavor: Option<usize>) -> Option<&[Slot]> {
        let i = flavor.unwrap_or(self.flavor_nodes.len().checked_sub(1)?);
        self.flavor_nodes.get(i).map(Vec::as_slice)
    }

    fn flavor_name(&self, flavor: Option<usize>) -> Option<&str> {
        Some(self.queues.flavors().get(flavor?)?.name.as_str())
    }

    /// Pending demand `d` of `e` as fair share sees it: with resource flavors, wanted in every
    /// flavor its queue may use (placement decides which; each flavor's share is capped by the
    /// queue's quota there, so a queue is never promised more than it may hold).
    fn wanted(&self, e: &Entry, d: Resources) -> Resources {
        if self.flavor_nodes.is_empty() {
            return d;
        }
        let mut out = d.clone();
        for &f in self.queues.flavors_for(e.leaf) {
            crate::flavor::add_flavored(&mut out, &self.queues.flavors()[f].name, &d);
        }
        out.extended.retain(|(n, _)| !self.queues.unbounded_flavored(n));
        out
    }

    /// `task` ready to place with `flavor`: with the flavor's tolerations, and its pod
    /// (anti)-affinity resolved into node affinity (the summary goes to `note`).
    fn prepare(
        &self,
        task: &wasmsched_api::Task,
        flavor: Option<usize>,
        note: &mut Option<String>,
    ) -> Result<wasmsched_api::Task, String> {
        let task = self.in_flavor(task, flavor);
        Ok(match self.resolve_pod_affinity(&task)? {
            Some((resolved, summary)) => {
                *note = Some(summary);
                resolved
            }
            None => task,
        })
    }

    /// `task` as placed with `flavor`: with the flavor's tolerations.
    fn in_flavor(&self, task: &wasmsched_api::Task, flavor: Option<usize>) -> wasmsched_api::Task {
        let mut task = task.clone();
        if let Some(f) = flavor.and_then(|f| self.queues.flavors().get(f)) {
            task.tolerations.extend(f.tolerations.iter().cloned());
        }
        task
    }

    /// Ask the fair-share plugin for deserved shares and the serving order (leaf queues). `None`
    /// without a plugin or when it failed: tree order, nothing reclaimed.
    fn fair_share(
        &mut self,
        set: &PolicySet,
        pending: &[Resources],
        cluster: &Resources,
        out: &mut Vec<Decision>,
    ) -> Option<Vec<usize>> {
        let plugin = set.fair_share()?;
        let request: Vec<Resources> =
            self.allocated.iter().zip(pending).map(|(a, p)| a.checked_add(p).unwrap_or_else(|| a.clone())).collect();
        // Reserves that lending limits keep for queues which do not ask for them are nobody's to
        // share: water-filling over them would promise other queues capacity they cannot take.
        let idle = self.queues.unused_reserves(&request);
        let cluster = cluster.saturating_sub(idle.total());
        let states = self.share_input(&request);
        match plugin.fair_share(0, states, &cluster) {
            Ok(ShareDecision { deserved, order }) => {
                self.deserved = Some(deserved);
                Some(order.into_iter().map(|q| q as usize).filter(|&q| self.queues.is_leaf(q)).collect())
            }
            Err(fault) => {
                warn!(%fault, "fair share failed; serving queues in tree order without reclaim");
                self.deserved = None;
                out.push(Decision::Fault(fault));
                None
            }
        }
    }

    /// The fair-share input for the current allocations and `request` (see `share_input`).
    fn share_input(&mut self, request: &[Resources]) -> &[wasmsched_api::QueueState] {
        let (allocated, usage) = (&self.allocated, &self.usage);
        match &mut self.share_input {
            Some(states) if states.len() == self.queues.len() => {
                for (i, s) in states.iter_mut().enumerate() {
                    let fresh = (allocated.get(i), request.get(i), usage.get(i).copied().unwrap_or(0.0));
                    refresh(&mut s.allocated, fresh.0);
                    refresh(&mut s.request, fresh.1);
                    s.decayed_usage = fresh.2;
                }
            }
            input => *input = Some(self.queues.states(allocated, request, usage)),
        }
        self.share_input.as_deref().expect("set above")
    }

    /// How many of `e`'s members (in order) the limits of its queue and ancestors admit on top of
    /// what they hold, and why no more: the first queue at its limit, or the lenders whose
    /// reserves the rest would take. Placed with `flavor`, members take its quota too.
    fn admitted_members(&self, e: &Entry, flavor: Option<usize>) -> (usize, Option<String>) {
        let flavor = self.flavor_name(flavor);
        let demand = |m| demand_in(m, flavor, &self.queues);
        let mut admitted = e.spec.members.len();
        let mut limiter = None;
        for q in self.queues.chain(e.leaf) {
            let Some(cap) = self.queues.limit(q) else { continue };
            let mut total = self.allocated[q].clone();
            let mut n = 0;
            for m in &e.spec.members {
                match total.checked_add(&demand(m)) {
                    Some(t) if fits(&t, cap) => {
                        total = t;
                        n += 1;
                    }
                    _ => break,
                }
            }
            if n < admitted {
                admitted = n;
                limiter = self.queues.get(q).map(|s| {
                    let what = if s.capability.as_ref() == Some(cap) { "capability" } else { "borrowing limit" };
                    format!("queue {} at {what}", s.name)
                });
            }
        }
        if let Some(reserves) = self.reserves_against(e.leaf) {
            let mut extra = Resources::default();
            let mut n = 0;
            for m in &e.spec.members[..admitted] {
                let Some(t) = extra.checked_add(&demand(m)) else { break };
                if !reserves.admit(&t, &self.capacity) {
                    break;
                }
                extra = t;
                n += 1;
            }
            if n < admitted {
                admitted = n;
                limiter = Some(
                    "the rest is reserved by queues that lend only part of their guarantee (lending limit)".into(),
                );
            }
        }
        (admitted, limiter)
    }

    /// The leaf queue's admission limits (digest Q3–Q5, in that order of the article's checks:
    /// job count, GPUs, priority). Running workloads count towards the job limit.
    fn admit(&self, w: &Workload, leaf: usize) -> Result<(), WorkloadError> {
        let Some(spec) = self.queues.get(leaf) else { return Ok(()) };
        let a = &spec.admission;
        let refuse =
            |reason: String| Err(WorkloadError::Refused { workload: w.name.clone(), queue: spec.name.clone(), reason });
        if let Some(max) = a.max_jobs {
            // O(workloads), only for queues with the limit.
            let held = self.entries.values().filter(|e| e.leaf == leaf).count();
            if held >= max as usize {
                return refuse(format!("queue job limit reached: {max}"));
            }
        }
        if let Some(max) = a.max_gpus_per_job {
            let milli: u64 = w.members.iter().map(|t| u64::from(t.gpu.count) * u64::from(t.gpu.milli_per_gpu)).sum();
            let gpus = milli.div_ceil(u64::from(wasmsched_api::GPU_MILLI));
            if gpus > u64::from(max) {
                return refuse(format!("job GPU request {gpus} exceeds limit {max}"));
            }
        }
        if let Some((min, max)) = a.priority_range
            && !(min..=max).contains(&w.priority)
        {
            return refuse(format!("job priority {} out of allowed range [{min}, {max}]", w.priority));
        }
        Ok(())
    }

    /// Try to place one workload (its unplaced members), preempting if it may.
    /// Try to place workload `name` (and to preempt for it when `may_preempt`). Room kept for
    /// nominated workloads of lower priority is open to it: they do not hold back work that
    /// outranks them, and wait for their victims again (or preempt anew) if it takes the room.
    fn attempt(&mut self, set: &PolicySet, name: &str, now: u64, out: &mut Vec<Decision>, may_preempt: bool) {
        let priority = self.entries[name].spec.priority;
        let outranked: Vec<String> = self
            .entries
            .values()
            .filter(|e| e.phase == Phase::Preempting && e.spec.priority < priority && !e.holds.is_empty())
            .map(|e| e.spec.name.clone())
            .collect();
        let mut borrowed = Vec::new();
        for w in outranked {
            let holds = std::mem::take(&mut self.entries.get_mut(&w).expect("listed").holds);
            self.release_holds(&holds);
            borrowed.push((w, holds));
        }
        self.attempt_within_holds(set, name, now, out, may_preempt);
        for (w, holds) in borrowed {
            for h in holds {
                let Some(slot) = self.nodes.slot_of(&h.node) else { continue };
                if matches!(self.nodes.update_usage(slot, |n| bind(n, &h.task, &h.devices)), Some(Ok(()))) {
                    self.entries.get_mut(&w).expect("listed").holds.push(h);
                }
            }
        }
    }

    fn attempt_within_holds(
        &mut self,
        set: &PolicySet,
        name: &str,
        now: u64,
        out: &mut Vec<Decision>,
        may_preempt: bool,
    ) {
        let mut explanation = Explanation { attempts: self.entries[name].attempts, ..Default::default() };
        let mut quota = Vec::new();
        let mut best_placed = None;
        let mut affinity = None;
        for flavor in self.flavor_choices(self.entries[name].leaf) {
            let e = &self.entries[name];
            let min = e.spec.min_member;
            let within = self.nodes_of(flavor);
            let on = match self.flavor_name(flavor) {
                Some(f) => format!("flavor {f}: "),
                None if within.is_some() => "nodes of no flavor: ".into(),
                None => String::new(),
            };
            if within.is_some_and(<[Slot]>::is_empty) {
                if flavor.is_some() {
                    quota.push(format!("{on}no nodes"));
                }
                continue;
            }
            let (admitted, limiter) = self.admitted_members(e, flavor);
            if admitted < min {
                let limiter = limiter.unwrap_or_default();
                quota.push(format!("{on}{limiter}: {admitted} of the {min} required members fit its quota"));
                continue;
            }
            let members: Result<Vec<_>, String> =
                e.spec.members[..admitted].iter().map(|t| self.prepare(t, flavor, &mut affinity)).collect();
            let members = match members {
                Ok(members) => members,
                Err(reason) => {
                    explanation.pod_affinity = Some(reason);
                    continue;
                }
            };
            let within = within.map(<[Slot]>::to_vec);
            let nodes_to_find =
                self.config.percentage_of_nodes_to_score.map(|p| feasible_nodes_to_find(self.nodes.len(), Some(p)));
            let group = GroupSpec {
                name,
                members: &members,
                min_member: min,
                topology: e.spec.topology.as_ref(),
                nodes_to_find,
                within: within.as_deref(),
                adjust: None,
            };
            let is_group = e.spec.is_group();
            let result = if is_group && e.spec.members.iter().any(|m| !m.pod_terms().is_empty()) {
                // Members with pod (anti-)affinity see the members placed before them too.
                let flavored: Vec<_> = e.spec.members[..admitted].iter().map(|t| self.in_flavor(t, flavor)).collect();
                let mut nodes = std::mem::take(&mut self.nodes);
                let result = {
                    let running = self.running_pods(false);
                    let adjust = |table: &NodeTable, i: usize, so_far: &[(usize, Slot)]| {
                        if so_far.is_empty() {
                            return None;
                        }
                        let mut all = running.clone();
                        for (j, slot) in so_far {
                            all.push(pod_affinity::Running::task(&table.get(*slot)?.name, &members[*j]));
                        }
                        pod_affinity::resolve(table, &all, &flavored[i]).ok().flatten().map(|(t, _)| t)
                    };
                    place_group(set, &mut nodes, &GroupSpec { adjust: Some(Adjust(&adjust)), ..group }, 0)
                };
                self.nodes = nodes;
                result
            } else {
                place_group(set, &mut self.nodes, &group, 0)
            };
            match result {
                Ok(placed) => {
                    self.commit(name, placed.placed, flavor, now, out);
                    return;
                }
                Err(GangError::Unschedulable { placed, diagnosis, .. }) => {
                    if best_placed.is_none_or(|b| placed > b) {
                        best_placed = Some(placed);
                        if is_group {
                            explanation.gang = Some((placed, min));
                        }
                        explanation.nodes = Some(diagnosis);
                    }
                }
                Err(err @ GangError::Invalid { .. }) => {
                    // normalise() rules this out; keep the workload pending with the reason.
                    quota.push(err.to_string());
                }
            }
        }
        if !quota.is_empty() {
            explanation.queue = Some(quota.join("; "));
        }
        if explanation.pod_affinity.is_none() {
            explanation.pod_affinity = affinity;
        }
        // Every node refused it for a reason eviction cannot change (a taint, a selector, another
        // GPU model): like kube-scheduler, do not try, and add no preemption hint to those reasons.
        let hopeless = explanation.queue.is_none()
            && explanation.gang.is_none()
            && explanation.pod_affinity.is_none()
            && explanation.nodes.as_ref().is_some_and(|d| d.faults.is_empty() && !d.preemption_may_help());
        match (self.entries[name].spec.preemption, set.preempt()) {
            _ if !may_preempt => explanation.preemption = Some(self.waiting_message(name)),
            (PreemptionPolicy::Never, _) => {
                explanation.preemption = Some("not allowed for this workload (preemption policy Never)".into());
            }
            (_, None) => {}
            (PreemptionPolicy::LowerPriority, Some(_)) if hopeless => {}
            (PreemptionPolicy::LowerPriority, Some(_)) => match preempt::preempt(self, set, name, now, out) {
                Ok(()) => return,
                Err(reason) => explanation.preemption = Some(reason),
            },
        }
        self.unschedulable(name, explanation, now, out);
    }

    /// Record a failed attempt: back off, park until the cluster changes, explain.
    fn unschedulable(&mut self, name: &str, mut explanation: Explanation, now: u64, out: &mut Vec<Decision>) {
        let e = self.entries.get_mut(name).expect("attempted workloads exist");
        e.attempts += 1;
        let exp = e.attempts.saturating_sub(1).min(30);
        let backoff = self.config.backoff_initial_seconds.saturating_mul(1 << exp).min(self.config.backoff_max_seconds);
        e.not_before = now.saturating_add(backoff);
        e.parked_at = Some(self.epoch);
        e.phase = if e.placed() > 0 || e.phase == Phase::Preempting { e.phase } else { Phase::Pending };
        if e.spec.members.iter().any(|m| !m.pod_terms().affinity.is_empty()) {
            self.affinity_parked.insert(name.to_string());
        }
        explanation.attempts = e.attempts;
        explanation.retry_at = Some(e.not_before);
        e.explanation = explanation.clone();
        debug!(workload = name, %explanation, "unschedulable");
        out.push(Decision::Unschedulable { workload: name.into(), explanation });
    }

    /// Record members bound on the table as running.
    fn commit(
        &mut self,
        name: &str,
        placed: Vec<(usize, Placement)>,
        flavor: Option<usize>,
        now: u64,
        out: &mut Vec<Decision>,
    ) {
        let leaf = self.entries[name].leaf;
        let flavor = self.flavor_name(flavor).map(str::to_string);
        if placed.iter().any(|(i, _)| !self.entries[name].spec.members[*i].labels.is_empty()) {
            self.wake_affinity_waiters();
        }
        for (i, Placement { node: slot, devices, score, feasible, skipped_faults }) in placed {
            let node = self.nodes.get(slot).map(|n| n.name.clone()).unwrap_or_default();
            let task = self.entries[name].spec.members[i].clone();
            self.account(leaf, &demand_in(&task, flavor.as_deref(), &self.queues), true);
            out.push(Decision::Bound {
                workload: name.into(),
                task: task.id.clone(),
                node: node.clone(),
                devices: devices.clone(),
                score,
                feasible,
                faults: skipped_faults,
            });
            let e = self.entries.get_mut(name).expect("committed workloads exist");
            let flavor = flavor.clone();
            e.members[i] = Some(Member { slot, node: node.clone(), devices, started: now, leaving: None, flavor });
            self.index_add(&node, name);
        }
        // Placed elsewhere while it waited nominated: the room kept for it is everyone's again.
        let holds = std::mem::take(&mut self.entries.get_mut(name).expect("committed workloads exist").holds);
        self.release_holds(&holds);
        self.forget_nomination(name);
        let e = self.entries.get_mut(name).expect("committed workloads exist");
        e.phase = Phase::Running;
        e.waiting_for.clear();
        e.attempts = 0;
        e.explanation = Explanation::default();
    }

    /// Elastic growth: members beyond min-member take idle capacity, within quota.
    fn grow(&mut self, set: &PolicySet, now: u64, out: &mut Vec<Decision>) {
        let mut growing: Vec<&Entry> =
            self.entries.values().filter(|e| e.phase == Phase::Running && e.placed() < e.spec.members.len()).collect();
        growing.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
        let growing: Vec<String> = growing.into_iter().map(|e| e.spec.name.clone()).collect();
        for name in growing {
            let unplaced: Vec<usize> =
                (0..self.entries[&name].members.len()).filter(|&i| self.entries[&name].members[i].is_none()).collect();
            let e = &self.entries[&name];
            let flavor = e.flavor().and_then(|f| self.queues.flavors().iter().position(|x| x.name == f));
            let within = self.nodes_of(flavor).map(<[Slot]>::to_vec);
            for i in unplaced {
                let e = &self.entries[&name];
                let Ok(task) = self.prepare(&e.spec.members[i], flavor, &mut None) else { break };
                if !self.within_capability(e.leaf, &demand_in(&task, self.flavor_name(flavor), &self.queues)) {
                    break;
                }
                let placed = match &within {
                    None => place(set, &self.nodes, &task, 0),
                    Some(slots) => place_among(set, &self.nodes, &task, 0, slots),
                };
                let Ok(p) = placed else { break };
                if !matches!(self.nodes.update_usage(p.node, |n| bind(n, &task, &p.devices)), Some(Ok(()))) {
                    break;
                }
                self.commit(&name, vec![(i, p)], flavor, now, out);
            }
        }
    }

    /// Let time pass: usage decays and accrues, grace periods and gang timeouts expire.
    fn advance(&mut self, now: u64, out: &mut Vec<Decision>) {
        if now > self.usage_at {
            let dt = (now - self.usage_at) as f64;
            let decay = 0.5f64.powf(dt / self.config.usage_half_life_seconds.max(1) as f64);
            for (u, a) in self.usage.iter_mut().zip(&self.allocated) {
                *u = *u * decay + a.gpu_milli as f64 * dt;
            }
            self.usage_at = now;
        }
        let expired: Vec<(String, usize, Leaving)> = self
            .entries
            .iter()
            .flat_map(|(name, e)| {
                e.members.iter().enumerate().filter_map(move |(i, m)| {
                    let l = m.as_ref()?.leaving.as_ref()?;
                    (l.deadline <= now).then(|| (name.clone(), i, l.clone()))
                })
            })
            .collect();
        for (wl, i, Leaving { preemptor, kind, .. }) in expired {
            self.evict(&wl, i, EvictReason::Preempted { preemptor, kind, checkpointed: false }, now, out);
        }
        let timed_out: Vec<String> = self
            .entries
            .values()
            .filter(|e| {
                e.phase == Phase::Pending && e.spec.is_group() && now >= e.since.saturating_add(self.timeout_of(e))
            })
            .map(|e| e.spec.name.clone())
            .collect();
        for name in timed_out {
            let e = self.entries.get_mut(&name).expect("listed above");
            e.phase = Phase::TimedOut;
            e.explanation.queue = Some(format!("gang timed out after {} s unplaced", now - e.since));
            out.push(Decision::TimedOut { workload: name });
        }
    }

    /// Add (or remove) `d` to a leaf queue and its ancestors.
    fn account(&mut self, leaf: usize, d: &Resources, add: bool) {
        self.reserves.take();
        let chain: Vec<usize> = self.queues.chain(leaf).collect();
        for q in chain {
            self.allocated[q] = if add {
                self.allocated[q].checked_add(d).unwrap_or_else(|| self.allocated[q].clone())
            } else {
                self.allocated[q].saturating_sub(d)
            };
        }
    }

    /// Release a placed member from its node and its queue, keeping it in the entry for rollback.
    fn unbind(&mut self, wl: &str, idx: usize) -> Option<Member> {
        let e = self.entries.get_mut(wl)?;
        let held = e.held(idx, &self.queues);
        let m = e.members[idx].take()?;
        let task = e.spec.members[idx].clone();
        let leaf = e.leaf;
        self.index_remove(&m.node, wl);
        self.nodes.update_usage(m.slot, |n| release(n, &task, &m.devices));
        self.account(leaf, &held, false);
        Some(m)
    }

    /// Undo [`Self::unbind`].
    fn rebind(&mut self, wl: &str, idx: usize, m: Member) {
        let Some(e) = self.entries.get(wl) else { return };
        let task = e.spec.members[idx].clone();
        let leaf = e.leaf;
        if !matches!(self.nodes.update_usage(m.slot, |n| bind(n, &task, &m.devices)), Some(Ok(()))) {
            warn!(workload = wl, task = %task.id, node = %m.node, "could not restore a member after a rolled-back preemption");
        }
        self.account(leaf, &demand_in(&task, m.flavor.as_deref(), &self.queues), true);
        self.index_add(&m.node, wl);
        if let Some(e) = self.entries.get_mut(wl) {
            e.members[idx] = Some(m);
        }
    }

    /// Record that a member of `wl` is placed on `node` (the index [`Self::members_on`] reads, so a
    /// node change costs its own members, not a walk of every workload).
    fn index_add(&mut self, node: &str, wl: &str) {
        *self.on_node.entry(node.to_string()).or_default().entry(wl.to_string()).or_default() += 1;
    }

    /// Undo [`Self::index_add`] for one member.
    fn index_remove(&mut self, node: &str, wl: &str) {
        let Some(here) = self.on_node.get_mut(node) else { return };
        if let Some(n) = here.get_mut(wl) {
            *n -= 1;
            if *n == 0 {
                here.remove(wl);
            }
        }
        if here.is_empty() {
            self.on_node.remove(node);
        }
    }

    /// Evict a placed member for good.
    fn evict(&mut self, wl: &str, idx: usize, reason: EvictReason, now: u64, out: &mut Vec<Decision>) {
        let Some(m) = self.unbind(wl, idx) else { return };
        let task = self.entries[wl].spec.members[idx].clone();
        match &reason {
            // Nobody stops a pod on a node that is gone or shrank under it: nothing to wait for.
            EvictReason::NodeLost => {}
            EvictReason::Preempted { preemptor, .. } if self.config.await_termination => {
                self.leave_terminating(&m, task, Some(preemptor));
            }
            EvictReason::GangBroken if self.config.await_termination => self.leave_terminating(&m, task, None),
            EvictReason::Preempted { preemptor, .. } => self.hold(preemptor, &m, task),
            EvictReason::GangBroken => {}
        }
        let task = self.entries[wl].spec.members[idx].id.clone();
        out.push(Decision::Evicted { workload: wl.into(), task, node: m.node, reason });
        self.after_eviction(wl, now, out);
        self.unpark_all();
    }

    /// A group below min-member stops entirely and goes back to its queue.
    fn after_eviction(&mut self, wl: &str, now: u64, out: &mut Vec<Decision>) {
        let Some(e) = self.entries.get(wl) else { return };
        let (placed, min) = (e.placed(), e.spec.min_member);
        if placed > 0 && placed < min {
            let rest: Vec<usize> = (0..e.members.len()).filter(|&i| e.members[i].is_some()).collect();
            for i in rest {
                self.evict(wl, i, EvictReason::GangBroken, now, out);
            }
            return;
        }
        if placed == 0
            && let Some(e) = self.entries.get_mut(wl)
            && e.phase != Phase::TimedOut
        {
            // Back in its queue with the initial back-off, so it is not tried again in the cycle that
            // evicted it.
            e.phase = Phase::Pending;
            e.since = now;
            e.attempts = 0;
            e.not_before = now.saturating_add(self.config.backoff_initial_seconds);
            e.parked_at = None;
        }
    }

    /// Keep what an evicted victim freed bound for its preemptor while that one still waits.
    fn hold(&mut self, preemptor: &str, m: &Member, task: wasmsched_api::Task) {
        self.hold_for(preemptor, Hold { node: m.node.clone(), task, devices: m.devices.clone() });
    }

    fn hold_for(&mut self, preemptor: &str, hold: Hold) {
        if self.entries.get(preemptor).is_none_or(|p| p.phase != Phase::Preempting) {
            return;
        }
        let Some(slot) = self.nodes.slot_of(&hold.node) else { return };
        if matches!(self.nodes.update_usage(slot, |n| bind(n, &hold.task, &hold.devices)), Some(Ok(()))) {
            self.entries.get_mut(preemptor).expect("checked").holds.push(hold);
        }
    }

    /// An evicted member keeps its room bound until the driver reports it gone.
    fn leave_terminating(&mut self, m: &Member, task: wasmsched_api::Task, preemptor: Option<&str>) {
        self.nodes.update_usage(m.slot, |n| bind_fact(n, &task, &m.devices));
        let preemptor = preemptor
            .filter(|p| self.entries.get(*p).is_some_and(|e| e.phase == Phase::Preempting))
            .map(str::to_string);
        let hold = Hold { node: m.node.clone(), task, devices: m.devices.clone() };
        self.terminating.push(Terminating { hold, preemptor });
    }

    /// An evicted task is gone from its node (its pod deleted, or its eviction given up): its room
    /// is free, or kept for the preemptor that still waits for it. `false` when it was not
    /// terminating (evicted without [`CoreConfig::await_termination`], or reported already).
    pub fn terminated(&mut self, task: &str) -> bool {
        let Some(i) = self.terminating.iter().position(|t| t.hold.task.id == task) else { return false };
        let Terminating { hold, preemptor } = self.terminating.remove(i);
        if let Some(slot) = self.nodes.slot_of(&hold.node) {
            self.nodes.update_usage(slot, |n| release(n, &hold.task, &hold.devices));
        }
        if let Some(p) = preemptor {
            self.hold_for(&p, hold);
        }
        self.unpark_all();
        true
    }

    /// For a workload waiting nominated (its victims checkpointing or terminating), the nodes
    /// where room is made or kept for it; `None` when it is not waiting.
    pub fn nomination(&self, workload: &str) -> Option<Vec<String>> {
        let e = self.entries.get(workload).filter(|e| e.phase == Phase::Preempting)?;
        let leaving = e.waiting_for.iter().filter_map(|(w, i)| self.entries.get(w)?.members.get(*i)?.as_ref());
        let terminating = self.terminating.iter().filter(|t| t.preemptor.as_deref() == Some(workload));
        let mut nodes: Vec<String> = leaving
            .map(|m| m.node.clone())
            .chain(terminating.map(|t| t.hold.node.clone()))
            .chain(e.holds.iter().map(|h| h.node.clone()))
            .collect();
        nodes.sort();
        nodes.dedup();
        Some(nodes)
    }

    /// Tasks evicted and still terminating, with the node each holds room on.
    pub fn terminating(&self) -> impl Iterator<Item = (&str, &str)> {
        self.terminating.iter().map(|t| (t.hold.task.id.as_str(), t.hold.node.as_str()))
    }

    /// Whether every victim of nominated workload `e` has left: none still checkpointing, none
    /// still terminating.
    fn victims_gone(&self, e: &Entry) -> bool {
        let name = e.spec.name.as_str();
        e.waiting_for.iter().all(|(w, i)| {
            self.entries.get(w).and_then(|v| v.members.get(*i)?.as_ref()).is_none_or(|m| m.leaving.is_none())
        }) && !self.terminating.iter().any(|t| t.preemptor.as_deref() == Some(name))
    }

    /// Why nominated workload `name` still waits: its victims checkpointing and terminating.
    fn waiting_message(&self, name: &str) -> String {
        let Some(e) = self.entries.get(name) else { return String::new() };
        let checkpointing = e
            .waiting_for
            .iter()
            .filter(|(w, i)| {
                self.entries.get(w).and_then(|v| v.members.get(*i)?.as_ref()).is_some_and(|m| m.leaving.is_some())
            })
            .count();
        let terminating: Vec<&Terminating> =
            self.terminating.iter().filter(|t| t.preemptor.as_deref() == Some(name)).collect();
        let mut parts = Vec::new();
        if checkpointing > 0 {
            parts.push(format!("{checkpointing} to checkpoint"));
        }
        if !terminating.is_empty() {
            let mut nodes: Vec<&str> = terminating.iter().map(|t| t.hold.node.as_str()).collect();
            nodes.sort_unstable();
            nodes.dedup();
            parts.push(format!("{} to terminate on {}", terminating.len(), nodes.join(", ")));
        }
        format!("nominated: waiting for its victims ({})", parts.join(", "))
    }

    /// `name` no longer waits for room: victims still terminating free it for everyone.
    fn forget_nomination(&mut self, name: &str) {
        for t in &mut self.terminating {
            if t.preemptor.as_deref() == Some(name) {
                t.preemptor = None;
            }
        }
    }

    fn release_holds(&mut self, holds: &[Hold]) {
        for h in holds {
            if let Some(slot) = self.nodes.slot_of(&h.node) {
                self.nodes.update_usage(slot, |n| release(n, &h.task, &h.devices));
            }
        }
    }

    /// The cluster changed: everything parked may be tried again (after its back-off).
    fn unpark_all(&mut self) {
        self.epoch += 1;
        self.affinity_parked.clear();
    }

    /// A pod with labels started: parked work with required pod affinity may be tried again
    /// (after its back-off), since that pod may be the one it waits for.
    pub(super) fn wake_affinity_waiters(&mut self) {
        for name in std::mem::take(&mut self.affinity_parked) {
            if let Some(e) = self.entries.get_mut(&name) {
                e.parked_at = None;
            }
        }
    }

    fn is_parked(&self, e: &Entry) -> bool {
        e.parked_at == Some(self.epoch)
    }

    /// Whether `extra` more fits the limits of `leaf` and every ancestor, and leaves free what
    /// lending queues keep for themselves.
    fn within_capability(&self, leaf: usize, extra: &Resources) -> bool {
        self.queues.chain(leaf).all(|q| {
            self.queues.limit(q).is_none_or(|c| self.allocated[q].checked_add(extra).is_some_and(|t| fits(&t, c)))
        }) && self.leaves_reserves(leaf, extra)
    }

    /// Whether `extra` more for `leaf` keeps the unused reserves of queues outside its path free.
    fn leaves_reserves(&self, leaf: usize, extra: &Resources) -> bool {
        self.reserves_against(leaf).is_none_or(|r| r.admit(extra, &self.capacity))
    }

    /// What lending queues keep from `leaf`'s work, what is allocated already, and how much more
    /// the leaf may take without borrowing; `None` when no queue keeps anything. Constant while
    /// only `leaf`'s own path allocates more.
    fn reserves_against(&self, leaf: usize) -> Option<Reserves> {
        let (unused, used) = self
            .reserves
            .get_or_init(|| {
                if !self.queues.has_reserves() {
                    return None;
                }
                let mut used = Resources::default();
                for q in (0..self.queues.len()).filter(|&q| self.queues.parent(q).is_none()) {
                    used.saturating_add_assign(&self.allocated[q]);
                }
                Some((self.queues.unused_reserves(&self.allocated), used))
            })
            .as_ref()?;
        // Work within the guarantee of its queue or of any ancestor borrows nothing.
        let mut headroom = Resources::default();
        for q in self.queues.chain(leaf) {
            if let Some(spec) = self.queues.get(q) {
                let room = spec.guarantee.saturating_sub(&self.allocated[q]);
                headroom.cpu_milli = headroom.cpu_milli.max(room.cpu_milli);
                headroom.memory_bytes = headroom.memory_bytes.max(room.memory_bytes);
                headroom.gpu_milli = headroom.gpu_milli.max(room.gpu_milli);
            }
        }
        Some(Reserves { reserved: self.queues.reserved_against(leaf, unused), used: used.clone(), headroom })
    }
}

/// The unused reserves of lending queues off one leaf's path, all allocations, and what the leaf
/// may add within a guarantee on its path.
struct Reserves {
    reserved: Resources,
    used: Resources,
    headroom: Resources,
}

impl Reserves {
    /// A lending limit bounds what others *borrow* (Kueue's semantics): in every resource some
    /// queue reserves and `extra` goes beyond the guarantees on the leaf's path, all allocations
    /// plus `extra` plus the reserves stay within `capacity`. Quota-level, like Kueue's cohorts:
    /// which nodes the reserve sits on is left to placement.
    fn admit(&self, extra: &Resources, capacity: &Resources) -> bool {
        let (r, u, h) = (&self.reserved, &self.used, &self.headroom);
        let ok = |reserved: u64, used: u64, headroom: u64, extra: u64, cap: u64| {
            reserved == 0 || extra <= headroom || used.saturating_add(extra).saturating_add(reserved) <= cap
        };
        ok(r.cpu_milli, u.cpu_milli, h.cpu_milli, extra.cpu_milli, capacity.cpu_milli)
            && ok(r.memory_bytes, u.memory_bytes, h.memory_bytes, extra.memory_bytes, capacity.memory_bytes)
            && ok(r.gpu_milli, u.gpu_milli, h.gpu_milli, extra.gpu_milli, capacity.gpu_milli)
            && r.extended.iter().all(|(n, v)| ok(*v, u.extended(n), 0, extra.extended(n), capacity.extended(n)))
    }
}

/// `*held = fresh` (default when absent), copying only when they differ.
fn refresh(held: &mut Resources, fresh: Option<&Resources>) {
    match fresh {
        Some(f) if held != f => held.clone_from(f),
        Some(_) => {}
        None if *held != Resources::default() => *held = Resources::default(),
        None => {}
    }
}

#[cfg(test)]
mod tests;
