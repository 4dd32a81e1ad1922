//! `wasmsched topo`: a node's parsed topology, and which `k` GPUs the scheduler would give a task
//! on it, and why.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::json;
use wasmsched_topology::annotation::{self, from_annotation, to_annotation};
use wasmsched_topology::{CpuSet, LinkCosts, NodeTopology, NumaPolicy, Prepared, pinning, smi};

/// Arguments of `wasmsched topo`.
#[derive(clap::Args)]
pub struct Args {
    /// `nvidia-smi topo -m` output, or what the agent wrote: the topology annotation's value,
    /// its `annotations.json`, or the report `wasmsched-agent discover` prints; `-` reads stdin.
    /// Exit status 1 when no set of `-k` GPUs fits.
    file: PathBuf,
    /// Choose this many GPUs (without it, show the topology).
    #[arg(short = 'k', long)]
    gpus: Option<u32>,
    /// Free GPUs as a list (`0-3,6`); default all.
    #[arg(long)]
    free: Option<String>,
    /// NUMA policy: none, best-effort, restricted, single-numa-node.
    #[arg(long, default_value = "best-effort")]
    policy: String,
    /// Runner-up sets to show, each with the key it loses on.
    #[arg(long, default_value_t = 3)]
    alternatives: usize,
    /// Link costs (JSON; fields of `LinkCosts`, missing ones keep their defaults).
    #[arg(long)]
    costs: Option<PathBuf>,
    /// Bandwidth that scores 100, in GB/s.
    #[arg(long, default_value_t = 900.0)]
    reference_gbps: f64,
    /// Also pin this many CPUs next to the chosen GPUs and print the `numactl` line.
    #[arg(long, value_name = "N")]
    cpus: Option<usize>,
    /// The host's `numactl --hardware` output (default: NUMA nodes from the topology's CPU affinity).
    #[arg(long, value_name = "FILE", requires = "cpus")]
    numactl: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let topology = if text.trim_start().starts_with('{') {
        from_annotation(&annotation_value(&text)?).context("parsing the topology annotation")?
    } else {
        smi::parse(&text).context("parsing nvidia-smi topo -m output")?
    };
    let costs = match &args.costs {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let costs: LinkCosts =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            costs.validate().map_err(anyhow::Error::msg)?;
            costs
        }
        None => LinkCosts::default(),
    };
    match args.gpus {
        None => show(&topology, &costs, args.json),
        Some(k) => choose(&topology, &costs, k, &args),
    }
}

/// The topology annotation's value out of any of the agent's JSON outputs: the `discover` report
/// (`{"annotations": {KEY: {…}}}`), `annotations.json` (`{KEY: "…"}`), or the value itself.
fn annotation_value(text: &str) -> anyhow::Result<String> {
    let doc: serde_json::Value = serde_json::from_str(text).context("parsing JSON")?;
    let value = match doc.get("annotations") {
        Some(annotations) => annotations.get(annotation::TOPOLOGY_ANNOTATION),
        None => doc.get(annotation::TOPOLOGY_ANNOTATION),
    };
    Ok(match value {
        Some(serde_json::Value::String(inner)) => inner.clone(),
        Some(object) => object.to_string(),
        None => text.to_string(),
    })
}

fn show(topology: &NodeTopology, costs: &LinkCosts, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        let doc = json!({
            "topology": serde_json::from_str::<serde_json::Value>(&to_annotation(topology))?,
            "labels": annotation::labels(topology),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", topology.render(costs));
        for (key, value) in annotation::labels(topology) {
            println!("label {key}={value}");
        }
    }
    Ok(())
}

fn choose(topology: &NodeTopology, costs: &LinkCosts, k: u32, args: &Args) -> anyhow::Result<()> {
    let Some(policy) = NumaPolicy::parse(&args.policy) else {
        bail!("unknown NUMA policy `{}` (none, best-effort, restricted, single-numa-node)", args.policy);
    };
    let prepared = Prepared::new(topology, costs);
    let free = match &args.free {
        None => prepared.all(),
        Some(list) => {
            let set = CpuSet::parse(list).map_err(|e| anyhow::anyhow!("--free: {}", e.replace("CPU", "GPU")))?;
            let mut mask = 0u64;
            for gpu in set.iter() {
                if gpu as usize >= topology.len() {
                    bail!("--free names GPU {gpu}, the node has {} GPUs", topology.len());
                }
                mask |= 1 << gpu;
            }
            mask
        }
    };
    let reference = (args.reference_gbps * 1000.0).round().clamp(1.0, f64::from(u32::MAX)) as u32;
    let choice = prepared.select(free, k, policy);
    // Runner-ups come from the exhaustive ranking, which also shows the two agree.
    let ranked = prepared.ranked(free, k, policy);
    let not_ranked = match &ranked {
        Err(e @ wasmsched_topology::Unsatisfiable::TooManyToRank(_)) => Some(e.to_string()),
        _ => None,
    };
    let ranked = ranked.ok();
    let alternatives: Vec<_> = ranked
        .iter()
        .flatten()
        .skip(1)
        .take(args.alternatives)
        .map(|alt| {
            let loses_on = choice.as_ref().ok().and_then(|c| c.decided_by(alt, policy));
            (alt.clone(), loses_on)
        })
        .collect();
    let score = prepared.score(free, k, policy, reference);
    let pinning = match (&choice, args.cpus) {
        (Ok(c), Some(count)) => {
            let numa = match &args.numactl {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                    pinning::parse_numactl(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                }
                None => pinning::numa_from_topology(topology),
            };
            let plan = pinning::plan(topology, &numa, &c.gpus, count, &CpuSet::default())
                .map_err(|e| anyhow::anyhow!("pinning {count} CPUs: {e}"))?;
            Some(plan.numactl(&["<command>"]))
        }
        _ => None,
    };
    if args.json {
        let doc = json!({
            "request": {"gpus": k, "policy": policy.as_str(), "free": bits(free)},
            "choice": choice.as_ref().ok(),
            "unsatisfiable": choice.as_ref().err().map(ToString::to_string),
            "score": score,
            "candidates": ranked.as_ref().map(Vec::len),
            "alternatives": alternatives.iter().map(|(c, why)| json!({"choice": c, "loses_on": why})).collect::<Vec<_>>(),
            "numactl": pinning,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return unsatisfied(k, &choice);
    }
    println!("request  {k} GPUs, NUMA policy {}, free {:?}", policy.as_str(), bits(free));
    match &choice {
        Ok(c) => {
            println!("choose   {c}");
            if let Some(score) = score {
                println!("score    {score}/100 (node ranking)");
            }
            if let Some(line) = &pinning {
                println!("pin      {}", line.join(" "));
            }
            if let Some(why) = &not_ranked {
                println!("(runner-ups not shown: {why})");
            }
            if let Some(ranked) = &ranked {
                println!("out of   {} admissible sets", ranked.len());
            }
            for (alt, why) in &alternatives {
                println!("  not    {alt}\n         loses on {}", why.unwrap_or("nothing (identical)"));
            }
        }
        Err(e) => println!("none     {e}"),
    }
    unsatisfied(k, &choice)
}

/// A request no set satisfies is answered (above) and then fails: scripts see it in the exit status.
fn unsatisfied<T>(k: u32, choice: &Result<T, wasmsched_topology::Unsatisfiable>) -> anyhow::Result<()> {
    match choice {
        Ok(_) => Ok(()),
        Err(e) => bail!("no {k} GPUs fit: {e}"),
    }
}

fn bits(mask: u64) -> Vec<u32> {
    (0..64).filter(|i| mask >> i & 1 == 1).collect()
}
