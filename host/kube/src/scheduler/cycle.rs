//! One cycle: the core sees the nodes that changed and the pods waiting, then decides.

use super::*;
use crate::convert::GPU_RESOURCE;
use crate::dra::{ClaimRef, DraPod, MadeClaim, extended};

impl Scheduler {
    /// Workloads whose eviction the disruption budgets would refuse (more of a budget's pods than
    /// it allows now, lowest priority offered first) are not offered as victims; the others are
    /// offered again.
    pub(super) fn offer_victims(&mut self) {
        if self.view.objects.budgets.is_empty() && self.view.objects.withdrawn.is_empty() {
            return;
        }
        // One hash lookup per pod outside the namespaces that have a budget.
        let namespaces = self.view.objects.budgets.namespaces();
        let candidates =
            self.view.ours.iter().filter(|(_, f)| f.bound && namespaces.contains(f.task.namespace.as_str()));
        let candidates = candidates.filter_map(|(id, f)| {
            Some(crate::disruption::Candidate {
                workload: self.core.owner_of(id)?,
                namespace: &f.task.namespace,
                labels: &f.labels,
                priority: f.task.priority,
            })
        });
        let withheld = self.view.objects.budgets.withheld(candidates);
        // Every cycle, not only on change: a workload submitted again starts preemptible.
        for w in &withheld {
            let _ = self.core.set_preemptible(w, false);
        }
        for w in self.view.objects.withdrawn.difference(&withheld) {
            let _ = self.core.set_preemptible(w, true);
        }
        self.view.objects.withdrawn = withheld;
    }

    /// Node `name` as the core sees it: what pods the core does not manage hold. Members of the
    /// core (and `also`, pods about to be taken over) and victims the core holds as terminating
    /// on this very node are left out; a victim anywhere else is a fact here until it is gone.
    pub(super) fn background(&mut self, name: &str, also: &AHashSet<String>) -> Option<Node> {
        let slot = self.view.cache.nodes().slot_of(name)?;
        let mut node = self.view.cache.nodes().get(slot)?.clone();
        let terminating: AHashSet<&str> =
            self.core.terminating().filter(|(_, on)| *on == name).map(|(task, _)| task).collect();
        for (id, task, devices) in self.view.cache.holders_on(name) {
            if self.core.owner_of(id).is_some() || terminating.contains(id) || also.contains(id) {
                release(&mut node, task, devices);
            }
        }
        // DRA devices by class: all of them, and those held by claims the core does not count
        // through its own tasks' requests (others' claims, claims of pods gone or not ours).
        let (core, counted) = (&self.core, &self.view.objects.dra_counted);
        let counted_by_core = |claim: &str, resource: &str| {
            counted.get(claim).is_some_and(|(t, rs)| rs.iter().any(|r| r == resource) && core.owner_of(t).is_some())
        };
        let capacity = self.view.objects.dra.capacity(name, &counted_by_core);
        for (resource, devices, held) in &capacity {
            add_extended(&mut node.allocatable, resource, *devices);
            add_extended(&mut node.allocated, resource, *held);
        }
        // What the core sees now, for `dra_capacity_changed` to compare with.
        if capacity.is_empty() {
            self.view.objects.dra_capacity.remove(name);
        } else {
            self.view.objects.dra_capacity.insert(name.to_string(), capacity);
        }
        Some(node)
    }

    /// DRA devices or their holds changed: the core sees again each node whose device counts
    /// by class changed.
    pub(super) fn dra_capacity_changed(&mut self, changed: Option<Vec<String>>) {
        let names: Vec<String> = changed.unwrap_or_else(|| self.view.cache.node_names().map(String::from).collect());
        let (core, counted) = (&self.core, &self.view.objects.dra_counted);
        let counted_by_core = |claim: &str, resource: &str| {
            counted.get(claim).is_some_and(|(t, rs)| rs.iter().any(|r| r == resource) && core.owner_of(t).is_some())
        };
        for name in names {
            let now = self.view.objects.dra.capacity(&name, &counted_by_core);
            let before = self.view.objects.dra_capacity.get(&name);
            if before.map_or(!now.is_empty(), |b| *b != now) {
                self.next.stale_nodes.insert(name);
            }
        }
    }

    pub(super) fn observe(&mut self, node: Node, now: u64) -> Vec<Decision> {
        let name = node.name.clone();
        let topology = self.view.cache.nodes().topologies().get(&name).cloned();
        self.core.set_topology(&name, topology);
        self.show_topology(&name);
        let others = self.others_on(&name);
        self.core.observe_pods(&name, others);
        self.describe_node(&node);
        self.core.observe_node(node, now)
    }

    /// Others' pods on `node` as inter-pod affinity needs them (ours are the core's own members).
    pub(super) fn others_on(&self, node: &str) -> Vec<RunningPod> {
        self.view
            .cache
            .holders_on(node)
            .filter(|(id, _, _)| !self.view.ours.contains_key(*id) && self.core.owner_of(id).is_none())
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
                None if self.core.nodes().slot_of(&name).is_some() => {
                    out.extend(self.core.remove_node(&name, now));
                    self.describe_node_gone(&name);
                    self.show_topology(&name);
                }
                None => {}
            }
        }
        out
    }

    /// Our pending pods the core does not have yet become workloads: lone pods at once, groups
    /// once their `PodGroup` is known and min-member of them exist (later members join).
    pub(super) fn submit_pending(&mut self, now: u64) {
        self.next.not_before.retain(|_, t| *t > now);
        self.forget_announced();
        let ours = &self.view.ours;
        self.next.mixed.retain(|id, _| ours.get(id).is_some_and(|f| !f.bound));
        // The first pod of ours with pod affinity of its own: from now on the core sees every
        // other pod's labels (before this pod is tried).
        if !self.next.all_pod_labels && self.view.ours.values().any(|f| !f.bound && !f.task.pod_terms().is_empty()) {
            self.next.all_pod_labels = true;
            let names: Vec<String> = self.view.cache.node_names().map(String::from).collect();
            for name in names {
                let others = self.others_on(&name);
                self.core.observe_pods(&name, others);
            }
        }
        self.regroup();
        // Lone pods (with the queue their owner names, if any), gangs by key, and pods that
        // wait for their group's object or owner to be seen.
        let mut singles: Vec<(String, Option<String>)> = Vec::new();
        let mut groups: BTreeMap<String, grouping::Gathered> = BTreeMap::new();
        let mut waiting: Vec<(String, String)> = Vec::new();
        for (id, f) in &self.view.ours {
            // A victim being evicted is not waiting for a node, even when its bind failed (it was
            // chosen while the bind was in flight): it goes, and its controller makes another.
            if f.bound || self.core.owner_of(id).is_some() || self.view.evicting.contains(id) {
                continue;
            }
            let membership = self.membership(f);
            let wait_key = match &membership {
                grouping::Membership::Gang { key, .. } => key.as_str(),
                _ => id.as_str(),
            };
            if self.next.not_before.get(wait_key).is_some_and(|t| *t > now) {
                continue;
            }
            match membership {
                grouping::Membership::Alone { queue } => singles.push((id.clone(), queue)),
                grouping::Membership::Gang { key, name, info } => {
                    groups.entry(key).or_insert_with(|| grouping::Gathered::new(name, info)).ids.push(id.clone())
                }
                grouping::Membership::Waiting(reason) => waiting.push((id.clone(), reason)),
            }
        }
        for (id, reason) in waiting {
            self.report(&[id], &reason);
        }
        // Oldest first (then by name): the core serves a queue's equal priorities in submission
        // order, so that order must be the pods', not a hash map's.
        let age = |id: &String| (self.view.ours[id].created, id.clone());
        singles.sort_by_key(|(id, _)| age(id));
        let mut groups: Vec<(String, grouping::Gathered)> = groups.into_iter().collect();
        groups.sort_by_key(|(_, g)| g.ids.iter().map(age).min());
        let retry = now + self.config.resubmit_after.as_secs().max(1);
        for (id, queue) in singles {
            let mut workload = workloads::single(&self.view.ours[&id], &self.view.objects.priority_classes);
            if let Some(queue) = queue {
                workloads::set_queue(&mut workload, &queue);
            }
            if !self.restrict_to_claims(&id, &mut workload.members, retry) {
                continue;
            }
            // It arrived, whether or not its queue admits it now.
            self.announce(&workload, &[]);
            if let Err(e) = self.core.submit(workload, now) {
                self.next.not_before.insert(id.clone(), retry);
                self.report(&[id], &e.to_string());
            }
        }
        for (key, grouping::Gathered { name, info, mut ids }) in groups {
            ids.sort();
            if self.core.status(&key).is_some() {
                let mut tasks: Vec<Task> = ids
                    .iter()
                    .map(|id| {
                        let mut task = self.view.ours[id].task_with_priority(&self.view.objects.priority_classes);
                        task.group = Some(name.clone());
                        task
                    })
                    .collect();
                if !self.restrict_to_claims(&key, &mut tasks, retry) {
                    continue;
                }
                // Late members: their gang as they see it (its size here counts only them).
                if self.describing() {
                    let late: Vec<&PodFacts> = ids.iter().map(|id| &self.view.ours[id]).collect();
                    self.announce(
                        &workloads::gang(
                            &key,
                            &info,
                            &late,
                            &self.view.objects.priority_classes,
                            &self.config.topology,
                        ),
                        &[],
                    );
                }
                if let Err(e) = self.core.add_members(&key, tasks) {
                    self.next.not_before.insert(key, retry);
                    self.report(&ids, &e.to_string());
                }
                continue;
            }
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
            let members: Vec<&PodFacts> = ids.iter().map(|id| &self.view.ours[id]).collect();
            let mut workload =
                workloads::gang(&key, &info, &members, &self.view.objects.priority_classes, &self.config.topology);
            for task in &mut workload.members {
                task.group = Some(name.clone());
            }
            if !self.restrict_to_claims(&key, &mut workload.members, retry) {
                continue;
            }
            self.announce(&workload, &[]);
            match self.core.submit(workload, now) {
                Ok(()) => {
                    self.next.gang_min.insert(key, info.min_member);
                }
                Err(e) => {
                    self.next.not_before.insert(key, retry);
                    self.report(&ids, &e.to_string());
                }
            }
        }
    }

    /// Each of `tasks` (the members of workload `key`) with DRA claims is restricted to the nodes
    /// that can serve its claims now. `false` when some cannot be served anywhere: the members
    /// are told why and wait until devices are added or freed (or `retry`, at the latest).
    fn restrict_to_claims(&mut self, key: &str, tasks: &mut [Task], retry: u64) -> bool {
        let mut any = false;
        let mut refusal = None;
        self.next.dra_not_now.remove(key);
        for task in tasks.iter_mut() {
            // What an earlier submission asked of DRA is not this one's: the classes serving the
            // pod may be gone (a DeviceClass deleted), and a stale entry would be allocated at bind.
            if self.view.objects.dra_pods.remove(&task.id).is_some() {
                self.view.objects.dra_counted.retain(|_, (t, _)| *t != task.id);
            }
            let Some(facts) = self.view.ours.get(&task.id) else { continue };
            // Extended resources a DeviceClass serves (KEP-5004), through a claim made for the pod.
            let names = facts.containers.iter().flat_map(|c| c.requests.keys()).filter(|n| extended::is_extended(n));
            let served = self.view.objects.dra.classes_for(names.map(String::as_str));
            if facts.claims.is_empty() && served.is_empty() {
                continue;
            }
            // Device-plugin nodes offer them too: tried there first, then on the DRA nodes.
            if facts.claims.is_empty() {
                let nodes = self.view.cache.nodes();
                let offered = self
                    .view
                    .cache
                    .node_names()
                    .filter_map(|n| nodes.slot_of(n).and_then(|s| nodes.get(s)))
                    .any(|node| served.keys().all(|r| offers(node, r)));
                if offered {
                    let path = self.next.mixed.entry(task.id.clone()).or_default();
                    path.submitted_dra = path.dra;
                    if !path.dra {
                        continue;
                    }
                } else {
                    self.next.mixed.remove(&task.id);
                }
            }
            if !self.view.objects.dra.synced() {
                any = true;
                refusal = Some(
                    "waiting for the cluster's ResourceSlices, DeviceClasses and ResourceClaims to be listed".into(),
                );
                break;
            }
            let mut pod = DraPod { claims: facts.claims.clone(), made: None };
            let mut candidates: Vec<&str> = self.view.cache.node_names().collect();
            if !served.is_empty() {
                // Only on nodes that do not offer the resources themselves (a device plugin).
                let nodes = self.view.cache.nodes();
                candidates.retain(|n| {
                    let node = nodes.slot_of(n).and_then(|s| nodes.get(s));
                    node.is_none_or(|node| !served.keys().any(|r| offers(node, r)))
                });
                let (name, uid) = (key_of(task).name, facts.uid.clone());
                match self.view.objects.dra.made_claim_of(&task.namespace, &uid) {
                    Some(claim) => pod.claims.push(ClaimRef {
                        name: "extended resources".into(),
                        claim: Some(claim),
                        template: None,
                    }),
                    None => {
                        pod.made = Some(MadeClaim::new(&task.namespace, &name, &uid, &facts.containers, &served));
                    }
                }
            }
            let made = pod.made.as_ref().map(|m| &m.claim);
            match self.view.objects.dra.feasible_nodes(&task.namespace, &pod.claims, made, candidates.into_iter()) {
                Ok(feasible) => {
                    tracing::debug!(pod = %task.id, nodes = ?feasible.nodes, now = feasible.now, "DRA: where its claims can go");
                    if let Some(why) = feasible.not_now.clone() {
                        self.next.dra_not_now.insert(key.to_string(), why);
                    }
                    if served.contains_key(GPU_RESOURCE) {
                        task.gpu = Default::default();
                    }
                    task.request.extended.retain(|(n, _)| !served.contains_key(n.as_str()));
                    crate::dra::restrict_to(task, feasible, self.view.cache.node_names());
                    if let Some(avoid) = self.next.dra_avoid.get(key) {
                        crate::dra::avoid(task, avoid.iter().cloned().collect());
                    }
                }
                // Nothing of DRA's can serve it, but nodes offer its extended resources themselves.
                Err(_) if facts.claims.is_empty() => {
                    if let Some(path) = self.next.mixed.get_mut(&task.id) {
                        path.submitted_dra = false;
                    }
                    continue;
                }
                Err(reason) => {
                    any = true;
                    refusal = Some(reason);
                    break;
                }
            }
            any = true;
            // The devices its claims ask for, counted by class like extended resources: the core
            // then never places more than a node has free, a gang's members included, quotas
            // count them, and preemption frees them. A claim shared with a pod the core already
            // counts it for is not counted twice.
            for (claim, wants) in self.view.objects.dra.requests(&task.namespace, &pod.claims, made) {
                let other = self.view.objects.dra_counted.get(&claim).filter(|(t, _)| *t != task.id);
                if other.is_some_and(|(t, _)| self.core.owner_of(t).is_some()) {
                    continue;
                }
                let resources = wants.iter().map(|(r, _)| r.to_string()).collect();
                self.view.objects.dra_counted.insert(claim, (task.id.clone(), resources));
                for (resource, n) in wants {
                    add_extended(&mut task.request, &resource, n);
                }
            }
            self.view.objects.dra_pods.insert(task.id.clone(), pod);
        }
        if let Some(reason) = refusal {
            self.next.not_before.insert(key.to_string(), retry);
            self.next.dra_waiting.insert(key.to_string());
            let ids: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
            self.report(&ids, &reason);
            return false;
        }
        if any {
            self.next.dra_submitted.insert(key.to_string());
        }
        true
    }

    /// A claim a pod waits for exists now, or devices were added or freed: pods waiting on their
    /// claims are tried again at once; when devices changed, workloads submitted with the nodes
    /// their claims allowed then, none of whose members is placed, are submitted again with the
    /// nodes they allow now, and no node is avoided any more.
    fn dra_woken(&mut self, woken: crate::dra::Woken) {
        for key in self.next.dra_waiting.drain() {
            self.next.not_before.remove(&key);
        }
        // A claim created changes where no submitted pod's claims can go: only devices do (a
        // burst of pods from templates must not submit every waiting pod again per claim).
        if !woken.devices {
            return;
        }
        self.next.dra_avoid.clear();
        for workload in std::mem::take(&mut self.next.dra_submitted) {
            let unplaced = self.core.members_of(&workload).is_some_and(|mut m| !m.any(|(_, placed)| placed));
            if unplaced {
                let _ = self.core.finish(&workload);
            }
        }
    }

    /// One cycle: the core sees what changed, new pods are submitted, the core decides.
    pub(super) fn cycle(&mut self) {
        self.next.dirty = false;
        let woken = self.view.objects.dra.take_woken();
        if woken != crate::dra::Woken::default() {
            self.dra_woken(woken);
        }
        let changed = self.view.objects.dra.take_changed_nodes();
        if changed.as_ref().is_none_or(|c| !c.is_empty()) {
            self.dra_capacity_changed(changed);
        }
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
        self.publish_share_changes();
        self.next.dirty |= self.core.more_ready();
    }
}

/// `n` more of extended resource `name` in `r` (kept sorted by name).
pub(super) fn add_extended(r: &mut wasmsched_api::Resources, name: &str, n: u64) {
    match r.extended.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
        Ok(i) => r.extended[i].1 += n,
        Err(i) => r.extended.insert(i, (name.into(), n)),
    }
}

/// Whether `node` offers extended resource `name` itself (a device plugin's GPUs, say).
fn offers(node: &Node, name: &str) -> bool {
    if name == GPU_RESOURCE {
        node.allocatable.gpu_milli > 0
    } else {
        node.allocatable.extended.iter().any(|(n, v)| n == name && *v > 0)
    }
}
