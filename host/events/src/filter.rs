//! Selecting and de-duplicating events on the consumer side (`wasmsched events tail`).

use std::collections::{HashSet, VecDeque};

use crate::schema::{Event, Kind};
use crate::sink::subject_token;

/// Which events to show. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Event kinds.
    pub kinds: Vec<Kind>,
    /// Kubernetes namespace (cluster-scoped events have none and never match a namespace).
    pub namespace: Option<String>,
    /// Task id: matches events about that task (the victim of a preemption) or whose subject it is.
    pub task: Option<String>,
}

impl Filter {
    /// Whether `event` passes.
    pub fn matches(&self, event: &Event) -> bool {
        if !self.kinds.is_empty() && !self.kinds.contains(&event.kind()) {
            return false;
        }
        if let Some(ns) = &self.namespace
            && event.namespace.as_deref() != Some(ns.as_str())
        {
            return false;
        }
        if let Some(task) = &self.task {
            let about = event.payload.task().is_some_and(|t| &t.id == task)
                || matches!(&event.payload, crate::schema::Payload::TaskPreempted(p) if &p.preemptor.id == task)
                || &event.subject == task;
            if !about {
                return false;
            }
        }
        true
    }

    /// NATS subject filters under `root` (`<prefix>.<cluster>`) that select at least the matching
    /// events; the task filter is applied on the consumer.
    pub fn subjects(&self, root: &str) -> Vec<String> {
        let ns = self.namespace.as_deref().map_or_else(|| "*".to_owned(), subject_token);
        if self.kinds.is_empty() {
            return vec![format!("{root}.*.{ns}")];
        }
        self.kinds.iter().map(|k| format!("{root}.{}.{ns}", k.name())).collect()
    }
}

/// Remembers the last `capacity` event ids, to drop re-deliveries.
#[derive(Debug)]
pub struct Dedup {
    seen: HashSet<String>,
    order: VecDeque<String>,
    capacity: usize,
}

impl Dedup {
    /// Remember up to `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        Dedup { seen: HashSet::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// True the first time `id` is seen (within the memory).
    pub fn first_time(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() == self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.seen.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}
