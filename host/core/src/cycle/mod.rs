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

// Where each part of the cycle lives: `attempt` (quota → place → preempt, commit, grow),
// `preempt`, `nomination` (holds for a nominated preemptor, terminating victims), `eviction`,
// `quota` (admission, capabilities, reserves), `flavors`, `fair_share` (the stage's input and
// order), `timers` (back-off, parking, grace periods, gang timeouts), `accounting` (what nodes
// and queues hold), `live` (facts from a live cluster), `explain` (why a workload waits).
mod accounting;
mod attempt;
mod eviction;
mod explain;
mod failures;
mod fair_share;
mod flavors;
mod live;
mod nomination;
mod pod_affinity;
mod preempt;
mod quota;
mod timers;
mod workload;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use ahash::AHashMap;
use tracing::{debug, warn};
use wasmsched_api::{DeviceShare, Node, Resources, ShareDecision};

use crate::gang::{Adjust, GangError, GroupSpec, place_group};
use crate::node_accounting::{bind, bind_fact, release};
use crate::node_table::{NodeTable, Slot};
use crate::placement::{Placement, feasible_nodes_to_find, place, place_among};
use crate::plugin::PluginFault;
use crate::policy_set::PolicySet;
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
    /// A run another queue reclaims must have run this long (s), every running member of its
    /// workload: what it loses is then never a placement just made, and queues cannot take
    /// capacity back and forth within a moment. A queue may set its own
    /// ([`crate::QueueSpec::reclaim_min_runtime_seconds`]). 60 by default; 0 reclaims any run.
    pub reclaim_min_runtime_seconds: u64,
    /// A reclaim may throw away at most the GPU-time its queue has been short of its deserved
    /// share while it waited, since it last had its share (the work the victims lose: run time ×
    /// GPUs, none when they checkpoint; a broken gang whole). A queue briefly under its share
    /// then takes back only young runs, or waits for completions; one starved for long may take
    /// more; and over a replay the work reclaims throw away never exceeds the shortfall they
    /// repair. The value is the factor K: a reclaim may throw away K × that shortfall (1: the
    /// shortfall itself; larger buys a starved queue its share sooner at more lost work). 0, the
    /// default for now: no such limit.
    pub reclaim_within_deficit: u32,
    /// A run that has gone on longer than this (s) is never reclaimed for a share above the
    /// preemptor's guarantee: the work it would throw away grows with its age while the room it
    /// frees does not, so a starved queue takes back what other queues started recently and waits
    /// out what runs for days. A queue that reclaims within its guarantee is not limited (a
    /// guarantee is a promise, fair share above it a balance), nor is priority preemption within
    /// a queue. A queue may set its own ([`crate::QueueSpec::reclaim_max_runtime_seconds`]).
    /// An hour by default: on the Philly trace at eight cluster sizes it cut the work reclaims
    /// threw away to 1–4 % of the unlimited rule's, with the starved queue waiting less than
    /// without reclaim at seven of them (BENCHMARKS.md). 0: no limit.
    pub reclaim_max_runtime_seconds: u64,
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
            reclaim_min_runtime_seconds: 60,
            reclaim_within_deficit: 0,
            reclaim_max_runtime_seconds: 3600,
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
    /// A queue within its deserved share took back what the victim's queue held beyond its
    /// share; the numbers the reclaim was judged by.
    Reclaim(ShareMove),
    /// The victim's job was elastic and keeps running at or above its minimum.
    ElasticShrink,
}

/// A reclaim in numbers: what the victim's and the preemptor's queues hold of GPUs against their
/// deserved shares before and after the whole plan, and the work the victim loses. An operator
/// audits a reclaim by these (`events why`), and a replay sums what reclaims cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareMove {
    /// The victim's leaf queue.
    pub victim_queue: QueueMove,
    /// The preemptor's leaf queue.
    pub preemptor_queue: QueueMove,
    /// GPU-seconds of work the victim task loses: its run time × its GPUs, 0 when it can
    /// checkpoint.
    pub lost_gpu_seconds: u64,
}

/// One queue's GPUs (milli) around a reclaim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueMove {
    /// Held before the plan.
    pub before_gpu_milli: u64,
    /// Held after it.
    pub after_gpu_milli: u64,
    /// Its deserved share when it was decided.
    pub deserved_gpu_milli: u64,
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
        /// For a member of a gang with a topology request: the domain it went to, and why there
        /// when that is not its first level ([`crate::TopologyConstraint::describe`]).
        topology: Option<String>,
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
    /// The task is not placed on a node.
    #[error("task {0} is not placed")]
    NotPlaced(String),
    /// Charging the task more would take its queue, or one above it, past a limit (or into what
    /// lending queues keep for themselves).
    #[error("queue {queue} cannot hold {more} more for task {task}")]
    OverLimit {
        /// The task.
        task: String,
        /// Its leaf queue.
        queue: String,
        /// What it would have been charged, as text.
        more: String,
    },
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
    /// When it was submitted, or re-queued after an eviction (seconds, the core's clock): how
    /// long it has been waiting.
    pub since: u64,
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
    /// A leaf's place, from 1, in the order the fair-share stage last served the leaves (the
    /// most underserved first); `None` for inner queues or before any fair-share answer.
    pub served: Option<usize>,
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
    /// Tried again at this time even if parked: its wait for one domain of its topology's first
    /// level ends, and it may then fall back.
    wake_at: Option<u64>,
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
    /// Task → its workload.
    owner: AHashMap<String, String>,
    /// Submission order, for ties.
    seq: u64,
    /// Per node, the workloads with members on it and how many.
    on_node: AHashMap<String, AHashMap<String, u32>>,
    /// Evicted members still terminating, oldest first ([`CoreConfig::await_termination`]). A task
    /// may be there twice: evicted work is queued again and may be placed and evicted again before
    /// its first copy has stopped (a simulator's restart; on Kubernetes a new pod).
    terminating: Vec<Terminating>,
    /// Workloads that may hold room for themselves (a superset: checked before use), so an attempt
    /// looks for holds it may borrow among these few instead of walking every workload.
    holders: ahash::AHashSet<String>,
    queue_use: QueueUse,
    affinity: AffinityIndex,
    last_cycle: LastCycle,
}

/// What each queue holds and is owed: the input of quotas and of the fair-share stage.
#[derive(Debug)]
struct QueueUse {
    /// Per queue, its subtree's allocation (running and leaving members).
    allocated: Vec<Resources>,
    /// Per queue, decayed past usage (for `decayed-usage` fair share), as of `usage_at`.
    usage: Vec<f64>,
    usage_at: u64,
    /// Per queue, the deserved share the fair-share stage last computed.
    deserved: Option<Vec<Resources>>,
    /// Per leaf queue, GPU-milli-seconds it has been short of its deserved share while it had work
    /// waiting, since it last had its share: what its reclaims may throw away
    /// ([`CoreConfig::reclaim_within_deficit`]), less what they already did.
    starved: Vec<u64>,
    /// Per leaf queue, GPU-milli short of its deserved share as the last cycle left it, when it has
    /// work waiting (else 0): the rate `starved` grows at until the next cycle.
    starving: Vec<u64>,
    /// The leaf queues in the order the fair-share stage last served them (empty: none yet).
    order: Vec<usize>,
    /// The unused reserves of lending queues and the roots' total allocation for the current
    /// `allocated` (`None` inside: no queue keeps a reserve): computed on first use, dropped by
    /// every change of `allocated`, so quota checks between two changes cost O(depth).
    reserves: OnceLock<Option<(UnusedReserves, Resources)>>,
    /// The fair-share stage's input as last sent, refreshed in place: names, parents, weights,
    /// guarantees and limits change only with the tree (`set_queues` drops it), so a call copies
    /// only the allocations, requests and usage that changed instead of rebuilding every state
    /// (the stage is asked after every bind or eviction of a cycle).
    share_input: Option<Vec<wasmsched_api::QueueState>>,
}

/// Others' pods, for inter-pod (anti-)affinity.
#[derive(Debug, Default)]
struct AffinityIndex {
    /// Per node, the pods of others running there.
    foreign_pods: AHashMap<String, Vec<RunningPod>>,
    /// Of those, the ones with anti-affinity terms (every task is checked against them).
    foreign_anti: AHashMap<String, Vec<RunningPod>>,
    /// Workloads with a member with anti-affinity terms (every task is checked against them).
    anti_holders: ahash::AHashSet<String>,
    /// Parked workloads with required pod affinity: a pod starting may be the one they wait for,
    /// which no capacity change would signal.
    affinity_parked: ahash::AHashSet<String>,
}

/// What the cycles so far have seen of the cluster and the policy.
#[derive(Debug, Default)]
struct LastCycle {
    /// Bumped on every change that may let parked work fit (capacity freed, node added).
    epoch: u64,
    /// The last cycle stopped at its attempt budget with work still ready.
    truncated: bool,
    /// The version of the policy set the last cycle ran: parked work was judged by that set, so
    /// another one (a hot reload) may place it.
    policy_version: Option<u64>,
    /// The nodes' allocatable total, taken at the start of each cycle: what lending queues'
    /// reserves are kept free of.
    capacity: Resources,
    /// With resource flavors: per flavor, then for nodes of none, the slots of its nodes (taken
    /// with `capacity`). Empty without flavors.
    flavor_nodes: Vec<Vec<Slot>>,
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
            on_node: AHashMap::new(),
            terminating: Vec::new(),
            holders: ahash::AHashSet::new(),
            queue_use: QueueUse {
                allocated: vec![Resources::default(); n],
                usage: vec![0.0; n],
                usage_at: 0,
                deserved: None,
                starved: vec![0; n],
                starving: vec![0; n],
                order: Vec::new(),
                reserves: OnceLock::new(),
                share_input: None,
            },
            affinity: AffinityIndex::default(),
            last_cycle: LastCycle::default(),
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

    /// Keeps free capacity per domain of these topology levels (node labels, innermost first),
    /// which policies read through the `domains` import ([`NodeTable::set_levels`]).
    pub fn set_levels(&mut self, levels: Vec<String>) {
        self.nodes.set_levels(levels);
    }

    /// Sets the accelerator kinds known besides NVIDIA's (what policies' `accelerators.kinds`
    /// answers; [`NodeTable::set_accelerator_kinds`]).
    pub fn set_accelerator_kinds(&mut self, kinds: Vec<wasmsched_api::accelerators::Kind>) {
        self.nodes.set_accelerator_kinds(kinds);
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
        node.allocated = Resources::default();
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
            if !matches!(self.nodes.update_usage(slot, |n| bind(n, &h.task, &h.devices)), Some(Ok(())))
                && let Some(e) = self.entries.get_mut(&w)
            {
                e.holds.remove(i);
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
        self.affinity.foreign_pods.remove(name);
        self.affinity.foreign_anti.remove(name);
        self.nodes.remove(name);
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
            self.affinity.anti_holders.insert(workload.name.clone());
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
                wake_at: None,
                explanation: Explanation::default(),
            },
        );
        Ok(())
    }

    /// A workload completed (or was deleted): its resources are released and it is forgotten.
    pub fn finish(&mut self, workload: &str) -> Result<(), CoreError> {
        let e = self.entries.remove(workload).ok_or_else(|| CoreError::UnknownWorkload(workload.into()))?;
        self.affinity.anti_holders.remove(workload);
        for (i, m) in e.members.iter().enumerate() {
            if let Some(m) = m {
                self.index_remove(&m.node, workload);
                let task = &e.spec.members[i];
                self.nodes.update_usage(m.slot, |n| release(n, task, &m.devices));
                self.account(e.leaf, &e.held(i, &self.queues), false);
            }
        }
        self.release_holds(&e.holds);
        self.holders.remove(workload);
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
            since: e.since,
        })
    }

    /// Each pending workload's place in its queue, from 1: the order a cycle tries a leaf queue's
    /// work in (higher priority first, then submission), whether it is due now or backing off.
    /// Which queue goes first is fair share's answer of the moment, so places are per queue.
    /// Workloads that are preempting are tried before every queue's list and have no place.
    pub fn queue_positions(&self) -> AHashMap<&str, usize> {
        let mut by_leaf: BTreeMap<usize, Vec<&Entry>> = BTreeMap::new();
        for e in self.entries.values().filter(|e| e.phase == Phase::Pending) {
            by_leaf.entry(e.leaf).or_default().push(e);
        }
        let mut places = AHashMap::new();
        for mut list in by_leaf.into_values() {
            list.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
            places.extend(list.into_iter().enumerate().map(|(i, e)| (e.spec.name.as_str(), i + 1)));
        }
        places
    }

    /// Every waiting workload (pending or preempting) as its leaf queue's index (as in
    /// [`SchedulerCore::queue_shares`]), since when it waits and why in a word
    /// ([`Explanation::category`]): what the metrics count, without a status copied per workload.
    pub fn waiting(&self) -> impl Iterator<Item = (usize, u64, &'static str)> + '_ {
        self.entries
            .values()
            .filter(|e| matches!(e.phase, Phase::Pending | Phase::Preempting))
            .map(|e| (e.leaf, e.since, e.explanation.category()))
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
                allocated: self.queue_use.allocated[i].clone(),
                deserved: self.queue_use.deserved.as_ref().and_then(|d| d.get(i).cloned()),
                decayed_usage: self.queue_use.usage[i],
                served: self.queue_use.order.iter().position(|&q| q == i).map(|p| p + 1),
            })
            .collect()
    }

    /// Whether the last cycle stopped at [`CoreConfig::max_attempts_per_cycle`] with workloads
    /// still ready to be tried: run the next one without waiting.
    pub fn more_ready(&self) -> bool {
        self.last_cycle.truncated
    }

    /// Run one cycle at time `now` (seconds, never decreasing). A cycle runs one set from start
    /// to end; when `set` is another version than the last cycle's, everything parked may be tried
    /// again (after its back-off): its verdicts came from the old policies.
    pub fn schedule(&mut self, set: &PolicySet, now: u64) -> Vec<Decision> {
        if self.last_cycle.policy_version.replace(set.version()).is_some_and(|v| v != set.version()) {
            self.unpark_all();
        }
        let mut out = Vec::new();
        self.advance(now, &mut out);
        (self.last_cycle.capacity, self.last_cycle.flavor_nodes) = self.cluster_capacity();

        let mut nominated: Vec<&Entry> = self.entries.values().filter(|e| e.phase == Phase::Preempting).collect();
        nominated.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
        let nominated: Vec<(String, bool)> =
            nominated.into_iter().map(|e| (e.spec.name.clone(), self.victims_gone(e))).collect();
        for (name, gone) in nominated {
            // An earlier one's attempt may have ended this one (its victims' room taken back).
            let Some(e) = self.entries.get_mut(&name) else { continue };
            if gone {
                // Its victims have left: it goes first, on the room kept for it, preempting
                // again if that room was taken by someone who outranks it.
                let holds = std::mem::take(&mut e.holds);
                e.phase = Phase::Pending;
                e.waiting_for.clear();
                self.release_holds(&holds);
                self.attempt(set, &name, now, &mut out, true);
            } else if e.parked_at != Some(self.last_cycle.epoch) && e.not_before <= now {
                // Still waiting (a long grace period, a finalizer): like kube-scheduler's nominated
                // pods, it takes room elsewhere if some appears, never evicting more meanwhile.
                self.attempt(set, &name, now, &mut out, false);
            }
        }

        // A gang whose wait for one domain of its first level ends may fall back now.
        let epoch = self.last_cycle.epoch;
        for e in self.entries.values_mut() {
            if e.wake_at.is_some_and(|t| t <= now) {
                e.wake_at = None;
                if e.parked_at == Some(epoch) {
                    e.parked_at = None;
                }
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
        let cluster = self.last_cycle.capacity.clone();
        // The plugin's answer depends only on allocations and pending demand, which change only
        // when something binds or leaves: until then its last order stands.
        let mut order: Option<Option<Vec<usize>>> = None;
        let mut failures = Failures::default();
        let mut budget = self.config.max_attempts_per_cycle.unwrap_or(usize::MAX);
        self.last_cycle.truncated = false;
        while !lists.is_empty() {
            if budget == 0 {
                self.last_cycle.truncated = true;
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
        if self.config.reclaim_within_deficit > 0 {
            self.note_starving();
        }
        out
    }
}

#[cfg(test)]
mod tests;
