//! `gpu-topology`: places multi-GPU tasks on well-connected GPUs.
//!
//! - **filter**: under a NUMA policy that can refuse (`restricted`, `single-numa-node`), a node whose
//!   free GPUs admit no set is rejected with the host's reason (preemption may help, so it is
//!   resolvable).
//! - **score**: the host's topology score of the best set (its bottleneck bandwidth on a log scale),
//!   so NVSwitch nodes outrank NVLink-pair nodes outrank PCIe nodes for a 4-GPU job; a node whose
//!   topology is unknown scores `unknown_score`; single-GPU and shared-GPU tasks score 100
//!   everywhere (topology does not matter to them, other scorers decide).
//! - **select-devices**: exactly that best set. Shared-GPU requests and nodes of unknown topology
//!   get the scheduler's default choice (lowest-index whole GPUs; best fit for a share).
//!
//! Configuration (JSON, all optional): `{"numa_policy": "best-effort", "unknown_score": 50}`.

use serde::Deserialize;
use wasmsched_sdk::prelude::*;
use wasmsched_sdk::topology::{self, NumaPolicy};

/// Configuration.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Config {
    /// `none`, `best-effort`, `restricted` or `single-numa-node`.
    numa_policy: String,
    /// Score of a node whose topology the host does not know, `0..=100`.
    unknown_score: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config { numa_policy: "best-effort".into(), unknown_score: 50 }
    }
}

/// The plugin.
pub struct GpuTopology {
    policy: NumaPolicy,
    unknown_score: u32,
}

impl Plugin for GpuTopology {
    const NAME: &'static str = "gpu-topology";

    fn new(config: &str) -> Result<Self, String> {
        let c: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        let policy = NumaPolicy::parse(&c.numa_policy).ok_or_else(|| {
            format!(
                "invalid gpu-topology configuration: numa_policy `{}` is not none, best-effort, restricted or single-numa-node",
                c.numa_policy
            )
        })?;
        if c.unknown_score > MAX_SCORE {
            return Err(format!(
                "invalid gpu-topology configuration: unknown_score {} is above {MAX_SCORE}",
                c.unknown_score
            ));
        }
        Ok(GpuTopology { policy, unknown_score: c.unknown_score })
    }
}

/// Whole GPUs, more than one: the requests topology matters to.
fn multi_gpu(task: &Task) -> bool {
    task.gpu.count > 1 && task.gpu.milli_per_gpu >= GPU_MILLI
}

impl Filter for GpuTopology {
    fn filter(&mut self, task: &Task, node: &Node) -> Verdict {
        if !multi_gpu(task) || matches!(self.policy, NumaPolicy::None | NumaPolicy::BestEffort) {
            return Verdict::Fit;
        }
        match topology::best_gpus(node, &task.gpu, self.policy) {
            Some(Err(reason)) => Verdict::unfit(reason),
            Some(Ok(_)) | None => Verdict::Fit,
        }
    }
}

impl Score for GpuTopology {
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        if !multi_gpu(task) {
            return MAX_SCORE;
        }
        // Too few free GPUs: no need to ask the host (the filter stage normally removed the node).
        if topology::free_mask(node, &task.gpu).count_ones() < task.gpu.count {
            return 0;
        }
        match topology::best_gpus(node, &task.gpu, self.policy) {
            Some(Ok(set)) => set.score.min(MAX_SCORE),
            Some(Err(_)) => 0,
            None => self.unknown_score,
        }
    }
}

impl SelectDevices for GpuTopology {
    fn select_devices(&mut self, task: &Task, node: &Node) -> Result<Vec<DeviceShare>, Rejection> {
        let req = &task.gpu;
        if req.count == 0 {
            return Ok(Vec::new());
        }
        if req.milli_per_gpu >= GPU_MILLI {
            match topology::best_gpus(node, req, self.policy) {
                Some(Ok(set)) => {
                    return Ok(set.gpus.into_iter().map(|gpu| DeviceShare { gpu, milli: req.milli_per_gpu }).collect());
                }
                Some(Err(reason)) => return Err(Rejection { reason, unresolvable: false }),
                None => {}
            }
        }
        wasmsched_sdk::default_devices(req, node)
    }
}

wasmsched_sdk::export_plugin!(GpuTopology: filter, score, select_devices);
