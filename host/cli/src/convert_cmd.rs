//! `wasmsched convert`: public GPU-cluster traces as replay scenarios (`docs/scenario.md`), so a
//! trace is replayed, edited (queues, weights, node counts) and compared like any scenario.

use std::path::PathBuf;

use anyhow::Context;
use wasmsched_sim::philly::{self, PhillyOptions};

/// The trace formats `convert` reads.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Microsoft's Philly job log (`cluster_job_log`, or a subset in its shape): real arrivals and
    /// run times of 1- to 128-GPU jobs; a job larger than a node becomes a gang of equal members.
    Philly(PhillyArgs),
}

/// Arguments of `convert philly`.
#[derive(clap::Args)]
pub struct PhillyArgs {
    /// The log: a JSON array of job records.
    log: PathBuf,
    /// Nodes of the replayed cluster.
    #[arg(long, default_value_t = 112)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// GPU model of the nodes.
    #[arg(long, default_value = "P100")]
    model: String,
    /// Spread the jobs over this many queues of equal weight (`q0`, `q1`, …) by a hash of their
    /// id, instead of one queue per virtual cluster (`vc`): for logs without teams.
    #[arg(long)]
    queues: Option<usize>,
    /// Write the scenario (JSON) here; default: standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    let Command::Philly(args) = cmd;
    let file = args.log.display().to_string();
    let text = std::fs::read_to_string(&args.log).with_context(|| format!("reading {file}"))?;
    let options =
        PhillyOptions { nodes: args.nodes, gpus_per_node: args.gpus_per_node, model: args.model, queues: args.queues };
    let (scenario, skipped) = philly::scenario(&file, &text, &options)?;
    if scenario.jobs.is_empty() {
        anyhow::bail!("{file}: no job could be converted ({} left out)", skipped.len());
    }
    for why in &skipped {
        tracing::warn!("left out: {why}");
    }
    let body = serde_json::to_string_pretty(&scenario)? + "\n";
    match &args.out {
        Some(path) => std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{body}"),
    }
    eprintln!(
        "{} jobs in {} queues on {} nodes of {} GPUs; {} records left out (WASMSCHED_LOG=warn lists them)",
        scenario.jobs.len(),
        scenario.queues.len(),
        scenario.nodes.len(),
        options.gpus_per_node,
        skipped.len()
    );
    Ok(())
}
