//! A run's figures, as a table row and as JSON.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use kube::Client;
use serde::Serialize;

use crate::measure::{ProcessSample, ServerSample, quantile};
use crate::watch::{History, Overcommit};
use crate::{Arrival, Config, UnderTest};

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `schedulerName` of the pods.
    pub scheduler: String,
    /// Who bound them: `scheduler` (running), `command: LINE` (started by the run) or
    /// `binder: N in flight[, events]`.
    pub bound_by: String,
    /// The measured pods' shape (`plain`, `gang:8`, …).
    pub workload: String,
    /// Fake nodes and GPUs on each.
    pub nodes: usize,
    /// GPUs on each node.
    pub gpus_per_node: u32,
    /// Measured pods and GPUs each asked.
    pub pods: usize,
    /// GPUs each pod asked.
    pub gpus_per_pod: u32,
    /// `batch`, `burst` or `N/s`.
    pub arrival: String,
    /// Measured pods bound before the timeout.
    pub bound: usize,
    /// The first measured pods (up to 20) not bound, to look at (`wasmsched events why`).
    pub unbound: Vec<String>,
    /// From the clock's start (the first creation sent; for a batch, the scheduler's start) to
    /// the last pod seen bound.
    pub seconds: f64,
    /// From the clock's start to the first pod seen bound.
    pub first_bound_seconds: f64,
    /// `bound / seconds`.
    pub pods_per_second: f64,
    /// Creation sent (for a batch, the scheduler's start) → first seen bound, over the bound
    /// pods (milliseconds).
    pub latency_ms: Latency,
    /// The scheduler's requests per bound pod by `"VERB resource"` (the API server's counters
    /// less this tool's own); empty when the server's `/metrics` could not be read.
    pub requests_per_pod: BTreeMap<String, f64>,
    /// Their sum; none without `/metrics`.
    pub requests_per_pod_total: Option<f64>,
    /// The scheduler's process (when its PID was given).
    pub scheduler_process: Option<ProcessFigures>,
    /// This tool's own CPU seconds in the window (its watch, its creations, and with the binder
    /// the binder's work): on a machine it shares with the API server, the binder's cost.
    pub tool_cpu_seconds: Option<f64>,
    /// The API server's own CPU seconds during the run (its `/metrics`).
    pub api_server_cpu_seconds: Option<f64>,
    /// Pods whose deletion the tool finished in the kubelet's place (preemption victims).
    pub deletions_finished: usize,
    /// Nodes seen holding more GPUs than they have (0 and 0: never).
    pub overcommit: Overcommit,
    /// DRA devices in two of the run's allocated claims (0: none).
    pub devices_allocated_twice: usize,
    /// Measured pods ended by their lifetime.
    pub ended: usize,
    /// Fillers created to replace preempted ones (a preemption run under churn).
    pub refilled: usize,
    /// Every pod of the run seen bound (fillers too) and the GPU-seconds they held: what a
    /// scheduler's own event and usage counts must agree with.
    pub history: History,
    /// The scheduler and the pods over the run, one sample per `sample_every`.
    pub series: Vec<Sample>,
}

/// One moment of a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    /// Since the clock's start.
    pub seconds: f64,
    /// The scheduler's resident memory (MiB).
    pub rss_mib: Option<f64>,
    /// Its open file descriptors.
    pub open_fds: Option<usize>,
    /// Its CPU seconds so far.
    pub cpu_seconds: Option<f64>,
    /// Pods bound and not yet gone.
    pub alive: usize,
    /// Measured pods ended by their lifetime so far.
    pub ended: usize,
}

/// Latency quantiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// The slowest.
    pub max: f64,
}

/// A process's CPU and memory over the run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ProcessFigures {
    /// CPU seconds used during the measured window.
    pub cpu_seconds: f64,
    /// Resident memory at the end (MiB).
    pub rss_mib: f64,
    /// The most resident memory it ever had (MiB).
    pub peak_rss_mib: f64,
}

/// What the run collected, for [`Report::new`].
pub struct Samples<'a> {
    /// The clock's start: the first creation, or for a batch the scheduler's start.
    pub started: Instant,
    /// When each measured pod's creation was sent, by index.
    pub created: &'a [Instant],
    /// When each bound measured pod was first seen bound, by name.
    pub bound: &'a HashMap<String, Instant>,
    /// The name of measured pod `i`.
    pub names: &'a dyn Fn(usize) -> String,
    /// The API server's counters before and after.
    pub server: Option<(ServerSample, ServerSample)>,
    /// The scheduler's process before and after.
    pub process: Option<(ProcessSample, ProcessSample)>,
    /// This tool's process before and after.
    pub tool: Option<(ProcessSample, ProcessSample)>,
    /// This tool's own requests in the window.
    pub own: BTreeMap<String, f64>,
    /// Deletions finished in the kubelet's place.
    pub evicted: usize,
    /// Nodes seen over their GPUs.
    pub overcommit: Overcommit,
    /// DRA devices in two allocated claims.
    pub devices_allocated_twice: usize,
    /// Measured pods ended by their lifetime.
    pub ended: usize,
    /// Fillers created to replace preempted ones.
    pub refilled: usize,
    /// The run's pods seen bound and their GPU-seconds.
    pub history: History,
    /// Samples over the run.
    pub series: Vec<Sample>,
}

/// The API server's counters now, or none when it does not let this client read `/metrics`.
pub async fn server_sample(client: &Client) -> Option<ServerSample> {
    let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
    match client.request_text(request).await {
        Ok(text) => Some(ServerSample::parse(&text)),
        Err(e) => {
            tracing::warn!(error = %e, "the API server's /metrics is not readable: no requests per pod");
            None
        }
    }
}

impl Report {
    /// The report of a run of `config` from what it collected.
    pub fn new(config: &Config, samples: Samples<'_>) -> Report {
        let batch = config.arrival == Arrival::Batch;
        let mut latencies = Vec::with_capacity(samples.bound.len());
        let mut unbound = Vec::new();
        let (mut first_bound, mut last_bound) = (None::<Instant>, None::<Instant>);
        for (i, sent) in samples.created.iter().enumerate() {
            if let Some(at) = samples.bound.get(&(samples.names)(i)) {
                let from = if batch { samples.started } else { *sent };
                latencies.push(at.saturating_duration_since(from).as_secs_f64() * 1e3);
                last_bound = Some(last_bound.map_or(*at, |l| l.max(*at)));
                first_bound = Some(first_bound.map_or(*at, |l| l.min(*at)));
            } else if unbound.len() < 20 {
                unbound.push((samples.names)(i));
            }
        }
        latencies.sort_by(f64::total_cmp);
        let bound = latencies.len();
        let start = if batch { Some(samples.started) } else { samples.created.iter().min().copied() };
        let since_start = |at: Option<Instant>| match (start, at) {
            (Some(s), Some(a)) => a.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        };
        let seconds = since_start(last_bound);
        let q = |p| quantile(&latencies, p).unwrap_or(0.0);
        let (requests_per_pod, requests_per_pod_total, api_server_cpu_seconds) = match &samples.server {
            Some((before, after)) => {
                let per_pod: BTreeMap<String, f64> = after
                    .requests_since(before)
                    .into_iter()
                    .map(|(kind, n)| {
                        let theirs = (n - samples.own.get(&kind).copied().unwrap_or(0.0)).max(0.0);
                        (kind, theirs / bound.max(1) as f64)
                    })
                    .filter(|(_, n)| *n > 0.0)
                    .collect();
                let total = per_pod.values().sum();
                let cpu = after.cpu_seconds.zip(before.cpu_seconds).map(|(a, b)| a - b);
                (per_pod, Some(total), cpu)
            }
            None => (BTreeMap::new(), None, None),
        };
        const MIB: f64 = 1024.0 * 1024.0;
        Report {
            scheduler: config.scheduler_name.clone(),
            bound_by: match &config.under_test {
                UnderTest::Running { .. } => "scheduler".into(),
                UnderTest::Command { line, .. } => format!("command: {line}"),
                UnderTest::Binder(b) => {
                    format!("binder: {} in flight{}", b.in_flight, if b.events { ", events" } else { "" })
                }
            },
            workload: config.workload.name(),
            nodes: config.nodes,
            gpus_per_node: config.gpus_per_node,
            pods: config.pods,
            gpus_per_pod: config.gpus_per_pod,
            arrival: config.arrival.to_string(),
            bound,
            unbound,
            seconds,
            first_bound_seconds: since_start(first_bound),
            pods_per_second: if seconds > 0.0 { bound as f64 / seconds } else { 0.0 },
            latency_ms: Latency { p50: q(0.5), p90: q(0.9), p99: q(0.99), max: q(1.0) },
            requests_per_pod,
            requests_per_pod_total,
            scheduler_process: samples.process.map(|(before, after)| ProcessFigures {
                cpu_seconds: after.cpu_seconds - before.cpu_seconds,
                rss_mib: after.rss_bytes as f64 / MIB,
                peak_rss_mib: after.peak_rss_bytes as f64 / MIB,
            }),
            tool_cpu_seconds: samples.tool.map(|(before, after)| after.cpu_seconds - before.cpu_seconds),
            api_server_cpu_seconds,
            deletions_finished: samples.evicted,
            overcommit: samples.overcommit,
            devices_allocated_twice: samples.devices_allocated_twice,
            ended: samples.ended,
            refilled: samples.refilled,
            history: samples.history,
            series: samples.series,
        }
    }

    /// Every measured pod was bound.
    pub fn complete(&self) -> bool {
        self.bound == self.pods
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let who = match self.bound_by.strip_prefix("binder: ") {
            Some(b) => format!("trivial binder ({b})"),
            None => format!("scheduler {:?}", self.scheduler),
        };
        writeln!(
            f,
            "{who}: {} {} pods of {} GPU(s) on {} nodes × {} GPUs, arrival: {}",
            self.pods, self.workload, self.gpus_per_pod, self.nodes, self.gpus_per_node, self.arrival
        )?;
        writeln!(
            f,
            "  bound        {} of {} in {:.2} s (first after {:.2} s): {:.1} pods/s",
            self.bound, self.pods, self.seconds, self.first_bound_seconds, self.pods_per_second
        )?;
        if !self.unbound.is_empty() {
            writeln!(f, "  NOT BOUND    {}", self.unbound.join(", "))?;
        }
        let l = self.latency_ms;
        writeln!(
            f,
            "  latency      p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.p50, l.p90, l.p99, l.max
        )?;
        match self.requests_per_pod_total {
            Some(total) => {
                let each: Vec<String> = self.requests_per_pod.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
                writeln!(f, "  requests/pod {total:.2} ({})", each.join(", "))?;
            }
            None => writeln!(f, "  requests/pod unknown (the API server's /metrics was not readable)")?,
        }
        if let Some(p) = self.scheduler_process {
            writeln!(
                f,
                "  scheduler    {:.2} CPU s, RSS {:.0} MiB (peak {:.0} MiB)",
                p.cpu_seconds, p.rss_mib, p.peak_rss_mib
            )?;
        }
        if let Some(cpu) = self.tool_cpu_seconds {
            writeln!(f, "  this tool    {cpu:.2} CPU s")?;
        }
        if let Some(cpu) = self.api_server_cpu_seconds {
            writeln!(f, "  API server   {cpu:.2} CPU s")?;
        }
        if self.ended > 0 {
            writeln!(f, "  churn        {} pods ended by their lifetime", self.ended)?;
        }
        if let (Some(first), Some(last)) = (self.series.first(), self.series.last()) {
            let rss: Vec<f64> = self.series.iter().filter_map(|s| s.rss_mib).collect();
            let fds: Vec<usize> = self.series.iter().filter_map(|s| s.open_fds).collect();
            writeln!(
                f,
                "  over time    {} samples, {:.0}..{:.0} s: RSS {:.0}..{:.0} MiB, open files {}..{}",
                self.series.len(),
                first.seconds,
                last.seconds,
                rss.iter().copied().fold(f64::INFINITY, f64::min),
                rss.iter().copied().fold(0.0, f64::max),
                fds.iter().min().unwrap_or(&0),
                fds.iter().max().unwrap_or(&0)
            )?;
        }
        let o = self.overcommit;
        if o.times > 0 {
            writeln!(f, "  OVERCOMMIT   a node held up to {} GPUs beyond its own, {} times", o.most, o.times)?;
        }
        if self.devices_allocated_twice > 0 {
            writeln!(f, "  DOUBLE       {} DRA devices in two claims at once", self.devices_allocated_twice)?;
        }
        if self.deletions_finished > 0 {
            writeln!(f, "  deletions    {} finished in the kubelet's place", self.deletions_finished)?;
        }
        if self.refilled > 0 {
            writeln!(f, "  refilled     {} preempted fillers replaced", self.refilled)?;
        }
        let h = self.history;
        writeln!(f, "  history      {} pods bound in all, {:.1} GPU-hours held", h.bound, h.gpu_seconds / 3600.0)?;
        Ok(())
    }
}
