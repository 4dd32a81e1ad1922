//! The replay's effects: what each of the core's decisions does to the jobs — replicas placed and
//! stopped, departures and checkpoints put on the agenda, the counts the report gives. The
//! Kubernetes loop carries out the same decisions through the same [`Effects`] trait.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ahash::AHashMap;
use wasmsched_api::{DeviceShare, Task};
use wasmsched_core::{Decision, Effects, EvictReason, Explanation, PluginFault, SchedulerCore, Workload};

use super::fabric::FabricModel;
use super::metrics::{self, Counts};
use super::runs::{Run, RunEnd, Runs};
use super::{Job, JobOutcome};

/// A job's state during the replay.
#[derive(Clone, Debug, Default)]
pub(super) struct JobState {
    /// Replicas placed now.
    pub(super) placed: u32,
    /// Since when it has run (at least its minimum of replicas), if it does.
    pub(super) active_since: Option<u64>,
    /// Seconds of running kept from earlier stints (checkpointed).
    pub(super) progress: u64,
    /// Bumped whenever a scheduled departure becomes stale.
    pub(super) generation: u32,
    /// GPU milli-units its placed replicas hold.
    pub(super) gpu_milli: u64,
    pub(super) finished: bool,
    /// When it last stopped below its minimum: whether its progress was kept (checkpointed).
    pub(super) stopped_with_work: bool,
    /// How much slower than its duration it runs now, in thousandths (0 before it runs: as 1000);
    /// more than 1000 when it spans domains of a slow fabric ([`super::fabric`]).
    pub(super) slowdown_milli: u64,
}

/// Instants something is due, earliest first.
#[derive(Default)]
pub(super) struct Agenda {
    /// (time, job, generation)
    pub(super) departures: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// (time, task id)
    pub(super) checkpoints: BinaryHeap<Reverse<(u64, String)>>,
    /// (time, task id, GPU milli-units it holds until then)
    pub(super) terminations: BinaryHeap<Reverse<(u64, String, u64)>>,
    /// (time, job): gangs that timed out, submitted again then.
    pub(super) resubmissions: BinaryHeap<Reverse<(u64, usize)>>,
}

/// The jobs and their workloads, and which job a task or workload belongs to.
pub(super) struct Jobs<'a> {
    pub(super) jobs: &'a [Job],
    pub(super) workloads: Vec<Workload>,
    by_name: AHashMap<&'a str, usize>,
    task_of: AHashMap<String, (usize, usize)>,
}

impl<'a> Jobs<'a> {
    pub(super) fn new(jobs: &'a [Job]) -> Jobs<'a> {
        let by_name = jobs.iter().enumerate().map(|(i, j)| (j.name.as_str(), i)).collect();
        let workloads: Vec<_> = jobs.iter().map(Job::workload).collect();
        let mut task_of = AHashMap::new();
        for (j, w) in workloads.iter().enumerate() {
            for (m, t) in w.members.iter().enumerate() {
                task_of.insert(t.id.clone(), (j, m));
            }
        }
        Jobs { jobs, workloads, by_name, task_of }
    }

    /// The task a decision names (or the first member of the workload it names) and its job.
    pub(super) fn of(&self, d: &Decision) -> (Option<&Task>, Option<usize>) {
        match d {
            Decision::Bound { task, .. }
            | Decision::Evicted { task, .. }
            | Decision::PreemptionRequested { task, .. } => match self.task_of.get(task) {
                Some(&(j, m)) => (Some(&self.workloads[j].members[m]), Some(j)),
                None => (None, None),
            },
            Decision::Unschedulable { workload, .. } | Decision::TimedOut { workload } => {
                let j = self.by_name.get(workload.as_str()).copied();
                (j.map(|j| &self.workloads[j].members[0]), j)
            }
            Decision::Fault(_) => (None, None),
        }
    }

    /// The task with id `task`.
    pub(super) fn task(&self, task: &str) -> Option<&Task> {
        self.task_of.get(task).map(|&(j, m)| &self.workloads[j].members[m])
    }

    pub(super) fn job_of_task(&self, task: &str) -> Option<usize> {
        self.task_of.get(task).map(|&(j, _)| j)
    }

    pub(super) fn job_of_workload(&self, workload: &str) -> Option<usize> {
        self.by_name.get(workload).copied()
    }
}

/// Everything the replay keeps about its jobs while it runs.
pub(super) struct Progress {
    pub(super) state: Vec<JobState>,
    pub(super) agenda: Agenda,
    pub(super) out: Vec<JobOutcome>,
    pub(super) counts: Counts,
    /// GPU milli-units in use (evicted replicas until they stop).
    pub(super) used: u64,
    /// The last instant the cluster changed.
    pub(super) last_change: u64,
    /// Every task's runs, and the usage they billed.
    pub(super) runs: Runs,
    /// The interconnect, when the scenario models one.
    pub(super) fabric: Option<FabricModel>,
}

impl Progress {
    pub(super) fn new(jobs: &[Job]) -> Progress {
        let out = jobs
            .iter()
            .map(|j| JobOutcome {
                queue: j.queue.clone(),
                arrival: j.arrival,
                start: None,
                end: None,
                given_up: None,
                evictions: 0,
                waiting_reason: None,
            })
            .collect();
        Progress {
            state: vec![JobState::default(); jobs.len()],
            agenda: Agenda::default(),
            out,
            counts: Counts { attempts: 0, evictions: 0, timed_out: 0, faults: 0 },
            used: 0,
            last_change: 0,
            runs: Runs::default(),
            fabric: None,
        }
    }
}

/// The core's decisions of one instant, carried out on the replay's jobs.
pub(super) struct Driver<'a, 'j> {
    pub(super) jobs: &'a Jobs<'j>,
    pub(super) progress: &'a mut Progress,
    pub(super) core: &'a mut SchedulerCore,
    pub(super) now: u64,
    /// After how long a gang that timed out is submitted again; None: it is given up
    /// ([`super::ReplaySettings`]).
    pub(super) resubmit_after: Option<u64>,
}

impl Driver<'_, '_> {
    /// Replica `task` of a job taken over where it runs (`running_on`): placed, as a bind places
    /// it, without an attempt of the core's.
    pub(super) fn taken_over(&mut self, task: &str, node: &str, devices: &[DeviceShare]) {
        self.placed(task, node, devices);
    }

    /// Replica `task` runs on `node` from now: its run starts, and its job once its minimum runs.
    fn placed(&mut self, task: &str, node: &str, devices: &[DeviceShare]) {
        let Some(j) = self.jobs.job_of_task(task) else { return };
        let (job, workload, now, p) = (&self.jobs.jobs[j], &self.jobs.workloads[j], self.now, &mut *self.progress);
        p.runs.start(task, Run { job: j, node: node.to_owned(), devices: devices.to_vec(), started: now });
        p.last_change = now;
        let s = &mut p.state[j];
        s.placed += 1;
        s.gpu_milli += job.replica_gpu_milli();
        p.used += job.replica_gpu_milli();
        let min = workload.min_member as u32;
        if s.active_since.is_none() && s.placed >= min {
            s.active_since = Some(now);
            p.out[j].start.get_or_insert(now);
            p.out[j].waiting_reason = None;
            s.slowdown_milli = match p.fabric.as_mut() {
                Some(f) if job.replicas > 1 => {
                    let ids = job.task_ids();
                    let nodes: Vec<&str> = ids.iter().filter_map(|t| p.runs.node_of(t)).collect();
                    f.started(j, &nodes, p.used.saturating_sub(s.gpu_milli), &p.runs.holders(), self.jobs.jobs)
                }
                _ => 1000,
            };
            if let Some(d) = job.duration {
                // Work left, at the speed it runs now (rounded up: a slowed job never ends early).
                let left = d.saturating_sub(s.progress).saturating_mul(s.slowdown_milli).div_ceil(1000);
                p.agenda.departures.push(Reverse((now.saturating_add(left), j, s.generation)));
            }
        }
    }
}

impl Effects for Driver<'_, '_> {
    fn bind(&mut self, _: &Decision, _: &str, task: &str, node: &str, devices: &[DeviceShare]) {
        if self.jobs.job_of_task(task).is_some() {
            self.progress.counts.attempts += 1;
        }
        self.placed(task, node, devices);
    }

    fn unschedulable(&mut self, _: &Decision, workload: &str, explanation: &Explanation) {
        let Some(j) = self.jobs.job_of_workload(workload) else { return };
        self.progress.counts.attempts += 1;
        self.progress.out[j].waiting_reason = Some(metrics::main_reason(explanation));
    }

    fn request_checkpoint(&mut self, _: &Decision, task: &str, _: &str, deadline: u64) {
        let Some(j) = self.jobs.job_of_task(task) else { return };
        if let Some(c) = self.jobs.jobs[j].checkpoint_seconds
            && self.now.saturating_add(c) < deadline
        {
            self.progress.agenda.checkpoints.push(Reverse((self.now.saturating_add(c), task.to_string())));
        }
    }

    fn evict(&mut self, _: &Decision, _: &str, task: &str, _: &str, reason: &EvictReason) {
        let Some(j) = self.jobs.job_of_task(task) else { return };
        let (job, workload, now, p) = (&self.jobs.jobs[j], &self.jobs.workloads[j], self.now, &mut *self.progress);
        p.counts.evictions += 1;
        p.last_change = now;
        let s = &mut p.state[j];
        s.placed = s.placed.saturating_sub(1);
        s.gpu_milli = s.gpu_milli.saturating_sub(job.replica_gpu_milli());
        let end = match reason {
            EvictReason::Preempted { .. } => RunEnd::Preempted,
            EvictReason::GangBroken | EvictReason::NodeLost => RunEnd::Evicted,
        };
        // Its GPUs stay in use until it has stopped (a lost node's pods stop with it).
        let stops_at = if matches!(reason, EvictReason::NodeLost) {
            p.used = p.used.saturating_sub(job.replica_gpu_milli());
            now
        } else {
            let at = now.saturating_add(job.termination_seconds.unwrap_or(0));
            p.agenda.terminations.push(Reverse((at, task.to_string(), job.replica_gpu_milli())));
            at
        };
        let work_kept = match s.active_since {
            Some(since) if s.placed < workload.min_member as u32 => {
                let kept = matches!(reason, EvictReason::Preempted { checkpointed: true, .. });
                // Work done, at the speed it ran.
                let done = (now - since).saturating_mul(1000) / s.slowdown_milli.max(1000);
                s.progress = if kept { s.progress + done } else { 0 };
                s.active_since = None;
                s.generation += 1;
                s.stopped_with_work = kept;
                p.out[j].evictions += 1;
                kept
            }
            // The job runs on without this replica (an elastic job shrunk).
            Some(_) => true,
            // The job had already stopped (the rest of a broken gang): as its stop left it.
            None => s.stopped_with_work,
        };
        p.runs.evict(task, now, stops_at, end, work_kept);
    }

    fn timed_out(&mut self, _: &Decision, workload: &str) {
        let Some(j) = self.jobs.job_of_workload(workload) else { return };
        let p = &mut *self.progress;
        p.counts.timed_out += 1;
        let waited = self.now - self.jobs.jobs[j].arrival;
        for member in &self.jobs.workloads[j].members {
            p.runs.finish(&member.id, self.now, RunEnd::Evicted);
        }
        // Forget it so its name and pods are free again.
        let _ = self.core.finish(&self.jobs.jobs[j].name);
        if let Some(after) = self.resubmit_after {
            // As the Kubernetes path does: the same gang again a little later, its delay counted
            // from its first arrival. Not a change of the cluster, so a gang that can never be
            // placed does not keep the replay going by itself.
            p.out[j].waiting_reason = Some(format!("gang timed out after {waited} s; submitted again"));
            p.agenda.resubmissions.push(Reverse((self.now.saturating_add(after), j)));
            return;
        }
        p.last_change = self.now;
        p.out[j].waiting_reason = Some(format!("gang timed out after {waited} s"));
        p.out[j].given_up = Some(self.now);
    }

    /// Counted with every decision's faults ([`Decision::faults`]), not here.
    fn fault(&mut self, _: &Decision, _: &PluginFault) {}
}
