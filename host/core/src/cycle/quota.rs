//! Admission and quotas: which members a queue's limits admit, capabilities up the tree, and the
//! reserves lending queues keep.

use super::*;

/// The unused reserves of lending queues off one leaf's path, all allocations, and what the leaf
/// may add within a guarantee on its path.
pub(super) struct Reserves {
    pub(super) reserved: Resources,
    pub(super) used: Resources,
    pub(super) headroom: Resources,
}

impl Reserves {
    /// A lending limit bounds what others *borrow* (Kueue's semantics): in every resource some
    /// queue reserves and `extra` goes beyond the guarantees on the leaf's path, all allocations
    /// plus `extra` plus the reserves stay within `capacity`. Quota-level, like Kueue's cohorts:
    /// which nodes the reserve sits on is left to placement.
    pub(super) fn admit(&self, extra: &Resources, capacity: &Resources) -> bool {
        let (r, u, h) = (&self.reserved, &self.used, &self.headroom);
        let ok = |reserved: u64, used: u64, headroom: u64, extra: u64, cap: u64| {
            reserved == 0 || extra <= headroom || used.saturating_add(extra).saturating_add(reserved) <= cap
        };
        ok(r.cpu_milli, u.cpu_milli, h.cpu_milli, extra.cpu_milli, capacity.cpu_milli)
            && ok(r.memory_bytes, u.memory_bytes, h.memory_bytes, extra.memory_bytes, capacity.memory_bytes)
            && ok(r.gpu_milli, u.gpu_milli, h.gpu_milli, extra.gpu_milli, capacity.gpu_milli)
            && r.extended.iter().all(|(n, v)| ok(*v, u.extended(n), 0, extra.extended(n), capacity.extended(n)))
    }
}

impl SchedulerCore {
    /// How many of `e`'s members (in order) the limits of its queue and ancestors admit on top of
    /// what they hold, and why no more: the first queue at its limit, or the lenders whose
    /// reserves the rest would take. Placed with `flavor`, members take its quota too.
    pub(super) fn admitted_members(&self, e: &Entry, flavor: Option<usize>) -> (usize, Option<String>) {
        let flavor = self.flavor_name(flavor);
        let demand = |m| demand_in(m, flavor, &self.queues);
        let mut admitted = e.spec.members.len();
        let mut limiter = None;
        for q in self.queues.chain(e.leaf) {
            let Some(cap) = self.queues.limit(q) else { continue };
            let mut total = self.queue_use.allocated[q].clone();
            let mut n = 0;
            for m in &e.spec.members {
                match total.checked_add(&demand(m)) {
                    Some(t) if fits(&t, cap) => {
                        total = t;
                        n += 1;
                    }
                    _ => break,
                }
            }
            if n < admitted {
                admitted = n;
                limiter = self.queues.get(q).map(|s| {
                    let what = if s.capability.as_ref() == Some(cap) { "capability" } else { "borrowing limit" };
                    format!("queue {} at {what}", s.name)
                });
            }
        }
        if let Some(reserves) = self.reserves_against(e.leaf) {
            let mut extra = Resources::default();
            let mut n = 0;
            for m in &e.spec.members[..admitted] {
                let Some(t) = extra.checked_add(&demand(m)) else { break };
                if !reserves.admit(&t, &self.last_cycle.capacity) {
                    break;
                }
                extra = t;
                n += 1;
            }
            if n < admitted {
                admitted = n;
                limiter = Some(
                    "the rest is reserved by queues that lend only part of their guarantee (lending limit)".into(),
                );
            }
        }
        (admitted, limiter)
    }

    /// The leaf queue's admission limits (Q3–Q5, in this order:
    /// job count, GPUs, priority). Running workloads count towards the job limit.
    pub(super) fn admit(&self, w: &Workload, leaf: usize) -> Result<(), WorkloadError> {
        let Some(spec) = self.queues.get(leaf) else { return Ok(()) };
        let a = &spec.admission;
        let refuse =
            |reason: String| Err(WorkloadError::Refused { workload: w.name.clone(), queue: spec.name.clone(), reason });
        if let Some(max) = a.max_jobs {
            // O(workloads), only for queues with the limit.
            let held = self.entries.values().filter(|e| e.leaf == leaf).count();
            if held >= max as usize {
                return refuse(format!("queue job limit reached: {max}"));
            }
        }
        if let Some(max) = a.max_gpus_per_job {
            let milli: u64 = w.members.iter().map(|t| u64::from(t.gpu.count) * u64::from(t.gpu.milli_per_gpu)).sum();
            let gpus = milli.div_ceil(u64::from(wasmsched_api::GPU_MILLI));
            if gpus > u64::from(max) {
                return refuse(format!("job GPU request {gpus} exceeds limit {max}"));
            }
        }
        if let Some((min, max)) = a.priority_range
            && !(min..=max).contains(&w.priority)
        {
            return refuse(format!("job priority {} out of allowed range [{min}, {max}]", w.priority));
        }
        Ok(())
    }

    /// Whether `extra` more fits the limits of `leaf` and every ancestor, and leaves free what
    /// lending queues keep for themselves.
    pub(super) fn within_capability(&self, leaf: usize, extra: &Resources) -> bool {
        self.queues.chain(leaf).all(|q| {
            self.queues
                .limit(q)
                .is_none_or(|c| self.queue_use.allocated[q].checked_add(extra).is_some_and(|t| fits(&t, c)))
        }) && self.leaves_reserves(leaf, extra)
    }

    /// Whether `extra` more for `leaf` keeps the unused reserves of queues outside its path free.
    pub(super) fn leaves_reserves(&self, leaf: usize, extra: &Resources) -> bool {
        self.reserves_against(leaf).is_none_or(|r| r.admit(extra, &self.last_cycle.capacity))
    }

    /// What lending queues keep from `leaf`'s work, what is allocated already, and how much more
    /// the leaf may take without borrowing; `None` when no queue keeps anything. Constant while
    /// only `leaf`'s own path allocates more.
    pub(super) fn reserves_against(&self, leaf: usize) -> Option<Reserves> {
        let (unused, used) = self
            .queue_use
            .reserves
            .get_or_init(|| {
                if !self.queues.has_reserves() {
                    return None;
                }
                let mut used = Resources::default();
                for q in (0..self.queues.len()).filter(|&q| self.queues.parent(q).is_none()) {
                    used.saturating_add_assign(&self.queue_use.allocated[q]);
                }
                Some((self.queues.unused_reserves(&self.queue_use.allocated), used))
            })
            .as_ref()?;
        // Work within the guarantee of its queue or of any ancestor borrows nothing.
        let mut headroom = Resources::default();
        for q in self.queues.chain(leaf) {
            if let Some(spec) = self.queues.get(q) {
                let room = spec.guarantee.saturating_sub(&self.queue_use.allocated[q]);
                headroom.cpu_milli = headroom.cpu_milli.max(room.cpu_milli);
                headroom.memory_bytes = headroom.memory_bytes.max(room.memory_bytes);
                headroom.gpu_milli = headroom.gpu_milli.max(room.gpu_milli);
            }
        }
        Some(Reserves { reserved: self.queues.reserved_against(leaf, unused), used: used.clone(), headroom })
    }
}
