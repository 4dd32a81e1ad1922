//! A loaded plugin: instance pool, budgets, mirror sync, fault handling.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmsched_api::batch::FilterBatch;
use wasmsched_api::{
    ClaimRequest, DeviceShare, PreemptCandidate, Preemption, QueueState, Rejection, Resources, ShareDecision, Stage,
    Task,
};
use wasmsched_core::{
    CallContext, Changes, FailurePolicy, FaultKind, NodeTable, PluginFault, PolicyPlugin, Slot, validate,
};
use wasmtime::component::InstancePre;
use wasmtime::{Engine, Store, Trap, UpdateDeadline};

use crate::bindings::{
    self, fair_share, fair_share_delta, filter, mirror, mirror_usage, placement, placement_counted, plugin, preempt,
    score, select_claim_devices, select_devices,
};
use crate::breaker::{Breaker, BreakerConfig};
use crate::budget::{self, Budget};
use crate::cache::sha256_hex;
use crate::engine::Runtime;
use crate::error::LoadError;
use crate::host::{HostState, MAX_HANDLES, truncate};
use crate::metrics::{FaultObserver, PluginMetrics};

/// Fuel per call when the runtime is deterministic and the plugin sets none: roughly a second of
/// guest work, far above any sane policy call.
const DEFAULT_FUEL: u64 = 1_000_000_000;
/// Backstop per call when the runtime is deterministic. Fuel is the budget there; the configured
/// deadline would make results depend on machine load, so only a hang outside guest code (which
/// fuel cannot see) is cut, and late.
const DETERMINISTIC_BACKSTOP: Duration = Duration::from_secs(30);
/// The least wall-clock ceiling of a call: a call descheduled this long is cut even under its
/// CPU budget (see [`PluginConfig::wall_ceiling`]).
const MIN_WALL_CEILING: Duration = Duration::from_secs(1);

/// The least CPU time instantiation and `init` get, whatever the call deadline: they run off
/// the decision path (loading, replacing a faulted instance). Still bounded, so a plugin whose
/// `init` loops fails to load.
const INIT_BUDGET: Duration = Duration::from_secs(1);
/// Budget of each mirror call that copies nodes (reset, upserts, usage), in calls' worth: copying
/// a cluster into a fresh instance is the mirror's cost, not the policy's, and the first calls
/// of an interpreted guest (JavaScript, Python) also compile its code.
const SYNC_SCALE: u64 = 10;
/// Nodes per `mirror.upsert` call during a full sync; bounds the size of one call.
const SYNC_CHUNK: usize = 512;
/// Usage changes of at most this many nodes ride along with a `placement` call; more (a mirror
/// catching up after a while) go in `mirror-usage` calls of their own, each with its own budget.
const DEFER_USAGE: usize = 64;
/// Longest fault message kept.
const MAX_FAULT_MESSAGE: usize = 512;

/// How one plugin is run.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    /// Registered name (used in metrics, events and errors).
    pub name: String,
    /// Configuration text handed to the plugin's `init` (JSON by convention).
    pub config: String,
    /// Budget of one call: the CPU time its thread may spend in it (time the thread waits for a
    /// CPU does not count), measured with the granularity of the runtime's epoch tick.
    pub deadline: Duration,
    /// Wall-clock ceiling of one call, whatever its CPU use (a call stalled outside the guest, or
    /// a machine so loaded that the thread barely runs). `None`: 100 × `deadline`, and at least
    /// 1 s.
    pub wall_ceiling: Option<Duration>,
    /// Cap on the instance's linear memory, in bytes.
    pub memory_limit: usize,
    /// Fuel per call when the runtime is deterministic.
    pub fuel: Option<u64>,
    /// What callers do when it faults.
    pub failure: FailurePolicy,
    /// When to stop calling it.
    pub breaker: BreakerConfig,
}

impl PluginConfig {
    /// Defaults: 10 ms deadline (ignored by deterministic runtimes, where fuel bounds calls), 64 MiB memory, fail-closed, breaker after 5 failures.
    pub fn new(name: impl Into<String>) -> Self {
        PluginConfig {
            name: name.into(),
            config: String::new(),
            deadline: Duration::from_millis(10),
            wall_ceiling: None,
            memory_limit: 64 << 20,
            fuel: None,
            failure: FailurePolicy::FailClosed,
            breaker: BreakerConfig::default(),
        }
    }

    /// Set the configuration text.
    pub fn with_config(mut self, config: impl Into<String>) -> Self {
        self.config = config.into();
        self
    }

    /// Set the per-call deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Set the wall-clock ceiling of one call.
    pub fn with_wall_ceiling(mut self, ceiling: Duration) -> Self {
        self.wall_ceiling = Some(ceiling);
        self
    }

    /// The wall-clock ceiling in force: the configured one, or the default for the deadline.
    pub fn effective_wall_ceiling(&self) -> Duration {
        self.wall_ceiling.unwrap_or_else(|| self.deadline.saturating_mul(100).max(MIN_WALL_CEILING)).max(self.deadline)
    }

    /// Set the memory cap.
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Set the fuel per call (deterministic runtimes).
    pub fn with_fuel(mut self, fuel: u64) -> Self {
        self.fuel = Some(fuel);
        self
    }

    /// Set the failure policy.
    pub fn with_failure_policy(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// Set the circuit breaker.
    pub fn with_breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }
}

/// Export lookups resolved once at load.
struct Indices {
    plugin: plugin::GuestIndices,
    mirror: Option<mirror::GuestIndices>,
    mirror_usage: Option<mirror_usage::GuestIndices>,
    filter: Option<filter::GuestIndices>,
    score: Option<score::GuestIndices>,
    placement: Option<placement::GuestIndices>,
    placement_counted: Option<placement_counted::GuestIndices>,
    select_devices: Option<select_devices::GuestIndices>,
    select_claim_devices: Option<select_claim_devices::GuestIndices>,
    preempt: Option<preempt::GuestIndices>,
    fair_share: Option<fair_share::GuestIndices>,
    fair_share_delta: Option<fair_share_delta::GuestIndices>,
}

/// One live instance with its store.
struct Live {
    store: Store<HostState>,
    mirror: Option<mirror::Guest>,
    /// Usage-only updates; without it, usage changes go as full upserts.
    mirror_usage: Option<mirror_usage::Guest>,
    filter: Option<filter::Guest>,
    score: Option<score::Guest>,
    /// `filter` and `score` with the usage changes along; without it, `mirror-usage` goes first.
    placement: Option<placement::Guest>,
    /// `placement` with a lighter form of a task that asks for extended resources; used instead
    /// of `placement` where the component exports it.
    placement_counted: Option<placement_counted::Guest>,
    select_devices: Option<select_devices::Guest>,
    /// DRA device ranking (added to 0.2.0): without it, the host's order.
    select_claim_devices: Option<select_claim_devices::Guest>,
    preempt: Option<preempt::Guest>,
    fair_share: Option<fair_share::Guest>,
    /// Fair share by changes; without it, every call sends every queue.
    fair_share_delta: Option<fair_share_delta::Guest>,
    /// `(table id, generation)` the mirror reflects.
    synced: Option<(u64, u64)>,
    /// What the guest holds of fair share: the states it was sent and its last answer (`None`
    /// until a call succeeded, and after any failure: the next call resets it).
    shares: Option<SentShares>,
}

/// Usage changes a sync held back to send along with a `placement` call, and the generation the
/// mirror reaches with them.
#[derive(Default)]
struct Deferred {
    generation: u64,
    usage: Vec<(u32, mirror_usage::NodeUsage)>,
}

/// The queue states an instance was sent and the deserved shares it last answered.
struct SentShares {
    queues: Vec<QueueState>,
    deserved: Vec<Resources>,
}

/// What went wrong inside a call, before it is attributed.
enum CallError {
    Wasm(wasmtime::Error),
    Guest(String),
    Bad(String),
    /// The mirror refused the usage changes sent along with a `placement` call; nothing ran.
    OutOfStep(String),
    /// An export's functions do not have the contract's types (found when instantiating).
    Contract(String),
}

impl CallError {
    /// The message of a failed instantiation.
    fn into_message(self) -> String {
        match self {
            CallError::Wasm(e) => describe_wasm_error(&e, None),
            CallError::Guest(m) | CallError::Bad(m) | CallError::OutOfStep(m) | CallError::Contract(m) => m,
        }
    }
}

impl From<wasmtime::Error> for CallError {
    fn from(e: wasmtime::Error) -> Self {
        CallError::Wasm(e)
    }
}

/// Everything needed to make fresh instances.
struct Blueprint {
    name: Arc<str>,
    config: PluginConfig,
    engine: Engine,
    pre: InstancePre<HostState>,
    indices: Indices,
    /// CPU budget of one guest call.
    deadline: Duration,
    /// Wall-clock ceiling of one guest call.
    ceiling: Duration,
    /// The runtime's epoch tick.
    tick: Duration,
    epoch_ticks: u64,
    /// Instantiation and `init`: ten calls' worth, and at least [`INIT_BUDGET`].
    init_scale: u64,
    fuel: Option<u64>,
}

impl Blueprint {
    /// Arm the per-call budgets on `store`; `scale` stretches them (initialisation, full sync).
    fn arm(&self, store: &mut Store<HostState>, scale: u64) {
        store.set_epoch_deadline(self.epoch_ticks * scale);
        let cpu = self.deadline.saturating_mul(u32::try_from(scale).unwrap_or(u32::MAX));
        // A stretched budget (init, a full sync) keeps the ceiling unless twice its CPU is more.
        store.data_mut().budget = Budget::start(cpu, self.ceiling.max(cpu.saturating_mul(2)), self.tick);
        if let Some(fuel) = self.fuel {
            // Fuel is enabled on the engine whenever `self.fuel` is set.
            let _ = store.set_fuel(fuel.saturating_mul(scale));
        }
    }

    fn instantiate(&self) -> Result<(Live, plugin::PluginInfo), CallError> {
        let mut store = Store::new(&self.engine, HostState::new(self.name.clone(), self.config.memory_limit));
        store.limiter(|s| &mut s.limiter);
        let tick = self.tick;
        // Runs on the guest's thread when the epoch deadline passes: cut the call only if it
        // used its CPU budget (or reached the wall-clock ceiling), else extend the deadline.
        store.epoch_deadline_callback(move |mut ctx| match ctx.data().budget.check() {
            budget::Verdict::Continue(left) => Ok(UpdateDeadline::Continue(
                u64::try_from(left.as_nanos().div_ceil(tick.as_nanos())).unwrap_or(1).max(1),
            )),
            budget::Verdict::Cut(overrun) => {
                ctx.data_mut().overrun = Some(overrun);
                Ok(UpdateDeadline::Interrupt)
            }
        });
        store.data_mut().begin_call();
        self.arm(&mut store, self.init_scale);
        let instance = self.pre.instantiate(&mut store)?;
        let ix = &self.indices;
        // Loading an export checks its functions' types against the contract.
        let typed = |iface: &str, e: wasmtime::Error| {
            CallError::Contract(format!(
                "export wasmsched:policy/{iface}@{} does not have the contract's types: {e:#}",
                wasmsched_api::CONTRACT_VERSION
            ))
        };
        macro_rules! load {
            ($field:ident, $iface:literal) => {
                ix.$field.as_ref().map(|i| i.load(&mut store, &instance)).transpose().map_err(|e| typed($iface, e))?
            };
        }
        let plugin = ix.plugin.load(&mut store, &instance).map_err(|e| typed("plugin", e))?;
        let mut live = Live {
            mirror: load!(mirror, "mirror"),
            mirror_usage: load!(mirror_usage, "mirror-usage"),
            filter: load!(filter, "filter"),
            score: load!(score, "score"),
            placement: load!(placement, "placement"),
            placement_counted: load!(placement_counted, "placement-counted"),
            select_devices: load!(select_devices, "select-devices"),
            select_claim_devices: load!(select_claim_devices, "select-claim-devices"),
            preempt: load!(preempt, "preempt"),
            fair_share: load!(fair_share, "fair-share"),
            fair_share_delta: load!(fair_share_delta, "fair-share-delta"),
            store,
            synced: None,
            shares: None,
        };
        let info = match plugin.call_init(&mut live.store, &self.config.config) {
            Ok(r) => r.map_err(CallError::Guest)?,
            Err(e) => {
                let (kind, message) = explain(&e, live.store.data());
                return Err(CallError::Bad(match kind {
                    FaultKind::Deadline => format!("init exceeded its deadline: {message}"),
                    _ => format!("init failed: {message}"),
                }));
            }
        };
        Ok((live, info))
    }
}

/// A plugin loaded from a component, with one instance per worker.
pub struct WasmPlugin {
    blueprint: Blueprint,
    stages: Vec<Stage>,
    /// The name the component gives itself (`plugin-info.name`); it is registered under the
    /// name its configuration gives.
    own_name: String,
    sdk_version: String,
    digest: String,
    pool: Vec<Mutex<Option<Live>>>,
    breaker: Mutex<Breaker>,
    metrics: Arc<PluginMetrics>,
    observer: Option<FaultObserver>,
}

impl std::fmt::Debug for WasmPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPlugin")
            .field("name", &self.blueprint.name)
            .field("stages", &self.stages)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

fn contract(plugin: &str, message: impl Into<String>) -> LoadError {
    LoadError::Contract { plugin: plugin.into(), message: message.into() }
}

impl WasmPlugin {
    pub(crate) fn load(rt: &Runtime, wasm: &[u8], config: PluginConfig) -> Result<Self, LoadError> {
        let name: Arc<str> = config.name.as_str().into();
        let (component, _origin) = rt.cache.get_or_compile(&rt.engine, &name, wasm)?;
        let pre = rt.linker.instantiate_pre(&component).map_err(|e| contract(&name, format!("{e:#}")))?;
        let plugin = plugin::GuestIndices::new(&pre).map_err(|e| {
            contract(&name, format!("does not export wasmsched:policy/plugin (wrong world or contract version): {e:#}"))
        })?;
        // An interface the component does not export is simply absent; one it exports without
        // every function of the contract is refused, naming it.
        let optional = |iface: &str, found: wasmtime::Result<()>| -> Result<bool, LoadError> {
            let exported = format!("wasmsched:policy/{iface}@{}", wasmsched_api::CONTRACT_VERSION);
            match found {
                Ok(()) => Ok(true),
                Err(_) if pre.component().get_export_index(None, &exported).is_none() => Ok(false),
                Err(e) => Err(contract(&name, format!("export {exported}: {e:#}"))),
            }
        };
        macro_rules! optional {
            ($module:ident, $iface:literal) => {{
                let found = $module::GuestIndices::new(&pre);
                match optional($iface, found.as_ref().map(|_| ()).map_err(|e| wasmtime::format_err!("{e:#}")))? {
                    true => found.ok(),
                    false => None,
                }
            }};
        }
        let indices = Indices {
            plugin,
            mirror: optional!(mirror, "mirror"),
            mirror_usage: optional!(mirror_usage, "mirror-usage"),
            filter: optional!(filter, "filter"),
            score: optional!(score, "score"),
            placement: if rt.config.placement_calls { optional!(placement, "placement") } else { None },
            placement_counted: if rt.config.placement_calls {
                optional!(placement_counted, "placement-counted")
            } else {
                None
            },
            select_devices: optional!(select_devices, "select-devices"),
            select_claim_devices: optional!(select_claim_devices, "select-claim-devices"),
            preempt: optional!(preempt, "preempt"),
            fair_share: optional!(fair_share, "fair-share"),
            fair_share_delta: optional!(fair_share_delta, "fair-share-delta"),
        };
        let tick = rt.config.epoch_tick.as_nanos().max(1);
        // Round up and add one tick: the current tick may be about to end.
        let deadline =
            if rt.config.deterministic { DETERMINISTIC_BACKSTOP.max(config.deadline) } else { config.deadline };
        let epoch_ticks = u64::try_from(deadline.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX / 16) + 1;
        let init_ticks = u64::try_from(INIT_BUDGET.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX / 16);
        let init_scale = init_ticks.div_ceil(epoch_ticks).max(10);
        let fuel = rt.config.deterministic.then(|| config.fuel.unwrap_or(DEFAULT_FUEL));
        let ceiling = if rt.config.deterministic { deadline } else { config.effective_wall_ceiling() };
        let blueprint = Blueprint {
            name: name.clone(),
            config,
            engine: rt.engine.clone(),
            pre,
            indices,
            deadline,
            ceiling,
            tick: rt.config.epoch_tick,
            epoch_ticks,
            init_scale,
            fuel,
        };

        let (live, info) = blueprint.instantiate().map_err(|e| match e {
            CallError::Guest(message) | CallError::OutOfStep(message) => {
                LoadError::Config { plugin: name.to_string(), message }
            }
            CallError::Bad(message) => LoadError::Init { plugin: name.to_string(), message },
            CallError::Contract(message) => LoadError::Contract { plugin: name.to_string(), message },
            CallError::Wasm(e) => LoadError::Init {
                plugin: name.to_string(),
                message: format!("could not instantiate: {}", describe_wasm_error(&e, None)),
            },
        })?;
        let mut stages: Vec<Stage> = info.stages.into_iter().map(bindings::stage_in).collect();
        stages.sort();
        stages.dedup();
        if stages.is_empty() {
            return Err(contract(&name, "plugin declares no stage"));
        }
        for &stage in &stages {
            let exported = match stage {
                Stage::Filter => live.filter.is_some(),
                Stage::Score => live.score.is_some(),
                Stage::SelectDevices => live.select_devices.is_some(),
                Stage::Preempt => live.preempt.is_some(),
                Stage::FairShare => live.fair_share.is_some(),
            };
            if !exported {
                return Err(contract(&name, format!("declares stage {stage} but does not export its interface")));
            }
            if stage != Stage::FairShare && live.mirror.is_none() {
                return Err(contract(
                    &name,
                    format!("stage {stage} needs the mirror interface, which is not exported"),
                ));
            }
        }

        let metrics = Arc::new(PluginMetrics::default());
        metrics.instance_created();
        let mut pool: Vec<Mutex<Option<Live>>> = (0..rt.config.workers).map(|_| Mutex::new(None)).collect();
        *pool[0].get_mut().unwrap_or_else(|e| e.into_inner()) = Some(live);
        tracing::info!(plugin = %name, stages = ?stages, sdk = %info.sdk_version, "plugin loaded");
        Ok(WasmPlugin {
            blueprint,
            stages,
            own_name: info.name,
            sdk_version: info.sdk_version,
            digest: sha256_hex(wasm),
            pool,
            breaker: Mutex::new(Breaker::default()),
            metrics,
            observer: rt.observer.clone(),
        })
    }

    /// The name the component gives itself (its registered name is [`PolicyPlugin::name`]).
    pub fn own_name(&self) -> &str {
        &self.own_name
    }

    /// The SDK (or bindings) version the component reported.
    pub fn sdk_version(&self) -> &str {
        &self.sdk_version
    }

    /// Hex sha256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Counters and latency histograms.
    pub fn metrics(&self) -> &Arc<PluginMetrics> {
        &self.metrics
    }

    /// How it is run.
    pub fn config(&self) -> &PluginConfig {
        &self.blueprint.config
    }

    /// Create an instance for every worker that has none, so the first calls pay no
    /// instantiation (done off the hot path before a policy set goes live).
    pub fn prewarm(&self) -> Result<(), PluginFault> {
        for slot in &self.pool {
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                let (live, _) = self
                    .blueprint
                    .instantiate()
                    .map_err(|e| self.fault(self.stages[0], FaultKind::Instantiate, e.into_message()))?;
                self.metrics.instance_created();
                *slot = Some(live);
            }
        }
        Ok(())
    }

    /// Whether this plugin can stand in for loading the component whose sha256 is `digest` (hex)
    /// with `config` on `runtime`: same component, same configuration and budgets, same engine,
    /// and healthy (its breaker closed, no failure since its last success). A new policy version
    /// then keeps this plugin, warm instances and synced mirrors included, instead of loading
    /// the component again; a swap to it costs that plugin nothing.
    pub fn can_stand_in_for(&self, runtime: &Runtime, digest: &str, config: &PluginConfig) -> bool {
        self.digest == digest
            && self.blueprint.config == *config
            && Engine::same(&self.blueprint.engine, &runtime.engine)
            && self.breaker.lock().unwrap_or_else(|e| e.into_inner()).is_clear()
    }

    /// Drop every instance (each worker gets a fresh one on its next call).
    pub fn clear_instances(&self) {
        for slot in &self.pool {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    fn fault(&self, stage: Stage, kind: FaultKind, message: impl Into<String>) -> PluginFault {
        let message = truncate(message.into(), MAX_FAULT_MESSAGE);
        let fault = PluginFault::new(&self.blueprint.name, stage, kind, message);
        self.metrics.fault(&fault);
        if let Some(observer) = &self.observer {
            observer(&fault);
        }
        tracing::warn!(plugin = %fault.plugin, stage = %stage, kind = kind.as_str(), "{}", fault.message);
        fault
    }

    /// Run `f` on the worker's instance under the budgets, with the mirror synced to `nodes` first
    /// when given. `f` gets the usage changes the sync held back for a `placement` call (filter
    /// and score of an instance that has it); if the guest refuses them, the whole mirror is
    /// resent and `f` runs again. Any failure discards the instance.
    fn call<R>(
        &self,
        worker: usize,
        stage: Stage,
        nodes: Option<&NodeTable>,
        mut f: impl FnMut(&Blueprint, &mut Live, Deferred) -> Result<R, CallError>,
    ) -> Result<R, PluginFault> {
        if !self.stages.contains(&stage) {
            self.metrics.call(stage, None);
            return Err(self.fault(stage, FaultKind::NotImplemented, format!("plugin does not implement {stage}")));
        }
        if !self.breaker.lock().unwrap_or_else(|e| e.into_inner()).allow() {
            self.metrics.call(stage, None);
            return Err(self.fault(stage, FaultKind::CircuitOpen, "circuit breaker open after repeated failures"));
        }
        let mut slot = self.pool[worker % self.pool.len()].lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            match self.blueprint.instantiate() {
                Ok((live, _)) => {
                    self.metrics.instance_created();
                    *slot = Some(live);
                }
                Err(e) => {
                    self.metrics.call(stage, None);
                    self.breaker.lock().unwrap_or_else(|e| e.into_inner()).failure(&self.blueprint.config.breaker);
                    return Err(self.fault(stage, FaultKind::Instantiate, e.into_message()));
                }
            }
        }
        let Some(live) = slot.as_mut() else { unreachable!("instance was just created") };
        live.store.data_mut().begin_call();
        live.store.data_mut().topology = nodes.and_then(NodeTable::topology_view);
        live.store.data_mut().domains = nodes.and_then(NodeTable::domain_view);
        live.store.data_mut().accelerators = nodes.map(NodeTable::accelerator_view);
        let started = Instant::now();
        let placement = live.placement.is_some() || live.placement_counted.is_some();
        let defer = placement && matches!(stage, Stage::Filter | Stage::Score);
        let result = match nodes {
            Some(nodes) => self.sync(live, nodes, defer).and_then(|deferred| f(&self.blueprint, live, deferred)),
            None => f(&self.blueprint, live, Deferred::default()),
        };
        let result = match (result, nodes) {
            // It applied nothing and ran nothing: start its mirror over, as after a refused
            // `mirror-usage` call, and call again.
            (Err(CallError::OutOfStep(e)), Some(nodes)) => {
                tracing::warn!(plugin = %self.blueprint.name, "mirror refused a usage update ({e}); resending every node");
                self.apply(live, nodes, Changes::Full, nodes.generation(), false).and_then(|resent| {
                    f(&self.blueprint, live, resent).map_err(|e| match e {
                        // Nothing was sent along this time.
                        CallError::OutOfStep(m) => CallError::Bad(format!("refused an empty usage update: {m}")),
                        e => e,
                    })
                })
            }
            (result, _) => result,
        };
        self.metrics.call(stage, Some(started.elapsed()));
        live.store.data_mut().domains = None;
        live.store.data_mut().accelerators = None;
        match result {
            Ok(r) => {
                self.breaker.lock().unwrap_or_else(|e| e.into_inner()).success();
                Ok(r)
            }
            Err(e) => {
                let host = live.store.data();
                let (kind, message) = match e {
                    CallError::Guest(m) => (FaultKind::GuestError, m),
                    CallError::Bad(m) | CallError::Contract(m) => (FaultKind::BadOutput, m),
                    // Only a stage call with nodes sends usage along; it retries after a refusal.
                    CallError::OutOfStep(m) => (FaultKind::BadOutput, format!("mirror out of step: {m}")),
                    CallError::Wasm(e) => explain(&e, host),
                };
                // Never reuse an instance that failed: its state is suspect.
                *slot = None;
                drop(slot);
                self.metrics.instance_discarded();
                self.breaker.lock().unwrap_or_else(|e| e.into_inner()).failure(&self.blueprint.config.breaker);
                Err(self.fault(stage, kind, message))
            }
        }
    }

    /// `fair-share-delta.compute-changed`: only the queues that differ from what the instance
    /// holds go in, only the shares that differ from its last answer come out. Whatever the guest
    /// answers is checked before it is used; on any failure the instance is discarded (as after
    /// every failed call), so the next one starts with a reset.
    fn fair_share_by_changes(
        bp: &Blueprint,
        live: &mut Live,
        queues: &[QueueState],
        cluster: &bindings::wasmsched::policy::types::Resources,
    ) -> Result<ShareDecision, CallError> {
        let Some(fs) = live.fair_share_delta.as_ref() else { unreachable!("checked by the caller") };
        let sent = live.shares.take();
        let reset = sent.is_none();
        let changed: Vec<(u32, fair_share::QueueState)> = queues
            .iter()
            .enumerate()
            .filter(|&(i, q)| sent.as_ref().is_none_or(|s| s.queues.get(i) != Some(q)))
            .map(|(i, q)| (i as u32, bindings::queue(q)))
            .collect();
        bp.arm(&mut live.store, 1);
        let d = fs
            .call_compute_changed(&mut live.store, reset, queues.len() as u32, &changed, cluster)?
            .map_err(CallError::Guest)?;
        let (mut held, mut deserved) = match sent {
            Some(s) => (s.queues, s.deserved),
            None => (Vec::new(), Vec::new()),
        };
        let before = deserved.len().min(queues.len());
        deserved.truncate(queues.len());
        let mut given = vec![false; queues.len()];
        let mut last = None;
        for (i, share) in d.deserved {
            let at = i as usize;
            if at >= queues.len() || last.is_some_and(|l| l >= i) {
                return Err(CallError::Bad(format!(
                    "fair-share-delta answered a share for queue {i} (of {}), out of range or order",
                    queues.len()
                )));
            }
            last = Some(i);
            if at >= deserved.len() {
                deserved.resize_with(at + 1, Resources::default);
            }
            deserved[at] = bindings::resources_in(share);
            given[at] = true;
        }
        // Every queue needs a share: answered now, or kept from the last answer (none after a
        // reset, and none for a queue new since).
        let kept = if reset { 0 } else { before };
        if let Some(i) = (kept..queues.len()).find(|&i| !given[i]) {
            return Err(CallError::Bad(format!("fair-share-delta answered no share for queue {i}")));
        }
        let decision = ShareDecision { deserved, order: d.order };
        validate::share(&decision, queues.len()).map_err(CallError::Bad)?;
        // `changed` is ascending and holds every index past what was held.
        held.truncate(queues.len());
        for &(i, _) in &changed {
            let q = queues[i as usize].clone();
            match held.get_mut(i as usize) {
                Some(h) => *h = q,
                None => held.push(q),
            }
        }
        live.shares = Some(SentShares { queues: held, deserved: decision.deserved.clone() });
        Ok(decision)
    }

    /// Bring the instance's mirror up to `nodes`, holding back a few usage changes when `defer`.
    fn sync(&self, live: &mut Live, nodes: &NodeTable, defer: bool) -> Result<Deferred, CallError> {
        let changes = match live.synced {
            Some((id, generation)) => nodes.changes_since(id, generation),
            None => Changes::Full,
        };
        self.apply(live, nodes, changes, nodes.generation(), defer)
    }

    /// Apply `changes` of `nodes`, after which the mirror reflects generation `reached` (the
    /// current one after a full resend) — once the held-back usage changes, if `defer` and there
    /// are at most [`DEFER_USAGE`], are applied by the next `placement` call.
    fn apply(
        &self,
        live: &mut Live,
        nodes: &NodeTable,
        changes: Changes,
        reached: u64,
        defer: bool,
    ) -> Result<Deferred, CallError> {
        let bp = &self.blueprint;
        let mut generation = reached;
        let Some(mirror) = live.mirror.as_ref() else {
            return Err(CallError::Bad("mirror interface missing".into()));
        };
        let upsert = |live_store: &mut Store<HostState>,
                      generation: u64,
                      slots: &mut dyn Iterator<Item = Slot>|
         -> Result<(), CallError> {
            let batch: Vec<(u32, bindings::wasmsched::policy::types::Node)> =
                slots.filter_map(|s| nodes.get(s).map(|n| (s, bindings::node(n)))).collect();
            if !batch.is_empty() {
                bp.arm(live_store, SYNC_SCALE);
                mirror.call_upsert(&mut *live_store, generation, &batch)?;
            }
            Ok(())
        };
        let mut resend = false;
        let mut held = Vec::new();
        match changes {
            Changes::UpToDate => {}
            Changes::Delta { mut upserted, usage, removed } => {
                if !removed.is_empty() {
                    bp.arm(&mut live.store, 1);
                    mirror.call_remove(&mut live.store, generation, &removed)?;
                }
                match live.mirror_usage.as_ref() {
                    _ if defer && usage.len() <= DEFER_USAGE => {
                        held = usage.iter().filter_map(|&s| nodes.get(s).map(|n| (s, bindings::usage(n)))).collect();
                    }
                    Some(mirror_usage) => {
                        for chunk in usage.chunks(SYNC_CHUNK) {
                            let batch: Vec<(u32, mirror_usage::NodeUsage)> =
                                chunk.iter().filter_map(|&s| nodes.get(s).map(|n| (s, bindings::usage(n)))).collect();
                            bp.arm(&mut live.store, SYNC_SCALE);
                            if let Err(e) = mirror_usage.call_update_usage(&mut live.store, generation, &batch)? {
                                // Out of step with the host (it applied nothing): start over.
                                tracing::warn!(plugin = %bp.name, "mirror refused a usage update ({e}); resending every node");
                                resend = true;
                                break;
                            }
                        }
                    }
                    None => {
                        upserted.extend(usage);
                        upserted.sort_unstable();
                    }
                }
                if !resend {
                    for chunk in upserted.chunks(SYNC_CHUNK) {
                        upsert(&mut live.store, generation, &mut chunk.iter().copied())?;
                    }
                }
            }
            Changes::Full => resend = true,
        }
        if resend {
            generation = nodes.generation();
            bp.arm(&mut live.store, SYNC_SCALE);
            mirror.call_reset(&mut live.store, generation, nodes.slot_count())?;
            let slots: Vec<Slot> = nodes.slots().collect();
            for chunk in slots.chunks(SYNC_CHUNK) {
                upsert(&mut live.store, generation, &mut chunk.iter().copied())?;
            }
        }
        live.synced = Some((nodes.id(), generation));
        Ok(Deferred { generation, usage: held })
    }
}

fn stage_error(e: placement::StageError) -> CallError {
    match e {
        placement::StageError::OutOfStep(m) => CallError::OutOfStep(m),
        placement::StageError::Failed(m) => CallError::Guest(m),
    }
}

/// Turn a wasmtime error into a fault kind and a message that names the cause in words.
fn explain(e: &wasmtime::Error, host: &HostState) -> (FaultKind, String) {
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return (FaultKind::Trap, format!("the plugin exited with status {}", exit.0));
    }
    if let Some(table) = e.downcast_ref::<wasmtime::component::ResourceTableError>()
        && matches!(table, wasmtime::component::ResourceTableError::Full)
    {
        return (FaultKind::Trap, format!("the plugin opened more than {MAX_HANDLES} WASI handles at once"));
    }
    let last_error = host.last_error.as_deref();
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => match host.overrun {
            Some(o) => (FaultKind::Deadline, format!("deadline exceeded: {o}")),
            None => (FaultKind::Deadline, "deadline exceeded".into()),
        },
        Some(Trap::OutOfFuel) => (FaultKind::Fuel, "fuel exhausted".into()),
        _ => match host.limiter.asked {
            Some(asked) => (
                FaultKind::Memory,
                format!(
                    "memory limit reached: asked for {} MiB of linear memory, the cap is {} MiB ({})",
                    asked.div_ceil(1 << 20),
                    host.limiter.max_bytes >> 20,
                    describe_wasm_error(e, last_error)
                ),
            ),
            // During a call, an error that is not a trap came from a host function the guest called.
            None if e.downcast_ref::<Trap>().is_none() => {
                (FaultKind::Trap, format!("a host call failed: {}", describe_wasm_error(e, last_error)))
            }
            None => (FaultKind::Trap, describe_wasm_error(e, last_error)),
        },
    }
}

fn describe_wasm_error(e: &wasmtime::Error, last_error: Option<&str>) -> String {
    let first = match e.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        // Not a trap (a link error, or a host function refusing a call): the reason, not the wasm
        // backtrace wrapped around it.
        None => e.root_cause().to_string().lines().next().unwrap_or_default().to_string(),
    };
    match last_error {
        Some(msg) => format!("{first} ({msg})"),
        None => first,
    }
}

impl PolicyPlugin for WasmPlugin {
    fn name(&self) -> &str {
        &self.blueprint.name
    }

    fn stages(&self) -> &[Stage] {
        &self.stages
    }

    fn failure_policy(&self) -> FailurePolicy {
        self.blueprint.config.failure
    }

    fn catch_up(&self, nodes: &NodeTable, max_changes: usize) -> bool {
        let mut done = true;
        for slot in &self.pool {
            // An instance in use is busy with a call, which syncs it anyway.
            let Ok(mut slot) = slot.try_lock() else { continue };
            let Some(live) = slot.as_mut() else { continue };
            // Never used: nothing to catch up on (its first call sends every node, as always).
            let Some((id, generation)) = live.synced else { continue };
            if id == nodes.id() && generation >= nodes.generation() {
                // Already at (or past: `nodes` is an older snapshot of the same table) this state;
                // going back would mean resending every node.
                continue;
            }
            let (changes, reached, up_to_date) =
                nodes.changes_step(id, generation, max_changes).unwrap_or((Changes::Full, nodes.generation(), true));
            live.store.data_mut().begin_call();
            if let Err(e) = self.apply(live, nodes, changes, reached, false) {
                // Discarded like after a failed call; a fresh instance syncs in full on first use.
                let message = match e {
                    CallError::Wasm(e) => describe_wasm_error(&e, live.store.data().last_error.as_deref()),
                    CallError::Guest(m) | CallError::Bad(m) | CallError::OutOfStep(m) | CallError::Contract(m) => m,
                };
                tracing::warn!(plugin = %self.blueprint.name, "catching up the mirror failed: {message}");
                *slot = None;
                self.metrics.instance_discarded();
                continue;
            }
            done &= up_to_date;
        }
        done
    }

    fn filter_until(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<FilterBatch, PluginFault> {
        // Only `placement.filter` can stop early; `None` when stopping could not save anything.
        let enough = u32::try_from(enough).ok().filter(|&e| (e as usize) < candidates.len());
        self.call(ctx.worker, Stage::Filter, Some(ctx.nodes), |bp, live, deferred| {
            bp.arm(&mut live.store, 1);
            let r = match (live.placement_counted.as_ref(), live.placement.as_ref()) {
                (Some(p), _) => p
                    .call_filter(
                        &mut live.store,
                        deferred.generation,
                        &deferred.usage,
                        &bindings::counted_stage_task(task),
                        candidates,
                        enough,
                    )?
                    .map_err(stage_error)?,
                (None, Some(p)) => p
                    .call_filter(
                        &mut live.store,
                        deferred.generation,
                        &deferred.usage,
                        &bindings::stage_task(task),
                        candidates,
                        enough,
                    )?
                    .map_err(stage_error)?,
                (None, None) => {
                    let f = live.filter.as_ref().ok_or_else(|| CallError::Bad("filter export missing".into()))?;
                    f.call_filter(&mut live.store, &bindings::task(task), candidates)?.map_err(CallError::Guest)?
                }
            };
            let batch =
                FilterBatch { codes: r.codes, reasons: r.reasons.into_iter().map(bindings::rejection_in).collect() };
            validate::filter_until(&batch, candidates.len(), enough.map_or(usize::MAX, |e| e as usize))
                .map_err(CallError::Bad)?;
            Ok(batch)
        })
    }

    fn score(&self, ctx: CallContext<'_>, task: &Task, candidates: &[Slot]) -> Result<Vec<u32>, PluginFault> {
        self.call(ctx.worker, Stage::Score, Some(ctx.nodes), |bp, live, deferred| {
            bp.arm(&mut live.store, 1);
            let scores = match (live.placement_counted.as_ref(), live.placement.as_ref()) {
                (Some(p), _) => p
                    .call_score(
                        &mut live.store,
                        deferred.generation,
                        &deferred.usage,
                        &bindings::counted_stage_task(task),
                        candidates,
                    )?
                    .map_err(stage_error)?,
                (None, Some(p)) => p
                    .call_score(
                        &mut live.store,
                        deferred.generation,
                        &deferred.usage,
                        &bindings::stage_task(task),
                        candidates,
                    )?
                    .map_err(stage_error)?,
                (None, None) => {
                    let s = live.score.as_ref().ok_or_else(|| CallError::Bad("score export missing".into()))?;
                    s.call_score(&mut live.store, &bindings::task(task), candidates)?.map_err(CallError::Guest)?
                }
            };
            validate::scores(&scores, candidates.len()).map_err(CallError::Bad)?;
            Ok(scores)
        })
    }

    fn select_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
    ) -> Result<Result<Vec<DeviceShare>, Rejection>, PluginFault> {
        let wit_task = bindings::task(task);
        let target = ctx.nodes.get(node);
        self.call(ctx.worker, Stage::SelectDevices, Some(ctx.nodes), |bp, live, _| {
            let d =
                live.select_devices.as_ref().ok_or_else(|| CallError::Bad("select-devices export missing".into()))?;
            bp.arm(&mut live.store, 1);
            let r = d.call_select_devices(&mut live.store, &wit_task, node)?.map_err(CallError::Guest)?;
            Ok(match r {
                Ok(shares) => {
                    let shares: Vec<DeviceShare> =
                        shares.into_iter().map(|s| DeviceShare { gpu: s.gpu, milli: s.milli }).collect();
                    let target = target.ok_or_else(|| CallError::Bad(format!("node slot {node} is empty")))?;
                    validate::devices(&shares, task, target).map_err(CallError::Bad)?;
                    Ok(shares)
                }
                Err(r) => Err(bindings::rejection_in(r)),
            })
        })
    }

    fn ranks_claim_devices(&self) -> bool {
        // The SDK exports ranking with every device stage and answers empty for plugins
        // without it: only a component built before the export is known not to rank.
        self.blueprint.indices.select_claim_devices.is_some()
    }

    fn rank_claim_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
        request: &ClaimRequest,
    ) -> Result<Option<Vec<u32>>, PluginFault> {
        // Components built before this export leave the order to the host: asked nothing.
        if self.blueprint.indices.select_claim_devices.is_none() {
            return Ok(None);
        }
        let wit_task = bindings::task(task);
        let wit_request = bindings::claim_request(request);
        self.call(ctx.worker, Stage::SelectDevices, Some(ctx.nodes), |bp, live, _| {
            let r = live
                .select_claim_devices
                .as_ref()
                .ok_or_else(|| CallError::Bad("select-claim-devices export missing".into()))?;
            bp.arm(&mut live.store, 1);
            let order = r.call_rank(&mut live.store, &wit_task, node, &wit_request)?.map_err(CallError::Guest)?;
            validate::claim_ranking(&order, request.candidates.len()).map_err(CallError::Bad)?;
            // An empty answer: the plugin does not rank (the SDK's answer for plugins without it).
            Ok((!order.is_empty()).then_some(order))
        })
    }

    fn select_victims(
        &self,
        ctx: CallContext<'_>,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
    ) -> Result<Option<Preemption>, PluginFault> {
        let wit_task = bindings::task(preemptor);
        let wit_candidates: Vec<_> = candidates.iter().map(bindings::candidate).collect();
        self.call(ctx.worker, Stage::Preempt, Some(ctx.nodes), |bp, live, _| {
            let p = live.preempt.as_ref().ok_or_else(|| CallError::Bad("preempt export missing".into()))?;
            bp.arm(&mut live.store, 1);
            let r = p.call_select_victims(&mut live.store, &wit_task, &wit_candidates)?.map_err(CallError::Guest)?;
            let plan = r.map(|p| Preemption { candidate: p.candidate, victims: p.victims });
            if let Some(plan) = &plan {
                validate::preemption(plan, candidates).map_err(CallError::Bad)?;
            }
            Ok(plan)
        })
    }

    fn fair_share(
        &self,
        worker: usize,
        queues: &[QueueState],
        cluster: &Resources,
    ) -> Result<ShareDecision, PluginFault> {
        let wit_cluster = bindings::resources(cluster);
        self.call(worker, Stage::FairShare, None, |bp, live, _| {
            if live.fair_share_delta.is_some() {
                return Self::fair_share_by_changes(bp, live, queues, &wit_cluster);
            }
            let fs = live.fair_share.as_ref().ok_or_else(|| CallError::Bad("fair-share export missing".into()))?;
            let wit_queues: Vec<_> = queues.iter().map(bindings::queue).collect();
            bp.arm(&mut live.store, 1);
            let d = fs.call_compute(&mut live.store, &wit_queues, &wit_cluster)?.map_err(CallError::Guest)?;
            let d = ShareDecision {
                deserved: d.deserved.into_iter().map(bindings::resources_in).collect(),
                order: d.order,
            };
            validate::share(&d, queues.len()).map_err(CallError::Bad)?;
            Ok(d)
        })
    }
}
