//! Build the policy set the commands run, from built-in plugins, as Wasm or native.

use std::sync::Arc;

use anyhow::{Context, bail};
use wasmsched_core::{NativePlugin, PolicyPlugin, PolicySet};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_runtime::{PluginConfig, Runtime};

/// `resource-fit` then the named score, from `runtime` (Wasm) or native when `runtime` is `None`.
pub fn reference_set(runtime: Option<&Runtime>, score: &str) -> anyhow::Result<PolicySet> {
    let Some(score_builtin) = wasmsched_plugins::by_name(score).filter(|b| b.name.ends_with("-allocated")) else {
        bail!("unknown score policy {score:?}: use least-allocated or most-allocated");
    };
    let fit = wasmsched_plugins::RESOURCE_FIT;
    let (filter, score): (Arc<dyn PolicyPlugin>, Arc<dyn PolicyPlugin>) = match runtime {
        Some(rt) => (
            Arc::new(rt.load(fit.wasm, PluginConfig::new(fit.name)).context("loading resource-fit")?),
            Arc::new(
                rt.load(score_builtin.wasm, PluginConfig::new(score_builtin.name).with_config(score_builtin.config))
                    .with_context(|| format!("loading {}", score_builtin.name))?,
            ),
        ),
        None => (
            Arc::new(NativePlugin::<ResourceFit>::new(fit.config, 1).map_err(anyhow::Error::msg)?),
            Arc::new(
                NativePlugin::<AllocationScore>::new(score_builtin.config, 1)
                    .map_err(anyhow::Error::msg)?
                    .named(score_builtin.name),
            ),
        ),
    };
    Ok(PolicySet::builder().filter(filter).score(score, 1).version(1).build())
}
