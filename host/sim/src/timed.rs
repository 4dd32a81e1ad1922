//! Time-driven replay: jobs arrive at their times, wait in their queues, run for their durations
//! and leave, freeing capacity that re-activates waiting work.
//!
//! The queue discipline is strict priority, then arrival, with backfilling: a job that does not fit
//! does not block smaller ones behind it. Waiting jobs are retried only when capacity is freed (never
//! by polling), and within one retry pass a request shape that failed is not tried again, because
//! identical requests on an unchanged cluster get identical filter results. Time is virtual
//! (seconds); a run is deterministic for deterministic policies.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde::{Deserialize, Serialize};
use wasmsched_api::{DeviceShare, GpuRequest, Node, Resources, Task};
use wasmsched_core::{NodeTable, Placement, PolicySet, Slot, Unschedulable, bind, place, release};
use wasmsched_plugin_gpu_share_score::{Spec, TypicalPod, typical_pods};

use wasmsched_topology::NodeTopology;

use crate::trace::{TraceError, TracePod};

/// A job of the time-driven replay (one pod).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique name.
    pub name: String,
    /// Queue it waits in.
    #[serde(default = "default_queue")]
    pub queue: String,
    /// Arrival time (s).
    pub arrival: u64,
    /// Run time once started (s); `None` runs until the end of the replay.
    #[serde(default)]
    pub duration: Option<u64>,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
    /// CPU request (milli-cores).
    #[serde(default)]
    pub cpu_milli: u64,
    /// Memory request (MiB).
    #[serde(default)]
    pub memory_mib: u64,
    /// GPUs (whole GPUs, or 1 shared).
    #[serde(default)]
    pub gpus: u32,
    /// Share of each GPU (milli-GPU, 1..=1000).
    #[serde(default)]
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    #[serde(default)]
    pub gpu_models: Vec<String>,
}

fn default_queue() -> String {
    "default".into()
}

impl Job {
    /// An openb pod as a job: queue = its QoS class, arrival = creation time, duration = deletion
    /// minus creation. `compress` divides arrival times (> 1 raises the load; durations unchanged).
    pub fn from_trace(pod: &TracePod, compress: f64) -> Job {
        let arrival = pod.creation_time.unwrap_or(0);
        Job {
            name: pod.name.clone(),
            queue: if pod.qos.is_empty() { default_queue() } else { pod.qos.clone() },
            arrival: (arrival as f64 / compress) as u64,
            duration: pod.deletion_time.map(|d| d.saturating_sub(arrival)),
            priority: 0,
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            gpus: pod.num_gpu,
            gpu_milli: if pod.num_gpu == 0 { 0 } else { pod.gpu_milli },
            gpu_models: pod.gpu_spec.clone(),
        }
    }

    fn task(&self) -> Task {
        Task {
            id: self.name.clone(),
            namespace: "sim".into(),
            queue: self.queue.clone(),
            priority: self.priority,
            request: Resources {
                cpu_milli: self.cpu_milli,
                memory_bytes: self.memory_mib.saturating_mul(1 << 20),
                ..Default::default()
            },
            gpu: if self.gpus == 0 {
                GpuRequest::default()
            } else {
                GpuRequest {
                    count: self.gpus,
                    milli_per_gpu: self.gpu_milli,
                    models: self.gpu_models.clone(),
                    ..Default::default()
                }
            },
            ..Default::default()
        }
    }

    /// The job's shape, as FGD's target workload counts it.
    fn spec(&self) -> Spec {
        let gpu = self.gpus > 0;
        Spec {
            cpu_milli: self.cpu_milli,
            milli: if gpu { self.gpu_milli } else { 0 },
            count: self.gpus,
            models: if gpu { self.gpu_models.join("|") } else { String::new() },
        }
    }

    fn gpu_milli_total(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.gpu_milli)
    }
}

/// FGD's target workload of a job list: its popular shapes covering 95 % of the jobs.
pub fn target_workload(jobs: &[Job]) -> Vec<TypicalPod> {
    typical_pods(jobs.iter().map(Job::spec), 95)
}

/// A node of a scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioNode {
    /// Unique name.
    pub name: String,
    /// CPU (milli-cores).
    pub cpu_milli: u64,
    /// Memory (MiB).
    pub memory_mib: u64,
    /// GPUs.
    #[serde(default)]
    pub gpus: u32,
    /// GPU model.
    #[serde(default)]
    pub model: String,
    /// `nvidia-smi topo -m` output of the node, a path relative to the scenario file; its GPU count
    /// must equal `gpus`. Read by [`Scenario::load`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

/// The documented scenario format (JSON): nodes, the queues jobs may name, and jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The cluster.
    pub nodes: Vec<ScenarioNode>,
    /// Queue names; a job naming another queue is an error.
    pub queues: Vec<String>,
    /// The jobs.
    pub jobs: Vec<Job>,
}

impl Scenario {
    /// Parse and validate a scenario; errors name the file and the offending item.
    pub fn parse(file: &str, text: &str) -> Result<Scenario, TraceError> {
        let bad = |line: usize, column: usize, message: String| TraceError::Malformed {
            file: file.into(),
            line,
            column,
            message,
        };
        let s: Scenario = serde_json::from_str(text).map_err(|e| bad(e.line(), e.column(), e.to_string()))?;
        let mut names = BTreeSet::new();
        for n in &s.nodes {
            if !names.insert(n.name.as_str()) {
                return Err(bad(0, 0, format!("node {:?} appears twice", n.name)));
            }
            if n.gpus > 64 || (n.gpus > 0 && n.model.is_empty()) {
                return Err(bad(0, 0, format!("node {:?}: {} GPUs of model {:?}", n.name, n.gpus, n.model)));
            }
        }
        let mut jobs = BTreeSet::new();
        for j in &s.jobs {
            if !jobs.insert(j.name.as_str()) {
                return Err(bad(0, 0, format!("job {:?} appears twice", j.name)));
            }
            if !s.queues.contains(&j.queue) {
                return Err(bad(0, 0, format!("job {:?} names unknown queue {:?}", j.name, j.queue)));
            }
            let shared_ok = j.gpus == 1 && (1..=1000).contains(&j.gpu_milli);
            let whole_ok = j.gpus > 1 && j.gpus <= 64 && j.gpu_milli == 1000;
            if j.gpus > 0 && !(shared_ok || whole_ok) {
                return Err(bad(
                    0,
                    0,
                    format!("job {:?}: {} GPUs × {} milli is not a valid GPU request", j.name, j.gpus, j.gpu_milli),
                ));
            }
        }
        Ok(s)
    }

    /// Reads and validates the scenario at `path`, and the topology files its nodes name
    /// (relative to the scenario's directory).
    pub fn load(path: &std::path::Path) -> Result<(Scenario, BTreeMap<String, NodeTopology>), TraceError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TraceError::Io { file: file.clone(), source: e })?;
        let scenario = Scenario::parse(&file, &text)?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        let mut topologies = BTreeMap::new();
        for n in &scenario.nodes {
            let Some(rel) = &n.topology else { continue };
            let bad = |message: String| TraceError::Malformed { file: file.clone(), line: 0, column: 0, message };
            let topo_path = dir.join(rel);
            let text = std::fs::read_to_string(&topo_path)
                .map_err(|e| bad(format!("node {:?}: topology {}: {e}", n.name, topo_path.display())))?;
            let topology = wasmsched_topology::smi::parse(&text)
                .map_err(|e| bad(format!("node {:?}: topology {}: {e}", n.name, topo_path.display())))?;
            if topology.len() != n.gpus as usize {
                return Err(bad(format!(
                    "node {:?} has {} GPUs, its topology {} has {}",
                    n.name,
                    n.gpus,
                    topo_path.display(),
                    topology.len()
                )));
            }
            topologies.insert(n.name.clone(), topology);
        }
        Ok((scenario, topologies))
    }

    /// The scenario's nodes as the core's nodes, with the given topologies attached (and their
    /// NUMA nodes on the GPUs).
    pub fn node_table_with(&self, topologies: &BTreeMap<String, NodeTopology>) -> NodeTable {
        let mut t = self.node_table();
        for (name, topology) in topologies {
            if let Some(slot) = t.slot_of(name) {
                t.update(slot, |node| {
                    for gpu in &mut node.gpus {
                        gpu.numa_node = topology.gpus().get(gpu.index as usize).and_then(|g| g.numa);
                    }
                });
            }
            t.topologies_mut().insert(name, topology.clone());
        }
        t
    }

    /// The scenario's nodes as the core's nodes.
    pub fn node_table(&self) -> NodeTable {
        let mut t = NodeTable::new();
        for n in &self.nodes {
            t.upsert(Node {
                name: n.name.clone(),
                allocatable: Resources {
                    cpu_milli: n.cpu_milli,
                    memory_bytes: n.memory_mib.saturating_mul(1 << 20),
                    gpu_milli: u64::from(n.gpus) * 1000,
                    extended: vec![],
                },
                gpus: (0..n.gpus)
                    .map(|index| wasmsched_api::GpuDevice {
                        index,
                        model: n.model.clone(),
                        free_milli: 1000,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        t
    }
}

/// What happened to one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobOutcome {
    /// Queue.
    pub queue: String,
    /// Arrival (s).
    pub arrival: u64,
    /// Start (s), if it ever ran.
    pub start: Option<u64>,
    /// End (s), if it finished within the replay.
    pub end: Option<u64>,
    /// Why it was still waiting at the end (the reason most nodes gave).
    pub waiting_reason: Option<String>,
}

/// Per-queue summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueStats {
    /// Jobs that arrived.
    pub jobs: usize,
    /// Jobs that started.
    pub started: usize,
    /// Jobs still waiting at the end.
    pub waiting: usize,
    /// Queueing delay of started jobs (s): mean, median, 99th percentile.
    pub delay_mean: f64,
    /// Median queueing delay (s).
    pub delay_p50: u64,
    /// 99th-percentile queueing delay (s).
    pub delay_p99: u64,
    /// Mean completion time (end − arrival) of finished jobs (s).
    pub jct_mean: f64,
    /// GPU-seconds received over GPU-seconds demanded (within the replay).
    pub service_ratio: f64,
}

/// The result of a time-driven replay.
#[derive(Clone, Debug, Serialize)]
pub struct TimedRun {
    /// Per job, in input order.
    pub jobs: Vec<JobOutcome>,
    /// Per queue.
    pub queues: BTreeMap<String, QueueStats>,
    /// Jobs still waiting at the end, by reason.
    pub waiting_by_reason: BTreeMap<String, usize>,
    /// (time s, GPU allocation % of capacity) after each instant with events.
    pub utilisation: Vec<(u64, f64)>,
    /// Time-weighted mean GPU allocation (%) between the first and the last event.
    pub utilisation_mean: f64,
    /// Jain's fairness index over the queues' service ratios (1 = perfectly even).
    pub jain_fairness: f64,
    /// Placement attempts made (a measure of the scheduler's work).
    pub attempts: usize,
    /// Last event time (s).
    pub horizon: u64,
}

fn main_reason(e: &wasmsched_core::Unschedulable) -> String {
    e.diagnosis
        .rejections
        .iter()
        .max_by_key(|(_, (n, _))| *n)
        .map_or_else(|| e.diagnosis.to_string(), |((plugin, reason), _)| format!("{plugin}: {reason}"))
}

/// Replay `jobs` on a copy of `nodes` with `set` (worker 0).
pub fn run(set: &PolicySet, nodes: &NodeTable, jobs: &[Job]) -> TimedRun {
    run_observed(set, nodes, jobs, |_| {})
}

/// One placement attempt of a time-driven replay, for observers (events, logs).
#[derive(Debug)]
pub struct TimedDecision<'a> {
    /// Virtual time of the attempt, in seconds since the start of the replay.
    pub at: u64,
    /// The job's task.
    pub task: &'a Task,
    /// Attempts for this job so far, this one included.
    pub attempt: u32,
    /// Where it went (the node after binding), or why it could not be placed.
    pub outcome: Result<(&'a Placement, &'a Node), &'a Unschedulable>,
}

/// [`run`], calling `observe` after every placement attempt.
pub fn run_observed(
    set: &PolicySet,
    nodes: &NodeTable,
    jobs: &[Job],
    mut observe: impl FnMut(TimedDecision<'_>),
) -> TimedRun {
    let mut per_job_attempts = vec![0u32; jobs.len()];
    let mut table = nodes.clone();
    let capacity: u64 = table.slots().filter_map(|s| table.get(s)).map(|n| n.allocatable.gpu_milli).sum();
    let tasks: Vec<Task> = jobs.iter().map(Job::task).collect();
    let mut arrivals: Vec<usize> = (0..jobs.len()).collect();
    arrivals.sort_by_key(|&i| (jobs[i].arrival, i));
    let mut next_arrival = 0;
    let mut departures: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut running: Vec<Option<(Slot, Vec<DeviceShare>)>> = vec![None; jobs.len()];
    let mut pending: BTreeSet<(Reverse<i32>, u64, usize)> = BTreeSet::new();
    let mut out: Vec<JobOutcome> = jobs
        .iter()
        .map(|j| JobOutcome {
            queue: j.queue.clone(),
            arrival: j.arrival,
            start: None,
            end: None,
            waiting_reason: None,
        })
        .collect();
    let (mut used, mut attempts) = (0u64, 0usize);
    let mut utilisation = Vec::new();
    let mut now = 0;
    loop {
        let t_arr = arrivals.get(next_arrival).map(|&i| jobs[i].arrival);
        let t_dep = departures.peek().map(|Reverse((t, _))| *t);
        now = match (t_arr, t_dep) {
            (None, None) => break,
            (a, d) => a.unwrap_or(u64::MAX).min(d.unwrap_or(u64::MAX)),
        };
        let mut freed = false;
        while let Some(&Reverse((t, i))) = departures.peek() {
            if t != now {
                break;
            }
            departures.pop();
            if let Some((slot, devices)) = running[i].take() {
                table.update(slot, |n| release(n, &tasks[i], &devices));
                used -= jobs[i].gpu_milli_total();
                out[i].end = Some(now);
                freed = true;
            }
        }
        let mut fresh = Vec::new();
        while let Some(&i) = arrivals.get(next_arrival) {
            if jobs[i].arrival != now {
                break;
            }
            next_arrival += 1;
            pending.insert((Reverse(jobs[i].priority), jobs[i].arrival, i));
            fresh.push(i);
        }
        // Capacity only shrinks between departures, so without one only new arrivals can fit.
        let candidates: Vec<(Reverse<i32>, u64, usize)> = if freed {
            pending.iter().copied().collect()
        } else {
            fresh.iter().map(|&i| (Reverse(jobs[i].priority), jobs[i].arrival, i)).collect()
        };
        let mut failed_shapes: Vec<(&Resources, &GpuRequest)> = Vec::new();
        for key in candidates {
            let i = key.2;
            let shape = (&tasks[i].request, &tasks[i].gpu);
            if failed_shapes.contains(&shape) {
                continue;
            }
            attempts += 1;
            per_job_attempts[i] += 1;
            let attempt = per_job_attempts[i];
            match place(set, &table, &tasks[i], 0) {
                Ok(p) => {
                    if let Some(Ok(())) = table.update(p.node, |n| bind(n, &tasks[i], &p.devices)) {
                        if let Some(node) = table.get(p.node) {
                            observe(TimedDecision { at: now, task: &tasks[i], attempt, outcome: Ok((&p, node)) });
                        }
                        pending.remove(&key);
                        running[i] = Some((p.node, p.devices));
                        used += jobs[i].gpu_milli_total();
                        out[i].start = Some(now);
                        out[i].waiting_reason = None;
                        if let Some(d) = jobs[i].duration {
                            departures.push(Reverse((now.saturating_add(d), i)));
                        }
                    }
                }
                Err(e) => {
                    observe(TimedDecision { at: now, task: &tasks[i], attempt, outcome: Err(&e) });
                    out[i].waiting_reason = Some(main_reason(&e));
                    failed_shapes.push(shape);
                }
            }
        }
        for &(_, _, i) in &pending {
            if out[i].waiting_reason.is_none() {
                out[i].waiting_reason = Some("not yet retried".into());
            }
        }
        let pct = if capacity > 0 { 100.0 * used as f64 / capacity as f64 } else { 0.0 };
        utilisation.push((now, pct));
    }
    summarise(jobs, out, utilisation, attempts, now)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summarise(
    jobs: &[Job],
    out: Vec<JobOutcome>,
    utilisation: Vec<(u64, f64)>,
    attempts: usize,
    horizon: u64,
) -> TimedRun {
    let mut queues = BTreeMap::new();
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    for q in names {
        let ids: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].queue == q).collect();
        let mut delays: Vec<u64> = ids.iter().filter_map(|&i| out[i].start.map(|s| s - out[i].arrival)).collect();
        delays.sort_unstable();
        let jcts: Vec<u64> = ids.iter().filter_map(|&i| out[i].end.map(|e| e - out[i].arrival)).collect();
        let (mut received, mut demanded) = (0f64, 0f64);
        for &i in &ids {
            let g = jobs[i].gpu_milli_total() as f64;
            let want = jobs[i].duration.unwrap_or(u64::MAX).min(horizon.saturating_sub(jobs[i].arrival));
            demanded += g * want as f64;
            if let Some(s) = out[i].start {
                received += g * (out[i].end.unwrap_or(horizon).min(horizon) - s).min(want) as f64;
            }
        }
        let mean =
            |v: &[u64]| if v.is_empty() { 0.0 } else { v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64 };
        queues.insert(
            q.to_string(),
            QueueStats {
                jobs: ids.len(),
                started: delays.len(),
                waiting: ids.iter().filter(|&&i| out[i].start.is_none()).count(),
                delay_mean: mean(&delays),
                delay_p50: percentile(&delays, 50.0),
                delay_p99: percentile(&delays, 99.0),
                jct_mean: mean(&jcts),
                service_ratio: if demanded > 0.0 { received / demanded } else { 1.0 },
            },
        );
    }
    let mut waiting_by_reason = BTreeMap::new();
    for o in out.iter().filter(|o| o.start.is_none()) {
        *waiting_by_reason.entry(o.waiting_reason.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    let span = utilisation.last().map_or(0, |l| l.0) - utilisation.first().map_or(0, |f| f.0);
    let utilisation_mean = if span == 0 {
        utilisation.last().map_or(0.0, |l| l.1)
    } else {
        utilisation.windows(2).map(|w| w[0].1 * (w[1].0 - w[0].0) as f64).sum::<f64>() / span as f64
    };
    let x: Vec<f64> = queues.values().map(|q| q.service_ratio).collect();
    let (s, s2) = x.iter().fold((0.0, 0.0), |(s, s2), v| (s + v, s2 + v * v));
    let jain_fairness = if s2 > 0.0 { s * s / (x.len() as f64 * s2) } else { 1.0 };
    TimedRun { jobs: out, queues, waiting_by_reason, utilisation, utilisation_mean, jain_fairness, attempts, horizon }
}
