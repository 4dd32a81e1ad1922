//! What the score benches share: a built-in component loaded as the scheduler loads it.

use std::sync::Arc;
use std::time::Duration;

use wasmsched_core::PolicyPlugin;
use wasmsched_runtime::{PluginConfig, Runtime};

/// Built-in `b` on `rt`, with its default configuration.
pub fn load(rt: &Runtime, b: wasmsched_plugins::BuiltIn) -> Arc<dyn PolicyPlugin> {
    Arc::new(
        rt.load(b.wasm, PluginConfig::new(b.name).with_config(b.config).with_deadline(Duration::from_secs(1))).unwrap(),
    )
}
