//! One placement decision: filter → score → device selection for one task.
//!
//! This is the inner step of a scheduling cycle; queues, gangs and preemption build on it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use wasmsched_api::{DeviceShare, Task};

use crate::alloc::default_select_devices;
use crate::node_table::{NodeTable, Slot};
use crate::plugin::{CallContext, FailurePolicy, PluginFault, PolicyPlugin, validate};
use crate::verdicts::VerdictCache;

/// An immutable set of plugins for the stages. A cycle takes one set at its start and uses it
/// throughout, so no decision mixes two versions.
#[derive(Clone, Default)]
pub struct PolicySet {
    version: u64,
    filters: Vec<FilterStage>,
    scores: Vec<(Arc<dyn PolicyPlugin>, u32)>,
    devices: Option<Arc<dyn PolicyPlugin>>,
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

    /// The preempt plugin, if preemption is enabled.
    pub fn preempt(&self) -> Option<&Arc<dyn PolicyPlugin>> {
        self.preempt.as_ref()
    }

    /// The fair-share plugin; without one, queues are served in tree order and nothing is reclaimed.
    pub fn fair_share(&self) -> Option<&Arc<dyn PolicyPlugin>> {
        self.fair_share.as_ref()
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
    /// state has not changed since, as the contract allows (`crate::verdicts`).
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

/// Where a task goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The chosen node.
    pub node: Slot,
    /// GPUs on it.
    pub devices: Vec<DeviceShare>,
    /// Its weighted total score.
    pub score: u64,
    /// How many nodes passed filtering.
    pub feasible: usize,
    /// Faults of fail-open plugins that were skipped.
    pub skipped_faults: Vec<PluginFault>,
}

/// Why a task could not be placed: rejections aggregated by plugin and reason, and faults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnosis {
    /// `(plugin, reason) -> (nodes, unresolvable)`.
    pub rejections: BTreeMap<(String, String), (usize, bool)>,
    /// Plugin faults seen (fail-closed ones make the task unschedulable on their own).
    pub faults: Vec<PluginFault>,
    /// Nodes considered.
    pub candidates: usize,
}

impl Diagnosis {
    /// Whether preemption could help: some node was rejected only for resolvable reasons.
    /// (Approximation: true when any resolvable rejection was seen.)
    pub fn preemption_may_help(&self) -> bool {
        self.rejections.values().any(|&(_, unresolvable)| !unresolvable)
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes available", self.candidates)?;
        let mut by_count: Vec<_> = self.rejections.iter().collect();
        by_count.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
        for ((plugin, reason), (n, _)) in by_count {
            write!(f, "; {n} nodes: {reason} ({plugin})")?;
        }
        for fault in &self.faults {
            write!(f, "; {fault}")?;
        }
        Ok(())
    }
}

/// A task that could not be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("task unschedulable: {diagnosis}")]
pub struct Unschedulable {
    /// Why.
    pub diagnosis: Diagnosis,
}

/// Place `task` on `nodes` with `set`, on worker `worker`.
///
/// Filters run in order over all nodes (each on the survivors of the previous), scores are summed
/// with their weights, and the highest total wins; ties go to the lowest slot, so the result is
/// deterministic. Device selection then runs on the winner, falling back to the next best node if
/// it refuses. A fail-closed plugin fault makes the task unschedulable; a fail-open one is skipped.
pub fn place(set: &PolicySet, nodes: &NodeTable, task: &Task, worker: usize) -> Result<Placement, Unschedulable> {
    place_among(set, nodes, task, worker, nodes.occupied())
}

/// [`place`] restricted to `candidates` (ascending slots; e.g. one topology domain).
pub fn place_among(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    candidates: &[Slot],
) -> Result<Placement, Unschedulable> {
    let ctx = CallContext { worker, nodes };
    let candidates: Vec<Slot> = candidates.iter().copied().filter(|&s| nodes.get(s).is_some()).collect();
    let mut run =
        Run { diagnosis: Diagnosis { candidates: candidates.len(), ..Default::default() }, skipped: Vec::new() };
    let feasible = run.filter_chain(set, ctx, task, candidates, usize::MAX)?;
    run.choose(set, ctx, task, feasible)
}

/// One node's verdict under a set's filters: `None` when it passes, else the first rejecting
/// plugin's reason and whether preemption could not help.
pub type NodeVerdict = Option<(String, bool)>;

/// Each of `candidates`' verdicts under `set`'s filters, in order (a node rejected by one filter is
/// not shown to the next). For callers that answer per node — a kube-scheduler extender's
/// `filter` — rather than pick one. A fail-open plugin's fault skips it; a fail-closed one is the
/// error.
pub fn filter_each(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    candidates: &[Slot],
) -> Result<Vec<NodeVerdict>, PluginFault> {
    let ctx = CallContext { worker, nodes };
    let mut verdicts: Vec<NodeVerdict> = vec![None; candidates.len()];
    let mut alive: Vec<usize> = (0..candidates.len()).filter(|&i| nodes.get(candidates[i]).is_some()).collect();
    for i in (0..candidates.len()).filter(|&i| nodes.get(candidates[i]).is_none()) {
        verdicts[i] = Some(("node not found".into(), true));
    }
    for filter in &set.filters {
        if alive.is_empty() {
            break;
        }
        let slots: Vec<Slot> = alive.iter().map(|&i| candidates[i]).collect();
        match filter.filter(ctx, task, &slots, usize::MAX) {
            Ok(batch) => {
                alive.retain(|&i| {
                    let k = slots.iter().position(|&s| s == candidates[i]).expect("asked about it");
                    match usize::from(batch.codes[k]) {
                        0 => true,
                        code => {
                            let r = &batch.reasons[code - 1];
                            verdicts[i] = Some((format!("{} ({})", r.reason, filter.name()), r.unresolvable));
                            false
                        }
                    }
                });
            }
            Err(_) if filter.failure_policy() == FailurePolicy::FailOpen => {}
            Err(fault) => return Err(fault),
        }
    }
    Ok(verdicts)
}

/// Each of `candidates`' weighted total score under `set` (no filtering), for callers that rank
/// nodes chosen elsewhere — a kube-scheduler extender's `prioritize`.
pub fn score_each(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    candidates: &[Slot],
) -> Result<Vec<u64>, PluginFault> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    weighted_scores(set, CallContext { worker, nodes }, task, candidates, &mut Vec::new())
}

/// The set's weighted total per candidate; a fail-open plugin's fault goes to `skipped` and its
/// score counts as 0, a fail-closed one is the error.
fn weighted_scores(
    set: &PolicySet,
    ctx: CallContext<'_>,
    task: &Task,
    candidates: &[Slot],
    skipped: &mut Vec<PluginFault>,
) -> Result<Vec<u64>, PluginFault> {
    let mut totals = vec![0u64; candidates.len()];
    for (score, weight) in &set.scores {
        match score.score(ctx, task, candidates) {
            Ok(scores) => {
                for (t, s) in totals.iter_mut().zip(scores) {
                    *t += u64::from(s) * u64::from(*weight);
                }
            }
            Err(fault) if score.failure_policy() == FailurePolicy::FailOpen => skipped.push(fault),
            Err(fault) => return Err(fault),
        }
    }
    Ok(totals)
}

/// The set's device selection on one node (its plugin, else the default rule; a fail-open fault
/// falls back to the default and goes to `skipped`), not yet checked against the node.
fn select_devices(
    set: &PolicySet,
    ctx: CallContext<'_>,
    task: &Task,
    slot: Slot,
    node: &wasmsched_api::Node,
    skipped: &mut Vec<PluginFault>,
) -> Result<Result<Vec<DeviceShare>, wasmsched_api::Rejection>, PluginFault> {
    Ok(match &set.devices {
        None => default_select_devices(task, node),
        Some(p) => match p.select_devices(ctx, task, slot) {
            Ok(r) => r,
            Err(fault) if p.failure_policy() == FailurePolicy::FailOpen => {
                skipped.push(fault);
                default_select_devices(task, node)
            }
            Err(fault) => return Err(fault),
        },
    })
}

/// The GPUs `set` gives `task` on node `slot` (its device-selection plugin, else the default
/// rule), checked against the node; the reason when none fit.
pub fn select_devices_on(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    slot: Slot,
) -> Result<Vec<DeviceShare>, String> {
    let node = nodes.get(slot).ok_or("node not found")?;
    let chosen = select_devices(set, CallContext { worker, nodes }, task, slot, node, &mut Vec::new());
    let devices = chosen.map_err(|fault| fault.to_string())?.map_err(|r| r.reason)?;
    validate::devices(&devices, task, node)?;
    Ok(devices)
}

/// kube-scheduler's rule for how many feasible nodes to look for before scoring
/// (`percentageOfNodesToScore`): every node below 100 nodes; otherwise `percentage` % of them
/// (adaptive when `None`: 50 % minus 1 % per 125 nodes, at least 5 %), and never fewer than 100.
pub fn feasible_nodes_to_find(total: usize, percentage: Option<u32>) -> usize {
    const MIN_NODES: usize = 100;
    if total < MIN_NODES || percentage.is_some_and(|p| p >= 100) {
        return total;
    }
    let pct = match percentage {
        Some(p) if p > 0 => p as usize,
        _ => 50usize.saturating_sub(total / 125).max(5),
    };
    (total * pct / 100).max(MIN_NODES)
}

/// Outcome of [`place_sampled`]: the placement (or why not) and how many nodes were examined, so
/// the caller can start the next search where this one stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampled {
    /// The placement.
    pub result: Result<Placement, Unschedulable>,
    /// Nodes filtered.
    pub examined: usize,
}

/// [`place`] among the first `find` feasible nodes in scan order: the occupied slots from position
/// `start`, wrapping (kube-scheduler's rule). `examined` counts the nodes up to and including the
/// `find`-th feasible one (all of them when fewer fit); the caller rotates `start` by it between
/// decisions, as kube-scheduler does, so every node is considered in turn. Deterministic for a
/// given `start`, and independent of how the scan is cut into filter calls ([`next_window`]).
pub fn place_sampled(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    start: usize,
    find: usize,
) -> Sampled {
    place_sampled_among(set, nodes, task, worker, nodes.occupied(), start, find)
}

/// [`place_sampled`] restricted to `candidates` (a gang's topology domain, for instance); `start`
/// is a position in `candidates`.
pub fn place_sampled_among(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    candidates: &[Slot],
    start: usize,
    find: usize,
) -> Sampled {
    let ctx = CallContext { worker, nodes };
    let n = candidates.len();
    let mut run = Run { diagnosis: Diagnosis::default(), skipped: Vec::new() };
    let want = find.max(1);
    let mut feasible = Vec::new();
    let mut examined = 0;
    while examined < n && feasible.len() < want {
        let window = next_window(want - feasible.len(), examined, feasible.len()).min(n - examined);
        // The window's slots from the scan position, wrapping: two slices, not an index modulo `n`
        // per slot (a 64-bit division each, a few µs per decision at 500 nodes).
        let from = (start + examined) % n;
        let head = &candidates[from..(from + window).min(n)];
        let tail = &candidates[..window - head.len()];
        let chunk: Vec<Slot> = [head, tail].concat();
        run.diagnosis.candidates = examined + window;
        let mut fit = match run.filter_chain(set, ctx, task, chunk, want - feasible.len()) {
            Ok(fit) => fit,
            Err(u) => return Sampled { result: Err(u), examined: examined + window },
        };
        let missing = want - feasible.len();
        if fit.len() >= missing {
            // Stop at the `want`-th feasible node: nodes after it in this window were filtered
            // only because the window was sized by an estimate, and do not count.
            fit.truncate(missing);
            let last = fit[missing - 1];
            let at = head.iter().chain(tail).position(|&s| s == last);
            examined += at.map_or(window, |i| i + 1);
        } else {
            examined += window;
        }
        feasible.append(&mut fit);
    }
    // `diagnosis.candidates` stays the count filtered (past the cut too): the rejection counts
    // it explains cover every node a filter saw.
    // Slot order keeps the lowest-slot tie-break independent of where the scan started.
    feasible.sort_unstable();
    Sampled { result: run.choose(set, ctx, task, feasible), examined }
}

/// How many nodes the next filter call of a sampled scan covers, given the feasible nodes still
/// `missing` and `found` among the `examined` so far. The first call covers `missing` plus a
/// quarter (at least 32); later ones the count the feasible share seen so far predicts, plus a
/// quarter, so that a cluster where few nodes fit costs a few calls rather than one per 32 nodes
/// (each call lowers the task into every Wasm plugin again); with nothing found yet the scan
/// doubles. Only the cost depends on it: the last filter stops at the `missing`-th feasible node
/// ([`PolicyPlugin::filter_until`]), and nodes past it are dropped in any case
/// ([`place_sampled_among`]). The quarter is what a filter that cannot stop early (or a filter
/// before the last) may evaluate in vain; without it two decisions in three needed a second
/// call on the benchmark's cluster, where a fifth of the nodes do not fit a typical pod.
fn next_window(missing: usize, examined: usize, found: usize) -> usize {
    const MIN_WINDOW: usize = 32;
    let predicted = match (examined, found) {
        (0, _) => missing + missing / 4,
        (_, 0) => examined,
        _ => (missing * examined).div_ceil(found) * 5 / 4,
    };
    predicted.max(MIN_WINDOW)
}

/// State of one placement attempt.
struct Run {
    diagnosis: Diagnosis,
    skipped: Vec<PluginFault>,
}

impl Run {
    fn fail(&mut self, fault: PluginFault) -> Unschedulable {
        let mut diagnosis = std::mem::take(&mut self.diagnosis);
        diagnosis.faults.push(fault);
        Unschedulable { diagnosis }
    }

    fn unschedulable(&mut self) -> Unschedulable {
        let mut diagnosis = std::mem::take(&mut self.diagnosis);
        diagnosis.faults.append(&mut self.skipped);
        Unschedulable { diagnosis }
    }

    /// Run the filters in order, each on the survivors of the previous; an empty result is not an
    /// error here (the caller decides), a fail-closed fault is. The last filter may stop once
    /// `enough` nodes fit: the survivors are then the first `enough` in order, and nodes after
    /// the last of them were not looked at.
    fn filter_chain(
        &mut self,
        set: &PolicySet,
        ctx: CallContext<'_>,
        task: &Task,
        mut candidates: Vec<Slot>,
        enough: usize,
    ) -> Result<Vec<Slot>, Unschedulable> {
        let last = set.filters.len().saturating_sub(1);
        for (at, filter) in set.filters.iter().enumerate() {
            if candidates.is_empty() {
                break;
            }
            let enough = if at == last { enough } else { usize::MAX };
            match filter.filter(ctx, task, &candidates, enough) {
                Ok(batch) => {
                    // Count per reason code first: one diagnosis entry per distinct reason, not per node.
                    let mut per_code = vec![0usize; batch.reasons.len() + 1];
                    let mut kept = 0;
                    // Shorter than the candidates only when it stopped at the `enough`-th fit.
                    for i in 0..batch.codes.len().min(candidates.len()) {
                        let code = usize::from(batch.codes[i]);
                        per_code[code] += 1;
                        if code == 0 {
                            candidates[kept] = candidates[i];
                            kept += 1;
                        }
                    }
                    candidates.truncate(kept);
                    for (r, &n) in batch.reasons.iter().zip(&per_code[1..]) {
                        if n > 0 {
                            let e = self
                                .diagnosis
                                .rejections
                                .entry((filter.name().to_string(), r.reason.clone()))
                                .or_insert((0, r.unresolvable));
                            e.0 += n;
                        }
                    }
                }
                Err(fault) if filter.failure_policy() == FailurePolicy::FailOpen => self.skipped.push(fault),
                Err(fault) => return Err(self.fail(fault)),
            }
        }
        Ok(candidates)
    }

    /// Score the feasible nodes and pick one that device selection accepts.
    fn choose(
        &mut self,
        set: &PolicySet,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: Vec<Slot>,
    ) -> Result<Placement, Unschedulable> {
        let nodes = ctx.nodes;
        if candidates.is_empty() {
            return Err(self.unschedulable());
        }
        let totals = match weighted_scores(set, ctx, task, &candidates, &mut self.skipped) {
            Ok(t) => t,
            Err(fault) => return Err(self.fail(fault)),
        };

        // The best node first (highest total, lowest slot on ties); the rest are ranked only if device
        // selection refuses it, which is rare, so the common case is a linear scan.
        let best = (0..candidates.len()).fold(0, |b, i| if totals[i] > totals[b] { i } else { b });
        let rest = || {
            let mut order: Vec<usize> = (0..candidates.len()).filter(|&i| i != best).collect();
            // Stable sort: equal totals keep ascending slot order.
            order.sort_by(|&a, &b| totals[b].cmp(&totals[a]));
            order
        };
        for i in std::iter::once(best).chain(std::iter::once(()).flat_map(|()| rest())) {
            let slot = candidates[i];
            let Some(node) = nodes.get(slot) else { continue };
            let chosen = match select_devices(set, ctx, task, slot, node, &mut self.skipped) {
                Ok(c) => c,
                Err(fault) => return Err(self.fail(fault)),
            };
            match chosen {
                Ok(devices) if validate::devices(&devices, task, node).is_ok() => {
                    return Ok(Placement {
                        node: slot,
                        devices,
                        score: totals[i],
                        feasible: candidates.len(),
                        skipped_faults: std::mem::take(&mut self.skipped),
                    });
                }
                Ok(_) => {}
                Err(r) => {
                    let e = self
                        .diagnosis
                        .rejections
                        .entry(("select-devices".into(), r.reason))
                        .or_insert((0, r.unresolvable));
                    e.0 += 1;
                }
            }
        }
        Err(self.unschedulable())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources};

    use super::*;
    use crate::native::NativePlugin;

    #[test]
    fn feasible_nodes_to_find_follows_kube_scheduler() {
        assert_eq!(feasible_nodes_to_find(50, None), 50);
        assert_eq!(feasible_nodes_to_find(1000, None), 420);
        assert_eq!(feasible_nodes_to_find(5000, None), 500);
        assert_eq!(feasible_nodes_to_find(20_000, None), 1000, "floor of 5 %");
        assert_eq!(feasible_nodes_to_find(1000, Some(1)), 100, "never fewer than 100");
        assert_eq!(feasible_nodes_to_find(1000, Some(100)), 1000);
        assert_eq!(feasible_nodes_to_find(1000, Some(0)), 420, "0 means adaptive");
    }

    fn table(n: usize, gpus_every: usize) -> NodeTable {
        let mut t = NodeTable::new();
        for i in 0..n {
            let gpus = u32::from(i % gpus_every == 0);
            t.upsert(Node {
                name: format!("n{i:04}"),
                allocatable: Resources {
                    cpu_milli: 8000,
                    memory_bytes: 1 << 36,
                    gpu_milli: u64::from(gpus) * 1000,
                    extended: vec![],
                },
                gpus: (0..gpus).map(|g| GpuDevice { index: g, free_milli: 1000, ..Default::default() }).collect(),
                ..Default::default()
            });
        }
        t
    }

    fn set() -> PolicySet {
        PolicySet::builder()
            .filter(Arc::new(NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap()))
            .build()
    }

    #[test]
    fn sampling_stops_early_and_rotates() {
        let t = table(1000, 1);
        let task = Task::default();
        let a = place_sampled(&set(), &t, &task, 0, 0, 100);
        assert_eq!(a.examined, 100);
        assert_eq!(a.result.as_ref().unwrap().node, 0);
        let b = place_sampled(&set(), &t, &task, 0, 950, 100);
        assert_eq!(b.examined, 100);
        assert_eq!(b.result.unwrap().node, 0, "the window wraps: slots 950..999 and 0..49, lowest slot wins ties");
        let c = place_sampled(&set(), &t, &task, 0, 300, 100);
        assert_eq!(c.result.unwrap().node, 300);
    }

    #[test]
    fn sampling_keeps_looking_when_few_nodes_fit_and_matches_place_when_exhaustive() {
        let t = table(1000, 10);
        let gpu =
            Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let s = place_sampled(&set(), &t, &gpu, 0, 0, 50);
        // Slots 0, 10, ..., 490 fit: the 50th feasible node is the 491st examined.
        assert_eq!(s.examined, 491, "only every 10th node fits");
        assert_eq!(s.result.unwrap().feasible, 50);
        let big =
            Task { gpu: GpuRequest { count: 2, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let s = place_sampled(&set(), &t, &big, 0, 123, 100);
        assert_eq!(s.examined, 1000);
        let e = s.result.unwrap_err();
        assert_eq!(e, place(&set(), &t, &big, 0).unwrap_err());
        assert_eq!(e.diagnosis.candidates, 1000);
    }

    /// Filter calls a scan of `n` nodes makes when every `every`-th fits (0: none), looking for `want`.
    fn calls(n: usize, every: usize, want: usize) -> usize {
        let fits_before = |k: usize| if every == 0 { 0 } else { k.div_ceil(every) };
        let (mut examined, mut calls) = (0, 0);
        while examined < n && fits_before(examined) < want {
            examined += next_window(want - fits_before(examined), examined, fits_before(examined)).min(n - examined);
            calls += 1;
        }
        calls
    }

    #[test]
    fn a_sparse_cluster_costs_a_few_filter_calls_not_one_per_32_nodes() {
        assert_eq!(calls(5000, 1, 500), 1, "everything fits: one call");
        // Windows of the missing count (at least 32) took 1 + 441 / 32 = 15 calls here.
        assert!(calls(5000, 10, 50) <= 3, "{}", calls(5000, 10, 50));
        assert!(calls(5000, 3, 500) <= 3, "{}", calls(5000, 3, 500));
        // Nothing fits: the window doubles, ~log2(5000 / 32) calls instead of 157.
        assert!(calls(5000, 0, 500) <= 9, "{}", calls(5000, 0, 500));
    }

    /// The sampled scan must pick exactly what placing among the first `find` feasible nodes in scan
    /// order picks, whatever sizes the filter calls had: checked against a node-by-node scan.
    #[test]
    fn sampling_places_among_the_first_feasible_nodes_in_scan_order() {
        let mut t = NodeTable::new();
        for i in 0..700u64 {
            let gpu = i % 3 == 0 || i % 7 == 0;
            t.upsert(Node {
                name: format!("n{i:04}"),
                allocatable: Resources {
                    cpu_milli: 8000,
                    memory_bytes: 1 << 36,
                    gpu_milli: if gpu { 1000 } else { 0 },
                    extended: vec![],
                },
                allocated: Resources { cpu_milli: (i * 37 % 8) * 1000, ..Default::default() },
                gpus: if gpu {
                    vec![GpuDevice { index: 0, free_milli: [1000, 0, 500][(i % 5 % 3) as usize], ..Default::default() }]
                        .into()
                } else {
                    Vec::new().into()
                },
                ..Default::default()
            });
        }
        let occupied = t.occupied().to_vec();
        let cpu = Task { request: Resources { cpu_milli: 3000, ..Default::default() }, ..Default::default() };
        let gpu =
            Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let scored = {
            let score = NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new("", 1).unwrap();
            let fit = NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap();
            PolicySet::builder().filter(Arc::new(fit)).score(Arc::new(score), 1).build()
        };
        for task in [&cpu, &gpu] {
            for (start, find) in [(0, 100), (123, 100), (650, 40), (5, 1), (0, 700), (399, 250)] {
                let sampled = place_sampled(&scored, &t, task, 0, start, find);
                let order: Vec<Slot> = (0..occupied.len()).map(|i| occupied[(start + i) % occupied.len()]).collect();
                let verdicts = filter_each(&scored, &t, task, 0, &order).unwrap();
                let fits: Vec<usize> = (0..order.len()).filter(|&i| verdicts[i].is_none()).take(find).collect();
                let examined = if fits.len() == find { fits[find - 1] + 1 } else { order.len() };
                assert_eq!(sampled.examined, examined, "start {start}, find {find}");
                // Ties go to the lowest slot, wherever the scan started.
                let mut chosen: Vec<Slot> = fits.iter().map(|&i| order[i]).collect();
                chosen.sort_unstable();
                assert_eq!(sampled.result, place_among(&scored, &t, task, 0, &chosen), "start {start}, find {find}");
            }
        }
    }

    #[test]
    fn per_node_verdicts_scores_and_devices_answer_an_extender() {
        // n0000 has a GPU, n0001 none, n0002 a GPU but cordoned; slot 9 does not exist.
        let mut t = table(3, 2);
        t.upsert(Node { name: "n0002".into(), unschedulable: true, ..t.get(0).unwrap().clone() });
        let gpu =
            Task { gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() }, ..Default::default() };
        let v = filter_each(&set(), &t, &gpu, 0, &[0, 1, 2, 9]).unwrap();
        assert_eq!(v[0], None);
        assert_eq!(v[1], Some(("node has no GPU (resource-fit)".into(), true)));
        assert_eq!(v[2], Some(("node is cordoned (resource-fit)".into(), true)));
        assert_eq!(v[3], Some(("node not found".into(), true)));
        let score = Arc::new(
            NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new(r#"{"strategy":"least"}"#, 1)
                .unwrap(),
        );
        let scored = PolicySet::builder().score(score, 2).build();
        let totals = score_each(&scored, &t, &gpu, 0, &[0, 1]).unwrap();
        assert_eq!(totals.len(), 2);
        assert!(totals.iter().all(|s| s % 2 == 0), "weighted: {totals:?}");
        assert_eq!(select_devices_on(&set(), &t, &gpu, 0, 0).unwrap().len(), 1);
        assert!(select_devices_on(&set(), &t, &gpu, 0, 1).is_err(), "no GPU there");
    }
}
