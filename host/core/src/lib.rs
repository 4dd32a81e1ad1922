//! The wasmsched scheduling core: cluster state, the stage pipeline and placement.
//!
//! The same core runs against Kubernetes and the in-process simulator, so it does no I/O and knows
//! nothing of WebAssembly: a policy is anything that implements [`PolicyPlugin`], whether a
//! component run by `wasmsched-runtime` or a native Rust type wrapped in [`NativePlugin`].
//!
//! # Core concepts
//! - [`NodeTable`]: nodes by slot, with a generation number and a change log so plugin instances
//!   can keep a mirror current with small deltas.
//! - [`PolicyPlugin`]: the host-side face of a plugin; every call is batched (one call per task
//!   and batch of candidate nodes).
//! - [`PluginFault`]: a plugin failed (trap, deadline, memory, bad output) — attributed to the
//!   plugin and stage, and kept apart from verdicts (a node that does not fit is not a fault).
//! - [`PolicySet`] and [`place`]: run filter → score → device selection for one task.
//! - [`place_sampled`] and [`feasible_nodes_to_find`]: kube-scheduler's adaptive
//!   `percentageOfNodesToScore`, with a rotating, deterministic start.
//! - [`place_group`]: a gang, all-or-nothing (at least min-member), optionally inside one topology
//!   domain, rolled back on failure.
//! - [`QueueTree`]: validated queue hierarchy (weights, guarantees, capabilities), with quotas
//!   per resource [`Flavor`] (kinds of node, e.g. by GPU model).
//! - [`SchedulerCore`]: the whole cycle — fair-share queue order, quotas, gangs, preemption with
//!   checkpoints, elastic growth, back-off, and an [`Explanation`] for every pending workload.
//! - [`Topologies`]: GPU topologies by node, which plugins query through the `topology` import
//!   (natively through the same view, installed around every call).
//! - [`Domains`]: free capacity per topology domain (NVLink clique, rack, block) at every level,
//!   kept by the [`NodeTable`] and asked through the `domains` import.
//!
//! # Where each stage lives
//! | stage | file |
//! |---|---|
//! | cluster state | `node_table.rs`, `node_accounting.rs` (bind/release), `topology.rs`, `cycle/live.rs` |
//! | what users submit | `cycle/workload.rs`, `queue.rs`, `flavor.rs` |
//! | admission and quotas | `cycle/quota.rs`, `cycle/flavors.rs` |
//! | fair share (host side) | `cycle/fair_share.rs` |
//! | the policy set | `policy_set.rs` |
//! | filter | `placement/filter.rs`, `placement/verdict_cache.rs`, `cycle/pod_affinity.rs` |
//! | score | `placement/score.rs` |
//! | device selection | `placement/devices.rs` (GPU topology answers: `topology.rs`) |
//! | one task / one gang | `placement/mod.rs`, `gang.rs` |
//! | one workload's attempt | `cycle/attempt.rs`, `cycle/failures.rs` |
//! | preemption | `cycle/preempt.rs`, `cycle/nomination.rs`, `cycle/eviction.rs` |
//! | back-off and timers | `cycle/timers.rs` |
//! | accounting | `cycle/accounting.rs` |
//! | why work waits | `cycle/explain.rs` |
//! | carrying decisions out (drivers) | `effects.rs` |
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources, Task};
//! use wasmsched_core::{NativePlugin, NodeTable, PolicySet, place};
//! use wasmsched_plugin_allocation_score::AllocationScore;
//! use wasmsched_plugin_resource_fit::ResourceFit;
//!
//! let mut nodes = NodeTable::new();
//! for (name, gpus) in [("small", 1), ("big", 4)] {
//!     nodes.upsert(Node {
//!         name: name.into(),
//!         allocatable: Resources { cpu_milli: 32_000, memory_bytes: 1 << 40, gpu_milli: gpus * 1000, extended: Default::default() },
//!         gpus: (0..gpus as u32).map(|i| GpuDevice { index: i, free_milli: 1000, ..Default::default() }).collect(),
//!         ..Default::default()
//!     });
//! }
//! let set = PolicySet::builder()
//!     .filter(Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()))
//!     .score(Arc::new(NativePlugin::<AllocationScore>::new(r#"{"strategy":"most"}"#, 1).unwrap()), 1)
//!     .build();
//! let task = Task { gpu: GpuRequest { count: 2, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
//! let placement = place(&set, &nodes, &task, 0).unwrap();
//! assert_eq!(nodes.get(placement.node).unwrap().name, "big");
//! ```

mod accelerators;
mod cycle;
mod domains;
mod effects;
mod flavor;
mod gang;
mod native;
mod node_accounting;
mod node_table;
mod placement;
mod plugin;
mod policy_set;
mod queue;
#[cfg(test)]
mod testing;
mod topology;

pub use accelerators::{Accelerators, KindRejection, kind_rejection};
pub use cycle::{
    CoreConfig, CoreError, Decision, EvictReason, Explanation, Phase, PreemptKind, PreemptionPolicy, QueueMove,
    QueueShare, RunningPod, SchedulerCore, ShareMove, Workload, WorkloadError, WorkloadStatus,
};
pub use domains::Domains;
pub use effects::{Effects, carry_out};
pub use flavor::{Flavor, add_flavored, flavored_amount, flavored_resource};
pub use gang::{Adjust, GangError, GangPlacement, GroupSpec, Slices, TopologyConstraint, place_group};
pub use native::NativePlugin;
pub use node_accounting::{AllocError, bind, bind_fact, release};
pub use node_table::{Changes, NodeTable, Slot};
pub use placement::{
    Diagnosis, NodeVerdict, Placement, Sampled, Unschedulable, default_select_devices, feasible_nodes_to_find,
    filter_each, place, place_among, place_sampled, place_sampled_among, score_each, select_devices_on,
};
pub use plugin::{CallContext, FailurePolicy, FaultKind, PluginFault, PolicyPlugin, validate};
pub use policy_set::{PolicySet, PolicySetBuilder};
pub use queue::{Admission, QueueError, QueueSpec, QueueTree};
pub use topology::{DEFAULT_REFERENCE_MBPS, Topologies, apply_node_facts};

/// Compile-time check that the types shared across worker threads stay thread-safe.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<NodeTable>();
    check::<PolicySet>();
}
