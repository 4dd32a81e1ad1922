//! The built-in policies as WebAssembly components, embedded in the binary so that a fresh checkout
//! runs without a separate plugin build.
//!
//! Each is built from the crate of the same name under `plugins/` by `build.rs`. The same crates
//! linked natively are the host's benchmark baseline and differential oracle.

/// A built-in component and the configuration it is registered with.
#[derive(Clone, Copy, Debug)]
pub struct BuiltIn {
    /// Registered name.
    pub name: &'static str,
    /// The component binary.
    pub wasm: &'static [u8],
    /// Default configuration.
    pub config: &'static str,
    /// The stage it serves as a policy of its own.
    pub role: Role,
    /// The plugin crate it is built from (what runs natively in its place).
    pub source: Source,
}

/// The stage a built-in serves when a command names it as a policy (`--policy NAME`,
/// `--fair-share NAME`): what the commands offer, read from this one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A filter every set starts with.
    Filter,
    /// A score policy (some also choose the devices).
    Score,
    /// A fair-share stage.
    FairShare,
    /// A victim-selection stage.
    Preempt,
}

/// The plugin crate under `plugins/` a built-in is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `plugins/resource-fit`.
    ResourceFit,
    /// `plugins/allocation-score`.
    AllocationScore,
    /// `plugins/node-affinity`.
    NodeAffinity,
    /// `plugins/fair-share`.
    FairShare,
    /// `plugins/priority-preempt`.
    PriorityPreempt,
    /// `plugins/gpu-share-score`.
    GpuShareScore,
    /// `plugins/gpu-topology`.
    GpuTopology,
    /// `plugins/domain-packing`.
    DomainPacking,
}

const RESOURCE_FIT_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/resource-fit.wasm"));
const ALLOCATION_SCORE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/allocation-score.wasm"));
const NODE_AFFINITY_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/node-affinity.wasm"));
const FAIR_SHARE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fair-share.wasm"));
const PRIORITY_PREEMPT_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/priority-preempt.wasm"));
const GPU_SHARE_SCORE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu-share-score.wasm"));
const GPU_TOPOLOGY_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu-topology.wasm"));
const DOMAIN_PACKING_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/domain-packing.wasm"));

/// `resource-fit` filter: CPU, memory, extended resources, GPU count/share/memory/model, node
/// selector, taints.
pub const RESOURCE_FIT: BuiltIn = BuiltIn {
    name: "resource-fit",
    wasm: RESOURCE_FIT_WASM,
    config: "",
    role: Role::Filter,
    source: Source::ResourceFit,
};

/// `least-allocated` score (spread): `allocation-score` with `strategy: least`.
pub const LEAST_ALLOCATED: BuiltIn = BuiltIn {
    name: "least-allocated",
    wasm: ALLOCATION_SCORE_WASM,
    config: r#"{"strategy":"least"}"#,
    role: Role::Score,
    source: Source::AllocationScore,
};

/// `most-allocated` score (bin-packing): `allocation-score` with `strategy: most`.
pub const MOST_ALLOCATED: BuiltIn = BuiltIn {
    name: "most-allocated",
    wasm: ALLOCATION_SCORE_WASM,
    config: r#"{"strategy":"most"}"#,
    role: Role::Score,
    source: Source::AllocationScore,
};

/// `node-affinity` score: the task's preferred node-affinity terms, scaled so the best node
/// scores 100 (kube-scheduler's NodeAffinity score).
pub const NODE_AFFINITY: BuiltIn = BuiltIn {
    name: "node-affinity",
    wasm: NODE_AFFINITY_WASM,
    config: "",
    role: Role::Score,
    source: Source::NodeAffinity,
};

/// `proportion` fair share: hierarchical weighted water-filling, queues served by use of their
/// deserved share.
pub const PROPORTION: BuiltIn = BuiltIn {
    name: "proportion",
    wasm: FAIR_SHARE_WASM,
    config: r#"{"policy":"proportion"}"#,
    role: Role::FairShare,
    source: Source::FairShare,
};

/// `drf` fair share: hierarchical Dominant Resource Fairness order.
pub const DRF: BuiltIn = BuiltIn {
    name: "drf",
    wasm: FAIR_SHARE_WASM,
    config: r#"{"policy":"drf"}"#,
    role: Role::FairShare,
    source: Source::FairShare,
};

/// `decayed-usage` fair share: order by past usage (decayed by the host) per weight.
pub const DECAYED_USAGE: BuiltIn = BuiltIn {
    name: "decayed-usage",
    wasm: FAIR_SHARE_WASM,
    config: r#"{"policy":"decayed-usage"}"#,
    role: Role::FairShare,
    source: Source::FairShare,
};

/// `priority-preempt`: fewest victims, lowest priority, least GPU-time lost; minimum-runtime
/// protection and a minimum priority difference (`min_priority_diff`, `min_runtime_seconds`,
/// `max_victims`).
pub const PRIORITY_PREEMPT: BuiltIn = BuiltIn {
    name: "priority-preempt",
    wasm: PRIORITY_PREEMPT_WASM,
    config: "",
    role: Role::Preempt,
    source: Source::PriorityPreempt,
};

/// The FGD paper's `random` score: one feasible node drawn uniformly; add `"seed"` to the config.
pub const RANDOM: BuiltIn = BuiltIn {
    name: "random",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"random"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// The FGD paper's `dot-prod` score: smallest (CPU, GPU) dot product of free and requested.
pub const DOT_PROD: BuiltIn = BuiltIn {
    name: "dot-prod",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"dot-prod"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// The FGD paper's `gpu-clustering` score: co-locate pods of the same GPU shape.
pub const GPU_CLUSTERING: BuiltIn = BuiltIn {
    name: "gpu-clustering",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"gpu-clustering"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// The FGD paper's `gpu-packing` score: partly used GPUs, then used nodes, then idle nodes.
pub const GPU_PACKING: BuiltIn = BuiltIn {
    name: "gpu-packing",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"gpu-packing"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// The FGD paper's `best-fit` score: least CPU and GPU left after placement.
pub const BEST_FIT: BuiltIn = BuiltIn {
    name: "best-fit",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"best-fit"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// Fragmentation Gradient Descent. Its configuration must add the target workload
/// (`"typical": [...]`), which depends on the trace: the simulator derives it.
pub const FGD: BuiltIn = BuiltIn {
    name: "fgd",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"fgd"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// `fgd-cpu`: FGD whose fragmentation counts only the GPUs the node's CPU can still feed
/// (`usable: cpu-bounded`); more GPUs allocated than FGD on 13 of the 17 openb workloads
/// (`docs/openb/fgd-cpu.md`). Like `fgd`, its configuration must add the target workload.
pub const FGD_CPU: BuiltIn = BuiltIn {
    name: "fgd-cpu",
    wasm: GPU_SHARE_SCORE_WASM,
    config: r#"{"policy":"fgd","usable":"cpu-bounded"}"#,
    role: Role::Score,
    source: Source::GpuShareScore,
};

/// `gpu-topology`: NUMA-policy filter, interconnect score and device selection of the best GPU set,
/// from the host's topology answers (`docs/topology.md`).
pub const GPU_TOPOLOGY: BuiltIn = BuiltIn {
    name: "gpu-topology",
    wasm: GPU_TOPOLOGY_WASM,
    config: r#"{"numa_policy":"best-effort"}"#,
    role: Role::Score,
    source: Source::GpuTopology,
};

/// `domain-packing` score: small and CPU-only work into topology domains (NVLink cliques, racks)
/// already broken, so whole ones stay free for gangs; reads the host's levels (`domains` import).
pub const DOMAIN_PACKING: BuiltIn = BuiltIn {
    name: "domain-packing",
    wasm: DOMAIN_PACKING_WASM,
    config: "",
    role: Role::Score,
    source: Source::DomainPacking,
};

/// The six policies of the FGD paper, in the paper's order.
pub const PAPER: [BuiltIn; 6] = [RANDOM, DOT_PROD, GPU_CLUSTERING, GPU_PACKING, BEST_FIT, FGD];

/// Every built-in, by name.
pub const ALL: [BuiltIn; 17] = [
    RESOURCE_FIT,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    NODE_AFFINITY,
    PROPORTION,
    DRF,
    DECAYED_USAGE,
    PRIORITY_PREEMPT,
    RANDOM,
    DOT_PROD,
    GPU_CLUSTERING,
    GPU_PACKING,
    BEST_FIT,
    FGD,
    FGD_CPU,
    GPU_TOPOLOGY,
    DOMAIN_PACKING,
];

/// A built-in by name.
pub fn by_name(name: &str) -> Option<BuiltIn> {
    ALL.into_iter().find(|b| b.name == name)
}

/// The names of the built-ins that serve `role`, in the table's order.
pub fn named(role: Role) -> impl Iterator<Item = &'static str> {
    ALL.into_iter().filter(move |b| b.role == role).map(|b| b.name)
}

/// Every built-in as `(name, component, default configuration)`: what a policy registry's table is
/// made of (`wasmsched_registry::BuiltIns` collects it), without this crate knowing the registry.
pub fn table() -> impl Iterator<Item = (&'static str, &'static [u8], &'static str)> {
    ALL.into_iter().map(|b| (b.name, b.wasm, b.config))
}
