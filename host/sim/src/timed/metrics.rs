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
    /// Times its jobs' runs were stopped by an eviction: a job, not a pod (a gang of 4 evicted
    /// is 1 here and 4 in the replay's pod count, [`super::TimedRun::evictions`]).
    pub evictions: u32,
    /// GPU-seconds received over GPU-seconds demanded (within the replay; first start to end).
    pub service_ratio: f64,
    /// GPU-hours it held less than its deserved share while it had work waiting.
    pub share_deficit_gpu_hours: f64,
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

/// The `p`-th percentile (nearest rank) of `sorted`; 0 when it is empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean of `v`; 0 when it is empty.
pub fn mean(v: &[u64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64 }
}

/// The mean of the step function `samples` (value from each instant to the next) over
/// `[from, to]`; the value at `from` when the window is a single instant.
pub fn time_weighted_mean(samples: &[(u64, f64)], window: (u64, u64)) -> f64 {
    let (from, to) = window;
    if to <= from {
        return value_at(samples, from);
    }
    integral(samples, window) / (to - from) as f64
}

/// The step function's value at `t`: the last sample at or before it (0 before the first).
fn value_at(samples: &[(u64, f64)], t: u64) -> f64 {
    let after = samples.partition_point(|s| s.0 <= t);
    if after == 0 { 0.0 } else { samples[after - 1].1 }
}

/// The integral of the step function over `[from, to)`, visiting only the samples inside it.
fn integral(samples: &[(u64, f64)], (from, to): (u64, u64)) -> f64 {
    let mut total = 0.0;
    let (mut t, mut value) = (from, value_at(samples, from));
    let first_inside = samples.partition_point(|s| s.0 <= from);
    for &(when, v) in samples[first_inside..].iter().take_while(|s| s.0 < to) {
        total += value * (when - t) as f64;
        (t, value) = (when, v);
    }
    total + value * to.saturating_sub(t) as f64
}

/// The instants when at least one job had arrived and neither started nor been given up, as
/// disjoint sorted windows. A job never started waits until it is given up, or to `horizon`.
fn waiting_windows(out: &[JobOutcome], horizon: u64) -> Vec<(u64, u64)> {
    let mut waits: Vec<(u64, u64)> = out
        .iter()
        .map(|o| (o.arrival, o.start.or(o.given_up).unwrap_or(horizon)))
        .filter(|(from, to)| to > from)
        .collect();
    waits.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(waits.len());
    for (from, to) in waits {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// The time-weighted mean of `samples` over the union of `windows`; `None` when they are empty.
fn mean_over_windows(samples: &[(u64, f64)], windows: &[(u64, u64)]) -> Option<f64> {
    let length: u64 = windows.iter().map(|w| w.1 - w.0).sum();
    (length > 0).then(|| windows.iter().map(|&w| integral(samples, w)).sum::<f64>() / length as f64)
}

pub(super) fn summarise(
    jobs: &[Job],
    mut out: Vec<JobOutcome>,
    utilisation: Vec<(u64, f64)>,
    counts: Counts,
    fairness: FairnessOverTime,
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
                share_deficit_gpu_hours: 0.0,
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
    let utilisation_mean_while_waiting = mean_over_windows(&utilisation, &waiting_windows(&out, horizon));
    let x: Vec<f64> = queues.values().map(|q| q.service_ratio).collect();
    let jain_fairness = jain(&x);
    let jain_fairness_while_backlogged = fairness.jain_while_backlogged(horizon);
    for (q, hours) in fairness.deficit_gpu_hours(horizon) {
        if let Some(stats) = queues.get_mut(&q) {
            stats.share_deficit_gpu_hours = hours;
        }
    }
    TimedRun {
        fabric: None,
        jobs: out,
        queues,
        waiting_by_reason,
        utilisation,
        utilisation_mean,
        utilisation_mean_while_arriving,
        utilisation_mean_while_waiting,
        jain_fairness,
        jain_fairness_while_backlogged,
        attempts: counts.attempts,
        evictions: counts.evictions,
        timed_out: counts.timed_out,
        faults: counts.faults,
        horizon,
        usage: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{JobOutcome, mean_over_windows, time_weighted_mean, waiting_windows};

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

    fn job(arrival: u64, start: Option<u64>, given_up: Option<u64>) -> JobOutcome {
        JobOutcome { queue: "q".into(), arrival, start, end: None, given_up, evictions: 0, waiting_reason: None }
    }

    #[test]
    fn work_waits_from_arrival_to_start_or_until_given_up_and_overlaps_count_once() {
        let out = [
            job(0, Some(0), None),   // never waited
            job(5, Some(15), None),  // 5–15
            job(10, Some(12), None), // inside the first wait
            job(30, None, Some(40)), // a gang given up at 40
            job(50, None, None),     // still waiting at the end
        ];
        assert_eq!(waiting_windows(&out, 60), vec![(5, 15), (30, 40), (50, 60)]);
        // 0 % until 10 s, 50 % until 35 s, 100 % from then on.
        let steps = [(0, 0.0), (10, 50.0), (35, 100.0)];
        let mean = mean_over_windows(&steps, &waiting_windows(&out, 60)).unwrap();
        // (5·0 + 5·50) + (5·50 + 5·100) + 10·100 over 30 s.
        assert_eq!(mean, (250.0 + 750.0 + 1000.0) / 30.0);
        assert_eq!(mean_over_windows(&steps, &waiting_windows(&out[..1], 60)), None, "nothing waited");
    }
}

/// Fairness while it matters: at each instant, the leaf queues that have work waiting
/// (backlogged) and the part of its deserved GPU share each holds. Measured at the end of a replay
/// in which everything finishes, every queue's service ratio is 1 and Jain's index says nothing;
/// over the backlogged periods it says how evenly the waiting queues were served as they waited.
#[derive(Debug, Default)]
pub(super) struct FairnessOverTime {
    /// Step functions over time: Jain's index over the backlogged queues' allocated / deserved
    /// where two or more are backlogged (else 0), and whether they are (1 or 0).
    jain: Vec<(u64, f64)>,
    counted: Vec<(u64, f64)>,
    /// Per leaf queue: GPU-milli short of its deserved share while backlogged, over time.
    deficit: BTreeMap<String, Vec<(u64, f64)>>,
}

impl FairnessOverTime {
    /// The state after the cycle at `now`: each leaf's (name, allocated and deserved GPU-milli,
    /// tasks waiting).
    pub(super) fn sample(&mut self, now: u64, leaves: &[(String, u64, Option<u64>, usize)]) {
        let mut ratios = Vec::new();
        for (name, allocated, deserved, waiting) in leaves {
            let short = match deserved {
                Some(d) if *waiting > 0 && *d > 0 => {
                    ratios.push(*allocated as f64 / *d as f64);
                    d.saturating_sub(*allocated) as f64
                }
                _ => 0.0,
            };
            self.deficit.entry(name.clone()).or_default().push((now, short));
        }
        let contended = ratios.len() >= 2;
        self.jain.push((now, if contended { jain(&ratios) } else { 0.0 }));
        self.counted.push((now, if contended { 1.0 } else { 0.0 }));
    }

    /// Time-weighted Jain's index over the instants two or more queues were backlogged, up to
    /// `horizon`; None when that never happened.
    pub(super) fn jain_while_backlogged(&self, horizon: u64) -> Option<f64> {
        let window = (self.counted.first().map_or(0, |s| s.0), horizon);
        let length = integral(&self.counted, window);
        (length > 0.0).then(|| integral(&self.jain, window) / length)
    }

    /// Per queue: GPU-hours it was short of its deserved share while it had work waiting.
    pub(super) fn deficit_gpu_hours(&self, horizon: u64) -> BTreeMap<String, f64> {
        self.deficit
            .iter()
            .map(|(q, steps)| {
                let window = (steps.first().map_or(0, |s| s.0), horizon);
                (q.clone(), integral(steps, window) / 1000.0 / 3600.0)
            })
            .collect()
    }
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one holds everything.
fn jain(x: &[f64]) -> f64 {
    let (s, s2) = x.iter().fold((0.0, 0.0), |(s, s2), v| (s + v, s2 + v * v));
    if s2 > 0.0 { s * s / (x.len() as f64 * s2) } else { 1.0 }
}
