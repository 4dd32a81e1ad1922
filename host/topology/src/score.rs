//! The node-level topology score: how good the best `k` free GPUs of a node are, for ranking nodes.

use crate::{Choice, NumaPolicy, Prepared};

/// Bandwidth that scores 0: below every link class of a node (10 GB/s).
pub const SCORE_FLOOR_MBPS: u32 = 10_000;

impl Prepared {
    /// Scores a node for a `k`-GPU task in `0..=100`, None when the node cannot take it.
    ///
    /// The score is the best set's bottleneck bandwidth on a log scale from [`SCORE_FLOOR_MBPS`]
    /// (0) to `reference_mbps` (100, the best fabric the operator expects, e.g. NV18's 900 GB/s):
    /// bandwidths span two orders of magnitude, and a linear share would squash every PCIe class
    /// into the same few points. So an NVSwitch node outranks an NVLink-pair node, which outranks a
    /// PCIe switch, a host bridge and a cross-socket path, in that order. A set spanning more NUMA
    /// nodes than needed loses a tenth per extra node (except under [`NumaPolicy::None`]). A single
    /// GPU has no links: every node that can take it scores 100 and other plugins decide.
    pub fn score(&self, free: u64, k: u32, policy: NumaPolicy, reference_mbps: u32) -> Option<u32> {
        let choice = self.select(free, k, policy).ok()?;
        Some(self.score_of(&choice, policy, reference_mbps))
    }

    /// The score of a set already chosen (see [`Prepared::score`]).
    pub fn score_of(&self, choice: &Choice, policy: NumaPolicy, reference_mbps: u32) -> u32 {
        let Some(bottleneck) = choice.bottleneck_mbps else {
            return 100;
        };
        let floor = f64::from(SCORE_FLOOR_MBPS);
        let reference = f64::from(reference_mbps).max(floor * 2.0);
        let ratio = (f64::from(bottleneck).max(floor) / floor).ln() / (reference / floor).ln();
        let share = (ratio * 100.0).round().clamp(0.0, 100.0) as u64;
        let extra_span = if policy == NumaPolicy::None {
            0
        } else {
            u64::from(choice.numa_span.saturating_sub(self.min_span(choice.gpus.len() as u32)))
        };
        (share * 10u64.saturating_sub(extra_span).max(1) / 10) as u32
    }
}
