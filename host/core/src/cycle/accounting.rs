//! What every queue and node holds: members bound and released, the node index, the cluster's
//! capacity.

use super::*;

impl SchedulerCore {
    /// Add (or remove) `d` to a leaf queue and its ancestors.
    pub(super) fn account(&mut self, leaf: usize, d: &Resources, add: bool) {
        self.queue_use.reserves.take();
        let chain: Vec<usize> = self.queues.chain(leaf).collect();
        for q in chain {
            self.queue_use.allocated[q] = if add {
                self.queue_use.allocated[q].checked_add(d).unwrap_or_else(|| self.queue_use.allocated[q].clone())
            } else {
                self.queue_use.allocated[q].saturating_sub(d)
            };
        }
    }

    /// Release a placed member from its node and its queue, keeping it in the entry for rollback.
    pub(super) fn unbind(&mut self, wl: &str, idx: usize) -> Option<Member> {
        let e = self.entries.get_mut(wl)?;
        let held = e.held(idx, &self.queues);
        let m = e.members[idx].take()?;
        let task = e.spec.members[idx].clone();
        let leaf = e.leaf;
        self.index_remove(&m.node, wl);
        self.nodes.update_usage(m.slot, |n| release(n, &task, &m.devices));
        self.account(leaf, &held, false);
        Some(m)
    }

    /// Undo [`Self::unbind`].
    pub(super) fn rebind(&mut self, wl: &str, idx: usize, m: Member) {
        let Some(e) = self.entries.get(wl) else { return };
        let task = e.spec.members[idx].clone();
        let leaf = e.leaf;
        if !matches!(self.nodes.update_usage(m.slot, |n| bind(n, &task, &m.devices)), Some(Ok(()))) {
            warn!(workload = wl, task = %task.id, node = %m.node, "could not restore a member after a rolled-back preemption");
        }
        self.account(leaf, &demand_in(&task, m.flavor.as_deref(), &self.queues), true);
        self.index_add(&m.node, wl);
        if let Some(e) = self.entries.get_mut(wl) {
            e.members[idx] = Some(m);
        }
    }

    /// Record that a member of `wl` is placed on `node` (the index [`Self::members_on`] reads, so a
    /// node change costs its own members, not a walk of every workload).
    pub(super) fn index_add(&mut self, node: &str, wl: &str) {
        *self.on_node.entry(node.to_string()).or_default().entry(wl.to_string()).or_default() += 1;
    }

    /// Undo [`Self::index_add`] for one member.
    pub(super) fn index_remove(&mut self, node: &str, wl: &str) {
        let Some(here) = self.on_node.get_mut(node) else { return };
        if let Some(n) = here.get_mut(wl) {
            *n -= 1;
            if *n == 0 {
                here.remove(wl);
            }
        }
        if here.is_empty() {
            self.on_node.remove(node);
        }
    }

    pub(super) fn members_on(&self, node: &str) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        let Some(here) = self.on_node.get(node) else { return out };
        // In name order, as a walk of every workload would find them.
        let mut names: Vec<&String> = here.keys().collect();
        names.sort();
        for name in names {
            let Some(e) = self.entries.get(name) else { continue };
            for (i, m) in e.members.iter().enumerate() {
                if m.as_ref().is_some_and(|m| m.node == node) {
                    out.push((name.clone(), i));
                }
            }
        }
        out
    }

    /// The nodes' allocatable total (with each flavor's qualified copies) and, with flavors, the
    /// nodes of each flavor and then of none.
    pub(super) fn cluster_capacity(&self) -> (Resources, Vec<Vec<Slot>>) {
        let flavors = self.queues.flavors();
        let mut total = Resources::default();
        let mut by_flavor = vec![Vec::new(); if flavors.is_empty() { 0 } else { flavors.len() + 1 }];
        for slot in self.nodes.slots() {
            let Some(n) = self.nodes.get(slot) else { continue };
            total.saturating_add_assign(&n.allocatable);
            if flavors.is_empty() {
                continue;
            }
            match self.queues.flavor_of(n) {
                Some(f) => {
                    crate::flavor::add_flavored(&mut total, &flavors[f].name, &n.allocatable);
                    by_flavor[f].push(slot);
                }
                None => by_flavor[flavors.len()].push(slot),
            }
        }
        // Only the qualified resources some quota names are dimensions worth counting.
        total.extended.retain(|(n, _)| !self.queues.unbounded_flavored(n));
        (total, by_flavor)
    }
}
