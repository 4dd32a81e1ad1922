//! Cross-crate tests, one binary (one link step), one module per feature.

mod contract;
mod cycle;
mod differential;
mod fair_share;
mod hostile;
mod hot_reload;
mod javascript;
mod mutated;
mod python;
mod registry_nats;
mod reports;
mod runtime;
mod topology;

/// A real `nats-server` per test, shared with the events crate's tests.
#[path = "../../host/events/tests/all/support/mod.rs"]
mod nats_support;

use std::sync::{Arc, Mutex};

use wasmsched_core::PluginFault;
use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig, WasmPlugin};
use wasmsched_tests::fixtures;

/// A runtime whose fault observer records into the returned list.
pub fn runtime_with_faults(config: RuntimeConfig) -> (Runtime, Arc<Mutex<Vec<PluginFault>>>) {
    let mut rt = Runtime::new(config).expect("runtime");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    rt.set_fault_observer(Arc::new(move |f: &PluginFault| sink.lock().unwrap().push(f.clone())));
    (rt, seen)
}

/// A plugin configuration for tests whose subject is not timing: a generous deadline, so that a
/// loaded CI machine cannot turn a slow call into a deadline fault. Deadline tests set their own.
pub fn unhurried(name: impl Into<String>) -> PluginConfig {
    PluginConfig::new(name).with_deadline(std::time::Duration::from_secs(5))
}

/// Load the hostile fixture in `mode` (with an unhurried deadline).
pub fn hostile(rt: &Runtime, mode: &str) -> WasmPlugin {
    rt.load(&fixtures::read(fixtures::HOSTILE), unhurried(format!("hostile-{mode}")).with_config(mode))
        .unwrap_or_else(|e| panic!("load hostile {mode}: {e}"))
}
