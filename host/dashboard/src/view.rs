//! What the dashboard shows: one [`View`] of the scheduler or the simulator at a moment, built by
//! them (off their scheduling thread, from copy-on-write snapshots) and published whole. The API
//! serves parts of the latest view; nothing here refers back to live state, so a slow browser can
//! never hold up a decision.

use serde::Serialize;

/// The scheduler or simulator at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct View {
    /// What is being shown (`simulator: openb default trace, fgd`, `kubernetes`).
    pub source: String,
    /// The source's clock: virtual seconds for a replay, seconds since start for a scheduler.
    pub at_seconds: u64,
    /// Totals over the cluster.
    pub cluster: Cluster,
    /// Every node, in name order.
    pub nodes: Vec<NodeView>,
    /// The queue tree, parents before children.
    pub queues: Vec<QueueView>,
    /// Workloads that wait (and gangs partly placed).
    pub workloads: Vec<WorkloadView>,
    /// The live policy set.
    pub policies: Option<PolicyView>,
    /// Allocation and fragmentation over time, oldest first.
    pub series: Vec<SeriesPoint>,
    /// Each node's GPU topology as `wasmsched topo` renders it (the `nvidia-smi topo -m` matrix,
    /// NUMA, link classes), for the nodes that publish one. Served with a single node only
    /// (`/api/v1/nodes/{name}`): the list pages stay small. Shared, as topologies rarely change.
    #[serde(skip)]
    pub topologies: std::sync::Arc<std::collections::HashMap<String, std::sync::Arc<str>>>,
    /// Each queue's GPUs allocated and deserved over time, oldest first. Served with a single
    /// queue only (`/api/v1/queues/{name}`).
    #[serde(skip)]
    pub queue_history: std::sync::Arc<std::collections::HashMap<String, std::collections::VecDeque<SharePoint>>>,
    /// An experiment grid's progress and results (`experiment --serve`), served at
    /// `/api/v1/experiments`.
    #[serde(skip)]
    pub experiments: Option<std::sync::Arc<ExperimentsView>>,
}

/// An experiment grid (traces × policies × seeds): how far it is, and once it is over, its table
/// and each (trace, policy)'s allocation curve.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExperimentsView {
    /// Experiments finished.
    pub done: usize,
    /// Experiments in the grid.
    pub total: usize,
    /// The traces, in grid order.
    pub traces: Vec<String>,
    /// The policies, in grid order.
    pub policies: Vec<String>,
    /// Seeds per (trace, policy).
    pub seeds: usize,
    /// Per (trace, policy), once the grid is over.
    pub rows: Vec<ExperimentRow>,
}

/// One (trace, policy) of a finished grid.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExperimentRow {
    /// The trace.
    pub trace: String,
    /// The policy.
    pub policy: String,
    /// GPU allocation ratio (percent) at 100 % and at 130 % of capacity arrived: mean over seeds
    /// and its sample standard deviation (none where the grid did not reach it).
    pub at_100: Option<[f64; 2]>,
    /// The same at 130 %.
    pub at_130: Option<[f64; 2]>,
    /// Mean allocation percent by arrived percent, 0, 1, … (none where no seed got there).
    pub allocation: Vec<Option<f64>>,
}

/// One sample of a queue's share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SharePoint {
    /// Seconds (the view's clock).
    pub at: u64,
    /// GPUs allocated to its subtree, in thousandths.
    pub allocated_gpu_milli: u64,
    /// Its deserved GPUs, in thousandths, where fair share has answered.
    pub deserved_gpu_milli: Option<u64>,
}

/// Totals over the cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Cluster {
    /// Nodes.
    pub nodes: usize,
    /// Whole GPUs.
    pub gpus: u64,
    /// GPU capacity in thousandths of a GPU.
    pub gpu_milli_total: u64,
    /// Of which allocated.
    pub gpu_milli_used: u64,
    /// GPUs partly allocated (a share of them is in use, the rest is idle but split).
    pub gpus_shared: u64,
    /// Per GPU model.
    pub models: Vec<ModelCount>,
    /// Tasks placed so far.
    pub placed: u64,
    /// Tasks that could not be placed (a replay) or wait (a scheduler).
    pub waiting: u64,
}

/// GPUs of one model.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelCount {
    /// The model (`""` for GPUs of unknown model).
    pub model: String,
    /// Whole GPUs.
    pub gpus: u64,
    /// Allocated, in thousandths of a GPU.
    pub used_milli: u64,
}

/// One node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// Its GPUs' model.
    pub model: String,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
    /// CPU capacity and allocation, in millicores.
    pub cpu_milli: u64,
    /// Allocated CPU, in millicores.
    pub cpu_used_milli: u64,
    /// Cordoned.
    pub unschedulable: bool,
    /// The tasks placed on it, with their queues (`[]` where the source does not say).
    pub tasks: Vec<NodeTask>,
    /// The DRA devices local to it (`resource.k8s.io` ResourceSlices), whole GPUs and MIG
    /// partitions alike, and which claims hold them.
    pub devices: Vec<DeviceView>,
}

/// One DRA device local to a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceView {
    /// `driver/pool/device`, as allocation results name it.
    pub id: String,
    /// What its driver calls it, where the slice says (`productName`: `NVIDIA H100 80GB HBM3`).
    pub model: Option<String>,
    /// Its kind, where the slice says (`type`: `gpu`, `mig`).
    pub kind: Option<String>,
    /// MIG profile, where it is a partition (`profile`: `1g.10gb`).
    pub profile: Option<String>,
    /// The claims that hold it (`namespace/name`); empty when free.
    pub held_by: Vec<String>,
}

/// A task placed on a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeTask {
    /// The task.
    pub name: String,
    /// Its queue.
    pub queue: String,
}

/// One GPU of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuView {
    /// Its index on the node.
    pub index: u32,
    /// Allocated, in thousandths (1000: whole; between: shared).
    pub used_milli: u32,
    /// Its memory in bytes (0: unknown).
    pub memory_bytes: u64,
    /// Its NUMA node, when known.
    pub numa_node: Option<u32>,
    /// `Healthy`, `Degraded` or `Unhealthy` (new work avoids or never gets it).
    pub health: &'static str,
}

/// One queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueView {
    /// Its name.
    pub name: String,
    /// Its parent (none for the root's children).
    pub parent: Option<String>,
    /// GPUs allocated to its subtree, in thousandths.
    pub allocated_gpu_milli: u64,
    /// Its deserved GPUs from the last fair-share computation, in thousandths.
    pub deserved_gpu_milli: Option<u64>,
    /// Its weight among its siblings.
    pub weight: u32,
    /// GPUs always obtainable, in thousandths.
    pub guarantee_gpu_milli: u64,
    /// Most GPUs its subtree may hold, in thousandths; `None`: unbounded.
    pub capability_gpu_milli: Option<u64>,
    /// GPUs held above its guarantee (borrowed from others' unused guarantees), in thousandths.
    pub borrowed_gpu_milli: u64,
    /// A leaf's place in the order fair share last served the leaves (the most underserved first);
    /// `None` for inner queues or before fair share has answered.
    pub served: Option<usize>,
    /// CPU allocated to its subtree, milli-cores.
    pub allocated_cpu_milli: u64,
    /// CPU deserved, milli-cores.
    pub deserved_cpu_milli: Option<u64>,
    /// Memory allocated to its subtree, bytes.
    pub allocated_memory_bytes: u64,
    /// Memory deserved, bytes.
    pub deserved_memory_bytes: Option<u64>,
    /// CPU always obtainable, milli-cores, and the most its subtree may hold (`None`: unbounded).
    pub guarantee_cpu_milli: u64,
    /// See `guarantee_cpu_milli`.
    pub capability_cpu_milli: Option<u64>,
    /// Memory always obtainable, bytes, and the most its subtree may hold (`None`: unbounded).
    pub guarantee_memory_bytes: u64,
    /// See `guarantee_memory_bytes`.
    pub capability_memory_bytes: Option<u64>,
    /// Tasks waiting in it.
    pub pending: usize,
    /// Tasks running in it.
    pub running: usize,
}

/// Amounts from here up stand for "unbounded" in a bound (the sources write `u64::MAX / 4` for what
/// a capability does not name).
const UNBOUNDED: u64 = 1 << 60;

impl QueueView {
    /// A queue's row: what fair share says of it (`share`), its quotas (`spec`), its parent's name,
    /// and how many of its tasks wait and run.
    pub fn of(
        share: &wasmsched_core::QueueShare,
        spec: Option<&wasmsched_core::QueueSpec>,
        parent: Option<String>,
        pending: usize,
        running: usize,
    ) -> QueueView {
        let guarantee = spec.map_or(0, |q| q.guarantee.gpu_milli);
        let deserved = share.deserved.as_ref();
        // A capability bounds what it names; the rest reads as a huge number (unbounded).
        let cap = |of: fn(&wasmsched_api::Resources) -> u64| {
            spec.and_then(|q| q.capability.as_ref()).map(of).filter(|&v| v < UNBOUNDED)
        };
        QueueView {
            name: share.name.clone(),
            parent,
            allocated_gpu_milli: share.allocated.gpu_milli,
            deserved_gpu_milli: deserved.map(|d| d.gpu_milli),
            weight: spec.map_or(0, |q| q.weight),
            guarantee_gpu_milli: guarantee,
            capability_gpu_milli: cap(|c| c.gpu_milli),
            borrowed_gpu_milli: share.allocated.gpu_milli.saturating_sub(guarantee),
            served: share.served,
            allocated_cpu_milli: share.allocated.cpu_milli,
            deserved_cpu_milli: deserved.map(|d| d.cpu_milli),
            allocated_memory_bytes: share.allocated.memory_bytes,
            deserved_memory_bytes: deserved.map(|d| d.memory_bytes),
            guarantee_cpu_milli: spec.map_or(0, |q| q.guarantee.cpu_milli),
            capability_cpu_milli: cap(|c| c.cpu_milli),
            guarantee_memory_bytes: spec.map_or(0, |q| q.guarantee.memory_bytes),
            capability_memory_bytes: cap(|c| c.memory_bytes),
            pending,
            running,
        }
    }
}

/// One workload that waits, or a gang not wholly placed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkloadView {
    /// Its name (`namespace/name` of a pod, or its gang's key).
    pub name: String,
    /// Its queue.
    pub queue: String,
    /// `Pending`, `Running`, `Preempting`, `TimedOut`.
    pub phase: String,
    /// Members.
    pub members: usize,
    /// Members placed.
    pub placed: usize,
    /// Members placed together at least.
    pub min_member: usize,
    /// Why it waits, as the scheduler explains it.
    pub reason: Option<String>,
    /// Its place among its queue's waiting work, from 1, in the order the scheduler tries them
    /// (priority, then submission); `None` where there is no queue order (the simulator's failed
    /// pods, a preempting workload).
    pub queue_position: Option<usize>,
    /// Seconds since it was submitted or re-queued; `None` where unknown.
    pub waiting_seconds: Option<u64>,
}

/// The live policy set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PolicyView {
    /// Its name.
    pub name: String,
    /// Its version (1, 2, … as swapped live).
    pub version: u64,
    /// Its plugins in stage order.
    pub plugins: Vec<PluginView>,
    /// The rollout as `wasmsched policy status --json` reports it (probation, the live
    /// version's last window, a candidate's shadow comparison, source errors, history); `None`
    /// where there is no registry (the simulator).
    pub rollout: Option<serde_json::Value>,
}

/// One plugin of the live set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PluginView {
    /// Its name.
    pub name: String,
    /// The stages it serves.
    pub stages: Vec<String>,
    /// Its component's digest (`native` for a built-in run natively).
    pub digest: String,
    /// The sandbox's bounds on it; `None` where it does not run in the sandbox (native) or they
    /// are not known to the view.
    pub budget: Option<BudgetView>,
    /// Calls, faults and latency per stage since it was loaded (its smoke test included); empty
    /// where not measured.
    pub calls: Vec<StageCalls>,
}

/// What one call of a plugin may use, and what a fault does.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BudgetView {
    /// CPU time per call, milliseconds.
    pub deadline_ms: f64,
    /// Linear-memory cap, MiB.
    pub memory_mib: u64,
    /// `fail-closed` (the task waits, the fault is its reason) or `fail-open` (the verdict is skipped).
    pub failure: String,
}

/// One stage of one plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StageCalls {
    /// The stage (`Filter`, `Score`, …).
    pub stage: String,
    /// Calls made, failed ones included.
    pub calls: u64,
    /// Faults by kind (`deadline`, `memory`, `trap`, …), only kinds seen.
    pub faults: Vec<FaultCount>,
    /// Mean latency of the calls that reached the plugin, microseconds.
    pub mean_us: f64,
    /// 99th percentile, microseconds (the upper bound of its power-of-two bucket).
    pub p99_us: f64,
}

/// Faults of one kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FaultCount {
    /// The kind.
    pub kind: String,
    /// How many.
    pub count: u64,
}

/// One point of the allocation history.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// The source's clock (virtual seconds, or arrived percent × 10 for an FGD replay).
    pub at: f64,
    /// GPUs allocated, percent of capacity.
    pub allocation_percent: f64,
    /// GPUs fragmented (FGD's measure), percent of capacity, when the source computes it.
    pub fragmentation_percent: Option<f64>,
}

impl From<&wasmsched_api::Node> for NodeView {
    fn from(node: &wasmsched_api::Node) -> NodeView {
        NodeView {
            name: node.name.clone(),
            model: node.gpus.first().map(|g| g.model.clone()).unwrap_or_default(),
            labels: node.labels.clone(),
            gpus: node
                .gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    used_milli: wasmsched_api::GPU_MILLI.saturating_sub(g.free_milli),
                    memory_bytes: g.memory_bytes,
                    numa_node: g.numa_node,
                    health: match g.health {
                        wasmsched_api::GpuHealth::Healthy => "Healthy",
                        wasmsched_api::GpuHealth::Degraded => "Degraded",
                        wasmsched_api::GpuHealth::Unhealthy => "Unhealthy",
                    },
                })
                .collect(),
            cpu_milli: node.allocatable.cpu_milli,
            cpu_used_milli: node.allocated.cpu_milli,
            unschedulable: node.unschedulable,
            tasks: Vec::new(),
            devices: Vec::new(),
        }
    }
}

impl Cluster {
    /// The totals of `nodes`, with `placed` and `waiting` tasks.
    pub fn of(nodes: &[NodeView], placed: u64, waiting: u64) -> Cluster {
        let mut c = Cluster { nodes: nodes.len(), placed, waiting, ..Cluster::default() };
        for n in nodes {
            let used: u64 = n.gpus.iter().map(|g| u64::from(g.used_milli)).sum();
            c.gpus += n.gpus.len() as u64;
            c.gpu_milli_total += 1000 * n.gpus.len() as u64;
            c.gpu_milli_used += used;
            c.gpus_shared += n.gpus.iter().filter(|g| g.used_milli > 0 && g.used_milli < 1000).count() as u64;
            if n.gpus.is_empty() {
                continue;
            }
            match c.models.iter_mut().find(|m| m.model == n.model) {
                Some(m) => {
                    m.gpus += n.gpus.len() as u64;
                    m.used_milli += used;
                }
                None => {
                    c.models.push(ModelCount { model: n.model.clone(), gpus: n.gpus.len() as u64, used_milli: used })
                }
            }
        }
        c.models.sort_by(|a, b| a.model.cmp(&b.model));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_bounds_only_what_it_names() {
        let unnamed = u64::MAX / 4;
        let cap =
            wasmsched_api::Resources { gpu_milli: 8_000, cpu_milli: unnamed, memory_bytes: unnamed, extended: vec![] };
        let spec = wasmsched_core::QueueSpec {
            name: "batch".into(),
            weight: 1,
            guarantee: wasmsched_api::Resources { cpu_milli: 4_000, ..Default::default() },
            capability: Some(cap),
            ..Default::default()
        };
        let share = wasmsched_core::QueueShare {
            name: "batch".into(),
            allocated: wasmsched_api::Resources { gpu_milli: 2_000, ..Default::default() },
            deserved: None,
            decayed_usage: 0.0,
            served: Some(1),
        };
        let q = QueueView::of(&share, Some(&spec), Some("org".into()), 3, 1);
        assert_eq!(
            (q.capability_gpu_milli, q.capability_cpu_milli, q.capability_memory_bytes),
            (Some(8_000), None, None)
        );
        assert_eq!((q.guarantee_cpu_milli, q.borrowed_gpu_milli, q.pending, q.running), (4_000, 2_000, 3, 1));
        let alone = QueueView::of(&share, None, None, 0, 0);
        assert_eq!((alone.capability_gpu_milli, alone.weight), (None, 0));
    }
}
