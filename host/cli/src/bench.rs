//! `wasmsched bench`: scheduling throughput on kube-scheduler's scheduler_perf shape (5,000 nodes,
//! 1,000 existing pods, 10,000 pods to schedule), with the policy set native and as Wasm, and with
//! events off and on, all in one run so that the ratios compare like with like.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use wasmsched_api::{GPU_MILLI, GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_core::{GroupSpec, NodeTable, PolicySet, bind, feasible_nodes_to_find, place_group, place_sampled};
use wasmsched_events::EventSink;
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::Rng;

use crate::events_cmd;
use crate::policy::policy_set;
use wasmsched_events::decisions;

/// Arguments of `bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Pods bound before the measurement.
    #[arg(long, default_value_t = 1000)]
    existing: usize,
    /// Pods to schedule (measured).
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Score policy (with resource-fit as the filter).
    #[arg(long, default_value = "least-allocated")]
    score: String,
    /// Percentage of nodes to score (kube-scheduler's percentageOfNodesToScore); default adaptive.
    #[arg(long)]
    percentage: Option<u32>,
    /// Runs of each configuration, alternating; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Seed of the cluster and the pods.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Gangs in the all-or-nothing scenario (0 skips it).
    #[arg(long, default_value_t = 20)]
    gangs: usize,
    /// Members per gang (each asks for 2 whole GPUs; min-member = all of them).
    #[arg(long, default_value_t = 500)]
    gang_size: usize,
    /// Queues in the queue-churn scenario (whole cycle: fair share, reclaim, preemption); 0 skips it.
    #[arg(long, default_value_t = 1000)]
    queues: usize,
    /// Give the churn's leaf queues borrowing limits (32 GPUs) and the guaranteed ones lending
    /// limits (half their guarantee).
    #[arg(long)]
    queue_limits: bool,
    /// Split the churn's nodes into this many resource flavors, with per-flavor guarantees and
    /// borrowing limits (0: no flavors).
    #[arg(long, default_value_t = 0)]
    queue_flavors: usize,
    /// Nodes (8 GPUs each) in the queue-churn scenario.
    #[arg(long, default_value_t = 500)]
    queue_nodes: usize,
    /// Rounds (cycles, one virtual second apart) of the queue-churn scenario.
    #[arg(long, default_value_t = 100)]
    queue_rounds: usize,
    /// Also measure DRA allocation: the same nodes publishing 8 GPUs each as ResourceSlice devices
    /// and the pods asking through claims (a CEL selector each, a quarter with a matchAttribute
    /// constraint), next to the device-plugin path on the same pods (`bench_dra`).
    #[arg(long)]
    dra: bool,
    /// Also measure a cluster of two accelerator vendors: every other 8-GPU node AMD's, every
    /// third whole-GPU pod asking for AMD GPUs, next to the same run with NVIDIA alone
    /// (`bench_vendors`).
    #[arg(long)]
    vendors: bool,
    /// Only the native policy set.
    #[arg(long)]
    native_only: bool,
    /// Also run every policy set with filter verdicts not reused (`placement::verdict_cache` in the core),
    /// to measure what reuse saves in the same run.
    #[arg(long)]
    compare_verdict_reuse: bool,
    /// Also run the Wasm policy set on a runtime without wall-clock deadlines (no epoch checks in
    /// the guest code), to measure what deadline enforcement costs in the same run. A measurement
    /// only: without deadlines nothing stops a plugin that loops.
    #[arg(long)]
    compare_deadlines: bool,
    /// Also run the Wasm policy set on a runtime that ignores the plugins' `placement` export
    /// (usage changes in calls of their own, every task in full: how components without it are
    /// called), to measure what it saves in the same run.
    #[arg(long)]
    compare_placement: bool,
    /// Draw the pods from this many distinct pod specs (like the replicas of a few Deployments;
    /// scheduler_perf's basic case is 1) instead of a fresh random spec per pod.
    #[arg(long)]
    pod_shapes: Option<usize>,
    /// Also measure what a live dashboard with this many open pages costs the scheduling thread
    /// (each runtime, with and without, alternating; 0 skips it).
    #[arg(long, default_value_t = 0)]
    dashboard_clients: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// No progress bar (there is none anyway when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Also run with events published here (`--events FILE` or `--nats URL`), to measure their cost.
    #[command(flatten)]
    sink: events_cmd::Sink,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Measured {
    runtime: &'static str,
    events: bool,
    pub(crate) pods_per_second: f64,
    p50_us: f64,
    p99_us: f64,
    pub(crate) placed: usize,
    unschedulable: usize,
    /// Share of the run spent building and emitting events on the scheduling thread (%), from
    /// timing one publishing decision in [`EMIT_SAMPLE`].
    events_share_percent: f64,
    /// Share of filter verdicts answered from earlier, equal tasks on unchanged nodes (%).
    verdicts_reused_percent: f64,
    /// Bringing the plugins' node mirrors to the run's copy of the cluster, before the clock
    /// starts ([`sync_mirrors`]); 0 for native plugins, which read the table itself.
    mirror_sync_ms: f64,
}

/// The gang scenario: every gang placed all-or-nothing, one after the other.
#[derive(Clone, Debug, Serialize)]
struct GangRun {
    runtime: &'static str,
    gangs: usize,
    gang_size: usize,
    placed_gangs: usize,
    total_seconds: f64,
    slowest_gang_ms: f64,
}

#[derive(Serialize)]
struct Report {
    nodes: usize,
    existing: usize,
    pods: usize,
    nodes_to_find: usize,
    policies: String,
    repeat: usize,
    events_destination: Option<String>,
    /// Median run of each configuration.
    runs: Vec<Measured>,
    /// Wasm pods/s over native pods/s, events off.
    wasm_over_native: Option<f64>,
    /// The same with the Wasm set on a runtime without deadlines (`--compare-deadlines`).
    #[serde(skip_serializing_if = "Option::is_none")]
    unbounded_over_native: Option<f64>,
    /// The same with the Wasm set called without `placement` (`--compare-placement`).
    #[serde(skip_serializing_if = "Option::is_none")]
    plain_calls_over_native: Option<f64>,
    /// Per runtime: the median over repetitions of pods/s with events over pods/s without, each
    /// pair run back to back.
    events_on_over_off: Vec<(&'static str, f64)>,
    /// Per runtime: events on vs off measured within runs (the number the < 2 % target is judged
    /// by; whole runs are too noisy on a small VM).
    events_interleaved: Vec<Interleaved>,
    /// The gang scenario per runtime (median total time over repetitions).
    gangs: Vec<GangRun>,
    /// The queue-churn scenario per runtime (one run each).
    queue_churn: Vec<crate::bench_queues::QueueRun>,
    /// DRA next to the device-plugin path per runtime (`--dra`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    dra: Vec<crate::bench_dra::DraRun>,
    vendors: Vec<crate::bench_vendors::VendorRun>,
    /// A live dashboard's cost per runtime (`--dashboard-clients`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    dashboard: Vec<crate::bench_dashboard::DashboardCost>,
}

fn gang_member(gang: usize, i: usize) -> Task {
    Task {
        id: format!("gang-{gang}-{i}"),
        namespace: "training".into(),
        queue: "default".into(),
        group: Some(format!("gang-{gang}")),
        request: Resources { cpu_milli: 8000, memory_bytes: 64 << 30, ..Default::default() },
        gpu: GpuRequest { count: 2, milli_per_gpu: GPU_MILLI, ..Default::default() },
        ..Default::default()
    }
}

/// Send every node of `table` to the Wasm plugins' mirrors, before a run's clock starts. Each run
/// schedules on a fresh copy of the base cluster, a table with an id of its own, so the first
/// call of every plugin would otherwise resend all nodes inside the measurement — 5,000 nodes,
/// tens of milliseconds per plugin, a cost a long-running scheduler pays once at start (its table
/// is never replaced; a new policy version is caught up off the loop), not per decision.
fn sync_mirrors(set: &PolicySet, table: &NodeTable) -> Duration {
    let t = Instant::now();
    set.catch_up(table, usize::MAX);
    t.elapsed()
}

/// Place `gangs` gangs of `size` members all-or-nothing with sampling, on a copy of `base`.
fn run_gangs(
    set: &PolicySet,
    base: &NodeTable,
    gangs: usize,
    size: usize,
    find: usize,
    runtime: &'static str,
) -> GangRun {
    // Every run starts without reusable verdicts, as a fresh scheduler would.
    let set = &set.with_fresh_verdicts();
    let mut table = base.clone();
    let members: Vec<Vec<Task>> = (0..gangs).map(|g| (0..size).map(|i| gang_member(g, i)).collect()).collect();
    let (mut placed, mut slowest) = (0, Duration::ZERO);
    sync_mirrors(set, &table);
    let t = Instant::now();
    for (g, m) in members.iter().enumerate() {
        let name = format!("gang-{g}");
        let spec = GroupSpec {
            name: &name,
            members: m,
            min_member: size,
            topology: None,
            nodes_to_find: Some(find),
            within: None,
            adjust: None,
        };
        let t0 = Instant::now();
        if place_group(set, &mut table, &spec, 0).is_ok() {
            placed += 1;
        }
        slowest = slowest.max(t0.elapsed());
    }
    GangRun {
        runtime,
        gangs,
        gang_size: size,
        placed_gangs: placed,
        total_seconds: t.elapsed().as_secs_f64(),
        slowest_gang_ms: slowest.as_secs_f64() * 1e3,
    }
}

/// `n` free 80 GB GPUs of `model`, four per NUMA node.
pub(crate) fn gpu_devices(model: &str, n: u32) -> Vec<GpuDevice> {
    (0..n)
        .map(|index| GpuDevice {
            index,
            model: model.into(),
            memory_bytes: 80 << 30,
            free_milli: GPU_MILLI,
            free_memory_bytes: 80 << 30,
            numa_node: Some(index / 4),
            ..Default::default()
        })
        .collect()
}

/// A GPU cluster like the ones scheduler_perf models: identical-ish nodes, two GPU generations.
fn cluster(n: usize, rng: &mut Rng) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        let (model, gpus) = if i % 4 == 0 { ("V100M32", 4) } else { ("A100-SXM4-80GB", 8) };
        t.upsert(Node {
            name: format!("node-{i:05}"),
            labels: vec![("gpu-model".into(), model.into()), ("zone".into(), format!("zone-{}", rng.below(3)))],
            allocatable: Resources {
                cpu_milli: 128_000,
                memory_bytes: 1 << 40,
                gpu_milli: u64::from(gpus * GPU_MILLI),
                extended: Default::default(),
            },
            gpus: gpu_devices(model, gpus).into(),
            ..Default::default()
        });
    }
    t
}

/// A pod mix: CPU-only, GPU shares, and 1–8 whole GPUs.
fn pod(rng: &mut Rng, i: usize) -> Task {
    let gpu = match rng.below(10) {
        0..=2 => GpuRequest::default(),
        3..=5 => GpuRequest { count: 1, milli_per_gpu: *rng.pick(&[250u32, 500]), ..Default::default() },
        _ => GpuRequest { count: *rng.pick(&[1u32, 1, 2, 4, 8]), milli_per_gpu: GPU_MILLI, ..Default::default() },
    };
    Task { gpu, ..cpu_memory_pod(rng, i) }
}

/// Pod `i` of the mix without GPUs: its team's namespace, a CPU and memory request drawn from `rng`.
pub(crate) fn cpu_memory_pod(rng: &mut Rng, i: usize) -> Task {
    Task {
        id: format!("pod-{i}"),
        namespace: format!("team-{}", i % 8),
        queue: "default".into(),
        request: Resources {
            cpu_milli: *rng.pick(&[1000u64, 4000, 8000]),
            memory_bytes: *rng.pick(&[4u64 << 30, 16 << 30, 64 << 30]),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[derive(Clone)]
pub(crate) struct Scenario {
    pub(crate) base: NodeTable,
    pub(crate) pods: Vec<Task>,
    pub(crate) find: usize,
}

/// Which pods of a run publish their decision.
#[derive(Clone, Copy)]
pub(crate) enum Publish {
    Never,
    Always,
    /// Alternate blocks of this many pods, starting with publishing when `first_on`.
    Blocks {
        pods: usize,
        first_on: bool,
    },
}

impl Publish {
    fn for_pod(self, i: usize) -> bool {
        match self {
            Publish::Never => false,
            Publish::Always => true,
            Publish::Blocks { pods, first_on } => (i / pods.max(1)).is_multiple_of(2) == first_on,
        }
    }
}

/// Time spent deciding (and publishing) the pods that published and those that did not.
#[derive(Clone, Copy, Default)]
pub(crate) struct SplitTime {
    on_pods: usize,
    on_seconds: f64,
    off_pods: usize,
    off_seconds: f64,
}

impl SplitTime {
    fn add(&mut self, other: SplitTime) {
        self.on_pods += other.on_pods;
        self.on_seconds += other.on_seconds;
        self.off_pods += other.off_pods;
        self.off_seconds += other.off_seconds;
    }

    /// Pods/s while publishing over pods/s while not.
    fn on_over_off(&self) -> f64 {
        let rate = |pods: usize, secs: f64| pods as f64 / secs.max(1e-9);
        rate(self.on_pods, self.on_seconds) / rate(self.off_pods, self.off_seconds)
    }
}

/// Events on vs off measured by interleaving: every run alternates blocks of pods with and without
/// publishing, and successive runs swap which blocks publish, so each pod is timed both ways and a
/// slow phase of a noisy machine falls on both modes alike (whole runs swing by ±15 % on this VM,
/// more than the 2 % being measured). The drainer's work for a block may spill into the next one,
/// whichever its mode; blocks are long against its 2 ms linger so that this spill is small.
#[derive(Clone, Debug, Serialize)]
struct Interleaved {
    runtime: &'static str,
    block_pods: usize,
    runs: usize,
    /// Over all runs: pods/s while publishing over pods/s while not.
    on_over_off: f64,
    /// The same over each pair of runs with swapped blocks (every pod timed once each way).
    pair_min: f64,
    pair_max: f64,
}

/// `in emit` is timed on one publishing decision in this many.
const EMIT_SAMPLE: usize = 16;

/// Pods per block of the interleaved events measurement (~25 ms native, ~100 ms Wasm), at most.
const INTERLEAVE_BLOCK: usize = 500;

/// Schedule every pod once, serially, on a copy of the base cluster.
pub(crate) fn run_once(set: &PolicySet, s: &Scenario, sink: Option<&EventSink>, runtime: &'static str) -> Measured {
    let publish = if sink.is_some() { Publish::Always } else { Publish::Never };
    run_with(set, s, sink, publish, runtime, &mut |_, _, _| {}).0
}

/// What a run shows to an observer after each pod: the table, the pod, whether it was bound.
pub(crate) type Tap<'a> = dyn FnMut(&NodeTable, &Task, bool) + 'a;

/// Schedule every pod once, publishing the decisions `publish` picks to `sink`; also the time
/// split between the pods that published and those that did not.
pub(crate) fn run_with(
    set: &PolicySet,
    s: &Scenario,
    sink: Option<&EventSink>,
    publish: Publish,
    runtime: &'static str,
    tap: &mut Tap<'_>,
) -> (Measured, SplitTime) {
    // Every run starts without reusable verdicts (the table is a copy of the same base, so an
    // earlier run's verdicts would otherwise apply).
    let set = &set.with_fresh_verdicts();
    let mut table = s.base.clone();
    let total = table.len();
    let policy = wasmsched_events::schema::PolicySetRef { name: "bench".into(), version: 1 };
    let mut latencies = Vec::with_capacity(s.pods.len());
    let (mut placed, mut unschedulable, mut start) = (0, 0, 0);
    let (mut in_events, mut published) = (Duration::ZERO, 0usize);
    let mut split = SplitTime::default();
    let mirror_sync = sync_mirrors(set, &table);
    let t = Instant::now();
    for (i, task) in s.pods.iter().enumerate() {
        // A sink only a dashboard reads takes what its page can show (`wanted`), as the scheduler's does.
        let sink = sink.filter(|s| publish.for_pod(i) && s.wanted());
        let t0 = Instant::now();
        let sampled = place_sampled(set, &table, task, 0, start, s.find);
        start = (start + sampled.examined) % total.max(1);
        let bound = match &sampled.result {
            Ok(p) => matches!(table.update_usage(p.node, |n| bind(n, task, &p.devices)), Some(Ok(()))),
            Err(_) => false,
        };
        if bound {
            placed += 1
        } else {
            unschedulable += 1
        }
        tap(&table, task, bound);
        // A placement whose bind failed (never expected: devices are validated) publishes nothing.
        let outcome = match &sampled.result {
            Ok(p) if bound => table.get(p.node).map(|n| Ok((p, n))),
            Ok(_) => None,
            Err(u) => Some(Err(&u.diagnosis)),
        };
        if let (Some(_), Some(outcome)) = (sink, outcome) {
            let decision =
                decisions::Decision { task, outcome, evaluated: sampled.examined, attempt: 1, submitted: None };
            // Timed on one publishing decision in EMIT_SAMPLE only, and scaled up: two clock reads
            // per event would themselves add ~0.3 % to the "on" side of a 15 µs decision.
            if published % EMIT_SAMPLE == 0 {
                let e0 = Instant::now();
                decisions::publish(sink, None, decision, &policy);
                in_events += e0.elapsed() * EMIT_SAMPLE as u32;
            } else {
                decisions::publish(sink, None, decision, &policy);
            }
            published += 1;
        }
        let took = t0.elapsed();
        if sink.is_some() {
            split.on_pods += 1;
            split.on_seconds += took.as_secs_f64();
        } else {
            split.off_pods += 1;
            split.off_seconds += took.as_secs_f64();
        }
        latencies.push(took);
    }
    let seconds = t.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)));
    let us = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e6);
    let measured = Measured {
        runtime,
        events: sink.is_some(),
        pods_per_second: s.pods.len() as f64 / seconds.max(1e-9),
        p50_us: us(pct(0.50)),
        p99_us: us(pct(0.99)),
        placed,
        unschedulable,
        events_share_percent: 100.0 * in_events.as_secs_f64() / seconds.max(1e-9),
        verdicts_reused_percent: {
            let (reused, asked) = set.verdict_counts();
            100.0 * reused as f64 / (reused + asked).max(1) as f64
        },
        mirror_sync_ms: mirror_sync.as_secs_f64() * 1e3,
    };
    (measured, split)
}

/// The interleaved events measurement of one runtime: `runs` rounded up to whole pairs.
fn interleaved(set: &PolicySet, s: &Scenario, sink: &EventSink, runs: usize, runtime: &'static str) -> Interleaved {
    let pairs = runs.div_ceil(2);
    // At least four blocks per run, so that small runs interleave too.
    let block = INTERLEAVE_BLOCK.min(s.pods.len().div_ceil(4)).max(1);
    let mut total = SplitTime::default();
    let mut per_pair = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        let mut pair = SplitTime::default();
        for first_on in [true, false] {
            let publish = Publish::Blocks { pods: block, first_on };
            pair.add(run_with(set, s, Some(sink), publish, runtime, &mut |_, _, _| {}).1);
            // Let the drainer catch up so that it does not run into the next run.
            sink.flush(Duration::from_secs(120));
        }
        per_pair.push(pair.on_over_off());
        total.add(pair);
    }
    Interleaved {
        runtime,
        block_pods: block,
        runs: 2 * pairs,
        on_over_off: total.on_over_off(),
        pair_min: per_pair.iter().copied().fold(f64::INFINITY, f64::min),
        pair_max: per_pair.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.pods_per_second.total_cmp(&b.pods_per_second));
    runs[runs.len() / 2].clone()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.nodes > 0 && args.pods > 0 && args.repeat > 0,
        "--nodes, --pods and --repeat must be positive"
    );
    let natives = policy_set(None, &args.score, args.seed, &[])?;
    let scenario = scenario(&args, &natives);
    let find = scenario.find;
    let sets = Sets::load(&args, natives)?;
    let sink = args.sink.open("bench")?;
    let destination = args
        .sink
        .nats
        .nats
        .clone()
        .map(|u| format!("nats {u}"))
        .or_else(|| args.sink.events.as_ref().map(|p| format!("jsonl {}", p.display())));
    let runtimes = sets.measured(args.compare_verdict_reuse);
    // Warm-up (instances, caches).
    let warm =
        Scenario { base: scenario.base.clone(), pods: scenario.pods[..scenario.pods.len().min(500)].to_vec(), find };
    for (name, set) in &runtimes {
        run_once(set, &warm, None, name);
    }
    // Progress between measurements (never inside one): the runs, then the interleaved event
    // runs, the gang runs and the queue churns.
    let with_events = usize::from(sink.is_some());
    let with_wasm = usize::from(sets.runtime.is_some());
    let churn_sets = if args.queues == 0 { 0 } else { (1 + with_wasm) * (1 + usize::from(args.compare_verdict_reuse)) };
    let progress = crate::progress::Progress::new(
        (runtimes.len() * args.repeat * (1 + with_events)
            + runtimes.len() * with_events
            + runtimes.len() * args.repeat * usize::from(args.gangs > 0 && args.gang_size > 0)
            + churn_sets
            + if args.dashboard_clients > 0 { runtimes.len() } else { 0 }
            + if args.dra { 1 + with_wasm } else { 0 }
            + if args.vendors { 1 + with_wasm } else { 0 }) as u64,
        "measurements",
        args.quiet,
    );
    let (samples, pair_ratios) = measure_runs(&runtimes, &scenario, sink.as_ref(), args.repeat, &progress);
    let events_interleaved: Vec<Interleaved> = match sink.as_ref() {
        Some(sink) => runtimes
            .iter()
            .map(|(name, set)| {
                let i = interleaved(set, &scenario, sink, args.repeat, name);
                progress.step();
                i
            })
            .collect(),
        None => Vec::new(),
    };
    let stats = events_cmd::finish(sink, args.sink.grace());
    let mut dashboard = Vec::new();
    if args.dashboard_clients > 0 {
        for (name, set) in &runtimes {
            dashboard.push(crate::bench_dashboard::measure(set, &scenario, name, args.repeat, args.dashboard_clients)?);
            progress.step();
        }
    }
    let mut gangs = Vec::new();
    if args.gangs > 0 && args.gang_size > 0 {
        for (name, set) in &runtimes {
            let mut of: Vec<GangRun> = (0..args.repeat)
                .map(|_| {
                    let g = run_gangs(set, &scenario.base, args.gangs, args.gang_size, find, name);
                    progress.step();
                    g
                })
                .collect();
            of.sort_by(|a, b| a.total_seconds.total_cmp(&b.total_seconds));
            gangs.push(of[of.len() / 2].clone());
        }
    }
    let queue_churn = if args.queues > 0 { queue_churn(&args, sets.runtime.as_ref(), &progress)? } else { Vec::new() };
    let mut dra = Vec::new();
    if args.dra {
        let setup = crate::bench_dra::Setup::new(args.nodes, args.pods, find, args.seed);
        for (name, set) in sets.native_and_wasm() {
            dra.push(setup.measure(set, name, args.repeat));
            progress.step();
        }
    }
    let mut vendors = Vec::new();
    if args.vendors {
        let two = crate::bench_vendors::mixed(&scenario);
        for (name, set) in sets.native_and_wasm() {
            vendors.push(crate::bench_vendors::measure(set, name, &scenario, &two, args.repeat));
            progress.step();
        }
    }
    drop(progress);
    let runs = medians(&runtimes, &samples);
    let get = |rt: &str| runs.iter().find(|m| m.runtime == rt && !m.events).map(|m| m.pods_per_second);
    let wasm_over_native = get("wasm").zip(get("native")).map(|(w, n)| w / n);
    let unbounded_over_native = get("wasm, no deadlines").zip(get("native")).map(|(w, n)| w / n);
    let plain_calls_over_native = get("wasm, plain calls").zip(get("native")).map(|(w, n)| w / n);
    let events_on_over_off = runtimes
        .iter()
        .zip(pair_ratios)
        .filter(|(_, r)| !r.is_empty())
        .map(|((name, _), mut r)| {
            r.sort_by(f64::total_cmp);
            (*name, r[r.len() / 2])
        })
        .collect();
    let report = Report {
        nodes: args.nodes,
        existing: args.existing,
        pods: args.pods,
        nodes_to_find: find,
        policies: format!("resource-fit + {}", args.score),
        repeat: args.repeat,
        events_destination: destination,
        runs,
        wasm_over_native,
        unbounded_over_native,
        plain_calls_over_native,
        events_on_over_off,
        events_interleaved,
        gangs,
        queue_churn,
        dra,
        vendors,
        dashboard,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, stats.as_ref());
    }
    events_cmd::delivered(stats.as_ref())
}

/// The cluster of `args.nodes` nodes with `args.existing` pods bound by `natives` before anything
/// is measured, and the pods to schedule (of `args.pod_shapes` shapes, or each its own).
fn scenario(args: &Args, natives: &PolicySet) -> Scenario {
    let mut rng = Rng::new(args.seed);
    let mut base = cluster(args.nodes, &mut rng);
    let find = feasible_nodes_to_find(args.nodes, args.percentage);
    let mut start = 0;
    for i in 0..args.existing {
        let task = pod(&mut rng, i);
        let s = place_sampled(natives, &base, &task, 0, start, find);
        start = (start + s.examined) % args.nodes;
        if let Ok(p) = s.result {
            base.update_usage(p.node, |n| bind(n, &task, &p.devices));
        }
    }
    let pods: Vec<Task> = match args.pod_shapes {
        Some(k) => {
            let specs: Vec<Task> = (0..k.max(1)).map(|i| pod(&mut rng, args.existing + i)).collect();
            (0..args.pods)
                .map(|i| Task { id: format!("pod-{}", args.existing + i), ..specs[i % specs.len()].clone() })
                .collect()
        }
        None => (0..args.pods).map(|i| pod(&mut rng, args.existing + i)).collect(),
    };
    Scenario { base, pods, find }
}

/// The policy sets compared: native, and on Wasm runtimes as asked (with deadlines, without,
/// without placement calls). Each runtime is kept with the set that runs on it.
struct Sets {
    natives: PolicySet,
    runtime: Option<Arc<Runtime>>,
    wasm: Option<PolicySet>,
    unbounded: Option<PolicySet>,
    plain: Option<PolicySet>,
    /// The other runtimes, alive as long as their sets run (their epoch tickers with them).
    _others: Vec<Arc<Runtime>>,
}

impl Sets {
    fn load(args: &Args, natives: PolicySet) -> anyhow::Result<Sets> {
        let on = |config: RuntimeConfig, what: &str| -> anyhow::Result<(Arc<Runtime>, PolicySet)> {
            let rt = Arc::new(Runtime::new(config).with_context(|| format!("starting the Wasm runtime{what}"))?);
            let set = policy_set(Some(&rt), &args.score, args.seed, &[])?;
            Ok((rt, set))
        };
        let config = crate::policy::runtime_config;
        let wasm = (!args.native_only).then(|| on(config(), "")).transpose()?;
        let unbounded = (!args.native_only && args.compare_deadlines)
            .then(|| on(RuntimeConfig { deadlines: false, ..config() }, " without deadlines"))
            .transpose()?;
        let plain = (!args.native_only && args.compare_placement)
            .then(|| on(RuntimeConfig { placement_calls: false, ..config() }, " without placement calls"))
            .transpose()?;
        let (runtime, wasm) = wasm.unzip();
        let (unbounded_runtime, unbounded) = unbounded.unzip();
        let (plain_runtime, plain) = plain.unzip();
        let _others = unbounded_runtime.into_iter().chain(plain_runtime).collect();
        Ok(Sets { natives, runtime, wasm, unbounded, plain, _others })
    }

    /// The configurations the main runs measure, by name.
    fn measured(&self, verdict_reuse: bool) -> Vec<(&'static str, PolicySet)> {
        let mut runtimes: Vec<(&'static str, PolicySet)> = vec![("native", self.natives.clone())];
        if let Some(w) = &self.wasm {
            runtimes.push(("wasm", w.clone()));
        }
        if let Some(u) = &self.unbounded {
            runtimes.push(("wasm, no deadlines", u.clone()));
        }
        if let Some(p) = &self.plain {
            runtimes.push(("wasm, plain calls", p.clone()));
        }
        if verdict_reuse {
            runtimes.push(("native, no verdict reuse", self.natives.without_verdict_reuse()));
            if let Some(w) = &self.wasm {
                runtimes.push(("wasm, no verdict reuse", w.without_verdict_reuse()));
            }
        }
        runtimes
    }

    fn native_and_wasm(&self) -> impl Iterator<Item = (&'static str, &PolicySet)> {
        std::iter::once(("native", &self.natives)).chain(self.wasm.as_ref().map(|w| ("wasm", w)))
    }
}

/// Each repetition runs every configuration with events off and on back to back, alternating
/// which goes first, so drift on a noisy machine hits both alike; the ratio is taken per pair.
/// Every run, and per configuration the on/off ratio of each pair.
fn measure_runs(
    runtimes: &[(&'static str, PolicySet)],
    scenario: &Scenario,
    sink: Option<&EventSink>,
    repeat: usize,
    progress: &crate::progress::Progress,
) -> (Vec<Measured>, Vec<Vec<f64>>) {
    let mut samples: Vec<Measured> = Vec::new();
    let mut pair_ratios: Vec<Vec<f64>> = vec![Vec::new(); runtimes.len()];
    for r in 0..repeat {
        for (i, (name, set)) in runtimes.iter().enumerate() {
            let off = |samples: &mut Vec<Measured>| {
                let m = run_once(set, scenario, None, name);
                samples.push(m.clone());
                progress.step();
                m
            };
            let Some(sink) = sink else {
                off(&mut samples);
                continue;
            };
            let on = |samples: &mut Vec<Measured>| {
                let m = run_once(set, scenario, Some(sink), name);
                samples.push(m.clone());
                // Let the drainer catch up so that it does not run into the next measurement.
                sink.flush(Duration::from_secs(120));
                progress.step();
                m
            };
            let (a, b) = if r % 2 == 0 {
                let a = off(&mut samples);
                (a, on(&mut samples))
            } else {
                let b = on(&mut samples);
                (off(&mut samples), b)
            };
            pair_ratios[i].push(b.pods_per_second / a.pods_per_second);
        }
    }
    (samples, pair_ratios)
}

/// The queue-churn scenario on the full cycle's policies, native and Wasm (and without verdict
/// reuse when asked).
fn queue_churn(
    args: &Args,
    runtime: Option<&Arc<Runtime>>,
    progress: &crate::progress::Progress,
) -> anyhow::Result<Vec<crate::bench_queues::QueueRun>> {
    let natives = crate::policy::cycle_policy_set(None, "proportion")?;
    let wasm = runtime.map(|rt| crate::policy::cycle_policy_set(Some(rt), "proportion")).transpose()?;
    let mut sets = vec![("native", natives.clone())];
    if let Some(w) = &wasm {
        sets.push(("wasm", w.clone()));
    }
    if args.compare_verdict_reuse {
        sets.push(("native, no verdict reuse", natives.without_verdict_reuse()));
        if let Some(w) = &wasm {
            sets.push(("wasm, no verdict reuse", w.without_verdict_reuse()));
        }
    }
    let mut out = Vec::new();
    for (name, set) in &sets {
        let churn = crate::bench_queues::Churn {
            queues: args.queues,
            limits: args.queue_limits,
            flavors: args.queue_flavors,
            nodes: args.queue_nodes,
            rounds: args.queue_rounds,
            seed: args.seed,
        };
        out.push(crate::bench_queues::run(set, name, churn));
        progress.step();
    }
    Ok(out)
}

/// The median run of each configuration, events off then on.
fn medians(runtimes: &[(&'static str, PolicySet)], samples: &[Measured]) -> Vec<Measured> {
    let mut runs = Vec::new();
    for (name, _) in runtimes {
        for events in [false, true] {
            let of: Vec<Measured> =
                samples.iter().filter(|m| m.runtime == *name && m.events == events).cloned().collect();
            if !of.is_empty() {
                runs.push(median(of));
            }
        }
    }
    runs
}

/// The report as text.
fn print_report(report: &Report, stats: Option<&wasmsched_events::Stats>) {
    println!(
        "wasmsched bench: {} nodes, {} existing pods, {} pods to schedule; {}; {} nodes to find; median of {}",
        report.nodes, report.existing, report.pods, report.policies, report.nodes_to_find, report.repeat
    );
    println!(
        "  {:<26} events   pods/s    p50 µs   p99 µs   placed  unschedulable  in emit  verdicts reused  mirror sync (untimed)",
        "runtime"
    );
    for m in &report.runs {
        println!(
            "  {:<26} {:<6} {:>8.0} {:>9.1} {:>8.1} {:>8} {:>8}  {:>10}  {:>6.1} %  {:>14.1} ms",
            m.runtime,
            if m.events { "on" } else { "off" },
            m.pods_per_second,
            m.p50_us,
            m.p99_us,
            m.placed,
            m.unschedulable,
            if m.events { format!("{:.2} %", m.events_share_percent) } else { "-".into() },
            m.verdicts_reused_percent,
            m.mirror_sync_ms
        );
    }
    if let Some(r) = report.wasm_over_native {
        println!("Wasm / native throughput: {r:.3}");
    }
    if let Some(r) = report.unbounded_over_native {
        println!("Wasm without deadlines / native throughput: {r:.3} (what epoch checks cost: measurement only)");
    }
    if let Some(r) = report.plain_calls_over_native {
        println!("Wasm without placement calls / native throughput: {r:.3} (components without `placement`)");
    }
    for (rt, r) in &report.events_on_over_off {
        println!("{rt}: events on / off throughput, whole runs paired: {r:.3} ({:+.1} %)", (r - 1.0) * 100.0);
    }
    for i in &report.events_interleaved {
        println!(
            "{}: events on / off throughput, interleaved blocks of {} pods over {} runs: {:.3} ({:+.1} %; pairs of runs {:.3}–{:.3})",
            i.runtime,
            i.block_pods,
            i.runs,
            i.on_over_off,
            (i.on_over_off - 1.0) * 100.0,
            i.pair_min,
            i.pair_max
        );
    }
    for d in &report.dashboard {
        println!(
            "{}: with a live dashboard ({} open pages; {} views published, {} API answers) / without: {:.3} (pairs {:.3}–{:.3}); on the scheduling thread {:.2} % of the time",
            d.runtime, d.clients, d.views, d.answers, d.on_over_off, d.pair_min, d.pair_max, d.on_thread_percent
        );
    }
    for g in &report.gangs {
        println!(
            "{}: {} gangs × {} members all-or-nothing: {} placed in {:.3} s (slowest gang {:.1} ms)",
            g.runtime, g.gangs, g.gang_size, g.placed_gangs, g.total_seconds, g.slowest_gang_ms
        );
    }
    for q in &report.queue_churn {
        println!(
            "{}: {} queues{}{}, {} nodes, {} cycles under churn: {:.0} decisions/s (mean cycle {:.1} ms, slowest {:.1} ms); {} submitted, {} bound, {} evicted; share error mean {:.4}, worst {:.4}",
            q.runtime,
            q.queues,
            if q.limits { " with borrowing/lending limits" } else { "" },
            if q.flavors > 0 { format!(", {} flavors", q.flavors) } else { String::new() },
            q.nodes,
            q.rounds,
            q.decisions_per_second,
            q.mean_cycle_ms,
            q.max_cycle_ms,
            q.submitted,
            q.bound,
            q.evicted,
            q.share_error_mean,
            q.share_error_max
        );
    }
    for v in &report.vendors {
        println!(
            "{}: two vendors (every other 8-GPU node AMD, a third of the whole-GPU pods AMD's) {:.0} pods/s ({} placed, {} on another kind's devices); NVIDIA alone {:.0} pods/s ({} placed). Two vendors / NVIDIA alone {:.3} (median of the pairs)",
            v.runtime,
            v.mixed_pods_per_second,
            v.mixed_placed,
            v.wrong_kind,
            v.nvidia_pods_per_second,
            v.nvidia_placed,
            v.mixed_over_nvidia,
        );
    }
    for d in &report.dra {
        println!(
            "{}: DRA claims on {} nodes × 8 devices, {} pods: {:.0} pods/s ({} placed, {} placed again after a refused allocation, {} devices given twice; devices built in {:.0} ms before the clock); device plugin {:.0} pods/s ({} placed); the class's count alone {:.0} pods/s. DRA / device plugin {:.3}, DRA / count alone {:.3}",
            d.runtime,
            d.nodes,
            d.pods,
            d.dra_pods_per_second,
            d.dra_placed,
            d.dra_retries,
            d.devices_given_twice,
            d.inventory_ms,
            d.plugin_pods_per_second,
            d.plugin_placed,
            d.counted_pods_per_second,
            d.dra_over_plugin,
            d.dra_over_counted
        );
    }
    if let (Some(d), Some(s)) = (&report.events_destination, stats) {
        println!("events to {d}: {} emitted, {} delivered, {} dropped", s.emitted, s.delivered, s.dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::Publish;

    #[test]
    fn the_emit_share_is_measured_on_a_sample_and_only_when_publishing() {
        use wasmsched_events::{Origin, OutboxConfig};
        let mut rng = super::Rng::new(7);
        let base = super::cluster(200, &mut rng);
        let pods: Vec<_> = (0..200).map(|i| super::pod(&mut rng, i)).collect();
        let s = super::Scenario { base, pods, find: 100 };
        let set = crate::policy::policy_set(None, "least-allocated", 7, &[]).unwrap();
        let off = super::run_once(&set, &s, None, "native");
        assert_eq!(off.events_share_percent, 0.0);
        let path = std::env::temp_dir().join(format!("wasmsched-bench-emit-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let origin = Origin { source: "test".into(), id_prefix: "t".into() };
        let sink = wasmsched_events::EventSink::jsonl(&path, origin, OutboxConfig::default()).unwrap();
        let on = super::run_once(&set, &s, Some(&sink), "native");
        let stats = sink.close(std::time::Duration::from_secs(10));
        assert_eq!(stats.delivered as usize, on.placed + on.unschedulable, "every decision published once");
        assert!(on.events_share_percent > 0.0, "timed on a sample: {}", on.events_share_percent);
        assert_eq!((on.placed, on.unschedulable), (off.placed, off.unschedulable));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn interleaved_blocks_alternate_and_the_two_phases_publish_each_pod_once() {
        let on = |first_on: bool| -> Vec<bool> {
            (0..10).map(|i| Publish::Blocks { pods: 3, first_on }.for_pod(i)).collect()
        };
        let t = true;
        let f = false;
        assert_eq!(on(true), [t, t, t, f, f, f, t, t, t, f]);
        for (a, b) in on(true).into_iter().zip(on(false)) {
            assert_ne!(a, b, "every pod publishes in exactly one of the two phases");
        }
        assert!((0..10).all(|i| Publish::Always.for_pod(i) && !Publish::Never.for_pod(i)));
    }
}
