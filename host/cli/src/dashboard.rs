//! `simulate --serve`: the dashboard over a replay. The replay's observer keeps a copy of each
//! node as the decisions change it and hands the dashboard a whole view every 100 ms (and a
//! decision event per pod while a browser follows), paced so a person can watch.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use wasmsched_core::{NodeTable, PolicySet};
use wasmsched_dashboard::view::{Cluster, NodeTask, NodeView, PluginView, PolicyView, SeriesPoint, WorkloadView};
use wasmsched_dashboard::{Publisher, Server, View};
use wasmsched_sim::replay;

/// Unplaced pods the view lists (the most recent).
const FAILURES_SHOWN: usize = 200;
/// How often a new view is published during the replay.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// A dashboard server of the command line's own, on a runtime of one thread.
pub struct Board {
    runtime: tokio::runtime::Runtime,
    server: Server,
    /// Where views and events go.
    pub publisher: Publisher,
}

impl Board {
    /// Serves `first` on `addr` (printing where on stderr, as the tests and a person read it): a
    /// page never sees a view of nothing, whenever it comes.
    pub fn start(addr: SocketAddr, first: View) -> anyhow::Result<Board> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("the dashboard's runtime")?;
        let publisher = Publisher::new();
        publisher.publish(first);
        let server = runtime.block_on(Server::start(addr, publisher.clone()))?;
        eprintln!("dashboard: http://{}/", server.addr());
        Ok(Board { runtime, server, publisher })
    }

    /// Serves the last view until Ctrl-C or SIGTERM.
    pub fn serve_until_interrupted(self) -> anyhow::Result<()> {
        eprintln!("dashboard: finished; serving http://{}/ until Ctrl-C", self.server.addr());
        self.runtime.block_on(async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r,
                _ = term.recv() => Ok(()),
            }
        })?;
        self.server.stop();
        Ok(())
    }
}

/// The dashboard of one replay.
pub struct Replay {
    board: Board,
    source: String,
    nodes: Vec<NodeView>,
    slot: HashMap<String, usize>,
    policies: PolicyView,
    failures: VecDeque<WorkloadView>,
    series: Vec<SeriesPoint>,
    /// What the series' clock counts: pods decided while the replay runs, then FGD's arrived
    /// percent of capacity.
    series_x: &'static str,
    placed: u64,
    failed: u64,
    pace: f64,
    started: Instant,
    published: Instant,
}

impl Replay {
    /// Where the page's decision stream is fed (a tap on the command's event sink).
    pub fn publisher(&self) -> &Publisher {
        &self.board.publisher
    }

    /// Serves the dashboard on `addr` for a replay of `set` over `nodes`.
    pub fn start(
        addr: SocketAddr,
        source: String,
        nodes: &NodeTable,
        set: &PolicySet,
        policy: &wasmsched_events::schema::PolicySetRef,
        pace: f64,
    ) -> anyhow::Result<Replay> {
        anyhow::ensure!(pace.is_finite() && pace >= 0.0, "--pace must be 0 or a positive number of pods per second");
        let board = Board::start(addr, View { source: source.clone(), ..View::default() })?;
        let mut views: Vec<NodeView> = nodes.slots().filter_map(|s| nodes.get(s)).map(NodeView::from).collect();
        views.sort_by(|a, b| a.name.cmp(&b.name));
        let slot = views.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        let plugins = set
            .plugin_stages()
            .into_iter()
            .map(|(name, stages)| PluginView {
                name: name.to_string(),
                stages: stages.iter().map(|s| format!("{s:?}")).collect(),
                digest: "built-in".into(),
                ..PluginView::default()
            })
            .collect();
        let policies = PolicyView { name: policy.name.clone(), version: policy.version, plugins, rollout: None };
        let mut replay = Replay {
            board,
            source,
            nodes: views,
            slot,
            policies,
            failures: VecDeque::new(),
            series: Vec::new(),
            series_x: "pods decided",
            placed: 0,
            failed: 0,
            pace,
            started: Instant::now(),
            published: Instant::now(),
        };
        replay.publish();
        Ok(replay)
    }

    /// One decision of the replay: the node it changed, the event, the pace.
    pub fn decided(&mut self, d: &replay::Decision<'_>) {
        match d.outcome {
            Ok((_, node)) => {
                self.placed += 1;
                if let Some(&i) = self.slot.get(&node.name) {
                    let mut tasks = std::mem::take(&mut self.nodes[i].tasks);
                    tasks.push(NodeTask { name: d.task.id.clone(), queue: d.task.queue.clone() });
                    self.nodes[i] = NodeView { tasks, ..NodeView::from(node) };
                }
            }
            Err(u) => {
                self.failed += 1;
                let reason = u.diagnosis.to_string();
                self.failures.push_front(WorkloadView {
                    name: d.task.id.clone(),
                    queue: d.task.queue.clone(),
                    phase: "Unschedulable".into(),
                    members: 1,
                    placed: 0,
                    min_member: 1,
                    reason: Some(reason),
                    queue_position: None,
                    waiting_seconds: None,
                });
                self.failures.truncate(FAILURES_SHOWN);
            }
        }
        let decided = self.placed + self.failed;
        if self.pace > 0.0 {
            let due = self.started + Duration::from_secs_f64(decided as f64 / self.pace);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        if self.published.elapsed() >= PUBLISH_EVERY {
            let cluster = Cluster::of(&self.nodes, self.placed, self.failed);
            let allocation = 100.0 * cluster.gpu_milli_used as f64 / cluster.gpu_milli_total.max(1) as f64;
            self.series.push(SeriesPoint {
                at: decided as f64,
                allocation_percent: allocation,
                fragmentation_percent: Some(100.0 * d.after.frag_milli / cluster.gpu_milli_total.max(1) as f64),
            });
            self.publish();
        }
    }

    /// The replay is over: the final view, with the FGD measures by arrived percent.
    pub fn finished(&mut self, run: &replay::Run) {
        let allocation = replay::allocation_columns(run, 130);
        let fragmentation = replay::fragmentation_columns(run, 130);
        self.series = allocation
            .into_iter()
            .zip(fragmentation)
            .enumerate()
            .filter_map(|(arrived, (a, f))| {
                Some(SeriesPoint { at: arrived as f64, allocation_percent: a?, fragmentation_percent: f })
            })
            .collect();
        self.source = format!("{} — replay finished", self.source);
        self.series_x = "capacity arrived (%)";
        self.publish();
    }

    fn publish(&mut self) {
        self.published = Instant::now();
        self.board.publisher.publish(View {
            source: self.source.clone(),
            at_seconds: self.started.elapsed().as_secs(),
            cluster: Cluster::of(&self.nodes, self.placed, self.failed),
            nodes: self.nodes.clone(),
            queues: Vec::new(),
            workloads: self.failures.iter().cloned().collect(),
            policies: Some(self.policies.clone()),
            series: self.series.clone(),
            series_x: self.series_x.into(),
            ..View::default()
        });
    }

    /// Serves the final view until Ctrl-C or SIGTERM.
    pub fn serve_until_interrupted(self) -> anyhow::Result<()> {
        self.board.serve_until_interrupted()
    }
}
