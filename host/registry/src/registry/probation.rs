//! The watch over a version after it goes live: windows of decisions, the baseline of the
//! version before, and the thresholds that roll a version back.

use super::*;

/// Statistics of one window of decisions.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WindowStats {
    /// Decisions.
    pub decisions: u64,
    /// Share with a plugin fault.
    pub fault_rate: f64,
    /// Share unschedulable.
    pub unschedulable_rate: f64,
    /// 99th-percentile decision latency, milliseconds.
    pub p99_ms: f64,
}

#[derive(Default)]
pub(super) struct Window {
    pub(super) latencies_us: Vec<u32>,
    pub(super) faults: u64,
    pub(super) unschedulable: u64,
}

impl Window {
    pub(super) fn push(&mut self, d: &Decision<'_>) {
        self.latencies_us.push(d.latency.as_micros().min(u32::MAX as u128) as u32);
        self.faults += u64::from(d.faulted());
        self.unschedulable += u64::from(d.result.is_err());
    }

    pub(super) fn len(&self) -> u64 {
        self.latencies_us.len() as u64
    }

    pub(super) fn close(&mut self) -> WindowStats {
        let n = self.latencies_us.len();
        let stats = if n == 0 {
            WindowStats::default()
        } else {
            let rank = ((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1;
            let (_, p99, _) = self.latencies_us.select_nth_unstable(rank);
            WindowStats {
                decisions: n as u64,
                fault_rate: self.faults as f64 / n as f64,
                unschedulable_rate: self.unschedulable as f64 / n as f64,
                p99_ms: f64::from(*p99) / 1e3,
            }
        };
        *self = Window::default();
        stats
    }
}

/// Watch over a version after it went live.
pub(super) struct Probation {
    pub(super) version: u64,
    pub(super) spec: RollbackSpec,
    pub(super) seen: u64,
    pub(super) window: Window,
}

/// Rolling statistics of the live version once it is past probation (the baseline the next
/// version is compared with).
#[derive(Default)]
pub(super) struct Baseline {
    pub(super) version: u64,
    pub(super) window: Window,
    pub(super) last: Option<WindowStats>,
    /// The decision count when `last` closed: a baseline older than a probation (and a window)
    /// is not compared with ([`Baseline::fresh_for`]).
    pub(super) last_at: u64,
}

impl Baseline {
    /// `last`, if it closed within `spec.probation + spec.window` decisions before decision `n`:
    /// long enough for one version's whole probation after a swap. Older (a run of versions each
    /// replaced while on probation), the cluster and workload it saw may differ too much from
    /// today's for the relative checks (p99 ratio, unschedulable rise) to mean anything; only
    /// the absolute ones apply. (The bench that swaps every 10 ms rolled back for an
    /// "unschedulable rise" against the empty cluster of its first window.)
    pub(super) fn fresh_for(&self, spec: &RollbackSpec, n: u64) -> Option<&WindowStats> {
        self.last.as_ref().filter(|_| n.saturating_sub(self.last_at) <= spec.probation.saturating_add(spec.window))
    }

    pub(super) fn close(&mut self, n: u64) {
        self.last = Some(self.window.close());
        self.last_at = n;
    }
}

/// The first threshold `stats` crosses, as a reason.
pub(super) fn trip(spec: &RollbackSpec, stats: &WindowStats, baseline: Option<&WindowStats>) -> Option<String> {
    if stats.fault_rate > spec.max_fault_rate {
        return Some(format!(
            "fault rate {:.2}% > {:.2}% over {} decisions",
            stats.fault_rate * 100.0,
            spec.max_fault_rate * 100.0,
            stats.decisions
        ));
    }
    if let Some(max) = spec.max_p99_ms
        && stats.p99_ms > max
    {
        return Some(format!("p99 latency {:.3} ms > {max} ms over {} decisions", stats.p99_ms, stats.decisions));
    }
    if let Some(base) = baseline {
        if let Some(ratio) = spec.max_p99_ratio
            && base.p99_ms > 0.0
            && stats.p99_ms > base.p99_ms * ratio
        {
            return Some(format!(
                "p99 latency {:.3} ms > {ratio}× the previous set's {:.3} ms",
                stats.p99_ms, base.p99_ms
            ));
        }
        if let Some(rise) = spec.max_unschedulable_increase
            && stats.unschedulable_rate > base.unschedulable_rate + rise
        {
            return Some(format!(
                "unschedulable {:.1}% > previous set's {:.1}% + {:.1} points",
                stats.unschedulable_rate * 100.0,
                base.unschedulable_rate * 100.0,
                rise * 100.0
            ));
        }
    }
    None
}

impl Registry {
    /// Probation and baseline bookkeeping; rolls back when a window trips.
    pub(super) fn watch(&self, inner: &mut Inner, used: &Arc<PolicyVersion>, d: &Decision<'_>, n: u64) {
        if let Some(p) = &mut inner.probation
            && p.version == used.version
        {
            p.window.push(d);
            p.seen += 1;
            if p.window.len() < p.spec.window {
                return;
            }
            let stats = p.window.close();
            let spec = p.spec.clone();
            let finished = p.seen >= spec.probation;
            let baseline = inner.baseline.fresh_for(&spec, n);
            if baseline.is_none() && inner.baseline.last.is_some() {
                tracing::debug!(set = %used.label(), "baseline older than a probation: relative checks skipped");
            }
            if let Some(reason) = trip(&spec, &stats, baseline) {
                self.roll_back(inner, &reason);
            } else if finished {
                inner.probation = None;
                inner.last_good = used.clone();
                inner.baseline =
                    Baseline { version: used.version, window: Window::default(), last: Some(stats), last_at: n };
                update_history(inner, used, Outcome::Live, "passed probation");
                tracing::info!(set = %used.label(), "policy set passed probation");
            }
            return;
        }
        let b = &mut inner.baseline;
        if b.version == used.version {
            b.window.push(d);
            if b.window.len() >= used.spec.rollback.window {
                b.close(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_nearest_rank() {
        let mut w = Window { latencies_us: (1..=1000).collect(), faults: 10, ..Window::default() };
        let s = w.close();
        assert_eq!(s.p99_ms, 0.990);
        assert_eq!(s.fault_rate, 0.01);
        assert_eq!(w.len(), 0, "closing starts a new window");
    }

    #[test]
    fn thresholds_name_what_tripped() {
        let spec = RollbackSpec { max_p99_ms: Some(2.0), ..RollbackSpec::default() };
        let ok = WindowStats { decisions: 500, fault_rate: 0.0, unschedulable_rate: 0.1, p99_ms: 1.0 };
        assert_eq!(trip(&spec, &ok, Some(&ok)), None);
        let faults = WindowStats { fault_rate: 0.02, ..ok.clone() };
        assert!(trip(&spec, &faults, None).unwrap().starts_with("fault rate 2.00% > 1.00%"));
        let slow = WindowStats { p99_ms: 2.5, ..ok.clone() };
        assert!(trip(&spec, &slow, None).unwrap().starts_with("p99 latency 2.500 ms > 2 ms"));
        let base = WindowStats { p99_ms: 0.1, ..ok.clone() };
        assert!(trip(&spec, &ok, Some(&base)).unwrap().contains("5× the previous"));
        let unsched = WindowStats { unschedulable_rate: 0.5, ..ok.clone() };
        assert!(trip(&spec, &unsched, Some(&ok)).unwrap().starts_with("unschedulable 50.0%"));
        assert_eq!(trip(&spec, &unsched, None), None, "no baseline, no relative checks");
    }
}
