//! The watch-fed view of the cluster: node, pod, pod group, queue, flavor, priority class and
//! disruption budget events update the cache and our pods, and mark what the core must see again.

use super::*;

impl Scheduler {
    pub(super) fn node_event(&mut self, event: watcher::Result<Event<KubeNode>>) {
        match event {
            Ok(Event::Init) => self.listing.relist.nodes = Some(AHashSet::new()),
            Ok(Event::InitApply(node)) => {
                if let Some(listed) = self.listing.relist.nodes.as_mut() {
                    listed.insert(node.name_any());
                }
                self.apply_node(&node);
            }
            Ok(Event::InitDone) => {
                let listed = self.listing.relist.nodes.take();
                if let Some(listed) = &listed {
                    let gone: Vec<String> =
                        self.cache.node_names().filter(|n| !listed.contains(*n)).map(String::from).collect();
                    self.next.stale_nodes.extend(gone);
                }
                self.cache.retain_listed(listed.as_ref(), None);
                self.listing.synced.nodes = true;
                tracing::info!(nodes = self.cache.nodes().len(), "nodes listed");
            }
            Ok(Event::Apply(node)) => self.apply_node(&node),
            Ok(Event::Delete(node)) => {
                self.cache.delete_node(&node.name_any());
                self.objects.dra.delete_node(&node.name_any());
                self.stale(node.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
        // Until the core has nodes (before the first cycle), the cache's are the sample.
        if self.shared.registry.wants_sample() && self.core.nodes().is_empty() {
            self.shared.registry.offer_sample(self.cache.nodes());
        }
    }

    pub(super) fn apply_node(&mut self, node: &KubeNode) {
        self.objects.dra.apply_node(node);
        let before = self.cache.nodes().slot_of(&node.name_any()).and_then(|s| self.cache.nodes().get(s)).cloned();
        if let Err(e) = self.cache.apply_node(node) {
            tracing::warn!(node = %node.name_any(), error = %e, "ignoring a node that does not convert");
            return;
        }
        let after = self.cache.nodes().slot_of(&node.name_any()).and_then(|s| self.cache.nodes().get(s));
        if before.as_ref() != after {
            self.stale(node.name_any());
        }
    }

    pub(super) fn stale(&mut self, node: String) {
        self.next.stale_nodes.insert(node);
        self.next.dirty = true;
    }

    pub(super) fn pod_event(&mut self, event: watcher::Result<Event<Pod>>) {
        match event {
            Ok(Event::Init) => self.listing.relist.pods = Some(AHashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Ok(id)) = (self.listing.relist.pods.as_mut(), pod_id(&pod)) {
                    listed.insert(id);
                }
                self.apply_pod(&pod);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.listing.relist.pods.take() {
                    let gone: Vec<String> = self.ours.keys().filter(|id| !listed.contains(*id)).cloned().collect();
                    for id in gone {
                        self.pod_gone(&id);
                    }
                    self.runs_not_listed(&listed);
                    let before: Vec<(String, String)> = self
                        .cache
                        .node_names()
                        .flat_map(|n| self.cache.holders_on(n).map(move |(id, _, _)| (id.to_string(), n.to_string())))
                        .filter(|(id, _)| !listed.contains(id))
                        .collect();
                    self.cache.retain_listed(None, Some(&listed));
                    for (_, node) in before {
                        self.stale(node);
                    }
                }
                self.listing.synced.pods = true;
                tracing::info!(bound = self.cache.holders(), ours = self.ours.len(), "pods listed");
            }
            Ok(Event::Apply(pod)) => self.apply_pod(&pod),
            Ok(Event::Delete(pod)) => {
                if let Ok(id) = pod_id(&pod) {
                    if let Some(node) = self.cache.node_of(&id).map(String::from) {
                        self.stale(node);
                    }
                    self.cache.delete_pod(&pod);
                    self.run_ended(&id, Some(&pod));
                    self.pod_gone(&id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }

    /// One of our pods finished or was deleted: it leaves the core (its gang keeps running).
    pub(super) fn pod_gone(&mut self, id: &str) {
        if self.objects.dra_pods.remove(id).is_some() {
            self.objects.dra_counted.retain(|_, (task, _)| task != id);
        }
        self.withdrawn(id);
        self.ours.remove(id);
        self.unreport(id);
        // A lone pod's workload is itself; a gang's note goes with its next submission or bind.
        self.next.dra_not_now.remove(id);
        if self.in_flight.evicting.remove(id) && self.core.terminated(id) {
            self.next.dirty = true;
        }
        if self.core.remove_task(id).is_ok() {
            self.next.dirty = true;
        }
    }

    pub(super) fn apply_pod(&mut self, pod: &Pod) {
        let Ok(id) = pod_id(pod) else { return };
        let before = self.cache.node_of(&id).map(String::from);
        let ours =
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some(self.config.scheduler_name.as_str());
        let phase = match self.cache.apply_pod(pod, &self.config.scheduler_name) {
            Ok(phase) => phase,
            Err(e) => {
                // A pod we cannot understand is left alone, never guessed at; if it is ours and
                // waits for a node, its owner is told why on the pod itself.
                tracing::warn!(pod = %id, error = %e, "ignoring a pod that does not convert");
                let pending = pod.spec.as_ref().is_some_and(|s| s.node_name.is_none());
                if ours && pending {
                    // An earlier, readable version of it must not be placed either.
                    if self.ours.contains_key(&id) {
                        self.pod_gone(&id);
                    }
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    self.report_one(&id, &uid, &format!("wasmsched cannot schedule this pod: {e}"), None);
                }
                return;
            }
        };
        let after = self.cache.node_of(&id).map(String::from);
        if ours && pod.metadata.deletion_timestamp.is_some() && matches!(phase, PodPhase::Bound | PodPhase::Relabelled)
        {
            // Terminating: it holds its room until it is gone, like anyone's pod, and is never
            // taken over or chosen as a victim again (a victim of ours is the core's already).
            self.ours.remove(&id);
            self.unreport(&id);
            if self.core.owner_of(&id).is_some() {
                let _ = self.core.remove_task(&id);
                if let Some(node) = after {
                    self.stale(node);
                }
            }
            return;
        }
        if matches!(phase, PodPhase::Relabelled) {
            if self.core.owner_of(&id).is_some() {
                // Ours: the core holds the labels inter-pod affinity reads of its members.
                if let Ok(task) = crate::convert::bound_task(pod, self.cache.accelerators())
                    && self.core.relabel_task(&id, task.labels).unwrap_or(false)
                {
                    self.next.dirty = true;
                }
            } else if let Some(node) = after.clone() {
                // Others' pods' labels are what inter-pod affinity of ours matches.
                self.stale(node);
            }
        }
        match phase {
            PodPhase::Pending(task) => {
                let facts = PodFacts::new(pod, *task);
                let changed = self
                    .ours
                    .get(&id)
                    .is_none_or(|f| f.task != facts.task || f.uid != facts.uid || f.claims != facts.claims);
                self.ours.insert(id, facts);
                self.next.dirty |= changed;
            }
            PodPhase::Bound | PodPhase::Relabelled => {
                if ours && let Ok(task) = crate::convert::bound_task(pod, self.cache.accelerators()) {
                    self.ours.insert(id.clone(), PodFacts::new(pod, task));
                    self.unreport(&id);
                    // Bound by the previous leader, seen after the take-over: its run is counted
                    // (one of ours whose bind is in flight is counted when the bind succeeds).
                    if self.listing.adopted.is_some() && !self.reports.unconfirmed.contains_key(&id) {
                        self.run_taken_over(&id);
                    }
                }
                match self.core.placement_of(&id) {
                    Some(node) if Some(node) == after.as_deref() => {
                        if self.ours.get(&id).is_some_and(|f| f.checkpointed) {
                            let now = self.now();
                            if let Ok(decisions) = self.core.checkpoint_done(&id, now) {
                                let live = self.shared.registry.current();
                                self.carry_out(decisions, &live, Duration::ZERO);
                            }
                        }
                    }
                    // Before the take-over every node is shown to the core afresh anyway.
                    _ if self.listing.adopted.is_none() => {}
                    placed => {
                        // Bound where the core did not put it (another scheduler won a race), or a
                        // pod the core never had: a fact the core sees as others' usage.
                        // A running pod's status updates change nothing the core sees.
                        let owned = placed.is_some() || self.core.owner_of(&id).is_some();
                        if owned {
                            let _ = self.core.remove_task(&id);
                        }
                        if owned || before != after {
                            self.next.stale_nodes.extend(before.into_iter().chain(after));
                            self.next.dirty = true;
                        }
                    }
                }
            }
            PodPhase::Other => {
                if !self.cache.holds(&id) {
                    self.run_ended(&id, Some(pod));
                }
                if (self.ours.contains_key(&id) || self.in_flight.evicting.contains(&id)) && !self.cache.holds(&id) {
                    self.pod_gone(&id);
                }
                if let Some(node) = before.filter(|_| !self.cache.holds(&id)) {
                    self.stale(node);
                }
            }
        }
    }

    pub(super) fn group_event(&mut self, event: watcher::Result<Event<PodGroup>>) {
        let (Ok(Event::Apply(g) | Event::InitApply(g)) | Ok(Event::Delete(g))) = &event else {
            match event {
                Err(e) if crate::crd::not_installed(&e) => {
                    if !std::mem::replace(&mut self.objects.groups_unserved, true) {
                        tracing::info!(
                            "PodGroup (scheduling.wasmsched.io) not installed in this cluster: pods naming one wait for it (watched)"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pod group watch failed; retrying"),
                Ok(Event::InitDone) if std::mem::take(&mut self.objects.groups_unserved) => {
                    tracing::info!("PodGroup (scheduling.wasmsched.io) now installed in this cluster");
                }
                Ok(_) => {}
            }
            return;
        };
        let key = format!("{}/{}", g.namespace().unwrap_or_default(), g.name_any());
        let changed = if matches!(event, Ok(Event::Delete(_))) {
            self.objects.groups.remove(&key).is_some()
        } else {
            let info = GroupInfo::new(g);
            self.objects.groups.insert(key, info.clone()) != Some(info) // a status write changes nothing
        };
        self.next.dirty |= changed;
        self.next.regroup |= changed;
    }

    pub(super) fn queue_event(&mut self, event: watcher::Result<Event<Queue>>) {
        if self.objects.queues.on_event(event, &mut self.listing.relist.queues, &mut self.listing.synced.queues) {
            self.rebuild_queues();
        }
    }

    /// Flavors change what queues' per-flavor quotas mean: the tree is rebuilt (a pod keeps the
    /// flavor it was placed with until it leaves).
    pub(super) fn flavor_event(&mut self, event: watcher::Result<Event<ResourceFlavor>>) {
        if self.objects.flavors.on_event(event, &mut self.listing.relist.flavors, &mut self.listing.synced.flavors) {
            self.rebuild_queues();
        }
    }

    /// Classes only give workloads submitted from now on their priority (a class's value is
    /// immutable): nothing already submitted changes.
    pub(super) fn priority_class_event(&mut self, event: watcher::Result<Event<PriorityClass>>) {
        match event {
            Ok(Event::Init) => self.listing.relist.priority_classes = Some(AHashSet::new()),
            Ok(Event::InitApply(pc)) => {
                if let Some(listed) = self.listing.relist.priority_classes.as_mut() {
                    listed.insert(pc.name_any());
                }
                self.objects.priority_classes.apply(&pc);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.listing.relist.priority_classes.take() {
                    self.objects.priority_classes.retain(&listed);
                }
                self.listing.synced.priority_classes = true;
            }
            Ok(Event::Apply(pc)) => {
                self.objects.priority_classes.apply(&pc);
            }
            Ok(Event::Delete(pc)) => self.objects.priority_classes.delete(&pc.name_any()),
            Err(e) => tracing::warn!(error = %e, "priority class watch failed; retrying"),
        }
    }

    /// A budget that changes may protect or release victims: the next cycle looks again.
    pub(super) fn budget_event(&mut self, event: watcher::Result<Event<PodDisruptionBudget>>) {
        let key = |b: &PodDisruptionBudget| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
        let changed = match event {
            Ok(Event::Init) => {
                self.listing.relist.budgets = Some(AHashSet::new());
                false
            }
            Ok(Event::InitApply(b)) => {
                if let Some(listed) = self.listing.relist.budgets.as_mut() {
                    listed.insert(key(&b));
                }
                self.objects.budgets.apply(&b)
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.listing.relist.budgets.take() {
                    self.objects.budgets.retain(&listed);
                }
                self.listing.synced.budgets = true;
                true
            }
            Ok(Event::Apply(b)) => self.objects.budgets.apply(&b),
            Ok(Event::Delete(b)) => self.objects.budgets.delete(&b),
            Err(e) => {
                tracing::warn!(error = %e, "disruption budget watch failed; retrying");
                false
            }
        };
        self.next.dirty |= changed;
    }

    /// A DRA object changed. A cluster that does not serve `resource.k8s.io/v1` (older than 1.34,
    /// or DRA turned off) is said once; the watch keeps trying quietly and pods with claims wait.
    pub(super) fn dra_event<K>(&mut self, event: watcher::Result<Event<K>>, apply: fn(&mut crate::dra::Dra, Event<K>)) {
        match event {
            Ok(event) => {
                apply(&mut self.objects.dra, event);
                self.next.dirty = true;
            }
            Err(e) if !self.objects.dra_unserved => {
                self.objects.dra_unserved = true;
                tracing::warn!(error = %e, "cannot watch DRA objects (resource.k8s.io/v1); pods with ResourceClaims wait until it can");
            }
            Err(e) => tracing::debug!(error = %e, "DRA watch failed; retrying"),
        }
    }

    /// A DeviceTaintRule changed. A cluster that does not serve them (`resource.k8s.io/v1beta2`
    /// off, as by default in 1.36) is said once; slices' own taints still count.
    pub(super) fn taint_rule_event(
        &mut self,
        event: watcher::Result<Event<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>>,
    ) {
        match event {
            Ok(event) => {
                self.objects.dra.taint_rule_event(event);
                self.next.dirty = true;
            }
            Err(e) if !self.objects.taint_rules_unserved => {
                self.objects.taint_rules_unserved = true;
                tracing::info!(error = %e, "DeviceTaintRules (resource.k8s.io/v1beta2) not watched; device taints come from ResourceSlices only");
            }
            Err(e) => tracing::debug!(error = %e, "DeviceTaintRule watch failed; retrying"),
        }
    }

    /// The core takes the queue tree the objects describe, unless that would orphan work.
    pub(super) fn rebuild_queues(&mut self) {
        let (tree, errors) = self.objects.queues.tree(&self.objects.flavors);
        for (queue, error) in errors {
            tracing::warn!(%queue, %error, "leaving out a queue that does not convert");
        }
        match tree.map_err(|e| e.to_string()).and_then(|t| self.core.set_queues(t).map_err(|e| e.to_string())) {
            Ok(()) => {
                self.objects.queue_error = None;
                self.next.not_before.clear();
                self.next.dirty = true;
                self.describe_queues();
            }
            Err(error) => {
                tracing::warn!(%error, "keeping the previous queue tree");
                self.objects.queue_error = Some(error);
            }
        }
    }
}
