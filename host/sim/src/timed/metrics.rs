//! What a time-driven replay reports: per-queue delay, completion time and service, utilisation
//! over time, fairness across queues, and why work still waits.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use wasmsched_core::Explanation;

use super::{Job, JobOutcome, TimedRun};

/// Per-queue summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueStats {
    /// Jobs that arrived.
    pub jobs: usize,
    /// Jobs that started.
    pub started: usize,
    /// Jobs never started by the end.
    pub waiting: usize,
    /// Mean queueing delay (first start − arrival) of started jobs (s).
    pub delay_mean: f64,
    /// Median queueing delay (s).
    pub delay_p50: u64,
    /// 99th-percentile queueing delay (s).
    pub delay_p99: u64,
    /// Mean completion time (end − arrival) of finished jobs (s).
    pub jct_mean: f64,
    /// Times its jobs were stopped by eviction.
    pub evictions: u32,
    /// GPU-seconds received over GPU-seconds demanded (within the replay; first start to end).
    pub service_ratio: f64,
}

/// Counters gathered along the replay.
pub(super) struct Counts {
    pub attempts: usize,
    pub evictions: usize,
    pub timed_out: usize,
    pub faults: usize,
}

/// The reason to group a waiting job under: the queue's limit if that stopped it, else the
/// rejection most nodes gave, else the gang's shortfall or preemption's answer.
pub(super) fn main_reason(e: &Explanation) -> String {
    if let Some(q) = &e.queue {
        return q.clone();
    }
    if let Some(d) = &e.nodes
        && let Some(((plugin, reason), _)) = d.rejections.iter().max_by_key(|(_, (n, _))| *n)
    {
        return format!("{plugin}: {reason}");
    }
    if let Some((placed, min)) = e.gang {
        return format!("gang: {placed} of {min} required members fit");
    }
    e.to_string()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn mean(v: &[u64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64 }
}

/// The mean of the step function `samples` (value from each instant to the next) over
/// `[from, to]`; the value at `from` when the window is a single instant.
fn time_weighted_mean(samples: &[(u64, f64)], (from, to): (u64, u64)) -> f64 {
    let at = |t: u64| samples.iter().take_while(|s| s.0 <= t).last().map_or(0.0, |s| s.1);
    if to <= from {
        return at(from);
    }
    let mut total = 0.0;
    let mut t = from;
    let mut value = at(from);
    for &(when, v) in samples.iter().filter(|s| s.0 > from && s.0 < to) {
        total += value * (when - t) as f64;
        (t, value) = (when, v);
    }
    total += value * (to - t) as f64;
    total / (to - from) as f64
}

pub(super) fn summarise(
    jobs: &[Job],
    mut out: Vec<JobOutcome>,
    utilisation: Vec<(u64, f64)>,
    counts: Counts,
    horizon: u64,
) -> TimedRun {
    for o in out.iter_mut().filter(|o| o.start.is_none() && o.waiting_reason.is_none()) {
        o.waiting_reason = Some("not attempted yet".into());
    }
    let mut queues = BTreeMap::new();
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    for q in names {
        let ids: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].queue == q).collect();
        let mut delays: Vec<u64> = ids.iter().filter_map(|&i| out[i].start.map(|s| s - out[i].arrival)).collect();
        delays.sort_unstable();
        let jcts: Vec<u64> = ids.iter().filter_map(|&i| out[i].end.map(|e| e - out[i].arrival)).collect();
        let (mut received, mut demanded) = (0f64, 0f64);
        for &i in &ids {
            let g = jobs[i].replica_gpu_milli() as f64 * f64::from(jobs[i].min_replicas.unwrap_or(jobs[i].replicas));
            let want = jobs[i].duration.unwrap_or(u64::MAX).min(horizon.saturating_sub(jobs[i].arrival));
            demanded += g * want as f64;
            if let Some(s) = out[i].start {
                received += g * (out[i].end.unwrap_or(horizon).min(horizon) - s).min(want) as f64;
            }
        }
        queues.insert(
            q.to_string(),
            QueueStats {
                jobs: ids.len(),
                started: delays.len(),
                waiting: ids.iter().filter(|&&i| out[i].start.is_none()).count(),
                delay_mean: mean(&delays),
                delay_p50: percentile(&delays, 50.0),
                delay_p99: percentile(&delays, 99.0),
                jct_mean: mean(&jcts),
                evictions: ids.iter().map(|&i| out[i].evictions).sum(),
                service_ratio: if demanded > 0.0 { received / demanded } else { 1.0 },
            },
        );
    }
    let mut waiting_by_reason = BTreeMap::new();
    for o in out.iter().filter(|o| o.start.is_none()) {
        *waiting_by_reason.entry(o.waiting_reason.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    let whole = (utilisation.first().map_or(0, |f| f.0), utilisation.last().map_or(0, |l| l.0));
    let utilisation_mean = time_weighted_mean(&utilisation, whole);
    let arriving =
        (jobs.iter().map(|j| j.arrival).min().unwrap_or(0), jobs.iter().map(|j| j.arrival).max().unwrap_or(0));
    let utilisation_mean_while_arriving = time_weighted_mean(&utilisation, arriving);
    let x: Vec<f64> = queues.values().map(|q| q.service_ratio).collect();
    let (s, s2) = x.iter().fold((0.0, 0.0), |(s, s2), v| (s + v, s2 + v * v));
    let jain_fairness = if s2 > 0.0 { s * s / (x.len() as f64 * s2) } else { 1.0 };
    TimedRun {
        jobs: out,
        queues,
        waiting_by_reason,
        utilisation,
        utilisation_mean,
        utilisation_mean_while_arriving,
        jain_fairness,
        attempts: counts.attempts,
        evictions: counts.evictions,
        timed_out: counts.timed_out,
        faults: counts.faults,
        horizon,
    }
}

#[cfg(test)]
mod tests {
    use super::time_weighted_mean;

    #[test]
    fn the_mean_weighs_each_value_by_how_long_it_held_within_the_window() {
        // 0 % until 10 s, 50 % until 20 s, 100 % from then on.
        let steps = [(0, 0.0), (10, 50.0), (20, 100.0)];
        assert_eq!(time_weighted_mean(&steps, (0, 20)), 25.0);
        assert_eq!(time_weighted_mean(&steps, (10, 30)), 75.0);
        assert_eq!(time_weighted_mean(&steps, (5, 15)), 25.0);
        assert_eq!(time_weighted_mean(&steps, (15, 15)), 50.0, "one instant: the value then");
        assert_eq!(time_weighted_mean(&[], (0, 10)), 0.0);
    }
}
