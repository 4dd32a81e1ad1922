//! Preparation, off the hot path: verify digests → compile (or load the cached artifact) →
//! instantiate every worker's instance → smoke test on a sample of the live cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmsched_api::{GPU_MILLI, GpuDevice, GpuRequest, Node, Resources, Stage, Task};
use wasmsched_core::{FaultKind, NodeTable, PolicyPlugin, PolicySet, place};
use wasmsched_events::schema::{PluginRef, PolicyLoaded, PolicySetRef, Stage as EventStage};
use wasmsched_runtime::{PluginConfig, PluginMetrics, Runtime, WasmPlugin};

use crate::BuiltIns;
use crate::error::PrepareError;
use crate::source::Fetched;
use crate::spec::{ArtifactRef, PolicySetSpec, digest_of};

/// One immutable, prepared version of a policy set: what a cycle takes at its start.
pub struct PolicyVersion {
    /// The set the core runs, stamped with [`PolicyVersion::version`].
    pub set: PolicySet,
    /// The specification it was built from.
    pub spec: PolicySetSpec,
    /// Monotonic version assigned by the registry.
    pub version: u64,
    /// Where it came from.
    pub origin: String,
    /// Content fingerprint (spec and artifacts).
    pub fingerprint: String,
    /// Its plugins: local name, stages served, digest.
    pub plugins: Vec<PluginInfo>,
    /// Time spent verifying, compiling, instantiating and smoke-testing.
    pub prepare_time: Duration,
}

impl std::fmt::Debug for PolicyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.spec.name, self.version)
    }
}

impl PolicyVersion {
    /// `name@version`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.spec.name, self.version)
    }

    /// How events name it.
    pub fn reference(&self) -> PolicySetRef {
        PolicySetRef { name: self.spec.name.clone(), version: self.version }
    }

    /// The data of its `io.wasmsched.policy.loaded.v1` event.
    pub fn loaded(&self) -> PolicyLoaded {
        PolicyLoaded {
            policy_set: self.reference(),
            plugins: self
                .plugins
                .iter()
                .map(|p| PluginRef {
                    name: p.name.clone(),
                    stages: p.stages.iter().map(|s| event_stage(*s)).collect(),
                    digest: p.digest.trim_start_matches("sha256:").to_string(),
                })
                .collect(),
            prepare_ms: self.prepare_time.as_millis() as u64,
        }
    }
}

fn event_stage(s: Stage) -> EventStage {
    match s {
        Stage::Filter => EventStage::Filter,
        Stage::Score => EventStage::Score,
        Stage::SelectDevices => EventStage::SelectDevices,
        Stage::Preempt => EventStage::Preempt,
        Stage::FairShare => EventStage::FairShare,
    }
}

/// A plugin of a prepared version.
#[derive(Clone, Debug)]
pub struct PluginInfo {
    /// Local name in the spec.
    pub name: String,
    /// Stages it serves in the set.
    pub stages: Vec<Stage>,
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// Its calls, faults and latencies since it was loaded, smoke test included (exporters read
    /// these). A kept plugin's are those of the plugin it kept.
    pub metrics: Arc<PluginMetrics>,
    /// The loaded plugin: what the set calls, and what a later version may keep.
    pub plugin: Arc<WasmPlugin>,
    /// The live version this plugin was kept from (same component, configuration and budgets),
    /// instances and mirrors included; `None`: loaded for this version.
    pub kept_from: Option<u64>,
}

impl PolicyVersion {
    /// Share `previous`'s filter verdicts for each filter that is the same component (digest)
    /// with the same configuration, so a swap does not make equal tasks ask every node again.
    pub fn inherit_verdicts(&mut self, previous: &PolicyVersion) {
        let identity = |v: &PolicyVersion, name: &str| -> Option<(String, String)> {
            v.spec.plugins.get(name).filter(|p| p.reuse_verdicts)?;
            let digest = v.plugins.iter().find(|p| p.name == name)?.digest.clone();
            Some((digest, v.spec.config_text(name).unwrap_or_default()))
        };
        for (i, name) in self.spec.stages.filter.iter().enumerate() {
            let Some(mine) = identity(self, name) else { continue };
            let same = previous.spec.stages.filter.iter().position(|n| identity(previous, n).as_ref() == Some(&mine));
            if let Some(j) = same {
                self.set.inherit_verdicts(i, &previous.set, j);
            }
        }
    }
}

/// A snapshot of the live cluster and recent tasks, for smoke tests.
#[derive(Clone)]
pub struct Sample {
    /// The nodes (a clone of the live table: placements on it bind nothing real).
    pub nodes: Arc<NodeTable>,
    /// Recent tasks.
    pub tasks: Vec<Task>,
}

impl Sample {
    /// No cluster and no tasks: the smoke test then only checks that the preemption and
    /// fair-share plugins answer, and places nothing. For a set that must start from its plugins'
    /// initial state: a replay that must be reproducible (a seeded `random` score draws from its
    /// generator on every call).
    pub fn none() -> Sample {
        Sample { nodes: Arc::new(NodeTable::new()), tasks: Vec::new() }
    }

    /// A small synthetic cluster (four 8-GPU nodes) and tasks of 0 to 8 GPUs, used before the
    /// scheduler has offered a real sample.
    pub fn synthetic() -> Sample {
        let mut nodes = NodeTable::new();
        for n in 0..4 {
            nodes.upsert(Node {
                name: format!("smoke-{n}"),
                allocatable: Resources {
                    cpu_milli: 96_000,
                    memory_bytes: 1 << 40,
                    gpu_milli: 8 * u64::from(GPU_MILLI),
                    extended: Default::default(),
                },
                gpus: (0..8).map(|i| GpuDevice { index: i, free_milli: GPU_MILLI, ..Default::default() }).collect(),
                ..Default::default()
            });
        }
        let tasks = [0u32, 1, 2, 4, 8, 1, 0, 2]
            .iter()
            .enumerate()
            .map(|(i, &gpus)| Task {
                id: format!("smoke-{i}"),
                queue: "default".into(),
                request: Resources { cpu_milli: 4_000, memory_bytes: 16 << 30, ..Default::default() },
                gpu: GpuRequest {
                    count: gpus,
                    milli_per_gpu: if gpus > 0 { GPU_MILLI } else { 0 },
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        Sample { nodes: Arc::new(nodes), tasks }
    }
}

/// Turns fetched versions into [`PolicyVersion`]s with one runtime (and its compiled-artifact
/// cache).
#[derive(Clone)]
pub struct Preparer {
    runtime: Arc<Runtime>,
    builtins: Arc<BuiltIns>,
    keep_unchanged: bool,
}

impl Preparer {
    /// Prepare with `runtime`, `builtin:` sources taken from `builtins`, keeping the live
    /// version's unchanged plugins ([`Preparer::prepare_beside`]).
    pub fn new(runtime: Arc<Runtime>, builtins: BuiltIns) -> Preparer {
        Preparer { runtime, builtins: Arc::new(builtins), keep_unchanged: true }
    }

    /// Load every plugin of every version anew, changed or not (`false`): fresh instances for
    /// all, at the cost of a cold swap (what `policy bench --reload-all` compares against).
    pub fn keep_unchanged(mut self, keep: bool) -> Preparer {
        self.keep_unchanged = keep;
        self
    }

    /// Every gate but the shadow run, every plugin loaded anew. On error everything built so far
    /// is dropped.
    pub fn prepare(&self, fetched: &Fetched, version: u64, sample: &Sample) -> Result<PolicyVersion, PrepareError> {
        self.prepare_beside(fetched, version, sample, None)
    }

    /// [`Preparer::prepare`], keeping each plugin of `live` that this version does not change
    /// (same component, configuration and budgets, healthy; [`WasmPlugin::can_stand_in_for`]):
    /// its warm instances and synced mirrors go live with the new version, so a swap costs only
    /// the plugins that changed. The smoke test never calls the live instances: a kept plugin
    /// is smoke-tested on a fresh load of its own (the sample is older than the live cluster,
    /// and a call on it would resend the sample to a live mirror and hold it while the loop
    /// waits). The live set is never touched.
    pub fn prepare_beside(
        &self,
        fetched: &Fetched,
        version: u64,
        sample: &Sample,
        live: Option<&PolicyVersion>,
    ) -> Result<PolicyVersion, PrepareError> {
        let started = Instant::now();
        let mut spec = fetched.spec.clone();
        spec.resolve_builtins(&self.builtins)?;
        let spec = &spec;
        // What the set calls, and what the smoke test calls instead (kept plugins only).
        let mut loaded: BTreeMap<&str, Arc<dyn PolicyPlugin>> = BTreeMap::new();
        let mut probes: BTreeMap<&str, Arc<dyn PolicyPlugin>> = BTreeMap::new();
        let mut plugins = Vec::new();
        for (name, p) in &spec.plugins {
            let load_err = |message: String| PrepareError::Load { plugin: name.clone(), message };
            let bytes: &[u8] = match ArtifactRef::parse(&p.source).map_err(load_err)? {
                ArtifactRef::BuiltIn(b) => self.builtins.get(&b).map_err(load_err)?.wasm,
                _ => fetched
                    .artifacts
                    .get(name)
                    .map(|b| &b[..])
                    .ok_or_else(|| load_err("artifact was not fetched".into()))?,
            };
            let actual = digest_of(bytes);
            if let Some(pinned) = &p.digest
                && *pinned != actual
            {
                return Err(PrepareError::Digest { plugin: name.clone(), pinned: pinned.clone(), actual });
            }
            let mut config = PluginConfig::new(name.as_str())
                .with_config(spec.config_text(name).unwrap_or_default())
                .with_failure_policy(p.failure.into());
            if let Some(d) = p.deadline() {
                config = config.with_deadline(d);
            }
            if let Some(mib) = p.memory_mib {
                config = config.with_memory_limit((mib as usize) << 20);
            }
            if let Some(fuel) = p.fuel {
                config = config.with_fuel(fuel);
            }
            let hex = actual.trim_start_matches("sha256:");
            let kept = live.filter(|_| self.keep_unchanged).and_then(|live| {
                let k = live.plugins.iter().find(|k| k.name == *name)?;
                k.plugin.can_stand_in_for(&self.runtime, hex, &config).then_some((k, live.version))
            });
            let plugin = Arc::new(self.runtime.load(bytes, config).map_err(|e| load_err(e.to_string()))?);
            let used = stages_of(spec, name);
            for stage in &used {
                if !plugin.stages().contains(stage) {
                    let implemented: Vec<_> = plugin.stages().iter().map(|s| s.as_str()).collect();
                    return Err(PrepareError::Stage {
                        plugin: name.clone(),
                        stage: stage.as_str().into(),
                        implemented: implemented.join(", "),
                    });
                }
            }
            let info = match kept {
                Some((k, from)) => {
                    probes.insert(name, plugin);
                    PluginInfo { stages: used, kept_from: Some(from), ..k.clone() }
                }
                None => {
                    plugin.prewarm().map_err(|e| load_err(e.to_string()))?;
                    PluginInfo {
                        name: name.clone(),
                        stages: used,
                        digest: actual,
                        metrics: plugin.metrics().clone(),
                        plugin,
                        kept_from: None,
                    }
                }
            };
            loaded.insert(name, info.plugin.clone());
            plugins.push(info);
        }

        let set = build_set(spec, version, &loaded);
        if probes.is_empty() {
            smoke_test(&set, spec, &loaded, sample)?;
        } else {
            let probed = loaded.iter().map(|(&n, p)| (n, probes.get(n).unwrap_or(p).clone())).collect();
            smoke_test(&build_set(spec, version, &probed), spec, &probed, sample)?;
            let kept: Vec<&str> = plugins.iter().filter(|p| p.kept_from.is_some()).map(|p| p.name.as_str()).collect();
            tracing::info!(set = %spec.name, version, kept = ?kept, "unchanged plugins kept from the live version");
        }
        Ok(PolicyVersion {
            set,
            spec: spec.clone(),
            version,
            origin: fetched.origin.clone(),
            fingerprint: fetched.fingerprint.clone(),
            plugins,
            prepare_time: started.elapsed(),
        })
    }
}

/// The set `spec` describes, over `loaded` (by local name; every plugin a stage names must be
/// there). The registry assembles every version this way; a binary that runs a spec's plugins
/// natively (a benchmark baseline) assembles them through it too.
pub fn build_set(spec: &PolicySetSpec, version: u64, loaded: &BTreeMap<&str, Arc<dyn PolicyPlugin>>) -> PolicySet {
    let mut builder = PolicySet::builder().version(version);
    for f in &spec.stages.filter {
        let plugin = loaded[f.as_str()].clone();
        builder = match spec.plugins.get(f.as_str()).is_none_or(|p| p.reuse_verdicts) {
            true => builder.filter(plugin),
            false => builder.filter_uncached(plugin),
        };
    }
    for w in &spec.stages.score {
        builder = builder.score(loaded[w.plugin.as_str()].clone(), w.weight);
    }
    if let Some(d) = &spec.stages.select_devices {
        builder = builder.devices(loaded[d.as_str()].clone());
    }
    if let Some(p) = &spec.stages.preempt {
        builder = builder.preempt(loaded[p.as_str()].clone());
    }
    if let Some(f) = &spec.stages.fair_share {
        builder = builder.fair_share(loaded[f.as_str()].clone());
    }
    builder.build()
}

/// The stages `plugin` serves in `spec`, in pipeline order.
fn stages_of(spec: &PolicySetSpec, plugin: &str) -> Vec<Stage> {
    let s = &spec.stages;
    let mut stages = Vec::new();
    if s.filter.iter().any(|f| f == plugin) {
        stages.push(Stage::Filter);
    }
    if s.score.iter().any(|w| w.plugin == plugin) {
        stages.push(Stage::Score);
    }
    if s.select_devices.as_deref() == Some(plugin) {
        stages.push(Stage::SelectDevices);
    }
    if s.preempt.as_deref() == Some(plugin) {
        stages.push(Stage::Preempt);
    }
    if s.fair_share.as_deref() == Some(plugin) {
        stages.push(Stage::FairShare);
    }
    stages
}

/// Place up to `spec.smoke.tasks` sample tasks, then call the preempt and fair-share plugins
/// (which placing does not reach) once each: any plugin fault (even of a fail-open plugin) or
/// a decision over the time limit fails the version; a deadline fault only if a second try
/// overruns too (`exercise_stage` says why). Unschedulable tasks are fine: the sample
/// cluster may be full.
fn smoke_test(
    set: &PolicySet,
    spec: &PolicySetSpec,
    plugins: &BTreeMap<&str, Arc<dyn PolicyPlugin>>,
    sample: &Sample,
) -> Result<(), PrepareError> {
    for (name, stage) in [(&spec.stages.preempt, Stage::Preempt), (&spec.stages.fair_share, Stage::FairShare)] {
        let Some(plugin) = name.as_deref().and_then(|n| plugins.get(n)) else { continue };
        if let Err(fault) = crate::exercise::exercise_stage(&**plugin, stage, sample).run.outcome {
            return Err(PrepareError::Smoke(format!("{stage} on the sample cluster: {fault}")));
        }
    }
    let limit = Duration::from_secs_f64(spec.smoke.max_decision_ms / 1e3);
    // Warm-up: each fresh instance's first call copies the whole sample cluster into its mirror,
    // which on a large cluster can take longer than a call's deadline. That cost is the mirror's,
    // not the policy's: a deadline fault here is not held against the version (any other fault
    // is, below).
    if let Some(first) = sample.tasks.first() {
        let _ = place(set, &sample.nodes, first, 0);
    }
    let tasks = sample.tasks.iter().cycle().take(if sample.tasks.is_empty() { 0 } else { spec.smoke.tasks });
    for (i, task) in tasks.enumerate() {
        let attempt = || {
            let started = Instant::now();
            let outcome = place(set, &sample.nodes, task, 0);
            let faults = match &outcome {
                Ok(p) => p.skipped_faults.clone(),
                Err(u) => u.diagnosis.faults.clone(),
            };
            (faults, started.elapsed())
        };
        let (mut faults, mut took) = attempt();
        // A deadline fault gets a second try, as in `exercise_stage` (which says why).
        if !faults.is_empty() && faults.iter().all(|f| f.kind == FaultKind::Deadline) {
            (faults, took) = attempt();
        }
        if let Some(fault) = faults.first() {
            return Err(PrepareError::Smoke(format!("task {} (sample {i}): {fault}", task.id)));
        }
        if took > limit {
            return Err(PrepareError::Smoke(format!(
                "task {} took {:.1} ms, more than max_decision_ms {}",
                task.id,
                took.as_secs_f64() * 1e3,
                spec.smoke.max_decision_ms
            )));
        }
    }
    Ok(())
}
