//! The policy sets the commands run by name (`--policy fgd`, the queue cycle, …).
//!
//! Each is an ordinary policy set, the value an operator's document parses to
//! (`docs/hot-reload.md`), made from the command's options ([`builtin_set`]; `wasmsched policy
//! builtin NAME` prints it) and loaded through the registry's gates like any other set. With
//! `--native` the same document's plugins are the plugin crates linked into this binary: the
//! benchmark baseline and the differential oracle.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, bail};
use wasmsched_api::fragmentation::TypicalPod;
use wasmsched_core::{NativePlugin, PolicyPlugin, PolicySet};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_gpu_share_score::GpuShareScore;
use wasmsched_plugin_gpu_topology::GpuTopology;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_plugins::Role;
use wasmsched_registry::{ArtifactRef, Fetched, PluginSpec, PolicySetSpec, Preparer, Sample, Stages, Weighted};
use wasmsched_runtime::{Runtime, RuntimeConfig};

/// The Wasm runtime for replays, or none with `--native`. Fuel, not wall-clock time, bounds
/// plugins here, so a replay is reproducible on any machine.
pub fn replay_runtime(native: bool) -> anyhow::Result<Option<Arc<Runtime>>> {
    (!native)
        .then(|| Runtime::new(RuntimeConfig { deterministic: true, ..runtime_config() }).map(Arc::new))
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

/// The components this binary carries, as the policy registry's `builtin:` table.
pub fn builtins() -> wasmsched_registry::BuiltIns {
    wasmsched_plugins::table().collect()
}

/// Score policies `simulate`, `replay` and `experiment` accept: every built-in score (the plugin
/// table's), and `domain-aware`, which is `fgd` under `domain-packing` (whole NVLink cliques and
/// racks kept for gangs; without levels — a scenario's `levels`, `run --topology-levels` — it is
/// `fgd`). `gpu-topology` needs nodes with a known topology (replay scenarios with `topology`
/// files); elsewhere it scores every node alike.
pub fn score_policies() -> Vec<&'static str> {
    wasmsched_plugins::named(Role::Score).chain([DOMAIN_AWARE]).collect()
}

/// The set made of `fgd` under `domain-packing`.
const DOMAIN_AWARE: &str = "domain-aware";

/// Weight of `gpu-topology` against `most-allocated` in the `gpu-topology` policy set.
const TOPOLOGY_WEIGHT: u32 = 2;

/// Weight of `domain-packing` against `fgd` in the `domain-aware` set: which domain first, then
/// which node of it.
const DOMAIN_WEIGHT: u32 = 2;

/// The FGD paper's six policies, in its order (the plugin table's).
pub const PAPER_POLICIES: [&str; 6] = {
    let mut names = [""; 6];
    let mut i = 0;
    while i < names.len() {
        names[i] = wasmsched_plugins::PAPER[i].name;
        i += 1;
    }
    names
};

/// FGD with another fragmentation measure (`gpu-share-score`'s `usable`): the ablations of
/// `docs/openb/fgd-cpu.md`, which `builtin_set` accepts beside [`score_policies`] (`fgd-cpu` is
/// also a built-in of its own).
const FGD_MEASURES: [(&str, &str); 3] =
    [("fgd-cpu", "cpu-bounded"), ("fgd-copies", "copies"), ("fgd-cpu-copies", "cpu-bounded-copies")];

/// What a built-in set is made of.
#[derive(Clone, Debug, Default)]
pub struct SetOptions<'a> {
    /// The score policy (one of [`score_policies`]); `None`: `most-allocated` without device
    /// selection, the queue cycle's placement.
    pub score: Option<&'a str>,
    /// Seed of `random`.
    pub seed: u64,
    /// `fgd`'s target workload.
    pub typical: &'a [TypicalPod],
    /// The fair-share stage (a built-in fair-share policy), if any.
    pub fair_share: Option<&'a str>,
    /// Priority preemption.
    pub preempt: bool,
}

/// The built-in set `options` describe: `resource-fit`, then the score policy (which also chooses
/// the GPUs for the paper's policies and `gpu-topology`), then the cycle's stages. A value, the
/// same an operator's document parses to (`wasmsched policy builtin NAME` prints it).
pub fn builtin_set(options: &SetOptions<'_>) -> anyhow::Result<PolicySetSpec> {
    let score = options.score.unwrap_or("most-allocated");
    let fgd_measure = FGD_MEASURES.iter().find(|(name, _)| *name == score).map(|&(_, usable)| usable);
    let scores = score_policies();
    if !scores.contains(&score) && fgd_measure.is_none() {
        bail!("unknown score policy {score:?}: use one of {}", scores.join(", "));
    }
    if let Some(share) = options.fair_share {
        let shares: Vec<&str> = wasmsched_plugins::named(Role::FairShare).collect();
        if !shares.contains(&share) {
            bail!("unknown fair-share policy {share:?}: use {}", shares.join(", "));
        }
    }
    let domains = score == DOMAIN_AWARE;
    // `domain-aware` is FGD's node choice under the domain score.
    let score = if domains { "fgd" } else { score };
    let config = match score {
        "random" => Some(serde_json::json!({ "policy": "random", "seed": options.seed })),
        "fgd" => Some(serde_json::json!({ "policy": "fgd", "typical": options.typical })),
        _ => fgd_measure
            .map(|usable| serde_json::json!({ "policy": "fgd", "usable": usable, "typical": options.typical })),
    };
    // The ablations are `fgd` configured; `fgd-cpu` is a built-in of its own.
    let source = if fgd_measure.is_some() && score != "fgd-cpu" { "fgd" } else { score };
    let builtin = |name: &str| PluginSpec::new(format!("builtin:{name}"));
    let weighted = |plugin: &str, weight: u32| Weighted { plugin: plugin.into(), weight };
    let mut plugins = BTreeMap::from([("resource-fit".to_string(), builtin("resource-fit"))]);
    let mut scorer = builtin(source);
    scorer.config = config.map(serde_yaml_ng::to_value).transpose()?;
    plugins.insert(score.to_string(), scorer);
    let topology = score == "gpu-topology";
    let mut stages = Stages { filter: vec!["resource-fit".into()], ..Stages::default() };
    if topology {
        // Filter (NUMA policy), score and device selection from one plugin. Topology only ranks
        // nodes for multi-GPU tasks; bin packing (most-allocated) breaks its ties and places
        // single-GPU tasks, so they fill partly used nodes instead of breaking up whole ones.
        plugins.insert("most-allocated".into(), builtin("most-allocated"));
        stages.filter.push(score.into());
        stages.score = vec![weighted(score, TOPOLOGY_WEIGHT), weighted("most-allocated", 1)];
    } else if domains {
        plugins.insert("domain-packing".into(), builtin("domain-packing"));
        stages.score = vec![weighted("domain-packing", DOMAIN_WEIGHT), weighted(score, 1)];
    } else {
        stages.score = vec![weighted(score, 1)];
    }
    if topology || PAPER_POLICIES.contains(&score) || fgd_measure.is_some() {
        stages.select_devices = Some(score.into());
    }
    if options.preempt {
        plugins.insert("priority-preempt".into(), builtin("priority-preempt"));
        stages.preempt = Some("priority-preempt".into());
    }
    if let Some(share) = options.fair_share {
        plugins.insert(share.into(), builtin(share));
        stages.fair_share = Some(share.into());
    }
    let name = if domains { DOMAIN_AWARE } else { score };
    let spec = PolicySetSpec {
        name: name.into(),
        plugins,
        stages,
        smoke: Default::default(),
        shadow: None,
        rollback: Default::default(),
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    Ok(spec)
}

/// Load `spec` (a policy set naming built-ins only) as version 1: through the registry's
/// [`Preparer`] on `runtime`, or natively when `runtime` is `None`. Its smoke test has no sample
/// ([`Sample::none`]): a replay starts from the plugins' initial state, so a seeded `random`
/// draws the same numbers every run.
pub fn load_set(runtime: Option<&Arc<Runtime>>, spec: PolicySetSpec) -> anyhow::Result<PolicySet> {
    let Some(runtime) = runtime else {
        return native_set(&spec);
    };
    let fetched = Fetched { spec, origin: "built-in".into(), artifacts: BTreeMap::new(), fingerprint: String::new() };
    let version = Preparer::new(runtime.clone(), builtins()).prepare(&fetched, 1, &Sample::none())?;
    Ok(version.set)
}

/// `spec`'s plugins as the native crates, assembled as the registry assembles a set (built-in
/// defaults resolved the way the registry resolves them).
fn native_set(spec: &PolicySetSpec) -> anyhow::Result<PolicySet> {
    let mut spec = spec.clone();
    spec.resolve_builtins(&builtins())?;
    let mut plugins: BTreeMap<&str, Arc<dyn PolicyPlugin>> = BTreeMap::new();
    for (name, p) in &spec.plugins {
        let ArtifactRef::BuiltIn(builtin) = ArtifactRef::parse(&p.source).map_err(anyhow::Error::msg)? else {
            bail!("plugin {name}: only built-ins run natively");
        };
        let config = spec.config_text(name).unwrap_or_default();
        plugins.insert(name, native(&builtin, &config).with_context(|| format!("plugin {name}"))?);
    }
    Ok(wasmsched_registry::build_set(&spec, 1, &plugins))
}

/// The native plugin of built-in `name` — the crate its component is built from — registered
/// under that name.
fn native(name: &str, config: &str) -> anyhow::Result<Arc<dyn PolicyPlugin>> {
    use wasmsched_plugins::Source;
    let Some(builtin) = wasmsched_plugins::by_name(name) else { bail!("no built-in {name:?}") };
    let msg = anyhow::Error::msg;
    Ok(match builtin.source {
        Source::ResourceFit => Arc::new(NativePlugin::<ResourceFit>::new(config, 1).map_err(msg)?),
        Source::NodeAffinity => {
            Arc::new(NativePlugin::<wasmsched_plugin_node_affinity::NodeAffinityScore>::new(config, 1).map_err(msg)?)
        }
        Source::GpuTopology => Arc::new(NativePlugin::<GpuTopology>::new(config, 1).map_err(msg)?),
        Source::DomainPacking => {
            Arc::new(NativePlugin::<wasmsched_plugin_domain_packing::DomainPacking>::new(config, 1).map_err(msg)?)
        }
        Source::FairShare => Arc::new(
            NativePlugin::<wasmsched_plugin_fair_share::FairSharePolicy>::new(config, 1).map_err(msg)?.named(name),
        ),
        Source::PriorityPreempt => {
            Arc::new(NativePlugin::<wasmsched_plugin_priority_preempt::PriorityPreempt>::new(config, 1).map_err(msg)?)
        }
        Source::AllocationScore => Arc::new(NativePlugin::<AllocationScore>::new(config, 1).map_err(msg)?.named(name)),
        Source::GpuShareScore => Arc::new(NativePlugin::<GpuShareScore>::new(config, 1).map_err(msg)?.named(name)),
    })
}

/// The full cycle's policies: `resource-fit`, `most-allocated`, the `fair_share` built-in
/// (`proportion`, `drf` or `decayed-usage`) and `priority-preempt`, from `runtime` or native.
pub fn cycle_policy_set(runtime: Option<&Arc<Runtime>>, fair_share: &str) -> anyhow::Result<PolicySet> {
    let options = SetOptions { fair_share: Some(fair_share), preempt: true, ..SetOptions::default() };
    load_set(runtime, builtin_set(&options)?)
}

/// `resource-fit` then the score policy `score`, from `runtime` (Wasm) or native when `runtime`
/// is `None`. The paper's policies also choose the GPUs; `seed` seeds `random`, `typical` is
/// `fgd`'s target workload.
pub fn policy_set(
    runtime: Option<&Arc<Runtime>>,
    score: &str,
    seed: u64,
    typical: &[TypicalPod],
) -> anyhow::Result<PolicySet> {
    load_set(runtime, builtin_set(&SetOptions { score: Some(score), seed, typical, ..SetOptions::default() })?)
}

/// [`policy_set`] plus the cycle's stages: fair share `fair_share` (by name) and, when `preempt`,
/// priority preemption — what the time-driven replay runs (as version 1).
pub fn replay_policy_set(
    runtime: Option<&Arc<Runtime>>,
    score: &str,
    seed: u64,
    typical: &[TypicalPod],
    fair_share: &str,
    preempt: bool,
) -> anyhow::Result<PolicySet> {
    let options = SetOptions { score: Some(score), seed, typical, fair_share: Some(fair_share), preempt };
    load_set(runtime, builtin_set(&options)?)
}

#[cfg(test)]
mod tests {
    use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources, Task};
    use wasmsched_core::{NodeTable, place};

    use super::*;

    fn cluster() -> NodeTable {
        let mut nodes = NodeTable::new();
        for (i, (gpus, used)) in [(8u32, 0u32), (8, 3), (4, 1), (2, 0)].into_iter().enumerate() {
            nodes.upsert(Node {
                name: format!("n{i}"),
                allocatable: Resources {
                    cpu_milli: 64_000,
                    memory_bytes: 256 << 30,
                    gpu_milli: u64::from(gpus) * 1000,
                    extended: Default::default(),
                },
                gpus: (0..gpus)
                    .map(|g| GpuDevice {
                        index: g,
                        free_milli: if g < used { 400 } else { 1000 },
                        model: "A100".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
        }
        nodes
    }

    fn task(id: &str, count: u32, milli: u32) -> Task {
        Task {
            id: id.into(),
            request: Resources { cpu_milli: 2_000, memory_bytes: 8 << 30, ..Default::default() },
            gpu: GpuRequest { count, milli_per_gpu: milli, ..Default::default() },
            ..Default::default()
        }
    }

    /// Every built-in set is a valid document, and its Wasm and native loads place alike.
    #[test]
    fn every_builtin_set_loads_both_ways_and_places_alike() {
        let runtime =
            Arc::new(Runtime::new(RuntimeConfig { deterministic: true, ..RuntimeConfig::default() }).unwrap());
        let typical = [TypicalPod { cpu_milli: 2_000, milli: 1000, count: 1, models: vec![], weight: 1.0 }];
        let nodes = cluster();
        let tasks = [task("a", 1, 300), task("b", 2, 1000), task("c", 1, 1000), task("d", 0, 0)];
        for score in score_policies().into_iter().chain(FGD_MEASURES.map(|(name, _)| name)) {
            let options =
                SetOptions { score: Some(score), seed: 3, typical: &typical, fair_share: Some("drf"), preempt: true };
            // As `policy builtin` prints it, and as an operator's copy of that parses.
            let doc = serde_yaml_ng::to_string(&builtin_set(&options).unwrap()).unwrap();
            let spec = PolicySetSpec::parse("t", &doc).unwrap_or_else(|e| panic!("{score}: {e}\n{doc}"));
            assert_eq!(spec, builtin_set(&options).unwrap(), "{score}: printed and parsed back, the same set");
            let first = if score == "domain-aware" { "domain-packing" } else { score };
            assert_eq!(spec.stages.score[0].plugin, first);
            assert_eq!(
                spec.stages.select_devices.is_some(),
                PAPER_POLICIES.contains(&score)
                    || ["gpu-topology", "domain-aware"].contains(&score)
                    || score.starts_with("fgd-")
            );
            let wasm = load_set(Some(&runtime), spec.clone()).unwrap();
            let native = load_set(None, spec).unwrap();
            assert!(wasm.preempt().is_some() && wasm.fair_share().is_some());
            for t in &tasks {
                let (w, n) = (place(&wasm, &nodes, t, 0), place(&native, &nodes, t, 0));
                assert_eq!(w.map(|p| (p.node, p.devices)), n.map(|p| (p.node, p.devices)), "{score}, task {}", t.id);
            }
        }
    }

    #[test]
    fn unknown_names_are_refused_with_the_choices() {
        let err = builtin_set(&SetOptions { score: Some("fdg"), ..SetOptions::default() }).unwrap_err().to_string();
        assert!(err.contains("unknown score policy \"fdg\"") && err.contains("fgd"), "{err}");
        let options = SetOptions { fair_share: Some("fifo"), ..SetOptions::default() };
        let err = builtin_set(&options).unwrap_err().to_string();
        assert!(err.contains("proportion, drf, decayed-usage"), "{err}");
    }
}
