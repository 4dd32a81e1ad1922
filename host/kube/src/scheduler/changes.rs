//! What each change the cluster view reports (`cluster.rs`) means for the core, the pods' runs
//! and the reasons reported on pods: the watch handlers' half that is not the view's.

use super::cluster::{Changed, ClusterView, Gone, PodChange};
use super::*;

impl Scheduler {
    /// One watch event applied to the view (`apply`), and what it changed carried out.
    pub(super) fn watched(&mut self, apply: impl FnOnce(&mut ClusterView) -> Changed) {
        let changed = apply(&mut self.view);
        self.changed(changed);
    }

    /// Carries out what one watch event changed.
    fn changed(&mut self, changed: Changed) {
        let Changed { dirty, stale_nodes, regroup, queues, pods } = changed;
        self.next.dirty |= dirty;
        self.next.stale_nodes.extend(stale_nodes);
        self.next.regroup |= regroup;
        for change in pods {
            self.pod_changed(change);
        }
        if queues {
            self.rebuild_queues();
        }
    }

    /// Until the core has nodes (before the first cycle), the view's are the policies' sample.
    pub(super) fn offer_sample(&self) {
        if self.shared.registry.wants_sample() && self.core.nodes().is_empty() {
            self.shared.registry.offer_sample(self.view.cache.nodes());
        }
    }

    pub(super) fn stale(&mut self, node: String) {
        self.next.stale_nodes.insert(node);
        self.next.dirty = true;
    }

    fn pod_changed(&mut self, change: PodChange) {
        match change {
            PodChange::Unreadable { id, uid, error } => {
                self.report_one(&id, &uid, &format!("wasmsched cannot schedule this pod: {error}"), None);
            }
            PodChange::Terminating { id, node } => {
                self.unreport(&id);
                if self.core.owner_of(&id).is_some() {
                    let _ = self.core.remove_task(&id);
                    if let Some(node) = node {
                        self.stale(node);
                    }
                }
            }
            PodChange::Relabelled { id, labels, node } => {
                if self.core.owner_of(&id).is_some() {
                    // Ours: the core holds the labels inter-pod affinity reads of its members.
                    if let Some(labels) = labels
                        && self.core.relabel_task(&id, labels).unwrap_or(false)
                    {
                        self.next.dirty = true;
                    }
                } else if let Some(node) = node {
                    // Others' pods' labels are what inter-pod affinity of ours matches.
                    self.stale(node);
                }
            }
            PodChange::Bound { id, ours, before, after } => self.pod_bound(&id, ours, before, after),
            PodChange::Ended { id, pod } => self.run_ended(&id, pod.as_deref()),
            PodChange::Gone(gone) => self.pod_gone(*gone),
            PodChange::Relisted { listed } => self.runs_not_listed(&listed),
        }
    }

    /// One of our pods finished or was deleted: it leaves the core (its gang keeps running).
    fn pod_gone(&mut self, gone: Gone) {
        let Gone { id, facts, evicted } = gone;
        self.withdrawn(&id, facts.as_ref());
        self.unreport(&id);
        // A lone pod's workload is itself; a gang's note goes with its next submission or bind.
        self.next.dra_not_now.remove(&id);
        if evicted && self.core.terminated(&id) {
            self.next.dirty = true;
        }
        if self.core.remove_task(&id).is_ok() {
            self.next.dirty = true;
        }
    }

    /// Pod `id` is bound on `after` (was on `before`); `ours`: one of ours.
    fn pod_bound(&mut self, id: &str, ours: bool, before: Option<String>, after: Option<String>) {
        if ours {
            self.unreport(id);
            // Bound by the previous leader, seen after the take-over: its run is counted (one of
            // ours whose bind is in flight is counted when the bind succeeds).
            if self.adopted.is_some() && !self.reports.unconfirmed.contains_key(id) {
                self.run_taken_over(id);
            }
        }
        match self.core.placement_of(id) {
            Some(node) if Some(node) == after.as_deref() => {
                if self.view.ours.get(id).is_some_and(|f| f.checkpointed) {
                    let now = self.now();
                    if let Ok(decisions) = self.core.checkpoint_done(id, now) {
                        let live = self.shared.registry.current();
                        self.carry_out(decisions, &live, Duration::ZERO);
                    }
                }
            }
            // Before the take-over every node is shown to the core afresh anyway.
            _ if self.adopted.is_none() => {}
            placed => {
                // Bound where the core did not put it (another scheduler won a race), or a pod the
                // core never had: a fact the core sees as others' usage. A running pod's status
                // updates change nothing the core sees.
                let owned = placed.is_some() || self.core.owner_of(id).is_some();
                if owned {
                    let _ = self.core.remove_task(id);
                }
                if owned || before != after {
                    self.next.stale_nodes.extend(before.into_iter().chain(after));
                    self.next.dirty = true;
                }
            }
        }
    }

    /// The core takes the queue tree the objects describe, unless that would orphan work.
    pub(super) fn rebuild_queues(&mut self) {
        let (tree, errors) = self.view.objects.queues.tree(&self.view.objects.flavors);
        for (queue, error) in errors {
            tracing::warn!(%queue, %error, "leaving out a queue that does not convert");
        }
        match tree.map_err(|e| e.to_string()).and_then(|t| self.core.set_queues(t).map_err(|e| e.to_string())) {
            Ok(()) => {
                self.view.objects.queue_error = None;
                self.next.not_before.clear();
                self.next.dirty = true;
                self.describe_queues();
            }
            Err(error) => {
                tracing::warn!(%error, "keeping the previous queue tree");
                self.view.objects.queue_error = Some(error);
            }
        }
    }
}
