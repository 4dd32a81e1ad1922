//! One placement decision: filter → score → device selection for one task.
//!
//! This is the inner step of a scheduling cycle; queues, gangs and preemption build on it. Each
//! stage has its file: `filter` (the filter chain, and per-node verdicts for extenders),
//! `verdict_cache` (filter verdicts reused for equal tasks), `score` (weighted totals) and
//! `devices` (which GPUs on the chosen node). This file ties them together: over all nodes
//! ([`place`]) or the first feasible ones in scan order ([`place_sampled`]).

mod devices;
mod filter;
mod scan;
mod score;
#[cfg(test)]
mod tests;
pub(crate) mod verdict_cache;

use std::collections::BTreeMap;
use std::fmt;

use wasmsched_api::{DeviceShare, Task};

pub use devices::{default_select_devices, select_devices_on};
use filter::KindCheck;
pub use filter::{NodeVerdict, filter_each};
use scan::{Cursor, EveryNode, KindNodes};
pub use score::score_each;

use crate::node_table::{NodeTable, Slot};
use crate::plugin::{CallContext, PluginFault, validate};
use crate::policy_set::PolicySet;

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
    let mut candidates = candidates;
    if let Some(mut kinds) = KindCheck::new(nodes, task) {
        candidates.retain(|&s| kinds.admits(s));
        kinds.record(&mut run);
    }
    let feasible = run.filter_chain(set, ctx, task, candidates, usize::MAX)?;
    run.choose(set, ctx, task, feasible)
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
/// is a position in `candidates`. On a cluster of several accelerator kinds, a scan of every node
/// (what the cycle asks for a pod without a domain, with its own copy of the occupied slots) walks
/// the task's kind's nodes only (`scan::KindNodes`); the comparison that finds it out is a
/// memory compare, against a kind check per node.
pub fn place_sampled_among(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    candidates: &[Slot],
    start: usize,
    find: usize,
) -> Sampled {
    match KindCheck::new(nodes, task) {
        Some(kinds) if candidates == nodes.occupied() => {
            sample(set, nodes, task, worker, KindNodes::new(nodes, task.gpu.kind, start, kinds), find)
        }
        kinds => sample(set, nodes, task, worker, EveryNode::new(candidates, start, kinds), find),
    }
}

/// The sampled scan: filter calls on windows the cursor cuts, until `find` nodes fit or the scan
/// is done, then [`Run::choose`] among them.
fn sample(
    set: &PolicySet,
    nodes: &NodeTable,
    task: &Task,
    worker: usize,
    mut cursor: impl Cursor,
    find: usize,
) -> Sampled {
    let ctx = CallContext { worker, nodes };
    let n = cursor.len();
    let mut run = Run { diagnosis: Diagnosis::default(), skipped: Vec::new() };
    let want = find.max(1);
    let mut feasible = Vec::new();
    // Nodes scanned up to the `want`-th feasible one (all scanned when fewer fit), and nodes
    // handed to the filters (all of them unless the host's kind check rejected some).
    let (mut examined, mut offered) = (0, 0);
    let mut chunk = Vec::new();
    while cursor.scanned() < n && feasible.len() < want {
        let missing = want - feasible.len();
        let window = next_window(missing, offered, feasible.len()).min(n - cursor.scanned());
        chunk.clear();
        cursor.fill(&mut chunk, window, &mut run);
        offered += chunk.len();
        examined = cursor.scanned();
        run.diagnosis.candidates = examined;
        // The filters keep the fitting slots in the chunk's own buffer, reused for the next window.
        let mut fit = match run.filter_chain(set, ctx, task, std::mem::take(&mut chunk), missing) {
            Ok(fit) => fit,
            Err(u) => return Sampled { result: Err(u), examined },
        };
        if fit.len() >= missing {
            // Stop at the `want`-th feasible node: nodes after it in this window were filtered
            // only because the window was sized by an estimate, and do not count.
            fit.truncate(missing);
            examined = cursor.scanned_through(fit[missing - 1]);
        }
        feasible.append(&mut fit);
        chunk = fit;
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
pub(super) struct Run {
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
        let totals = match score::weighted_scores(set, ctx, task, &candidates, &mut self.skipped) {
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
            let chosen = match devices::select_devices(set, ctx, task, slot, node, &mut self.skipped) {
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
