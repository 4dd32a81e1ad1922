//! The host-side face of a policy plugin, and the fault channel kept apart from verdicts.

use wasmsched_api::batch::FilterBatch;
use wasmsched_api::{
    ClaimRequest, DeviceShare, MAX_SCORE, PreemptCandidate, Preemption, QueueState, Rejection, Resources,
    ShareDecision, Stage, Task,
};

use crate::node_table::{NodeTable, Slot};

/// What every plugin call gets besides its arguments.
#[derive(Clone, Copy, Debug)]
pub struct CallContext<'a> {
    /// The worker thread making the call; each worker has its own plugin instance.
    pub worker: usize,
    /// The nodes candidates refer to.
    pub nodes: &'a NodeTable,
}

/// What to do when a plugin faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The task is unschedulable this cycle, with the fault as the reason. Right for filters whose
    /// verdict protects something (quotas, hardware constraints).
    #[default]
    FailClosed,
    /// The plugin's verdict is skipped (every node passes it; its score counts 0). Right for
    /// advisory scores.
    FailOpen,
}

/// Why a plugin call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The guest trapped (panic, `unreachable`, stack overflow, out-of-bounds access).
    Trap,
    /// The call ran past its wall-clock deadline (epoch interruption).
    Deadline,
    /// The call ran out of fuel (deterministic budget).
    Fuel,
    /// The guest tried to grow memory past its cap.
    Memory,
    /// The guest answered something malformed (wrong length, out-of-range score, unknown device).
    BadOutput,
    /// The guest returned an error value.
    GuestError,
    /// The plugin does not implement the stage it was called for.
    NotImplemented,
    /// The circuit breaker is open after repeated failures: the plugin was not called.
    CircuitOpen,
    /// A fresh instance could not be created or initialised.
    Instantiate,
}

impl FaultKind {
    /// Short name for metrics and events.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Trap => "trap",
            FaultKind::Deadline => "deadline",
            FaultKind::Fuel => "fuel",
            FaultKind::Memory => "memory",
            FaultKind::BadOutput => "bad-output",
            FaultKind::GuestError => "guest-error",
            FaultKind::NotImplemented => "not-implemented",
            FaultKind::CircuitOpen => "circuit-open",
            FaultKind::Instantiate => "instantiate",
        }
    }
}

/// A plugin failed a call. Always names the plugin and the stage.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plugin {plugin} failed in {stage} ({}): {message}", kind.as_str())]
pub struct PluginFault {
    /// The plugin's registered name.
    pub plugin: String,
    /// The stage called.
    pub stage: Stage,
    /// The kind of failure.
    pub kind: FaultKind,
    /// Details (trap message, panic message, what was malformed).
    pub message: String,
}

impl PluginFault {
    /// A fault of `plugin` in `stage`.
    pub fn new(plugin: &str, stage: Stage, kind: FaultKind, message: impl Into<String>) -> Self {
        PluginFault { plugin: plugin.to_string(), stage, kind, message: message.into() }
    }
}

/// A policy plugin as the core calls it: one call per task and batch of candidate nodes.
///
/// Implementations are shared between worker threads; `ctx.worker` selects the instance.
/// Outputs must pass [`validate`]; implementations validate before returning so that a bad answer
/// is a fault of the plugin, not a host error later.
pub trait PolicyPlugin: Send + Sync {
    /// Registered name.
    fn name(&self) -> &str;

    /// The stages it implements.
    fn stages(&self) -> &[Stage];

    /// What to do when it faults.
    fn failure_policy(&self) -> FailurePolicy;

    /// Filter `candidates`; the batch has exactly one code per candidate.
    fn filter(&self, ctx: CallContext<'_>, task: &Task, candidates: &[Slot]) -> Result<FilterBatch, PluginFault> {
        self.filter_until(ctx, task, candidates, usize::MAX)
    }

    /// Filter `candidates`, allowed to stop once `enough` of them fit: the batch then has one code
    /// per candidate up to that one (exactly `enough` fits, the last code a fit), else one per
    /// candidate. Sampled placement needs the first feasible nodes in scan order only, so it can
    /// pass a generous window in one call. A plugin that cannot stop early answers every candidate.
    fn filter_until(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<FilterBatch, PluginFault>;

    /// Score `candidates`, one score in `0..=100` per candidate.
    fn score(&self, ctx: CallContext<'_>, task: &Task, candidates: &[Slot]) -> Result<Vec<u32>, PluginFault>;

    /// Choose devices on `node`.
    fn select_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
    ) -> Result<Result<Vec<DeviceShare>, Rejection>, PluginFault>;

    /// Whether [`PolicyPlugin::rank_claim_devices`] may answer anything but `None`: when it
    /// cannot, the host does not build the request (each candidate device with its attributes,
    /// the larger part of a DRA allocation's cost, `wasmsched bench --dra`).
    fn ranks_claim_devices(&self) -> bool {
        false
    }

    /// Rank a DRA claim request's candidate devices on `node`: candidate indexes, most wanted
    /// first, each once (validated); `None` when the plugin does not rank them (the default, and
    /// what components built before this part of the contract answer).
    fn rank_claim_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
        request: &ClaimRequest,
    ) -> Result<Option<Vec<u32>>, PluginFault> {
        let _ = (ctx, task, node, request);
        Ok(None)
    }

    /// Choose preemption victims.
    fn select_victims(
        &self,
        ctx: CallContext<'_>,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
    ) -> Result<Option<Preemption>, PluginFault>;

    /// Compute fair shares.
    fn fair_share(
        &self,
        worker: usize,
        queues: &[QueueState],
        cluster: &Resources,
    ) -> Result<ShareDecision, PluginFault>;

    /// Bring whatever state the plugin keeps of `nodes` (a Wasm instance's mirror) closer to it,
    /// applying at most `max_changes` of the table's logged changes per instance; `true` once up to
    /// date. Lets a version about to go live catch up in small steps instead of in its first call.
    /// Plugins that keep nothing are always up to date.
    fn catch_up(&self, nodes: &crate::NodeTable, max_changes: usize) -> bool {
        let _ = (nodes, max_changes);
        true
    }
}

/// Checks on plugin outputs, shared by every [`PolicyPlugin`] implementation. Each returns what is
/// wrong, for a [`FaultKind::BadOutput`] fault.
pub mod validate {
    use super::*;
    use wasmsched_api::Node;

    /// The longest rejection reason kept; longer ones are a fault (a plugin echoing megabytes into
    /// every explanation is broken).
    pub const MAX_REASON_BYTES: usize = 1024;

    /// A ranking of `candidates` claim devices: indexes in range, each at most once.
    pub fn claim_ranking(order: &[u32], candidates: usize) -> Result<(), String> {
        let mut seen = vec![false; candidates];
        for &i in order {
            match seen.get_mut(i as usize) {
                None => return Err(format!("device index {i} out of range (0..{candidates})")),
                Some(true) => return Err(format!("device index {i} ranked twice")),
                Some(s) => *s = true,
            }
        }
        Ok(())
    }

    /// A filter batch for `candidates` nodes.
    pub fn filter(batch: &FilterBatch, candidates: usize) -> Result<(), String> {
        filter_until(batch, candidates, usize::MAX)
    }

    /// A filter batch for `candidates` nodes from [`PolicyPlugin::filter_until`]: a code per
    /// candidate, or per candidate up to the `enough`-th that fits.
    pub fn filter_until(batch: &FilterBatch, candidates: usize, enough: usize) -> Result<(), String> {
        let answered = batch.codes.len();
        if answered != candidates {
            let fits = batch.codes.iter().filter(|&&c| c == 0).count();
            let stopped_at_enough = answered < candidates && fits == enough && batch.codes.last() == Some(&0);
            if !stopped_at_enough {
                let mut message = format!("{answered} verdicts for {candidates} candidates");
                if enough < candidates {
                    message += &format!(" (stopping is allowed only at fit {enough}; {fits} fit)");
                }
                return Err(message);
            }
        }
        // The largest code first (a loop without an early exit vectorises; this runs on every
        // answer of every Wasm filter), the offending one only when there is one.
        if batch.codes.iter().copied().max().is_some_and(|c| usize::from(c) > batch.reasons.len()) {
            let c = batch.codes.iter().find(|&&c| usize::from(c) > batch.reasons.len()).copied().unwrap_or_default();
            return Err(format!("verdict code {c} but only {} reasons", batch.reasons.len()));
        }
        if let Some(r) = batch.reasons.iter().find(|r| r.reason.len() > MAX_REASON_BYTES) {
            return Err(format!("rejection reason of {} bytes (limit {MAX_REASON_BYTES})", r.reason.len()));
        }
        Ok(())
    }

    /// Scores for `candidates` nodes.
    pub fn scores(scores: &[u32], candidates: usize) -> Result<(), String> {
        if scores.len() != candidates {
            return Err(format!("{} scores for {candidates} candidates", scores.len()));
        }
        if scores.iter().copied().max().is_some_and(|s| s > MAX_SCORE) {
            let s = scores.iter().find(|&&s| s > MAX_SCORE).copied().unwrap_or_default();
            return Err(format!("score {s} out of range 0..={MAX_SCORE}"));
        }
        Ok(())
    }

    /// Device shares for `task` on `node`: existing devices, each once, each share fitting the
    /// device's free share, and together exactly what the task asks.
    pub fn devices(shares: &[DeviceShare], task: &Task, node: &Node) -> Result<(), String> {
        if shares.len() != task.gpu.count as usize {
            return Err(format!("{} devices for a request of {}", shares.len(), task.gpu.count));
        }
        for (i, s) in shares.iter().enumerate() {
            if shares[..i].iter().any(|o| o.gpu == s.gpu) {
                return Err(format!("GPU {} chosen twice", s.gpu));
            }
            let Some(gpu) = node.gpus.iter().find(|g| g.index == s.gpu) else {
                return Err(format!("GPU {} does not exist on {}", s.gpu, node.name));
            };
            if s.milli != task.gpu.milli_per_gpu {
                return Err(format!("GPU {} given {} milli, task asks {}", s.gpu, s.milli, task.gpu.milli_per_gpu));
            }
            if !task.gpu.fits_device(gpu) {
                return Err(format!("GPU {} cannot host the request (free {} milli)", s.gpu, gpu.free_milli));
            }
        }
        Ok(())
    }

    /// A preemption plan against `candidates`.
    pub fn preemption(p: &Preemption, candidates: &[PreemptCandidate]) -> Result<(), String> {
        let Some(c) = candidates.get(p.candidate as usize) else {
            return Err(format!("candidate {} of {}", p.candidate, candidates.len()));
        };
        for (i, v) in p.victims.iter().enumerate() {
            if *v as usize >= c.victims.len() || p.victims[..i].contains(v) {
                return Err(format!("victim index {v} invalid or repeated"));
            }
        }
        Ok(())
    }

    /// A share decision for `queues` queues.
    pub fn share(d: &ShareDecision, queues: usize) -> Result<(), String> {
        if d.deserved.len() != queues {
            return Err(format!("{} deserved shares for {queues} queues", d.deserved.len()));
        }
        for (i, q) in d.order.iter().enumerate() {
            if *q as usize >= queues || d.order[..i].contains(q) {
                return Err(format!("queue index {q} invalid or repeated in order"));
            }
        }
        Ok(())
    }
}
