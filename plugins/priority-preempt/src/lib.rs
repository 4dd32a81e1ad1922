//! `priority-preempt`: the built-in preempt policy. For a task that fits nowhere it picks, among
//! the victims the host allows on each candidate node, the cheapest set that makes room:
//!
//! 1. victims that are running under their minimum-runtime protection, or (same queue, not elastic
//!    surplus) are less than `min_priority_diff` below the preemptor, are never chosen;
//! 2. on each node, victims are added cheapest first until the preemptor fits, then any victim
//!    that turns out unnecessary is dropped again (most expensive first). Cheapest means: elastic
//!    surplus members (their group stays at or above min-member) first, then lowest priority, then
//!    least GPU-time lost, then the host's order;
//! 3. across nodes a plan of elastic surplus only wins, then the lowest highest
//!    victim priority, then the least GPU-time lost, then the fewest victims, then the earliest
//!    candidate.
//!
//! GPU-time lost is the work thrown away: none for a checkpointable victim, else running time ×
//! GPUs — and a victim that breaks its gang (non-surplus member of a group) loses the whole running
//! gang's work, estimated as its own times the members running, counted once per gang. Work lost
//! comes before the number of victims: evicting one 32-GPU gang that ran for hours to place 4 GPUs
//! costs the cluster more than evicting two 2-GPU jobs that started a minute ago.
//!
//! Which tasks may be victims at all (strictly lower priority in the same queue, borrowed capacity
//! of queues above their deserved share, elastic surplus) is the host's rule; the fit estimate here
//! uses node totals and idle devices, and the host re-checks the plan exactly before acting on it.
//!
//! Configuration (JSON, all optional):
//! `{"min_priority_diff": 1, "min_runtime_seconds": 0, "max_victims": 0}` (`max_victims` 0 = no
//! limit).

use serde::Deserialize;
use wasmsched_sdk::prelude::*;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    min_priority_diff: i64,
    min_runtime_seconds: u64,
    max_victims: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { min_priority_diff: 1, min_runtime_seconds: 0, max_victims: 0 }
    }
}

/// The priority preempt policy.
#[derive(Debug, Default)]
pub struct PriorityPreempt {
    config: Config,
}

impl Plugin for PriorityPreempt {
    const NAME: &'static str = "priority-preempt";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        if config.min_priority_diff < 1 {
            return Err(format!(
                "invalid {} configuration: min_priority_diff must be at least 1 (equal priorities never preempt each other)",
                Self::NAME
            ));
        }
        Ok(PriorityPreempt { config })
    }
}

/// An elastic member above its group's min-member: evicting it leaves the group running.
fn surplus(v: &Victim) -> bool {
    v.group_running > v.group_min_member
}

/// GPU-seconds a victim loses when evicted: its own work, or (when it breaks its gang) the whole
/// running gang's, each member assumed like this one.
fn lost_gpu_seconds(v: &Victim) -> u64 {
    if v.checkpointable {
        return 0;
    }
    let own = v.running_seconds.saturating_mul(v.task.gpu.total_milli()) / 1000;
    if breaks_group(v) { own.saturating_mul(u64::from(v.group_running.max(1))) } else { own }
}

/// A non-surplus member of a group: evicting it takes the whole running group down.
fn breaks_group(v: &Victim) -> bool {
    v.task.group.is_some() && !surplus(v)
}

/// Estimate (from node totals) whether `task` fits `node` once `victims` are gone.
fn fits_after(task: &Task, node: &Node, victims: &[&Victim]) -> bool {
    let freed = |f: &dyn Fn(&Task) -> u64| victims.iter().map(|v| f(&v.task)).fold(0u64, u64::saturating_add);
    if node.free_cpu_milli().saturating_add(freed(&|t| t.request.cpu_milli)) < task.request.cpu_milli
        || node.free_memory_bytes().saturating_add(freed(&|t| t.request.memory_bytes)) < task.request.memory_bytes
    {
        return false;
    }
    for (name, want) in &task.request.extended {
        let free = node.allocatable.extended(name).saturating_sub(node.allocated.extended(name));
        if free.saturating_add(freed(&|t| t.request.extended(name))) < *want {
            return false;
        }
    }
    let req = &task.gpu;
    if req.count == 0 {
        return true;
    }
    let usable = |g: &&GpuDevice| g.health != GpuHealth::Unhealthy && req.allows_model(&g.model);
    if req.milli_per_gpu >= GPU_MILLI {
        let idle = node.gpus.iter().filter(usable).filter(|g| g.free_milli >= GPU_MILLI).count() as u64;
        let whole_freed = freed(&|t| if t.gpu.milli_per_gpu >= GPU_MILLI { u64::from(t.gpu.count) } else { 0 });
        idle + whole_freed >= u64::from(req.count)
    } else {
        let shared_freed = freed(&|t| t.gpu.total_milli());
        node.gpus.iter().filter(usable).any(|g| u64::from(g.free_milli) + shared_freed >= u64::from(req.milli_per_gpu))
    }
}

/// What a plan costs, compared lexicographically (lower is better).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    /// Some victim is not elastic surplus: a job stops, not just shrinks.
    non_surplus: bool,
    top_priority: i32,
    lost: u64,
    victims: u64,
}

impl PriorityPreempt {
    fn eligible(&self, preemptor: &Task, v: &Victim) -> bool {
        if v.running_seconds < self.config.min_runtime_seconds {
            return false;
        }
        if v.task.queue == preemptor.queue && !surplus(v) {
            return i64::from(preemptor.priority) - i64::from(v.task.priority) >= self.config.min_priority_diff;
        }
        true
    }

    /// The cheapest victims on one node, by index, or `None` when even all eligible ones are not
    /// enough.
    fn plan_node(&self, preemptor: &Task, c: &PreemptCandidate, node: &Node) -> Option<(Vec<u32>, Cost)> {
        let key = |i: &usize| {
            let v = &c.victims[*i];
            (!surplus(v), v.task.priority, lost_gpu_seconds(v), *i)
        };
        let mut order: Vec<usize> = (0..c.victims.len()).filter(|&i| self.eligible(preemptor, &c.victims[i])).collect();
        order.sort_by_key(key);
        let mut chosen: Vec<usize> = Vec::new();
        let as_refs = |idx: &[usize]| idx.iter().map(|&i| &c.victims[i]).collect::<Vec<_>>();
        if !fits_after(preemptor, node, &[]) {
            for &i in &order {
                chosen.push(i);
                if fits_after(preemptor, node, &as_refs(&chosen)) {
                    break;
                }
            }
            if !fits_after(preemptor, node, &as_refs(&chosen)) {
                return None;
            }
            // Drop victims that turned out unnecessary, most expensive first.
            for pos in (0..chosen.len()).rev() {
                let mut without = chosen.clone();
                without.remove(pos);
                if fits_after(preemptor, node, &as_refs(&without)) {
                    chosen = without;
                }
            }
        }
        if chosen.is_empty() {
            // The estimate says it fits already; the host found otherwise, so this node cannot be
            // judged from totals. Offer nothing here rather than a plan that frees nothing.
            return None;
        }
        if self.config.max_victims > 0 && chosen.len() > self.config.max_victims {
            return None;
        }
        Some((chosen.iter().map(|&i| i as u32).collect(), self.cost(c, &chosen)))
    }

    fn cost(&self, c: &PreemptCandidate, chosen: &[usize]) -> Cost {
        let victims: Vec<&Victim> = chosen.iter().map(|&i| &c.victims[i]).collect();
        // A victim whose group falls below min-member takes the whole running group with it:
        // the group is counted (members and work lost) once.
        let (mut total, mut lost) = (0u64, 0u64);
        let mut groups: Vec<(&str, &str)> = Vec::new();
        for v in &victims {
            match &v.task.group {
                Some(g) if breaks_group(v) => {
                    if !groups.contains(&(v.task.namespace.as_str(), g.as_str())) {
                        groups.push((v.task.namespace.as_str(), g.as_str()));
                        total += u64::from(v.group_running.max(1));
                        lost = lost.saturating_add(lost_gpu_seconds(v));
                    }
                }
                _ => {
                    total += 1;
                    lost = lost.saturating_add(lost_gpu_seconds(v));
                }
            }
        }
        Cost {
            non_surplus: victims.iter().any(|v| !surplus(v)),
            top_priority: victims.iter().map(|v| v.task.priority).max().unwrap_or(i32::MIN),
            lost,
            victims: total,
        }
    }
}

impl Preempt for PriorityPreempt {
    fn select_victims(
        &mut self,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
        nodes: &[&Node],
    ) -> Option<Preemption> {
        let mut best: Option<(Cost, u32, Vec<u32>)> = None;
        for (ci, (c, node)) in candidates.iter().zip(nodes).enumerate() {
            if let Some((victims, cost)) = self.plan_node(preemptor, c, node)
                && best.as_ref().is_none_or(|(b, _, _)| cost < *b)
            {
                best = Some((cost, ci as u32, victims));
            }
        }
        best.map(|(_, candidate, victims)| Preemption { candidate, victims })
    }
}

wasmsched_sdk::export_plugin!(PriorityPreempt: preempt);

#[cfg(test)]
mod tests;
