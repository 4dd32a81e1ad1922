//! Evicting a member, and what follows for its group: below min-member the whole group stops and
//! goes back to its queue.

use super::*;

impl SchedulerCore {
    /// Evict a placed member for good.
    pub(super) fn evict(&mut self, wl: &str, idx: usize, reason: EvictReason, now: u64, out: &mut Vec<Decision>) {
        let Some(m) = self.unbind(wl, idx) else { return };
        let task = self.entries[wl].spec.members[idx].clone();
        match &reason {
            // Nobody stops a pod on a node that is gone or shrank under it: nothing to wait for.
            EvictReason::NodeLost => {}
            EvictReason::Preempted { preemptor, .. } if self.config.await_termination => {
                self.leave_terminating(&m, task, Some(preemptor));
            }
            EvictReason::GangBroken if self.config.await_termination => self.leave_terminating(&m, task, None),
            EvictReason::Preempted { preemptor, .. } => self.hold(preemptor, &m, task),
            EvictReason::GangBroken => {}
        }
        let task = self.entries[wl].spec.members[idx].id.clone();
        out.push(Decision::Evicted { workload: wl.into(), task, node: m.node, reason });
        self.after_eviction(wl, now, out);
        self.unpark_all();
    }

    /// A group below min-member stops entirely and goes back to its queue.
    pub(super) fn after_eviction(&mut self, wl: &str, now: u64, out: &mut Vec<Decision>) {
        let Some(e) = self.entries.get(wl) else { return };
        let (placed, min) = (e.placed(), e.spec.min_member);
        if placed > 0 && placed < min {
            let rest: Vec<usize> = (0..e.members.len()).filter(|&i| e.members[i].is_some()).collect();
            for i in rest {
                self.evict(wl, i, EvictReason::GangBroken, now, out);
            }
            return;
        }
        if placed == 0
            && let Some(e) = self.entries.get_mut(wl)
            && e.phase != Phase::TimedOut
        {
            // Back in its queue with the initial back-off, so it is not tried again in the cycle that
            // evicted it.
            e.phase = Phase::Pending;
            e.since = now;
            e.attempts = 0;
            e.not_before = now.saturating_add(self.config.backoff_initial_seconds);
            e.parked_at = None;
        }
    }
}
