//! `replay --serve`: the dashboard over a time-driven replay — the cluster, the queue tree with
//! its fair shares, the work that waits and why, and the policy set live at each moment (a
//! `--rollout` shows as a new version) — paced in virtual time: `--speed N` plays N virtual
//! seconds per second, 0 as fast as it goes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use wasmsched_api::fragmentation::{self, ModelAccess, TypicalPod};
use wasmsched_core::{Decision, NodeTable, QueueShare, QueueTree};
use wasmsched_dashboard::view::{
    Cluster, DeviceView, NodeTask, NodeView, PluginView, PolicyView, QueueView, SeriesPoint, WorkloadView,
};
use wasmsched_dashboard::{Publisher, View};
use wasmsched_sim::timed::{Job, TimedDecision, TimedRelease};

use crate::dashboard::Board;
use crate::replay_policies::LiveSet;

/// How often a new view is published (wall time).
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// The dashboard of one time-driven replay.
pub struct TimedReplay {
    board: Board,
    source: String,
    speed: f64,
    started: Instant,
    published: Instant,
    /// Virtual seconds of the latest observation.
    at: u64,
    nodes: Vec<NodeView>,
    /// The scenario's topology levels, innermost first: the domains shown.
    levels: Vec<String>,
    slot: HashMap<String, usize>,
    /// Tasks on each node (by node index), as the decisions and releases leave them.
    tasks: Vec<Vec<NodeTask>>,
    /// DRA devices on each node (by node index), and where each is, by its id.
    devices: Vec<Vec<DeviceView>>,
    device_at: DeviceIndex,
    /// The devices each running task's claims hold.
    held: HashMap<String, Vec<(usize, usize)>>,
    /// Workloads that wait, by name, with why as of their last attempt.
    waiting: BTreeMap<String, WorkloadView>,
    queues: Vec<QueueShare>,
    tree: QueueTree,
    policy: PolicyView,
    series: Vec<SeriesPoint>,
    placed: u64,
    /// FGD's target workload of the replayed jobs, and each node's fragmentation for it (by node
    /// index), kept current as nodes change.
    typical: Vec<TypicalPod>,
    access: ModelAccess,
    fragmented: Vec<f64>,
}

fn policy_view(live: &LiveSet) -> PolicyView {
    let plugins = live
        .set
        .plugin_stages()
        .into_iter()
        .map(|(name, stages)| PluginView {
            name: name.to_string(),
            stages: stages.iter().map(|s| format!("{s:?}")).collect(),
            digest: live.digest(name).unwrap_or("built-in").to_string(),
            ..PluginView::default()
        })
        .collect();
    PolicyView { name: live.reference.name.clone(), version: live.reference.version, plugins, rollout: None }
}

impl TimedReplay {
    /// Where the page's decision stream is fed (a tap on the command's event sink).
    pub fn publisher(&self) -> &Publisher {
        &self.board.publisher
    }

    /// Serves the dashboard on `addr` for a replay of `jobs` over `nodes` and `tree`, starting with `first`.
    pub fn start(
        addr: SocketAddr,
        jobs: &[Job],
        nodes: &NodeTable,
        tree: &QueueTree,
        dra: Option<&wasmsched_dra::Objects>,
        first: &LiveSet,
        speed: f64,
    ) -> anyhow::Result<TimedReplay> {
        let source = format!("replay: {} jobs on {} nodes", jobs.len(), nodes.len());
        anyhow::ensure!(
            speed.is_finite() && speed >= 0.0,
            "--speed must be 0 (as fast as possible) or a positive number of virtual seconds per second"
        );
        let board = Board::start(addr, View { source: source.clone(), ..View::default() })?;
        let mut views: Vec<NodeView> = nodes.slots().filter_map(|s| nodes.get(s)).map(NodeView::from).collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        let slot: HashMap<String, usize> = views.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        let (devices, device_at) = node_devices(dra, &slot);
        let mut replay = TimedReplay {
            board,
            source,
            speed,
            started: Instant::now(),
            published: Instant::now(),
            at: 0,
            tasks: vec![Vec::new(); views.len()],
            devices,
            device_at,
            held: HashMap::new(),
            nodes: views,
            levels: nodes.domains().levels().to_vec(),
            slot,
            waiting: BTreeMap::new(),
            queues: Vec::new(),
            tree: tree.clone(),
            policy: policy_view(first),
            series: Vec::new(),
            placed: 0,
            typical: wasmsched_sim::timed::target_workload(jobs),
            access: ModelAccess::default(),
            fragmented: Vec::new(),
        };
        replay.fragmented = vec![0.0; replay.nodes.len()];
        let names: Vec<String> = replay.nodes.iter().map(|n| n.name.clone()).collect();
        for name in names {
            replay.refresh(nodes, &name);
        }
        replay.publish();
        Ok(replay)
    }

    /// The node `name` as `nodes` has it now.
    fn refresh(&mut self, nodes: &NodeTable, name: &str) {
        if let (Some(&i), Some(node)) = (self.slot.get(name), nodes.slot_of(name).and_then(|s| nodes.get(s))) {
            self.nodes[i] = NodeView::from(node);
            let model = node.gpus.first().map_or("", |g| g.model.as_str());
            self.fragmented[i] =
                fragmentation::of_node(&self.typical, self.access.of(&self.typical, model), node).fragmented;
        }
    }

    fn remove_task(&mut self, node: &str, task: &str) {
        if let Some(&i) = self.slot.get(node) {
            self.tasks[i].retain(|t| t.name != task);
        }
        for (n, d) in self.held.remove(task).unwrap_or_default() {
            self.devices[n][d].held_by.retain(|h| h != task);
        }
    }

    /// One decision, made by `live` (the set of its version).
    pub fn decided(&mut self, d: &TimedDecision<'_>, live: Option<&LiveSet>) {
        self.enter(d.at);
        if let Some(live) = live.filter(|l| l.reference.version != self.policy.version) {
            self.policy = policy_view(live);
        }
        match d.decision {
            Decision::Bound { workload, task, node, .. } => {
                self.placed += 1;
                self.waiting.remove(workload);
                self.refresh(d.nodes, node);
                if let Some(&i) = self.slot.get(node) {
                    let queue = d.job.map(|j| j.queue.clone()).unwrap_or_default();
                    self.tasks[i].push(NodeTask { name: task.clone(), queue });
                }
                let ids = d.claims.iter().flat_map(|a| &a.results).filter(|r| !r.2).map(|r| r.1.to_string());
                for at in ids.filter_map(|id| self.device_at.get(&id).copied()).collect::<Vec<_>>() {
                    self.devices[at.0][at.1].held_by.push(task.clone());
                    self.held.entry(task.clone()).or_default().push(at);
                }
            }
            Decision::Unschedulable { workload, explanation } => {
                let reason = explanation.to_string();
                let (members, min_member) = d.job.map_or((1, 1), job_size);
                self.waiting.insert(
                    workload.clone(),
                    WorkloadView {
                        name: workload.clone(),
                        queue: d.job.map(|j| j.queue.clone()).unwrap_or_default(),
                        phase: "Pending".into(),
                        members,
                        placed: explanation.gang.map_or(0, |g| g.0),
                        min_member,
                        reason: Some(reason).filter(|r| !r.is_empty()),
                        queue_position: None,
                        waiting_seconds: d.job.map(|j| d.at.saturating_sub(j.arrival)),
                    },
                );
            }
            Decision::Evicted { task, node, .. } => {
                self.remove_task(node, task);
                self.refresh(d.nodes, node);
            }
            Decision::TimedOut { workload } => {
                if let Some(w) = self.waiting.get_mut(workload) {
                    w.phase = "TimedOut".into();
                }
            }
            Decision::PreemptionRequested { .. } | Decision::Fault(_) => {}
        }
        self.publish_when_due();
    }

    /// A job that waited was withdrawn: it waits no more.
    pub fn withdrawn(&mut self, at: u64, workload: &str) {
        self.enter(at);
        self.waiting.remove(workload);
        self.publish_when_due();
    }

    /// A run ended: its room is free.
    pub fn released(&mut self, r: &TimedRelease<'_>) {
        self.enter(r.at);
        self.remove_task(r.node, &r.task.id);
        self.refresh(r.nodes, r.node);
        self.publish_when_due();
    }

    /// The queues after an instant's cycle.
    pub fn shares(&mut self, at: u64, queues: &[QueueShare]) {
        self.enter(at);
        self.queues = queues.to_vec();
        self.publish_when_due();
    }

    /// An observation at virtual time `at`, before it changes anything: when time moves on, the
    /// instant that ended is shown as it ended (every decision of it made) and the replay waits
    /// for the wall clock to reach `at` at `speed`.
    fn enter(&mut self, at: u64) {
        if at <= self.at {
            return;
        }
        if self.speed > 0.0 {
            let due = self.started + Duration::from_secs_f64(at as f64 / self.speed);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                self.publish();
                std::thread::sleep(wait);
            }
        }
        self.at = at;
    }

    /// After an observation: a view when one is due.
    fn publish_when_due(&mut self) {
        if self.published.elapsed() >= PUBLISH_EVERY {
            self.publish();
        }
    }

    /// The replay is over: the final view.
    pub fn finished(mut self) -> Board {
        self.source = format!("{} — replay finished", self.source);
        self.publish();
        self.board
    }

    fn queue_views(&self) -> Vec<QueueView> {
        let mut pending: HashMap<&str, usize> = HashMap::new();
        for w in self.waiting.values().filter(|w| w.phase == "Pending") {
            *pending.entry(w.queue.as_str()).or_default() += w.members.saturating_sub(w.placed);
        }
        let mut running: HashMap<&str, usize> = HashMap::new();
        for t in self.tasks.iter().flatten() {
            *running.entry(t.queue.as_str()).or_default() += 1;
        }
        let mut rows: Vec<QueueView> = self
            .queues
            .iter()
            .map(|s| {
                let i = self.tree.index_of(&s.name);
                let parent = i.and_then(|i| self.tree.parent(i)).and_then(|p| self.tree.get(p)).map(|q| q.name.clone());
                let (pending, running) = (pending.get(s.name.as_str()), running.get(s.name.as_str()));
                QueueView::of(
                    s,
                    i.and_then(|i| self.tree.get(i)),
                    parent,
                    pending.copied().unwrap_or(0),
                    running.copied().unwrap_or(0),
                )
            })
            .collect();
        QueueView::lend(&mut rows);
        rows
    }

    fn publish(&mut self) {
        self.published = Instant::now();
        let nodes: Vec<NodeView> = self
            .nodes
            .iter()
            .zip(self.tasks.iter().zip(&self.devices))
            .map(|(n, (tasks, devices))| NodeView { tasks: tasks.clone(), ..n.clone() }.with_devices(devices.clone()))
            .collect();
        let cluster = Cluster::of(&nodes, self.placed, self.waiting.len() as u64);
        let domains = wasmsched_dashboard::view::DomainView::of(&nodes, &self.levels);
        let allocation = 100.0 * cluster.gpu_milli_used as f64 / cluster.gpu_milli_total.max(1) as f64;
        let point = SeriesPoint {
            at: self.at as f64,
            allocation_percent: allocation,
            fragmentation_percent: (!self.typical.is_empty() && cluster.gpu_milli_total > 0)
                .then(|| 100.0 * self.fragmented.iter().sum::<f64>() / cluster.gpu_milli_total as f64),
        };
        // One point per virtual instant: the cluster as the instant left it.
        match self.series.last_mut() {
            Some(last) if last.at == point.at => *last = point,
            _ => self.series.push(point),
        }
        let publisher: &Publisher = &self.board.publisher;
        publisher.publish(View {
            source: self.source.clone(),
            at_seconds: self.at,
            cluster,
            nodes,
            domains,
            queues: self.queue_views(),
            workloads: self.waiting.values().cloned().collect(),
            policies: Some(self.policy.clone()),
            series: self.series.clone(),
            series_x: "virtual seconds".into(),
            ..View::default()
        });
    }
}

/// Where each DRA device is shown, by its id: (node index, its place among the node's devices).
type DeviceIndex = HashMap<String, (usize, usize)>;

/// The DRA devices of `dra`'s complete pools local to each node of `slot`, and where each is.
fn node_devices(
    dra: Option<&wasmsched_dra::Objects>,
    slot: &HashMap<String, usize>,
) -> (Vec<Vec<DeviceView>>, DeviceIndex) {
    let mut devices = vec![Vec::new(); slot.len()];
    let mut at = HashMap::new();
    let Some(objects) = dra else { return (devices, at) };
    let (inventory, _) = wasmsched_dra::Inventory::from_slices(&objects.slices);
    let mut local: Vec<&wasmsched_dra::Device> = inventory
        .devices()
        .iter()
        .filter(|d| matches!(&d.reach, wasmsched_dra::Reach::Node(n) if slot.contains_key(n)))
        .collect();
    local.sort_by(|a, b| a.id.cmp(&b.id));
    for d in local {
        let wasmsched_dra::Reach::Node(node) = &d.reach else { continue };
        let n = slot[node];
        at.insert(d.id.to_string(), (n, devices[n].len()));
        devices[n].push(DeviceView {
            id: d.id.to_string(),
            model: d.string_attribute("productName").map(str::to_owned),
            kind: d.string_attribute("type").map(str::to_owned),
            profile: d.string_attribute("profile").map(str::to_owned),
            held_by: Vec::new(),
        });
    }
    (devices, at)
}

/// A job's members and the fewest that must run together.
fn job_size(job: &Job) -> (usize, usize) {
    let members = job.replicas.max(1) as usize;
    (members, job.min_replicas.map_or(members, |m| m as usize))
}
