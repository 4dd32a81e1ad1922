//! Collective-communication time estimates (the α–β model), one unit throughout: GB/s and MB.
//!
//! Used for placement quality reports and the "communication bottleneck" alert, never to choose:
//! choosing uses the exact keys of [`crate::select`].

use serde::{Deserialize, Serialize};

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Ring all-reduce: reduce-scatter then all-gather.
    AllReduce,
    /// Ring all-gather.
    AllGather,
    /// Ring reduce-scatter (each rank sends `(n−1)/n` of the buffer, not all of it).
    ReduceScatter,
}

impl Collective {
    /// MB each rank sends for a `data_mb` buffer over `n` ranks.
    pub fn volume_mb(self, n: u32, data_mb: f64) -> f64 {
        if n < 2 {
            return 0.0;
        }
        let share = f64::from(n - 1) / f64::from(n);
        match self {
            Collective::AllReduce => 2.0 * share * data_mb,
            Collective::AllGather | Collective::ReduceScatter => share * data_mb,
        }
    }

    /// Ring steps (each paying one latency).
    pub fn steps(self, n: u32) -> u32 {
        match self {
            Collective::AllReduce => 2 * n.saturating_sub(1),
            Collective::AllGather | Collective::ReduceScatter => n.saturating_sub(1),
        }
    }
}

/// Time in milliseconds of a ring collective over `n` ranks whose slowest ring link has
/// `bottleneck_gbps`, plus `latency_us` per step (0 for the bandwidth term alone).
pub fn ring_ms(collective: Collective, n: u32, data_mb: f64, bottleneck_gbps: f64, latency_us: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    if bottleneck_gbps <= 0.0 {
        return f64::INFINITY;
    }
    let bandwidth = collective.volume_mb(n, data_mb) / 1024.0 / bottleneck_gbps * 1000.0;
    bandwidth + f64::from(collective.steps(n)) * latency_us / 1000.0
}

/// Tree all-reduce over `n` nodes: `2·⌈log2 n⌉` transfers of the whole buffer at `bandwidth_gbps`.
pub fn tree_allreduce_ms(n: u32, data_mb: f64, bandwidth_gbps: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let depth = f64::from(n).log2().ceil();
    2.0 * depth * data_mb / 1024.0 / bandwidth_gbps * 1000.0
}
