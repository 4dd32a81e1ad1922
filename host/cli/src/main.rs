//! The `wasmsched` command.

// A CLI prints its results; libraries log through `tracing`.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod bench;
mod bench_dashboard;
mod bench_dra;
mod bench_queues;
mod bench_vendors;
mod chart;
mod cluster_bench;
mod convert_cmd;
mod dashboard;
mod dra_cmd;
mod events_cmd;
mod experiment;
mod history;
mod inputs;
mod plugin_cmd;
mod plugin_new;
mod policy;
mod policy_cmd;
mod progress;
mod replay_cmd;
mod replay_compare;
mod replay_dashboard;
mod replay_policies;
mod run_cmd;
mod scenario_cmd;
mod simulate;
mod topo_cmd;
mod usage_cmd;

/// wasmsched: a GPU cluster scheduler whose policies are sandboxed WebAssembly components.
#[derive(Parser)]
#[command(name = "wasmsched", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a GPU-cluster trace in the embedded simulator (default: the openb trace).
    Simulate(simulate::Args),
    /// Time-driven replay: arrivals, departures and queues, from a scenario or an openb trace.
    Replay(replay_cmd::Args),
    /// Run the FGD paper's grid (traces × policies × seeds) and write its table and figures.
    Experiment(experiment::Args),
    /// Scheduling throughput on scheduler_perf's shape: native vs Wasm, events off vs on.
    Bench(bench::Args),
    /// A scheduler on a real API server: fake GPU nodes, pods in a burst or at a rate; pods/s,
    /// creation → bound latency, requests per pod, CPU; `--binder` for the server's own ceiling.
    ClusterBench(cluster_bench::Args),
    /// Scheduling events: tail them, print their schema, measure publishing.
    #[command(subcommand)]
    Events(events_cmd::Command),
    /// Inspect plugins.
    #[command(subcommand)]
    Plugin(plugin_cmd::Command),
    /// Hot reload: pin, check and push policy sets; status, promote and rollback of a running
    /// scheduler; measure swaps.
    #[command(subcommand)]
    Policy(policy_cmd::Command),
    /// Schedule a Kubernetes cluster: pods whose `schedulerName` is ours are placed with the live
    /// policy set (kubeconfig or in-cluster credentials).
    Run(run_cmd::Args),
    /// Serve kube-scheduler's extender protocol (filter, prioritize, bind) with the live policy
    /// set, for clusters that keep kube-scheduler: GPU-aware filtering, topology-aware scoring and
    /// GPU-set selection, with the GPU ids written on the pod at bind.
    Extender(run_cmd::ExtenderArgs),
    /// Print the CustomResourceDefinitions (Queue, PodGroup, SchedulingPolicy) as YAML.
    Crds,
    /// Dynamic Resource Allocation (resource.k8s.io/v1) offline: which devices a claim would get.
    #[command(subcommand)]
    Dra(dra_cmd::Command),
    /// A node's GPU topology (from `nvidia-smi topo -m` or the agent's annotation), and which k
    /// GPUs a task would get on it, and why.
    Topo(topo_cmd::Args),
    /// Public GPU-cluster traces as replay scenarios (`wasmsched replay --scenario`).
    #[command(subcommand)]
    Convert(convert_cmd::Command),
    /// Your own cluster as a replay scenario: from the event stream it recorded, to compare
    /// policies on its real work (`wasmsched replay --scenario`).
    #[command(subcommand)]
    Scenario(scenario_cmd::Command),
    /// Usage accounting from the events: GPU-, CPU- and memory-hours per queue, namespace, GPU
    /// model or node pool over a window, lost GPU-hours, queueing delay, fair share.
    Usage(usage_cmd::Args),
}

/// mimalloc instead of glibc's malloc: the event drainer frees on its own thread what the
/// scheduling thread allocated, and glibc serialises such frees on the allocating thread's arena
/// lock, which cost the scheduling thread several percent of its throughput (BENCHMARKS.md, events).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    wasmsched_events::cli::end_on_panic();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("WASMSCHED_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: log files and `kubectl logs` get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let started = Instant::now();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate::run(args, started).context("simulate"),
        Command::Replay(args) => replay_cmd::run(args).context("replay"),
        Command::Experiment(args) => experiment::run(args).context("experiment"),
        Command::Bench(args) => bench::run(args).context("bench"),
        Command::ClusterBench(args) => cluster_bench::run(args).context("cluster-bench"),
        Command::Events(cmd) => events_cmd::run(cmd).context("events"),
        Command::Plugin(cmd) => plugin_cmd::run(cmd),
        Command::Policy(cmd) => policy_cmd::run(cmd).context("policy"),
        Command::Topo(args) => topo_cmd::run(args).context("topo"),
        Command::Usage(args) => usage_cmd::run(args).context("usage"),
        Command::Convert(cmd) => convert_cmd::run(cmd).context("convert"),
        Command::Scenario(cmd) => scenario_cmd::run(cmd).context("scenario"),
        Command::Dra(cmd) => dra_cmd::run(cmd).context("dra"),
        Command::Run(args) => run_cmd::run(args).context("run"),
        Command::Extender(args) => run_cmd::extender(args).context("extender"),
        Command::Crds => {
            print!("{}", wasmsched_kube::crd::crds_yaml());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", wasmsched_events::cli::error_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
