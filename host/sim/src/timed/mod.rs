//! Time-driven replay: jobs arrive at their times, wait in their queues, run for their durations
//! and leave, driven through the same [`SchedulerCore`] as production — queues with fair share and
//! quotas, gangs and elastic jobs, preemption with checkpoints — in virtual time (seconds).
//!
//! Evictions are graceful, as on Kubernetes: an evicted replica keeps its GPUs for its job's
//! `termination_seconds` (default 0) and its preemptor waits nominated until it has stopped
//! ([`CoreConfig::await_termination`] is always on here).
//!
//! The loop only advances to instants where something happens: an arrival, a departure, a
//! checkpoint finishing, an evicted replica stopping, or the core's own [`SchedulerCore::next_wakeup`] (a back-off ending, a
//! grace period or gang timeout running out). Waiting work is never polled: the core retries it
//! after the cluster changed. A run is deterministic for deterministic policies.
//!
//! Progress model: a job runs while at least `min_replicas` of its replicas do; it needs
//! `duration` seconds of that. Evicted below its minimum it stops; it keeps its progress only if it
//! checkpointed (`checkpoint_seconds`, within the grace period), else it starts over. Replicas
//! above the minimum (elastic) do not make it finish sooner.

mod metrics;
mod scenario;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use ahash::AHashMap;
use serde::Serialize;
use wasmsched_api::Task;
use wasmsched_core::{CoreConfig, Decision, EvictReason, NodeTable, PolicySet, QueueTree, SchedulerCore};
use wasmsched_plugin_gpu_share_score::{TypicalPod, typical_pods};

pub use metrics::QueueStats;
pub use scenario::{
    Amount, FlavorConfig, FlavorQuota, Job, Loaded, QueueConfig, Scenario, ScenarioNode, flat_queues, queue_tree,
    queue_tree_with,
};

/// FGD's target workload of a job list: its popular shapes covering 95 % of the jobs.
pub fn target_workload(jobs: &[Job]) -> Vec<TypicalPod> {
    typical_pods(jobs.iter().map(Job::spec), 95)
}

/// What happened to one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobOutcome {
    /// Queue.
    pub queue: String,
    /// Arrival (s).
    pub arrival: u64,
    /// First start (s): when its minimum of replicas first ran.
    pub start: Option<u64>,
    /// End (s), if it finished within the replay.
    pub end: Option<u64>,
    /// Times it was stopped by eviction.
    pub evictions: u32,
    /// Why it was not running at the end, if it was not (its last explanation).
    pub waiting_reason: Option<String>,
}

/// The result of a time-driven replay.
#[derive(Clone, Debug, Serialize)]
pub struct TimedRun {
    /// Per job, in input order.
    pub jobs: Vec<JobOutcome>,
    /// Per queue.
    pub queues: BTreeMap<String, QueueStats>,
    /// Jobs not started by the end, by reason.
    pub waiting_by_reason: BTreeMap<String, usize>,
    /// (time s, GPU allocation % of capacity) after each instant with events.
    pub utilisation: Vec<(u64, f64)>,
    /// Time-weighted mean GPU allocation (%) between the first and the last event.
    pub utilisation_mean: f64,
    /// Jain's fairness index over the queues' service ratios (1 = perfectly even).
    pub jain_fairness: f64,
    /// Decisions taken: bindings plus failed attempts (a measure of the scheduler's work).
    pub attempts: usize,
    /// Evictions (preemptions, broken gangs).
    pub evictions: usize,
    /// Gangs given up after their timeout.
    pub timed_out: usize,
    /// Plugin faults the cycle recovered from.
    pub faults: usize,
    /// Time of the last change (s): an arrival, departure, binding, eviction or timeout.
    pub horizon: u64,
}

/// Why a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The queues are inconsistent.
    #[error("queues: {0}")]
    Queues(String),
    /// A job the core refuses (its queue, its shape).
    #[error("job {job}: {reason}")]
    Job {
        /// The job.
        job: String,
        /// Why.
        reason: String,
    },
}

/// Replay `jobs` on a copy of `nodes` with `set`, queues `queues`, the core's default settings.
pub fn run(set: &PolicySet, nodes: &NodeTable, queues: &QueueTree, jobs: &[Job]) -> Result<TimedRun, ReplayError> {
    run_observed(&PolicyTimeline::new(set), nodes, queues, jobs, &CoreConfig::default(), |_| {})
}

/// The policy sets of a replay: the first from the start, each later one from its virtual time on
/// — a hot reload in the middle of a trace, replayed deterministically. As in production, a cycle
/// runs one set from start to end, and a set of another version retries parked work.
#[derive(Clone, Debug)]
pub struct PolicyTimeline<'a> {
    /// `(from, set)`, by `from`; the first is at 0.
    steps: Vec<(u64, &'a PolicySet)>,
}

impl<'a> PolicyTimeline<'a> {
    /// `initial` throughout.
    pub fn new(initial: &'a PolicySet) -> Self {
        PolicyTimeline { steps: vec![(0, initial)] }
    }

    /// `set` from virtual second `from` on (until a later change). Of two changes at the same
    /// second, the one added last wins.
    pub fn then_at(mut self, from: u64, set: &'a PolicySet) -> Self {
        let at = self.steps.partition_point(|&(t, _)| t <= from);
        self.steps.insert(at, (from, set));
        self
    }

    /// The set live at `now`.
    pub fn at(&self, now: u64) -> &'a PolicySet {
        let i = self.steps.partition_point(|&(t, _)| t <= now);
        self.steps[i.saturating_sub(1)].1
    }

    /// The first change after `now`.
    fn next_change_after(&self, now: u64) -> Option<u64> {
        let i = self.steps.partition_point(|&(t, _)| t <= now);
        self.steps.get(i).map(|&(t, _)| t)
    }
}

/// One decision of a time-driven replay, for observers (events, logs).
#[derive(Debug)]
pub struct TimedDecision<'a> {
    /// Virtual time of the decision, in seconds since the start of the replay.
    pub at: u64,
    /// What the core decided.
    pub decision: &'a Decision,
    /// The task it names, or the first member of the workload it names.
    pub task: Option<&'a Task>,
    /// The job it concerns (`None` for plugin faults).
    pub job: Option<&'a Job>,
    /// The cluster after the decision's cycle.
    pub nodes: &'a NodeTable,
    /// The version of the policy set that decided.
    pub policy_version: u64,
}

/// A job's state during the replay.
#[derive(Clone, Debug, Default)]
struct JobState {
    /// Replicas placed now.
    placed: u32,
    /// Since when it has run (at least its minimum of replicas), if it does.
    active_since: Option<u64>,
    /// Seconds of running kept from earlier stints (checkpointed).
    progress: u64,
    /// Bumped whenever a scheduled departure becomes stale.
    generation: u32,
    /// GPU milli-units its placed replicas hold.
    gpu_milli: u64,
    finished: bool,
}

/// Instants something is due, earliest first.
#[derive(Default)]
struct Agenda {
    /// (time, job, generation)
    departures: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// (time, task id)
    checkpoints: BinaryHeap<Reverse<(u64, String)>>,
    /// (time, task id, GPU milli-units it holds until then)
    terminations: BinaryHeap<Reverse<(u64, String, u64)>>,
}

/// [`run`] with the policy sets of `policies`, explicit core settings, calling `observe` after
/// every decision.
pub fn run_observed(
    policies: &PolicyTimeline<'_>,
    nodes: &NodeTable,
    queues: &QueueTree,
    jobs: &[Job],
    config: &CoreConfig,
    mut observe: impl FnMut(TimedDecision<'_>),
) -> Result<TimedRun, ReplayError> {
    let config = CoreConfig { await_termination: true, ..config.clone() };
    let mut core = SchedulerCore::new(queues.clone(), config.clone());
    *core.topologies_mut() = nodes.topologies().clone();
    let mut capacity = 0u64;
    for slot in nodes.slots() {
        if let Some(n) = nodes.get(slot) {
            capacity += n.allocatable.gpu_milli;
            core.upsert_node(n.clone(), 0);
        }
    }
    let by_name: AHashMap<&str, usize> = jobs.iter().enumerate().map(|(i, j)| (j.name.as_str(), i)).collect();
    let workloads: Vec<_> = jobs.iter().map(Job::workload).collect();
    let mut task_of: AHashMap<String, (usize, usize)> = AHashMap::new();
    for (j, w) in workloads.iter().enumerate() {
        for (m, t) in w.members.iter().enumerate() {
            task_of.insert(t.id.clone(), (j, m));
        }
    }
    let mut arrivals: Vec<usize> = (0..jobs.len()).collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival, i));
    let mut next_arrival = 0;
    let mut state = vec![JobState::default(); jobs.len()];
    let mut agenda = Agenda::default();
    let mut out: Vec<JobOutcome> = jobs
        .iter()
        .map(|j| JobOutcome {
            queue: j.queue.clone(),
            arrival: j.arrival,
            start: None,
            end: None,
            evictions: 0,
            waiting_reason: None,
        })
        .collect();
    let (mut used, mut attempts, mut evictions, mut timed_out, mut faults) = (0u64, 0usize, 0usize, 0usize, 0usize);
    let mut utilisation = Vec::new();
    let mut now = 0;
    let mut last_version = None;
    // When the policy set last changed (a rollout is a change for the core's wake-ups, not for
    // the horizon: retrying changes nothing by itself).
    let mut rollout = 0u64;
    // The core's wake-ups alone (back-offs of work that is not parked) end once nothing changes.
    let mut last_change = 0u64;
    let longest_timeout = jobs.iter().filter_map(|j| j.timeout).max().unwrap_or(0).max(config.gang_timeout_seconds);
    let idle_limit = longest_timeout.max(config.backoff_max_seconds).saturating_mul(2).max(60);
    loop {
        let external = [
            arrivals.get(next_arrival).map(|&i| jobs[i].arrival),
            agenda.departures.peek().map(|Reverse((t, _, _))| *t),
            agenda.checkpoints.peek().map(|Reverse((t, _))| *t),
            agenda.terminations.peek().map(|Reverse((t, _, _))| *t),
            policies.next_change_after(now),
        ]
        .into_iter()
        .flatten()
        .min();
        let wakeup = core
            .next_wakeup()
            .map(|t| t.max(now.saturating_add(1)))
            .filter(|&t| t <= last_change.max(rollout).saturating_add(idle_limit));
        now = match (external, wakeup) {
            (None, None) => break,
            (a, b) => a.unwrap_or(u64::MAX).min(b.unwrap_or(u64::MAX)),
        };

        let mut decisions: Vec<Decision> = Vec::new();
        while let Some(&Reverse((t, j, generation))) = agenda.departures.peek() {
            if t != now {
                break;
            }
            agenda.departures.pop();
            if state[j].generation == generation && !state[j].finished && core.finish(&jobs[j].name).is_ok() {
                used -= state[j].gpu_milli;
                state[j] = JobState { finished: true, ..JobState::default() };
                out[j].end = Some(now);
                last_change = now;
            }
        }
        while let Some(Reverse((t, _))) = agenda.checkpoints.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, task))) = agenda.checkpoints.pop() else { break };
            // Already evicted when its grace period ran out first: nothing to report.
            if let Ok(d) = core.checkpoint_done(&task, now) {
                decisions.extend(d);
            }
        }
        while let Some(Reverse((t, _, _))) = agenda.terminations.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, task, gpu_milli))) = agenda.terminations.pop() else { break };
            core.terminated(&task);
            used = used.saturating_sub(gpu_milli);
            last_change = now;
        }
        while let Some(&i) = arrivals.get(next_arrival) {
            if jobs[i].arrival != now {
                break;
            }
            next_arrival += 1;
            match core.submit(workloads[i].clone(), now) {
                Ok(()) => last_change = now,
                // Its queue's admission limits turned it away: it never waits; its outcome says why.
                Err(wasmsched_core::WorkloadError::Refused { reason, .. }) => {
                    out[i].waiting_reason = Some(format!("refused: {reason}"));
                }
                Err(e) => return Err(ReplayError::Job { job: jobs[i].name.clone(), reason: e.to_string() }),
            }
        }
        let set = policies.at(now);
        if last_version.replace(set.version()).is_some_and(|v| v != set.version()) {
            // The core retries work parked under the old set: its wake-ups count from here.
            rollout = now;
        }
        decisions.extend(core.schedule(set, now));

        for d in &decisions {
            let (task, job) = match d {
                Decision::Bound { task, .. }
                | Decision::Evicted { task, .. }
                | Decision::PreemptionRequested { task, .. } => match task_of.get(task) {
                    Some(&(j, m)) => (Some(&workloads[j].members[m]), Some(j)),
                    None => (None, None),
                },
                Decision::Unschedulable { workload, .. } | Decision::TimedOut { workload } => {
                    let j = by_name.get(workload.as_str()).copied();
                    (j.map(|j| &workloads[j].members[0]), j)
                }
                Decision::Fault(_) => (None, None),
            };
            match (d, job) {
                (Decision::Bound { .. }, Some(j)) => {
                    attempts += 1;
                    last_change = now;
                    let s = &mut state[j];
                    s.placed += 1;
                    s.gpu_milli += jobs[j].replica_gpu_milli();
                    used += jobs[j].replica_gpu_milli();
                    let min = workloads[j].min_member as u32;
                    if s.active_since.is_none() && s.placed >= min {
                        s.active_since = Some(now);
                        out[j].start.get_or_insert(now);
                        out[j].waiting_reason = None;
                        if let Some(d) = jobs[j].duration {
                            let left = d.saturating_sub(s.progress);
                            agenda.departures.push(Reverse((now.saturating_add(left), j, s.generation)));
                        }
                    }
                }
                (Decision::Evicted { reason, task, .. }, Some(j)) => {
                    evictions += 1;
                    last_change = now;
                    let s = &mut state[j];
                    s.placed = s.placed.saturating_sub(1);
                    s.gpu_milli = s.gpu_milli.saturating_sub(jobs[j].replica_gpu_milli());
                    // Its GPUs stay in use until it has stopped (a lost node's pods stop with it).
                    if matches!(reason, EvictReason::NodeLost) {
                        used = used.saturating_sub(jobs[j].replica_gpu_milli());
                    } else {
                        let at = now.saturating_add(jobs[j].termination_seconds.unwrap_or(0));
                        agenda.terminations.push(Reverse((at, task.clone(), jobs[j].replica_gpu_milli())));
                    }
                    if let Some(since) = s.active_since
                        && s.placed < workloads[j].min_member as u32
                    {
                        let kept = matches!(reason, EvictReason::Preempted { checkpointed: true, .. });
                        s.progress = if kept { s.progress + (now - since) } else { 0 };
                        s.active_since = None;
                        s.generation += 1;
                        out[j].evictions += 1;
                    }
                }
                (Decision::PreemptionRequested { task, deadline, .. }, Some(j)) => {
                    if let Some(c) = jobs[j].checkpoint_seconds
                        && now.saturating_add(c) < *deadline
                    {
                        agenda.checkpoints.push(Reverse((now.saturating_add(c), task.clone())));
                    }
                }
                (Decision::Unschedulable { explanation, .. }, Some(j)) => {
                    attempts += 1;
                    out[j].waiting_reason = Some(metrics::main_reason(explanation));
                }
                (Decision::TimedOut { .. }, Some(j)) => {
                    timed_out += 1;
                    last_change = now;
                    out[j].waiting_reason = Some(format!("gang timed out after {} s", now - jobs[j].arrival));
                    // Given up: forget it so its name and pods are free again.
                    let _ = core.finish(&jobs[j].name);
                }
                _ => {}
            }
            faults += d.faults().len();
            observe(TimedDecision {
                at: now,
                decision: d,
                task,
                job: job.map(|j| &jobs[j]),
                nodes: core.nodes(),
                policy_version: set.version(),
            });
        }
        let pct = if capacity > 0 { 100.0 * used as f64 / capacity as f64 } else { 0.0 };
        utilisation.push((now, pct));
    }
    // Retries that changed nothing after the last real change are not part of the replay.
    let horizon = last_change;
    utilisation.retain(|&(t, _)| t <= horizon);
    Ok(metrics::summarise(jobs, out, utilisation, metrics::Counts { attempts, evictions, timed_out, faults }, horizon))
}
