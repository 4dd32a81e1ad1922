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
//! - **DRA devices** (`rank_claim_devices`): of a claim request's candidate devices, the smallest
//!   group under one NVLink domain, else one PCIe root, else one NUMA node that holds the request.
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

/// The attributes that place a DRA device, tightest first: an NVLink domain, a PCIe root complex,
/// a NUMA node (names as the NVIDIA driver and Kubernetes publish them; the driver's own without a
/// domain are matched by their last segment).
const LOCALITY: [&[&str]; 3] = [
    &["cliqueID", "cliqueId", "nvlinkClique"],
    &["resource.kubernetes.io/pcieRoot"],
    &["resource.kubernetes.io/numaNode", "numaNode", "numa"],
];

fn locality<'d>(device: &'d ClaimDevice, names: &[&str]) -> Option<&'d AttributeValue> {
    device.attributes.iter().find_map(|(name, value)| {
        let id = name.rsplit_once('/').map_or(name.as_str(), |(_, id)| id);
        names.iter().any(|n| *n == name || (!n.contains('/') && *n == id)).then_some(value)
    })
}

impl RankClaimDevices for GpuTopology {
    /// The tightest group of candidates that holds the whole request, the smallest such group
    /// first (best fit: a 2-GPU request takes a PCIe root with two free GPUs, not two of a root
    /// with four): an NVLink domain, else a PCIe root, else a NUMA node. No group holds it (or
    /// the devices publish no locality): no preference, the host's topology order stands.
    fn rank_claim_devices(&mut self, _task: &Task, _node: &Node, request: &ClaimRequest) -> Vec<u32> {
        let count = request.count as usize;
        if count < 2 && self.policy == NumaPolicy::None {
            return Vec::new();
        }
        for names in LOCALITY {
            let mut groups: Vec<(&AttributeValue, Vec<u32>)> = Vec::new();
            for (i, d) in request.candidates.iter().enumerate() {
                let Some(value) = locality(d, names) else { continue };
                match groups.iter_mut().find(|(v, _)| *v == value) {
                    Some((_, members)) => members.push(i as u32),
                    None => groups.push((value, vec![i as u32])),
                }
            }
            // Several groups to choose from, and one can hold the request.
            if groups.len() < 2 {
                continue;
            }
            if let Some((_, members)) =
                groups.iter().filter(|(_, m)| m.len() >= count.max(1)).min_by_key(|(_, m)| m.len())
            {
                return members[..count.max(1)].to_vec();
            }
        }
        Vec::new()
    }
}

wasmsched_sdk::export_plugin!(GpuTopology: filter, score, select_devices, rank_claim_devices);

#[cfg(test)]
mod dra_tests {
    use super::*;

    fn device(root: &str, numa: i64) -> ClaimDevice {
        ClaimDevice {
            id: String::new(),
            attributes: vec![
                ("resource.kubernetes.io/pcieRoot".into(), AttributeValue::String(root.into())),
                ("gpu.nvidia.com/numaNode".into(), AttributeValue::Int(numa)),
            ],
            capacity: Vec::new(),
        }
    }

    #[test]
    fn a_request_takes_the_smallest_pcie_root_that_holds_it() {
        let mut p = GpuTopology::new("").unwrap();
        // Root a: candidates 0, 1, 2; root b: 3, 4.
        let candidates = vec![device("a", 0), device("a", 0), device("a", 0), device("b", 1), device("b", 1)];
        let mut request = ClaimRequest { name: "gpus".into(), count: 2, candidates };
        assert_eq!(p.rank_claim_devices(&Task::default(), &Node::default(), &request), vec![3, 4]);
        // Three: only root a holds them.
        request.count = 3;
        assert_eq!(p.rank_claim_devices(&Task::default(), &Node::default(), &request), vec![0, 1, 2]);
        // Four: no root, no NUMA node holds them: the host's order.
        request.count = 4;
        assert!(p.rank_claim_devices(&Task::default(), &Node::default(), &request).is_empty());
    }
}
