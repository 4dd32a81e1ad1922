//! The policy set: which plugin serves each stage (filters in order, weighted scores, device
//! selection, preemption, fair share), stamped with its version.
//!
//! A cycle takes one set at its start and uses it throughout, so no decision mixes two versions.
//! Each filter keeps the verdicts it already gave (`placement::verdict_cache`).

use std::fmt;
use std::sync::Arc;

use wasmsched_api::{ClaimRequest, Task};

use crate::node_table::{NodeTable, Slot};
use crate::placement::verdict_cache::VerdictCache;
use crate::plugin::{CallContext, FailurePolicy, PluginFault, PolicyPlugin};

/// An immutable set of plugins for the stages. A cycle takes one set at its start and uses it
/// throughout, so no decision mixes two versions.
#[derive(Clone, Default)]
pub struct PolicySet {
    version: u64,
    pub(crate) filters: Vec<FilterStage>,
    pub(crate) scores: Vec<(Arc<dyn PolicyPlugin>, u32)>,
    pub(crate) devices: Option<Arc<dyn PolicyPlugin>>,
    preempt: Option<Arc<dyn PolicyPlugin>>,
    fair_share: Option<Arc<dyn PolicyPlugin>>,
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySet")
            .field("version", &self.version)
            .field("filters", &self.filters.iter().map(|f| f.plugin.name()).collect::<Vec<_>>())
            .field("scores", &self.scores.iter().map(|(p, w)| (p.name(), *w)).collect::<Vec<_>>())
            .field("devices", &self.devices.as_ref().map(|p| p.name()))
            .field("preempt", &self.preempt.as_ref().map(|p| p.name()))
            .field("fair_share", &self.fair_share.as_ref().map(|p| p.name()))
            .finish()
    }
}

impl PolicySet {
    /// Start building a set.
    pub fn builder() -> PolicySetBuilder {
        PolicySetBuilder { set: PolicySet::default() }
    }

    /// Version stamp, recorded with every decision.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The filters, in order.
    pub(crate) fn filters(&self) -> &[FilterStage] {
        &self.filters
    }

    /// Every plugin of the set once, in stage order (filters, scores, devices, preempt, fair
    /// share), with the stages it serves: what a dashboard or a log shows of the set.
    pub fn plugin_stages(&self) -> Vec<(&str, &[wasmsched_api::Stage])> {
        let mut out: Vec<(&str, &[wasmsched_api::Stage])> = Vec::new();
        for p in self.plugins() {
            if !out.iter().any(|(n, _)| *n == p.name()) {
                out.push((p.name(), p.stages()));
            }
        }
        out
    }

    /// The preempt plugin, if preemption is enabled.
    pub fn preempt(&self) -> Option<&Arc<dyn PolicyPlugin>> {
        self.preempt.as_ref()
    }

    /// The fair-share plugin; without one, queues are served in tree order and nothing is reclaimed.
    pub fn fair_share(&self) -> Option<&Arc<dyn PolicyPlugin>> {
        self.fair_share.as_ref()
    }

    /// Whether the device-selection plugin may rank a DRA claim's candidate devices
    /// ([`PolicySet::rank_claim_devices`]); when not, there is no request to build.
    pub fn ranks_claim_devices(&self) -> bool {
        self.devices.as_ref().is_some_and(|p| p.ranks_claim_devices())
    }

    /// The device-selection plugin's order of a DRA claim request's candidates on `node` (the
    /// node called `node` in `nodes`), most wanted first; `None` when there is no such plugin, it
    /// does not rank, or it faulted (the host's own order is used then: a ranking is a
    /// preference, never a reason to refuse a placement).
    pub fn rank_claim_devices(
        &self,
        nodes: &NodeTable,
        task: &Task,
        node: &str,
        request: &ClaimRequest,
    ) -> Option<Vec<u32>> {
        let plugin = self.devices.as_ref()?;
        let slot = nodes.slot_of(node)?;
        match plugin.rank_claim_devices(CallContext { worker: 0, nodes }, task, slot, request) {
            Ok(order) => order,
            Err(fault) => {
                tracing::warn!(plugin = plugin.name(), %fault, "ranking DRA devices failed; the host's order is used");
                None
            }
        }
    }

    /// Let every plugin catch up with `nodes` by at most `max_changes` changes
    /// ([`PolicyPlugin::catch_up`]); `true` once all are up to date. A plugin serving several
    /// stages is asked once per stage, which only repeats an up-to-date check.
    pub fn catch_up(&self, nodes: &NodeTable, max_changes: usize) -> bool {
        self.catch_up_where(nodes, max_changes, |_| true)
    }

    /// [`PolicySet::catch_up`] for the plugins `other` does not also hold. A version that kept
    /// the live version's plugins is caught up off the loop this way: the loop keeps those
    /// current itself, and a catch-up would hold their instances while the loop waits for them.
    pub fn catch_up_apart_from(&self, other: &PolicySet, nodes: &NodeTable, max_changes: usize) -> bool {
        self.catch_up_where(nodes, max_changes, |p| {
            !other.plugins().any(|o| std::ptr::addr_eq(Arc::as_ptr(o), Arc::as_ptr(p)))
        })
    }

    fn catch_up_where(
        &self,
        nodes: &NodeTable,
        max_changes: usize,
        mut wanted: impl FnMut(&Arc<dyn PolicyPlugin>) -> bool,
    ) -> bool {
        // Every plugin takes its step, whether or not an earlier one is done.
        let mut done = true;
        for p in self.plugins().filter(|p| wanted(p)) {
            done &= p.catch_up(nodes, max_changes);
        }
        done
    }

    /// Every stage's plugin, in pipeline order (a plugin serving several stages once per stage).
    fn plugins(&self) -> impl Iterator<Item = &Arc<dyn PolicyPlugin>> {
        let staged = self.filters.iter().map(|f| &f.plugin).chain(self.scores.iter().map(|(p, _)| p));
        staged.chain([&self.devices, &self.preempt, &self.fair_share].into_iter().flatten())
    }

    /// The same plugins with none of the verdicts they gave so far (each filter keeps whether it
    /// reuses them): what a benchmark's repeated runs start from.
    pub fn with_fresh_verdicts(&self) -> PolicySet {
        let mut set = self.clone();
        for f in &mut set.filters {
            if f.verdicts.is_some() {
                f.verdicts = Some(Arc::default());
            }
        }
        set
    }

    /// Filter verdicts reused so far and verdicts asked of the filters (those that reuse), over
    /// every copy of this set sharing its verdicts.
    pub fn verdict_counts(&self) -> (u64, u64) {
        self.filters
            .iter()
            .filter_map(|f| f.verdicts.as_ref())
            .map(|v| v.counts())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Let filter `index` share the verdicts of filter `from_index` of `previous` (both must reuse
    /// verdicts): for a new policy version whose filter is the same component with the same
    /// configuration as the live one's, so its first decisions do not start cold. The caller
    /// vouches for the sameness; verdicts stay tied to node stamps, so they remain exact.
    pub fn inherit_verdicts(&mut self, index: usize, previous: &PolicySet, from_index: usize) {
        let (Some(stage), Some(from)) = (self.filters.get_mut(index), previous.filters.get(from_index)) else {
            return;
        };
        if stage.verdicts.is_some() && from.verdicts.is_some() {
            stage.verdicts = from.verdicts.clone();
        }
    }

    /// The same plugins, every filter asked about every node every time (to measure what reuse
    /// saves, or to rule it out).
    pub fn without_verdict_reuse(&self) -> PolicySet {
        let mut set = self.clone();
        for f in &mut set.filters {
            f.verdicts = None;
        }
        set
    }
}

/// A filter of a set and, unless disabled, the verdicts it already gave. Clones of a set share
/// the verdicts (same plugins, same answers); a new set starts with none.
#[derive(Clone)]
pub(crate) struct FilterStage {
    plugin: Arc<dyn PolicyPlugin>,
    verdicts: Option<Arc<VerdictCache>>,
}

impl FilterStage {
    /// The plugin's registered name.
    pub(crate) fn name(&self) -> &str {
        self.plugin.name()
    }

    /// What to do when it faults.
    pub(crate) fn failure_policy(&self) -> FailurePolicy {
        self.plugin.failure_policy()
    }

    /// Its verdicts on `candidates`, reusing known ones; allowed to cover only the candidates up
    /// to (at least) the `enough`-th that fits ([`PolicyPlugin::filter_until`]).
    pub(crate) fn filter(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<wasmsched_api::batch::FilterBatch, PluginFault> {
        match &self.verdicts {
            Some(cache) => cache.filter(self.plugin.as_ref(), ctx, task, candidates, enough),
            None => self.plugin.filter_until(ctx, task, candidates, enough),
        }
    }
}

/// Builds a [`PolicySet`].
pub struct PolicySetBuilder {
    set: PolicySet,
}

impl PolicySetBuilder {
    /// Add a filter; filters run in the order added, each on the nodes the previous ones passed.
    /// Its verdicts are reused for equal tasks (the same record apart from the id) on nodes whose
    /// state has not changed since, as the contract allows (`crate::placement::verdict_cache`).
    pub fn filter(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.filters.push(FilterStage { plugin: p, verdicts: Some(Arc::default()) });
        self
    }

    /// Add a filter that is asked about every node every time: for a filter whose verdicts depend
    /// on more than the task and the node (which the contract does not allow, but a test fixture
    /// or a plugin under development may do).
    pub fn filter_uncached(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.filters.push(FilterStage { plugin: p, verdicts: None });
        self
    }

    /// Add a score with its weight.
    pub fn score(mut self, p: Arc<dyn PolicyPlugin>, weight: u32) -> Self {
        self.set.scores.push((p, weight));
        self
    }

    /// Use a device-selection plugin instead of [`default_select_devices`].
    pub fn devices(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.devices = Some(p);
        self
    }

    /// Enable preemption with this plugin choosing the victims.
    pub fn preempt(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.preempt = Some(p);
        self
    }

    /// Compute deserved shares and the queue order with this plugin.
    pub fn fair_share(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.fair_share = Some(p);
        self
    }

    /// Stamp a version.
    pub fn version(mut self, version: u64) -> Self {
        self.set.version = version;
        self
    }

    /// The set.
    pub fn build(self) -> PolicySet {
        self.set
    }
}
