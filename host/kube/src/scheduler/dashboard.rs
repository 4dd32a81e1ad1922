//! What the leader (or a standby) shows on the dashboard (`wasmsched run --dashboard`): every
//! second the loop takes the core's node table by copy-on-write snapshot, the queues, the waiting
//! workloads with their explanations and the live policy set, and a blocking task turns the nodes
//! into the view — the loop never builds 5,000 node rows itself.

use wasmsched_dashboard::view::{
    BudgetView, Cluster, FaultCount, NodeTask, NodeView, PluginView, PolicyView, QueueView, SeriesPoint, StageCalls,
    TARGET_POPULARITY_PERCENT, TARGET_SHAPES, WorkloadView,
};

use super::*;
use wasmsched_api::fragmentation;

/// How often a view is published.
pub(super) const DASHBOARD_EVERY: Duration = Duration::from_secs(1);
/// How often each queue's share is sampled for its history, and how many samples are kept (an
/// hour's worth).
const SHARE_EVERY: Duration = Duration::from_secs(10);
const SHARE_SAMPLES: usize = 360;

impl Scheduler {
    /// Shows this scheduler on `publisher`'s dashboard.
    pub fn with_dashboard(mut self, publisher: wasmsched_dashboard::Publisher) -> Scheduler {
        self.reports.dashboard = Some(publisher);
        let nodes = self.core.nodes();
        let names: Vec<String> = nodes.slots().filter_map(|s| nodes.get(s)).map(|n| n.name.clone()).collect();
        for name in names {
            self.show_topology(&name);
        }
        self
    }

    /// The dashboard's decision stream reads the event outbox: a tap on the `--events`/`--nats`
    /// sink, or, where no destination is set, a sink whose only reader is the dashboard (events
    /// then go through the outbox but are encoded only while a page follows).
    pub(super) fn stream_decisions(&mut self) {
        let Some(publisher) = self.reports.dashboard.clone() else { return };
        let tap: Arc<dyn wasmsched_events::Tap> = Arc::new(publisher);
        match &self.reports.events {
            Some(sink) => {
                if !sink.tap(tap) {
                    tracing::warn!("the event sink is read by another tap: the dashboard shows no decisions");
                }
            }
            None => {
                let origin = wasmsched_events::Origin {
                    source: format!("wasmsched/{}/scheduler", self.config.scheduler_name),
                    id_prefix: wasmsched_events::Origin::unique_prefix(),
                };
                match EventSink::tap_only(origin, wasmsched_events::OutboxConfig::default(), tap) {
                    Ok(sink) => self.reports.events = Some(sink),
                    Err(e) => tracing::warn!(error = %e, "the dashboard shows no decisions"),
                }
            }
        }
    }

    /// Keeps `node`'s rendered topology for the dashboard in step with the core's (none: forgotten).
    pub(super) fn show_topology(&mut self, node: &str) {
        if self.reports.dashboard.is_none() {
            return;
        }
        let known = self.core.nodes().topologies();
        let text: Option<Arc<str>> = known.get(node).map(|t| t.render(known.costs()).into());
        if self.reports.topology_text.get(node) != text.as_ref() {
            let texts = Arc::make_mut(&mut self.reports.topology_text);
            match text {
                Some(t) => texts.insert(node.to_string(), t),
                None => texts.remove(node),
            };
        }
    }

    /// Brings the dashboard's copy of the nodes' DRA devices up to date: the nodes whose devices
    /// or holds changed since the last view, or all of them after slices changed.
    fn show_dra_devices(&mut self) {
        let dra = &mut self.view.objects.dra;
        let nodes = match dra.take_shown_changes() {
            Some(changed) if changed.is_empty() => return,
            Some(changed) => changed,
            None => {
                self.reports.dra_devices = Arc::default();
                dra.device_node_names()
            }
        };
        let shown = Arc::make_mut(&mut self.reports.dra_devices);
        for node in nodes {
            let devices = dra.devices_on(&node);
            if devices.is_empty() {
                shown.remove(&node);
            } else {
                shown.insert(node, device_views(devices).into());
            }
        }
    }

    /// Publishes a view when one is due.
    pub(super) fn publish_dashboard(&mut self) {
        let Some(publisher) = self.reports.dashboard.clone() else { return };
        if self.timers.dashboard_at.elapsed() < DASHBOARD_EVERY {
            return;
        }
        self.timers.dashboard_at = Instant::now();
        let nodes = self.core.nodes().snapshot();
        let shares = self.core.queue_shares();
        let counts = self.core.queue_tasks();
        let tree = self.core.queues();
        let mut queues: Vec<QueueView> = shares
            .iter()
            .zip(&counts)
            .enumerate()
            .map(|(i, (s, (pending, running)))| {
                let parent = tree.parent(i).and_then(|p| tree.get(p)).map(|q| q.name.clone());
                QueueView::of(s, tree.get(i), parent, *pending, *running)
            })
            .collect();
        QueueView::lend(&mut queues);
        let at_seconds = self.now();
        let places = self.core.queue_positions();
        // What runs where: every placed member of every workload holding room.
        let mut on_node: AHashMap<String, Vec<NodeTask>> = AHashMap::new();
        for phase in [Phase::Running, Phase::Pending, Phase::Preempting] {
            for name in self.core.workloads_in(phase) {
                for (task, node) in self.core.placements_of(name).into_iter().flatten() {
                    let t = NodeTask { name: task.id.clone(), queue: task.queue.clone() };
                    on_node.entry(node.to_string()).or_default().push(t);
                }
            }
        }
        let sample = self.reports.queue_sampled.is_none_or(|at| at.elapsed() >= SHARE_EVERY);
        if sample {
            self.reports.queue_sampled = Some(Instant::now());
            let history = Arc::make_mut(&mut self.reports.queue_history);
            history.retain(|name, _| shares.iter().any(|s| &s.name == name));
            for s in &shares {
                let series = history.entry(s.name.clone()).or_default();
                if series.len() == SHARE_SAMPLES {
                    series.pop_front();
                }
                series.push_back(SharePoint {
                    at: at_seconds,
                    allocated_gpu_milli: s.allocated.gpu_milli,
                    deserved_gpu_milli: s.deserved.as_ref().map(|d| d.gpu_milli),
                });
            }
        }
        let mut workloads = Vec::new();
        for phase in [Phase::Pending, Phase::Preempting, Phase::TimedOut] {
            for name in self.core.workloads_in(phase) {
                let Some(status) = self.core.status(name) else { continue };
                let (members, placed) = self
                    .core
                    .members_of(name)
                    .map(|m| m.fold((0, 0), |(n, p), (_, placed)| (n + 1, p + usize::from(placed))))
                    .unwrap_or_default();
                let queue = self.core.members_of(name).and_then(|mut m| m.next()).map(|(t, _)| t.queue.clone());
                workloads.push(WorkloadView {
                    name: name.to_string(),
                    queue: queue.unwrap_or_default(),
                    phase: format!("{phase:?}"),
                    members,
                    placed,
                    min_member: self.next.gang_min.get(name).copied().unwrap_or(1).min(members.max(1)),
                    reason: Some(reason(&status.explanation)).filter(|r| !r.is_empty()),
                    queue_position: places.get(name).copied(),
                    waiting_seconds: Some(at_seconds.saturating_sub(status.since)),
                });
            }
        }
        self.held_back(&mut workloads);
        let live = self.shared.registry.current();
        let policies = PolicyView {
            name: live.spec.name.clone(),
            version: live.version,
            plugins: live
                .plugins
                .iter()
                .map(|p| PluginView {
                    name: p.name.clone(),
                    stages: p.stages.iter().map(|s| format!("{s:?}")).collect(),
                    digest: p.digest.clone(),
                    budget: Some(budget(p.plugin.config())),
                    calls: p.stages.iter().map(|&s| stage_calls(&p.metrics.stage(s))).collect(),
                })
                .collect(),
            rollout: serde_json::to_value(self.shared.registry.status()).ok(),
        };
        // A queue counts its subtree's tasks: the roots' counts are the cluster's.
        let placed =
            counts.iter().enumerate().filter(|(i, _)| tree.parent(*i).is_none()).map(|(_, c)| c.1 as u64).sum();
        let waiting = workloads.len() as u64;
        // Behind a Service both replicas answer: a standby says what it is.
        let source = if *self.leadership.leader.borrow() {
            "kubernetes (leader)".to_string()
        } else {
            "kubernetes (standby: the leader's view is on the other replica)".to_string()
        };
        let topologies = self.reports.topology_text.clone();
        let queue_history = self.reports.queue_history.clone();
        self.show_dra_devices();
        let devices = self.reports.dra_devices.clone();
        let allocation = self.reports.allocation.clone();
        // Fragmentation is measured against the pods this scheduler has now, bound or waiting:
        // their shapes are the workload the cluster's idle share should still fit.
        let shapes = self.view.ours.shapes().clone();
        tokio::task::spawn_blocking(move || {
            let mut rows: Vec<NodeView> = nodes
                .slots()
                .filter_map(|s| nodes.get(s))
                .map(|n| {
                    let row = NodeView { tasks: on_node.remove(&n.name).unwrap_or_default(), ..NodeView::from(n) };
                    row.with_devices(devices.get(&n.name).map(|d| d.to_vec()).unwrap_or_default())
                })
                .collect();
            rows.sort_by(|a, b| a.name.cmp(&b.name));
            let cluster = Cluster::of(&rows, placed, waiting);
            let domains = wasmsched_dashboard::view::DomainView::of(&rows, nodes.domains().levels());
            // The cluster's GPU allocation and fragmentation, sampled with the queues' shares,
            // and the view's own moment last (not kept): the chart ends now, as the rows above it.
            let series = {
                let now = (cluster.gpu_milli_total > 0).then(|| SeriesPoint {
                    at: at_seconds as f64,
                    allocation_percent: 100.0 * cluster.gpu_milli_used as f64 / cluster.gpu_milli_total as f64,
                    fragmentation_percent: fragmented_percent(
                        &fragmentation::typical_of_counts(shapes, TARGET_POPULARITY_PERCENT, TARGET_SHAPES),
                        &nodes,
                    ),
                });
                let mut points = allocation.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut series: Vec<SeriesPoint> = points.iter().cloned().collect();
                if let Some(now) = now {
                    if sample {
                        if points.len() == SHARE_SAMPLES {
                            points.pop_front();
                        }
                        points.push_back(now.clone());
                    }
                    if series.last().is_none_or(|p| p.at < now.at) {
                        series.push(now);
                    }
                }
                series
            };
            publisher.publish(wasmsched_dashboard::View {
                source,
                at_seconds,
                cluster,
                nodes: rows,
                domains,
                queues,
                workloads,
                policies: Some(policies),
                series,
                series_x: "seconds since the scheduler started".into(),
                topologies,
                queue_history,
                experiments: None,
                comparison: None,
            });
        });
    }
}

/// The share of the GPUs the scheduler shares out (the nodes' own, not DRA devices: those go
/// whole to claims) that is fragmented for `typical`, in percent; `None` without pods or GPUs.
fn fragmented_percent(typical: &[fragmentation::TypicalPod], nodes: &wasmsched_core::NodeTable) -> Option<f64> {
    let all = || nodes.slots().filter_map(|s| nodes.get(s));
    let capacity: u64 = all().map(|n| n.gpus.len() as u64 * u64::from(wasmsched_api::GPU_MILLI)).sum();
    if typical.is_empty() || capacity == 0 {
        return None;
    }
    Some(100.0 * fragmentation::of_cluster(typical, all()).fragmented / capacity as f64)
}

impl Scheduler {
    /// Pods that wait before the core sees them (a gang's members not all created yet, a claim
    /// its template has not made yet, a queue that does not exist): each says why, as its
    /// `PodScheduled` condition does, after the workloads the core holds.
    fn held_back(&self, workloads: &mut Vec<WorkloadView>) {
        let wall_now = k8s_openapi::jiff::Timestamp::now().as_second().max(0) as u64;
        let mut held: Vec<WorkloadView> = self
            .reports
            .reported
            .iter()
            .filter(|(id, _)| self.core.owner_of(id).is_none())
            .filter_map(|(id, why)| {
                let pod = self.view.ours.get(id).filter(|p| !p.bound)?;
                let created = pod.created.map(|c| c.as_second().max(0) as u64);
                Some(WorkloadView {
                    name: id.clone(),
                    queue: pod.task.queue.clone(),
                    phase: "Held".into(),
                    members: 1,
                    placed: 0,
                    min_member: 1,
                    reason: Some(why.clone()),
                    queue_position: None,
                    waiting_seconds: created.map(|c| wall_now.saturating_sub(c)),
                })
            })
            .collect();
        held.sort_by(|a, b| a.name.cmp(&b.name));
        workloads.extend(held);
    }
}

/// A node's DRA devices as the dashboard shows them, in name order.
fn device_views(mut devices: Vec<crate::dra::NodeDevice>) -> Vec<wasmsched_dashboard::view::DeviceView> {
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    devices
        .into_iter()
        .map(|d| wasmsched_dashboard::view::DeviceView {
            id: d.id.to_string(),
            model: d.model,
            kind: d.kind,
            profile: d.profile,
            held_by: d.held_by,
        })
        .collect()
}

fn budget(config: &wasmsched_runtime::PluginConfig) -> BudgetView {
    BudgetView {
        deadline_ms: config.deadline.as_secs_f64() * 1e3,
        memory_mib: (config.memory_limit >> 20) as u64,
        failure: match config.failure {
            wasmsched_core::FailurePolicy::FailClosed => "fail-closed",
            wasmsched_core::FailurePolicy::FailOpen => "fail-open",
        }
        .into(),
    }
}

fn stage_calls(s: &wasmsched_runtime::StageSnapshot) -> StageCalls {
    StageCalls {
        stage: format!("{:?}", s.stage),
        calls: s.calls,
        faults: s.faults.iter().map(|&(kind, count)| FaultCount { kind: kind.as_str().into(), count }).collect(),
        mean_us: s.latency.mean.as_secs_f64() * 1e6,
        p99_us: s.latency.p99.as_secs_f64() * 1e6,
    }
}
