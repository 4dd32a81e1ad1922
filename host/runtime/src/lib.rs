//! Runs wasmsched policy plugins as sandboxed WebAssembly components.
//!
//! This is the only crate that touches wasmtime. It turns component bytes into a
//! [`WasmPlugin`], which implements the core's `PolicyPlugin` trait exactly like a native plugin,
//! so the scheduling core never knows which kind it calls.
//!
//! # Core concepts
//! - [`Runtime`]: one wasmtime engine, an epoch ticker thread for deadlines, a linker with a
//!   deny-all WASI context, and a compiled-artifact cache keyed by content hash and engine.
//! - [`PluginConfig`]: name, configuration text, budgets (deadline, memory, fuel), failure policy
//!   and circuit breaker — per plugin.
//! - [`WasmPlugin`]: a loaded plugin with a pool of instances, one per worker, each keeping a
//!   mirror of the node table current with generation-numbered deltas.
//! - [`PluginMetrics`]: calls, faults by kind and latency histograms per stage.
//!
//! # Sandbox and budgets
//! Every call runs under a CPU-time deadline (default 10 ms of its thread's CPU, checked when the
//! epoch deadline fires, so time spent waiting for a CPU is not charged; `budget.rs`) with a
//! wall-clock ceiling, and a memory cap (default 64 MiB), and under fuel when the runtime is
//! deterministic (the simulator). Instantiation with `init` (ten calls' worth, at least 1 s) and
//! each mirror call that copies nodes into an instance (ten calls' worth) get more: the runtime
//! asks for that work, the policy does not decide it. Plugins see no filesystem, network,
//! environment, arguments or real clock (WASI clocks are frozen at zero, randomness is a fixed
//! sequence), and cannot wait: every clock subscription is due at once, so no WASI call parks the
//! thread out of the deadline's reach. Component files, compiled artefacts and WASI handles are
//! bounded too. A trap, an exhausted budget or a malformed answer discards the instance (the next
//! call gets a fresh one), is recorded in metrics and reported to the fault observer, and the
//! caller applies the plugin's failure policy. Repeated failures open a circuit breaker.
//!
//! # Example
//! ```
//! use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig};
//! use wasmsched_core::PolicyPlugin;
//!
//! let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
//! let fit = wasmsched_plugins::RESOURCE_FIT;
//! let plugin = runtime.load(fit.wasm, PluginConfig::new(fit.name)).unwrap();
//! assert_eq!(plugin.name(), "resource-fit");
//! ```

mod bindings;
mod breaker;
mod budget;
mod cache;
mod engine;
mod error;
mod host;
mod metrics;
mod plugin;

pub use breaker::BreakerConfig;
pub use engine::{
    DEFAULT_MAX_ARTIFACT_BYTES, DEFAULT_MAX_COMPONENT_BYTES, Runtime, RuntimeConfig, component_limit, read_component,
};
pub use error::LoadError;
pub use metrics::{FAULT_KINDS, FaultObserver, LatencySnapshot, PluginMetrics, StageSnapshot};
pub use plugin::{PluginConfig, WasmPlugin};

/// Compile-time check that what worker threads share stays thread-safe.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Runtime>();
    check::<WasmPlugin>();
}
