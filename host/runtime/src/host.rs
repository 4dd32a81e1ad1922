//! Per-instance host state: the deny-all WASI context, the memory limiter, the call's budget and
//! the `host` imports.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::ResourceLimiter;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{Deterministic, HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use wasmsched_api::accelerators::AcceleratorView;
use wasmsched_api::domains::DomainView;
use wasmsched_api::topology::TopologyView;

use crate::bindings::wasmsched::policy::accelerators;
use crate::bindings::wasmsched::policy::domains::{self, Domain};
use crate::bindings::wasmsched::policy::host::{self, LogLevel};
use crate::bindings::wasmsched::policy::topology::{self, GpuLink, GpuSet, NumaPolicy};

/// Longest log message kept; longer ones are cut.
const MAX_LOG_BYTES: usize = 1024;
/// Log lines a single call may emit; the rest are counted and dropped.
const MAX_LOGS_PER_CALL: u32 = 16;
/// WASI handles (streams, pollables, sockets) one instance may hold at once. A policy needs a
/// handful; without a cap a guest could fill host memory, which the memory cap does not see.
pub(crate) const MAX_HANDLES: usize = 1024;
/// Random bytes one WASI call may ask for (the host allocates them outside the memory cap).
const MAX_RANDOM_BYTES: u64 = 1 << 20;

pub(crate) struct HostState {
    plugin: Arc<str>,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    logs_this_call: u32,
    /// The last error-level message (a panic message, usually), to explain a trap.
    pub(crate) last_error: Option<String>,
    /// Answers `topology` imports during the current call (the node table's snapshot).
    pub(crate) topology: Option<Arc<dyn TopologyView>>,
    /// Answers `domains` imports during the current call (a snapshot of the table's domains,
    /// dropped after the call so the table changes its own copy again).
    pub(crate) domains: Option<Arc<dyn DomainView>>,
    /// Answers `accelerators` imports during the current call.
    pub(crate) accelerators: Option<Arc<dyn AcceleratorView>>,
    /// The running guest call's budget, read by the epoch-deadline callback.
    pub(crate) budget: crate::budget::Budget,
    /// Set when the callback cut a call: what it had used.
    pub(crate) overrun: Option<crate::budget::Overrun>,
}

impl HostState {
    pub(crate) fn new(plugin: Arc<str>, memory_limit: usize) -> Self {
        let wasi = WasiCtx::builder()
            // Deterministic and sealed: no clock, no entropy, no network, no files, no env.
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .secure_random(Deterministic::new(vec![0x5a, 0x17, 0xc3, 0x9e]))
            .insecure_random(Deterministic::new(vec![0x3c, 0xa5, 0x0f, 0x71]))
            .insecure_random_seed(0x7761_736d_7363_6865_6400)
            // A request is a host allocation the memory cap does not see: keep it small.
            .max_random_size(MAX_RANDOM_BYTES)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_HANDLES);
        HostState {
            plugin,
            wasi,
            table,
            limiter: MemoryLimiter { max_bytes: memory_limit, asked: None },
            logs_this_call: 0,
            last_error: None,
            topology: None,
            domains: None,
            accelerators: None,
            budget: crate::budget::Budget::default(),
            overrun: None,
        }
    }

    /// Reset per-call state before a call.
    pub(crate) fn begin_call(&mut self) {
        self.logs_this_call = 0;
        self.limiter.asked = None;
        self.last_error = None;
        self.overrun = None;
    }

    /// A pollable that is ready at once: see the `monotonic_clock::Host` impl.
    fn already_due(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let due = self.table.push(AlreadyDue)?;
        subscribe(&mut self.table, due)
    }
}

/// The guest's monotonic clock, replacing WASI's own. Time is frozen at zero for a plugin, and a
/// plugin may not wait: WASI's `subscribe-duration`/`subscribe-instant` would park the calling
/// thread on the host's real clock (a `sleep` in the guest), where no epoch deadline can reach it
/// because the guest runs no code. Here every subscription is due at once, so a sleep returns
/// immediately, `poll` never blocks, and a guest that waits in a loop spins in its own code, where
/// its CPU budget cuts it.
impl monotonic_clock::Host for HostState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(HostMonotonicClock::now(&FrozenClock))
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(HostMonotonicClock::resolution(&FrozenClock))
    }

    fn subscribe_instant(&mut self, _when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.already_due()
    }

    fn subscribe_duration(&mut self, _duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.already_due()
    }
}

/// A clock subscription that is always due.
struct AlreadyDue;

#[wasmtime_wasi::async_trait]
impl Pollable for AlreadyDue {
    async fn ready(&mut self) {}
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Longest node name a plugin may ask about; longer ones are simply unknown.
const MAX_NODE_NAME: usize = 253;

impl topology::Host for HostState {
    fn best_gpus(&mut self, node: String, count: u32, policy: NumaPolicy, free: u64) -> Option<Result<GpuSet, String>> {
        if node.len() > MAX_NODE_NAME {
            return None;
        }
        let policy = match policy {
            NumaPolicy::None => wasmsched_api::topology::NumaPolicy::None,
            NumaPolicy::BestEffort => wasmsched_api::topology::NumaPolicy::BestEffort,
            NumaPolicy::Restricted => wasmsched_api::topology::NumaPolicy::Restricted,
            NumaPolicy::SingleNumaNode => wasmsched_api::topology::NumaPolicy::SingleNumaNode,
        };
        let answer = self.topology.as_ref()?.best_gpus(&node, count, policy, free)?;
        Some(answer.map(|s| GpuSet {
            gpus: s.gpus,
            bottleneck_mbps: s.bottleneck_mbps,
            distance_milli: s.distance_milli,
            numa_span: s.numa_span,
            score: s.score,
        }))
    }

    fn link(&mut self, node: String, a: u32, b: u32) -> Option<GpuLink> {
        if node.len() > MAX_NODE_NAME {
            return None;
        }
        let l = self.topology.as_ref()?.link(&node, a, b)?;
        Some(GpuLink {
            class: l.class,
            nvswitch: l.nvswitch,
            bandwidth_mbps: l.bandwidth_mbps,
            distance_milli: l.distance_milli,
        })
    }
}

impl domains::Host for HostState {
    fn levels(&mut self) -> Vec<String> {
        self.domains.as_ref().map(|d| d.levels()).unwrap_or_default()
    }

    fn domain_named(&mut self, level: u32, name: String) -> Option<Domain> {
        let d = self.domains.as_ref()?.domain(level, &name)?;
        Some(Domain {
            name: d.name,
            nodes: d.nodes,
            idle_nodes: d.idle_nodes,
            gpu_milli: d.gpu_milli,
            free_gpu_milli: d.free_gpu_milli,
        })
    }
}

impl accelerators::Host for HostState {
    fn kinds(&mut self) -> Vec<accelerators::Kind> {
        let kinds = self.accelerators.as_ref().map(|a| a.kinds()).unwrap_or_default();
        kinds.into_iter().map(|k| accelerators::Kind { name: k.name, resources: k.resources }).collect()
    }

    fn device_kinds(&mut self, node: String) -> Vec<String> {
        if node.len() > MAX_NODE_NAME {
            return Vec::new();
        }
        self.accelerators.as_ref().and_then(|a| a.device_kinds(&node)).unwrap_or_default()
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: LogLevel, mut message: String) {
        if matches!(level, LogLevel::Error) {
            self.last_error = Some(truncate(message.clone(), MAX_LOG_BYTES));
        }
        self.logs_this_call += 1;
        if self.logs_this_call > MAX_LOGS_PER_CALL {
            return;
        }
        message = truncate(message, MAX_LOG_BYTES);
        let plugin = &*self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, "{message}"),
            LogLevel::Info => tracing::info!(plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, "{message}"),
            LogLevel::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

/// Cut `s` to at most `max` bytes (on a character boundary), marking the cut.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Caps linear memory; remembers what a refused growth asked for, so that a following trap is
/// reported as a memory fault (with the cap and the request) rather than a generic one.
pub(crate) struct MemoryLimiter {
    pub(crate) max_bytes: usize,
    /// The size in bytes a refused growth asked for, since the call began.
    pub(crate) asked: Option<usize>,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.asked = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// A clock stuck at zero: policies must be functions of their inputs.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}
