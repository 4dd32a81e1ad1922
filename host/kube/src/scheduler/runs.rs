//! Our pods' runs, for usage accounting: each from its bind to the moment its pod stops holding the
//! node — completed, failed, deleted, or evicted and gone — published as `task-scheduled` and
//! `task-ended`, to the event sink and the observers (the usage meter behind `/metrics`, `docs/usage.md`).
//!
//! A run that began before this process (a restart, a fail-over) is taken over from the pod: its
//! start is what the binding wrote on it ([`SCHEDULED_AT_ANNOTATION`], the very time the earlier
//! process published), else its `PodScheduled` transition, to the second, which `wasmsched usage`
//! pairs with the earlier `task-scheduled`.
//!
//! A standby follows the runs too, publishing nothing: the ends of runs that end while it stands
//! by are kept for four lease durations (a minute at least). When it takes over it publishes them
//! all — so a run whose pod went in the gap between the old leader's death and the take-over is
//! closed, not billed forever — and the `task-scheduled` of the runs that began in that time, which the old leader
//! may have died before sending. Which of them the old leader did send cannot be known (it may
//! itself have started after some ended): such an event is then published twice, under the same
//! task and start, and a consumer keys runs by both (`wasmsched usage` does), so each counts once.
//!
//! [`SCHEDULED_AT_ANNOTATION`]: crate::convert::SCHEDULED_AT_ANNOTATION

use k8s_openapi::api::core::v1::Pod;
use wasmsched_events::Timestamp;
use wasmsched_events::decisions;
use wasmsched_events::schema::{EndReason, GpuShare, Payload, TaskEnded, TaskScheduled};

use super::*;

/// A run going on.
pub(super) struct Run {
    /// Its start: the `task-scheduled` event's time.
    started: Timestamp,
    /// The placement as published.
    placed: TaskScheduled,
    /// How the scheduler stopped it, if it did: (why, whether its work was kept).
    stopped: Option<(EndReason, bool)>,
}

impl Scheduler {
    /// Publish `payload` stamped `at`, to the observers and the event sink.
    pub(super) fn publish_at(&self, at: Timestamp, payload: Payload) {
        for observer in &self.reports.observers {
            observer.observe(at, &payload);
        }
        if let Some(sink) = self.reports.events.as_ref().filter(|s| s.wanted()) {
            sink.emit_at(at, payload);
        }
    }

    /// Queues whose deserved share the cycle moved: `queue-share-changed` (what usage reports
    /// each queue's use beside).
    pub(super) fn publish_share_changes(&mut self) {
        if self.reports.events.is_none() {
            return;
        }
        let at = Timestamp::now();
        for p in self.reports.shares.changes(&self.core.queue_shares()) {
            self.publish_at(at, p);
        }
    }

    /// A bind sent at `at` succeeded: its events are published, and its run begins.
    pub(super) fn run_started(&mut self, id: &str, events: Vec<Payload>, at: Timestamp) {
        for e in events {
            if let Payload::TaskScheduled(placed) = &e {
                let run = Run { started: at, placed: placed.clone(), stopped: None };
                self.reports.runs.insert(id.to_string(), run);
            }
            self.publish_at(at, e);
        }
    }

    /// A bound pod of ours this process did not bind (bound before a restart, or by the leader):
    /// its run is followed from now on, started when the pod was scheduled. Only the leader's
    /// meter counts it (a standby's counters would count it twice).
    pub(super) fn run_taken_over(&mut self, id: &str) {
        if self.reports.runs.contains_key(id) {
            return;
        }
        let (Some(facts), Some((node_name, devices))) = (self.view.ours.get(id), self.view.cache.holding(id)) else {
            return;
        };
        let node = self.view.cache.nodes().slot_of(node_name).and_then(|s| self.view.cache.nodes().get(s));
        let started = facts.scheduled.as_ref().map_or_else(Timestamp::now, crate::convert::event_time);
        let task = &facts.task;
        let (model, kind) = node.map(|n| decisions::gpu_model_and_kind(n, devices)).unwrap_or_default();
        let placed = TaskScheduled {
            task: decisions::task_ref(task),
            node: node_name.to_string(),
            gpus: devices.iter().map(|d| GpuShare { gpu: d.gpu, milli: d.milli }).collect(),
            allocated: decisions::allocated(task, devices),
            gpu_model: model.map(str::to_owned),
            gpu_kind: kind.map(str::to_owned),
            node_pool: node.and_then(decisions::node_pool).map(str::to_owned),
            submitted: facts.created.as_ref().map(crate::convert::event_time),
            ..TaskScheduled::default()
        };
        // Its `task-scheduled` was published when it started; this process's meter counts it from
        // now (the process before counted it until it stopped).
        if *self.leadership.leader.borrow() {
            let (now, placed) = (Timestamp::now(), Payload::TaskScheduled(placed.clone()));
            for observer in &self.reports.observers {
                observer.taken_over(now, started, &placed);
            }
        }
        self.reports.runs.insert(id.to_string(), Run { started, placed, stopped: None });
    }

    /// This replica now leads: the runs that ended while it stood by lately are ended (the old
    /// leader may have died before it published them), and every run going on is counted from
    /// now, as this replica's own.
    pub(super) fn take_over_runs(&mut self) {
        let ended = std::mem::take(&mut self.reports.ended_standing_by);
        let since = Timestamp::now().millis().saturating_sub(self.kept_standing_by().as_millis() as u64);
        if let Some(sink) = self.reports.events.as_ref().filter(|s| s.wanted()) {
            // Published, not metered: they ended before this process counted anything.
            for (at, payload) in ended.into_iter().filter(|(at, _)| at.millis() >= since) {
                sink.emit_at(at, payload);
            }
        }
        let now = Timestamp::now();
        for run in self.reports.runs.values() {
            let placed = Payload::TaskScheduled(run.placed.clone());
            for observer in &self.reports.observers {
                observer.taken_over(now, run.started, &placed);
            }
            // One that began lately may have lost its `task-scheduled` with the old leader.
            if let Some(sink) = self.reports.events.as_ref().filter(|s| s.wanted() && run.started.millis() >= since) {
                sink.emit_at(run.started, placed);
            }
        }
        self.follow_bound_runs();
    }

    /// Every bound pod of ours whose run is not followed yet: followed from now on.
    pub(super) fn follow_bound_runs(&mut self) {
        let bound: Vec<String> = self.view.ours.iter().filter(|(_, f)| f.bound).map(|(id, _)| id.clone()).collect();
        for id in bound {
            self.run_taken_over(&id);
        }
    }

    /// How far back a standby keeps the runs that ended, for its take-over: four lease durations,
    /// and a minute at least (a take-over comes one lease duration after the old leader's last
    /// renewal, plus this replica's own lag on a loaded machine, and the leader before may have
    /// missed some too).
    fn kept_standing_by(&self) -> Duration {
        self.config.lease.as_ref().map_or(Duration::ZERO, |l| (4 * l.lease_duration).max(Duration::from_secs(60)))
    }

    /// This replica no longer leads: the runs are the new leader's to count; this one follows them
    /// on as a standby.
    pub(super) fn runs_handed_over(&mut self) {
        for observer in &self.reports.observers {
            observer.handed_over();
        }
    }

    /// The scheduler evicted pod `id`: its run ends when the pod is gone, for this reason.
    pub(super) fn run_stopped(&mut self, id: &str, reason: &EvictReason) {
        let stopped = match reason {
            EvictReason::Preempted { kind: wasmsched_core::PreemptKind::ElasticShrink, .. } => {
                (EndReason::Preempted, true)
            }
            EvictReason::Preempted { checkpointed, .. } => (EndReason::Preempted, *checkpointed),
            EvictReason::GangBroken | EvictReason::NodeLost => (EndReason::Evicted, false),
        };
        if let Some(run) = self.reports.runs.get_mut(id) {
            run.stopped = Some(stopped);
        }
    }

    /// Pod `id` no longer holds its node (`pod`: its last state, when known): its run's
    /// `task-ended` is published — at once, or, when the pod left the watch by finishing (the
    /// watch shows only pods that hold resources, and a pod leaving it shows its state before),
    /// once its phase is read.
    pub(super) fn run_ended(&mut self, id: &str, pod: Option<&Pod>) {
        let Some(run) = self.reports.runs.remove(id) else { return };
        let at = Timestamp::now();
        let phase = pod.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.clone());
        let deleted = pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        let terminal = matches!(phase.as_deref(), Some("Succeeded" | "Failed"));
        if run.stopped.is_some() || deleted || terminal {
            let evicted = pod.and_then(|p| p.status.as_ref()).and_then(|s| s.reason.as_deref()) == Some("Evicted");
            let reason = if evicted { Some("Evicted") } else { phase.as_deref() };
            self.publish_end(run, at, reason);
            return;
        }
        let (effects, key) = (self.api.effects.clone(), key_of_id(id));
        let done = self.in_flight.done_tx.clone();
        tokio::spawn(async move {
            let phase = effects.ended_as(&key).await;
            let _ = done.send(Done::RunFinished { run: Box::new(run), at, phase });
        });
    }

    /// The phase of a pod that left the watch was read (`None`: it is gone too).
    pub(super) fn run_finished(&mut self, run: Run, at: Timestamp, phase: Option<&str>) {
        self.publish_end(run, at, phase);
    }

    /// `task-ended` of `run` at `at`: why from how the scheduler stopped it, else from the pod's
    /// phase (`Evicted`: the kubelet's eviction), else it was deleted.
    fn publish_end(&mut self, run: Run, at: Timestamp, phase: Option<&str>) {
        let (reason, work_kept) = match (run.stopped, phase) {
            (Some(stopped), _) => stopped,
            // The kubelet evicted it (node pressure): its work is lost.
            (None, Some("Evicted")) => (EndReason::Evicted, false),
            (None, Some("Succeeded")) => (EndReason::Completed, true),
            (None, Some("Failed")) => (EndReason::Failed, false),
            (None, _) => (EndReason::Deleted, false),
        };
        let p = run.placed;
        let ended = TaskEnded {
            task: p.task,
            node: p.node,
            started: run.started,
            gpus: p.gpus,
            allocated: p.allocated,
            gpu_model: p.gpu_model,
            gpu_kind: p.gpu_kind,
            node_pool: p.node_pool,
            reason,
            work_kept,
        };
        if *self.leadership.leader.borrow() {
            self.publish_at(at, Payload::TaskEnded(ended));
            return;
        }
        // A standby keeps it for the take-over, as long as it could matter then.
        let horizon = at.millis().saturating_sub(self.kept_standing_by().as_millis() as u64);
        let stash = &mut self.reports.ended_standing_by;
        stash.push_back((at, Payload::TaskEnded(ended)));
        while stash.front().is_some_and(|(t, _)| t.millis() < horizon) {
            stash.pop_front();
        }
    }

    /// Runs of pods that a relist no longer shows: over.
    pub(super) fn runs_not_listed(&mut self, listed: &AHashSet<String>) {
        let gone: Vec<String> = self.reports.runs.keys().filter(|id| !listed.contains(*id)).cloned().collect();
        for id in gone {
            self.run_ended(&id, None);
        }
    }
}
