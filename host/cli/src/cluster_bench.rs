//! `wasmsched cluster-bench`: a scheduler's throughput and latency on a real API server, or the
//! server's own ceiling with the trivial binder (`wasmsched_clusterbench`).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use wasmsched_clusterbench::{Arrival, BinderConfig, Config, Mix, UnderTest};

/// The cluster is the one the kubeconfig (or in-cluster credentials) reaches. Fake nodes are
/// created there: use a cluster for benchmarks, without a controller manager's node lifecycle
/// (no kubelet keeps the nodes Ready).
#[derive(Parser)]
pub struct Args {
    /// `schedulerName` of the pods: the scheduler under test (with --binder: any name no
    /// scheduler serves).
    #[arg(long, default_value = "wasmsched")]
    scheduler_name: String,
    /// Start the scheduler under test with this command line (`sh -c`), after the pods for a
    /// batch; its CPU and memory are measured and it is stopped at the end.
    #[arg(long, conflicts_with_all = ["binder", "scheduler_pid"])]
    scheduler_command: Option<String>,
    /// Where the started scheduler's output goes (default: discarded).
    #[arg(long, requires = "scheduler_command")]
    scheduler_log: Option<std::path::PathBuf>,
    /// A scheduler already running on this machine: its CPU time and memory go in the report.
    #[arg(long, conflicts_with = "binder")]
    scheduler_pid: Option<u32>,
    /// Seconds a started scheduler (or the binder) gets before a burst or a rate begins.
    #[arg(long, default_value_t = 5.0)]
    warm_up: f64,
    /// Bind the pods here, round-robin and without scheduling: the API server's own ceiling.
    #[arg(long)]
    binder: bool,
    /// Binds in flight for --binder.
    #[arg(long, default_value_t = 64, requires = "binder")]
    binder_in_flight: usize,
    /// With --binder, record one `Scheduled` event per pod as a scheduler does.
    #[arg(long, requires = "binder")]
    binder_events: bool,
    /// `plain`, `gang:N` (wasmsched PodGroups of N), `anti-affinity` (required, per hostname) or
    /// `preempt` (the cluster filled with low-priority pods first; each measured pod preempts), `dra`
    /// (each pod's GPUs through a ResourceClaim of its own with a CEL selector; the nodes publish
    /// their GPUs as ResourceSlices; not mixed, no churn), or
    /// a comma-separated mix of them dealt one unit each in turn (`plain,gang:8,preempt`: with
    /// `preempt` in a mix every measured pod outranks the fillers; with --lifetime each preempted
    /// filler is replaced, so arrivals keep preempting).
    #[arg(long, default_value = "plain", value_parser = Mix::parse)]
    workload: Mix,
    /// Fake nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// GPUs per fake node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Measured pods.
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// GPUs per pod.
    #[arg(long, default_value_t = 1)]
    gpus_per_pod: u32,
    /// How the pods arrive: `batch` (all created before the scheduler starts; needs
    /// --scheduler-command or --binder), `burst` (all at once while it runs) or a number of
    /// pods per second.
    #[arg(long, default_value = "burst", value_parser = parse_arrival)]
    arrival: Arrival,
    /// Creations (and node set-up requests) in flight.
    #[arg(long, default_value_t = 64)]
    create_in_flight: usize,
    /// The namespace of the pods (created if missing).
    #[arg(long, default_value = "wasmsched-bench")]
    namespace: String,
    /// The longest wait for every pod to be bound (seconds).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Wait after the last bind before reading the API server's counters (seconds): events
    /// and status writes trailing the binds count.
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// End (delete) each pod this many seconds after it is bound: with a rate, steady churn of
    /// arrivals and departures, for a soak.
    #[arg(long)]
    lifetime: Option<f64>,
    /// Sample the scheduler's memory, open files and CPU this often (seconds): the report's
    /// `series`.
    #[arg(long)]
    sample_every: Option<f64>,
    /// Delete the fake nodes afterwards (by default they stay for the next run).
    #[arg(long)]
    delete_nodes: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let optional = [("--lifetime", args.lifetime), ("--sample-every", args.sample_every)];
    for (flag, secs) in optional.into_iter().filter_map(|(f, s)| Some((f, s?))) {
        if !(secs.is_finite() && secs > 0.0) {
            bail!("{flag} is a positive number of seconds");
        }
    }
    for (flag, secs) in [("--settle", args.settle), ("--warm-up", args.warm_up)] {
        if !(secs.is_finite() && secs >= 0.0) {
            bail!("{flag} is a number of seconds, 0 or more");
        }
    }
    let under_test = match (args.binder, args.scheduler_command) {
        (true, _) => UnderTest::Binder(BinderConfig { in_flight: args.binder_in_flight, events: args.binder_events }),
        (false, Some(line)) => UnderTest::Command { line, log: args.scheduler_log },
        (false, None) => UnderTest::Running { pid: args.scheduler_pid },
    };
    let config = Config {
        scheduler_name: args.scheduler_name,
        under_test,
        namespace: args.namespace,
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        pods: args.pods,
        gpus_per_pod: args.gpus_per_pod,
        arrival: args.arrival,
        workload: args.workload,
        create_in_flight: args.create_in_flight,
        warm_up: Duration::from_secs_f64(args.warm_up),
        timeout: Duration::from_secs(args.timeout),
        settle: Duration::from_secs_f64(args.settle),
        delete_nodes: args.delete_nodes,
        lifetime: args.lifetime.map(Duration::from_secs_f64),
        sample_every: args.sample_every.map(Duration::from_secs_f64),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    let report = runtime.block_on(async {
        let client = wasmsched_clusterbench::Client::try_default()
            .await
            .context("connecting to the Kubernetes API (kubeconfig or in-cluster)")?;
        wasmsched_clusterbench::run(client, &config).await.map_err(anyhow::Error::from)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    let o = report.overcommit;
    if o.times > 0 {
        bail!("a node held more GPUs than it has ({} times, up to {} beyond): a double allocation", o.times, o.most);
    }
    if report.devices_allocated_twice > 0 {
        bail!("{} DRA devices were in two claims at once: a double allocation", report.devices_allocated_twice);
    }
    if !report.complete() {
        bail!("{} of {} pods were not bound within {} s", report.pods - report.bound, report.pods, args.timeout);
    }
    Ok(())
}

fn parse_arrival(text: &str) -> Result<Arrival, String> {
    match text {
        "batch" => Ok(Arrival::Batch),
        "burst" => Ok(Arrival::Burst),
        _ => match text.parse::<f64>() {
            Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(Arrival::Rate(rate)),
            _ => Err(format!("{text:?}: batch, burst or a positive number of pods per second")),
        },
    }
}
