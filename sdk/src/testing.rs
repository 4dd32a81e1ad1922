//! Run a plugin natively in unit tests, with the batch semantics of the component.
//!
//! The host crate `wasmsched-runtime` offers the other half (loading the compiled component), so a
//! test can assert that both answer identically; see `tests/all/differential.rs`.

use wasmsched_api::batch::{FilterBatch, filter_batch, score_batch};
use wasmsched_api::{DeviceShare, Node, Plugin, Rejection, Stages, Task, Verdict};

/// A plugin instance driven natively.
pub struct NativeHarness<P> {
    plugin: P,
}

impl<P: Plugin + Stages> NativeHarness<P> {
    /// Configure the plugin as the host would.
    pub fn new(config: &str) -> Result<Self, String> {
        Ok(NativeHarness { plugin: P::new(config)? })
    }

    /// The plugin itself.
    pub fn plugin(&mut self) -> &mut P {
        &mut self.plugin
    }

    /// Filter `nodes` as one batch; `None` if the plugin has no filter stage.
    pub fn filter(&mut self, task: &Task, nodes: &[Node]) -> Option<Vec<Verdict>> {
        let f = self.plugin.as_filter()?;
        Some(decode(&filter_batch(f, task, nodes)))
    }

    /// Score `nodes` as one batch (normalised); `None` if the plugin has no score stage.
    pub fn score(&mut self, task: &Task, nodes: &[Node]) -> Option<Vec<u32>> {
        let s = self.plugin.as_score()?;
        Some(score_batch(s, task, nodes))
    }

    /// Select devices on `node`; `None` if the plugin has no such stage.
    pub fn select_devices(&mut self, task: &Task, node: &Node) -> Option<Result<Vec<DeviceShare>, Rejection>> {
        Some(self.plugin.as_select_devices()?.select_devices(task, node))
    }
}

fn decode(batch: &FilterBatch) -> Vec<Verdict> {
    batch
        .codes
        .iter()
        .map(|&c| match c {
            0 => Verdict::Fit,
            k => {
                let r = &batch.reasons[usize::from(k) - 1];
                if r.unresolvable { Verdict::unresolvable(r.reason.clone()) } else { Verdict::unfit(r.reason.clone()) }
            }
        })
        .collect()
}
