//! Preemption for one workload that does not fit: which running tasks the host *allows* as victims
//! (the rules in the parent module's docs), which the preempt plugin *chooses*, and an exact check
//! that the choice makes room before anything is evicted.
//!
//! Members are handled in order: each is placed plainly if the room freed so far suffices, else the
//! plugin is asked for victims on the nodes where preemption might help (nodes no filter rejects
//! as unresolvable). A victim whose group would drop below min-member brings its whole group, and a
//! victim queue is never pushed below its guarantee. The plugin's plan is verified by releasing the
//! victims and running the real filter → score → device chain on that node; a plan that does not
//! verify is rolled back and that node dropped (up to three tries per member). Until min-member
//! members have room nothing is evicted; if they never do, every change is rolled back. A gang
//! with a strict topology constraint does all this inside one domain at a time; with resource
//! flavors, inside one flavor's nodes and quota at a time, in the order placement tries them.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmsched_api::{PreemptCandidate, Resources, Task, Victim};

use super::{
    Decision, Entry, EvictReason, Leaving, Member, Phase, PreemptKind, QueueMove, SchedulerCore, ShareMove, demand_in,
};
use crate::node_accounting::{bind, release};
use crate::node_table::Slot;
use crate::placement::{Placement, place, place_among};
use crate::plugin::{CallContext, PolicyPlugin};
use crate::policy_set::PolicySet;
use crate::queue::fits;

/// Tries per member before giving up on plans that do not verify.
const PLAN_TRIES: usize = 3;

/// What the preemptor is and may do.
struct Preemptor<'a> {
    name: &'a str,
    leaf: usize,
    priority: i32,
    /// Its queue is at capability: only its own queue's work can make room.
    quota_bound: bool,
    /// Its queue stays within its deserved share once placed: it may reclaim.
    may_reclaim: bool,
    /// The queues on its path (its leaf, ancestors) that stay within their guarantee once it is
    /// placed: reclaiming from outside one of them takes back what was promised, so no maximum run
    /// time protects those victims.
    within_guarantee: Vec<usize>,
    /// What its min-member members take: the resources a reclaim is judged in.
    need: Resources,
    /// GPU-milli-seconds of work its reclaims may throw away
    /// ([`super::CoreConfig::reclaim_within_deficit`]); `None`: no such limit.
    budget: Option<u64>,
    /// The resource flavor tried (its name), whose quota the preemptor's members take.
    flavor: Option<&'a str>,
    /// The cycle's time (s): how long a reclaim victim has run.
    now: u64,
}

impl Preemptor<'_> {
    /// The running workloads whose members may be evicted for it: each member as (workload,
    /// index). One pass over the workloads; what does not depend on the victim is looked up once.
    fn eligible(&self, core: &SchedulerCore) -> Vec<(String, usize)> {
        let preempted_by = core.entries.get(self.name).map_or(&[][..], |p| p.preempted_by.as_slice());
        core.entries
            .values()
            .filter(|v| self.may_evict(core, v, preempted_by))
            .flat_map(|v| {
                v.members
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.as_ref().is_some_and(|m| m.leaving.is_none()))
                    .map(|(i, _)| (v.spec.name.clone(), i))
            })
            .collect()
    }

    /// Whether `v`'s running members may be evicted for it; `preempted_by` lists the workloads
    /// that preempted it.
    fn may_evict(&self, core: &SchedulerCore, v: &Entry, preempted_by: &[String]) -> bool {
        self.evictable(core, v, preempted_by, true)
    }

    /// Whether only the run times of reclaim keep every running workload from it: what the
    /// waiting reason then says.
    fn held_by_run_times(&self, core: &SchedulerCore) -> bool {
        let preempted_by = core.entries.get(self.name).map_or(&[][..], |p| p.preempted_by.as_slice());
        self.may_reclaim && core.entries.values().any(|v| self.evictable(core, v, preempted_by, false))
    }

    /// [`Self::may_evict`], with a reclaim's run-time window minded or not.
    fn evictable(&self, core: &SchedulerCore, v: &Entry, preempted_by: &[String], mind_run_time: bool) -> bool {
        if v.spec.name == self.name || !v.spec.preemptible || v.phase != Phase::Running {
            return false;
        }
        // The rules above cannot loop while deserved shares stand still; shares move with demand,
        // so this is the backstop that makes "never back and forth" hold regardless.
        if preempted_by.contains(&v.spec.name) {
            return false;
        }
        let surplus = v.running() > v.spec.min_member;
        if v.leaf == self.leaf {
            return v.spec.priority < self.priority || (surplus && v.spec.priority <= self.priority);
        }
        if self.quota_bound {
            return false;
        }
        if surplus && v.spec.priority <= self.priority {
            return true;
        }
        // A reclaim: the whole workload leaves (it is at its minimum), so it is judged whole.
        let Some(victim_queue) = core.queues.get(v.leaf) else { return false };
        if !(self.may_reclaim && victim_queue.reclaimable) {
            return false;
        }
        let min_runtime = victim_queue.reclaim_min_runtime_seconds.unwrap_or(core.config.reclaim_min_runtime_seconds);
        let max_runtime =
            match victim_queue.reclaim_max_runtime_seconds.unwrap_or(core.config.reclaim_max_runtime_seconds) {
                0 => u64::MAX,
                _ if self.within_guarantee.iter().any(|&q| !core.queues.chain(v.leaf).any(|x| x == q)) => u64::MAX,
                max => max,
            };
        if mind_run_time
            && !v
                .members
                .iter()
                .flatten()
                .all(|m| (min_runtime..=max_runtime).contains(&self.now.saturating_sub(m.started)))
        {
            return false;
        }
        let all: Vec<(String, usize)> =
            v.members.iter().enumerate().filter(|(_, m)| m.is_some()).map(|(i, _)| (v.spec.name.clone(), i)).collect();
        self.shares_allow(core, &self.reclaimed_from(core, &all))
            && self.budget.is_none_or(|b| self.lost_work(core, &all, &[]) <= b)
    }

    /// The members among `chosen` whose eviction is a reclaim: of another queue's workload that
    /// falls below its minimum (elastic surplus given up is not a reclaim).
    fn reclaims<'c>(
        &self,
        core: &SchedulerCore,
        chosen: &'c [(String, usize)],
    ) -> impl Iterator<Item = &'c (String, usize)> {
        chosen.iter().filter(move |(w, _)| {
            let v = &core.entries[w];
            let leaving = chosen.iter().filter(|(x, _)| x == w).count();
            v.leaf != self.leaf && v.running().saturating_sub(leaving) < v.spec.min_member
        })
    }

    /// GPU-milli-seconds of work the reclaims among `chosen` (and the other queues' members in
    /// `taken` already) throw away.
    fn lost_work(&self, core: &SchedulerCore, chosen: &[(String, usize)], taken: &[(String, usize, Member)]) -> u64 {
        let now_chosen = self
            .reclaims(core, chosen)
            .filter_map(|(w, i)| core.entries[w].members[*i].as_ref().map(|m| lost_work(core, w, *i, m, self.now)));
        let before = taken
            .iter()
            .filter(|(w, _, _)| core.entries[w].leaf != self.leaf)
            .map(|(w, i, m)| lost_work(core, w, *i, m, self.now));
        now_chosen.chain(before).fold(0, u64::saturating_add)
    }

    /// What the reclaims among `chosen` take from each queue outside the preemptor's own path (the
    /// victims' leaves and their ancestors below the queue both share).
    fn reclaimed_from(&self, core: &SchedulerCore, chosen: &[(String, usize)]) -> BTreeMap<usize, Resources> {
        let own: Vec<usize> = core.queues.chain(self.leaf).collect();
        let mut freed: BTreeMap<usize, Resources> = BTreeMap::new();
        for (w, i) in self.reclaims(core, chosen) {
            let v = &core.entries[w];
            let held = v.held(*i, &core.queues);
            for q in core.queues.chain(v.leaf).filter(|q| !own.contains(q)) {
                freed.entry(q).or_default().saturating_add_assign(&held);
            }
        }
        freed
    }

    /// The share rule of a reclaim (module docs): in the resources the preemptor needs, every
    /// queue that loses is above its deserved share in at least one of them, and stays at or above
    /// it in each of those after the eviction. With the preemptor's queue at or below its share
    /// after placement (`may_reclaim`), the preemptor's share after the move is never above the
    /// victim's (Kueue's rule); and because the loser keeps at least its share, a share that whole
    /// jobs cannot meet exactly leaves the last job where it runs instead of swapping it back and
    /// forth (the hysteresis: never less than a whole job's worth of imbalance).
    fn shares_allow(&self, core: &SchedulerCore, freed: &BTreeMap<usize, Resources>) -> bool {
        // No other queue loses anything (victims of the preemptor's own queue, surplus given up):
        // nothing for shares to judge, with or without a fair-share stage.
        if freed.is_empty() {
            return true;
        }
        let Some(deserved) = core.queue_use.deserved.as_ref() else { return false };
        freed.iter().all(|(&q, lost)| {
            let (held, owed) = (&core.queue_use.allocated[q], &deserved[q]);
            let mut over_in_some = false;
            for dim in dims(&self.need).filter(|d| d.of(&self.need) > 0 && d.of(lost) > 0) {
                if dim.of(held) > dim.of(owed) {
                    over_in_some = true;
                    if dim.of(held).saturating_sub(dim.of(lost)) < dim.of(owed) {
                        return false;
                    }
                }
            }
            over_in_some
        })
    }
}

/// GPU-milli-seconds of work member `i` of `w` (running as `m`) throws away when evicted at
/// `now`: its run time × its GPUs, none when its workload checkpoints.
fn lost_work(core: &SchedulerCore, w: &str, i: usize, m: &Member, now: u64) -> u64 {
    let v = &core.entries[w];
    if v.spec.checkpointable {
        return 0;
    }
    now.saturating_sub(m.started).saturating_mul(v.spec.members[i].gpu.total_milli())
}

/// One resource of a [`Resources`]: reclaim is judged resource by resource.
#[derive(Clone, Copy)]
enum Dim<'a> {
    Cpu,
    Memory,
    Gpu,
    Extended(&'a str),
}

impl Dim<'_> {
    fn of(self, r: &Resources) -> u64 {
        match self {
            Dim::Cpu => r.cpu_milli,
            Dim::Memory => r.memory_bytes,
            Dim::Gpu => r.gpu_milli,
            Dim::Extended(name) => r.extended(name),
        }
    }
}

/// The resources `r` names.
fn dims(r: &Resources) -> impl Iterator<Item = Dim<'_>> {
    [Dim::Cpu, Dim::Memory, Dim::Gpu].into_iter().chain(r.extended.iter().map(|(k, _)| Dim::Extended(k.as_ref())))
}

/// Make room for workload `name`; on success its members are bound (or it waits nominated for
/// checkpointing victims). On failure nothing has changed and the reason is returned.
pub(super) fn preempt(
    core: &mut SchedulerCore,
    set: &PolicySet,
    name: &str,
    now: u64,
    out: &mut Vec<Decision>,
) -> Result<(), String> {
    let choices = core.flavor_choices(core.entries[name].leaf);
    let mut reasons = Vec::new();
    for flavor in choices {
        if core.nodes_of(flavor).is_some_and(<[Slot]>::is_empty) {
            continue;
        }
        match preempt_with(core, set, name, flavor, now, out) {
            Ok(()) => return Ok(()),
            Err(reason) => match core.flavor_name(flavor) {
                Some(f) => reasons.push(format!("flavor {f}: {reason}")),
                None if core.nodes_of(flavor).is_some() => reasons.push(format!("nodes of no flavor: {reason}")),
                None => reasons.push(reason),
            },
        }
    }
    Err(reasons.join("; "))
}

/// [`preempt`] with one flavor choice: its nodes, its quota.
fn preempt_with(
    core: &mut SchedulerCore,
    set: &PolicySet,
    name: &str,
    flavor: Option<usize>,
    now: u64,
    out: &mut Vec<Decision>,
) -> Result<(), String> {
    let plugin = set.preempt().cloned().ok_or("no preempt plugin")?;
    let e = &core.entries[name];
    let within = core.nodes_of(flavor);
    // A strict gang must end up inside one domain of its outermost tier: preemption is tried
    // domain by domain (tightest first, as placement orders them), victims only from inside.
    let domains: Vec<Option<Vec<Slot>>> = match e.spec.topology.as_ref().filter(|t| t.strict) {
        Some(t) => {
            let outer = t.tiers.len().saturating_sub(1);
            crate::gang::domains(&core.nodes, &t.tiers[outer..])
                .into_iter()
                .map(|(_, mut slots)| {
                    if let Some(within) = within {
                        slots.retain(|s| within.binary_search(s).is_ok());
                    }
                    Some(slots)
                })
                .filter(|slots| slots.as_ref().is_some_and(|s| !s.is_empty()))
                .collect()
        }
        None => vec![within.map(<[Slot]>::to_vec)],
    };
    let (admitted, _) = core.admitted_members(e, flavor);
    let min = e.spec.min_member;
    let flavor_name = core.flavor_name(flavor).map(str::to_string);
    let mut need = Resources::default();
    for m in &e.spec.members[..min] {
        need.saturating_add_assign(&demand_in(m, flavor_name.as_deref(), &core.queues));
    }
    let may_reclaim = core
        .queue_use
        .deserved
        .as_ref()
        .is_some_and(|d| core.queue_use.allocated[e.leaf].checked_add(&need).is_some_and(|t| fits(&t, &d[e.leaf])));
    let within_guarantee = core
        .queues
        .chain(e.leaf)
        .filter(|&q| {
            core.queues
                .get(q)
                .is_some_and(|spec| within_guarantee(&core.queue_use.allocated[q], &need, &spec.guarantee))
        })
        .collect();
    let who = Preemptor {
        name,
        leaf: e.leaf,
        priority: e.spec.priority,
        quota_bound: admitted < min,
        may_reclaim,
        within_guarantee,
        need,
        budget: (core.config.reclaim_within_deficit > 0)
            .then(|| core.queue_use.starved.get(e.leaf).copied().unwrap_or(0)),
        flavor: flavor_name.as_deref(),
        now,
    };
    let members: Vec<Task> =
        e.spec.members.iter().map(|t| core.prepare(t, flavor, &mut None)).collect::<Result<_, _>>()?;
    let leaf = e.leaf;

    let eligible = who.eligible(core);
    if eligible.is_empty() {
        return Err(if who.quota_bound {
            "no lower-priority work in its own queue to make room within the quota".into()
        } else if who.held_by_run_times(core) {
            "no running task may be evicted for it: the runs it could reclaim are younger than their minimum run time or older than the maximum run time for reclaim (waited out)".into()
        } else {
            "no running task may be evicted for it (lower priority in its queue, elastic surplus, or borrowed by a queue above its deserved share)".into()
        });
    }

    let mut taken: Vec<(String, usize, Member)> = Vec::new();
    if who.quota_bound {
        // The queue's limit (or a lender's reserve) keeps it out however much room the nodes
        // have: first free quota within the queue, then find room on nodes as usual.
        if let Err(reason) = free_quota(core, name, flavor, &eligible, now, &mut taken) {
            for (w, i, m) in taken.into_iter().rev() {
                core.rebind(&w, i, m);
            }
            return Err(reason);
        }
    }
    let mut found = None;
    let mut reason = String::from("no topology domain to preempt in");
    for domain in &domains {
        let mut in_domain = Vec::new();
        match fill(core, set, &plugin, &who, &members, &eligible, domain.as_deref(), now, out, &mut in_domain) {
            Ok(placed) => {
                taken.extend(in_domain);
                found = Some(placed);
                break;
            }
            Err(r) => {
                for (w, i, m) in in_domain.into_iter().rev() {
                    core.rebind(&w, i, m);
                }
                reason = r;
            }
        }
    }
    let Some(placed) = found else {
        for (w, i, m) in taken.into_iter().rev() {
            core.rebind(&w, i, m);
        }
        return Err(reason);
    };

    // Commit: victims that can checkpoint are asked to and keep running until they report or
    // their grace period ends; the rest are evicted now. With graceful termination the preemptor
    // waits nominated for every victim to be gone, their room in use until then.
    let grace = |core: &SchedulerCore, w: &str| {
        let v = &core.entries[w];
        if v.spec.checkpointable { v.spec.grace_seconds.unwrap_or(core.config.checkpoint_grace_seconds) } else { 0 }
    };
    let waits = core.config.await_termination || taken.iter().any(|(w, _, _)| grace(core, w) > 0);
    if waits {
        unplace(core, &members, &placed);
        core.entries.get_mut(name).expect("preemptor exists").phase = Phase::Preempting;
    }
    // Which rule lets each victim go, on the whole plan: the victims are released at this point,
    // so a job still at its minimum only lost elastic surplus; otherwise its queue decides, and a
    // reclaim records the shares it moved.
    let deserved_gpu = |core: &SchedulerCore, q: usize| {
        core.queue_use.deserved.as_ref().and_then(|d| d.get(q)).map_or(0, |d| d.gpu_milli)
    };
    let mut reclaimed_gpu: BTreeMap<usize, u64> = BTreeMap::new();
    for (w, i, m) in &taken {
        let v = &core.entries[w];
        if v.leaf != leaf {
            let held = demand_in(&v.spec.members[*i], m.flavor.as_deref(), &core.queues);
            *reclaimed_gpu.entry(v.leaf).or_default() += held.gpu_milli;
        }
    }
    let preemptor_before = core.queue_use.allocated[leaf].gpu_milli;
    let preemptor_queue = QueueMove {
        before_gpu_milli: preemptor_before,
        after_gpu_milli: preemptor_before.saturating_add(who.need.gpu_milli),
        deserved_gpu_milli: deserved_gpu(core, leaf),
    };
    let kind_of = |core: &SchedulerCore, w: &str, i: usize, m: &Member| {
        let v = &core.entries[w];
        if v.placed() >= v.spec.min_member {
            return PreemptKind::ElasticShrink;
        }
        if v.leaf == leaf {
            return PreemptKind::Priority;
        }
        let after = core.queue_use.allocated[v.leaf].gpu_milli;
        PreemptKind::Reclaim(ShareMove {
            victim_queue: QueueMove {
                before_gpu_milli: after.saturating_add(reclaimed_gpu.get(&v.leaf).copied().unwrap_or(0)),
                after_gpu_milli: after,
                deserved_gpu_milli: deserved_gpu(core, v.leaf),
            },
            preemptor_queue,
            lost_gpu_seconds: lost_work(core, w, i, m, now) / 1000,
        })
    };
    let kinds: Vec<PreemptKind> = taken.iter().map(|(w, i, m)| kind_of(core, w, *i, m)).collect();
    let spent: u64 = kinds
        .iter()
        .map(|k| match k {
            PreemptKind::Reclaim(m) => m.lost_gpu_seconds.saturating_mul(1000),
            _ => 0,
        })
        .fold(0, u64::saturating_add);
    if let Some(starved) = core.queue_use.starved.get_mut(leaf) {
        *starved = starved.saturating_sub(spent);
    }
    let mut waiting_for = Vec::new();
    let mut victim_workloads: Vec<String> = Vec::new();
    for ((w, i, mut m), kind) in taken.into_iter().zip(kinds) {
        let v = core.entries.get_mut(&w).expect("victims exist");
        if !v.preempted_by.iter().any(|p| p == name) {
            v.preempted_by.push(name.to_string());
        }
        let g = grace(core, &w);
        let task = core.entries[&w].spec.members[i].id.clone();
        if g > 0 {
            let deadline = now.saturating_add(g);
            m.leaving = Some(Leaving { deadline, preemptor: name.to_string(), kind });
            core.rebind(&w, i, m);
            out.push(Decision::PreemptionRequested { workload: w.clone(), task, preemptor: name.into(), deadline });
            waiting_for.push((w, i));
        } else {
            let victim = core.entries[&w].spec.members[i].clone();
            if core.config.await_termination {
                core.leave_terminating(&m, victim, Some(name));
            } else if waits {
                core.hold(name, &m, victim);
            }
            out.push(Decision::Evicted {
                workload: w.clone(),
                task,
                node: m.node,
                reason: EvictReason::Preempted { preemptor: name.into(), kind, checkpointed: false },
            });
            if !victim_workloads.contains(&w) {
                victim_workloads.push(w);
            }
        }
    }
    for w in victim_workloads {
        core.after_eviction(&w, now, out);
    }
    core.unpark_all();
    if waits {
        // Nothing changed for it since it was decided: parked until the cluster changes.
        let epoch = core.last_cycle.epoch;
        let e = core.entries.get_mut(name).expect("preemptor exists");
        e.parked_at = Some(epoch);
        e.waiting_for = waiting_for;
        let message = core.waiting_message(name);
        core.entries.get_mut(name).expect("preemptor exists").explanation.preemption = Some(message);
    } else {
        core.commit(name, placed, flavor, None, now, out);
    }
    Ok(())
}

/// Place the preemptor's members in order — plainly where the room freed so far suffices, else
/// with victims the plugin chooses — until min-member of them are placed, inside `domain` when
/// given. Victims released go to `taken`; on failure the members placed are released again (the
/// caller rebinds `taken`).
#[allow(clippy::too_many_arguments)]
fn fill(
    core: &mut SchedulerCore,
    set: &PolicySet,
    plugin: &Arc<dyn PolicyPlugin>,
    who: &Preemptor<'_>,
    members: &[Task],
    eligible: &[(String, usize)],
    domain: Option<&[Slot]>,
    now: u64,
    out: &mut Vec<Decision>,
    taken: &mut Vec<(String, usize, Member)>,
) -> Result<Vec<(usize, Placement)>, String> {
    let min = core.entries[who.name].spec.min_member;
    let eligible: Vec<(String, usize)> = match domain {
        None => eligible.to_vec(),
        Some(slots) => eligible
            .iter()
            .filter(|(w, i)| core.entries[w].members[*i].as_ref().is_some_and(|m| slots.contains(&m.slot)))
            .cloned()
            .collect(),
    };
    let mut placed: Vec<(usize, Placement)> = Vec::new();
    let mut reason = String::new();
    for (i, task) in members.iter().enumerate() {
        if placed.len() == min || placed.len() + (members.len() - i) < min {
            break;
        }
        let plain = match domain {
            None => place(set, &core.nodes, task, 0),
            Some(slots) => place_among(set, &core.nodes, task, 0, slots),
        };
        if let Ok(p) = plain
            && matches!(core.nodes.update_usage(p.node, |n| bind(n, task, &p.devices)), Some(Ok(())))
        {
            placed.push((i, p));
            continue;
        }
        match room_for(core, set, plugin, who, task, &eligible, taken, now, out) {
            Ok(p) => placed.push((i, p)),
            Err(r) => {
                reason = r;
                break;
            }
        }
    }
    let mut placed_demand = Resources::default();
    for (i, _) in &placed {
        placed_demand.saturating_add_assign(&demand_in(&members[*i], who.flavor, &core.queues));
    }
    if placed.len() >= min && core.within_capability(who.leaf, &placed_demand) {
        return Ok(placed);
    }
    if placed.len() >= min {
        reason = "evicting what the plugin chose would still leave the queue over its capability".into();
    }
    unplace(core, members, &placed);
    Err(reason)
}

/// Release lower-priority tasks of the preemptor's own queue until its quota admits min-member
/// members (Kueue's `withinClusterQueue: LowerPriority`). Chosen in the built-in plugin's order —
/// elastic surplus first, then lowest priority, then least GPU-time lost (none for checkpointable
/// work) — whole groups when a group would fall below min-member. The plugin's node-level choice
/// follows for whatever room the nodes still lack.
fn free_quota(
    core: &mut SchedulerCore,
    name: &str,
    flavor: Option<usize>,
    eligible: &[(String, usize)],
    now: u64,
    taken: &mut Vec<(String, usize, Member)>,
) -> Result<(), String> {
    let min = core.entries[name].spec.min_member;
    let cost = |core: &SchedulerCore, (w, i): &(String, usize)| {
        let v = &core.entries[w];
        let surplus = v.running() > v.spec.min_member;
        let lost = if v.spec.checkpointable {
            0
        } else {
            let started = v.members[*i].as_ref().map_or(now, |m| m.started);
            now.saturating_sub(started).saturating_mul(u64::from(v.spec.members[*i].gpu.count.max(1)))
        };
        (!surplus, v.spec.priority, lost, w.clone(), *i)
    };
    let mut order: Vec<(String, usize)> = eligible.to_vec();
    order.sort_by_cached_key(|v| cost(core, v));
    for victim in order {
        if core.admitted_members(&core.entries[name], flavor).0 >= min {
            return Ok(());
        }
        if core.entries[&victim.0].members[victim.1].is_none() {
            continue; // already taken with its group
        }
        let mut chosen = vec![victim];
        whole_groups(core, &mut chosen);
        for (w, i) in chosen {
            if let Some(m) = core.unbind(&w, i) {
                taken.push((w, i, m));
            }
        }
    }
    if core.admitted_members(&core.entries[name], flavor).0 >= min {
        Ok(())
    } else {
        Err("evicting every lower-priority task of its queue would not bring it within its quota".into())
    }
}

/// Release the preemptor's tentatively bound members.
fn unplace(core: &mut SchedulerCore, members: &[Task], placed: &[(usize, Placement)]) {
    for (i, p) in placed {
        core.nodes.update_usage(p.node, |n| release(n, &members[*i], &p.devices));
    }
}

/// Find and verify victims that make room for `task`; on success the victims are released (in
/// `taken`) and `task` is bound where the returned placement says.
#[allow(clippy::too_many_arguments)]
fn room_for(
    core: &mut SchedulerCore,
    set: &PolicySet,
    plugin: &Arc<dyn PolicyPlugin>,
    who: &Preemptor<'_>,
    task: &Task,
    eligible: &[(String, usize)],
    taken: &mut Vec<(String, usize, Member)>,
    now: u64,
    out: &mut Vec<Decision>,
) -> Result<Placement, String> {
    let mut by_slot: BTreeMap<Slot, Vec<(String, usize)>> = BTreeMap::new();
    for (w, i) in eligible {
        if let Some(m) = core.entries[w].members[*i].as_ref() {
            by_slot.entry(m.slot).or_default().push((w.clone(), *i));
        }
    }
    let mut slots = might_help(core, set, task, by_slot.keys().copied().collect());
    slots.truncate(core.config.max_preemption_candidates);
    for _ in 0..PLAN_TRIES {
        if slots.is_empty() {
            return Err("no node where evicting the allowed victims could make room".into());
        }
        let mut lists: Vec<Vec<(String, usize)>> = Vec::new();
        let mut candidates: Vec<PreemptCandidate> = Vec::new();
        for &slot in &slots {
            let mut list = by_slot[&slot].clone();
            list.sort_by_key(|(w, i)| (core.entries[w].spec.priority, w.clone(), *i));
            candidates.push(PreemptCandidate {
                node: slot,
                victims: list.iter().map(|(w, i)| victim(core, w, *i, now)).collect(),
            });
            lists.push(list);
        }
        let plan = match plugin.select_victims(CallContext { worker: 0, nodes: &core.nodes }, task, &candidates) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Err(format!("{} found no victims that make room", plugin.name())),
            Err(fault) => {
                let msg = format!("{fault}");
                out.push(Decision::Fault(fault));
                return Err(msg);
            }
        };
        let c = plan.candidate as usize;
        let slot = slots[c];
        let mut chosen: Vec<(String, usize)> = plan.victims.iter().map(|&v| lists[c][v as usize].clone()).collect();
        whole_groups(core, &mut chosen);
        if !guarantees_hold(core, who.leaf, &chosen)
            || !who.shares_allow(core, &who.reclaimed_from(core, &chosen))
            || who.budget.is_some_and(|b| who.lost_work(core, &chosen, taken) > b)
        {
            slots.retain(|&s| s != slot);
            continue;
        }
        let mut released = Vec::new();
        for (w, i) in &chosen {
            if let Some(m) = core.unbind(w, *i) {
                released.push((w.clone(), *i, m));
            }
        }
        if let Ok(p) = place_among(set, &core.nodes, task, 0, &[slot])
            && matches!(core.nodes.update_usage(slot, |n| bind(n, task, &p.devices)), Some(Ok(())))
        {
            taken.extend(released);
            return Ok(p);
        }
        for (w, i, m) in released.into_iter().rev() {
            core.rebind(&w, i, m);
        }
        slots.retain(|&s| s != slot);
    }
    Err(format!("{}'s choices did not make room when checked", plugin.name()))
}

fn victim(core: &SchedulerCore, w: &str, i: usize, now: u64) -> Victim {
    let v = &core.entries[w];
    let started = v.members[i].as_ref().map_or(now, |m| m.started);
    Victim {
        task: v.spec.members[i].clone(),
        running_seconds: now.saturating_sub(started),
        group_running: v.running() as u32,
        group_min_member: v.spec.min_member as u32,
        checkpointable: v.spec.checkpointable,
    }
}

/// A victim whose group would fall below min-member brings every running member of the group.
fn whole_groups(core: &SchedulerCore, chosen: &mut Vec<(String, usize)>) {
    let mut groups: Vec<String> = chosen.iter().map(|(w, _)| w.clone()).collect();
    groups.dedup();
    for w in groups {
        let v = &core.entries[&w];
        let leaving = chosen.iter().filter(|(x, _)| *x == w).count();
        if v.placed().saturating_sub(leaving) < v.spec.min_member {
            for (i, m) in v.members.iter().enumerate() {
                if m.as_ref().is_some_and(|m| m.leaving.is_none()) && !chosen.contains(&(w.clone(), i)) {
                    chosen.push((w.clone(), i));
                }
            }
        }
    }
}

/// Whether `held` + `need` stays within `guarantee` in every resource the guarantee names that
/// `need` asks for, at least one of them: the work reclaims what its queue was promised.
fn within_guarantee(held: &Resources, need: &Resources, guarantee: &Resources) -> bool {
    let asked: Vec<Dim> = dims(need).filter(|d| d.of(need) > 0 && d.of(guarantee) > 0).collect();
    !asked.is_empty() && asked.iter().all(|d| d.of(held).saturating_add(d.of(need)) <= d.of(guarantee))
}

/// No victim queue other than the preemptor's may drop below its guarantee in a resource it loses.
fn guarantees_hold(core: &SchedulerCore, leaf: usize, chosen: &[(String, usize)]) -> bool {
    let mut removed: BTreeMap<usize, Resources> = BTreeMap::new();
    for (w, i) in chosen {
        let v = &core.entries[w];
        if v.leaf != leaf {
            removed.entry(v.leaf).or_default().saturating_add_assign(&v.held(*i, &core.queues));
        }
    }
    removed.iter().all(|(&q, r)| {
        let Some(g) = core.queues.get(q).map(|s| &s.guarantee) else { return true };
        let after = core.queue_use.allocated[q].saturating_sub(r);
        let dims_ok = (r.cpu_milli == 0 || after.cpu_milli >= g.cpu_milli)
            && (r.memory_bytes == 0 || after.memory_bytes >= g.memory_bytes)
            && (r.gpu_milli == 0 || after.gpu_milli >= g.gpu_milli);
        dims_ok && r.extended.iter().all(|(n, v)| *v == 0 || after.extended(n) >= g.extended(n))
    })
}

/// kube-scheduler's "nodes where preemption might help": drop nodes a filter rejects for a reason
/// eviction cannot change (selector, taint, GPU model). A filter fault keeps the nodes (the exact
/// check afterwards decides).
fn might_help(core: &SchedulerCore, set: &PolicySet, task: &Task, mut slots: Vec<Slot>) -> Vec<Slot> {
    let ctx = CallContext { worker: 0, nodes: &core.nodes };
    for filter in set.filters() {
        if slots.is_empty() {
            break;
        }
        if let Ok(batch) = filter.filter(ctx, task, &slots, usize::MAX) {
            let keep: Vec<bool> = batch
                .codes
                .iter()
                .map(|&c| c == 0 || batch.reasons.get(usize::from(c) - 1).is_some_and(|r| !r.unresolvable))
                .collect();
            let mut k = keep.iter();
            slots.retain(|_| *k.next().unwrap_or(&true));
        }
    }
    slots
}
