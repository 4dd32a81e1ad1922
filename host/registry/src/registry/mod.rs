//! The registry: the live version, the candidate on its way, and the watch after a swap.
//!
//! The scheduling loop does two things with it: [`Registry::current`] at the start of a cycle (the
//! version every decision of the cycle uses), and [`Registry::record`] after each decision (feeds
//! the probation watch and the shadow run). Everything else — preparation, shadow verdicts,
//! rollback — happens through the registry on other threads or inside `record`, never by
//! mutating a version in place.
//!
//! Here: the live swap (offer, go live, promote, roll back, reject). Beside it: `shadow` (the
//! candidate compared decision by decision), `probation` (the watch after a swap and what trips a
//! rollback), `history` (what happened to each version), `sampling` (cluster samples and catching a
//! prepared version up with the loop's nodes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmsched_api::Task;
use wasmsched_core::{NodeTable, Placement, Unschedulable, place};
use wasmsched_events::EventSink;
use wasmsched_events::schema::{
    DecisionDiff, Payload, PolicyRejected, PolicyRolledBack, PolicySetRef, PolicyShadowDiff, PolicySwapped, TaskRef,
};

use crate::error::PrepareError;
use crate::prepare::{PolicyVersion, Preparer, Sample};
use crate::source::Fetched;
use crate::spec::{RollbackSpec, ShadowSpec};

mod history;
mod probation;
mod sampling;
mod shadow;

pub use history::{HistoryEntry, Outcome};
use history::{push_history, update_history};
pub use probation::WindowStats;
use probation::{Baseline, Probation, Window};
use shadow::ShadowRun;
pub use shadow::ShadowStats;

/// Recent tasks kept for smoke tests.
const RECENT_TASKS: usize = 64;
/// Keep one task in this many decisions for smoke tests (cloning every task costs hot-path time).
const RECENT_EVERY: u64 = 8;
/// History entries kept.
const HISTORY: usize = 32;
/// Differing decisions kept as examples in a shadow report.
const SHADOW_EXAMPLES: usize = 10;
/// Differing decisions a shadow run keeps for its status (the dashboard shows them), newest last.
const SHADOW_RECENT: usize = 20;
/// Publish a shadow report every this many compared decisions (and at the end).
const SHADOW_REPORT_EVERY: u64 = 1_000;
/// Offer a fresh cluster sample when the last one is older than this.
const SAMPLE_MAX_AGE: Duration = Duration::from_secs(60);
/// How long a preparation waits for the scheduling loop's next sample before going live.
const FRESH_SAMPLE_WAIT: Duration = Duration::from_millis(50);

/// How long a catch-up waits to see whether the loop is deciding at all (a decision within it
/// means a fresh sample will come); a loop with nothing to do offers none.
const IDLE_LOOP_WAIT: Duration = Duration::from_millis(2);

/// One decision of the scheduling loop, as the registry sees it.
pub struct Decision<'a> {
    /// The task decided.
    pub task: &'a Task,
    /// The nodes it was decided on, before the placement was bound.
    pub nodes: &'a NodeTable,
    /// The outcome.
    pub result: &'a Result<Placement, Unschedulable>,
    /// Time the decision took.
    pub latency: Duration,
}

impl Decision<'_> {
    fn faulted(&self) -> bool {
        match self.result {
            Ok(p) => !p.skipped_faults.is_empty(),
            Err(u) => !u.diagnosis.faults.is_empty(),
        }
    }
}

/// Everything `policy status` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    /// The live version.
    pub live: String,
    /// Its origin.
    pub live_origin: String,
    /// Whether it is still on probation.
    pub on_probation: bool,
    /// The version a rollback restores.
    pub last_good: Option<String>,
    /// Statistics of the live version's last full window.
    pub live_window: Option<WindowStats>,
    /// The candidate in shadow or ready, if any.
    pub candidate: Option<String>,
    /// Its shadow comparison.
    pub shadow: Option<ShadowStats>,
    /// Sources that failed their last poll: `(source, error)`.
    pub source_errors: Vec<(String, String)>,
    /// Most recent first.
    pub history: Vec<HistoryEntry>,
}

/// Why a control request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// There is no candidate to promote.
    #[error("no candidate to promote")]
    NoCandidate,
    /// There is nothing to roll back to.
    #[error("nothing to roll back to: {0} is the only good version")]
    NothingToRollBackTo(String),
}

struct Inner {
    last_good: Arc<PolicyVersion>,
    probation: Option<Probation>,
    baseline: Baseline,
    shadow: Option<ShadowRun>,
    ready: Option<Arc<PolicyVersion>>,
    /// With warm-up: the version going live once its mirrors have caught up, and how it came.
    staged: Option<(Arc<PolicyVersion>, String)>,
    /// Versions replaced inside [`Registry::warm`]: dropping one frees its instances (memory
    /// unmapped), which is not the scheduling loop's work; the next control call drops them.
    retired: Vec<Arc<PolicyVersion>>,
    history: VecDeque<HistoryEntry>,
    /// How many versions reached each outcome since start (the history keeps only the last few):
    /// what `wasmsched_policy_outcomes_total` exports, so an alert sees every rollback.
    outcomes: [u64; Outcome::ALL.len()],
    recent_tasks: VecDeque<Task>,
    sample: Option<(Sample, Instant)>,
    source_errors: Vec<(String, String)>,
}

/// Versioned policy sets: the live one, the candidate, history, rollback.
pub struct Registry {
    live: RwLock<Arc<PolicyVersion>>,
    inner: Mutex<Inner>,
    events: Option<EventSink>,
    versions: AtomicU64,
    decisions: AtomicU64,
    sample_wanted: AtomicBool,
    /// Changes per plugin instance a [`Registry::warm`] call applies; `None`: swaps are immediate.
    warm_up: Option<usize>,
    /// A version is staged (a load instead of the lock on every decision).
    staged: AtomicBool,
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

fn task_ref(t: &Task) -> TaskRef {
    TaskRef { id: t.id.clone(), namespace: t.namespace.clone(), queue: t.queue.clone(), ..Default::default() }
}

/// A placement's score normalised to 0..=100 by the set's total weight.
fn normalised(score: u64, v: &PolicyVersion) -> u32 {
    let weight: u64 = v.spec.stages.score.iter().map(|w| u64::from(w.weight)).sum();
    score.checked_div(weight).map_or(0, |s| s.min(100) as u32)
}

impl Registry {
    /// A registry whose first live version is `initial` (trusted: there is nothing to roll back
    /// to). Versions are numbered from `initial.version + 1` on.
    pub fn new(initial: PolicyVersion, events: Option<EventSink>) -> Registry {
        let initial = Arc::new(initial);
        let next = initial.version + 1;
        let registry = Registry {
            live: RwLock::new(initial.clone()),
            inner: Mutex::new(Inner {
                last_good: initial.clone(),
                probation: None,
                baseline: Baseline { version: initial.version, ..Baseline::default() },
                shadow: None,
                ready: None,
                staged: None,
                retired: Vec::new(),
                history: VecDeque::new(),
                outcomes: [0; Outcome::ALL.len()],
                recent_tasks: VecDeque::new(),
                sample: None,
                source_errors: Vec::new(),
            }),
            events,
            versions: AtomicU64::new(next),
            decisions: AtomicU64::new(0),
            sample_wanted: AtomicBool::new(true),
            warm_up: None,
            staged: AtomicBool::new(false),
        };
        {
            let mut inner = registry.lock();
            registry.emit(Payload::PolicySwapped(PolicySwapped { from: None, to: initial.reference() }));
            push_history(&mut inner, &initial, Outcome::Live, "initial version");
        }
        registry
    }

    /// Stage versions instead of swapping them in at once: each goes live once its plugins'
    /// mirrors have caught up with the cluster, `max_changes` changes per [`Registry::warm`] call,
    /// so no decision pays a whole catch-up (the first one with a new version otherwise does).
    /// The scheduling loop must then call [`Registry::warm`] before each cycle. Rollbacks stay
    /// immediate.
    pub fn with_warm_up(mut self, max_changes: usize) -> Registry {
        self.warm_up = Some(max_changes.max(1));
        self
    }

    /// The version to use for the next cycle. Cheap (a read lock and a reference count).
    pub fn current(&self) -> Arc<PolicyVersion> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A fresh version number for a candidate.
    pub fn next_version(&self) -> u64 {
        self.versions.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, payload: Payload) {
        if let Some(sink) = &self.events {
            sink.emit(payload);
        }
    }

    /// Feed one decision made with `used`: the probation watch, the baseline and the shadow run.
    /// Called by the scheduling loop after each decision, before binding it.
    pub fn record(&self, used: &Arc<PolicyVersion>, d: Decision<'_>) {
        let n = self.decisions.fetch_add(1, Ordering::Relaxed);
        let shadow = {
            let mut inner = self.lock();
            if n.is_multiple_of(RECENT_EVERY) {
                if inner.recent_tasks.len() == RECENT_TASKS {
                    inner.recent_tasks.pop_front();
                }
                inner.recent_tasks.push_back(d.task.clone());
            }
            self.watch(&mut inner, used, &d, n);
            match &mut inner.shadow {
                Some(run) => {
                    run.offered += 1;
                    ((run.offered - 1) % run.spec.sample_every == 0).then(|| run.candidate.clone())
                }
                None => None,
            }
        };
        if let Some(candidate) = shadow {
            let outcome = place(&candidate.set, d.nodes, d.task, 0);
            let mut inner = self.lock();
            self.compare(&mut inner, used, &candidate, &d, &outcome);
        }
    }

    /// Replace the live version, at once or (with warm-up) once it has caught up; the new one is
    /// on probation.
    fn swap_in(&self, inner: &mut Inner, next: Arc<PolicyVersion>, how: &str) {
        if self.warm_up.is_none() {
            self.go_live(inner, next, how);
            return;
        }
        // Off the scheduling loop (a control call): free what `warm` retired.
        inner.retired.clear();
        if let Some((old, _)) = inner.staged.replace((next.clone(), how.to_string())) {
            update_history(inner, &old, Outcome::Superseded, &format!("replaced by {} while warming up", next.label()));
        }
        push_history(inner, &next, Outcome::Staged, "warming up its mirrors");
        self.staged.store(true, Ordering::Release);
    }

    /// Make `next` live now; it is on probation. Returns the version it replaced.
    fn go_live(&self, inner: &mut Inner, next: Arc<PolicyVersion>, how: &str) -> Arc<PolicyVersion> {
        let previous = {
            let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *live, next.clone())
        };
        // Outgoing version: its last window is the new one's baseline.
        if inner.baseline.version == previous.version
            && inner.baseline.last.is_none()
            && inner.baseline.window.len() > 0
        {
            inner.baseline.close(self.decisions.load(Ordering::Relaxed));
        }
        let Baseline { last, last_at, .. } = std::mem::take(&mut inner.baseline);
        inner.baseline = Baseline { version: next.version, window: Window::default(), last, last_at };
        // An outgoing version still on probation never became good: last_good stays as it is.
        update_history(inner, &previous, Outcome::Superseded, &format!("replaced by {}", next.label()));
        inner.probation = Some(Probation {
            version: next.version,
            spec: next.spec.rollback.clone(),
            seen: 0,
            window: Window::default(),
        });
        let label = next.label();
        match inner.history.iter_mut().find(|h| h.label == label && h.outcome == Outcome::Staged) {
            Some(h) => (h.outcome, h.reason, h.at) = (Outcome::Probation, how.into(), now()),
            None => push_history(inner, &next, Outcome::Probation, how),
        }
        tracing::info!(from = %previous.label(), to = %next.label(), how, "policy set swapped");
        self.emit(Payload::PolicySwapped(PolicySwapped { from: Some(previous.reference()), to: next.reference() }));
        previous
    }

    /// Restore the last good version.
    fn roll_back(&self, inner: &mut Inner, reason: &str) {
        let target = inner.last_good.clone();
        if let Some((staged, _)) = inner.staged.take() {
            self.staged.store(false, Ordering::Release);
            update_history(inner, &staged, Outcome::Superseded, &format!("dropped: rolled back to {}", target.label()));
        }
        let from = {
            let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *live, target.clone())
        };
        inner.probation = None;
        let Baseline { last, last_at, .. } = std::mem::take(&mut inner.baseline);
        inner.baseline = Baseline { version: target.version, window: Window::default(), last, last_at };
        update_history(inner, &from, Outcome::RolledBack, reason);
        push_history(inner, &target, Outcome::Live, &format!("restored after {} was rolled back", from.label()));
        tracing::warn!(from = %from.label(), to = %target.label(), reason, "policy set rolled back");
        self.emit(Payload::PolicyRolledBack(PolicyRolledBack {
            from: from.reference(),
            to: target.reference(),
            reason: reason.to_string(),
        }));
    }

    fn reject(&self, inner: &mut Inner, label: &str, origin: &str, error: PrepareError) {
        let (name, version) = label.split_once('@').unwrap_or((label, "0"));
        tracing::warn!(set = label, origin, error = %error, "policy set rejected");
        self.emit(Payload::PolicyRejected(PolicyRejected {
            policy_set: PolicySetRef { name: name.into(), version: version.parse().unwrap_or(0) },
            origin: origin.into(),
            gate: error.gate().into(),
            reason: error.to_string(),
        }));
        let reason = error.to_string();
        match inner.history.iter_mut().find(|h| h.label == label) {
            Some(h) => {
                h.outcome = Outcome::Rejected;
                h.reason = reason;
                h.at = now();
            }
            None => {
                if inner.history.len() == HISTORY {
                    inner.history.pop_back();
                }
                inner.history.push_front(HistoryEntry {
                    label: label.into(),
                    origin: origin.into(),
                    outcome: Outcome::Rejected,
                    reason,
                    at: now(),
                });
            }
        }
    }

    /// Prepare `fetched` (off the hot path: call from a watcher thread) and, if it passes, start
    /// its shadow run or make it live. Returns the version, or why it was rejected.
    pub fn offer(&self, fetched: &Fetched, preparer: &Preparer) -> Result<u64, PrepareError> {
        let version = self.next_version();
        let label = format!("{}@{version}", fetched.spec.name);
        let busy_before = self.decisions.load(Ordering::Relaxed);
        let (sample, taken) = self.sample_taken();
        // The next version prepared starts from a sample at most one preparation old, so its
        // first live decision catches up on little.
        self.sample_wanted.store(true, Ordering::Relaxed);
        let live = self.current();
        let prepared = match preparer.prepare_beside(fetched, version, &sample, Some(&live)) {
            Ok(mut v) => {
                drop(live);
                v.inherit_verdicts(&self.current());
                self.catch_up_to_live(&v, taken, busy_before);
                Arc::new(v)
            }
            Err(e) => {
                let mut inner = self.lock();
                self.reject(&mut inner, &label, &fetched.origin, e.clone());
                return Err(e);
            }
        };
        self.emit(Payload::PolicyLoaded(prepared.loaded()));
        let mut inner = self.lock();
        if let Some(old) = inner.shadow.take() {
            update_history(&mut inner, &old.candidate, Outcome::Superseded, &format!("replaced by {label}"));
        }
        if let Some(old) = inner.ready.take() {
            update_history(&mut inner, &old, Outcome::Superseded, &format!("replaced by {label}"));
        }
        match prepared.spec.shadow.clone() {
            Some(spec) => {
                push_history(&mut inner, &prepared, Outcome::Shadow, "prepared; shadow run started");
                inner.shadow = Some(ShadowRun {
                    candidate: prepared,
                    spec,
                    started: Instant::now(),
                    offered: 0,
                    compared: 0,
                    identical: 0,
                    faults: 0,
                    both_placed: 0,
                    score_delta_sum: 0.0,
                    examples: Vec::new(),
                    recent: std::collections::VecDeque::new(),
                    reported: 0,
                });
            }
            None => self.swap_in(&mut inner, prepared, "prepared and smoke-tested"),
        }
        Ok(version)
    }

    /// Make an already prepared version live now, skipping its shadow run (benchmarks, tests and
    /// embedders that prepare versions themselves). Its mirrors are caught up first, on the
    /// calling thread.
    pub fn install(&self, version: PolicyVersion) {
        self.catch_up_earlier_version(&version);
        let mut inner = self.lock();
        self.swap_in(&mut inner, Arc::new(version), "installed");
    }

    /// Make the candidate (in shadow or ready) live now.
    pub fn promote(&self) -> Result<String, ControlError> {
        let candidate = {
            let inner = self.lock();
            inner.ready.clone().or_else(|| inner.shadow.as_ref().map(|run| run.candidate.clone()))
        };
        if let Some(candidate) = candidate {
            self.catch_up_earlier_version(&candidate);
        }
        let mut inner = self.lock();
        let candidate = match (inner.ready.take(), inner.shadow.take()) {
            (Some(ready), _) => ready,
            (None, Some(run)) => run.candidate,
            (None, None) => return Err(ControlError::NoCandidate),
        };
        let label = candidate.label();
        self.swap_in(&mut inner, candidate, "promoted by hand");
        Ok(label)
    }

    /// Restore the last good version now. When the live version is the last good one, there is
    /// nothing to restore.
    pub fn rollback(&self) -> Result<String, ControlError> {
        let target = self.lock().last_good.clone();
        if target.version != self.current().version {
            self.catch_up_earlier_version(&target);
        }
        let mut inner = self.lock();
        let live = self.current();
        if live.version == inner.last_good.version {
            return Err(ControlError::NothingToRollBackTo(live.label()));
        }
        let to = inner.last_good.label();
        self.roll_back(&mut inner, "rolled back by hand");
        Ok(to)
    }

    /// Note that `source` polled fine.
    pub fn source_ok(&self, source: &str) {
        let mut inner = self.lock();
        if inner.source_errors.iter().any(|(s, _)| s == source) {
            tracing::info!(source, "policy source recovered");
            inner.source_errors.retain(|(s, _)| s != source);
        }
    }

    /// A source could not deliver a version (unreadable, vanished, invalid spec, missing
    /// artifact): kept in status, logged and published once per distinct error. The live version
    /// is untouched.
    pub fn report_fetch_failure(&self, source: &str, error: &str) {
        let mut inner = self.lock();
        if inner.source_errors.iter().any(|(s, e)| s == source && e == error) {
            return;
        }
        inner.source_errors.retain(|(s, _)| s != source);
        inner.source_errors.push((source.to_string(), error.to_string()));
        tracing::warn!(source, error, "policy source failed; the live set keeps running");
        self.emit(Payload::PolicyRejected(PolicyRejected {
            policy_set: PolicySetRef::default(),
            origin: source.into(),
            gate: "fetch".into(),
            reason: error.into(),
        }));
    }

    /// How many versions reached each outcome since this registry started (a version counts once
    /// per outcome it reaches).
    pub fn outcome_counts(&self) -> Vec<(Outcome, u64)> {
        let inner = self.lock();
        Outcome::ALL.iter().cloned().zip(inner.outcomes).collect()
    }

    /// Live, candidate, shadow statistics and history.
    pub fn status(&self) -> Status {
        let inner = self.lock();
        let live = self.current();
        let candidate = inner.ready.as_ref().or(inner.shadow.as_ref().map(|r| &r.candidate)).map(|c| c.label());
        Status {
            live: live.label(),
            live_origin: live.origin.clone(),
            on_probation: inner.probation.as_ref().is_some_and(|p| p.version == live.version),
            last_good: Some(inner.last_good.label()),
            live_window: inner.baseline.last.clone().filter(|_| inner.baseline.version == live.version),
            candidate,
            shadow: inner.shadow.as_ref().map(ShadowRun::stats),
            source_errors: inner.source_errors.clone(),
            history: inner.history.iter().cloned().collect(),
        }
    }
}
