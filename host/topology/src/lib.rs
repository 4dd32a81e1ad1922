//! GPU topology, natively: what is inside a node (NVLink, NVSwitch, PCIe, NUMA) and how nodes sit
//! in racks and switches, and the choices that depend on it.
//!
//! - [`NodeTopology`]: a node's GPUs and the [`Link`] between every pair, built from
//!   `nvidia-smi topo -m` ([`smi::parse`]), from NVML (the `wasmsched-nvml` crate), or from the node
//!   annotation the agent writes ([`annotation`]).
//! - [`Prepared::select`]: the exact best set of `k` free GPUs under a [`NumaPolicy`], with the
//!   documented key of [`select`]; [`Prepared::score`] ranks nodes by it.
//! - [`comm`]: collective-communication time estimates; [`pinning`]: CPUs and `numactl` for the
//!   chosen GPUs; [`cluster`]: locality domains for multi-node gangs.
//!
//! Link costs are configurable ([`LinkCosts`]); defaults and their sources are in `docs/topology.md`.

pub mod alerts;
pub mod amd_smi;
pub mod annotation;
pub mod cluster;
pub mod comm;
mod cpuset;
mod link;
pub mod neuron_ls;
mod node;
pub mod pinning;
pub mod score;
pub mod select;
pub mod smi;

pub use cpuset::CpuSet;
pub use link::{Cost, Link, LinkCosts};
pub use node::{Gpu, MAX_GPUS, Nic, NodeTopology, PeerLinks};
pub use select::{Choice, NumaPolicy, Prepared, SEARCH_BUDGET, Unsatisfiable};

/// Errors building a topology.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Text that does not parse, with the 1-based line.
    #[error("line {line}: {message}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A topology that parses but is inconsistent.
    #[error("{0}")]
    Invalid(String),
}
