//! Helpers shared by the crate's unit tests.

use std::sync::Arc;

use wasmsched_api::{DeviceShare, Resources, ShareDecision, Task};

use crate::node_table::Slot;
use crate::plugin::{PluginFault, PolicyPlugin};

/// Counts the filter and fair-share calls a plugin gets, to show what the cycle and the sampled
/// scan save (a Wasm plugin pays per call: the task is lowered into it again).
pub(crate) struct Counting {
    inner: Arc<dyn PolicyPlugin>,
    filters: std::sync::atomic::AtomicUsize,
    shares: std::sync::atomic::AtomicUsize,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn PolicyPlugin>) -> Arc<Self> {
        Arc::new(Counting { inner, filters: Default::default(), shares: Default::default() })
    }
    /// Filter calls and fair-share calls so far.
    pub(crate) fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.filters.load(Relaxed), self.shares.load(Relaxed))
    }
}

impl PolicyPlugin for Counting {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn stages(&self) -> &[wasmsched_api::Stage] {
        self.inner.stages()
    }
    fn failure_policy(&self) -> crate::plugin::FailurePolicy {
        self.inner.failure_policy()
    }
    fn filter_until(
        &self,
        ctx: crate::plugin::CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<wasmsched_api::batch::FilterBatch, PluginFault> {
        self.filters.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.filter_until(ctx, task, candidates, enough)
    }
    fn score(&self, ctx: crate::plugin::CallContext<'_>, task: &Task, c: &[Slot]) -> Result<Vec<u32>, PluginFault> {
        self.inner.score(ctx, task, c)
    }
    fn select_devices(
        &self,
        ctx: crate::plugin::CallContext<'_>,
        task: &Task,
        node: Slot,
    ) -> Result<Result<Vec<DeviceShare>, wasmsched_api::Rejection>, PluginFault> {
        self.inner.select_devices(ctx, task, node)
    }
    fn select_victims(
        &self,
        ctx: crate::plugin::CallContext<'_>,
        preemptor: &Task,
        candidates: &[wasmsched_api::PreemptCandidate],
    ) -> Result<Option<wasmsched_api::Preemption>, PluginFault> {
        self.inner.select_victims(ctx, preemptor, candidates)
    }
    fn fair_share(
        &self,
        worker: usize,
        queues: &[wasmsched_api::QueueState],
        cluster: &Resources,
    ) -> Result<ShareDecision, PluginFault> {
        self.shares.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.fair_share(worker, queues, cluster)
    }
}
