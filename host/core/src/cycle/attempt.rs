//! One workload's attempt: quota, then placement (all-or-nothing at min-member), else preemption;
//! a success is committed, and elastic workloads grow into idle capacity.

use super::*;

impl SchedulerCore {
    /// Try to place workload `name` (and to preempt for it when `may_preempt`). Room kept for
    /// nominated workloads of lower priority *in its own queue* is open to it: they do not hold
    /// back work that outranks them, and wait for their victims again (or preempt anew) if it
    /// takes the room. Priority orders work within a queue only: room held for another queue's
    /// workload (a reclaim's room above all) is never lent, or a victim's queue-mate of higher
    /// priority would take back what its queue was over its share by.
    pub(super) fn attempt(
        &mut self,
        set: &PolicySet,
        name: &str,
        now: u64,
        out: &mut Vec<Decision>,
        may_preempt: bool,
    ) {
        let (priority, leaf) = (self.entries[name].spec.priority, self.entries[name].leaf);
        let mut outranked: Vec<String> = self
            .holders
            .iter()
            .filter(|w| {
                self.entries.get(*w).is_some_and(|e| {
                    e.phase == Phase::Preempting && e.leaf == leaf && e.spec.priority < priority && !e.holds.is_empty()
                })
            })
            .cloned()
            .collect();
        // In name order, as a walk of every workload would find them: replays stay deterministic.
        outranked.sort_unstable();
        let mut borrowed = Vec::new();
        for w in outranked {
            let Some(e) = self.entries.get_mut(&w) else { continue };
            let holds = std::mem::take(&mut e.holds);
            self.release_holds(&holds);
            borrowed.push((w, holds));
        }
        self.attempt_within_holds(set, name, now, out, may_preempt);
        for (w, holds) in borrowed {
            // A holder that is gone meanwhile gets nothing back (its room was released above).
            if !self.entries.contains_key(&w) {
                continue;
            }
            for h in holds {
                let Some(slot) = self.nodes.slot_of(&h.node) else { continue };
                if matches!(self.nodes.update_usage(slot, |n| bind(n, &h.task, &h.devices)), Some(Ok(())))
                    && let Some(e) = self.entries.get_mut(&w)
                {
                    e.holds.push(h);
                }
            }
        }
    }

    pub(super) fn attempt_within_holds(
        &mut self,
        set: &PolicySet,
        name: &str,
        now: u64,
        out: &mut Vec<Decision>,
        may_preempt: bool,
    ) {
        let mut explanation = Explanation { attempts: self.entries[name].attempts, ..Default::default() };
        let mut quota = Vec::new();
        let mut best_placed = None;
        let mut affinity = None;
        for flavor in self.flavor_choices(self.entries[name].leaf) {
            let e = &self.entries[name];
            let min = e.spec.min_member;
            let within = self.nodes_of(flavor);
            let on = match self.flavor_name(flavor) {
                Some(f) => format!("flavor {f}: "),
                None if within.is_some() => "nodes of no flavor: ".into(),
                None => String::new(),
            };
            if within.is_some_and(<[Slot]>::is_empty) {
                if flavor.is_some() {
                    quota.push(format!("{on}no nodes"));
                }
                continue;
            }
            let (admitted, limiter) = self.admitted_members(e, flavor);
            if admitted < min {
                let limiter = limiter.unwrap_or_default();
                quota.push(format!("{on}{limiter}: {admitted} of the {min} required members fit its quota"));
                continue;
            }
            let members: Result<Vec<_>, String> =
                e.spec.members[..admitted].iter().map(|t| self.prepare(t, flavor, &mut affinity)).collect();
            let members = match members {
                Ok(members) => members,
                Err(reason) => {
                    explanation.pod_affinity = Some(reason);
                    continue;
                }
            };
            let within = within.map(<[Slot]>::to_vec);
            let gpu_milli = members.iter().take(min).map(|t| t.gpu.total_milli()).sum();
            let waiting = e.spec.topology.as_ref().and_then(|t| t.waiting(&self.nodes, e.since, now, gpu_milli));
            let nodes_to_find =
                self.config.percentage_of_nodes_to_score.map(|p| feasible_nodes_to_find(self.nodes.len(), Some(p)));
            let group = GroupSpec {
                name,
                members: &members,
                min_member: min,
                topology: waiting.as_ref().or(e.spec.topology.as_ref()),
                nodes_to_find,
                within: within.as_deref(),
                adjust: None,
            };
            let is_group = e.spec.is_group();
            let result = if is_group && e.spec.members.iter().any(|m| !m.pod_terms().is_empty()) {
                // Members with pod (anti-)affinity see the members placed before them too.
                let flavored: Vec<_> = e.spec.members[..admitted].iter().map(|t| self.in_flavor(t, flavor)).collect();
                let mut nodes = std::mem::take(&mut self.nodes);
                let result = {
                    let running = self.running_pods(false);
                    let adjust = |table: &NodeTable, i: usize, so_far: &[(usize, Slot)]| {
                        if so_far.is_empty() {
                            return None;
                        }
                        let mut all = running.clone();
                        for (j, slot) in so_far {
                            all.push(pod_affinity::Running::task(&table.get(*slot)?.name, &members[*j]));
                        }
                        pod_affinity::resolve(table, &all, &flavored[i]).ok().flatten().map(|(t, _)| t)
                    };
                    place_group(set, &mut nodes, &GroupSpec { adjust: Some(Adjust(&adjust)), ..group }, 0)
                };
                self.nodes = nodes;
                result
            } else {
                place_group(set, &mut self.nodes, &group, 0)
            };
            match result {
                Ok(placed) => {
                    let topology = e.spec.topology.as_ref().map(|t| t.describe(&placed));
                    self.commit(name, placed.placed, flavor, topology, now, out);
                    return;
                }
                Err(GangError::Unschedulable { placed, diagnosis, .. }) => {
                    if best_placed.is_none_or(|b| placed > b) {
                        best_placed = Some(placed);
                        if is_group {
                            explanation.gang = Some((placed, min));
                        }
                        explanation.nodes = Some(diagnosis);
                    }
                }
                Err(err @ GangError::Invalid { .. }) => {
                    // normalise() rules this out; keep the workload pending with the reason.
                    quota.push(err.to_string());
                }
            }
        }
        if !quota.is_empty() {
            explanation.queue = Some(quota.join("; "));
        }
        if explanation.pod_affinity.is_none() {
            explanation.pod_affinity = affinity;
        }
        // Every node refused it for a reason eviction cannot change (a taint, a selector, another
        // GPU model): like kube-scheduler, do not try, and add no preemption hint to those reasons.
        let hopeless = explanation.queue.is_none()
            && explanation.gang.is_none()
            && explanation.pod_affinity.is_none()
            && explanation.nodes.as_ref().is_some_and(|d| d.faults.is_empty() && !d.preemption_may_help());
        match (self.entries[name].spec.preemption, set.preempt()) {
            _ if !may_preempt => explanation.preemption = Some(self.waiting_message(name)),
            (PreemptionPolicy::Never, _) => {
                explanation.preemption = Some("not allowed for this workload (preemption policy Never)".into());
            }
            (_, None) => {}
            (PreemptionPolicy::LowerPriority, Some(_)) if hopeless => {}
            (PreemptionPolicy::LowerPriority, Some(_)) => match preempt::preempt(self, set, name, now, out) {
                Ok(()) => return,
                Err(reason) => explanation.preemption = Some(reason),
            },
        }
        self.unschedulable(name, explanation, now, out);
    }

    /// Record members bound on the table as running.
    pub(super) fn commit(
        &mut self,
        name: &str,
        placed: Vec<(usize, Placement)>,
        flavor: Option<usize>,
        topology: Option<String>,
        now: u64,
        out: &mut Vec<Decision>,
    ) {
        let leaf = self.entries[name].leaf;
        let flavor = self.flavor_name(flavor).map(str::to_string);
        if placed.iter().any(|(i, _)| !self.entries[name].spec.members[*i].labels.is_empty()) {
            self.wake_affinity_waiters();
        }
        for (i, Placement { node: slot, devices, score, feasible, skipped_faults }) in placed {
            let node = self.nodes.get(slot).map(|n| n.name.clone()).unwrap_or_default();
            let task = self.entries[name].spec.members[i].clone();
            self.account(leaf, &demand_in(&task, flavor.as_deref(), &self.queues), true);
            out.push(Decision::Bound {
                workload: name.into(),
                task: task.id.clone(),
                node: node.clone(),
                devices: devices.clone(),
                score,
                feasible,
                faults: skipped_faults,
                topology: topology.clone(),
            });
            let e = self.entries.get_mut(name).expect("committed workloads exist");
            let flavor = flavor.clone();
            e.members[i] = Some(Member { slot, node: node.clone(), devices, started: now, leaving: None, flavor });
            self.index_add(&node, name);
        }
        // Placed elsewhere while it waited nominated: the room kept for it is everyone's again.
        let holds = std::mem::take(&mut self.entries.get_mut(name).expect("committed workloads exist").holds);
        self.release_holds(&holds);
        self.holders.remove(name);
        self.forget_nomination(name);
        let e = self.entries.get_mut(name).expect("committed workloads exist");
        e.phase = Phase::Running;
        e.waiting_for.clear();
        e.attempts = 0;
        e.explanation = Explanation::default();
    }

    /// Where a running workload's next member may go, in order: without a topology, anywhere
    /// (`None`); with one, each domain of its levels that holds all its placed members (ascending
    /// slots), innermost first, then anywhere unless its outermost level is required.
    fn growth_domains(&self, e: &Entry) -> Vec<Option<Vec<Slot>>> {
        let Some(topology) = e.spec.topology.as_ref() else { return vec![None] };
        let placed: Vec<Slot> = e.members.iter().flatten().map(|m| m.slot).collect();
        let mut out: Vec<Option<Vec<Slot>>> = (0..topology.tiers.len())
            .filter_map(|tier| {
                let domains = crate::gang::domains(&self.nodes, &topology.tiers[tier..]);
                let (_, mut slots) = domains.into_iter().find(|(_, slots)| placed.iter().all(|p| slots.contains(p)))?;
                slots.sort_unstable();
                Some(Some(slots))
            })
            .collect();
        if !topology.strict {
            out.push(None);
        }
        out
    }

    /// With slices: the nodes (ascending) of the slice-level domain holding the placed members of
    /// member `i`'s slice, which it joins; `None` without slices or while its slice has none placed.
    fn slice_domain(&self, e: &Entry, i: usize) -> Option<Vec<Slot>> {
        let slices = e.spec.topology.as_ref()?.slices.as_ref()?;
        let size = slices.size.max(1);
        let start = i / size * size;
        let placed: Vec<Slot> = e.members.iter().skip(start).take(size).flatten().map(|m| m.slot).collect();
        if placed.is_empty() {
            return None;
        }
        let (_, mut slots) = crate::gang::domains(&self.nodes, std::slice::from_ref(&slices.level))
            .into_iter()
            .find(|(_, slots)| placed.iter().all(|p| slots.contains(p)))?;
        slots.sort_unstable();
        Some(slots)
    }

    /// Elastic growth: members beyond min-member take idle capacity, within quota.
    pub(super) fn grow(&mut self, set: &PolicySet, now: u64, out: &mut Vec<Decision>) {
        let mut growing: Vec<&Entry> =
            self.entries.values().filter(|e| e.phase == Phase::Running && e.placed() < e.spec.members.len()).collect();
        growing.sort_by_key(|e| (std::cmp::Reverse(e.spec.priority), e.seq));
        let growing: Vec<String> = growing.into_iter().map(|e| e.spec.name.clone()).collect();
        for name in growing {
            let unplaced: Vec<usize> =
                (0..self.entries[&name].members.len()).filter(|&i| self.entries[&name].members[i].is_none()).collect();
            let e = &self.entries[&name];
            let flavor = e.flavor().and_then(|f| self.queues.flavors().iter().position(|x| x.name == f));
            let within = self.nodes_of(flavor).map(<[Slot]>::to_vec);
            // A gang with a topology grows (or replaces a member) inside the domains holding its
            // running members, innermost first; one that may leave them, then anywhere.
            let domains = self.growth_domains(e);
            for i in unplaced {
                let e = &self.entries[&name];
                let Ok(task) = self.prepare(&e.spec.members[i], flavor, &mut None) else { break };
                if !self.within_capability(e.leaf, &demand_in(&task, self.flavor_name(flavor), &self.queues)) {
                    break;
                }
                let slice = self.slice_domain(e, i);
                let placed = domains.iter().find_map(|domain| {
                    let mut among = match (&within, domain) {
                        (None, None) if slice.is_none() => return place(set, &self.nodes, &task, 0).ok(),
                        (None, None) => self.nodes.occupied().to_vec(),
                        (Some(w), None) => w.clone(),
                        (None, Some(d)) => d.clone(),
                        (Some(w), Some(d)) => d.iter().copied().filter(|s| w.binary_search(s).is_ok()).collect(),
                    };
                    if let Some(slice) = &slice {
                        among.retain(|s| slice.binary_search(s).is_ok());
                    }
                    place_among(set, &self.nodes, &task, 0, &among).ok()
                });
                let Some(p) = placed else { break };
                if !matches!(self.nodes.update_usage(p.node, |n| bind(n, &task, &p.devices)), Some(Ok(()))) {
                    break;
                }
                self.commit(&name, vec![(i, p)], flavor, None, now, out);
            }
        }
    }
}
