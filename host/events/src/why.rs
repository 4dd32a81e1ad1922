//! "Why is my task pending?" answered from the event stream (`wasmsched events why`): a task's
//! latest state and, while it waits, the reasons of its last attempt per stage. Events arrive in
//! decision order per task (one scheduler, one outbox), so the last one about the task wins.

use std::fmt;

use crate::schema::{Event, EvictedReason, Payload, PreemptReason, ReclaimCost, StageReason};
use crate::time::Timestamp;

/// What the stream says about one task so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum TaskState {
    /// No event about the task.
    #[default]
    Unknown,
    /// Bound to a node.
    Scheduled {
        /// The node.
        node: String,
        /// When.
        at: Timestamp,
        /// Attempts it took.
        attempt: u32,
    },
    /// Its last attempt failed, for these reasons.
    Pending {
        /// Attempts so far.
        attempt: u32,
        /// Why, per stage, most frequent first.
        reasons: Vec<StageReason>,
        /// When it was last tried.
        at: Timestamp,
    },
    /// Evicted to make room; it waits to be placed again.
    Preempted {
        /// Who needed the room.
        by: String,
        /// The node it left.
        node: String,
        /// The rule that allowed it.
        reason: PreemptReason,
        /// For a reclaim, the shares it moved and what it cost.
        reclaim: Option<ReclaimCost>,
        /// When.
        at: Timestamp,
    },
    /// Stopped because its gang broke or its node went away; it waits to be placed again.
    Evicted {
        /// The node it left.
        node: String,
        /// Why.
        reason: EvictedReason,
        /// When.
        at: Timestamp,
    },
}

/// Folds a task's events into its latest [`TaskState`].
#[derive(Clone, Debug)]
pub struct Why {
    task: String,
    state: TaskState,
    /// `(namespace, group)` of its gang, once an event about the task named it.
    group: Option<(String, String)>,
    /// Its gang timed out at least once (the last time, and after how long).
    timed_out: Option<(Timestamp, u64)>,
}

impl Why {
    /// Follow `task` (its id as events name it: `namespace/name` on Kubernetes, the job's task id
    /// in the simulator).
    pub fn new(task: &str) -> Self {
        Why { task: task.to_owned(), state: TaskState::Unknown, group: None, timed_out: None }
    }

    /// Take one event into account; events about other tasks are ignored.
    pub fn observe(&mut self, event: &Event) {
        if let Some(t) = event.payload.task().filter(|t| t.id == self.task)
            && let Some(g) = &t.group
        {
            self.group = Some((t.namespace.clone(), g.clone()));
        }
        match &event.payload {
            Payload::TaskScheduled(e) if e.task.id == self.task => {
                self.state = TaskState::Scheduled { node: e.node.clone(), at: event.time, attempt: e.attempt };
            }
            Payload::TaskUnschedulable(e) if e.task.id == self.task => {
                self.state = TaskState::Pending { attempt: e.attempt, reasons: e.reasons.clone(), at: event.time };
            }
            Payload::TaskPreempted(e) if e.victim.id == self.task => {
                self.state = TaskState::Preempted {
                    by: e.preemptor.id.clone(),
                    node: e.node.clone(),
                    reason: e.reason,
                    reclaim: e.reclaim,
                    at: event.time,
                };
            }
            Payload::TaskEvicted(e) if e.task.id == self.task => {
                self.state = TaskState::Evicted { node: e.node.clone(), reason: e.reason, at: event.time };
            }
            Payload::GroupTimedOut(e)
                if self.group.as_ref().is_some_and(|(ns, g)| *ns == e.namespace && *g == e.group) =>
            {
                self.timed_out = Some((event.time, e.waited_seconds));
            }
            _ => {}
        }
    }

    /// The latest state.
    pub fn state(&self) -> &TaskState {
        &self.state
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            TaskState::Unknown => write!(f, "{}: no events about this task", self.task)?,
            TaskState::Scheduled { node, at, attempt } => {
                write!(f, "{}: scheduled on {node} at {at} (attempt {attempt})", self.task)?
            }
            TaskState::Pending { attempt, reasons, at } => {
                write!(f, "{}: pending; attempt {attempt} at {at} failed:", self.task)?;
                if reasons.is_empty() {
                    write!(f, "\n  (no reason recorded)")?;
                }
                for r in reasons {
                    match r.nodes {
                        0 => write!(f, "\n  {}: {}", r.stage, r.reason)?,
                        n => write!(f, "\n  {}: {n} nodes: {}", r.stage, r.reason)?,
                    }
                }
            }
            TaskState::Preempted { by, node, reason, reclaim, at } => {
                write!(
                    f,
                    "{}: preempted on {node} at {at} for {by} ({}); waiting to be placed again",
                    self.task,
                    serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
                )?;
                if let Some(r) = reclaim {
                    write!(f, "\n  reclaim: {r}")?;
                }
            }
            TaskState::Evicted { node, reason, at } => write!(
                f,
                "{}: evicted from {node} at {at} ({}); waiting to be placed again",
                self.task,
                serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
            )?,
        }
        if let Some((at, waited)) = self.timed_out {
            write!(f, "\n  its gang timed out at {at} after waiting {waited} s")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{GroupTimedOut, Stage, TaskPreempted, TaskRef, TaskScheduled, TaskUnschedulable};
    use std::borrow::Cow;

    fn event(at: u64, payload: Payload) -> Event {
        Event {
            specversion: Cow::Borrowed("1.0"),
            id: format!("e{at}"),
            source: "wasmsched/test".into(),
            time: Timestamp(at),
            subject: String::new(),
            namespace: Some("ml".into()),
            datacontenttype: Cow::Borrowed("application/json"),
            payload,
        }
    }

    fn task(id: &str) -> TaskRef {
        TaskRef { id: id.into(), namespace: "ml".into(), group: Some("train".into()), ..Default::default() }
    }

    #[test]
    fn the_last_event_about_the_task_decides_and_reasons_are_listed_by_stage() {
        let mut why = Why::new("ml/train-0");
        assert_eq!(why.state(), &TaskState::Unknown);
        assert!(why.to_string().ends_with("no events about this task"));
        let pending = TaskUnschedulable {
            task: task("ml/train-0"),
            reasons: vec![
                StageReason { stage: Stage::Queue, reason: "queue team at capability".into(), nodes: 0 },
                StageReason { stage: Stage::Filter, reason: "insufficient free GPUs".into(), nodes: 3 },
            ],
            attempt: 2,
            ..Default::default()
        };
        why.observe(&event(1_000, Payload::TaskUnschedulable(pending)));
        // Another task's events change nothing.
        why.observe(&event(
            2_000,
            Payload::TaskScheduled(TaskScheduled { task: task("ml/other"), ..Default::default() }),
        ));
        let text = why.to_string();
        assert!(text.starts_with("ml/train-0: pending; attempt 2 at "), "{text}");
        assert!(
            text.contains("\n  queue: queue team at capability\n  filter: 3 nodes: insufficient free GPUs"),
            "{text}"
        );
        why.observe(&event(
            3_000,
            Payload::GroupTimedOut(GroupTimedOut {
                namespace: "ml".into(),
                group: "train".into(),
                waited_seconds: 600,
                ..Default::default()
            }),
        ));
        assert!(why.to_string().contains("its gang timed out at"));
        why.observe(&event(
            4_000,
            Payload::TaskScheduled(TaskScheduled {
                task: task("ml/train-0"),
                node: "gpu-3".into(),
                attempt: 3,
                ..Default::default()
            }),
        ));
        assert!(why.to_string().starts_with("ml/train-0: scheduled on gpu-3 at "));
        why.observe(&event(
            5_000,
            Payload::TaskPreempted(TaskPreempted {
                victim: task("ml/train-0"),
                node: "gpu-3".into(),
                preemptor: task("ml/urgent"),
                reason: PreemptReason::Priority,
                checkpoint: crate::schema::CheckpointOutcome::NotCheckpointable,
                grace_seconds: 0,
                reclaim: None,
            }),
        ));
        assert!(why.to_string().contains("preempted on gpu-3 at "), "{why}");
        assert!(why.to_string().contains("for ml/urgent (priority)"), "{why}");
        assert!(!why.to_string().contains("reclaim:"), "{why}");
        let cost = crate::schema::ReclaimCost {
            victim_queue: crate::schema::QueueShareMove {
                before_gpu_milli: 12_000,
                after_gpu_milli: 8_000,
                deserved_gpu_milli: 5_333,
            },
            preemptor_queue: crate::schema::QueueShareMove {
                before_gpu_milli: 0,
                after_gpu_milli: 4_000,
                deserved_gpu_milli: 5_333,
            },
            lost_gpu_seconds: 4 * 5400,
        };
        why.observe(&event(
            9_000,
            Payload::TaskPreempted(TaskPreempted {
                victim: task("ml/train-0"),
                node: "gpu-3".into(),
                preemptor: task("ml/other-team"),
                reason: PreemptReason::Reclaim,
                checkpoint: crate::schema::CheckpointOutcome::NotCheckpointable,
                grace_seconds: 0,
                reclaim: Some(cost),
            }),
        ));
        assert!(
            why.to_string().contains(
                "(reclaim); waiting to be placed again\n  reclaim: victim's queue 12 → 8 GPUs (deserved 5.333), \
                 preemptor's queue 0 → 4 (deserved 5.333), 6.0 GPU-h lost\n"
            ),
            "{why}"
        );
    }
}
