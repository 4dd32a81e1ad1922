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
    /// The topology domains of the cluster's levels (innermost level first, then by name): what
    /// whole domains are left for gangs that need one.
    pub domains: Vec<DomainView>,
    /// The queue tree, parents before children.
    pub queues: Vec<QueueView>,
    /// Workloads that wait (and gangs partly placed).
    pub workloads: Vec<WorkloadView>,
    /// The live policy set.
    pub policies: Option<PolicyView>,
    /// Allocation and fragmentation over time, oldest first.
    pub series: Vec<SeriesPoint>,
    /// What `series[].at` counts (`seconds since the scheduler started`, `virtual seconds`,
    /// `pods decided`, `capacity arrived (%)`): the chart's axis.
    pub series_x: String,
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
    /// Two policy sets replayed on the same input (`replay --compare --serve`), served at
    /// `/api/v1/comparison`.
    #[serde(skip)]
    pub comparison: Option<std::sync::Arc<ComparisonView>>,
}

/// Two policy sets replayed on the same input, side by side: how far each replay is and its
/// curves while they run, then the comparison `replay --compare --json` prints.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ComparisonView {
    /// Jobs in the input.
    pub jobs: usize,
    /// Set A, then set B.
    pub sides: [ComparisonSide; 2],
    /// Once both replays are over: the comparison, as `replay --compare --json` prints it.
    pub result: Option<serde_json::Value>,
}

/// One replay of a comparison.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ComparisonSide {
    /// The policy set's name.
    pub set: String,
    /// Virtual seconds replayed so far.
    pub at_seconds: u64,
    /// Jobs arrived so far.
    pub arrived: usize,
    /// Tasks placed at least once so far.
    pub placed: usize,
    /// Whether this replay is over.
    pub finished: bool,
    /// GPUs allocated and fragmented over virtual seconds, one point per instant with a decision
    /// (thinned to at most [`ComparisonSide::POINTS`] when served).
    pub series: Vec<SeriesPoint>,
}

impl ComparisonSide {
    /// The most points of a side's series a view carries: more than a chart's width in pixels.
    pub const POINTS: usize = 1000;

    /// This side with its series thinned to at most [`ComparisonSide::POINTS`], evenly, the last kept.
    pub fn thinned(&self) -> ComparisonSide {
        let Some((last, rest)) = self.series.split_last() else { return self.clone() };
        let step = rest.len().div_ceil(Self::POINTS - 1).max(1);
        let mut series: Vec<SeriesPoint> = rest.iter().step_by(step).cloned().collect();
        series.push(last.clone());
        ComparisonSide { series, ..self.clone() }
    }
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
    /// MIG partitions device plugins publish, per profile (in profile order).
    pub partitions: Vec<PartitionCount>,
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
    /// Its accelerator kind (`nvidia`, `amd`, …).
    pub kind: String,
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
    /// Its GPUs' accelerator kind (`nvidia`, `amd`, …; the first device's), empty without GPUs.
    pub kind: String,
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
    /// MIG partitions its device plugin publishes as extended resources, per profile.
    pub partitions: Vec<PartitionCount>,
}

/// MIG partitions of one profile that a device plugin publishes as an extended resource
/// (`nvidia.com/mig-1g.10gb: 7`, the plugin's `mixed` strategy). Counted, not named: which
/// instance a pod gets is the kubelet's choice.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PartitionCount {
    /// The profile (`1g.10gb`).
    pub profile: String,
    /// Published (allocatable).
    pub total: u64,
    /// Requested by the pods placed there.
    pub used: u64,
}

/// The device plugin's MIG resources are `nvidia.com/mig-<profile>`.
const MIG_RESOURCE: &str = "nvidia.com/mig-";

impl PartitionCount {
    /// A node's MIG partitions, from what its device plugin publishes and its pods request.
    fn of(node: &wasmsched_api::Node) -> Vec<PartitionCount> {
        let used = |name: &str| node.allocated.extended.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
        node.allocatable
            .extended
            .iter()
            .filter_map(|(name, total)| {
                let profile = name.strip_prefix(MIG_RESOURCE)?;
                Some(PartitionCount { profile: profile.to_string(), total: *total, used: used(name) })
            })
            .collect()
    }
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
    /// Of its unused GPU guarantee, what its siblings' borrowing takes now (see
    /// [`QueueView::lend`]), in thousandths.
    pub lent_gpu_milli: u64,
    /// The most of its GPU guarantee it lends (`None`: all of it), in thousandths.
    pub lending_limit_gpu_milli: Option<u64>,
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
    /// CPU held above its guarantee, and lent of its unused guarantee, milli-cores.
    pub borrowed_cpu_milli: u64,
    /// See `borrowed_cpu_milli`.
    pub lent_cpu_milli: u64,
    /// Memory held above its guarantee, and lent of its unused guarantee, bytes.
    pub borrowed_memory_bytes: u64,
    /// See `borrowed_memory_bytes`.
    pub lent_memory_bytes: u64,
    /// The most of its CPU and memory guarantees it lends (`None`: all).
    pub lending_limit_cpu_milli: Option<u64>,
    /// See `lending_limit_cpu_milli`.
    pub lending_limit_memory_bytes: Option<u64>,
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
        let lends = |of: fn(&wasmsched_api::Resources) -> u64| {
            spec.and_then(|q| q.lending_limit.as_ref()).map(of).filter(|&v| v < UNBOUNDED)
        };
        let held = &share.allocated;
        let guaranteed = spec.map(|q| &q.guarantee);
        QueueView {
            name: share.name.clone(),
            parent,
            allocated_gpu_milli: share.allocated.gpu_milli,
            deserved_gpu_milli: deserved.map(|d| d.gpu_milli),
            weight: spec.map_or(0, |q| q.weight),
            guarantee_gpu_milli: guarantee,
            capability_gpu_milli: cap(|c| c.gpu_milli),
            borrowed_gpu_milli: share.allocated.gpu_milli.saturating_sub(guarantee),
            lent_gpu_milli: 0,
            lending_limit_gpu_milli: lends(|l| l.gpu_milli),
            served: share.served,
            allocated_cpu_milli: share.allocated.cpu_milli,
            deserved_cpu_milli: deserved.map(|d| d.cpu_milli),
            allocated_memory_bytes: share.allocated.memory_bytes,
            deserved_memory_bytes: deserved.map(|d| d.memory_bytes),
            guarantee_cpu_milli: spec.map_or(0, |q| q.guarantee.cpu_milli),
            capability_cpu_milli: cap(|c| c.cpu_milli),
            guarantee_memory_bytes: spec.map_or(0, |q| q.guarantee.memory_bytes),
            capability_memory_bytes: cap(|c| c.memory_bytes),
            borrowed_cpu_milli: held.cpu_milli.saturating_sub(guaranteed.map_or(0, |g| g.cpu_milli)),
            lent_cpu_milli: 0,
            borrowed_memory_bytes: held.memory_bytes.saturating_sub(guaranteed.map_or(0, |g| g.memory_bytes)),
            lent_memory_bytes: 0,
            lending_limit_cpu_milli: lends(|l| l.cpu_milli),
            lending_limit_memory_bytes: lends(|l| l.memory_bytes),
            pending,
            running,
        }
    }
}

/// One resource of a queue row, for [`QueueView::lend`].
struct Dimension {
    allocated: fn(&QueueView) -> u64,
    guarantee: fn(&QueueView) -> u64,
    borrowed: fn(&QueueView) -> u64,
    lending_limit: fn(&QueueView) -> Option<u64>,
    lent: fn(&mut QueueView) -> &mut u64,
}

const DIMENSIONS: [Dimension; 3] = [
    Dimension {
        allocated: |q| q.allocated_gpu_milli,
        guarantee: |q| q.guarantee_gpu_milli,
        borrowed: |q| q.borrowed_gpu_milli,
        lending_limit: |q| q.lending_limit_gpu_milli,
        lent: |q| &mut q.lent_gpu_milli,
    },
    Dimension {
        allocated: |q| q.allocated_cpu_milli,
        guarantee: |q| q.guarantee_cpu_milli,
        borrowed: |q| q.borrowed_cpu_milli,
        lending_limit: |q| q.lending_limit_cpu_milli,
        lent: |q| &mut q.lent_cpu_milli,
    },
    Dimension {
        allocated: |q| q.allocated_memory_bytes,
        guarantee: |q| q.guarantee_memory_bytes,
        borrowed: |q| q.borrowed_memory_bytes,
        lending_limit: |q| q.lending_limit_memory_bytes,
        lent: |q| &mut q.lent_memory_bytes,
    },
];

impl QueueView {
    /// What each queue of `rows` (the whole tree) lends, per resource. Borrowing is of idle
    /// capacity (`docs/scheduling.md`), so no ledger says whose guarantee a borrower uses; the
    /// dashboard counts it the way a cohort does: among the children of one parent, what the
    /// borrowers hold above their guarantees comes out of the siblings' lendable amounts (the
    /// unused guarantee, at most the lending limit), each lending in proportion to what it can.
    /// What is borrowed beyond all of them comes from capacity nobody is guaranteed.
    pub fn lend(rows: &mut [QueueView]) {
        let mut parents: Vec<Option<String>> = rows.iter().map(|q| q.parent.clone()).collect();
        parents.sort();
        parents.dedup();
        for parent in parents {
            let siblings: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].parent == parent).collect();
            for d in &DIMENSIONS {
                let lendable = |q: &QueueView| {
                    let idle = (d.guarantee)(q).saturating_sub((d.allocated)(q));
                    (d.lending_limit)(q).map_or(idle, |l| idle.min(l))
                };
                let borrowed: u128 = siblings.iter().map(|&i| u128::from((d.borrowed)(&rows[i]))).sum();
                let offered: u128 = siblings.iter().map(|&i| u128::from(lendable(&rows[i]))).sum();
                for &i in &siblings {
                    let can = u128::from(lendable(&rows[i]));
                    let lent = if borrowed >= offered { can } else { can * borrowed / offered.max(1) };
                    *(d.lent)(&mut rows[i]) = lent as u64;
                }
            }
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

/// The fragmentation a live scheduler's dashboard shows is FGD's measure for the shapes covering
/// this share of the pods it has (the simulator's figure)…
pub const TARGET_POPULARITY_PERCENT: u32 = 95;
/// …at most this many of them, most popular first: pods ask for every CPU amount there is, and
/// the measure costs shapes × nodes × GPUs on the view's builder, beside the scheduler (at 5,000
/// nodes, hundreds of shapes cost tens of milliseconds a view).
pub const TARGET_SHAPES: usize = 32;

/// One point of the allocation history.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// The source's clock, in the view's `series_x` unit.
    pub at: f64,
    /// GPUs allocated, percent of capacity.
    pub allocation_percent: f64,
    /// GPUs fragmented (FGD's measure), percent of capacity, when the source computes it.
    pub fragmentation_percent: Option<f64>,
}

/// The label NVIDIA's GPU feature discovery puts the GPUs' product name in: the model of a node
/// whose GPUs are not whole devices the scheduler counts (MIG partitions, DRA devices).
const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

impl NodeView {
    /// The row with `devices`, its DRA devices; a node whose GPUs only DRA publishes takes its
    /// model from them.
    pub fn with_devices(mut self, devices: Vec<DeviceView>) -> NodeView {
        if self.gpus.is_empty()
            && let Some(model) = devices.iter().find_map(|d| d.model.clone())
        {
            self.model = model;
        }
        self.devices = devices;
        self
    }
}

impl From<&wasmsched_api::Node> for NodeView {
    fn from(node: &wasmsched_api::Node) -> NodeView {
        NodeView {
            name: node.name.clone(),
            model: match node.gpus.first() {
                Some(g) => g.model.clone(),
                None => node.label(PRODUCT_LABEL).unwrap_or_default().to_string(),
            },
            kind: node
                .gpus
                .first()
                .map(|g| wasmsched_api::accelerators::display_name(&g.kind).to_string())
                .unwrap_or_default(),
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
            partitions: PartitionCount::of(node),
        }
    }
}

/// One domain of a topology level (an NVLink clique, a rack, a block): the nodes sharing the values
/// of the level's label and those of the levels outside it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DomainView {
    /// The level (a node label).
    pub level: String,
    /// The domain's name: the labels' values, innermost first, joined by `/`.
    pub name: String,
    /// Its nodes.
    pub nodes: u32,
    /// Of them, nodes with nothing allocated: a domain whose nodes are all idle is whole.
    pub idle_nodes: u32,
    /// Its GPUs.
    pub gpus: u64,
    /// Their free share, in thousandths of a GPU.
    pub free_gpu_milli: u64,
}

impl DomainView {
    /// The domains of `levels` (node labels, innermost first) over `nodes`, named as gang
    /// placement and policies name them ([`wasmsched_api::domains::domain_name`]).
    pub fn of(nodes: &[NodeView], levels: &[String]) -> Vec<DomainView> {
        let mut out = Vec::new();
        let mut name = String::new();
        for (i, level) in levels.iter().enumerate() {
            let mut by_name: std::collections::BTreeMap<String, DomainView> = Default::default();
            for n in nodes {
                let label = |key: &str| n.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
                if !wasmsched_api::domains::domain_name_by(label, &levels[i..], &mut name) {
                    continue;
                }
                let d = by_name.entry(name.clone()).or_insert_with(|| DomainView {
                    level: level.clone(),
                    name: name.clone(),
                    ..DomainView::default()
                });
                let used: u64 = n.gpus.iter().map(|g| u64::from(g.used_milli)).sum();
                d.nodes += 1;
                d.idle_nodes += u32::from(used == 0 && n.cpu_used_milli == 0);
                d.gpus += n.gpus.len() as u64;
                d.free_gpu_milli += (1000 * n.gpus.len() as u64).saturating_sub(used);
            }
            out.extend(by_name.into_values());
        }
        out
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
            for p in &n.partitions {
                match c.partitions.iter_mut().find(|q| q.profile == p.profile) {
                    Some(q) => {
                        q.total += p.total;
                        q.used += p.used;
                    }
                    None => c.partitions.push(p.clone()),
                }
            }
            if n.gpus.is_empty() {
                continue;
            }
            match c.models.iter_mut().find(|m| m.model == n.model && m.kind == n.kind) {
                Some(m) => {
                    m.gpus += n.gpus.len() as u64;
                    m.used_milli += used;
                }
                None => c.models.push(ModelCount {
                    model: n.model.clone(),
                    kind: n.kind.clone(),
                    gpus: n.gpus.len() as u64,
                    used_milli: used,
                }),
            }
        }
        c.models.sort_by(|a, b| (&a.kind, &a.model).cmp(&(&b.kind, &b.model)));
        c.partitions.sort_by(|a, b| a.profile.cmp(&b.profile));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_counts_gpus_per_vendor_and_model() {
        let node = |name: &str, kind: &str, model: &str, free: u32| {
            let gpus = (0..8)
                .map(|index| wasmsched_api::GpuDevice {
                    index,
                    model: model.into(),
                    kind: kind.into(),
                    free_milli: free,
                    ..Default::default()
                })
                .collect();
            NodeView::from(&wasmsched_api::Node { name: name.into(), gpus, ..Default::default() })
        };
        let nodes = [node("a", "amd", "MI300X", 0), node("b", "", "H100", 1000), node("c", "amd", "MI300X", 1000)];
        assert_eq!((nodes[0].kind.as_str(), nodes[1].kind.as_str()), ("amd", "nvidia"));
        let c = Cluster::of(&nodes, 0, 0);
        let models: Vec<(&str, &str, u64, u64)> =
            c.models.iter().map(|m| (m.kind.as_str(), m.model.as_str(), m.gpus, m.used_milli)).collect();
        assert_eq!(models, [("amd", "MI300X", 16, 8000), ("nvidia", "H100", 8, 0)]);
        assert_eq!(NodeView::from(&wasmsched_api::Node::default()).kind, "", "no GPU, no kind");
    }

    #[test]
    fn a_comparison_side_is_thinned_evenly_to_its_limit_keeping_its_first_and_last_points() {
        let side = |n: usize| ComparisonSide {
            series: (0..n)
                .map(|i| SeriesPoint { at: i as f64, allocation_percent: 0.0, fragmentation_percent: None })
                .collect(),
            ..ComparisonSide::default()
        };
        assert_eq!(side(0).thinned(), side(0));
        assert_eq!(side(ComparisonSide::POINTS).thinned(), side(ComparisonSide::POINTS));
        for n in [ComparisonSide::POINTS + 1, 2_500, 100_000] {
            let thin = side(n).thinned().series;
            assert!(
                thin.len() <= ComparisonSide::POINTS && thin.len() > ComparisonSide::POINTS / 2,
                "{n}: {}",
                thin.len()
            );
            assert_eq!((thin[0].at, thin[thin.len() - 1].at), (0.0, (n - 1) as f64), "{n}");
            let gaps: Vec<f64> = thin.windows(2).map(|w| w[1].at - w[0].at).collect();
            let step = gaps[0];
            assert!(gaps[..gaps.len() - 1].iter().all(|g| *g == step) && gaps[gaps.len() - 1] <= step, "{n}");
        }
    }

    #[test]
    fn a_queue_lends_what_its_siblings_borrow_of_its_unused_guarantee_up_to_its_lending_limit() {
        let q = |name: &str, parent: Option<&str>, guarantee: u64, allocated: u64, limit: Option<u64>| QueueView {
            name: name.into(),
            parent: parent.map(String::from),
            guarantee_gpu_milli: guarantee,
            allocated_gpu_milli: allocated,
            borrowed_gpu_milli: allocated.saturating_sub(guarantee),
            lending_limit_gpu_milli: limit,
            guarantee_cpu_milli: 8_000,
            allocated_cpu_milli: 2_000,
            ..QueueView::default()
        };
        // Under org: batch borrows 6 GPUs; prod could lend 10 idle but its limit says 4, dev all
        // of its 4 idle: 8 offered, 6 taken, in proportion (3 and 3). Nobody borrows CPU.
        let mut rows = vec![
            q("org", None, 0, 24_000, None),
            q("prod", Some("org"), 16_000, 6_000, Some(4_000)),
            q("dev", Some("org"), 4_000, 0, None),
            q("batch", Some("org"), 12_000, 18_000, None),
            // A lone leaf elsewhere, borrowing more than anyone offers.
            q("solo", Some("other"), 2_000, 9_000, None),
        ];
        QueueView::lend(&mut rows);
        let lent: Vec<(&str, u64, u64)> =
            rows.iter().map(|q| (q.name.as_str(), q.lent_gpu_milli, q.lent_cpu_milli)).collect();
        assert_eq!(lent, [("org", 0, 0), ("prod", 3_000, 0), ("dev", 3_000, 0), ("batch", 0, 0), ("solo", 0, 0)]);
        // Borrowing past what all siblings offer takes each one's whole lendable amount.
        rows[3].allocated_gpu_milli = 30_000;
        rows[3].borrowed_gpu_milli = 18_000;
        QueueView::lend(&mut rows);
        assert_eq!((rows[1].lent_gpu_milli, rows[2].lent_gpu_milli), (4_000, 4_000));
    }

    #[test]
    fn mig_partitions_of_a_device_plugin_are_counted_per_profile_on_the_node_and_the_cluster() {
        let mig = |name: &str, total: u64, used: u64| {
            let ext = |v: u64| -> wasmsched_api::Extended {
                vec![("example.com/fpga".into(), 1), (format!("nvidia.com/mig-{name}").into(), v)].into()
            };
            let mut node = wasmsched_api::Node { name: format!("mig-{name}"), ..Default::default() };
            node.allocatable.extended = ext(total);
            node.allocated.extended = if used > 0 { ext(used) } else { Default::default() };
            node
        };
        let a = NodeView::from(&mig("1g.10gb", 7, 3));
        assert_eq!(a.partitions, [PartitionCount { profile: "1g.10gb".into(), total: 7, used: 3 }]);
        let b = NodeView::from(&mig("3g.40gb", 2, 0));
        let c = NodeView::from(&mig("1g.10gb", 7, 7));
        let cluster = Cluster::of(&[a, b, c], 0, 0);
        assert_eq!(
            cluster.partitions,
            [
                PartitionCount { profile: "1g.10gb".into(), total: 14, used: 10 },
                PartitionCount { profile: "3g.40gb".into(), total: 2, used: 0 }
            ]
        );
        assert_eq!((cluster.gpus, cluster.models.len()), (0, 0), "partitions are not whole GPUs");
    }

    #[test]
    fn a_capability_bounds_only_what_it_names() {
        let unnamed = u64::MAX / 4;
        let cap = wasmsched_api::Resources {
            gpu_milli: 8_000,
            cpu_milli: unnamed,
            memory_bytes: unnamed,
            extended: Default::default(),
        };
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
