//! `wasmsched simulate`: the FGD paper's "submit until X % arrived" experiment on an openb trace.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use wasmsched_sim::{replay, workload};

use crate::policy::policy_set;
use crate::{events_cmd, inputs};
use wasmsched_events::decisions;

/// Arguments of `simulate`.
#[derive(clap::Args)]
pub struct Args {
    /// Node list (openb `sn,cpu_milli,memory_mib,gpu,model`); default: the embedded openb GPU nodes.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Pod list (openb, either column shape); default: the embedded openb default trace.
    #[arg(long)]
    pods: Option<PathBuf>,
    /// Seed of the shuffle, tuning and node ranks.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Submit pods until this multiple of GPU capacity has arrived (a positive number).
    #[arg(long, default_value_t = 1.3, allow_negative_numbers = true)]
    tune: f64,
    /// Score policy: the FGD paper's random, dot-prod, gpu-clustering, gpu-packing, best-fit, fgd;
    /// fgd-cpu (FGD counting only the GPUs a node's CPU can feed; beats fgd on openb);
    /// kube-scheduler's least-allocated, most-allocated; or gpu-topology (interconnect-aware, for
    /// nodes with a known topology).
    #[arg(long, default_value = "fgd")]
    policy: String,
    /// Place with a policy set of your own instead of `resource-fit` + `--policy`: a directory with
    /// `policy.yaml` (the hot-reload format) or the file, through the hot-reload gates first.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["policy", "native", "compare_native"])]
    policy_set: Option<PathBuf>,
    /// Skip malformed pod rows (reporting each) instead of failing.
    #[arg(long)]
    lenient: bool,
    /// Run the policies natively instead of as Wasm components.
    #[arg(long)]
    native: bool,
    /// Also replay natively afterwards, report both times and check the results are identical.
    #[arg(long, conflicts_with = "native")]
    compare_native: bool,
    /// No progress bar (there is none anyway when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Print machine-readable JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Serve the dashboard on this address (e.g. `127.0.0.1:8080`) while the trace replays, and
    /// after it until Ctrl-C. Read-only; bind to a non-loopback address only on purpose.
    #[arg(long, value_name = "ADDR")]
    serve: Option<std::net::SocketAddr>,
    /// With `--serve`: at most this many pods placed per second, so a person can watch the cluster
    /// fill (0: as fast as possible).
    #[arg(long, default_value_t = 200.0, requires = "serve")]
    pace: f64,
    #[command(flatten)]
    sink: crate::events_cmd::Sink,
}

#[derive(Serialize)]
struct Report {
    nodes: usize,
    gpus: u64,
    pods_submitted: usize,
    /// Malformed pod rows skipped (`--lenient`), each as `file:line:column: reason`.
    skipped_rows: Vec<String>,
    placed: usize,
    failed: usize,
    failed_by_plugin_fault: usize,
    seed: u64,
    tune: f64,
    policies: String,
    runtime: &'static str,
    setup_seconds: f64,
    replay_seconds: f64,
    decisions_per_second: f64,
    /// With `--compare-native`: the same replay with the policies native.
    #[serde(skip_serializing_if = "Option::is_none")]
    native_replay_seconds: Option<f64>,
    /// With `--compare-native`: Wasm replay time over native replay time.
    #[serde(skip_serializing_if = "Option::is_none")]
    wasm_over_native: Option<f64>,
    /// The series, one row per percent of GPU capacity arrived, 0 to 130.
    by_arrived_percent: Vec<ArrivedRow>,
    /// With `--events` or `--nats`: what the event sink did.
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<wasmsched_events::Stats>,
}

/// The cluster when a given share of its GPU capacity had arrived as requests.
#[derive(serde::Serialize)]
struct ArrivedRow {
    /// GPU requests arrived so far, % of the cluster's GPU capacity.
    arrived_percent: usize,
    /// GPUs allocated, % of capacity (null where no decision is near this point).
    gpu_allocated_percent: Option<f64>,
    /// Idle GPU share fragmented for the trace's target workload, % of capacity (null likewise).
    gpu_fragmented_percent: Option<f64>,
}

pub fn run(args: Args, started: Instant) -> anyhow::Result<()> {
    anyhow::ensure!(args.tune > 0.0 && args.tune.is_finite(), "--tune must be a positive number");
    let nodes = inputs::nodes(args.nodes.as_deref())?;
    let (pods, skipped) = inputs::pods(args.pods.as_deref(), args.lenient)?;
    for e in &skipped {
        tracing::warn!("skipped malformed row: {e}");
    }
    anyhow::ensure!(!nodes.is_empty(), "the node list is empty");
    let work = workload::build(&pods, &nodes, args.seed, args.tune);
    let typical = workload::target_workload(&pods);
    let runtime = crate::policy::replay_runtime(args.native)?;
    let (set, policy, policies) = match &args.policy_set {
        None => (
            policy_set(runtime.as_ref(), &args.policy, args.seed, &typical)?,
            wasmsched_events::schema::PolicySetRef { name: args.policy.clone(), version: 1 },
            format!("resource-fit + {}", args.policy),
        ),
        Some(path) => {
            let runtime = runtime.clone().ok_or_else(|| anyhow::anyhow!("policy sets run as Wasm components"))?;
            let sample = wasmsched_registry::Sample {
                nodes: std::sync::Arc::new(work.nodes.snapshot()),
                tasks: work.pods.iter().take(16).map(|p| p.to_task()).collect(),
            };
            let initial = crate::replay_policies::Initial::File(path.clone());
            let preparer = wasmsched_registry::Preparer::new(runtime, crate::policy::builtins());
            let live = crate::replay_policies::ReplayPolicies::prepare(initial, &[], Some(&preparer), &sample)?
                .live
                .swap_remove(0);
            let label = format!("policy set {} ({})", live.reference.name, live.origin);
            (live.set, live.reference, label)
        }
    };
    let setup_seconds = started.elapsed().as_secs_f64();

    let events = args.sink.open_for_simulation("simulator")?;
    let runtime_name = if args.native { "native" } else { "wasm" };
    if !args.json {
        // The header first: piped to a file, it is there while the replay runs.
        println!(
            "wasmsched simulate: {} pods on {} nodes ({} GPUs), seed {}, tune {}, {policies} ({runtime_name})",
            work.pods.len(),
            work.nodes.len(),
            work.capacity_milli / 1000,
            args.seed,
            args.tune
        );
    }
    let mut dashboard = match args.serve {
        Some(addr) => {
            let source = format!(
                "simulator: {} pods on {} nodes, {policies} ({runtime_name})",
                work.pods.len(),
                work.nodes.len()
            );
            Some(crate::dashboard::Replay::start(addr, source, &work.nodes, &set, &policy, args.pace)?)
        }
        None => None,
    };
    let events = events_cmd::Shown::new(events, dashboard.as_ref().map(|b| b.publisher()), "simulator")?;
    let t = Instant::now();
    let progress = crate::progress::Progress::new(work.pods.len() as u64, "pods", args.quiet);
    let run = replay::run_observed(&set, &work.nodes, &work.pods, &typical, |d| {
        progress.step();
        if let Some(board) = dashboard.as_mut() {
            board.decided(&d);
        }
        let outcome = d.outcome.map_err(|u| &u.diagnosis);
        // The static replay has no clock: its placements are not billed, so no submission time.
        let decision =
            decisions::Decision { task: d.task, outcome, evaluated: work.nodes.len(), attempt: 1, submitted: None };
        decisions::publish(events.target(), None, decision, &policy);
    });
    drop(progress);
    let replay_seconds = t.elapsed().as_secs_f64();
    if let Some(board) = dashboard.as_mut() {
        board.finished(&run);
    }
    let event_stats = events_cmd::finish(events.user, args.sink.grace());
    let columns = replay::allocation_columns(&run, 130);
    let native_replay_seconds = if args.compare_native {
        let set = policy_set(None, &args.policy, args.seed, &typical)?;
        let t = Instant::now();
        let native = replay::run(&set, &work.nodes, &work.pods, &typical);
        let seconds = t.elapsed().as_secs_f64();
        anyhow::ensure!(native.series == run.series, "native and Wasm replays differ: the policy is not deterministic");
        Some(seconds)
    } else {
        None
    };
    let report = Report {
        nodes: work.nodes.len(),
        gpus: work.capacity_milli / 1000,
        pods_submitted: work.pods.len(),
        skipped_rows: skipped.iter().map(ToString::to_string).collect(),
        placed: run.placed,
        failed: run.failed,
        failed_by_plugin_fault: run.faulted,
        seed: args.seed,
        tune: args.tune,
        policies,
        runtime: runtime_name,
        setup_seconds,
        replay_seconds,
        decisions_per_second: work.pods.len() as f64 / replay_seconds.max(1e-9),
        native_replay_seconds,
        wasm_over_native: native_replay_seconds.map(|n| replay_seconds / n.max(1e-9)),
        by_arrived_percent: columns
            .into_iter()
            .zip(replay::fragmentation_columns(&run, 130))
            .enumerate()
            .map(|(arrived_percent, (gpu_allocated_percent, gpu_fragmented_percent))| ArrivedRow {
                arrived_percent,
                gpu_allocated_percent,
                gpu_fragmented_percent,
            })
            .collect(),
        events: event_stats,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        if let Some(board) = dashboard {
            board.serve_until_interrupted()?;
        }
        return events_cmd::delivered(report.events.as_ref());
    }
    println!(
        "placed {}, failed {} ({} by plugin faults); replay {:.2} s, {:.0} decisions/s; setup {:.2} s",
        report.placed,
        report.failed,
        report.failed_by_plugin_fault,
        report.replay_seconds,
        report.decisions_per_second,
        report.setup_seconds
    );
    if let (Some(n), Some(r)) = (report.native_replay_seconds, report.wasm_over_native) {
        println!("native replay {n:.2} s, identical results; Wasm / native = {r:.2}");
    }
    if let Some(s) = &report.events {
        println!(
            "events: {} emitted, {} delivered, {} pending, {} dropped{}",
            s.emitted,
            s.delivered,
            s.pending,
            s.dropped,
            s.last_error.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
        );
    }
    if !report.skipped_rows.is_empty() {
        println!("skipped {} malformed pod rows (--lenient):", report.skipped_rows.len());
        for e in &report.skipped_rows {
            println!("  {e}");
        }
    }
    println!("\narrived (% of GPU capacity)   GPU allocated (%)   GPU fragmented (%)");
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for row in report.by_arrived_percent.iter().skip(10).step_by(10) {
        println!(
            "  {:>4} %                     {:>7}             {:>7}",
            row.arrived_percent,
            cell(row.gpu_allocated_percent),
            cell(row.gpu_fragmented_percent)
        );
    }
    if let Some(board) = dashboard {
        board.serve_until_interrupted()?;
    }
    events_cmd::delivered(report.events.as_ref())
}
