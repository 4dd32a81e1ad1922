//! Native plugins: a policy type from the API run directly, behind the same [`PolicyPlugin`] trait
//! as components. The benchmark baseline and the differential-testing oracle.

use std::sync::Mutex;

use wasmsched_api::batch::{FilterBatch, filter_batch_until, score_batch};
use wasmsched_api::{
    DeviceShare, Node, Plugin, PreemptCandidate, Preemption, QueueState, Rejection, Resources, ShareDecision, Stage,
    Stages, Task,
};

use crate::node_table::{NodeTable, Slot};
use crate::plugin::{CallContext, FailurePolicy, FaultKind, PluginFault, PolicyPlugin, validate};

/// A native plugin with one instance per worker.
pub struct NativePlugin<P> {
    name: String,
    stages: Vec<Stage>,
    failure: FailurePolicy,
    /// The policy type ranks DRA claim devices (it answers `as_rank_claim_devices`).
    ranks_claim_devices: bool,
    instances: Vec<Mutex<P>>,
}

impl<P: Plugin + Stages + Send> NativePlugin<P> {
    /// Configure `workers` instances (at least one) with `config`.
    pub fn new(config: &str, workers: usize) -> Result<Self, String> {
        let mut instances = Vec::new();
        for _ in 0..workers.max(1) {
            instances.push(Mutex::new(P::new(config)?));
        }
        let first = instances[0].get_mut().map_err(|_| "poisoned")?;
        let stages = first.stages();
        let ranks_claim_devices = first.as_rank_claim_devices().is_some();
        Ok(NativePlugin {
            name: P::NAME.to_string(),
            stages,
            failure: FailurePolicy::default(),
            ranks_claim_devices,
            instances,
        })
    }

    /// Register under another name (e.g. `most-allocated` for `allocation-score`).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Set the failure policy.
    pub fn with_failure_policy(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// Runs `f` on the worker's instance; with `nodes`, the plugin's topology questions are answered
    /// from their topologies, and its domain questions from the table's domains, during the call (as the
    /// Wasm runtime's host imports do).
    fn with<R>(
        &self,
        nodes: Option<&NodeTable>,
        worker: usize,
        stage: Stage,
        f: impl FnOnce(&mut P) -> Result<R, (FaultKind, String)>,
    ) -> Result<R, PluginFault> {
        let slot = &self.instances[worker % self.instances.len()];
        let mut p = slot.lock().unwrap_or_else(|e| e.into_inner());
        let topology = nodes.and_then(NodeTable::topology_view);
        let domains = nodes.and_then(NodeTable::domain_view);
        let accelerators = nodes.map(NodeTable::accelerator_view);
        wasmsched_api::topology::with_view(topology, || {
            wasmsched_api::domains::with_view(domains, || {
                wasmsched_api::accelerators::with_view(accelerators, || f(&mut p))
            })
        })
        .map_err(|(kind, msg)| PluginFault::new(&self.name, stage, kind, msg))
    }
}

fn nodes<'a>(ctx: &CallContext<'a>, candidates: &[Slot]) -> Result<Vec<&'a Node>, (FaultKind, String)> {
    candidates
        .iter()
        .map(|&s| ctx.nodes.get(s).ok_or_else(|| (FaultKind::GuestError, format!("node slot {s} is empty"))))
        .collect()
}

fn missing(stage: Stage) -> (FaultKind, String) {
    (FaultKind::NotImplemented, format!("plugin does not implement {stage}"))
}

impl<P: Plugin + Stages + Send> PolicyPlugin for NativePlugin<P> {
    fn name(&self) -> &str {
        &self.name
    }

    fn stages(&self) -> &[Stage] {
        &self.stages
    }

    fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    fn filter_until(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<FilterBatch, PluginFault> {
        self.with(Some(ctx.nodes), ctx.worker, Stage::Filter, |p| {
            let nodes = nodes(&ctx, candidates)?;
            let batch = match p.filter_nodes(task, &nodes, enough) {
                Some(batch) => batch,
                None => filter_batch_until(p.as_filter().ok_or_else(|| missing(Stage::Filter))?, task, nodes, enough),
            };
            validate::filter_until(&batch, candidates.len(), enough).map_err(|m| (FaultKind::BadOutput, m))?;
            Ok(batch)
        })
    }

    fn score(&self, ctx: CallContext<'_>, task: &Task, candidates: &[Slot]) -> Result<Vec<u32>, PluginFault> {
        self.with(Some(ctx.nodes), ctx.worker, Stage::Score, |p| {
            let nodes = nodes(&ctx, candidates)?;
            let scores = match p.score_nodes(task, &nodes) {
                Some(scores) => scores,
                None => score_batch(p.as_score().ok_or_else(|| missing(Stage::Score))?, task, nodes),
            };
            validate::scores(&scores, candidates.len()).map_err(|m| (FaultKind::BadOutput, m))?;
            Ok(scores)
        })
    }

    fn ranks_claim_devices(&self) -> bool {
        self.ranks_claim_devices
    }

    fn rank_claim_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
        request: &wasmsched_api::ClaimRequest,
    ) -> Result<Option<Vec<u32>>, PluginFault> {
        self.with(Some(ctx.nodes), ctx.worker, Stage::SelectDevices, |p| {
            let Some(r) = p.as_rank_claim_devices() else { return Ok(None) };
            let n = nodes(&ctx, &[node])?[0];
            let order = r.rank_claim_devices(task, n, request);
            validate::claim_ranking(&order, request.candidates.len()).map_err(|m| (FaultKind::BadOutput, m))?;
            Ok(Some(order))
        })
    }

    fn select_devices(
        &self,
        ctx: CallContext<'_>,
        task: &Task,
        node: Slot,
    ) -> Result<Result<Vec<DeviceShare>, Rejection>, PluginFault> {
        self.with(Some(ctx.nodes), ctx.worker, Stage::SelectDevices, |p| {
            let d = p.as_select_devices().ok_or_else(|| missing(Stage::SelectDevices))?;
            let n = nodes(&ctx, &[node])?[0];
            let out = d.select_devices(task, n);
            if let Ok(shares) = &out {
                validate::devices(shares, task, n).map_err(|m| (FaultKind::BadOutput, m))?;
            }
            Ok(out)
        })
    }

    fn select_victims(
        &self,
        ctx: CallContext<'_>,
        preemptor: &Task,
        candidates: &[PreemptCandidate],
    ) -> Result<Option<Preemption>, PluginFault> {
        self.with(Some(ctx.nodes), ctx.worker, Stage::Preempt, |p| {
            let pr = p.as_preempt().ok_or_else(|| missing(Stage::Preempt))?;
            let slots: Vec<Slot> = candidates.iter().map(|c| c.node).collect();
            let out = pr.select_victims(preemptor, candidates, &nodes(&ctx, &slots)?);
            if let Some(plan) = &out {
                validate::preemption(plan, candidates).map_err(|m| (FaultKind::BadOutput, m))?;
            }
            Ok(out)
        })
    }

    fn fair_share(
        &self,
        worker: usize,
        queues: &[QueueState],
        cluster: &Resources,
    ) -> Result<ShareDecision, PluginFault> {
        self.with(None, worker, Stage::FairShare, |p| {
            let fs = p.as_fair_share().ok_or_else(|| missing(Stage::FairShare))?;
            let d = fs.compute(queues, cluster).map_err(|m| (FaultKind::GuestError, m))?;
            validate::share(&d, queues.len()).map_err(|m| (FaultKind::BadOutput, m))?;
            Ok(d)
        })
    }
}
