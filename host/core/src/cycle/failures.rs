//! Failures that speak for identical workloads within one cycle.
//!
//! Under overload thousands of pending pods often ask for the same few shapes. When one of them
//! fails on an unchanged cluster, trying its twins again costs a full filter pass (and a preempt
//! plugin call) each and cannot succeed, so the cycle reuses the first failure's explanation until
//! something binds or leaves (the caller clears the memo then).

use ahash::AHashMap;
use wasmsched_api::Task;

use super::{Entry, Explanation, PreemptionPolicy};

/// What makes two lone tasks interchangeable for placement and preemption: the task without its
/// name, and whether it may preempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ShapeKey {
    task: Task,
    preemption: PreemptionPolicy,
}

/// Explanations of this cycle's failures, by shape.
#[derive(Debug, Default)]
pub(super) struct Failures {
    seen: AHashMap<ShapeKey, Explanation>,
}

impl Failures {
    /// The key of a workload whose failure may stand for its twins: lone tasks with no topology
    /// constraint (gangs are rare and their members' order matters; not worth the risk).
    pub(super) fn key(e: &Entry) -> Option<ShapeKey> {
        let [task] = e.spec.members.as_slice() else { return None };
        if e.spec.topology.is_some() || e.placed() > 0 {
            return None;
        }
        let mut task = task.clone();
        task.id.clear();
        task.group = None;
        Some(ShapeKey { task, preemption: e.spec.preemption })
    }

    pub(super) fn get(&self, key: &ShapeKey) -> Option<&Explanation> {
        self.seen.get(key)
    }

    pub(super) fn insert(&mut self, key: ShapeKey, explanation: Explanation) {
        self.seen.insert(key, explanation);
    }

    /// The cluster changed: every failure must be tried again.
    pub(super) fn clear(&mut self) {
        self.seen.clear();
    }
}
