//! What the leader reports on `Queue` and `PodGroup` objects every few seconds, and the gauges
//! that walk every pod.

use super::*;

impl Scheduler {
    /// `Queue` and `PodGroup` status: allocation, counts, phase and the reason (leader only).
    pub(super) fn write_statuses(&mut self) {
        self.timers.status_at = Instant::now();
        let shares = self.core.queue_shares();
        let counts = self.core.queue_tasks();
        let (_, errors) = self.objects.queues.tree(&self.objects.flavors);
        let names: Vec<String> = self.objects.queues.names().map(String::from).collect();
        for name in names {
            let status = match shares.iter().position(|s| s.name == name) {
                Some(i) => QueueStatus {
                    conditions: vec![status::condition("Ready", true, "Accepted", "in the queue tree")],
                    allocated: status::resource_list(&unflavored(&shares[i].allocated, self.core.queues().flavors())),
                    flavors: self
                        .core
                        .queues()
                        .flavors()
                        .iter()
                        .map(|f| {
                            (f.name.clone(), status::resource_list(&flavored_amount(&shares[i].allocated, &f.name)))
                        })
                        .filter(|(_, list)| !list.is_empty())
                        .collect(),
                    pending: counts[i].0 as u32,
                    running: counts[i].1 as u32,
                },
                None => {
                    let message = errors
                        .get(&name)
                        .or(self.objects.queue_error.as_ref())
                        .map_or("not in the queue tree", String::as_str)
                        .to_string();
                    QueueStatus {
                        conditions: vec![status::condition("Ready", false, "Rejected", &message)],
                        ..QueueStatus::default()
                    }
                }
            };
            self.reports.status.queue(&name, status);
        }
        // Pods of each group the core does not have yet: (waiting, bound).
        let mut outside: AHashMap<String, (u32, u32)> = AHashMap::new();
        for (id, f) in &self.ours {
            if f.group.is_some()
                && self.core.owner_of(id).is_none()
                && let Some(g) = self.gang_of(id)
            {
                let c = outside.entry(g).or_default();
                if f.bound { c.1 += 1 } else { c.0 += 1 }
            }
        }
        let keys: Vec<(String, usize)> = self.objects.groups.iter().map(|(k, i)| (k.clone(), i.min_member)).collect();
        for (key, min) in keys {
            let status = match self.core.status(&key) {
                Some(s) => {
                    let pending = self.core.members_of(&key).map_or(0, |m| m.filter(|(_, placed)| !placed).count());
                    let phase = match s.phase {
                        Phase::Running => PodGroupPhase::Running,
                        Phase::TimedOut => PodGroupPhase::TimedOut,
                        Phase::Pending | Phase::Preempting => PodGroupPhase::Pending,
                    };
                    let message = match phase {
                        PodGroupPhase::Running => format!("{} members running (min {min})", s.running),
                        _ => reason(&s.explanation),
                    };
                    status::group_status(phase, s.running as u32, pending as u32, &message)
                }
                None => {
                    let (waiting, bound) = outside.get(&key).copied().unwrap_or_default();
                    let message = format!("{} of {min} members present", waiting + bound);
                    let phase = if bound as usize >= min { PodGroupPhase::Running } else { PodGroupPhase::Pending };
                    status::group_status(phase, bound, waiting, &message)
                }
            };
            self.reports.status.group(&key, status);
        }
        self.write_upstream_statuses();
    }

    /// The Workload API's `PodGroup`s that are gangs get the condition kube-scheduler writes:
    /// `True` (reason `Scheduled`) once the gang is placed, `False` (`Unschedulable`, with the
    /// reason) while a tried gang waits. Never `True` back to `False`: the upstream API calls the
    /// condition terminal once true (a gang that later loses members was still scheduled).
    fn write_upstream_statuses(&mut self) {
        let mut writes = Vec::new();
        for (api, key, group) in self.objects.pod_groups.upstream_gangs() {
            let Some(condition_type) = api.scheduled_condition() else { continue };
            let Some(status) = self.core.status(key) else { continue };
            let condition = match status.phase {
                Phase::Running => status::condition(
                    condition_type,
                    true,
                    "Scheduled",
                    &format!("{} members placed by wasmsched", status.running),
                ),
                _ if status.explanation.attempts == 0 => continue,
                _ => status::condition(condition_type, false, "Unschedulable", &reason(&status.explanation)),
            };
            let mut conditions = group.conditions.clone();
            match conditions.iter_mut().find(|c| c.type_ == condition_type) {
                Some(c) if c.status == "True" => continue,
                Some(c) => {
                    // The transition time moves only when the status does.
                    let moved = c.status != condition.status;
                    let at = c.last_transition_time.clone();
                    *c = condition;
                    if !moved {
                        c.last_transition_time = at;
                    }
                    c.observed_generation = group.generation;
                }
                None => {
                    let mut c = condition;
                    c.observed_generation = group.generation;
                    conditions.push(c);
                }
            }
            writes.push((api.api_resource(), key.clone(), conditions));
        }
        for (resource, key, conditions) in writes {
            self.reports.status.upstream_group(&resource, &key, conditions);
        }
    }

    /// Gauges that walk every pod: at most twice a second, never per event.
    pub(super) fn update_gauges(&mut self) {
        self.timers.gauges_at = Instant::now();
        self.shared.metrics.cache_nodes.set(self.cache.nodes().len() as i64);
        self.shared.metrics.cache_pods.set(self.cache.holders() as i64);
        let (active, backoff, parked) = self.core.pending_tasks(self.now());
        let waiting = self.ours.iter().filter(|(id, f)| !f.bound && self.core.owner_of(id).is_none()).count();
        for (queue, n) in [("active", active), ("backoff", backoff), ("unschedulable", parked), ("gated", waiting)] {
            self.shared.metrics.pending.get_or_create(&QueueLabels { queue }).set(n as i64);
        }
        if self.objects.dra.synced() {
            let (usable, held, refused) = self.objects.dra.counts();
            for (state, n) in [("usable", usable), ("held", held), ("refused", refused)] {
                self.shared.metrics.dra_devices.get_or_create(&crate::metrics::DraLabels { state }).set(n as i64);
            }
        }
    }
}

/// `r` without the flavor-qualified copies quotas per flavor are kept under (shown per flavor).
fn unflavored(r: &wasmsched_api::Resources, flavors: &[wasmsched_core::Flavor]) -> wasmsched_api::Resources {
    let mut plain = r.clone();
    plain.extended.retain(|(name, _)| {
        !flavors.iter().any(|f| name.strip_prefix(f.name.as_str()).is_some_and(|rest| rest.starts_with('/')))
    });
    plain
}
