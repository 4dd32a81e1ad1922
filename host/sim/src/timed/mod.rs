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

mod dra;
mod effects;
mod fabric;
mod metrics;
mod runs;
mod scenario;

use std::cmp::Reverse;
use std::collections::BTreeMap;

use serde::Serialize;
use wasmsched_api::Task;
use wasmsched_api::fragmentation::{TypicalPod, typical_pods};
use wasmsched_core::{CoreConfig, Decision, NodeTable, PolicySet, QueueTree, SchedulerCore, carry_out};

use dra::Devices;
use effects::{Driver, JobState, Jobs, Progress};

pub use fabric::{Fabric, FabricStats};
pub use metrics::{QueueStats, mean, percentile, time_weighted_mean};
pub use runs::{QueueUsage, RunEnd};
pub use scenario::{
    Accelerator, AdmissionConfig, Amount, DraConfig, FlavorConfig, FlavorQuota, GangSlices, GangTopology, Job, Loaded,
    QueueConfig, Scenario, ScenarioNode, flat_queues, queue_tree, queue_tree_with,
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
    /// When it was given up (s): its gang after its timeout, or withdrawn at its `withdraw_at`.
    pub given_up: Option<u64>,
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
    /// The same between the first and the last arrival: while work comes in, before a trace's
    /// long tail of running jobs (which dominates the whole-run mean of a real trace).
    pub utilisation_mean_while_arriving: f64,
    /// The same over the instants when some job had arrived and not yet started (and was not given
    /// up): how much of the cluster the scheduler kept busy while work was waiting for it — the
    /// figure that says how well it packs. `None` when no job ever waited.
    pub utilisation_mean_while_waiting: Option<f64>,
    /// Jain's fairness index over the queues' service ratios (1 = perfectly even), at the end: in
    /// a replay where everything finishes every ratio is 1, so this says little; see
    /// `jain_fairness_while_backlogged`.
    pub jain_fairness: f64,
    /// Jain's index over the backlogged leaf queues' allocated / deserved GPU share, time-weighted
    /// over the instants when two or more queues had work waiting; `None` when that never
    /// happened.
    pub jain_fairness_while_backlogged: Option<f64>,
    /// Decisions taken: bindings plus failed attempts (a measure of the scheduler's work).
    pub attempts: usize,
    /// Pods evicted (preemptions, broken gangs): each member of an evicted gang counts. The
    /// queues' [`QueueStats::evictions`] count jobs' runs stopped instead.
    pub evictions: usize,
    /// Gang timeouts: each time a gang waited its timeout out unplaced (submitted again, or with
    /// [`ReplaySettings::drop_timed_out_gangs`] given up).
    pub timed_out: usize,
    /// Plugin faults the cycle recovered from.
    pub faults: usize,
    /// Time of the last change (s): an arrival, departure, binding, eviction or timeout.
    pub horizon: u64,
    /// What each queue's runs held, by the simulator's own count (runs still going on counted up
    /// to the horizon).
    pub usage: BTreeMap<String, QueueUsage>,
    /// How gangs and small jobs used the domains of [`ReplaySettings::fabric`], when set.
    pub fabric: Option<FabricStats>,
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

/// How a replay stands in for what surrounds the scheduler on a cluster: the core's settings, and
/// what becomes of a gang that times out.
#[derive(Clone, Debug, Default)]
pub struct ReplaySettings {
    /// The scheduler core's settings (its gang timeout among them).
    pub core: CoreConfig,
    /// A gang that times out leaves the replay. By default it is submitted again
    /// [`RESUBMIT_AFTER_SECONDS`] later, as `wasmsched run` does on Kubernetes, where a pod waits
    /// as long as it exists: dropping it makes the big jobs of a real trace vanish and every delay
    /// look better than it was.
    pub drop_timed_out_gangs: bool,
    /// The interconnect between nodes (a scenario's `fabric`): a gang spanning its domains runs
    /// slower, and the run reports how domains were used.
    pub fabric: Option<Fabric>,
}

/// How long after its timeout a gang is submitted again: the Kubernetes path's default.
pub const RESUBMIT_AFTER_SECONDS: u64 = 10;

impl From<CoreConfig> for ReplaySettings {
    fn from(core: CoreConfig) -> ReplaySettings {
        ReplaySettings { core, drop_timed_out_gangs: false, fabric: None }
    }
}

/// Replay `jobs` on a copy of `nodes` with `set`, queues `queues`, the core's default settings.
pub fn run(set: &PolicySet, nodes: &NodeTable, queues: &QueueTree, jobs: &[Job]) -> Result<TimedRun, ReplayError> {
    run_observed(&PolicyTimeline::new(set), nodes, queues, jobs, ReplaySettings::default(), |_| {})
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
    /// For a binding of a replica with DRA claims, the devices each claim was allocated.
    pub claims: &'a [wasmsched_dra::Allocation],
}

/// A run of a task that is over: what it held is free again.
#[derive(Debug)]
pub struct TimedRelease<'a> {
    /// When it was freed (virtual s).
    pub at: u64,
    /// The task.
    pub task: &'a Task,
    /// Its job.
    pub job: &'a Job,
    /// Its node.
    pub node: &'a str,
    /// The cluster now.
    pub nodes: &'a NodeTable,
    /// The GPUs it held.
    pub devices: &'a [wasmsched_api::DeviceShare],
    /// When it was placed (virtual s).
    pub started: u64,
    /// Why it ended.
    pub end: RunEnd,
    /// An evicted run's work survived: it checkpointed first, or its job went on without it.
    pub work_kept: bool,
}

/// What a replay shows its observer, in order.
#[derive(Debug)]
pub enum Observed<'a> {
    /// A decision of the core.
    Decision(TimedDecision<'a>),
    /// A run ended.
    Released(TimedRelease<'a>),
    /// The cluster as an instant's decisions and the runs they ended left it.
    Settled {
        /// Virtual seconds.
        at: u64,
        /// The nodes.
        nodes: &'a NodeTable,
        /// GPU milli-units allocated (what the replay's utilisation counts), and the capacity.
        allocated_milli: u64,
        /// GPU milli-units of the cluster: its GPUs and DRA devices.
        capacity_milli: u64,
    },
    /// The queues after an instant's cycle: allocation and deserved shares (virtual s).
    Shares(u64, &'a [wasmsched_core::QueueShare]),
    /// A job arrived (virtual s), before the core saw it: also one refused at once.
    Arrived(u64, &'a Job, &'a wasmsched_core::Workload),
    /// A job that had not started was withdrawn at its `withdraw_at` (virtual s).
    Withdrawn(u64, &'a Job, &'a wasmsched_core::Workload),
}

/// [`run`] with the policy sets of `policies`, explicit core settings, calling `observe` after
/// every decision.
pub fn run_observed(
    policies: &PolicyTimeline<'_>,
    nodes: &NodeTable,
    queues: &QueueTree,
    jobs: &[Job],
    settings: impl Into<ReplaySettings>,
    mut observe: impl FnMut(TimedDecision<'_>),
) -> Result<TimedRun, ReplayError> {
    run_with_devices(policies, nodes, None, queues, jobs, settings, |o| {
        if let Observed::Decision(d) = o {
            observe(d)
        }
    })
}

/// Job `j`, whose first replicas run on `running_on` when it arrives: taken over there, as a
/// scheduler takes over the pods it finds running (`SchedulerCore::adopt`), each replica on the
/// first GPUs of its node with room for it.
fn take_over(
    core: &mut SchedulerCore,
    lookup: &Jobs<'_>,
    progress: &mut Progress,
    j: usize,
    now: u64,
) -> Result<(), ReplayError> {
    let job = &lookup.jobs[j];
    let refused = |reason: String| ReplayError::Job { job: job.name.clone(), reason };
    let workload = lookup.workloads[j].clone();
    let mut placed: Vec<(String, String, Vec<wasmsched_api::DeviceShare>)> = Vec::new();
    for (node, task) in job.running_on.iter().zip(&workload.members) {
        let devices = free_devices(core.nodes(), node, task, &placed)
            .ok_or_else(|| refused(format!("it runs on {node}, which has no node of that name or no room for it")))?;
        placed.push((task.id.clone(), node.clone(), devices));
    }
    core.adopt(workload, &placed, now).map_err(|e| refused(e.to_string()))?;
    let mut driver = Driver { jobs: lookup, progress, core, now, resubmit_after: None };
    for (task, node, devices) in &placed {
        driver.taken_over(task, node, devices);
    }
    Ok(())
}

/// Job `j`'s pods deleted at `now` (its `withdraw_at`): if it waits — in the core's queue, or to
/// be submitted again after a gang timeout — it is given up, and what part of its gang holds
/// goes back. Whether it was withdrawn: a job running then runs on; one refused never waited.
fn withdraw(
    core: &mut SchedulerCore,
    lookup: &Jobs<'_>,
    p: &mut Progress,
    devices: Option<&mut Devices>,
    j: usize,
    now: u64,
) -> bool {
    let job = &lookup.jobs[j];
    let s = &p.state[j];
    if s.active_since.is_some() || s.finished || p.out[j].given_up.is_some() {
        return false;
    }
    let resubmitting = p.agenda.resubmissions.iter().any(|Reverse((_, k))| *k == j);
    if core.finish(&job.name).is_err() && !resubmitting {
        return false;
    }
    if let Some(d) = devices {
        job.task_ids().iter().for_each(|t| d.release(t));
    }
    for member in &lookup.workloads[j].members {
        p.runs.finish(&member.id, now, runs::RunEnd::Evicted);
    }
    p.used = p.used.saturating_sub(s.gpu_milli);
    p.state[j] = JobState { finished: true, ..JobState::default() };
    p.out[j].given_up = Some(now);
    p.out[j].waiting_reason = Some("withdrawn while it waited (its pods were deleted)".into());
    p.last_change = now;
    true
}

/// The first GPUs of `node` with room for one replica `task` (after those `chosen` already there).
fn free_devices(
    nodes: &NodeTable,
    node: &str,
    task: &Task,
    chosen: &[(String, String, Vec<wasmsched_api::DeviceShare>)],
) -> Option<Vec<wasmsched_api::DeviceShare>> {
    let n = nodes.get(nodes.slot_of(node)?)?;
    let (count, milli) = (task.gpu.count as usize, task.gpu.milli_per_gpu);
    if count == 0 {
        return Some(Vec::new());
    }
    let taken = |gpu: u32| -> u32 {
        chosen
            .iter()
            .filter(|(_, on, _)| on == node)
            .flat_map(|(_, _, d)| d)
            .filter(|d| d.gpu == gpu)
            .map(|d| d.milli)
            .sum()
    };
    let picks: Vec<wasmsched_api::DeviceShare> = n
        .gpus
        .iter()
        .filter(|g| {
            g.health != wasmsched_api::GpuHealth::Unhealthy && g.free_milli.saturating_sub(taken(g.index)) >= milli
        })
        .take(count)
        .map(|g| wasmsched_api::DeviceShare { gpu: g.index, milli })
        .collect();
    (picks.len() == count).then_some(picks)
}

/// Show the runs that ended to `observe`, then bill them.
fn report_released(
    progress: &mut Progress,
    lookup: &Jobs<'_>,
    jobs: &[Job],
    nodes: &NodeTable,
    observe: &mut impl FnMut(Observed<'_>),
) {
    for e in &progress.runs.ended {
        let Some(task) = lookup.task(&e.task) else { continue };
        observe(Observed::Released(TimedRelease {
            at: e.at,
            task,
            job: &jobs[e.run.job],
            node: &e.run.node,
            nodes,
            devices: &e.run.devices,
            started: e.run.started,
            end: e.end,
            work_kept: e.work_kept,
        }));
    }
    progress.runs.bill(lookup);
}

/// [`run_observed`] on a cluster whose nodes also offer the DRA devices of `dra` (ResourceSlices
/// and DeviceClasses), for jobs with `claims`; `observe` sees every decision and every run that
/// ended.
pub fn run_with_devices(
    policies: &PolicyTimeline<'_>,
    nodes: &NodeTable,
    dra: Option<&wasmsched_dra::Objects>,
    queues: &QueueTree,
    jobs: &[Job],
    settings: impl Into<ReplaySettings>,
    mut observe: impl FnMut(Observed<'_>),
) -> Result<TimedRun, ReplayError> {
    let settings = settings.into();
    let config = CoreConfig { await_termination: true, ..settings.core.clone() };
    let mut core = SchedulerCore::new(queues.clone(), config.clone());
    *core.topologies_mut() = nodes.topologies().clone();
    core.set_levels(nodes.domains().levels().to_vec());
    core.set_accelerator_kinds(nodes.accelerators().kinds().to_vec());
    let mut devices = dra.map(|objects| Devices::new(objects, nodes));
    let mut capacity = 0u64;
    for slot in nodes.slots() {
        if let Some(n) = nodes.get(slot) {
            // Every accelerator counts: NVIDIA's in gpu-milli, another kind's by its devices.
            let others = n.gpus.iter().filter(|g| !g.kind.is_empty()).count() as u64;
            capacity += n.allocatable.gpu_milli + others * u64::from(wasmsched_api::GPU_MILLI);
            let mut n = n.clone();
            if let Some(d) = devices.as_mut() {
                n.allocatable.saturating_add_assign(&d.capacity(&n.name));
                capacity += d.device_milli(&n.name);
            }
            core.upsert_node(n, 0);
        }
    }
    let mut lookup = Jobs::new(jobs);
    let mut progress = Progress::new(jobs);
    progress.fabric = settings.fabric.as_ref().map(|f| fabric::FabricModel::new(f, nodes, jobs.len()));
    // Jobs with claims go only where their claims could ever be served; one that fits nowhere
    // never waits, and says why.
    let mut never = vec![false; jobs.len()];
    if let Some(d) = devices.as_mut() {
        for (j, job) in jobs.iter().enumerate().filter(|(_, j)| !j.claims.is_empty()) {
            match d.feasible(job) {
                Ok(fit) => restrict_to(&mut lookup.workloads[j], fit, nodes),
                Err(reason) => {
                    progress.out[j].waiting_reason = Some(format!("refused: {reason}"));
                    never[j] = true;
                }
            }
        }
    }
    // A replica no node could hold even empty is refused at arrival, not left to wait forever
    // as if the cluster were only busy.
    for (j, workload) in lookup.workloads.iter().enumerate() {
        if !never[j]
            && let Some(reason) = workload.members.first().and_then(|task| never_fits(task, nodes))
        {
            progress.out[j].waiting_reason = Some(format!("refused: {reason}"));
            never[j] = true;
        }
    }
    let mut arrivals: Vec<usize> = (0..jobs.len()).filter(|&j| !never[j]).collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival, i));
    let mut next_arrival = 0;
    // Jobs refused before they arrive are shown arriving all the same, at the first instant at or
    // after their arrival (they add no instant of their own: that would change the replay).
    let mut refused: Vec<usize> = (0..jobs.len()).filter(|&j| never[j]).collect();
    refused.sort_by_key(|&i| (Reverse(jobs[i].arrival), Reverse(i)));
    // Jobs to withdraw, the next last.
    let mut withdrawals: Vec<usize> = (0..jobs.len()).filter(|&j| !never[j] && jobs[j].withdraw_at.is_some()).collect();
    withdrawals.sort_by_key(|&j| (Reverse(jobs[j].withdraw_at), Reverse(j)));
    let mut utilisation = Vec::new();
    let mut fairness = metrics::FairnessOverTime::default();
    let mut now = 0;
    let mut last_version = None;
    // When the policy set last changed (a rollout is a change for the core's wake-ups, not for
    // the horizon: retrying changes nothing by itself).
    let mut rollout = 0u64;
    let longest_timeout = jobs.iter().filter_map(|j| j.timeout).max().unwrap_or(0).max(config.gang_timeout_seconds);
    let idle_limit = longest_timeout.max(config.backoff_max_seconds).saturating_mul(2).max(60);
    loop {
        let external = [
            arrivals.get(next_arrival).map(|&i| jobs[i].arrival),
            progress.agenda.departures.peek().map(|Reverse((t, _, _))| *t),
            progress.agenda.checkpoints.peek().map(|Reverse((t, _))| *t),
            progress.agenda.terminations.peek().map(|Reverse((t, _, _))| *t),
            policies.next_change_after(now),
            withdrawals.last().and_then(|&j| jobs[j].withdraw_at),
        ]
        .into_iter()
        .flatten()
        .min();
        let quiet_until = progress.last_change.max(rollout).saturating_add(idle_limit);
        // The core's wake-ups alone (back-offs of work that is not parked), and gangs submitted
        // again after a timeout, end once nothing changes.
        let wakeup = [
            core.next_wakeup().map(|t| t.max(now.saturating_add(1))),
            progress.agenda.resubmissions.peek().map(|Reverse((t, _))| *t),
        ]
        .into_iter()
        .flatten()
        .min()
        .filter(|&t| t <= quiet_until);
        let before = now;
        now = match (external, wakeup) {
            (None, None) => break,
            (a, b) => a.unwrap_or(u64::MAX).min(b.unwrap_or(u64::MAX)),
        };
        debug_assert!(now >= before, "the replay's clock went back from {before} to {now}");

        let mut decisions: Vec<Decision> = Vec::new();
        let p = &mut progress;
        while let Some(&Reverse((t, j, generation))) = p.agenda.departures.peek() {
            if t != now {
                break;
            }
            p.agenda.departures.pop();
            if p.state[j].generation == generation && !p.state[j].finished && core.finish(&jobs[j].name).is_ok() {
                if let Some(d) = devices.as_mut() {
                    jobs[j].task_ids().iter().for_each(|t| d.release(t));
                }
                p.used -= p.state[j].gpu_milli;
                for member in &lookup.workloads[j].members {
                    p.runs.finish(&member.id, now, runs::RunEnd::Completed);
                }
                p.state[j] = JobState { finished: true, ..JobState::default() };
                p.out[j].end = Some(now);
                p.last_change = now;
            }
        }
        while let Some(Reverse((t, _))) = p.agenda.checkpoints.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, task))) = p.agenda.checkpoints.pop() else { break };
            // Already evicted when its grace period ran out first: nothing to report.
            if let Ok(d) = core.checkpoint_done(&task, now) {
                decisions.extend(d);
            }
        }
        while let Some(Reverse((t, _, _))) = p.agenda.terminations.peek() {
            if *t != now {
                break;
            }
            let Some(Reverse((_, task, gpu_milli))) = p.agenda.terminations.pop() else { break };
            core.terminated(&task);
            if let Some(d) = devices.as_mut() {
                d.release(&task);
            }
            p.used = p.used.saturating_sub(gpu_milli);
            p.runs.stopped(&task, now);
            p.last_change = now;
        }
        report_released(p, &lookup, jobs, core.nodes(), &mut observe);
        while let Some(i) = refused.pop_if(|&mut i| jobs[i].arrival <= now) {
            observe(Observed::Arrived(jobs[i].arrival, &jobs[i], &lookup.workloads[i]));
        }
        while let Some(&i) = arrivals.get(next_arrival) {
            if jobs[i].arrival != now {
                break;
            }
            next_arrival += 1;
            observe(Observed::Arrived(now, &jobs[i], &lookup.workloads[i]));
            if !jobs[i].running_on.is_empty() {
                take_over(&mut core, &lookup, p, i, now)?;
                continue;
            }
            match core.submit(lookup.workloads[i].clone(), now) {
                Ok(()) => p.last_change = now,
                // Its queue's admission limits turned it away: it never waits; its outcome says why.
                Err(wasmsched_core::WorkloadError::Refused { reason, .. }) => {
                    p.out[i].waiting_reason = Some(format!("refused: {reason}"));
                }
                Err(e) => return Err(ReplayError::Job { job: jobs[i].name.clone(), reason: e.to_string() }),
            }
        }
        // A resubmission falls due while nothing changes only up to the quiet limit (below); one
        // due in a quiet stretch the replay skipped happens at the next instant, not in the past.
        while let Some(&Reverse((t, j))) = p.agenda.resubmissions.peek() {
            if t > now {
                break;
            }
            p.agenda.resubmissions.pop();
            // Withdrawn while it waited to be submitted again: gone.
            if p.out[j].given_up.is_some() {
                continue;
            }
            // Its earlier incarnation was forgotten at its timeout; a refusal now is reported as
            // at arrival.
            if let Err(e) = core.submit(lookup.workloads[j].clone(), now) {
                p.out[j].waiting_reason = Some(format!("refused: {e}"));
            }
        }
        while let Some(j) = withdrawals.pop_if(|&mut j| jobs[j].withdraw_at.is_some_and(|t| t <= now)) {
            if withdraw(&mut core, &lookup, p, devices.as_mut(), j, now) {
                observe(Observed::Withdrawn(now, &jobs[j], &lookup.workloads[j]));
            }
        }
        if let Some(d) = devices.as_mut() {
            for j in d.take_forgiven() {
                let spec = &lookup.workloads[j];
                let waiting = waiting_replicas(&core, spec);
                let _ = retake(&mut core, spec, waiting.as_deref(), now);
            }
        }
        let set = policies.at(now);
        if last_version.replace(set.version()).is_some_and(|v| v != set.version()) {
            // The core retries work parked under the old set: its wake-ups count from here.
            rollout = now;
        }
        decisions.extend(core.schedule(set, now));
        if let Some(d) = devices.as_mut() {
            claims_where_placed(&mut decisions, d, &mut core, set, &lookup, &mut progress, now);
        }

        for d in &decisions {
            if let (Some(dev), Decision::Evicted { task, reason: wasmsched_core::EvictReason::NodeLost, .. }) =
                (devices.as_mut(), d)
            {
                dev.release(task);
            }
            let mut driver = Driver {
                jobs: &lookup,
                progress: &mut progress,
                core: &mut core,
                now,
                resubmit_after: (!settings.drop_timed_out_gangs).then_some(RESUBMIT_AFTER_SECONDS),
            };
            carry_out(d, &mut driver);
            progress.counts.faults += d.faults().len();
            let (task, job) = lookup.of(d);
            let claims = match (d, devices.as_ref()) {
                (Decision::Bound { task, .. }, Some(dev)) => dev.held_by(task).unwrap_or_default(),
                _ => &[],
            };
            observe(Observed::Decision(TimedDecision {
                claims,
                at: now,
                decision: d,
                task,
                job: job.map(|j| &jobs[j]),
                nodes: core.nodes(),
                policy_version: set.version(),
            }));
            report_released(&mut progress, &lookup, jobs, core.nodes(), &mut observe);
        }
        let shares = core.queue_shares();
        let tasks = core.queue_tasks();
        let leaves: Vec<(String, u64, Option<u64>, usize)> = (0..shares.len())
            .filter(|&i| queues.is_leaf(i))
            .map(|i| {
                let q = &shares[i];
                (q.name.clone(), q.allocated.gpu_milli, q.deserved.as_ref().map(|d| d.gpu_milli), tasks[i].0)
            })
            .collect();
        fairness.sample(now, &leaves);
        let pct = if capacity > 0 { 100.0 * progress.used as f64 / capacity as f64 } else { 0.0 };
        if let Some(f) = progress.fabric.as_mut() {
            f.sample(now, core.nodes(), &progress.runs.holders(), jobs);
        }
        observe(Observed::Settled {
            at: now,
            nodes: core.nodes(),
            allocated_milli: progress.used,
            capacity_milli: capacity,
        });
        observe(Observed::Shares(now, &shares));
        utilisation.push((now, pct));
    }
    while let Some(i) = refused.pop() {
        observe(Observed::Arrived(jobs[i].arrival, &jobs[i], &lookup.workloads[i]));
    }
    // Retries that changed nothing after the last real change are not part of the replay.
    let horizon = progress.last_change;
    utilisation.retain(|&(t, _)| t <= horizon);
    let usage = progress.runs.usage_until(horizon, &lookup);
    let fabric = progress.fabric.as_ref().map(|f| f.stats(jobs, &progress.out, horizon));
    let mut run = metrics::summarise(jobs, progress.out, utilisation, progress.counts, fairness, horizon);
    run.usage = usage;
    run.fabric = fabric;
    Ok(run)
}

/// Restricts a job's replicas to the nodes `fit` (by name), unless that is every node.
fn restrict_to(workload: &mut wasmsched_core::Workload, fit: Vec<String>, nodes: &NodeTable) {
    if fit.len() >= nodes.len() {
        return;
    }
    let fit_set: std::collections::BTreeSet<&str> = fit.iter().map(String::as_str).collect();
    let others: Vec<String> = nodes
        .slots()
        .filter_map(|s| nodes.get(s))
        .map(|n| n.name.clone())
        .filter(|n| !fit_set.contains(n.as_str()))
        .collect();
    // The shorter list of the two.
    let (operator, names) = if others.len() < fit.len() {
        (wasmsched_api::SelectorOperator::NotIn, others)
    } else {
        (wasmsched_api::SelectorOperator::In, fit)
    };
    for task in &mut workload.members {
        dra::restrict(task, operator, names.clone());
    }
}

/// Allocates the claims of every replica the cycle placed, on its node, workload by workload; a
/// workload whose claims cannot all be served places nothing this cycle: its placements leave
/// `decisions` and the core, and it waits again, kept off that node until devices are freed.
fn claims_where_placed(
    decisions: &mut Vec<Decision>,
    devices: &mut Devices,
    core: &mut SchedulerCore,
    set: &PolicySet,
    lookup: &Jobs<'_>,
    progress: &mut Progress,
    now: u64,
) {
    let mut reserved: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut refused: BTreeMap<String, (String, String)> = BTreeMap::new();
    for d in decisions.iter() {
        let Decision::Bound { workload, task, node, .. } = d else { continue };
        if refused.contains_key(workload) {
            continue;
        }
        let Some(j) = lookup.job_of_task(task) else { continue };
        if lookup.jobs[j].claims.is_empty() {
            continue;
        }
        let Some(spec) = lookup.task(task) else { continue };
        let nodes = core.nodes();
        let mut rank = |request: &wasmsched_api::ClaimRequest| set.rank_claim_devices(nodes, spec, node, request);
        let rank: Option<&mut wasmsched_dra::allocator::Rank> =
            if set.ranks_claim_devices() { Some(&mut rank) } else { None };
        match devices.reserve(task, &lookup.jobs[j], node, rank) {
            Ok(()) => reserved.entry(workload).or_default().push(task),
            Err(reason) => {
                for t in reserved.remove(workload.as_str()).unwrap_or_default() {
                    devices.release_reserved(t);
                }
                refused.insert(workload.clone(), (node.clone(), reason));
            }
        }
    }
    if refused.is_empty() {
        return;
    }
    let placed_now = |w: &str| -> Vec<String> {
        decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Bound { workload, task, .. } if workload == w => Some(task.clone()),
                _ => None,
            })
            .collect()
    };
    for (workload, (node, reason)) in &refused {
        let Some(j) = lookup.job_of_workload(workload) else { continue };
        let now_placed = placed_now(workload);
        let before =
            core.members_of(workload).is_some_and(|mut m| m.any(|(t, placed)| placed && !now_placed.contains(&t.id)));
        let avoid = devices.avoid(j, node);
        let mut again = lookup.workloads[j].clone();
        for task in &mut again.members {
            dra::restrict(task, wasmsched_api::SelectorOperator::NotIn, avoid.clone());
        }
        // Placed before this cycle: it runs, and only the replicas placed now wait again.
        let replicas = before.then_some(now_placed);
        progress.out[j].waiting_reason = Some(match retake(core, &again, replicas.as_deref(), now) {
            Ok(()) => format!("its DRA claims could not be allocated: {reason}"),
            Err(e) => format!("refused: {e}"),
        });
    }
    decisions.retain(|d| !matches!(d, Decision::Bound { workload, .. } if refused.contains_key(workload)));
}

/// Puts waiting replicas back in the core as `spec` has them now (another node affinity):
/// `replicas` leave the running workload and come back as new members; `None`: none of it runs,
/// and the whole workload is submitted again.
fn retake(
    core: &mut SchedulerCore,
    spec: &wasmsched_core::Workload,
    replicas: Option<&[String]>,
    now: u64,
) -> Result<(), wasmsched_core::WorkloadError> {
    match replicas {
        Some(waiting) => {
            for t in waiting {
                let _ = core.remove_task(t);
            }
            let members = spec.members.iter().filter(|m| waiting.contains(&m.id)).cloned().collect();
            core.add_members(&spec.name, members)
        }
        // Not in the core (finished, given up): nothing waits.
        None if core.finish(&spec.name).is_err() => Ok(()),
        None => core.submit(spec.clone(), now),
    }
}

/// `spec`'s replicas that wait, when some of it runs (`None` when none does).
fn waiting_replicas(core: &SchedulerCore, spec: &wasmsched_core::Workload) -> Option<Vec<String>> {
    let members: Vec<(String, bool)> =
        core.members_of(&spec.name).into_iter().flatten().map(|(t, placed)| (t.id.clone(), placed)).collect();
    members.iter().any(|(_, placed)| *placed).then(|| members.into_iter().filter(|(_, p)| !p).map(|(t, _)| t).collect())
}

/// Why no node of `nodes` could ever hold `task`, even with nothing else on it; None when one
/// could. Only what a node has counts here (GPUs, their model and memory, CPU and memory), not its
/// labels or taints: those a cluster's operator may change.
fn never_fits(task: &Task, nodes: &NodeTable) -> Option<String> {
    let gpu = &task.gpu;
    let (mut most_gpus, mut most_cpu, mut most_memory) = (0u32, 0u64, 0u64);
    for node in nodes.slots().filter_map(|s| nodes.get(s)) {
        let gpus = node
            .gpus
            .iter()
            .filter(|g| {
                g.health != wasmsched_api::GpuHealth::Unhealthy
                    && gpu.allows_model(&g.model)
                    && g.memory_bytes >= gpu.memory_bytes_per_gpu
            })
            .count() as u32;
        let (cpu, memory) = (node.allocatable.cpu_milli, node.allocatable.memory_bytes);
        if gpus >= gpu.count && cpu >= task.request.cpu_milli && memory >= task.request.memory_bytes {
            return None;
        }
        most_gpus = most_gpus.max(gpus);
        most_cpu = most_cpu.max(cpu);
        most_memory = most_memory.max(memory);
    }
    let mut why = Vec::new();
    if gpu.count > most_gpus {
        let kind = if gpu.models.is_empty() { String::new() } else { format!(" ({})", gpu.models.join(" or ")) };
        why.push(format!("{} GPUs{kind} on one node, and no node has more than {most_gpus}", gpu.count));
    }
    if task.request.cpu_milli > most_cpu {
        why.push(format!("{} milli-CPU, and no node has more than {most_cpu}", task.request.cpu_milli));
    }
    if task.request.memory_bytes > most_memory {
        why.push(format!(
            "{} MiB of memory, and no node has more than {}",
            task.request.memory_bytes >> 20,
            most_memory >> 20
        ));
    }
    if why.is_empty() {
        why.push("no single node has all it asks for at once".into());
    }
    Some(format!("no node could ever hold one replica: it asks {}", why.join("; ")))
}
