//! What the leader reports on `Queue` and `PodGroup` objects every few seconds, and the gauges
//! that walk every pod.

use super::*;

impl Scheduler {
    /// `Queue` and `PodGroup` status: allocation, counts, phase and the reason (leader only).
    /// Tells the `ComputeDomain` keeper every domain our pods (pending or running) ask for now.
    pub(super) fn want_compute_domains(&self) {
        let Some(domains) = &self.api.compute_domains else { return };
        let mut wanted = crate::compute_domains::Wanted::new();
        for (id, pod) in &self.view.ours {
            if let Some(request) = &pod.compute_domain {
                let namespace = id.split_once('/').map_or("", |(ns, _)| ns);
                crate::compute_domains::add(&mut wanted, namespace, request, pod.owner.as_ref());
            }
        }
        domains.want(wanted);
    }

    pub(super) fn write_statuses(&mut self) {
        self.timers.status_at = Instant::now();
        let shares = self.core.queue_shares();
        let counts = self.core.queue_tasks();
        let (_, errors) = self.view.objects.queues.tree(&self.view.objects.flavors);
        let names: Vec<String> = self.view.objects.queues.names().map(String::from).collect();
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
                        .or(self.view.objects.queue_error.as_ref())
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
        for (id, f) in &self.view.ours {
            if f.group.is_some()
                && self.core.owner_of(id).is_none()
                && let Some(g) = self.gang_of(id)
            {
                let c = outside.entry(g).or_default();
                if f.bound { c.1 += 1 } else { c.0 += 1 }
            }
        }
        let keys: Vec<(String, usize)> =
            self.view.objects.groups.iter().map(|(k, i)| (k.clone(), i.min_member)).collect();
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
        for (api, key, group) in self.view.objects.pod_groups.upstream_gangs() {
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
        self.shared.metrics.cache_nodes.set(self.view.cache.nodes().len() as i64);
        self.shared.metrics.cache_pods.set(self.view.cache.holders() as i64);
        let (active, backoff, parked) = self.core.pending_tasks(self.now());
        let waiting = self.view.ours.iter().filter(|(id, f)| !f.bound && self.core.owner_of(id).is_none()).count();
        for (queue, n) in [("active", active), ("backoff", backoff), ("unschedulable", parked), ("gated", waiting)] {
            self.shared.metrics.pending.get_or_create(&QueueLabels { queue }).set(n as i64);
        }
        if self.view.objects.dra.synced() {
            let (usable, held, refused) = self.view.objects.dra.counts();
            for (state, n) in [("usable", usable), ("held", held), ("refused", refused)] {
                self.shared.metrics.dra_devices.get_or_create(&crate::metrics::DraLabels { state }).set(n as i64);
            }
        }
        let figures = self.figures();
        self.shared.metrics.set_figures(figures);
    }

    /// What the metrics export of queues, waiting work, GPUs and events (see
    /// [`crate::metrics::Figures`]). The GPUs' rows, which walk every node and measure
    /// fragmentation, are computed every [`GPU_FIGURES_EVERY`] and kept in between.
    fn figures(&mut self) -> crate::metrics::Figures {
        use crate::metrics::{Figures, QueueFigures};
        let now = self.now();
        let mut queues: Vec<QueueFigures> = self
            .core
            .queue_shares()
            .into_iter()
            .zip(self.core.queue_tasks())
            .map(|(s, (pending, running))| QueueFigures {
                allocated_gpus: s.allocated.gpu_milli as f64 / 1000.0,
                deserved_gpus: s.deserved.map(|d| d.gpu_milli as f64 / 1000.0),
                running_pods: running as u64,
                pending_pods: pending as u64,
                oldest_pending_seconds: 0,
                queue: s.name,
            })
            .collect();
        let mut waiting: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for (leaf, since, why) in self.core.waiting() {
            let Some(q) = queues.get_mut(leaf) else { continue };
            q.oldest_pending_seconds = q.oldest_pending_seconds.max(now.saturating_sub(since));
            *waiting.entry((q.queue.clone(), why)).or_default() += 1;
        }
        for (id, facts) in self.view.ours.iter() {
            if !facts.bound && self.core.owner_of(id).is_none() {
                *waiting.entry((facts.task.queue.clone(), "gated")).or_default() += 1;
            }
        }
        if self.reports.gpu_figures_at.is_none_or(|at| at.elapsed() >= GPU_FIGURES_EVERY) {
            self.reports.gpu_figures_at = Some(Instant::now());
            self.reports.gpu_figures = gpu_figures(self.core.nodes(), self.view.ours.shapes());
        }
        Figures {
            queues,
            waiting: waiting.into_iter().map(|((q, reason), n)| (q, reason, n)).collect(),
            gpus: self.reports.gpu_figures.clone(),
            events: self.reports.events.as_ref().map(|sink| sink.stats()),
        }
    }
}

/// How often the GPUs' metrics (every node walked, fragmentation measured) are recomputed.
const GPU_FIGURES_EVERY: Duration = Duration::from_secs(10);

/// The nodes' GPUs by kind, model and pool: devices, unhealthy ones, what is held, and the idle share
/// that none of `shapes` (the pods this scheduler has, bound or waiting) could use.
fn gpu_figures(
    nodes: &wasmsched_core::NodeTable,
    shapes: &BTreeMap<wasmsched_api::fragmentation::Spec, u64>,
) -> Vec<crate::metrics::GpuFigures> {
    use wasmsched_api::fragmentation;
    use wasmsched_dashboard::view::{TARGET_POPULARITY_PERCENT, TARGET_SHAPES};
    let typical = fragmentation::typical_of_counts(shapes.clone(), TARGET_POPULARITY_PERCENT, TARGET_SHAPES);
    let mut groups: BTreeMap<(String, String, String), Vec<&wasmsched_api::Node>> = BTreeMap::new();
    for node in nodes.slots().filter_map(|s| nodes.get(s)) {
        let Some(first) = node.gpus.first() else { continue };
        let pool = wasmsched_events::decisions::node_pool(node).unwrap_or_default();
        let kind = wasmsched_api::accelerators::display_name(&first.kind).to_string();
        groups.entry((kind, first.model.clone(), pool.to_string())).or_default().push(node);
    }
    groups
        .into_iter()
        .map(|((kind, model, pool), members)| {
            let devices = members.iter().flat_map(|n| n.gpus.iter());
            let held: u64 = devices.clone().map(|g| u64::from(wasmsched_api::GPU_MILLI - g.free_milli)).sum();
            crate::metrics::GpuFigures {
                devices: devices.clone().count() as u64,
                unhealthy: devices.filter(|g| g.health == wasmsched_api::GpuHealth::Unhealthy).count() as u64,
                allocated: held as f64 / 1000.0,
                fragmented: (!typical.is_empty())
                    .then(|| fragmentation::of_cluster(&typical, members.iter().copied()).fragmented / 1000.0),
                kind,
                model,
                pool,
            }
        })
        .collect()
}

/// `r` without the flavor-qualified copies quotas per flavor are kept under (shown per flavor).
fn unflavored(r: &wasmsched_api::Resources, flavors: &[wasmsched_core::Flavor]) -> wasmsched_api::Resources {
    let mut plain = r.clone();
    plain.extended.retain(|(name, _)| {
        !flavors.iter().any(|f| name.strip_prefix(f.name.as_str()).is_some_and(|rest| rest.starts_with('/')))
    });
    plain
}
