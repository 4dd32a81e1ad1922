//! The policy sets the commands run by name (`--policy fgd`, the queue cycle, …).
//!
//! Each is an ordinary policy-set document, the format an operator writes
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
use wasmsched_registry::{ArtifactRef, Fetched, PolicySetSpec, Preparer, Sample};
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

/// Score policies `simulate`, `replay` and `experiment` accept. `gpu-topology` needs nodes with a
/// known topology (replay scenarios with `topology` files); elsewhere it scores every node alike.
/// `domain-aware` is `fgd` under `domain-packing` (whole NVLink cliques and racks kept for gangs);
/// without levels (a scenario's `levels`, `run --topology-levels`) it is `fgd`.
pub const SCORE_POLICIES: [&str; 11] = [
    "random",
    "dot-prod",
    "gpu-clustering",
    "gpu-packing",
    "best-fit",
    "fgd",
    "fgd-cpu",
    "least-allocated",
    "most-allocated",
    "gpu-topology",
    "domain-aware",
];

/// Weight of `gpu-topology` against `most-allocated` in the `gpu-topology` policy set.
const TOPOLOGY_WEIGHT: u32 = 2;

/// Weight of `domain-packing` against `fgd` in the `domain-aware` set: which domain first, then
/// which node of it.
const DOMAIN_WEIGHT: u32 = 2;

/// The FGD paper's six policies, in its order.
pub const PAPER_POLICIES: [&str; 6] = ["random", "dot-prod", "gpu-clustering", "gpu-packing", "best-fit", "fgd"];

/// FGD with another fragmentation measure (`gpu-share-score`'s `usable`): `fgd-cpu`, and the
/// ablations of `docs/openb/fgd-cpu.md`, which `builtin_set` accepts beside [`SCORE_POLICIES`].
const FGD_MEASURES: [(&str, &str); 3] =
    [("fgd-cpu", "cpu-bounded"), ("fgd-copies", "copies"), ("fgd-cpu-copies", "cpu-bounded-copies")];

/// Fair-share policies the cycle accepts.
pub const FAIR_SHARE_POLICIES: [&str; 3] = ["proportion", "drf", "decayed-usage"];

/// What a built-in set is made of.
#[derive(Clone, Debug, Default)]
pub struct SetOptions<'a> {
    /// The score policy (one of [`SCORE_POLICIES`]); `None`: `most-allocated` without device
    /// selection, the queue cycle's placement.
    pub score: Option<&'a str>,
    /// Seed of `random`.
    pub seed: u64,
    /// `fgd`'s target workload.
    pub typical: &'a [TypicalPod],
    /// The fair-share stage (one of [`FAIR_SHARE_POLICIES`]), if any.
    pub fair_share: Option<&'a str>,
    /// Priority preemption.
    pub preempt: bool,
}

/// The built-in set `options` describe, as a policy-set document: `resource-fit`, then the score
/// policy (which also chooses the GPUs for the paper's policies and `gpu-topology`), then the
/// cycle's stages.
pub fn builtin_set(options: &SetOptions<'_>) -> anyhow::Result<String> {
    use std::fmt::Write;
    let score = options.score.unwrap_or("most-allocated");
    let fgd_measure = FGD_MEASURES.iter().find(|(name, _)| *name == score).map(|&(_, usable)| usable);
    if !SCORE_POLICIES.contains(&score) && fgd_measure.is_none() {
        bail!("unknown score policy {score:?}: use one of {}", SCORE_POLICIES.join(", "));
    }
    if let Some(share) = options.fair_share
        && !FAIR_SHARE_POLICIES.contains(&share)
    {
        bail!("unknown fair-share policy {share:?}: use {}", FAIR_SHARE_POLICIES.join(", "));
    }
    let domains = score == "domain-aware";
    // `domain-aware` is FGD's node choice under the domain score.
    let score = if domains { "fgd" } else { score };
    let config = match score {
        "random" => Some(serde_json::json!({ "policy": "random", "seed": options.seed }).to_string()),
        "fgd" => Some(serde_json::json!({ "policy": "fgd", "typical": options.typical }).to_string()),
        _ => fgd_measure.map(|usable| {
            serde_json::json!({ "policy": "fgd", "usable": usable, "typical": options.typical }).to_string()
        }),
    };
    // The ablations are `fgd` configured; `fgd-cpu` is a built-in of its own.
    let source = if fgd_measure.is_some() && score != "fgd-cpu" { "fgd" } else { score };
    let name = if domains { "domain-aware" } else { score };
    let mut doc = format!("name: {name}\nplugins:\n  resource-fit: {{ source: \"builtin:resource-fit\" }}\n");
    match config {
        // JSON is YAML: the configuration goes in as it is.
        Some(c) => writeln!(doc, "  {score}: {{ source: \"builtin:{source}\", config: {c} }}")?,
        None => writeln!(doc, "  {score}: {{ source: \"builtin:{source}\" }}")?,
    }
    let topology = score == "gpu-topology";
    if topology {
        doc.push_str("  most-allocated: { source: \"builtin:most-allocated\" }\n");
    }
    if domains {
        doc.push_str("  domain-packing: { source: \"builtin:domain-packing\" }\n");
    }
    if let Some(share) = options.fair_share {
        writeln!(doc, "  {share}: {{ source: \"builtin:{share}\" }}")?;
    }
    if options.preempt {
        doc.push_str("  priority-preempt: { source: \"builtin:priority-preempt\" }\n");
    }
    doc.push_str("stages:\n");
    if topology {
        // Filter (NUMA policy), score and device selection from one plugin. Topology only ranks
        // nodes for multi-GPU tasks; bin packing (most-allocated) breaks its ties and places
        // single-GPU tasks, so they fill partly used nodes instead of breaking up whole ones.
        writeln!(doc, "  filter: [resource-fit, {score}]")?;
        writeln!(
            doc,
            "  score: [{{ plugin: {score}, weight: {TOPOLOGY_WEIGHT} }}, {{ plugin: most-allocated, weight: 1 }}]"
        )?;
    } else if domains {
        doc.push_str("  filter: [resource-fit]\n");
        writeln!(
            doc,
            "  score: [{{ plugin: domain-packing, weight: {DOMAIN_WEIGHT} }}, {{ plugin: {score}, weight: 1 }}]"
        )?;
    } else {
        doc.push_str("  filter: [resource-fit]\n");
        writeln!(doc, "  score: [{{ plugin: {score}, weight: 1 }}]")?;
    }
    if topology || PAPER_POLICIES.contains(&score) || fgd_measure.is_some() {
        writeln!(doc, "  select_devices: {score}")?;
    }
    if options.preempt {
        doc.push_str("  preempt: priority-preempt\n");
    }
    if let Some(share) = options.fair_share {
        writeln!(doc, "  fair_share: {share}")?;
    }
    Ok(doc)
}

/// Load `document` (a policy set naming built-ins only) as version 1: through the registry's
/// [`Preparer`] on `runtime`, or natively when `runtime` is `None`. Its smoke test has no sample
/// ([`Sample::none`]): a replay starts from the plugins' initial state, so a seeded `random`
/// draws the same numbers every run.
pub fn load_set(runtime: Option<&Arc<Runtime>>, document: &str) -> anyhow::Result<PolicySet> {
    let spec = PolicySetSpec::parse("built-in", document)?;
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

/// The native plugin of built-in `name`, registered under that name.
fn native(name: &str, config: &str) -> anyhow::Result<Arc<dyn PolicyPlugin>> {
    let msg = anyhow::Error::msg;
    Ok(match name {
        "resource-fit" => Arc::new(NativePlugin::<ResourceFit>::new(config, 1).map_err(msg)?),
        "node-affinity" => {
            Arc::new(NativePlugin::<wasmsched_plugin_node_affinity::NodeAffinityScore>::new(config, 1).map_err(msg)?)
        }
        "gpu-topology" => Arc::new(NativePlugin::<GpuTopology>::new(config, 1).map_err(msg)?),
        "domain-packing" => {
            Arc::new(NativePlugin::<wasmsched_plugin_domain_packing::DomainPacking>::new(config, 1).map_err(msg)?)
        }
        "proportion" | "drf" | "decayed-usage" => Arc::new(
            NativePlugin::<wasmsched_plugin_fair_share::FairSharePolicy>::new(config, 1).map_err(msg)?.named(name),
        ),
        "priority-preempt" => {
            Arc::new(NativePlugin::<wasmsched_plugin_priority_preempt::PriorityPreempt>::new(config, 1).map_err(msg)?)
        }
        "least-allocated" | "most-allocated" => {
            Arc::new(NativePlugin::<AllocationScore>::new(config, 1).map_err(msg)?.named(name))
        }
        _ if PAPER_POLICIES.contains(&name) || name == "fgd-cpu" => {
            Arc::new(NativePlugin::<GpuShareScore>::new(config, 1).map_err(msg)?.named(name))
        }
        other => bail!("no native build of built-in {other:?}"),
    })
}

/// The full cycle's policies: `resource-fit`, `most-allocated`, the `fair_share` built-in
/// (`proportion`, `drf` or `decayed-usage`) and `priority-preempt`, from `runtime` or native.
pub fn cycle_policy_set(runtime: Option<&Arc<Runtime>>, fair_share: &str) -> anyhow::Result<PolicySet> {
    let options = SetOptions { fair_share: Some(fair_share), preempt: true, ..SetOptions::default() };
    load_set(runtime, &builtin_set(&options)?)
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
    load_set(runtime, &builtin_set(&SetOptions { score: Some(score), seed, typical, ..SetOptions::default() })?)
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
    load_set(runtime, &builtin_set(&options)?)
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
        for score in SCORE_POLICIES.into_iter().chain(FGD_MEASURES.map(|(name, _)| name)) {
            let options =
                SetOptions { score: Some(score), seed: 3, typical: &typical, fair_share: Some("drf"), preempt: true };
            let doc = builtin_set(&options).unwrap();
            let spec = PolicySetSpec::parse("t", &doc).unwrap_or_else(|e| panic!("{score}: {e}\n{doc}"));
            let first = if score == "domain-aware" { "domain-packing" } else { score };
            assert_eq!(spec.stages.score[0].plugin, first);
            assert_eq!(
                spec.stages.select_devices.is_some(),
                PAPER_POLICIES.contains(&score)
                    || ["gpu-topology", "domain-aware"].contains(&score)
                    || score.starts_with("fgd-")
            );
            let wasm = load_set(Some(&runtime), &doc).unwrap();
            let native = load_set(None, &doc).unwrap();
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
