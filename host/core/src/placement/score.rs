//! The score stage: the set's scores, weighted and summed per node.

use wasmsched_api::Task;

use crate::node_table::{NodeTable, Slot};
use crate::plugin::{CallContext, FailurePolicy, PluginFault};
use crate::policy_set::PolicySet;

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
pub(super) fn weighted_scores(
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
