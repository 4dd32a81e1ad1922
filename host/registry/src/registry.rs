//! The registry: the live version, the candidate on its way, and the watch after a swap.
//!
//! The scheduling loop does two things with it: [`Registry::current`] at the start of a cycle (the
//! version every decision of the cycle uses), and [`Registry::record`] after each decision (feeds
//! the probation watch and the shadow run). Everything else — preparation, shadow verdicts,
//! rollback — happens through the registry on other threads or inside `record`, never by
//! mutating a version in place.

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

/// Recent tasks kept for smoke tests.
const RECENT_TASKS: usize = 64;
/// Keep one task in this many decisions for smoke tests (cloning every task costs hot-path time).
const RECENT_EVERY: u64 = 8;
/// History entries kept.
const HISTORY: usize = 32;
/// Differing decisions kept as examples in a shadow report.
const SHADOW_EXAMPLES: usize = 10;
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
struct Window {
    latencies_us: Vec<u32>,
    faults: u64,
    unschedulable: u64,
}

impl Window {
    fn push(&mut self, d: &Decision<'_>) {
        self.latencies_us.push(d.latency.as_micros().min(u32::MAX as u128) as u32);
        self.faults += u64::from(d.faulted());
        self.unschedulable += u64::from(d.result.is_err());
    }

    fn len(&self) -> u64 {
        self.latencies_us.len() as u64
    }

    fn close(&mut self) -> WindowStats {
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
struct Probation {
    version: u64,
    spec: RollbackSpec,
    seen: u64,
    window: Window,
}

/// Rolling statistics of the live version once it is past probation (the baseline the next
/// version is compared with).
#[derive(Default)]
struct Baseline {
    version: u64,
    window: Window,
    last: Option<WindowStats>,
    /// The decision count when `last` closed: a baseline older than a probation (and a window)
    /// is not compared with ([`Baseline::fresh_for`]).
    last_at: u64,
}

impl Baseline {
    /// `last`, if it closed within `spec.probation + spec.window` decisions before decision `n`:
    /// long enough for one version's whole probation after a swap. Older (a run of versions each
    /// replaced while on probation), the cluster and workload it saw may differ too much from
    /// today's for the relative checks (p99 ratio, unschedulable rise) to mean anything; only
    /// the absolute ones apply. (The bench that swaps every 10 ms rolled back for an
    /// "unschedulable rise" against the empty cluster of its first window.)
    fn fresh_for(&self, spec: &RollbackSpec, n: u64) -> Option<&WindowStats> {
        self.last.as_ref().filter(|_| n.saturating_sub(self.last_at) <= spec.probation.saturating_add(spec.window))
    }

    fn close(&mut self, n: u64) {
        self.last = Some(self.window.close());
        self.last_at = n;
    }
}

struct ShadowRun {
    candidate: Arc<PolicyVersion>,
    spec: ShadowSpec,
    started: Instant,
    offered: u64,
    compared: u64,
    identical: u64,
    faults: u64,
    both_placed: u64,
    score_delta_sum: f64,
    examples: Vec<DecisionDiff>,
    reported: u64,
}

impl ShadowRun {
    fn stats(&self) -> ShadowStats {
        ShadowStats {
            compared: self.compared,
            identical_share: if self.compared == 0 { 1.0 } else { self.identical as f64 / self.compared as f64 },
            fault_rate: if self.compared == 0 { 0.0 } else { self.faults as f64 / self.compared as f64 },
            mean_score_delta: if self.both_placed == 0 { 0.0 } else { self.score_delta_sum / self.both_placed as f64 },
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }

    fn done(&self) -> bool {
        self.compared >= self.spec.decisions
            || (self.compared > 0 && self.started.elapsed().as_secs_f64() >= self.spec.seconds)
    }

    fn verdict(&self) -> Result<(), String> {
        let s = self.stats();
        if s.identical_share < self.spec.min_identical {
            return Err(format!(
                "{:.1}% identical placements < min_identical {:.1}% over {} decisions",
                s.identical_share * 100.0,
                self.spec.min_identical * 100.0,
                s.compared
            ));
        }
        if s.fault_rate > self.spec.max_fault_rate {
            return Err(format!(
                "fault rate {:.2}% > max_fault_rate {:.2}% over {} decisions",
                s.fault_rate * 100.0,
                self.spec.max_fault_rate * 100.0,
                s.compared
            ));
        }
        Ok(())
    }
}

/// A shadow run's comparison so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShadowStats {
    /// Decisions compared.
    pub compared: u64,
    /// Share placed on the same node (both unschedulable counts as identical).
    pub identical_share: f64,
    /// Share on which a shadow plugin faulted.
    pub fault_rate: f64,
    /// Mean absolute difference of the two sets' normalised scores (0..=100), over decisions both
    /// placed.
    pub mean_score_delta: f64,
    /// Seconds since the run began.
    pub seconds: f64,
}

/// What happened to a version.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Live now, watched until its probation ends.
    Probation,
    /// Live now, past probation (or the first version).
    Live,
    /// Prepared, running beside the live version.
    Shadow,
    /// Passed its shadow run; waits for `policy promote`.
    Ready,
    /// Was live, then replaced by a newer version.
    Superseded,
    /// Was live and tripped a threshold (or was rolled back by hand).
    RolledBack,
    /// Failed a gate; never went live.
    Rejected,
    /// Prepared and due to go live, its mirrors catching up first (registries with warm-up).
    Staged,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// `name@version`.
    pub label: String,
    /// Where it came from.
    pub origin: String,
    /// What became of it.
    pub outcome: Outcome,
    /// Why (rejections and rollbacks), or how it went live.
    pub reason: String,
    /// Seconds since the Unix epoch of the last change.
    pub at: f64,
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

    /// With warm-up: let the staged version catch up with `nodes` a step, and make it live when
    /// it has. Call from the scheduling loop before [`Registry::current`]; without a staged
    /// version this is an atomic load.
    pub fn warm(&self, nodes: &NodeTable) {
        let Some(max_changes) = self.warm_up else { return };
        if !self.staged.load(Ordering::Acquire) {
            return;
        }
        let Some(staged) = self.lock().staged.as_ref().map(|(v, _)| v.clone()) else { return };
        if !staged.set.catch_up(nodes, max_changes) {
            return;
        }
        let mut inner = self.lock();
        // Replaced by a newer one meanwhile: that one warms next time.
        if let Some((v, how)) = inner.staged.take_if(|(v, _)| Arc::ptr_eq(v, &staged)) {
            self.staged.store(false, Ordering::Release);
            let previous = self.go_live(&mut inner, v, &how);
            inner.retired.push(previous);
        }
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

    /// Whether the scheduling loop should hand over a cluster sample ([`Registry::offer_sample`]):
    /// one was asked for, or the last one is stale. An atomic load.
    pub fn wants_sample(&self) -> bool {
        self.sample_wanted.load(Ordering::Relaxed)
    }

    /// Keep a snapshot of the live cluster for smoke tests.
    pub fn offer_sample(&self, nodes: &NodeTable) {
        self.sample_wanted.store(false, Ordering::Relaxed);
        // A snapshot keeps the live table's identity: a version smoke-tested on it starts with
        // mirrors that need only the live table's later deltas.
        let snapshot = Arc::new(nodes.snapshot());
        let mut inner = self.lock();
        let tasks = inner.recent_tasks.iter().cloned().collect();
        inner.sample = Some((Sample { nodes: snapshot, tasks }, Instant::now()));
    }

    /// The sample a smoke test uses now: the last one offered (with the most recent tasks), else
    /// the synthetic one.
    pub fn sample(&self) -> Sample {
        self.sample_taken().0
    }

    /// [`Registry::sample`], and when the loop took it (`None`: the synthetic one).
    fn sample_taken(&self) -> (Sample, Option<Instant>) {
        let inner = self.lock();
        let taken = inner.sample.as_ref().map(|(_, at)| *at);
        let sample = match &inner.sample {
            Some((sample, at)) => {
                if at.elapsed() > SAMPLE_MAX_AGE {
                    self.sample_wanted.store(true, Ordering::Relaxed);
                }
                let mut sample = sample.clone();
                if !inner.recent_tasks.is_empty() {
                    sample.tasks = inner.recent_tasks.iter().rev().cloned().collect();
                }
                if sample.tasks.is_empty() {
                    sample.tasks = Sample::synthetic().tasks;
                }
                sample
            }
            None => Sample::synthetic(),
        };
        (sample, taken)
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

    /// Probation and baseline bookkeeping; rolls back when a window trips.
    fn watch(&self, inner: &mut Inner, used: &Arc<PolicyVersion>, d: &Decision<'_>, n: u64) {
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

    fn compare(
        &self,
        inner: &mut Inner,
        used: &Arc<PolicyVersion>,
        candidate: &Arc<PolicyVersion>,
        d: &Decision<'_>,
        shadow: &Result<Placement, Unschedulable>,
    ) {
        let Some(run) = &mut inner.shadow else { return };
        if run.candidate.version != candidate.version {
            return; // replaced while this decision was compared
        }
        run.compared += 1;
        let faulted = match shadow {
            Ok(p) => !p.skipped_faults.is_empty(),
            Err(u) => !u.diagnosis.faults.is_empty(),
        };
        run.faults += u64::from(faulted);
        let node = |r: &Result<Placement, Unschedulable>| r.as_ref().ok().map(|p| p.node);
        let (live_node, shadow_node) = (node(d.result), node(shadow));
        let live_score = d.result.as_ref().ok().map(|p| normalised(p.score, used));
        let shadow_score = shadow.as_ref().ok().map(|p| normalised(p.score, candidate));
        if let (Some(a), Some(b)) = (live_score, shadow_score) {
            run.both_placed += 1;
            run.score_delta_sum += (f64::from(a) - f64::from(b)).abs();
        }
        if live_node == shadow_node {
            run.identical += 1;
        } else if run.examples.len() < SHADOW_EXAMPLES {
            let name = |s: Option<u32>| s.and_then(|s| d.nodes.get(s)).map(|n| n.name.clone());
            run.examples.push(DecisionDiff {
                task: task_ref(d.task),
                live: name(live_node),
                shadow: name(shadow_node),
                live_score,
                shadow_score,
            });
        }
        let done = run.done();
        if done || run.compared - run.reported >= SHADOW_REPORT_EVERY {
            let report = PolicyShadowDiff {
                live: used.reference(),
                shadow: candidate.reference(),
                decisions: run.compared - run.reported,
                differing: run.compared - run.identical,
                mean_score_delta_milli: (run.stats().mean_score_delta * 1e3) as u64,
                shadow_faults: run.faults,
                examples: std::mem::take(&mut run.examples),
            };
            run.reported = run.compared;
            self.emit(Payload::PolicyShadowDiff(report));
        }
        if done {
            let run = inner.shadow.take().expect("a shadow run");
            match run.verdict() {
                Ok(()) if run.spec.auto_promote => self.swap_in(inner, run.candidate, "passed its shadow run"),
                Ok(()) => {
                    update_history(inner, &run.candidate, Outcome::Ready, "passed its shadow run; waits for promote");
                    inner.ready = Some(run.candidate);
                }
                Err(reason) => {
                    self.reject(inner, &run.candidate.label(), &run.candidate.origin, PrepareError::Shadow(reason))
                }
            }
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
                    reported: 0,
                });
            }
            None => self.swap_in(&mut inner, prepared, "prepared and smoke-tested"),
        }
        Ok(version)
    }

    /// Bring a prepared version's plugin mirrors up to the live cluster here, off the scheduling
    /// loop: they are synced to the sample it was smoke-tested on, as old as its preparation, and
    /// its first decisions would otherwise replay every change since. Only while the loop is
    /// deciding (decisions were recorded since the preparation began): a fresh sample is awaited
    /// ([`Registry::fresh_sample`]), else any sample newer than the one the preparation used
    /// (`taken`; `None`: the synthetic one) serves; an idle loop has no latency to protect.
    fn catch_up_to_live(&self, version: &PolicyVersion, taken: Option<Instant>, busy_before: u64) {
        if self.decisions.load(Ordering::Relaxed) == busy_before {
            return;
        }
        if let Some(nodes) = self.fresh_sample(taken) {
            version.set.catch_up_apart_from(&self.current().set, &nodes, usize::MAX);
        }
    }

    /// The same for a version prepared or used earlier (installed, promoted, rolled back to): its
    /// mirrors are as old as its last use, and its first live decision would replay every change
    /// since (or resend every node, once that is more than the table's log keeps). Plugins already
    /// at or past the sample's state skip it (no step back).
    fn catch_up_earlier_version(&self, version: &PolicyVersion) {
        if let Some(nodes) = self.fresh_sample(None) {
            version.set.catch_up_apart_from(&self.current().set, &nodes, usize::MAX);
        }
    }

    /// A sample the loop hands over from now on, awaited while it is deciding, at most
    /// [`FRESH_SAMPLE_WAIT`]; a loop that decides nothing within [`IDLE_LOOP_WAIT`] offers none
    /// and is not waited for. Failing that, the newest sample taken after `fallback_after` (`None`:
    /// any).
    fn fresh_sample(&self, fallback_after: Option<Instant>) -> Option<Arc<NodeTable>> {
        let busy_before = self.decisions.load(Ordering::Relaxed);
        let asked = Instant::now();
        self.sample_wanted.store(true, Ordering::Relaxed);
        let newer_than = |t: Option<Instant>| {
            let inner = self.lock();
            inner.sample.as_ref().filter(|(_, at)| t.is_none_or(|t| *at > t)).map(|(s, _)| s.nodes.clone())
        };
        loop {
            if let Some(nodes) = newer_than(Some(asked)) {
                return Some(nodes);
            }
            let waited = asked.elapsed();
            let idle = waited >= IDLE_LOOP_WAIT && self.decisions.load(Ordering::Relaxed) == busy_before;
            if idle || waited >= FRESH_SAMPLE_WAIT {
                return newer_than(fallback_after);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
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

/// The first threshold `stats` crosses, as a reason.
fn trip(spec: &RollbackSpec, stats: &WindowStats, baseline: Option<&WindowStats>) -> Option<String> {
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

fn push_history(inner: &mut Inner, v: &PolicyVersion, outcome: Outcome, reason: &str) {
    if inner.history.len() == HISTORY {
        inner.history.pop_back();
    }
    inner.history.push_front(HistoryEntry {
        label: v.label(),
        origin: v.origin.clone(),
        outcome,
        reason: reason.into(),
        at: now(),
    });
}

/// Update the most recent entry of `v` (or add one).
fn update_history(inner: &mut Inner, v: &PolicyVersion, outcome: Outcome, reason: &str) {
    let label = v.label();
    match inner.history.iter_mut().find(|h| h.label == label) {
        Some(h) => {
            h.outcome = outcome;
            h.reason = reason.into();
            h.at = now();
        }
        None => push_history(inner, v, outcome, reason),
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
