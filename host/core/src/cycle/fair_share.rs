//! The host side of fair share: the stage's input, its serving order, and pending demand as
//! decisions move it.

use super::*;

/// `*held = fresh` (default when absent), copying only when they differ.
pub(super) fn refresh(held: &mut Resources, fresh: Option<&Resources>) {
    match fresh {
        Some(f) if held != f => held.clone_from(f),
        Some(_) => {}
        None if *held != Resources::default() => *held = Resources::default(),
        None => {}
    }
}

impl SchedulerCore {
    /// Ask the fair-share plugin for deserved shares and the serving order (leaf queues). `None`
    /// without a plugin or when it failed: tree order, nothing reclaimed.
    pub(super) fn fair_share(
        &mut self,
        set: &PolicySet,
        pending: &[Resources],
        cluster: &Resources,
        out: &mut Vec<Decision>,
    ) -> Option<Vec<usize>> {
        let plugin = set.fair_share()?;
        let request: Vec<Resources> = self
            .queue_use
            .allocated
            .iter()
            .zip(pending)
            .map(|(a, p)| a.checked_add(p).unwrap_or_else(|| a.clone()))
            .collect();
        // Reserves that lending limits keep for queues which do not ask for them are nobody's to
        // share: water-filling over them would promise other queues capacity they cannot take.
        let idle = self.queues.unused_reserves(&request);
        let cluster = cluster.saturating_sub(idle.total());
        let states = self.share_input(&request);
        match plugin.fair_share(0, states, &cluster) {
            Ok(ShareDecision { deserved, order }) => {
                self.queue_use.deserved = Some(deserved);
                let leaves: Vec<usize> =
                    order.into_iter().map(|q| q as usize).filter(|&q| self.queues.is_leaf(q)).collect();
                self.queue_use.order.clone_from(&leaves);
                Some(leaves)
            }
            Err(fault) => {
                warn!(%fault, "fair share failed; serving queues in tree order without reclaim");
                self.queue_use.deserved = None;
                self.queue_use.order.clear();
                out.push(Decision::Fault(fault));
                None
            }
        }
    }

    /// The fair-share input for the current allocations and `request` (see `share_input`).
    pub(super) fn share_input(&mut self, request: &[Resources]) -> &[wasmsched_api::QueueState] {
        let (allocated, usage) = (&self.queue_use.allocated, &self.queue_use.usage);
        match &mut self.queue_use.share_input {
            Some(states) if states.len() == self.queues.len() => {
                for (i, s) in states.iter_mut().enumerate() {
                    let fresh = (allocated.get(i), request.get(i), usage.get(i).copied().unwrap_or(0.0));
                    refresh(&mut s.allocated, fresh.0);
                    refresh(&mut s.request, fresh.1);
                    s.decayed_usage = fresh.2;
                }
            }
            input => *input = Some(self.queues.states(allocated, request, usage)),
        }
        self.queue_use.share_input.as_deref().expect("set above")
    }

    /// Bound tasks' demand moves from pending to allocated, evicted ones' back.
    pub(super) fn move_demand(&self, pending: &mut [Resources], decisions: &[Decision]) {
        for d in decisions {
            let (workload, task, bound) = match d {
                Decision::Bound { workload, task, .. } => (workload, task, true),
                Decision::Evicted { workload, task, .. } => (workload, task, false),
                _ => continue,
            };
            let Some(e) = self.entries.get(workload) else { continue };
            let Some(t) = e.spec.members.iter().find(|t| &t.id == task) else { continue };
            let d = self.wanted(e, demand(t));
            for q in self.queues.chain(e.leaf) {
                if bound {
                    pending[q] = pending[q].saturating_sub(&d);
                } else {
                    pending[q].saturating_add_assign(&d);
                }
            }
        }
    }

    /// Queues the fair-share plugin left out of its order wait for the next cycle.
    pub(super) fn not_served(&mut self, lists: &BTreeMap<usize, std::collections::VecDeque<String>>) {
        for (leaf, names) in lists {
            let queue = self.queues.get(*leaf).map(|q| q.name.clone()).unwrap_or_default();
            for name in names {
                if let Some(e) = self.entries.get_mut(name) {
                    e.explanation.queue = Some(format!("queue {queue} not served by fair share this cycle"));
                }
            }
        }
    }
}
