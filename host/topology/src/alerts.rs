//! Placement alerts: a multi-GPU placement that spans NUMA
//! nodes is a **warning** ("topology mismatch"); one whose estimated all-reduce is slower than a
//! threshold is **critical** ("communication bottleneck").

use serde::{Deserialize, Serialize};

use crate::comm::{Collective, ring_ms};
use crate::{Cost, LinkCosts, NodeTopology};

/// How bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// Worth a look.
    Warning,
    /// Act.
    Critical,
}

/// One alert about one placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// How bad.
    pub severity: Severity,
    /// `topology-mismatch` or `communication-bottleneck`.
    pub kind: String,
    /// For humans.
    pub message: String,
}

/// When to raise the communication alert.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Buffer the all-reduce estimate is made for, MB.
    pub data_mb: f64,
    /// Estimated ring all-reduce time above which the placement is critical, ms.
    pub allreduce_ms: f64,
}

impl Default for Thresholds {
    /// 100 MB (an example buffer) and 5 ms: an NVLink or single-switch PCIe set stays
    /// below (0.16–4.6 ms on the PCIe-pair box), a cross-socket 4-GPU set does not (5.9 ms).
    fn default() -> Self {
        Thresholds { data_mb: 100.0, allreduce_ms: 5.0 }
    }
}

/// The slowest link inside a set of GPUs: its bandwidth (the minimum over pairs) and the worst latency
/// (infinite bandwidth and zero latency for fewer than two GPUs; pairs not on the node are skipped).
pub fn bottleneck(topology: &NodeTopology, costs: &LinkCosts, gpus: &[u32]) -> Cost {
    let mut worst = Cost { bandwidth_gbps: f64::INFINITY, latency_us: 0.0 };
    for (x, &a) in gpus.iter().enumerate() {
        for &b in &gpus[x + 1..] {
            if let Some(link) = topology.link(a as usize, b as usize) {
                let cost = costs.cost(link);
                worst.bandwidth_gbps = worst.bandwidth_gbps.min(cost.bandwidth_gbps);
                worst.latency_us = worst.latency_us.max(cost.latency_us);
            }
        }
    }
    worst
}

/// The alerts a placement of `gpus` on `topology` raises. Single-GPU placements raise none; GPUs
/// not on the node are reported as a topology mismatch (the placement cannot be judged).
pub fn placement_alerts(
    topology: &NodeTopology,
    costs: &LinkCosts,
    gpus: &[u32],
    thresholds: &Thresholds,
) -> Vec<Alert> {
    let mut alerts = Vec::new();
    if gpus.len() < 2 {
        return alerts;
    }
    if let Some(&bad) = gpus.iter().find(|&&g| g as usize >= topology.len()) {
        alerts.push(Alert {
            severity: Severity::Warning,
            kind: "topology-mismatch".into(),
            message: format!("GPU {bad} is not on this node ({} GPUs)", topology.len()),
        });
        return alerts;
    }
    let mut numa: Vec<Option<u32>> = gpus.iter().map(|&g| topology.gpus()[g as usize].numa).collect();
    numa.sort();
    numa.dedup();
    if numa.len() > 1 {
        let nodes: Vec<String> = numa.iter().map(|n| n.map_or("?".into(), |n| n.to_string())).collect();
        alerts.push(Alert {
            severity: Severity::Warning,
            kind: "topology-mismatch".into(),
            message: format!("GPUs {gpus:?} span NUMA nodes {}", nodes.join(", ")),
        });
    }
    let Cost { bandwidth_gbps: bottleneck, latency_us: latency } = bottleneck(topology, costs, gpus);
    let estimate = ring_ms(Collective::AllReduce, gpus.len() as u32, thresholds.data_mb, bottleneck, latency);
    if estimate > thresholds.allreduce_ms {
        alerts.push(Alert {
            severity: Severity::Critical,
            kind: "communication-bottleneck".into(),
            message: format!(
                "estimated all-reduce of {} MB over GPUs {gpus:?} takes {estimate:.2} ms (bottleneck {bottleneck:.1} GB/s), over {} ms",
                thresholds.data_mb, thresholds.allreduce_ms
            ),
        });
    }
    alerts
}
