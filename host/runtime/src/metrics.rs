//! Per-plugin, per-stage counters and latency histograms. Lock-free on the call path.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use wasmsched_api::Stage;
use wasmsched_core::{FaultKind, PluginFault};

/// Receives every plugin fault (the events crate publishes them).
pub type FaultObserver = std::sync::Arc<dyn Fn(&PluginFault) + Send + Sync>;

const BUCKETS: usize = 40;
/// Every kind of fault, in the order the counters keep them.
pub const FAULT_KINDS: [FaultKind; 9] = [
    FaultKind::Trap,
    FaultKind::Deadline,
    FaultKind::Fuel,
    FaultKind::Memory,
    FaultKind::BadOutput,
    FaultKind::GuestError,
    FaultKind::NotImplemented,
    FaultKind::CircuitOpen,
    FaultKind::Instantiate,
];
const RECENT_FAULTS: usize = 32;

/// Latency histogram with power-of-two nanosecond buckets: bucket `i` counts calls that took
/// `[2^i, 2^(i+1))` ns.
#[derive(Debug)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        let i = (63 - ns.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> LatencySnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let count = self.count.load(Relaxed);
        let quantile = |q: f64| {
            let target = (q * count as f64).ceil() as u64;
            let mut seen = 0;
            for (i, b) in buckets.iter().enumerate() {
                seen += b;
                if seen >= target.max(1) {
                    return Duration::from_nanos(1u64 << (i + 1).min(63));
                }
            }
            Duration::ZERO
        };
        LatencySnapshot {
            count,
            sum: Duration::from_nanos(self.sum_ns.load(Relaxed)),
            mean: Duration::from_nanos(self.sum_ns.load(Relaxed).checked_div(count).unwrap_or(0)),
            p50: if count == 0 { Duration::ZERO } else { quantile(0.5) },
            p99: if count == 0 { Duration::ZERO } else { quantile(0.99) },
            buckets,
        }
    }
}

/// Latency summary. Quantiles are bucket upper bounds (within a factor of two).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Calls recorded.
    pub count: u64,
    /// Total latency.
    pub sum: Duration,
    /// Mean latency.
    pub mean: Duration,
    /// Median (upper bound of its bucket).
    pub p50: Duration,
    /// 99th percentile (upper bound of its bucket).
    pub p99: Duration,
    /// Raw power-of-two buckets, for exporters: `buckets[i]` counts calls that took
    /// `[2^i, 2^(i+1))` ns (the last one: at least `2^i` ns).
    pub buckets: Vec<u64>,
}

#[derive(Debug, Default)]
struct StageMetrics {
    calls: AtomicU64,
    faults: [AtomicU64; FAULT_KINDS.len()],
    latency: Histogram,
}

/// One stage's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageSnapshot {
    /// The stage.
    pub stage: Stage,
    /// Calls made (including failed ones).
    pub calls: u64,
    /// Faults by kind (only kinds seen).
    pub faults: Vec<(FaultKind, u64)>,
    /// Latency of calls that reached the plugin.
    pub latency: LatencySnapshot,
}

/// Metrics of one plugin.
#[derive(Debug, Default)]
pub struct PluginMetrics {
    stages: [StageMetrics; 5],
    instances_created: AtomicU64,
    instances_discarded: AtomicU64,
    recent: Mutex<VecDeque<PluginFault>>,
}

fn stage_index(stage: Stage) -> usize {
    Stage::ALL.iter().position(|&s| s == stage).unwrap_or(0)
}

impl PluginMetrics {
    pub(crate) fn call(&self, stage: Stage, latency: Option<Duration>) {
        let m = &self.stages[stage_index(stage)];
        m.calls.fetch_add(1, Relaxed);
        if let Some(d) = latency {
            m.latency.record(d);
        }
    }

    pub(crate) fn fault(&self, fault: &PluginFault) {
        let m = &self.stages[stage_index(fault.stage)];
        if let Some(k) = FAULT_KINDS.iter().position(|&k| k == fault.kind) {
            m.faults[k].fetch_add(1, Relaxed);
        }
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == RECENT_FAULTS {
            recent.pop_front();
        }
        recent.push_back(fault.clone());
    }

    pub(crate) fn instance_created(&self) {
        self.instances_created.fetch_add(1, Relaxed);
    }

    pub(crate) fn instance_discarded(&self) {
        self.instances_discarded.fetch_add(1, Relaxed);
    }

    /// Instances created so far (the first per worker, then one per replacement).
    pub fn instances_created(&self) -> u64 {
        self.instances_created.load(Relaxed)
    }

    /// Instances thrown away after a fault.
    pub fn instances_discarded(&self) -> u64 {
        self.instances_discarded.load(Relaxed)
    }

    /// Counters of one stage.
    pub fn stage(&self, stage: Stage) -> StageSnapshot {
        let m = &self.stages[stage_index(stage)];
        StageSnapshot {
            stage,
            calls: m.calls.load(Relaxed),
            faults: FAULT_KINDS
                .iter()
                .zip(&m.faults)
                .map(|(k, n)| (*k, n.load(Relaxed)))
                .filter(|(_, n)| *n > 0)
                .collect(),
            latency: m.latency.snapshot(),
        }
    }

    /// Total faults of `kind` over all stages.
    pub fn faults(&self, kind: FaultKind) -> u64 {
        let k = FAULT_KINDS.iter().position(|&x| x == kind).unwrap_or(0);
        self.stages.iter().map(|s| s.faults[k].load(Relaxed)).sum()
    }

    /// The most recent faults, oldest first.
    pub fn recent_faults(&self) -> Vec<PluginFault> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_bound_the_samples() {
        let h = Histogram::default();
        for _ in 0..99 {
            h.record(Duration::from_nanos(1000));
        }
        h.record(Duration::from_millis(5));
        let s = h.snapshot();
        assert_eq!(s.count, 100);
        assert!(s.p50 >= Duration::from_nanos(1000) && s.p50 <= Duration::from_nanos(2048));
        assert!(s.p99 <= Duration::from_nanos(2048));
        assert!(s.mean > Duration::from_nanos(1000));
    }
}
