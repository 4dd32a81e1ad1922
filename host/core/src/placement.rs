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

/// An immutable set of plugins for the stages. A cycle takes one set at its start and uses it
/// throughout, so no decision mixes two versions.
#[derive(Clone, Default)]
pub struct PolicySet {
    version: u64,
    filters: Vec<Arc<dyn PolicyPlugin>>,
    scores: Vec<(Arc<dyn PolicyPlugin>, u32)>,
    devices: Option<Arc<dyn PolicyPlugin>>,
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySet")
            .field("version", &self.version)
            .field("filters", &self.filters.iter().map(|p| p.name()).collect::<Vec<_>>())
            .field("scores", &self.scores.iter().map(|(p, w)| (p.name(), *w)).collect::<Vec<_>>())
            .field("devices", &self.devices.as_ref().map(|p| p.name()))
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
}

/// Builds a [`PolicySet`].
pub struct PolicySetBuilder {
    set: PolicySet,
}

impl PolicySetBuilder {
    /// Add a filter; filters run in the order added, each on the nodes the previous ones passed.
    pub fn filter(mut self, p: Arc<dyn PolicyPlugin>) -> Self {
        self.set.filters.push(p);
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
    let all: Vec<Slot> = nodes.slots().collect();
    place_among(set, nodes, task, worker, &all)
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
    let mut candidates: Vec<Slot> = candidates.iter().copied().filter(|&s| nodes.get(s).is_some()).collect();
    let mut diagnosis = Diagnosis { candidates: candidates.len(), ..Default::default() };
    let mut skipped = Vec::new();
    let fail = |mut diagnosis: Diagnosis, fault: PluginFault| {
        diagnosis.faults.push(fault);
        Unschedulable { diagnosis }
    };

    for filter in &set.filters {
        if candidates.is_empty() {
            break;
        }
        match filter.filter(ctx, task, &candidates) {
            Ok(batch) => {
                // Count per reason code first: one diagnosis entry per distinct reason, not per node.
                let mut per_code = vec![0usize; batch.reasons.len() + 1];
                let mut kept = 0;
                for i in 0..candidates.len() {
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
                        let e = diagnosis
                            .rejections
                            .entry((filter.name().to_string(), r.reason.clone()))
                            .or_insert((0, r.unresolvable));
                        e.0 += n;
                    }
                }
            }
            Err(fault) if filter.failure_policy() == FailurePolicy::FailOpen => skipped.push(fault),
            Err(fault) => return Err(fail(diagnosis, fault)),
        }
    }
    if candidates.is_empty() {
        diagnosis.faults.extend(skipped);
        return Err(Unschedulable { diagnosis });
    }

    let mut totals = vec![0u64; candidates.len()];
    for (score, weight) in &set.scores {
        match score.score(ctx, task, &candidates) {
            Ok(scores) => {
                for (t, s) in totals.iter_mut().zip(scores) {
                    *t += u64::from(s) * u64::from(*weight);
                }
            }
            Err(fault) if score.failure_policy() == FailurePolicy::FailOpen => skipped.push(fault),
            Err(fault) => return Err(fail(diagnosis, fault)),
        }
    }

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
        let chosen = match &set.devices {
            None => default_select_devices(task, node),
            Some(p) => match p.select_devices(ctx, task, slot) {
                Ok(r) => r,
                Err(fault) if p.failure_policy() == FailurePolicy::FailOpen => {
                    skipped.push(fault);
                    default_select_devices(task, node)
                }
                Err(fault) => return Err(fail(diagnosis, fault)),
            },
        };
        match chosen {
            Ok(devices) if validate::devices(&devices, task, node).is_ok() => {
                return Ok(Placement {
                    node: slot,
                    devices,
                    score: totals[i],
                    feasible: candidates.len(),
                    skipped_faults: skipped,
                });
            }
            Ok(_) => {}
            Err(r) => {
                let e = diagnosis.rejections.entry(("select-devices".into(), r.reason)).or_insert((0, r.unresolvable));
                e.0 += 1;
            }
        }
    }
    diagnosis.faults.extend(skipped);
    Err(Unschedulable { diagnosis })
}
