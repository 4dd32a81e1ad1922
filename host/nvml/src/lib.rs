//! NVML, natively: device discovery (inventory, NVLink, PCIe paths, NUMA, MIG), telemetry and
//! health (XID events), through nvml-wrapper.
//!
//! Nothing here needs a GPU to build or to run: without a driver, [`Session::open`] returns
//! [`Error::Unavailable`] with the reason, and callers (the node agent) fall back to
//! `nvidia-smi topo -m` text or report the node as GPU-less. The conversion from NVML data to a
//! [`wasmsched_topology::NodeTopology`] ([`Inventory::topology`]) is pure and tested on recorded
//! data.

mod discover;
pub mod health;
mod inventory;
mod mig;

pub use discover::{Session, normalise_bus_id};
pub use health::{Health, XidEvent, XidWatcher, classify_xid};
pub use inventory::{Device, Inventory, Mig, MigInstance, NvLinkPort, PathLevel, Telemetry};

/// Errors of NVML discovery.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable NVML on this host (no driver, no library, no permission).
    #[error("NVML is not available: {0}")]
    Unavailable(String),
    /// An NVML call failed.
    #[error("NVML {what}: {reason}")]
    Call {
        /// What was asked.
        what: String,
        /// NVML's answer.
        reason: String,
    },
    /// Recorded inventory data that is inconsistent.
    #[error("inventory: {0}")]
    Inventory(String),
}
