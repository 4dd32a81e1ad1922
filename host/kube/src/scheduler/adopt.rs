//! Taking over after a start or a fail-over: the core sees every node and the running pods of
//! ours, placed before, as its own.

use super::*;

impl Scheduler {
    /// Once nodes and pods are listed (and queues and DRA objects, or the grace for them passed):
    /// the core sees every node and takes over the pods of ours that already run — placed before
    /// a restart.
    pub(super) fn maybe_adopt(&mut self) {
        if self.adopted.is_some() || !(self.view.synced.nodes && self.view.synced.pods) {
            return;
        }
        // DRA objects too: a GPU request a DeviceClass serves must not be tried the classic way
        // before the classes are known (a cluster without the API gives up after the grace).
        let listed = self.view.synced.queues
            && self.view.synced.flavors
            && self.view.synced.priority_classes
            && self.view.synced.budgets
            && self.view.objects.dra.synced()
            && self.view.objects.owners.settled()
            && self.view.objects.pod_groups.settled();
        if !listed && self.timers.clock.elapsed() < QUEUE_SYNC_GRACE {
            return;
        }
        let now = self.now();
        let running: AHashSet<String> =
            self.view.ours.iter().filter(|(_, f)| f.bound).map(|(id, _)| id.clone()).collect();
        self.next.stale_nodes.clear();
        let names: Vec<String> = self.view.cache.node_names().map(String::from).collect();
        for name in names {
            if let Some(node) = self.background(&name, &running) {
                self.observe(node, now);
            }
        }
        let mut singles = Vec::new();
        let mut groups: BTreeMap<String, grouping::Gathered> = BTreeMap::new();
        let mut pending_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, f) in &self.view.ours {
            match self.membership(f) {
                grouping::Membership::Gang { key, name, info } if running.contains(id) => {
                    groups.entry(key).or_insert_with(|| grouping::Gathered::new(name, info)).ids.push(id.clone())
                }
                grouping::Membership::Gang { key, .. } => pending_of.entry(key).or_default().push(id.clone()),
                // A running group whose object is gone runs on as the gang of what runs.
                grouping::Membership::Waiting(_) if running.contains(id) && f.group.is_some() => {
                    let name = f.group.as_ref().map(|(_, n)| n.clone()).unwrap_or_default();
                    let key = format!("{}/{name}", f.task.namespace);
                    let info = GroupInfo::of_min(1, None);
                    groups.entry(key).or_insert_with(|| grouping::Gathered::new(name, info)).ids.push(id.clone())
                }
                _ if running.contains(id) => singles.push(id.clone()),
                _ => {}
            }
        }
        let mut refused = Vec::new();
        for id in singles {
            let mut w = workloads::single(&self.view.ours[&id], &self.view.objects.priority_classes);
            self.count_held_devices(&mut w.members[0]);
            let placed: Vec<_> = self.placed(std::slice::from_ref(&id));
            self.announce(&w, &placed);
            if let Err(e) = self.core.adopt(w, &placed, now) {
                refused.push((id, e.to_string()));
            }
        }
        for (key, grouping::Gathered { name, mut info, ids: bound }) in groups {
            // Its pending members join it; they are placed as capacity allows. A group whose
            // object is gone runs on with what runs.
            let pending = pending_of.remove(&key).unwrap_or_default();
            if !self.view.objects.groups.contains_key(&key) {
                info.min_member = info.min_member.min(bound.len() + pending.len()).max(bound.len());
            }
            let members: Vec<&PodFacts> = bound.iter().chain(&pending).map(|id| &self.view.ours[id]).collect();
            let mut w =
                workloads::gang(&key, &info, &members, &self.view.objects.priority_classes, &self.config.topology);
            for task in &mut w.members {
                task.group = Some(name.clone());
                if bound.contains(&task.id) {
                    self.count_held_devices(task);
                }
            }
            let placed = self.placed(&bound);
            self.announce(&w, &placed);
            if let Err(e) = self.core.adopt(w, &placed, now) {
                refused.extend(bound.into_iter().map(|id| (id, e.to_string())));
            }
        }
        for (id, error) in refused {
            // Not taken over: it still runs, and counts as others' usage.
            tracing::warn!(pod = %id, %error, "a running pod of ours was not taken over");
            if let Some(node) = self.view.cache.node_of(&id).map(String::from) {
                self.next.stale_nodes.insert(node);
            }
        }
        // The devices of the claims counted now are the core's own, no longer others' holds.
        if !self.view.objects.dra_counted.is_empty() {
            self.next.stale_nodes.extend(self.view.cache.node_names().map(String::from));
        }
        let (adopted, pending) = (running.len(), self.view.ours.len() - running.len());
        if *self.leadership.leader.borrow() {
            tracing::info!(adopted, pending, "leading: took over the running pods of ours");
            self.take_over_runs();
        } else {
            // A standby only keeps its view (and the runs) current; it takes over when it gets
            // the lease.
            tracing::info!(adopted, pending, "standing by: running pods of ours known");
            self.follow_bound_runs();
        }
        self.adopted = Some(Instant::now());
        self.next.dirty = true;
    }

    /// `task`, a running pod of ours being taken over, with the devices its allocated claims hold,
    /// by class, in its request — as the cycle counted them when it placed the pod, and charged
    /// it beyond — so that its queue counts them after a restart as before. A claim shared with a
    /// pod counted already is counted once.
    fn count_held_devices(&mut self, task: &mut wasmsched_api::Task) {
        let Some(f) = self.view.ours.get(&task.id) else { return };
        for (claim, held) in self.view.objects.dra.held(&task.namespace, &f.claims) {
            if self.view.objects.dra_counted.get(&claim).is_some_and(|(t, _)| *t != task.id) {
                continue;
            }
            let resources = held.iter().map(|(r, _)| r.to_string()).collect();
            self.view.objects.dra_counted.insert(claim, (task.id.clone(), resources));
            for (resource, n) in held {
                super::cycle::add_extended(&mut task.request, &resource, n);
            }
        }
    }

    /// A follower that becomes the leader starts its core afresh: the pods the previous leader
    /// bound meanwhile are taken over like after a restart, so they count in their queues.
    pub(super) fn take_over_again(&mut self) {
        tracing::info!("leading: taking over the pods bound meanwhile");
        let tree = match self.view.objects.queues.tree(&self.view.objects.flavors).0 {
            Ok(tree) => tree,
            Err(_) => {
                Queues::default().tree(&Flavors::default()).0.expect("the implicit default queue alone is a valid tree")
            }
        };
        self.core = super::new_core(tree, &self.config);
        self.adopted = None;
        self.next.not_before.clear();
        self.reports.reported.clear();
        self.reports.attempts.clear();
        self.view.evicting.clear();
        self.next.stale_nodes.clear();
        self.view.objects.withdrawn.clear();
        self.next.dirty = true;
    }

    pub(super) fn placed(&self, ids: &[String]) -> Vec<(String, String, Vec<DeviceShare>)> {
        ids.iter()
            .filter_map(|id| {
                let (node, devices) = self.view.cache.holding(id)?;
                Some((id.clone(), node.to_string(), devices.to_vec()))
            })
            .collect()
    }
}
