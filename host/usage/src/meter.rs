//! [`Meter`]: the scheduler's running usage totals, for its Prometheus counters — fed the events it
//! publishes, as they are published, so that `/metrics` and `wasmsched usage` count the same.
//!
//! Unlike a [`Ledger`](crate::Ledger), which keeps every run for windows chosen later, a meter
//! folds each run into its group's totals when it ends and keeps only the runs going on: a
//! scheduler runs for months. Totals grow monotonically (a run going on counts up to the scrape),
//! and start from zero with the process, which Prometheus reads as a counter reset: so a run a new
//! process takes over counts from the take-over ([`Meter::take_over`]), never its past again.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ahash::AHashMap;
use wasmsched_events::Timestamp;
use wasmsched_events::schema::Payload;

use crate::facts::{Fact, Holding, of_payload};

/// The groups a meter counts by: the labels of its counters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MeterKey {
    /// Queue.
    pub queue: String,
    /// Namespace.
    pub namespace: String,
    /// GPU model (`-` for CPU-only runs).
    pub model: String,
}

/// A group's totals so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MeterTotals {
    /// GPU-seconds held.
    pub gpu_seconds: f64,
    /// Of those, in runs evicted without a checkpoint.
    pub lost_gpu_seconds: f64,
    /// CPU core-seconds.
    pub cpu_seconds: f64,
    /// Memory byte-seconds.
    pub memory_byte_seconds: f64,
    /// Runs that ended.
    pub runs_ended: u64,
}

/// Upper bounds (s) of the queueing-delay histogram's buckets.
pub const DELAY_BUCKETS: [f64; 12] =
    [1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];

/// Queueing delays of one queue's placements (submission to placement).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DelayHistogram {
    /// Placements per bucket of [`DELAY_BUCKETS`], and above the last.
    pub counts: [u64; DELAY_BUCKETS.len() + 1],
    /// Sum of the delays, s.
    pub sum: f64,
}

#[derive(Clone, Copy, Debug)]
struct Amounts {
    gpu_milli: u64,
    cpu_milli: u64,
    memory_bytes: u64,
}

/// A run going on: when it started (what its end names), when this meter began counting it (its
/// start, or the moment this process took it over), what it holds.
#[derive(Clone, Debug)]
struct OpenRun {
    started: u64,
    counted_from: u64,
    key: MeterKey,
    amounts: Amounts,
}

#[derive(Default)]
struct State {
    /// Runs going on, per `namespace/task`: (started ms, key, holdings).
    open: AHashMap<String, Vec<OpenRun>>,
    /// Milli-units × ms of ended runs, per group.
    closed: BTreeMap<MeterKey, [u128; 4]>,
    ended: BTreeMap<MeterKey, u64>,
    delays: BTreeMap<String, DelayHistogram>,
}

/// Running usage totals.
#[derive(Default)]
pub struct Meter {
    state: Mutex<State>,
}

/// How far a `task-ended`'s `started` may be from its run's `task-scheduled` time (see the report).
const MATCH_WITHIN_MS: u64 = 1000;

fn key(queue: &str, namespace: &str, h: &Holding<'_>) -> MeterKey {
    MeterKey { queue: queue.into(), namespace: namespace.into(), model: h.model.unwrap_or("-").into() }
}

fn amounts(h: &Holding<'_>) -> Amounts {
    Amounts { gpu_milli: h.gpu_milli, cpu_milli: h.cpu_milli, memory_bytes: h.memory_bytes }
}

impl Meter {
    /// A meter with nothing counted.
    pub fn new() -> Meter {
        Meter::default()
    }

    /// Count `payload`, published at `time` (only placements, ends and nothing else matter).
    pub fn record(&self, time: Timestamp, payload: &Payload) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match of_payload(time, payload) {
            Fact::Start { task, at, holding, submitted } => {
                let k = key(task.queue, task.namespace, &holding);
                if let Some(sub) = submitted.filter(|&s| s <= at) {
                    let d = s.delays.entry(task.queue.to_string()).or_default();
                    let seconds = (at - sub) as f64 / 1000.0;
                    let bucket = DELAY_BUCKETS.iter().position(|&b| seconds <= b).unwrap_or(DELAY_BUCKETS.len());
                    d.counts[bucket] += 1;
                    d.sum += seconds;
                }
                let runs = s.open.entry(format!("{}/{}", task.namespace, task.id)).or_default();
                runs.push(OpenRun { started: at, counted_from: at, key: k, amounts: amounts(&holding) });
            }
            Fact::End { task, started, at, holding, lost } => {
                let id = format!("{}/{}", task.namespace, task.id);
                let mut from = started;
                if let Some(runs) = s.open.get_mut(&id) {
                    if let Some(i) = runs.iter().position(|r| r.started.abs_diff(started) <= MATCH_WITHIN_MS) {
                        from = from.max(runs.swap_remove(i).counted_from);
                    }
                    if runs.is_empty() {
                        s.open.remove(&id);
                    }
                }
                let k = key(task.queue, task.namespace, &holding);
                let ms = u128::from(at.saturating_sub(from));
                // The work thrown away is the whole run's, lost now, though an earlier process
                // counted its first part as held.
                let whole_run = u128::from(at.saturating_sub(started));
                let a = amounts(&holding);
                let sums = s.closed.entry(k.clone()).or_default();
                sums[0] += u128::from(a.gpu_milli) * ms;
                sums[1] += if lost { u128::from(a.gpu_milli) * whole_run } else { 0 };
                sums[2] += u128::from(a.cpu_milli) * ms;
                sums[3] += u128::from(a.memory_bytes) * ms;
                *s.ended.entry(k).or_default() += 1;
            }
            _ => {}
        }
    }

    /// A run that began before this process (a restart, a fail-over), taken over at `now`: counted
    /// from `now` on, since the process that placed it counted it until then and Prometheus adds
    /// a restarted counter's whole value to what it had (a run of days taken over must not count
    /// its days again). Its queueing delay was counted then too. Its end names `placed`'s start.
    pub fn take_over(&self, now: Timestamp, started: Timestamp, placed: &Payload) {
        let Fact::Start { task, holding, .. } = of_payload(started, placed) else { return };
        let run = OpenRun {
            started: started.millis(),
            counted_from: now.millis().max(started.millis()),
            key: key(task.queue, task.namespace, &holding),
            amounts: amounts(&holding),
        };
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.open.entry(format!("{}/{}", task.namespace, task.id)).or_default().push(run);
    }

    /// Every group's totals, runs going on counted up to `now`.
    pub fn totals(&self, now: Timestamp) -> BTreeMap<MeterKey, MeterTotals> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut sums: BTreeMap<MeterKey, [u128; 4]> = s.closed.clone();
        for OpenRun { counted_from, key: k, amounts: a, .. } in s.open.values().flatten() {
            let ms = u128::from(now.millis().saturating_sub(*counted_from));
            let e = sums.entry(k.clone()).or_default();
            e[0] += u128::from(a.gpu_milli) * ms;
            e[2] += u128::from(a.cpu_milli) * ms;
            e[3] += u128::from(a.memory_bytes) * ms;
        }
        sums.into_iter()
            .map(|(k, v)| {
                let totals = MeterTotals {
                    gpu_seconds: v[0] as f64 / 1e6,
                    lost_gpu_seconds: v[1] as f64 / 1e6,
                    cpu_seconds: v[2] as f64 / 1e6,
                    memory_byte_seconds: v[3] as f64 / 1e3,
                    runs_ended: s.ended.get(&k).copied().unwrap_or(0),
                };
                (k, totals)
            })
            .collect()
    }

    /// Queueing delays per queue.
    pub fn delays(&self) -> BTreeMap<String, DelayHistogram> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).delays.clone()
    }

    /// Stop counting the runs going on (the scheduler no longer leads: the new leader counts
    /// them); what ended stays counted.
    pub fn forget_running(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).open.clear();
    }

    /// Runs going on.
    pub fn running(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).open.values().map(Vec::len).sum()
    }
}

/// The meter follows the scheduler's decisions as it publishes them.
impl wasmsched_events::Observer for Meter {
    fn observe(&self, at: Timestamp, payload: &Payload) {
        self.record(at, payload);
    }

    fn taken_over(&self, now: Timestamp, started: Timestamp, placed: &Payload) {
        self.take_over(now, started, placed);
    }

    fn handed_over(&self) {
        self.forget_running();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmsched_events::schema::{EndReason, GpuShare, Quantity, TaskEnded, TaskRef, TaskScheduled};

    fn task(id: &str) -> TaskRef {
        TaskRef { id: id.into(), namespace: "ml".into(), queue: "research".into(), ..TaskRef::default() }
    }

    fn scheduled(id: &str, submitted: u64) -> Payload {
        Payload::TaskScheduled(
            TaskScheduled {
                task: task(id),
                gpus: vec![GpuShare { gpu: 0, milli: 1000 }, GpuShare { gpu: 1, milli: 500 }],
                allocated: Quantity { cpu_milli: 2000, memory_bytes: 1 << 30, gpu_milli: 0 },
                gpu_model: Some("H100".into()),
                submitted: Some(Timestamp(submitted)),
                ..TaskScheduled::default()
            }
            .with_gpu_total(),
        )
    }

    fn ended(id: &str, started: u64, reason: EndReason, work_kept: bool) -> Payload {
        Payload::TaskEnded(TaskEnded {
            task: task(id),
            started: Timestamp(started),
            gpus: vec![GpuShare { gpu: 0, milli: 1000 }, GpuShare { gpu: 1, milli: 500 }],
            allocated: Quantity { cpu_milli: 2000, memory_bytes: 1 << 30, gpu_milli: 1500 },
            gpu_model: Some("H100".into()),
            reason,
            work_kept,
            ..TaskEnded::default()
        })
    }

    #[test]
    fn runs_count_while_they_go_on_and_fold_into_totals_when_they_end() {
        let m = Meter::new();
        m.record(Timestamp(10_000), &scheduled("a", 4_000));
        m.record(Timestamp(20_000), &scheduled("b", 20_000));
        let key = MeterKey { queue: "research".into(), namespace: "ml".into(), model: "H100".into() };
        // At 30 s: a has run 20 s, b 10 s, 1.5 GPUs each.
        let t = m.totals(Timestamp(30_000))[&key];
        assert_eq!((t.gpu_seconds, t.cpu_seconds, t.runs_ended), (45.0, 60.0, 0));
        // a ends at 40 s, preempted without its work; b's end names a start 400 ms off (a
        // scheduler that restarted and read it from the pod): the same run.
        m.record(Timestamp(40_000), &ended("a", 10_000, EndReason::Preempted, false));
        m.record(Timestamp(50_000), &ended("b", 20_400, EndReason::Completed, true));
        assert_eq!(m.running(), 0);
        let later = m.totals(Timestamp(90_000))[&key];
        assert_eq!(later.runs_ended, 2);
        assert_eq!(later.lost_gpu_seconds, 45.0);
        // b: 29.6 s of 1.5 GPUs as its end says; a: 30 s.
        assert!((later.gpu_seconds - (45.0 + 44.4)).abs() < 1e-9, "{later:?}");
        assert!(later.gpu_seconds >= t.gpu_seconds, "monotonic");
        assert_eq!(later.memory_byte_seconds, f64::from(1u32 << 30) * 59.6);
        let d = &m.delays()["research"];
        assert_eq!((d.counts[0], d.counts[2], d.sum), (1, 1, 6.0), "0 s (≤ 1 s) and 6 s (≤ 10 s)");
    }

    #[test]
    fn a_run_taken_over_counts_from_the_take_over_and_its_delay_not_again() {
        // A new process at 100 s takes over a run placed at 10 s (submitted at 4 s) by the one
        // before, which counted its first 90 s and its delay.
        let m = Meter::new();
        let key = MeterKey { queue: "research".into(), namespace: "ml".into(), model: "H100".into() };
        m.take_over(Timestamp(100_000), Timestamp(10_000), &scheduled("a", 4_000));
        assert_eq!(m.running(), 1);
        assert_eq!(m.totals(Timestamp(130_000))[&key].gpu_seconds, 45.0, "30 s × 1.5 GPUs");
        assert!(m.delays().is_empty());
        // Its end names its real start: matched, and held from the take-over; the work it throws
        // away is its whole run's (140 s), lost now.
        m.record(Timestamp(150_000), &ended("a", 10_000, EndReason::Preempted, false));
        assert_eq!(m.running(), 0);
        let t = m.totals(Timestamp(200_000))[&key];
        assert_eq!((t.gpu_seconds, t.lost_gpu_seconds, t.runs_ended), (75.0, 210.0, 1));
    }
}
