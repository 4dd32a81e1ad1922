//! The runtime: engine, epoch ticker, linker and artifact cache.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine};

use crate::bindings::wasmsched::policy::{accelerators, domains, host, topology};
use crate::cache::ArtifactCache;
use crate::error::LoadError;
use crate::host::HostState;
use crate::metrics::FaultObserver;
use crate::plugin::{PluginConfig, WasmPlugin};

/// Settings shared by every plugin of a runtime.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Worker threads that call plugins concurrently; each plugin keeps one instance per worker.
    pub workers: usize,
    /// Granularity of wall-clock deadlines. A call may overrun its deadline by up to one tick.
    pub epoch_tick: Duration,
    /// Meter guest execution with fuel (deterministic budgets, for the simulator). Costs some
    /// guest speed; plugins then need `PluginConfig::fuel`.
    pub deterministic: bool,
    /// Directory for compiled artifacts reused across restarts; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Enforce wall-clock deadlines (the default). Epoch interruption puts a check at every guest
    /// function entry and loop header: 5–10 % of Wasm throughput in `wasmsched bench`
    /// (docs/benchmarks-history.md, session 20). Off, nothing bounds a call's run time but fuel (`deterministic`): only for
    /// measuring what the checks cost (`bench --compare-deadlines`), never for plugins one does not
    /// trust.
    pub deadlines: bool,
    /// Call a component's `placement` export when it has one (the default): usage changes ride
    /// along with `filter` and `score`, and tasks with empty lists go brief. Off, every component
    /// is called as one without it (`mirror-usage`, then `filter` or `score`): for measuring what
    /// it saves in one run (`bench --compare-placement`) and for testing both paths.
    pub placement_calls: bool,
    /// Largest component accepted, in bytes: checked before a file is read and before bytes are
    /// compiled. Compiling takes several times a component's size in memory; the built-in
    /// policies are well under 1 MiB, a Python policy (its interpreter inside) about 20 MiB.
    pub max_component_bytes: u64,
    /// Largest compiled artefact accepted, in bytes (from the compiler or the disk cache).
    pub max_artifact_bytes: u64,
}

/// Default [`RuntimeConfig::max_component_bytes`] unless `WASMSCHED_MAX_COMPONENT_MIB` says
/// otherwise (see [`component_limit`]).
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 48 << 20;

/// The largest component accepted: `WASMSCHED_MAX_COMPONENT_MIB` when set to a number of MiB,
/// else [`DEFAULT_MAX_COMPONENT_BYTES`]. Every reader of component files (the runtime, policy
/// sources, `policy push`) uses this one limit, so raising it is one setting.
pub fn component_limit() -> u64 {
    std::env::var("WASMSCHED_MAX_COMPONENT_MIB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_MAX_COMPONENT_BYTES, |mib| mib.saturating_mul(1 << 20))
}
/// Default [`RuntimeConfig::max_artifact_bytes`].
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 256 << 20;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 1,
            epoch_tick: Duration::from_millis(1),
            deterministic: false,
            cache_dir: None,
            deadlines: true,
            placement_calls: true,
            max_component_bytes: component_limit(),
            max_artifact_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
        }
    }
}

/// Loads and runs plugins. Cheap to share behind an `Arc`; dropping it stops the epoch ticker.
pub struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) cache: ArtifactCache,
    pub(crate) config: RuntimeConfig,
    pub(crate) observer: Option<FaultObserver>,
    ticker_stop: Arc<AtomicBool>,
}

impl Runtime {
    /// Build the engine and start the epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Self, LoadError> {
        if config.workers == 0 {
            return Err(LoadError::Runtime("workers must be at least 1".into()));
        }
        if config.epoch_tick.is_zero() {
            return Err(LoadError::Runtime("epoch_tick must be positive".into()));
        }
        let mut wc = Config::new();
        wc.epoch_interruption(config.deadlines)
            .consume_fuel(config.deterministic)
            .max_wasm_stack(512 * 1024)
            // We use no component-model async; skipping its per-store state makes calls cheaper.
            .concurrency_support(false);
        // `WASMSCHED_PERFMAP=1` writes /tmp/perf-<pid>.map so `perf report` can name guest functions.
        if std::env::var_os("WASMSCHED_PERFMAP").is_some() {
            wc.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&wc).map_err(|e| LoadError::Runtime(format!("{e:#}")))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| LoadError::Runtime(format!("{e:#}")))?;
        // WASI's monotonic clock lets a guest park the thread on the host's real clock, out of
        // reach of every deadline; ours is frozen and never waits (`host.rs`).
        linker.allow_shadowing(true);
        wasmtime_wasi::p2::bindings::clocks::monotonic_clock::add_to_linker::<HostState, HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| LoadError::Runtime(format!("{e:#}")))?;
        linker.allow_shadowing(false);
        host::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Runtime(format!("{e:#}")))?;
        topology::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Runtime(format!("{e:#}")))?;
        domains::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Runtime(format!("{e:#}")))?;
        accelerators::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Runtime(format!("{e:#}")))?;

        let cache = ArtifactCache::new(&engine, config.cache_dir.clone(), config.max_artifact_bytes)?;
        let ticker_stop = Arc::new(AtomicBool::new(false));
        if config.deadlines {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            let tick = config.epoch_tick;
            std::thread::Builder::new()
                .name("wasmsched-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| LoadError::Runtime(format!("cannot start epoch ticker: {e}")))?;
        }
        Ok(Runtime { engine, linker, cache, config, observer: None, ticker_stop })
    }

    /// Report every plugin fault to `observer` (plugins loaded afterwards).
    pub fn set_fault_observer(&mut self, observer: FaultObserver) {
        self.observer = Some(observer);
    }

    /// The runtime's settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Compile (or fetch from the cache), check the contract, and initialise one instance with the
    /// plugin's configuration. Nothing is shared with other plugins, so a failed load leaves
    /// everything else untouched.
    pub fn load(&self, wasm: &[u8], config: PluginConfig) -> Result<WasmPlugin, LoadError> {
        let (size, limit) = (wasm.len() as u64, self.config.max_component_bytes);
        if size > limit {
            return Err(LoadError::TooLarge { plugin: config.name, size, limit });
        }
        WasmPlugin::load(self, wasm, config)
    }

    /// Read a component file, refusing one over [`RuntimeConfig::max_component_bytes`] before
    /// reading it (and one that grows past the limit while it is read).
    pub fn read_component(&self, path: &Path) -> Result<Vec<u8>, LoadError> {
        read_component(path, self.config.max_component_bytes)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// Read the component file at `path`, refusing one over `limit` bytes before reading it (and one
/// that grows past the limit while it is read).
pub fn read_component(path: &Path, limit: u64) -> Result<Vec<u8>, LoadError> {
    let io = |source| LoadError::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let too_large = |size| LoadError::TooLarge { plugin: path.display().to_string(), size, limit };
    let size = file.metadata().map_err(io)?.len();
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}
