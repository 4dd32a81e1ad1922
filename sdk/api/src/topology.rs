//! GPU topology as plugins see it: read-only answers from the host (`topology` in the WIT).
//!
//! Plugins call the SDK's `wasmsched_sdk::topology` functions; this module holds the shared
//! types and, natively, the hook through which the host answers on the calling thread.

/// NUMA alignment, with the Kubernetes Topology Manager's meaning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NumaPolicy {
    /// NUMA is not considered.
    None,
    /// Prefer the narrowest NUMA span, admit anyway.
    #[default]
    BestEffort,
    /// Only the narrowest span the node could give this many GPUs.
    Restricted,
    /// Only sets within one NUMA node.
    SingleNumaNode,
}

impl NumaPolicy {
    /// Parses the kubelet spelling (`single-numa-node`; the alias `single-numa` too).
    pub fn parse(text: &str) -> Option<NumaPolicy> {
        Some(match text.trim() {
            "none" => NumaPolicy::None,
            "best-effort" => NumaPolicy::BestEffort,
            "restricted" => NumaPolicy::Restricted,
            "single-numa-node" | "single-numa" => NumaPolicy::SingleNumaNode,
            _ => return None,
        })
    }

    /// The kubelet spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NumaPolicy::None => "none",
            NumaPolicy::BestEffort => "best-effort",
            NumaPolicy::Restricted => "restricted",
            NumaPolicy::SingleNumaNode => "single-numa-node",
        }
    }
}

/// A chosen GPU set and the values it was chosen by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSet {
    /// GPU indexes, ascending.
    pub gpus: Vec<u32>,
    /// Slowest link inside the set in MB/s; None for a single GPU.
    pub bottleneck_mbps: Option<u32>,
    /// Sum over pairs of latency normalised to one NVLink hop, in thousandths.
    pub distance_milli: u64,
    /// NUMA nodes the set touches.
    pub numa_span: u32,
    /// The host's node-level topology score, `0..=100`.
    pub score: u32,
}

/// The link between two GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuLink {
    /// `NV12`, `PIX`, `PXB`, `PHB`, `NODE` or `SYS`.
    pub class: String,
    /// NVLink through an NVSwitch.
    pub nvswitch: bool,
    /// Bandwidth in MB/s.
    pub bandwidth_mbps: u32,
    /// Latency normalised to one NVLink hop, in thousandths.
    pub distance_milli: u32,
}

/// What the host answers. Implemented by the scheduler core; the Wasm runtime forwards the
/// component's `topology` imports to it.
pub trait TopologyView: Send + Sync {
    /// The best `count` GPUs among `free` (bit i = GPU i) on `node`; None when the node's topology
    /// is unknown, an error when no set satisfies `policy`.
    fn best_gpus(&self, node: &str, count: u32, policy: NumaPolicy, free: u64) -> Option<Result<GpuSet, String>>;
    /// The link between GPUs `a` and `b` of `node`.
    fn link(&self, node: &str, a: u32, b: u32) -> Option<GpuLink>;
}

call_view!(TopologyView);
