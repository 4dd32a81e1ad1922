//! One cycle: the core sees the nodes that changed and the pods waiting, then decides.

use super::*;

impl Scheduler {
    /// Workloads whose eviction the disruption budgets would refuse (more of a budget's pods than
    /// it allows now, lowest priority offered first) are not offered as victims; the others are
    /// offered again.
    pub(super) fn offer_victims(&mut self) {
        if self.objects.budgets.is_empty() && self.objects.withdrawn.is_empty() {
            return;
        }
        // One hash lookup per pod outside the namespaces that have a budget.
        let namespaces = self.objects.budgets.namespaces();
        let candidates = self.ours.iter().filter(|(_, f)| f.bound && namespaces.contains(f.task.namespace.as_str()));
        let candidates = candidates.filter_map(|(id, f)| {
            Some(crate::disruption::Candidate {
                workload: self.core.owner_of(id)?,
                namespace: &f.task.namespace,
                labels: &f.labels,
                priority: f.task.priority,
            })
        });
        let withheld = self.objects.budgets.withheld(candidates);
        // Every cycle, not only on change: a workload submitted again starts preemptible.
        for w in &withheld {
            let _ = self.core.set_preemptible(w, false);
        }
        for w in self.objects.withdrawn.difference(&withheld) {
            let _ = self.core.set_preemptible(w, true);
        }
        self.objects.withdrawn = withheld;
    }

    /// Node `name` as the core sees it: what pods the core does not manage hold. Members of the
    /// core (and `also`, pods about to be taken over) and victims being evicted are left out.
    pub(super) fn background(&self, name: &str, also: &AHashSet<String>) -> Option<Node> {
        let slot = self.cache.nodes().slot_of(name)?;
        let mut node = self.cache.nodes().get(slot)?.clone();
        for (id, task, devices) in self.cache.holders_on(name) {
            if self.core.owner_of(id).is_some() || self.in_flight.evicting.contains(id) || also.contains(id) {
                release(&mut node, task, devices);
            }
        }
        Some(node)
    }

    pub(super) fn observe(&mut self, node: Node, now: u64) -> Vec<Decision> {
        let name = node.name.clone();
        let topology = self.cache.nodes().topologies().get(&name).cloned();
        self.core.set_topology(&name, topology);
        let others = self.others_on(&name);
        self.core.observe_pods(&name, others);
        self.core.observe_node(node, now)
    }

    /// Others' pods on `node` as inter-pod affinity needs them (ours are the core's own members).
    pub(super) fn others_on(&self, node: &str) -> Vec<RunningPod> {
        self.cache
            .holders_on(node)
            .filter(|(id, _, _)| !self.ours.contains_key(*id) && self.core.owner_of(id).is_none())
            .filter(|(_, t, _)| self.next.all_pod_labels || !t.pod_terms().anti_affinity.is_empty())
            .map(|(_, t, _)| RunningPod {
                namespace: t.namespace.clone(),
                labels: t.labels.clone(),
                anti_affinity: t.pod_terms().anti_affinity.clone(),
            })
            .collect()
    }

    /// The core sees again the nodes whose usage by others changed (or that left).
    pub(super) fn refresh_nodes(&mut self, now: u64) -> Vec<Decision> {
        let mut out = Vec::new();
        let none = AHashSet::new();
        for name in std::mem::take(&mut self.next.stale_nodes) {
            match self.background(&name, &none) {
                Some(node) => out.extend(self.observe(node, now)),
                None if self.core.nodes().slot_of(&name).is_some() => out.extend(self.core.remove_node(&name, now)),
                None => {}
            }
        }
        out
    }

    /// Our pending pods the core does not have yet become workloads: lone pods at once, groups
    /// once their `PodGroup` is known and min-member of them exist (later members join).
    pub(super) fn submit_pending(&mut self, now: u64) {
        self.next.not_before.retain(|_, t| *t > now);
        // The first pod of ours with pod affinity of its own: from now on the core sees every
        // other pod's labels (before this pod is tried).
        if !self.next.all_pod_labels && self.ours.values().any(|f| !f.bound && !f.task.pod_terms().is_empty()) {
            self.next.all_pod_labels = true;
            let names: Vec<String> = self.cache.node_names().map(String::from).collect();
            for name in names {
                let others = self.others_on(&name);
                self.core.observe_pods(&name, others);
            }
        }
        let mut singles = Vec::new();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, f) in &self.ours {
            if f.bound || self.core.owner_of(id).is_some() {
                continue;
            }
            let key = group_key(&f.task);
            let wait_key = key.as_deref().unwrap_or(id);
            if self.next.not_before.get(wait_key).is_some_and(|t| *t > now) {
                continue;
            }
            match key {
                Some(g) => groups.entry(g).or_default().push(id.clone()),
                None => singles.push(id.clone()),
            }
        }
        // Oldest first (then by name): the core serves a queue's equal priorities in submission
        // order, so that order must be the pods', not a hash map's.
        let age = |id: &String| (self.ours[id].created, id.clone());
        singles.sort_by_key(age);
        let mut groups: Vec<(String, Vec<String>)> = groups.into_iter().collect();
        groups.sort_by_key(|(_, ids)| ids.iter().map(age).min());
        let retry = now + self.config.resubmit_after.as_secs().max(1);
        for id in singles {
            if let Err(e) = self.core.submit(workloads::single(&self.ours[&id], &self.objects.priority_classes), now) {
                self.next.not_before.insert(id.clone(), retry);
                self.report(&[id], &e.to_string());
            }
        }
        for (key, mut ids) in groups {
            ids.sort();
            if self.core.status(&key).is_some() {
                let tasks =
                    ids.iter().map(|id| self.ours[id].task_with_priority(&self.objects.priority_classes)).collect();
                if let Err(e) = self.core.add_members(&key, tasks) {
                    self.next.not_before.insert(key, retry);
                    self.report(&ids, &e.to_string());
                }
                continue;
            }
            let Some(info) = self.objects.groups.get(&key).cloned() else {
                self.report(&ids, &format!("waiting for PodGroup {key}"));
                continue;
            };
            if ids.len() < info.min_member {
                // The same words on every member however many have arrived (one write each); the
                // count is on the PodGroup's status, written at most every few seconds.
                let msg = format!(
                    "pod group {key}: waiting for its {} members to exist (the PodGroup's status counts them)",
                    info.min_member
                );
                self.report(&ids, &msg);
                continue;
            }
            let members: Vec<&PodFacts> = ids.iter().map(|id| &self.ours[id]).collect();
            if let Err(e) =
                self.core.submit(workloads::gang(&key, &info, &members, &self.objects.priority_classes), now)
            {
                self.next.not_before.insert(key, retry);
                self.report(&ids, &e.to_string());
            }
        }
    }

    /// One cycle: the core sees what changed, new pods are submitted, the core decides.
    pub(super) fn cycle(&mut self) {
        self.next.dirty = false;
        self.timers.last_cycle = Instant::now();
        let now = self.now();
        // With warm-up, a staged version catches up a step on the table the last cycle decided
        // on, and goes live here, between cycles, once it has (a no-op otherwise).
        self.shared.registry.warm(self.core.nodes());
        let live = self.shared.registry.current();
        let refreshed = self.refresh_nodes(now);
        self.carry_out(refreshed, &live, Duration::ZERO);
        // The table the cycle decides on: a version prepared on it needs only its later deltas.
        if self.shared.registry.wants_sample() {
            self.shared.registry.offer_sample(self.core.nodes());
        }
        self.submit_pending(now);
        self.offer_victims();
        let started = Instant::now();
        let decisions = self.core.schedule(&live.set, now);
        let each = started.elapsed() / decisions.len().max(1) as u32;
        self.carry_out(decisions, &live, each);
        self.next.dirty |= self.core.more_ready();
    }
}
