//! Runs of the replay's tasks — placed, then released — and the usage the simulator bills from its
//! own state: what `wasmsched usage` must find again from the events alone.
//!
//! A run holds its GPUs from its placement until they are free again: at its job's departure, when
//! an evicted replica has stopped (after its job's `termination_seconds`), at once when its node is
//! lost, or when its gang is given up.

use std::collections::BTreeMap;

use ahash::AHashMap;
use serde::Serialize;
use wasmsched_api::{DeviceShare, Task};

use super::effects::Jobs;

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunEnd {
    /// Its job finished.
    Completed,
    /// It was preempted (and has now stopped).
    Preempted,
    /// Another eviction: a broken gang, a lost node, a gang given up.
    Evicted,
}

/// One task's run, while it lasts.
#[derive(Clone, Debug)]
pub(super) struct Run {
    pub(super) job: usize,
    pub(super) node: String,
    pub(super) devices: Vec<DeviceShare>,
    pub(super) started: u64,
}

/// A run that is over, for observers.
#[derive(Clone, Debug)]
pub(super) struct Ended {
    pub(super) task: String,
    pub(super) run: Run,
    pub(super) at: u64,
    pub(super) end: RunEnd,
    pub(super) work_kept: bool,
}

/// What a queue used, by the simulator's own count: each run's holdings times its length, in
/// exact integer units.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueUsage {
    /// Milli-GPU-seconds held (GPU-seconds × 1000).
    pub gpu_milli_seconds: u64,
    /// Milli-core-seconds held.
    pub cpu_milli_seconds: u64,
    /// Byte-seconds of memory held.
    pub memory_byte_seconds: u128,
    /// Of `gpu_milli_seconds`, runs evicted without a checkpoint: work thrown away.
    pub lost_gpu_milli_seconds: u64,
    /// Runs, finished or not.
    pub runs: u64,
}

impl QueueUsage {
    fn add(&mut self, task: &Task, run: &Run, until: u64, lost: bool) {
        let seconds = until.saturating_sub(run.started);
        let gpu: u64 = run.devices.iter().map(|d| u64::from(d.milli)).sum();
        self.gpu_milli_seconds += gpu * seconds;
        self.cpu_milli_seconds += task.request.cpu_milli * seconds;
        self.memory_byte_seconds += u128::from(task.request.memory_bytes) * u128::from(seconds);
        if lost {
            self.lost_gpu_milli_seconds += gpu * seconds;
        }
        self.runs += 1;
    }
}

/// The runs of a replay: those going on, those stopping after an eviction, and the usage of those
/// that ended.
#[derive(Default)]
pub(super) struct Runs {
    running: AHashMap<String, Run>,
    /// Evicted replicas holding their GPUs until they stop: (stops at, task, run, why, work_kept).
    stopping: Vec<(u64, String, Run, RunEnd, bool)>,
    /// Ended since the observer last looked.
    pub(super) ended: Vec<Ended>,
    usage: BTreeMap<String, QueueUsage>,
}

impl Runs {
    /// `(node, job)` of every running replica.
    pub(super) fn holders(&self) -> Vec<(&str, usize)> {
        self.running.values().map(|r| (r.node.as_str(), r.job)).collect()
    }

    /// The node `task` runs on.
    pub(super) fn node_of(&self, task: &str) -> Option<&str> {
        self.running.get(task).map(|r| r.node.as_str())
    }

    pub(super) fn start(&mut self, task: &str, run: Run) {
        self.running.insert(task.to_owned(), run);
    }

    /// `task` evicted at `now`: it stops at `stops_at` (now, for a lost node).
    pub(super) fn evict(&mut self, task: &str, now: u64, stops_at: u64, end: RunEnd, work_kept: bool) {
        let Some(run) = self.running.remove(task) else { return };
        if stops_at <= now {
            self.ended.push(Ended { task: task.to_owned(), run, at: now, end, work_kept });
        } else {
            self.stopping.push((stops_at, task.to_owned(), run, end, work_kept));
        }
    }

    /// An evicted `task` has stopped at `now`.
    pub(super) fn stopped(&mut self, task: &str, now: u64) {
        if let Some(i) = self.stopping.iter().position(|(at, t, ..)| *at == now && t == task) {
            let (at, task, run, end, work_kept) = self.stopping.swap_remove(i);
            self.ended.push(Ended { task, run, at, end, work_kept });
        }
    }

    /// `task`'s run, if it runs, is over at `now`.
    pub(super) fn finish(&mut self, task: &str, now: u64, end: RunEnd) {
        if let Some(run) = self.running.remove(task) {
            // A job that finished did its work; a gang given up did none.
            let work_kept = end == RunEnd::Completed;
            self.ended.push(Ended { task: task.to_owned(), run, at: now, end, work_kept });
        }
    }

    /// Bill the runs that ended (after observers saw them).
    pub(super) fn bill(&mut self, tasks: &Jobs<'_>) {
        for e in std::mem::take(&mut self.ended) {
            if let Some(task) = tasks.task(&e.task) {
                let lost = e.end != RunEnd::Completed && !e.work_kept;
                self.usage.entry(task.queue.clone()).or_default().add(task, &e.run, e.at, lost);
            }
        }
    }

    /// The usage of every run, those still going on counted up to `horizon`.
    pub(super) fn usage_until(mut self, horizon: u64, tasks: &Jobs<'_>) -> BTreeMap<String, QueueUsage> {
        self.bill(tasks);
        let running = self.running.iter().map(|(t, r)| (t.as_str(), r));
        for (task, run) in running.chain(self.stopping.iter().map(|s| (s.1.as_str(), &s.2))) {
            if let Some(task) = tasks.task(task) {
                self.usage.entry(task.queue.clone()).or_default().add(task, run, horizon, false);
            }
        }
        self.usage
    }
}
