//! Time in the cycle: back-off and parking after a failed attempt, grace periods and gang
//! timeouts running out, and the next moment something is due.

use super::*;

impl SchedulerCore {
    /// The earliest time something happens without outside input (a back-off ends, a grace
    /// period runs out, a gang times out), so a driver can sleep until then instead of polling.
    pub fn next_wakeup(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        for e in self.entries.values() {
            match e.phase {
                Phase::Pending | Phase::Preempting if !self.is_parked(e) => at(e.not_before),
                _ => {}
            }
            if e.phase == Phase::Pending && e.spec.is_group() {
                at(e.since.saturating_add(self.timeout_of(e)));
            }
            if let Some(t) = e.wake_at {
                at(t);
            }
            for m in e.members.iter().flatten() {
                if let Some(l) = &m.leaving {
                    at(l.deadline);
                }
            }
        }
        next
    }

    /// `dt` seconds passed as the last cycle left the queues: each leaf that was short of its
    /// deserved GPU share with work waiting accrues the shortfall; any other starts over from
    /// nothing (it had its share, or wanted no more).
    fn accrue_starvation(&mut self, dt: u64) {
        let factor = u64::from(self.config.reclaim_within_deficit);
        let use_ = &mut self.queue_use;
        for (starved, &rate) in use_.starved.iter_mut().zip(&use_.starving) {
            *starved =
                if rate > 0 { starved.saturating_add(rate.saturating_mul(dt).saturating_mul(factor)) } else { 0 };
        }
    }

    /// After a cycle: how far short of its deserved GPU share each leaf with work waiting is.
    pub(super) fn note_starving(&mut self) {
        let tasks = self.queue_tasks();
        let deserved = self.queue_use.deserved.as_ref();
        for q in 0..self.queues.len() {
            let short = deserved.map_or(0, |d| d[q].gpu_milli.saturating_sub(self.queue_use.allocated[q].gpu_milli));
            self.queue_use.starving[q] = if self.queues.is_leaf(q) && tasks[q].0 > 0 { short } else { 0 };
        }
    }

    pub(super) fn timeout_of(&self, e: &Entry) -> u64 {
        e.spec.timeout_seconds.unwrap_or(self.config.gang_timeout_seconds)
    }

    /// Let time pass: usage decays and accrues, grace periods and gang timeouts expire.
    pub(super) fn advance(&mut self, now: u64, out: &mut Vec<Decision>) {
        if now > self.queue_use.usage_at && self.config.reclaim_within_deficit > 0 {
            self.accrue_starvation(now - self.queue_use.usage_at);
        }
        if now > self.queue_use.usage_at {
            let dt = (now - self.queue_use.usage_at) as f64;
            let decay = 0.5f64.powf(dt / self.config.usage_half_life_seconds.max(1) as f64);
            for (u, a) in self.queue_use.usage.iter_mut().zip(&self.queue_use.allocated) {
                *u = *u * decay + a.gpu_milli as f64 * dt;
            }
            self.queue_use.usage_at = now;
        }
        let expired: Vec<(String, usize, Leaving)> = self
            .entries
            .iter()
            .flat_map(|(name, e)| {
                e.members.iter().enumerate().filter_map(move |(i, m)| {
                    let l = m.as_ref()?.leaving.as_ref()?;
                    (l.deadline <= now).then(|| (name.clone(), i, l.clone()))
                })
            })
            .collect();
        for (wl, i, Leaving { preemptor, kind, .. }) in expired {
            self.evict(&wl, i, EvictReason::Preempted { preemptor, kind, checkpointed: false }, now, out);
        }
        let timed_out: Vec<String> = self
            .entries
            .values()
            .filter(|e| {
                e.phase == Phase::Pending && e.spec.is_group() && now >= e.since.saturating_add(self.timeout_of(e))
            })
            .map(|e| e.spec.name.clone())
            .collect();
        for name in timed_out {
            let Some(e) = self.entries.get_mut(&name) else { continue };
            e.phase = Phase::TimedOut;
            e.explanation.queue = Some(format!("gang timed out after {} s unplaced", now - e.since));
            out.push(Decision::TimedOut { workload: name });
        }
    }

    /// Record a failed attempt: back off, park until the cluster changes, explain.
    pub(super) fn unschedulable(
        &mut self,
        name: &str,
        mut explanation: Explanation,
        now: u64,
        out: &mut Vec<Decision>,
    ) {
        let e = self.entries.get_mut(name).expect("attempted workloads exist");
        e.attempts += 1;
        let exp = e.attempts.saturating_sub(1).min(30);
        let backoff = self.config.backoff_initial_seconds.saturating_mul(1 << exp).min(self.config.backoff_max_seconds);
        e.not_before = now.saturating_add(backoff);
        e.parked_at = Some(self.last_cycle.epoch);
        // Waiting for one domain: tried again when the wait ends, cluster changed or not.
        e.wake_at = e
            .spec
            .topology
            .as_ref()
            .filter(|t| !t.strict && t.wait_seconds > 0)
            .map(|t| e.since.saturating_add(t.wait_seconds))
            .filter(|&t| t > now);
        e.phase = if e.placed() > 0 || e.phase == Phase::Preempting { e.phase } else { Phase::Pending };
        if e.spec.members.iter().any(|m| !m.pod_terms().affinity.is_empty()) {
            self.affinity.affinity_parked.insert(name.to_string());
        }
        explanation.attempts = e.attempts;
        explanation.retry_at = Some(e.not_before);
        e.explanation = explanation.clone();
        debug!(workload = name, %explanation, "unschedulable");
        out.push(Decision::Unschedulable { workload: name.into(), explanation });
    }

    /// The cluster changed: everything parked may be tried again (after its back-off).
    pub(super) fn unpark_all(&mut self) {
        self.last_cycle.epoch += 1;
        self.affinity.affinity_parked.clear();
    }

    /// A pod with labels started: parked work with required pod affinity may be tried again
    /// (after its back-off), since that pod may be the one it waits for.
    pub(super) fn wake_affinity_waiters(&mut self) {
        for name in std::mem::take(&mut self.affinity.affinity_parked) {
            if let Some(e) = self.entries.get_mut(&name) {
                e.parked_at = None;
            }
        }
    }

    pub(super) fn is_parked(&self, e: &Entry) -> bool {
        e.parked_at == Some(self.last_cycle.epoch)
    }
}
