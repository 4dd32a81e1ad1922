//! `wasmsched replay`: time-driven replay of a scenario or an openb trace through the scheduling
//! core (arrivals, departures, queues with fair share, gangs, preemption), with queueing delay,
//! completion time, evictions, utilisation and fairness.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use wasmsched_api::Task;
use wasmsched_core::{CoreConfig, Decision, EvictReason, NodeTable, Placement};
use wasmsched_sim::timed::{self, Job, QueueStats, Scenario, flat_queues, queue_tree};

use crate::inputs;
use crate::policy::replay_policy_set;
use crate::replay_policies::{Initial, RejectedRollout, ReplayPolicies};
use wasmsched_events::decisions;

/// Arguments of `replay`.
#[derive(clap::Args)]
pub struct Args {
    /// A scenario (JSON or YAML: `nodes`, `queues`, `jobs`; see `docs/scenario.md`) instead of an
    /// openb trace.
    #[arg(long, conflicts_with_all = ["nodes", "pods"])]
    scenario: Option<PathBuf>,
    /// openb node list; default: the embedded one.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// openb pod list with creation/deletion times; default: the embedded default trace.
    #[arg(long)]
    pods: Option<PathBuf>,
    /// Divide openb arrival times by this factor (durations unchanged) to raise the load. At the
    /// recorded times (`--compress 1 --node-stride 1`) the cluster is never more than ~1 % allocated
    /// and nothing waits; the defaults make the queues contend.
    #[arg(long, default_value_t = 1e6, allow_negative_numbers = true)]
    compress: f64,
    /// Keep every N-th openb node (2 = half the cluster).
    #[arg(long, default_value_t = 2)]
    node_stride: usize,
    /// Score policy (see `simulate --help`).
    #[arg(long, default_value = "fgd")]
    policy: String,
    /// Seed of the `random` policy.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Fair-share policy between queues: proportion, drf or decayed-usage.
    #[arg(long, default_value = "proportion")]
    fair_share: String,
    /// Never evict running work (no preempt stage).
    #[arg(long)]
    no_preemption: bool,
    /// A run another queue reclaims must have run this long (s); 0 reclaims any run (as
    /// `wasmsched run --reclaim-min-runtime`). A scenario queue's `reclaim_min_runtime` overrides
    /// it for its runs.
    #[arg(long, value_name = "SECONDS", default_value_t = CoreConfig::default().reclaim_min_runtime_seconds)]
    reclaim_min_runtime: u64,
    /// A reclaim may throw away at most K times the GPU-time its queue has been short of its
    /// deserved share while it waited (as `wasmsched run --reclaim-within-deficit`;
    /// docs/scheduling.md). The flag alone is K = 1; 0: no such limit.
    #[arg(long, value_name = "K", num_args = 0..=1, default_value_t = 0, default_missing_value = "1")]
    reclaim_within_deficit: u32,
    /// A run that has gone on longer than this (s) is never reclaimed (as `wasmsched run
    /// --reclaim-max-runtime`; docs/scheduling.md). A scenario queue's `reclaim_max_runtime`
    /// overrides it; 0: no limit.
    #[arg(long, value_name = "SECONDS", default_value_t = CoreConfig::default().reclaim_max_runtime_seconds)]
    reclaim_max_runtime: u64,
    /// How long a gang may wait unplaced before it times out (s); a job's own `timeout` wins.
    #[arg(long, value_name = "SECONDS", default_value_t = CoreConfig::default().gang_timeout_seconds)]
    gang_timeout: u64,
    /// A gang that times out leaves the replay. By default it is submitted again, as on
    /// Kubernetes (its pods stay, and so does the demand): dropping the big jobs of a real trace
    /// makes every delay look better than it was.
    #[arg(long)]
    drop_timed_out_gangs: bool,
    /// Ignore the jobs' `topology` requests: every gang goes wherever its members fit, as a
    /// topology-blind scheduler places it — the baseline for what keeping gangs inside one
    /// NVLink domain or rack is worth.
    #[arg(long)]
    topology_blind: bool,
    /// A gang that only prefers a level waits up to this long (s) for one domain of it before it
    /// falls back; for the jobs whose `topology` sets no `wait_seconds` of its own (0: at once).
    #[arg(long, value_name = "SECONDS", conflicts_with = "topology_blind")]
    topology_wait: Option<u64>,
    /// Replay with a policy set of your own instead of `--policy`/`--fair-share`: a directory with
    /// `policy.yaml` (the hot-reload format, `docs/hot-reload.md`) or the file. It passes the gates
    /// of a hot reload first (digests, compilation, contract, a smoke test on this cluster).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["policy", "fair_share", "no_preemption", "native", "seed"])]
    policy_set: Option<PathBuf>,
    /// `SECONDS=PATH`: from virtual second SECONDS on, schedule with the policy set at PATH — a
    /// rollout in the middle of the replay (repeatable). Each passes the same gates; one that fails
    /// is reported and never goes live. Parked work is retried under the new set.
    #[arg(long = "rollout", value_name = "SECONDS=PATH", conflicts_with = "native")]
    rollouts: Vec<crate::replay_policies::Rollout>,
    /// Run the policies natively instead of as Wasm components.
    #[arg(long)]
    native: bool,
    /// Replay twice on the same input — with the set above, then with this one (a policy set
    /// directory or file, or a built-in score policy's name) — and report side by side:
    /// placements that differ, work one places and the other not (with the reasons), queueing
    /// delay, allocation, fragmentation, fairness, evictions and GPU-hours lost. The two replays
    /// run at once; with `--serve`, the dashboard's Compare tab shows them side by side.
    #[arg(long, value_name = "PATH|POLICY", conflicts_with_all = ["rollouts", "out", "speed"])]
    compare: Option<String>,
    /// Write `jobs.csv`, `utilisation.csv`, `utilisation.svg` and `queue_delay.svg` (per-queue
    /// CDF of queueing delay) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long)]
    json: bool,
    /// Serve the dashboard here while the replay runs, and after it until Ctrl-C (e.g.
    /// `127.0.0.1:8080`; loopback unless you mean it): the cluster, the queues and their fair
    /// shares, what waits and why, the live policy set and each rollout, the decisions as they
    /// happen.
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
    /// With `--serve`: virtual seconds played per second, so a person can watch; 0 replays as
    /// fast as it can. Default: the trace's span (last arrival plus its run) in about two
    /// minutes, and never faster than a minute per second (a scenario of an hour: 60; the openb
    /// trace's 145 days: ~100,000).
    #[arg(long, requires = "serve")]
    speed: Option<f64>,
    /// No progress bar (there is none anyway when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Skip malformed jobs of a scenario (or malformed rows of an openb pod list) instead of
    /// stopping; each is reported (`skipped` in JSON).
    #[arg(long)]
    lenient: bool,
    /// Publish every placement attempt, stamped with virtual time (seconds since the start of the
    /// replay, written as an instant after the Unix epoch).
    #[command(flatten)]
    sink: crate::events_cmd::Sink,
}

#[derive(Serialize)]
struct Report<'a> {
    jobs: usize,
    /// With `--lenient`: what was left out, and why.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    skipped: &'a [String],
    /// The name of the set the replay starts with (a built-in score policy, or the policy set's).
    policy: &'a str,
    runtime: &'static str,
    replay_seconds: f64,
    horizon_seconds: u64,
    /// The set live at the start: its fair-share plugin and whether it preempts.
    fair_share: String,
    preemption: bool,
    /// Each set that ran, from when, and how many decisions it made.
    policy_versions: Vec<VersionReport>,
    /// Rollouts that failed a gate and never went live.
    #[serde(skip_serializing_if = "<[RejectedRollout]>::is_empty")]
    rejected_rollouts: &'a [RejectedRollout],
    placement_attempts: usize,
    /// Pods evicted (each member of a gang counts).
    evictions: usize,
    /// Jobs' runs stopped by evictions (a gang is one): what the queues' `evictions` add up to.
    job_evictions: u32,
    /// Gang timeouts (a gang submitted again may time out again; `--drop-timed-out-gangs`: given
    /// up).
    gangs_timed_out: usize,
    plugin_faults: usize,
    /// Time-weighted over the whole run (first to last event).
    utilisation_mean_percent: f64,
    /// Time-weighted from the first arrival to the last: what the cluster did while work came in.
    utilisation_mean_while_arriving_percent: f64,
    /// Time-weighted over the instants when some job had arrived and not started: how much of the
    /// cluster was allocated while work waited for it. `null` when no job ever waited.
    utilisation_mean_while_waiting_percent: Option<f64>,
    utilisation_peak_percent: f64,
    /// Jain's index over the queues' service ratios at the end (1 whenever everything finished).
    jain_fairness: f64,
    /// Jain's index over the backlogged queues' allocated / deserved share, time-weighted over the
    /// instants two or more queues had work waiting: fairness while it mattered.
    jain_fairness_while_backlogged: Option<f64>,
    queues: &'a std::collections::BTreeMap<String, QueueStats>,
    /// What each queue's runs held, by the simulator's own count (runs going on counted up to the
    /// horizon): what `wasmsched usage --by queue` finds again from the events.
    usage: &'a std::collections::BTreeMap<String, timed::QueueUsage>,
    waiting_at_end_by_reason: &'a std::collections::BTreeMap<String, usize>,
    /// Multi-GPU placements on nodes of known topology (scenarios with `topology` files).
    #[serde(skip_serializing_if = "Option::is_none")]
    topology: Option<TopologyStats>,
    /// How gangs and small jobs used the domains of the scenario's `fabric`.
    #[serde(skip_serializing_if = "Option::is_none")]
    fabric: Option<&'a timed::FabricStats>,
    /// With `--events` or `--nats`: what the event sink did.
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<wasmsched_events::Stats>,
}

/// One policy set of the replay.
#[derive(Serialize)]
struct VersionReport {
    name: String,
    version: u64,
    origin: String,
    from_seconds: u64,
    decisions: usize,
}

/// How well multi-GPU placements used the interconnect.
#[derive(Default, Serialize)]
struct TopologyStats {
    /// Placements of 2 or more whole GPUs on nodes with a known topology.
    multi_gpu_placements: usize,
    /// Of those, placements whose GPUs span NUMA nodes (`topology-mismatch` warnings).
    spanning_numa: usize,
    /// Of those, placements whose estimated 100 MB all-reduce is over 5 ms (`communication-bottleneck`).
    bottlenecked: usize,
    /// Mean bottleneck bandwidth inside the placed sets, GB/s.
    mean_bottleneck_gbps: f64,
}

/// Virtual seconds per second that show `jobs` in about two minutes, at least 60: what `replay
/// --serve` plays at unless told.
fn watchable_speed(jobs: &[Job]) -> f64 {
    const WATCH_SECONDS: f64 = 120.0;
    let span = jobs.iter().map(|j| j.arrival.saturating_add(j.duration.unwrap_or(0))).max().unwrap_or(0);
    let speed = (span as f64 / WATCH_SECONDS).max(60.0).round();
    eprintln!("dashboard: playing {speed} virtual seconds per second (--speed to change)");
    speed
}

/// Topology statistics and alert events of one placement.
fn observe_topology(
    stats: &mut TopologyStats,
    table: &NodeTable,
    node: &str,
    placement: &wasmsched_core::Placement,
) -> Vec<wasmsched_topology::alerts::Alert> {
    let Some(topology) = table.topologies().get(node) else { return Vec::new() };
    let gpus: Vec<u32> = placement.devices.iter().filter(|d| d.milli >= 1000).map(|d| d.gpu).collect();
    if gpus.len() < 2 {
        return Vec::new();
    }
    let costs = wasmsched_topology::LinkCosts::default();
    let bottleneck = wasmsched_topology::alerts::bottleneck(topology, &costs, &gpus).bandwidth_gbps;
    let alerts = wasmsched_topology::alerts::placement_alerts(topology, &costs, &gpus, &Default::default());
    let n = stats.multi_gpu_placements as f64;
    stats.mean_bottleneck_gbps = (stats.mean_bottleneck_gbps * n + bottleneck) / (n + 1.0);
    stats.multi_gpu_placements += 1;
    stats.spanning_numa += usize::from(alerts.iter().any(|a| a.kind == "topology-mismatch"));
    stats.bottlenecked += usize::from(alerts.iter().any(|a| a.kind == "communication-bottleneck"));
    alerts
}

/// The cluster the replay starts with, as events: each node's capacity and each queue's
/// configuration (what `wasmsched scenario from-events` rebuilds them from).
fn cluster_events(table: &NodeTable, tree: &wasmsched_core::QueueTree) -> Vec<wasmsched_events::Payload> {
    let kinds = table.accelerators().kinds();
    let nodes = table
        .slots()
        .filter_map(|s| table.get(s))
        .map(|n| decisions::node_capacity(n, table.topologies().get(&n.name).is_some(), false, kinds));
    let queues = (0..tree.len()).filter_map(|i| tree.get(i)).map(|q| decisions::queue_configured(q, false));
    nodes.chain(queues).collect()
}

/// The `task-ended` event of a run of the replay.
fn ended_event(r: &timed::TimedRelease<'_>) -> wasmsched_events::Payload {
    let node = r.nodes.slot_of(r.node).and_then(|s| r.nodes.get(s));
    decisions::ended(decisions::Ended {
        task: r.task,
        node,
        node_name: r.node,
        devices: r.devices,
        started: wasmsched_events::Timestamp(r.started.saturating_mul(1000)),
        reason: match r.end {
            timed::RunEnd::Completed => wasmsched_events::schema::EndReason::Completed,
            timed::RunEnd::Preempted => wasmsched_events::schema::EndReason::Preempted,
            timed::RunEnd::Evicted => wasmsched_events::schema::EndReason::Evicted,
        },
        work_kept: r.work_kept,
    })
}

/// What a replay replays: the cluster, its queues, the jobs, and what was left out of them.
pub(crate) struct Inputs {
    pub(crate) table: NodeTable,
    pub(crate) tree: wasmsched_core::QueueTree,
    pub(crate) jobs: Vec<Job>,
    pub(crate) skipped: Vec<String>,
    pub(crate) dra: Option<wasmsched_dra::Objects>,
    /// The scenario's `fabric`.
    pub(crate) fabric: Option<timed::Fabric>,
}

/// The scenario, or the openb trace, of `args`.
fn inputs(args: &Args) -> anyhow::Result<Inputs> {
    anyhow::ensure!(args.compress > 0.0 && args.compress.is_finite(), "--compress must be a positive number");
    anyhow::ensure!(args.node_stride >= 1, "--node-stride must be at least 1");
    let (mut dra, mut fabric) = (None, None);
    let (table, tree, mut jobs, skipped) = match &args.scenario {
        Some(path) => {
            let loaded = Scenario::load_lenient(path, args.lenient)?;
            let s = loaded.scenario;
            dra = loaded.dra;
            fabric = s.fabric.clone();
            (s.node_table_with(&loaded.topologies), s.queue_tree(), s.jobs, loaded.skipped)
        }
        None => {
            let nodes = inputs::nodes(args.nodes.as_deref())?;
            let (pods, skipped) = inputs::pods(args.pods.as_deref(), args.lenient)?;
            let skipped: Vec<String> = skipped.iter().map(ToString::to_string).collect();
            let mut table = NodeTable::new();
            for n in nodes.into_iter().step_by(args.node_stride) {
                table.upsert(n);
            }
            let jobs: Vec<Job> = pods.iter().map(|p| Job::from_trace(p, args.compress)).collect();
            let tree = queue_tree(&flat_queues(&jobs));
            (table, tree, jobs, skipped)
        }
    };
    for why in &skipped {
        tracing::warn!(skipped = %why, "left out of the replay");
    }
    if args.topology_blind {
        for job in &mut jobs {
            job.topology = None;
        }
    }
    if let Some(wait) = args.topology_wait {
        for t in jobs.iter_mut().filter_map(|j| j.topology.as_mut()) {
            if t.required.is_none() && t.wait_seconds == 0 {
                t.wait_seconds = wait;
            }
        }
    }
    if let Some(objects) = &dra {
        for r in wasmsched_dra::Inventory::from_slices(&objects.slices).1 {
            tracing::warn!(what = %r.what, reason = %r.reason, "DRA: leaving out devices that cannot be used");
        }
    }
    let tree = tree.map_err(anyhow::Error::msg)?;
    Ok(Inputs { table, tree, jobs, skipped, dra, fabric })
}

/// The set a replay starts with: `--policy-set`'s, or the built-in one `--policy`, `--seed`,
/// `--fair-share` and `--no-preemption` name.
fn initial_set(
    args: &Args,
    choice: Option<&str>,
    runtime: Option<&Arc<wasmsched_runtime::Runtime>>,
    jobs: &[Job],
) -> anyhow::Result<Initial> {
    let policy = choice.unwrap_or(&args.policy);
    if choice.is_none()
        && let Some(path) = &args.policy_set
    {
        return Ok(Initial::File(path.clone()));
    }
    if choice.is_some_and(|c| std::path::Path::new(c).exists()) {
        return Ok(Initial::File(policy.into()));
    }
    let typical = timed::target_workload(jobs);
    let set = replay_policy_set(runtime, policy, args.seed, &typical, &args.fair_share, !args.no_preemption)?;
    Ok(Initial::BuiltIn { set, name: policy.to_string() })
}

/// The core's settings of `args`, on a cluster with `fabric`.
fn settings(args: &Args, fabric: Option<timed::Fabric>) -> timed::ReplaySettings {
    let core = CoreConfig {
        gang_timeout_seconds: args.gang_timeout,
        reclaim_min_runtime_seconds: args.reclaim_min_runtime,
        reclaim_within_deficit: args.reclaim_within_deficit,
        reclaim_max_runtime_seconds: args.reclaim_max_runtime,
        ..CoreConfig::default()
    };
    timed::ReplaySettings { core, drop_timed_out_gangs: args.drop_timed_out_gangs, fabric }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Inputs { table, tree, jobs, skipped, dra, fabric } = inputs(&args)?;
    let runtime = crate::policy::replay_runtime(args.native)?;
    if let Some(other) = &args.compare {
        let a = initial_set(&args, None, runtime.as_ref(), &jobs)?;
        let b = initial_set(&args, Some(other), runtime.as_ref(), &jobs)?;
        let settings = settings(&args, fabric.clone());
        let inputs = Inputs { table, tree, jobs, skipped, dra, fabric };
        return crate::replay_compare::run(&inputs, runtime, [a, b], settings, args.json, args.serve);
    }
    let policies = prepare_policies(&args, runtime, &table, &jobs)?;
    let settings = settings(&args, fabric);
    let mut board = match args.serve {
        Some(addr) => Some(crate::replay_dashboard::TimedReplay::start(
            addr,
            &jobs,
            &table,
            &tree,
            dra.as_ref(),
            &policies.live[0],
            args.speed.unwrap_or_else(|| watchable_speed(&jobs)),
        )?),
        None => None,
    };
    let sink = args.sink.open_for_simulation("replay")?;
    let events = crate::events_cmd::Shown::new(sink, board.as_ref().map(|b| b.publisher()), "replay")?;
    if let Some(sink) = events.target() {
        for p in cluster_events(&table, &tree) {
            sink.emit_at(wasmsched_events::Timestamp(0), p);
        }
    }
    let t = Instant::now();
    // Progress in jobs started: the work is placing them (once the last has started only departures
    // remain), and under contention most start long after the last arrival.
    let progress = crate::progress::Progress::new(jobs.len() as u64, "jobs started", args.quiet);
    let mut recorder = Recorder::new(&events, board.as_mut(), &policies, &jobs, &table, &settings.core, &progress);
    let r = timed::run_with_devices(&policies.timeline(), &table, dra.as_ref(), &tree, &jobs, settings.clone(), |o| {
        recorder.observe(o)
    })?;
    let (decisions_by_version, topology) = recorder.finish();
    drop(progress);
    let board = board.map(crate::replay_dashboard::TimedReplay::finished);
    let event_stats = crate::events_cmd::finish(events.user, args.sink.grace());
    let report = Report {
        jobs: jobs.len(),
        skipped: &skipped,
        policy: &policies.live[0].reference.name,
        runtime: if args.native { "native" } else { "wasm" },
        replay_seconds: t.elapsed().as_secs_f64(),
        horizon_seconds: r.horizon,
        fair_share: policies.live[0].set.fair_share().map_or_else(|| "none".into(), |p| p.name().to_string()),
        preemption: policies.live[0].set.preempt().is_some(),
        policy_versions: policies
            .live
            .iter()
            .map(|l| VersionReport {
                name: l.reference.name.clone(),
                version: l.reference.version,
                origin: l.origin.clone(),
                from_seconds: l.from,
                decisions: decisions_by_version.get(&l.reference.version).copied().unwrap_or(0),
            })
            .collect(),
        rejected_rollouts: &policies.rejected,
        placement_attempts: r.attempts,
        evictions: r.evictions,
        job_evictions: r.queues.values().map(|q| q.evictions).sum(),
        gangs_timed_out: r.timed_out,
        plugin_faults: r.faults,
        utilisation_mean_percent: r.utilisation_mean,
        utilisation_mean_while_arriving_percent: r.utilisation_mean_while_arriving,
        utilisation_mean_while_waiting_percent: r.utilisation_mean_while_waiting,
        utilisation_peak_percent: r.utilisation.iter().map(|u| u.1).fold(0.0, f64::max),
        jain_fairness: r.jain_fairness,
        jain_fairness_while_backlogged: r.jain_fairness_while_backlogged,
        queues: &r.queues,
        usage: &r.usage,
        waiting_at_end_by_reason: &r.waiting_by_reason,
        topology,
        fabric: r.fabric.as_ref(),
        events: event_stats,
    };
    if let Some(out) = &args.out {
        write_files(out, &args, &jobs, &r)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if let Some(board) = board {
        // The summary is out (stdout flushed line by line); the pages stay up.
        board.serve_until_interrupted()?;
    }
    crate::events_cmd::delivered(report.events.as_ref())
}

/// The policy sets of the replay: the first from the command line, then each rollout that passes
/// its gates, smoke-tested on the replayed cluster with its first jobs.
fn prepare_policies(
    args: &Args,
    runtime: Option<Arc<wasmsched_runtime::Runtime>>,
    table: &NodeTable,
    jobs: &[Job],
) -> anyhow::Result<ReplayPolicies> {
    let initial = initial_set(args, None, runtime.as_ref(), jobs)?;
    let preparer = runtime.map(|rt| wasmsched_registry::Preparer::new(rt, crate::policy::builtins()));
    let sample = wasmsched_registry::Sample {
        nodes: Arc::new(table.snapshot()),
        tasks: jobs.iter().take(16).filter_map(|j| j.workload().members.into_iter().next()).collect(),
    };
    ReplayPolicies::prepare(initial, &args.rollouts, preparer.as_ref(), &sample)
}

/// What the replay observes, carried out: events published (arrivals, decisions, ends, shares,
/// policy swaps at their times), the dashboard fed, progress shown, decisions counted per
/// policy version and multi-GPU placements measured.
struct Recorder<'a> {
    events: &'a crate::events_cmd::Shown,
    board: Option<&'a mut crate::replay_dashboard::TimedReplay>,
    policies: &'a ReplayPolicies,
    /// Policy swaps not published yet, by virtual second.
    policy_events: std::iter::Peekable<std::vec::IntoIter<(u64, wasmsched_events::Payload)>>,
    decisions_by_version: std::collections::BTreeMap<u64, usize>,
    by_name: std::collections::HashMap<&'a str, &'a Job>,
    /// Per workload: failed attempts since it last ran, and the gang fit of the last one.
    tries: std::collections::HashMap<String, (u32, u32)>,
    started: std::collections::HashSet<String>,
    progress: &'a crate::progress::Progress,
    shares: decisions::Shares,
    topology: Option<TopologyStats>,
    kinds: Vec<wasmsched_api::accelerators::Kind>,
    config: &'a CoreConfig,
}

impl<'a> Recorder<'a> {
    fn new(
        events: &'a crate::events_cmd::Shown,
        board: Option<&'a mut crate::replay_dashboard::TimedReplay>,
        policies: &'a ReplayPolicies,
        jobs: &'a [Job],
        table: &NodeTable,
        config: &'a CoreConfig,
        progress: &'a crate::progress::Progress,
    ) -> Recorder<'a> {
        Recorder {
            events,
            board,
            policies,
            policy_events: policies.events().into_iter().peekable(),
            decisions_by_version: Default::default(),
            by_name: jobs.iter().map(|j| (j.name.as_str(), j)).collect(),
            tries: Default::default(),
            started: Default::default(),
            progress,
            shares: decisions::Shares::default(),
            topology: (!table.topologies().is_empty()).then(TopologyStats::default),
            kinds: table.accelerators().kinds().to_vec(),
            config,
        }
    }

    fn observe(&mut self, observed: timed::Observed<'_>) {
        match observed {
            timed::Observed::Decision(d) => self.decided(&d),
            timed::Observed::Arrived(at, job, workload) => self.arrived(at, job, workload),
            timed::Observed::Withdrawn(at, job, workload) => self.withdrawn(at, job, workload),
            timed::Observed::Released(r) => self.released(&r),
            timed::Observed::Shares(at, queues) => self.shares(at, queues),
            timed::Observed::Settled { .. } => {}
        }
    }

    fn arrived(&self, at: u64, job: &Job, workload: &wasmsched_core::Workload) {
        let Some(sink) = self.events.target() else { return };
        let timings = decisions::Timings {
            checkpoint_seconds: job.checkpoint_seconds,
            termination_seconds: job.termination_seconds,
            duration_seconds: job.duration,
        };
        let stamp = wasmsched_events::Timestamp(at.saturating_mul(1000));
        for (i, task) in workload.members.iter().enumerate() {
            // A replica taken over where it runs (`running_on`) says so.
            let payload = match job.running_on.get(i) {
                Some(node) => decisions::submitted_running(task, workload, timings, &self.kinds, node, stamp),
                None => decisions::submitted(task, workload, timings, &self.kinds),
            };
            sink.emit_at(stamp, payload);
        }
    }

    fn withdrawn(&mut self, at: u64, job: &Job, workload: &wasmsched_core::Workload) {
        if let Some(b) = self.board.as_mut() {
            b.withdrawn(at, &workload.name);
        }
        if let Some(sink) = self.events.target() {
            let stamp = wasmsched_events::Timestamp(at.saturating_mul(1000));
            for task in &workload.members {
                sink.emit_at(stamp, decisions::withdrawn(task, at.saturating_sub(job.arrival)));
            }
        }
    }

    fn released(&mut self, r: &timed::TimedRelease<'_>) {
        if let Some(b) = self.board.as_mut() {
            b.released(r);
        }
        if let Some(sink) = self.events.target() {
            sink.emit_at(wasmsched_events::Timestamp(r.at.saturating_mul(1000)), ended_event(r));
        }
    }

    fn shares(&mut self, at: u64, queues: &[wasmsched_core::QueueShare]) {
        if let Some(b) = self.board.as_mut() {
            b.shares(at, queues);
        }
        if let Some(sink) = self.events.target() {
            for p in self.shares.changes(queues) {
                sink.emit_at(wasmsched_events::Timestamp(at.saturating_mul(1000)), p);
            }
        }
    }

    /// A decision: counted, shown, published with the facts its events name.
    fn decided(&mut self, d: &timed::TimedDecision<'_>) {
        if let Some(b) = self.board.as_mut() {
            b.decided(d, self.policies.by_version(d.policy_version));
        }
        for (claim, a) in d.claims.iter().enumerate() {
            let devices: Vec<String> = a.results.iter().map(|(request, id, _)| format!("{request}={id}")).collect();
            tracing::debug!(at = d.at, task = d.task.map_or("", |t| t.id.as_str()), claim, devices = %devices.join(","), "DRA claim allocated");
        }
        if let (Some(job), Decision::Bound { .. }) = (d.job, d.decision)
            && self.started.insert(job.name.clone())
        {
            self.progress.at(self.started.len() as u64);
        }
        let at = wasmsched_events::Timestamp(d.at.saturating_mul(1000));
        *self.decisions_by_version.entry(d.policy_version).or_default() += 1;
        while let Some((_, payload)) = self.policy_events.next_if(|(t, _)| *t <= d.at) {
            if let Some(sink) = self.events.target() {
                sink.emit_at(at, payload);
            }
        }
        let no_task = Task::default();
        let task = d.task.unwrap_or(&no_task);
        if let (Some(stats), Decision::Bound { node, devices, score, feasible, .. }) =
            (self.topology.as_mut(), d.decision)
        {
            let placement = Placement {
                node: d.nodes.slot_of(node).unwrap_or_default(),
                devices: devices.clone(),
                score: *score,
                feasible: *feasible,
                skipped_faults: Vec::new(),
            };
            for alert in observe_topology(stats, d.nodes, node, &placement) {
                decisions::publish_alert(self.events.target(), at, task, node, &placement, alert);
            }
        }
        let Some(sink) = self.events.target() else { return };
        let policy = self.policies.by_version(d.policy_version).map(|l| l.reference.clone()).unwrap_or_default();
        let job = d.job;
        let tried = job.map(|j| self.tries.entry(j.name.clone()).or_default());
        let (attempt, placed) = match (d.decision, tried) {
            (Decision::Unschedulable { explanation, .. }, Some(t)) => {
                *t = (explanation.attempts, explanation.gang.map_or(0, |g| g.0 as u32));
                (explanation.attempts, t.1)
            }
            (Decision::Bound { .. }, Some(t)) => (t.0 + 1, t.1),
            (_, Some(t)) => (t.0, t.1),
            (_, None) => (0, 0),
        };
        let preemptor = match d.decision {
            Decision::Evicted { reason: EvictReason::Preempted { preemptor, .. }, .. } => {
                self.by_name.get(preemptor.as_str()).map(|j| j.workload().members.swap_remove(0))
            }
            _ => None,
        };
        let facts = decisions::CycleFacts {
            task,
            preemptor: preemptor.as_ref(),
            grace_seconds: job
                .filter(|j| j.checkpoint_seconds.is_some())
                .map(|j| j.grace_seconds.unwrap_or(self.config.checkpoint_grace_seconds)),
            attempt,
            min_member: job.map_or(1, |j| j.min_replicas.unwrap_or(j.replicas)),
            placed,
            waited_seconds: job.map_or(0, |j| d.at.saturating_sub(j.arrival)),
            submitted: job.map(|j| wasmsched_events::Timestamp(j.arrival.saturating_mul(1000))),
        };
        for event in decisions::cycle(d.decision, &facts, d.nodes, &policy) {
            sink.emit_at(at, event);
        }
    }

    /// The replay is over: policy swaps after the last decision are published; the decisions per
    /// policy version and the topology statistics.
    fn finish(self) -> (std::collections::BTreeMap<u64, usize>, Option<TopologyStats>) {
        if let Some(sink) = self.events.target() {
            for (t, payload) in self.policy_events {
                sink.emit_at(wasmsched_events::Timestamp(t.saturating_mul(1000)), payload);
            }
        }
        (self.decisions_by_version, self.topology)
    }
}

/// `--out DIR`: each job's times (`jobs.csv`), GPU allocation over time (`utilisation.csv` and a
/// chart) and each queue's queueing delay as a CDF.
fn write_files(out: &std::path::Path, args: &Args, jobs: &[Job], r: &timed::TimedRun) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut csv = String::from("job,queue,arrival,start,end,evictions,waiting_reason\n");
    for (j, o) in jobs.iter().zip(&r.jobs) {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let reason = o.waiting_reason.as_deref().unwrap_or("").replace(['"', ','], " ");
        csv.push_str(&format!(
            "{},{},{},{},{},{},{reason}\n",
            j.name,
            o.queue,
            o.arrival,
            opt(o.start),
            opt(o.end),
            o.evictions
        ));
    }
    std::fs::write(out.join("jobs.csv"), csv)?;
    let mut util = String::from("time_s,gpu_allocated_percent\n");
    for (t, u) in &r.utilisation {
        util.push_str(&format!("{t},{u}\n"));
    }
    std::fs::write(out.join("utilisation.csv"), util)?;
    let hours: Vec<(f64, f64)> = r.utilisation.iter().map(|&(t, u)| (t as f64 / 3600.0, u)).collect();
    crate::chart::lines(
        &out.join("utilisation.svg"),
        &format!("GPU allocation over time ({}, fair share {})", args.policy, args.fair_share),
        ("time (h)", "GPU allocated (% of capacity)"),
        crate::chart::Axes::Full,
        &[],
        &[(args.policy.clone(), crate::chart::steps(&hours))],
    )?;
    // Queueing delay per queue as a CDF: the share of its started jobs that waited at most x.
    let mut curves = Vec::new();
    for queue in r.queues.keys() {
        let mut waits: Vec<f64> = r
            .jobs
            .iter()
            .filter(|o| &o.queue == queue)
            .filter_map(|o| o.start.map(|s| (s - o.arrival) as f64 / 60.0))
            .collect();
        if waits.is_empty() {
            continue;
        }
        waits.sort_by(f64::total_cmp);
        let n = waits.len() as f64;
        // An empirical CDF: 0 below the shortest wait, a step up at each wait.
        let cdf: Vec<(f64, f64)> = std::iter::once((waits[0], 0.0))
            .chain(waits.iter().enumerate().map(|(i, &w)| (w, 100.0 * (i + 1) as f64 / n)))
            .collect();
        curves.push((queue.clone(), crate::chart::steps(&cdf)));
    }
    crate::chart::lines(
        &out.join("queue_delay.svg"),
        &format!("Queueing delay by queue ({}, fair share {})", args.policy, args.fair_share),
        ("waited (min)", "started jobs that waited at most this long (%)"),
        crate::chart::Axes::Full,
        &[],
        &curves,
    )?;
    Ok(())
}

/// The report as text.
fn print_report(report: &Report<'_>) {
    println!(
        "wasmsched replay: {} jobs, {} ({}), {:.2} s; horizon {} s; {} placement attempts",
        report.jobs,
        report.policy,
        report.runtime,
        report.replay_seconds,
        report.horizon_seconds,
        report.placement_attempts
    );
    if !report.skipped.is_empty() {
        println!("skipped {} (--lenient):", report.skipped.len());
        for why in report.skipped {
            println!("  {why}");
        }
    }
    println!(
        "fair share {}, preemption {}: {} pods evicted ({} job runs stopped), {} gang timeouts, {} plugin faults",
        report.fair_share,
        if report.preemption { "on" } else { "off" },
        report.evictions,
        report.job_evictions,
        report.gangs_timed_out,
        report.plugin_faults
    );
    if report.policy_versions.len() > 1 || !report.rejected_rollouts.is_empty() {
        for v in &report.policy_versions {
            println!(
                "policy set {}@{} from {} s: {} decisions ({})",
                v.name, v.version, v.from_seconds, v.decisions, v.origin
            );
        }
        for r in report.rejected_rollouts {
            println!("rollout at {} s rejected at its {} gate: {} ({})", r.at_seconds, r.gate, r.reason, r.origin);
        }
    }
    let while_waiting = report
        .utilisation_mean_while_waiting_percent
        .map_or_else(|| "no job waited".to_string(), |m| format!("mean {m:.2} % while work waited"));
    println!(
        "GPU allocation: {while_waiting}; {:.2} % while jobs arrived, {:.2} % over the whole run; \
         peak {:.2} %\nJain's fairness over queues {:.3} at the end, {} while queues waited\n",
        report.utilisation_mean_while_arriving_percent,
        report.utilisation_mean_percent,
        report.utilisation_peak_percent,
        report.jain_fairness,
        report.jain_fairness_while_backlogged.map_or_else(|| "– (never two at once)".into(), |j| format!("{j:.3}")),
    );
    let gpu_hours = |milli_seconds: u64| milli_seconds as f64 / 3.6e6;
    let held: u64 = report.usage.values().map(|u| u.gpu_milli_seconds).sum();
    let lost: u64 = report.usage.values().map(|u| u.lost_gpu_milli_seconds).sum();
    println!(
        "GPU-hours lost to evictions (work thrown away): {:.1} of {:.1} held ({:.2} %)\n",
        gpu_hours(lost),
        gpu_hours(held),
        if held == 0 { 0.0 } else { 100.0 * lost as f64 / held as f64 }
    );
    println!(
        "{:<12} {:>7} {:>8} {:>8} {:>12} {:>10} {:>10} {:>12} {:>9} {:>8} {:>10} {:>12}",
        "queue",
        "jobs",
        "started",
        "waiting",
        "delay mean",
        "delay p50",
        "delay p99",
        "JCT mean",
        "evictions",
        "service",
        "lost GPU-h",
        "deficit GPU-h"
    );
    for (name, q) in report.queues {
        let lost = report.usage.get(name).map_or(0, |u| u.lost_gpu_milli_seconds);
        println!(
            "{name:<12} {:>7} {:>8} {:>8} {:>11.1}s {:>9}s {:>9}s {:>11.0}s {:>9} {:>8.3} {:>10.1} {:>12.1}",
            q.jobs,
            q.started,
            q.waiting,
            q.delay_mean,
            q.delay_p50,
            q.delay_p99,
            q.jct_mean,
            q.evictions,
            q.service_ratio,
            gpu_hours(lost),
            q.share_deficit_gpu_hours
        );
    }
    if let Some(t) = &report.topology {
        println!(
            "\nmulti-GPU placements on known topologies: {}; spanning NUMA nodes {}; all-reduce over 5 ms {}; mean bottleneck {:.1} GB/s",
            t.multi_gpu_placements, t.spanning_numa, t.bottlenecked, t.mean_bottleneck_gbps
        );
    }
    if let Some(f) = report.fabric {
        println!(
            "\ngangs inside one {} domain: {} of {} started ({:.1} %; {} split while the rest of the cluster was below 90 % allocated, {} while one domain had room for the whole gang); gang queueing delay mean {:.0} s; GPUs stranded in domains only small jobs broke: {:.1} (time-weighted mean)",
            f.level,
            f.gangs_in_one_domain,
            f.gangs_started,
            100.0 * f.gangs_in_one_domain as f64 / f.gangs_started.max(1) as f64,
            f.gangs_split_below_90_percent,
            f.gangs_split_with_a_domain_free,
            f.gang_delay_mean_seconds,
            f.stranded_gpus_mean
        );
    }
    if !report.waiting_at_end_by_reason.is_empty() {
        println!("\nstill waiting at the end:");
        for (why, n) in report.waiting_at_end_by_reason {
            println!("  {n:>6}  {why}");
        }
    }
}
