//! Build the policy set the commands run, from built-in plugins, as Wasm or native.

use std::sync::Arc;

use anyhow::{Context, bail};
use wasmsched_core::{NativePlugin, PolicyPlugin, PolicySet};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_gpu_share_score::{GpuShareScore, TypicalPod};
use wasmsched_plugin_gpu_topology::GpuTopology;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_plugins::BuiltIn;
use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig};

/// The Wasm runtime for replays, or none with `--native`. Fuel, not wall-clock time, bounds
/// plugins here, so a replay is reproducible on any machine.
pub fn replay_runtime(native: bool) -> anyhow::Result<Option<Runtime>> {
    (!native)
        .then(|| Runtime::new(RuntimeConfig { deterministic: true, ..runtime_config() }))
        .transpose()
        .context("starting the Wasm runtime")
}

/// The runtime configuration of every command: compiled components are cached on disk (keyed by
/// the component's sha256 and the engine, verified on load) so a command does not recompile the
/// built-in policies every time it starts. `WASMSCHED_CACHE_DIR` chooses the directory (`off`
/// disables the cache); the default is `$XDG_CACHE_HOME/wasmsched` or `~/.cache/wasmsched`.
pub fn runtime_config() -> RuntimeConfig {
    RuntimeConfig { cache_dir: cache_dir(), ..RuntimeConfig::default() }
}

/// The cache directory, if one is configured and can be created: a cache that cannot be used only
/// costs compile time, it never stops a command.
fn cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = match std::env::var_os("WASMSCHED_CACHE_DIR") {
        Some(dir) if dir == "off" || dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("wasmsched")),
    }?;
    match std::fs::create_dir_all(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no compiled-component cache");
            None
        }
    }
}

/// Score policies `simulate`, `replay` and `experiment` accept. `gpu-topology` needs nodes with a
/// known topology (replay scenarios with `topology` files); elsewhere it scores every node alike.
pub const SCORE_POLICIES: [&str; 9] = [
    "random",
    "dot-prod",
    "gpu-clustering",
    "gpu-packing",
    "best-fit",
    "fgd",
    "least-allocated",
    "most-allocated",
    "gpu-topology",
];

/// Weight of `gpu-topology` against `most-allocated` in the `gpu-topology` policy set.
const TOPOLOGY_WEIGHT: u32 = 2;

/// The FGD paper's six policies, in its order.
pub const PAPER_POLICIES: [&str; 6] = ["random", "dot-prod", "gpu-clustering", "gpu-packing", "best-fit", "fgd"];

fn load(runtime: Option<&Runtime>, builtin: BuiltIn, config: &str) -> anyhow::Result<Arc<dyn PolicyPlugin>> {
    let name = builtin.name;
    Ok(match runtime {
        Some(rt) => Arc::new(
            rt.load(builtin.wasm, PluginConfig::new(name).with_config(config))
                .with_context(|| format!("loading {name}"))?,
        ),
        None if name == wasmsched_plugins::RESOURCE_FIT.name => {
            Arc::new(NativePlugin::<ResourceFit>::new(config, 1).map_err(anyhow::Error::msg)?)
        }
        None if name == wasmsched_plugins::NODE_AFFINITY.name => Arc::new(
            NativePlugin::<wasmsched_plugin_node_affinity::NodeAffinityScore>::new(config, 1)
                .map_err(anyhow::Error::msg)?,
        ),
        None if name == wasmsched_plugins::GPU_TOPOLOGY.name => {
            Arc::new(NativePlugin::<GpuTopology>::new(config, 1).map_err(anyhow::Error::msg)?)
        }
        None if [
            wasmsched_plugins::PROPORTION.name,
            wasmsched_plugins::DRF.name,
            wasmsched_plugins::DECAYED_USAGE.name,
        ]
        .contains(&name) =>
        {
            Arc::new(
                NativePlugin::<wasmsched_plugin_fair_share::FairSharePolicy>::new(config, 1)
                    .map_err(anyhow::Error::msg)?
                    .named(name),
            )
        }
        None if name == wasmsched_plugins::PRIORITY_PREEMPT.name => Arc::new(
            NativePlugin::<wasmsched_plugin_priority_preempt::PriorityPreempt>::new(config, 1)
                .map_err(anyhow::Error::msg)?,
        ),
        None if builtin.name.ends_with("-allocated") => {
            Arc::new(NativePlugin::<AllocationScore>::new(config, 1).map_err(anyhow::Error::msg)?.named(name))
        }
        None => Arc::new(NativePlugin::<GpuShareScore>::new(config, 1).map_err(anyhow::Error::msg)?.named(name)),
    })
}

/// The full cycle's policies: `resource-fit`, `most-allocated`, the `fair_share` built-in
/// (`proportion`, `drf` or `decayed-usage`) and `priority-preempt`, from `runtime` or native.
pub fn cycle_policy_set(runtime: Option<&Runtime>, fair_share: BuiltIn) -> anyhow::Result<PolicySet> {
    Ok(PolicySet::builder()
        .filter(load(runtime, wasmsched_plugins::RESOURCE_FIT, "")?)
        .score(load(runtime, wasmsched_plugins::MOST_ALLOCATED, wasmsched_plugins::MOST_ALLOCATED.config)?, 1)
        .fair_share(load(runtime, fair_share, fair_share.config)?)
        .preempt(load(runtime, wasmsched_plugins::PRIORITY_PREEMPT, "")?)
        .version(1)
        .build())
}

/// `resource-fit` then the score policy `score`, from `runtime` (Wasm) or native when `runtime`
/// is `None`. The paper's policies also choose the GPUs; `seed` seeds `random`, `typical` is
/// `fgd`'s target workload.
pub fn policy_set(
    runtime: Option<&Runtime>,
    score: &str,
    seed: u64,
    typical: &[TypicalPod],
) -> anyhow::Result<PolicySet> {
    Ok(placement_stages(runtime, score, seed, typical)?.build())
}

/// [`policy_set`] plus the cycle's stages: fair share `fair_share` (by name) and, when `preempt`,
/// priority preemption — what the time-driven replay runs (as version 1).
pub fn replay_policy_set(
    runtime: Option<&Runtime>,
    score: &str,
    seed: u64,
    typical: &[TypicalPod],
    fair_share: &str,
    preempt: bool,
) -> anyhow::Result<PolicySet> {
    let Some(share) = [wasmsched_plugins::PROPORTION, wasmsched_plugins::DRF, wasmsched_plugins::DECAYED_USAGE]
        .into_iter()
        .find(|b| b.name == fair_share)
    else {
        bail!("unknown fair-share policy {fair_share:?}: use proportion, drf or decayed-usage");
    };
    let mut set = placement_stages(runtime, score, seed, typical)?.fair_share(load(runtime, share, share.config)?);
    if preempt {
        set = set.preempt(load(runtime, wasmsched_plugins::PRIORITY_PREEMPT, "")?);
    }
    Ok(set.version(1).build())
}

/// Filter, score and device stages of [`policy_set`].
fn placement_stages(
    runtime: Option<&Runtime>,
    score: &str,
    seed: u64,
    typical: &[TypicalPod],
) -> anyhow::Result<wasmsched_core::PolicySetBuilder> {
    let Some(builtin) = wasmsched_plugins::by_name(score).filter(|b| SCORE_POLICIES.contains(&b.name)) else {
        bail!("unknown score policy {score:?}: use one of {}", SCORE_POLICIES.join(", "));
    };
    let config = match score {
        "random" => serde_json::json!({ "policy": "random", "seed": seed }).to_string(),
        "fgd" => serde_json::json!({ "policy": "fgd", "typical": typical }).to_string(),
        _ => builtin.config.to_string(),
    };
    let fit = load(runtime, wasmsched_plugins::RESOURCE_FIT, "")?;
    let scorer = load(runtime, builtin, &config)?;
    if score == wasmsched_plugins::GPU_TOPOLOGY.name {
        // Filter (NUMA policy), score and device selection from one instance pool. Topology only
        // ranks nodes for multi-GPU tasks; bin packing (most-allocated) breaks its ties and places
        // single-GPU tasks, so they fill partly used nodes instead of breaking up whole ones.
        let packing = load(runtime, wasmsched_plugins::MOST_ALLOCATED, wasmsched_plugins::MOST_ALLOCATED.config)?;
        return Ok(PolicySet::builder()
            .filter(fit)
            .filter(scorer.clone())
            .score(scorer.clone(), TOPOLOGY_WEIGHT)
            .score(packing, 1)
            .devices(scorer)
            .version(1));
    }
    let set = PolicySet::builder().filter(fit).score(scorer.clone(), 1).version(1);
    Ok(if PAPER_POLICIES.contains(&score) { set.devices(scorer) } else { set })
}
