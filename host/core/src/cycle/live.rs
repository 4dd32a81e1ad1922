//! Facts from a live cluster. A simulator tells the core everything; a Kubernetes driver does not:
//! other schedulers' pods hold part of each node, pods this scheduler placed before a restart are
//! already running, gang members are created one by one and finish one by one. These calls let a
//! driver tell the core what *is*, without the core second-guessing it.

use wasmsched_api::{DeviceShare, Node, Task};

use super::{CoreError, Decision, Member, Misfit, Phase, SchedulerCore, Workload, WorkloadError, demand_in};
use crate::node_accounting::bind_fact;
use crate::queue::QueueTree;

impl SchedulerCore {
    /// Add or replace a node whose `allocated` and GPU free amounts already count what work the
    /// core does not manage holds (other schedulers' pods). The core's members are counted on top;
    /// running pods are facts, so one that no longer fits is kept (the node shows as full), never
    /// evicted — that is the kubelet's call, not the scheduler's.
    pub fn observe_node(&mut self, node: Node, now: u64) -> Vec<Decision> {
        self.put_node(node, now, Misfit::Keep)
    }

    /// Take over a workload whose members in `running` (task id, node, devices) are already bound
    /// — pods placed before a restart. It is `Running` when any member runs (the rest are placed as
    /// capacity allows, like an elastic job's), else `Pending` like a submission. Refused, changing
    /// nothing, when the workload is refused by [`Self::submit`] or a running member names a task
    /// it lacks or a node the core does not know.
    pub fn adopt(
        &mut self,
        workload: Workload,
        running: &[(String, String, Vec<DeviceShare>)],
        now: u64,
    ) -> Result<(), WorkloadError> {
        let name = workload.name.clone();
        let invalid = |reason: String| WorkloadError::Invalid { workload: name.clone(), reason };
        let mut slots = Vec::with_capacity(running.len());
        for (task, node, _) in running {
            let idx = workload.members.iter().position(|m| &m.id == task);
            let idx = idx.ok_or_else(|| invalid(format!("running task {task} is not a member")))?;
            let slot =
                self.nodes.slot_of(node).ok_or_else(|| invalid(format!("task {task} runs on unknown node {node}")))?;
            slots.push((idx, slot));
        }
        // Admission limits are for new work: a running workload is taken over whatever they say.
        self.enter(workload, now, false)?;
        for ((idx, slot), (_, node, devices)) in slots.into_iter().zip(running) {
            let e = self.entries.get(&name).expect("just submitted");
            let task = e.spec.members[idx].clone();
            let leaf = e.leaf;
            // Running where it runs: it holds the quota of that node's flavor.
            let flavor = self.nodes.get(slot).and_then(|n| self.queues.flavor_of(n));
            let flavor = flavor.map(|f| self.queues.flavors()[f].name.clone());
            self.nodes.update_usage(slot, |n| bind_fact(n, &task, devices));
            self.account(leaf, &demand_in(&task, flavor.as_deref(), &self.queues), true);
            let e = self.entries.get_mut(&name).expect("just submitted");
            let devices = devices.clone();
            e.members[idx] = Some(Member { slot, node: node.clone(), devices, started: now, leaving: None, flavor });
            e.phase = Phase::Running;
            self.index_add(node, &name);
            if !task.labels.is_empty() {
                self.wake_affinity_waiters();
            }
        }
        Ok(())
    }

    /// Members created after their workload was submitted (a gang's pods appear one by one). A
    /// running workload places them as capacity allows; a pending one tries them with the rest.
    /// Refused, changing nothing, like [`Self::submit`].
    pub fn add_members(&mut self, workload: &str, tasks: Vec<Task>) -> Result<(), WorkloadError> {
        let e = self
            .entries
            .get(workload)
            .ok_or_else(|| WorkloadError::Invalid { workload: workload.into(), reason: "no such workload".into() })?;
        for t in &tasks {
            if let Some(owner) = self.owner.get(&t.id) {
                return Err(WorkloadError::TaskTaken {
                    workload: workload.into(),
                    task: t.id.clone(),
                    owner: owner.clone(),
                });
            }
        }
        let mut spec = e.spec.clone();
        spec.members.extend(tasks);
        let spec = spec.normalise(&self.queues)?;
        let e = self.entries.get_mut(workload).expect("looked up above");
        for t in &spec.members[e.members.len()..] {
            self.owner.insert(t.id.clone(), workload.into());
        }
        e.members.resize(spec.members.len(), None);
        if spec.members.iter().any(|m| !m.pod_terms().anti_affinity.is_empty()) {
            self.affinity.anti_holders.insert(workload.into());
        }
        e.spec = spec;
        e.parked_at = None;
        Ok(())
    }

    /// A task finished or was deleted: whatever it held is released and it leaves its workload,
    /// without breaking its gang (completion is not eviction). A workload left with no members is
    /// forgotten; a pending one left with fewer than min-member is withdrawn (the driver submits it
    /// again when enough members exist); a running one keeps running with a min-member no larger
    /// than what is left.
    pub fn remove_task(&mut self, task: &str) -> Result<(), CoreError> {
        let wl = self.owner.get(task).cloned().ok_or_else(|| CoreError::UnknownTask(task.into()))?;
        let idx = self.entries[&wl].spec.members.iter().position(|t| t.id == task).expect("owner is a member");
        self.unbind(&wl, idx);
        self.owner.remove(task);
        let e = self.entries.get_mut(&wl).expect("owner names a workload");
        e.spec.members.remove(idx);
        e.members.remove(idx);
        let (left, placed) = (e.spec.members.len(), e.placed());
        if placed > 0 {
            e.spec.min_member = e.spec.min_member.min(left);
        }
        // Victims are named by index: shift those past the removed one, drop the removed one.
        for other in self.entries.values_mut() {
            other.waiting_for.retain(|(w, i)| !(w == &wl && *i == idx));
            for (w, i) in &mut other.waiting_for {
                if w == &wl && *i > idx {
                    *i -= 1;
                }
            }
        }
        let e = &self.entries[&wl];
        if left == 0 || (placed == 0 && left < e.spec.min_member) {
            self.finish(&wl)?;
        }
        self.unpark_all();
        Ok(())
    }

    /// Whether `workload` may be chosen as a victim from now on. The driver withdraws it while
    /// something outside the core would refuse its eviction (an exhausted disruption budget), so
    /// preemption looks elsewhere instead of planning what cannot happen. Making it preemptible
    /// again lets parked work try once more.
    pub fn set_preemptible(&mut self, workload: &str, preemptible: bool) -> Result<(), CoreError> {
        let e = self.entries.get_mut(workload).ok_or_else(|| CoreError::UnknownWorkload(workload.into()))?;
        if e.spec.preemptible != preemptible {
            e.spec.preemptible = preemptible;
            if preemptible {
                self.unpark_all();
            }
        }
        Ok(())
    }

    /// A member's pod was relabelled (labels sorted by key, as in [`Task::labels`]). Inter-pod
    /// affinity reads a running member's labels from the core, so without this a relabelled pod
    /// would keep matching, for others' terms, the labels it was placed with. When a placed
    /// member's labels change, parked work is tried again (after its back-off): it may have
    /// waited for, or been kept away by, the old labels. Returns whether anything changed.
    pub fn relabel_task(&mut self, task: &str, labels: Vec<(String, String)>) -> Result<bool, CoreError> {
        let wl = self.owner.get(task).ok_or_else(|| CoreError::UnknownTask(task.into()))?;
        let e = self.entries.get_mut(wl).expect("owner names a workload");
        let idx = e.spec.members.iter().position(|t| t.id == task).expect("owner is a member");
        if e.spec.members[idx].labels == labels {
            return Ok(false);
        }
        e.spec.members[idx].labels = labels;
        if e.members[idx].is_some() {
            self.unpark_all();
        }
        Ok(true)
    }

    /// Charge a placed task for `more` than it asked: DRA devices its claims were allocated beyond
    /// what could be counted ahead (an `All` request, a larger `firstAvailable` alternative). Its
    /// node and its queues count them from now on and release them with the task. Refused,
    /// changing nothing, when its queues' limits (or the reserves lending queues keep) cannot take
    /// them: whoever allocated the devices then gives them back.
    pub fn charge_more(&mut self, task: &str, more: &[(wasmsched_api::ResourceName, u64)]) -> Result<(), CoreError> {
        let wl = self.owner.get(task).cloned().ok_or_else(|| CoreError::UnknownTask(task.into()))?;
        let e = &self.entries[&wl];
        let idx = e.spec.members.iter().position(|t| t.id == task).expect("owner is a member");
        let Some(member) = e.members[idx].as_ref() else { return Err(CoreError::NotPlaced(task.into())) };
        let more = wasmsched_api::Resources { extended: more.iter().copied().collect(), ..Default::default() };
        let before = &e.spec.members[idx];
        let mut after = before.clone();
        after.request.saturating_add_assign(&more);
        let flavor = member.flavor.as_deref();
        let held = demand_in(&after, flavor, &self.queues).saturating_sub(&demand_in(before, flavor, &self.queues));
        if !self.within_capability(e.leaf, &held) {
            let names = held.extended.iter().map(|(n, v)| format!("{v} {n}")).collect::<Vec<_>>().join(", ");
            return Err(CoreError::OverLimit {
                task: task.into(),
                queue: self.queues.get(e.leaf).map(|q| q.name.clone()).unwrap_or_default(),
                more: names,
            });
        }
        let (slot, leaf) = (member.slot, e.leaf);
        // Added as a fact, not checked against the node: the devices are allocated already.
        self.nodes.update_usage(slot, |n| n.allocated.saturating_add_assign(&more));
        self.account(leaf, &held, true);
        self.entries.get_mut(&wl).expect("owner names a workload").spec.members[idx] = after;
        Ok(())
    }

    /// Workloads the core tracks that own `task`.
    pub fn owner_of(&self, task: &str) -> Option<&str> {
        self.owner.get(task).map(String::as_str)
    }

    /// Pending tasks by how they wait at `now`: `(active, backoff, unschedulable)` — ready to be
    /// tried, backing off after a failure, parked until the cluster changes (kube-scheduler's
    /// queue names).
    pub fn pending_tasks(&self, now: u64) -> (usize, usize, usize) {
        let (mut active, mut backoff, mut parked) = (0, 0, 0);
        for e in self.entries.values().filter(|e| e.phase == Phase::Pending) {
            let n = e.spec.members.len();
            match () {
                _ if self.is_parked(e) => parked += n,
                _ if e.not_before > now => backoff += n,
                _ => active += n,
            }
        }
        for e in self.entries.values().filter(|e| matches!(e.phase, Phase::Running | Phase::Preempting)) {
            let unplaced = e.members.iter().filter(|m| m.is_none()).count();
            if e.phase == Phase::Preempting {
                active += unplaced;
            } else {
                parked += unplaced;
            }
        }
        (active, backoff, parked)
    }

    /// The node `task` is placed on (running or leaving), if it is.
    pub fn placement_of(&self, task: &str) -> Option<&str> {
        let e = self.entries.get(self.owner.get(task)?)?;
        let idx = e.spec.members.iter().position(|t| t.id == task)?;
        e.members[idx].as_ref().map(|m| m.node.as_str())
    }

    /// A workload's members (as normalised at submission) and whether each is placed.
    pub fn members_of(&self, workload: &str) -> Option<impl Iterator<Item = (&Task, bool)>> {
        let e = self.entries.get(workload)?;
        Some(e.spec.members.iter().zip(&e.members).map(|(t, m)| (t, m.is_some())))
    }

    /// The placed members of `workload` and their nodes, leaving ones included, in member order.
    pub fn placements_of(&self, workload: &str) -> Option<impl Iterator<Item = (&Task, &str)>> {
        let e = self.entries.get(workload)?;
        Some(e.spec.members.iter().zip(&e.members).filter_map(|(t, m)| m.as_ref().map(|m| (t, m.node.as_str()))))
    }

    /// Replace the queue tree (queues were added, removed or changed). Allocations are counted again
    /// in the new tree; decayed usage follows queues by name; deserved shares are recomputed next
    /// cycle. Refused, changing nothing, while a workload the core tracks sits in a queue the new
    /// tree lacks or that is no longer a leaf — work is never silently moved between queues.
    pub fn set_queues(&mut self, queues: QueueTree) -> Result<(), CoreError> {
        let mut leaves = Vec::with_capacity(self.entries.len());
        for (name, e) in &self.entries {
            match queues.index_of(&e.spec.queue) {
                Some(q) if queues.is_leaf(q) => leaves.push((name.clone(), q)),
                _ => {
                    return Err(CoreError::QueueInUse { queue: e.spec.queue.clone(), workload: name.clone() });
                }
            }
        }
        let usage: Vec<f64> = (0..queues.len())
            .map(|q| {
                let name = &queues.get(q).expect("in range").name;
                self.queues.index_of(name).map_or(0.0, |old| self.queue_use.usage[old])
            })
            .collect();
        self.queue_use.allocated = vec![Default::default(); queues.len()];
        self.queue_use.reserves.take();
        self.queue_use.usage = usage;
        self.queue_use.starved = vec![0; queues.len()];
        self.queue_use.starving = vec![0; queues.len()];
        self.queues = queues;
        self.queue_use.deserved = None;
        self.queue_use.order.clear();
        self.queue_use.share_input = None;
        for (name, leaf) in leaves {
            let Some(e) = self.entries.get_mut(&name) else { continue };
            e.leaf = leaf;
            let held: Vec<_> =
                (0..e.members.len()).filter(|&i| e.members[i].is_some()).map(|i| e.held(i, &self.queues)).collect();
            for d in held {
                self.account(leaf, &d, true);
            }
        }
        self.unpark_all();
        Ok(())
    }

    /// Per queue (in [`Self::queue_shares`] order, each counting its subtree): tasks waiting and
    /// tasks placed.
    pub fn queue_tasks(&self) -> Vec<(usize, usize)> {
        let mut counts = vec![(0, 0); self.queues.len()];
        for e in self.entries.values() {
            let placed = e.placed();
            let waiting = if matches!(e.phase, Phase::TimedOut) { 0 } else { e.spec.members.len() - placed };
            for q in self.queues.chain(e.leaf) {
                counts[q].0 += waiting;
                counts[q].1 += placed;
            }
        }
        counts
    }
}
