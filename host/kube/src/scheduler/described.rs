//! What the event stream has been told of the cluster: each node's capacity, each queue's
//! configuration, each pod's arrival and a waiting pod's withdrawal, published when they change — what `wasmsched scenario
//! from-events` rebuilds the cluster and its work from. Only with events on.

use ahash::{AHashMap, AHashSet};
use wasmsched_api::{DeviceShare, Node};
use wasmsched_core::Workload;
use wasmsched_events::Timestamp;
use wasmsched_events::decisions;
use wasmsched_events::schema::{NodeCapacityChanged, Payload, QueueConfigured};

use super::Scheduler;
use crate::convert;

/// The descriptions last published.
#[derive(Default)]
pub(super) struct Described {
    nodes: AHashMap<String, NodeCapacityChanged>,
    queues: std::collections::BTreeMap<String, QueueConfigured>,
    /// Pods whose `task-submitted` was published (a pod submitted again after an eviction or a
    /// gang's time-out arrived once).
    announced: AHashSet<String>,
}

/// Whether `node` still offers what `last` said.
fn same_capacity(last: &NodeCapacityChanged, node: &Node, topology: bool) -> bool {
    last.cpu_milli == node.allocatable.cpu_milli
        && last.memory_bytes == node.allocatable.memory_bytes
        && last.gpus as usize == node.gpus.len()
        && last.gpu_model.as_deref() == node.gpus.iter().next().map(|g| g.model.as_str())
        && last.accelerator.as_ref().map_or("", |a| a.kind.as_str()) == node.gpus.iter().next().map_or("", |g| &*g.kind)
        && last.topology == topology
        && last.labels.len() == node.labels.len()
        && last.labels.iter().zip(&node.labels).all(|((k, v), (nk, nv))| k == nk && v == nv)
}

impl Scheduler {
    /// Whether the stream wants descriptions (events are on).
    pub(super) fn describing(&self) -> bool {
        self.reports.events.as_ref().is_some_and(|s| s.wanted())
    }

    /// `node-capacity-changed` for `node` if it is new or offers something else than last said.
    pub(super) fn describe_node(&mut self, node: &Node) {
        if !self.describing() {
            return;
        }
        let topology = self.view.cache.nodes().topologies().get(&node.name).is_some();
        if self.reports.described.nodes.get(&node.name).is_some_and(|last| same_capacity(last, node, topology)) {
            return;
        }
        let payload = decisions::node_capacity(node, topology, false, self.core.nodes().accelerators().kinds());
        if let Payload::NodeCapacityChanged(said) = &payload {
            self.reports.described.nodes.insert(node.name.clone(), said.clone());
        }
        self.publish_at(Timestamp::now(), payload);
    }

    /// `node-capacity-changed` with `removed` for a node that left.
    pub(super) fn describe_node_gone(&mut self, name: &str) {
        if let Some(last) = self.reports.described.nodes.remove(name) {
            self.publish_at(
                Timestamp::now(),
                Payload::NodeCapacityChanged(NodeCapacityChanged { removed: true, ..last }),
            );
        }
    }

    /// `queue-configured` for each queue of the core's tree that is new or changed, and with
    /// `removed` for each that is gone.
    pub(super) fn describe_queues(&mut self) {
        if !self.describing() {
            return;
        }
        let tree = self.core.queues();
        let now: Vec<QueueConfigured> = (0..tree.len())
            .filter_map(|i| tree.get(i))
            .filter_map(|q| match decisions::queue_configured(q, false) {
                Payload::QueueConfigured(c) => Some(c),
                _ => None,
            })
            .collect();
        let mut changed: Vec<Payload> = Vec::new();
        let names: AHashSet<&str> = now.iter().map(|q| q.queue.as_str()).collect();
        let gone: Vec<String> =
            self.reports.described.queues.keys().filter(|q| !names.contains(q.as_str())).cloned().collect();
        for q in gone {
            if let Some(last) = self.reports.described.queues.remove(&q) {
                changed.push(Payload::QueueConfigured(QueueConfigured { removed: true, ..last }));
            }
        }
        for q in now {
            if self.reports.described.queues.get(&q.queue) != Some(&q) {
                self.reports.described.queues.insert(q.queue.clone(), q.clone());
                changed.push(Payload::QueueConfigured(q));
            }
        }
        let at = Timestamp::now();
        for p in changed {
            self.publish_at(at, p);
        }
    }

    /// `task-submitted` for each member of `workload` not announced yet, stamped when its pod
    /// was created (its arrival); the members in `running` (task, node, devices) — a running
    /// workload taken over — say where they have run since their pod was scheduled.
    pub(super) fn announce(&mut self, workload: &Workload, running: &[(String, String, Vec<DeviceShare>)]) {
        if !self.describing() {
            return;
        }
        let kinds = self.core.nodes().accelerators().kinds();
        let mut payloads = Vec::new();
        for task in &workload.members {
            if !self.reports.described.announced.insert(task.id.clone()) {
                continue;
            }
            let facts = self.view.ours.get(&task.id);
            let created = facts.and_then(|f| f.created.as_ref()).map_or_else(Timestamp::now, convert::event_time);
            let payload = match running.iter().find(|(id, _, _)| *id == task.id) {
                Some((_, node, _)) => {
                    let since = facts.and_then(|f| f.scheduled.as_ref()).map_or(created, convert::event_time);
                    decisions::submitted_running(task, workload, decisions::Timings::default(), kinds, node, since)
                }
                None => decisions::submitted(task, workload, decisions::Timings::default(), kinds),
            };
            payloads.push((created, payload));
        }
        for (created, payload) in payloads {
            self.publish_at(created, payload);
        }
    }

    /// `task-withdrawn` of pod `id` of ours, going before it ran: announced (its
    /// `task-submitted` went out) and never bound (`facts`: what it was as one of ours).
    pub(super) fn withdrawn(&mut self, id: &str, facts: Option<&crate::workloads::PodFacts>) {
        if !self.describing() || !self.reports.described.announced.remove(id) {
            return;
        }
        let Some(facts) = facts.filter(|f| !f.bound) else { return };
        let now = Timestamp::now();
        let created = facts.created.as_ref().map_or(now, convert::event_time);
        let waited = now.millis().saturating_sub(created.millis()) / 1000;
        let payload = decisions::withdrawn(&facts.task, waited);
        self.publish_at(now, payload);
    }

    /// Forget the announcements of pods that are gone.
    pub(super) fn forget_announced(&mut self) {
        let ours = &self.view.ours;
        self.reports.described.announced.retain(|id| ours.contains_key(id));
    }
}
