//! GPU topology from the host: the exact best GPU set on a node, and the link between two GPUs.
//!
//! The host knows each node's topology (from the node agent, or the simulator's configuration) and
//! answers natively; in a component these are calls across the boundary, natively they go to the
//! view the host installed for the call. Both return None for a node whose topology is unknown,
//! so a plugin must have an answer for that case (usually: behave as if topology did not matter).
//!
//! ```
//! use wasmsched_sdk::prelude::*;
//! use wasmsched_sdk::topology::{self, NumaPolicy};
//!
//! fn nvlink_only(task: &Task, node: &Node) -> bool {
//!     match topology::best_gpus(node, &task.gpu, NumaPolicy::BestEffort) {
//!         Some(Ok(set)) => set.bottleneck_mbps.is_none_or(|bw| bw >= 50_000),
//!         Some(Err(_)) => false,
//!         None => true, // unknown topology: do not filter on it
//!     }
//! }
//! let node = Node { name: "n".into(), ..Node::default() };
//! assert!(nvlink_only(&Task::default(), &node));
//! ```

pub use wasmsched_api::topology::{GpuLink, GpuSet, NumaPolicy};
use wasmsched_api::{GpuRequest, Node};

/// The node's GPUs (index below 64) that can take one device of `request`: healthy, with enough free
/// share, memory and an allowed model.
pub fn free_mask(node: &Node, request: &GpuRequest) -> u64 {
    node.gpus.iter().filter(|g| g.index < 64 && request.fits_device(g)).fold(0u64, |mask, g| mask | 1 << g.index)
}

/// The best `request.count` GPUs of `node` that can take `request`, as the host's exact selection
/// chooses them under `policy`. None: the host knows no topology for this node.
pub fn best_gpus(node: &Node, request: &GpuRequest, policy: NumaPolicy) -> Option<Result<GpuSet, String>> {
    let free = free_mask(node, request);
    #[cfg(target_family = "wasm")]
    {
        crate::__private::best_gpus(&node.name, request.count, policy, free)
    }
    #[cfg(not(target_family = "wasm"))]
    {
        wasmsched_api::topology::current()?.best_gpus(&node.name, request.count, policy, free)
    }
}

/// The link between GPUs `a` and `b` of `node`; None when unknown.
pub fn link(node: &Node, a: u32, b: u32) -> Option<GpuLink> {
    #[cfg(target_family = "wasm")]
    {
        crate::__private::link(&node.name, a, b)
    }
    #[cfg(not(target_family = "wasm"))]
    {
        wasmsched_api::topology::current()?.link(&node.name, a, b)
    }
}
