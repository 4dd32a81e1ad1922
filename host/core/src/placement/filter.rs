//! The filter stage: each filter of the set in order, on the nodes the previous ones passed.

use wasmsched_api::Task;

use super::Run;
use crate::accelerators::KindRejection;
use crate::node_table::{NodeTable, Slot};
use crate::placement::Unschedulable;
use crate::plugin::{CallContext, FailurePolicy, PluginFault};
use crate::policy_set::PolicySet;

/// The name the host's own check of accelerator kinds goes by in diagnoses (it runs before the
/// set's filters; [`crate::accelerators`]).
pub const HOST_CHECK: &str = "accelerator-kind";

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
    if nodes.accelerators().checks() && task.gpu.count > 0 {
        alive.retain(|&i| match nodes.kind_rejection(candidates[i], task) {
            None => true,
            Some(r) => {
                verdicts[i] = Some((format!("{} ({HOST_CHECK})", r.reason(&task.gpu.kind)), r.unresolvable()));
                false
            }
        });
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

/// The host's check of accelerator kinds for one task, before any filter, with the count of what it
/// rejected (entered in the diagnosis once, not per node: most nodes of a two-vendor cluster are of
/// the other kind).
pub(super) struct KindCheck<'a> {
    nodes: &'a NodeTable,
    task: &'a Task,
    /// Nodes rejected as too few devices of the kind, and as busy.
    rejected: [usize; 2],
}

impl<'a> KindCheck<'a> {
    /// `None` when nothing needs checking: no node of another kind was ever seen, or the task
    /// asks for no device.
    pub(super) fn new(nodes: &'a NodeTable, task: &'a Task) -> Option<Self> {
        (nodes.accelerators().checks() && task.gpu.count > 0).then_some(KindCheck { nodes, task, rejected: [0; 2] })
    }

    /// Whether `slot`'s devices can hold the task's kind; counts a rejection when not.
    pub(super) fn admits(&mut self, slot: Slot) -> bool {
        match self.nodes.kind_rejection(slot, self.task) {
            None => true,
            Some(r) => {
                self.rejected[usize::from(!r.unresolvable())] += 1;
                false
            }
        }
    }

    /// Counts `n` nodes without a device of the kind that a scan passed over unread (other kinds'
    /// nodes, [`super::scan::KindNodes`]).
    pub(super) fn add_too_few(&mut self, n: usize) {
        self.rejected[0] += n;
    }

    /// Enters the rejections counted so far into `run`'s diagnosis.
    pub(super) fn record(&mut self, run: &mut Run) {
        for (r, n) in [KindRejection::TooFew, KindRejection::Busy].into_iter().zip(std::mem::take(&mut self.rejected)) {
            if n > 0 {
                let key = (HOST_CHECK.to_string(), r.reason(&self.task.gpu.kind));
                run.diagnosis.rejections.entry(key).or_insert((0, r.unresolvable())).0 += n;
            }
        }
    }
}

impl Run {
    /// Run the filters in order, each on the survivors of the previous; an empty result is not an
    /// error here (the caller decides), a fail-closed fault is. The host's kind check is the
    /// caller's ([`KindCheck`]): a sampled scan runs it while cutting windows. The last filter may stop once
    /// `enough` nodes fit: the survivors are then the first `enough` in order, and nodes after
    /// the last of them were not looked at.
    pub(super) fn filter_chain(
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
}
