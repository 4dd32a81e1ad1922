//! `allocation-score`: the reference scorers, kube-scheduler's `LeastAllocated` (spread) and
//! `MostAllocated` (bin-packing) with per-resource weights over CPU, memory and GPU share.
//!
//! For each resource with non-zero node capacity, `requested` is what is allocated plus what the
//! task asks; the resource scores `(capacity - requested) * 100 / capacity` (least) or
//! `requested * 100 / capacity` (most), 0 when `requested > capacity`. The node score is the
//! weighted mean (integer division) over the resources the node has; a node with none scores 0.
//! GPU capacity counts healthy devices only.
//!
//! Configuration (JSON): `{"strategy": "least" | "most", "weights": {"cpu": 1, "memory": 1, "gpu": 1}}`.
//! Defaults: `least`, all weights 1. Weights are 0..=100 and not all zero.

use serde::Deserialize;
use wasmsched_sdk::prelude::*;

/// How requested resources turn into a score.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Prefer emptier nodes (spread).
    #[default]
    Least,
    /// Prefer fuller nodes (bin-packing).
    Most,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Weights {
    #[serde(default = "one")]
    cpu: u32,
    #[serde(default = "one")]
    memory: u32,
    #[serde(default = "one")]
    gpu: u32,
}

fn one() -> u32 {
    1
}

impl Default for Weights {
    fn default() -> Self {
        Weights { cpu: 1, memory: 1, gpu: 1 }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    strategy: Strategy,
    #[serde(default)]
    weights: Weights,
}

/// The allocation scorer.
#[derive(Debug, Default)]
pub struct AllocationScore {
    config: Config,
}

impl Plugin for AllocationScore {
    const NAME: &'static str = "allocation-score";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        let w = config.weights;
        if [w.cpu, w.memory, w.gpu].iter().any(|&x| x > 100) {
            return Err("invalid allocation-score configuration: weights must be at most 100".into());
        }
        if w.cpu + w.memory + w.gpu == 0 {
            return Err("invalid allocation-score configuration: all weights are zero".into());
        }
        Ok(AllocationScore { config })
    }
}

impl AllocationScore {
    /// The configured strategy.
    pub fn strategy(&self) -> Strategy {
        self.config.strategy
    }

    #[inline(always)]
    fn resource_score(&self, requested: u64, capacity: u64) -> u64 {
        if requested > capacity {
            return 0;
        }
        // u64 unless the product would overflow (quantities above ~1.8e17). Not `checked_mul`:
        // Wasm has no overflow flag, so it becomes a 128-bit multiply library call (`__multi3`),
        // which made this plugin 5× slower as a component than natively. A comparison is free.
        let used = if requested <= u64::MAX / u64::from(MAX_SCORE) {
            requested * u64::from(MAX_SCORE) / capacity
        } else {
            (u128::from(requested) * u128::from(MAX_SCORE) / u128::from(capacity)) as u64
        };
        // `used` <= MAX_SCORE because requested <= capacity.
        match self.config.strategy {
            Strategy::Least => u64::from(MAX_SCORE) - used,
            Strategy::Most => used,
        }
    }
}

impl Score for AllocationScore {
    // Always: LLVM otherwise may keep it out of the SDK's batch loop, and as a component every
    // call per node costs a Cranelift prologue (stack and epoch checks); see resource-fit.
    #[inline(always)]
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        let w = self.config.weights;
        // Capacity and free share of the usable devices, from the node's aggregates.
        let gpus = node.gpus.summary();
        let (gpu_capacity, gpu_free) = (u64::from(gpus.usable) * u64::from(GPU_MILLI), gpus.free_milli);
        let gpu_allocated = gpu_capacity - gpu_free.min(gpu_capacity);
        // Straight-line, not a loop over an array of the three: as a component the array lived
        // in linear memory and each pass checked the epoch deadline, 1.6× the native cost.
        let (mut sum, mut weights) = (0u64, 0u64);
        let mut add = |weight: u32, requested: u64, capacity: u64| {
            if capacity != 0 && weight != 0 {
                sum += u64::from(weight) * self.resource_score(requested, capacity);
                weights += u64::from(weight);
            }
        };
        add(w.cpu, node.allocated.cpu_milli.saturating_add(task.request.cpu_milli), node.allocatable.cpu_milli);
        add(
            w.memory,
            node.allocated.memory_bytes.saturating_add(task.request.memory_bytes),
            node.allocatable.memory_bytes,
        );
        add(w.gpu, gpu_allocated.saturating_add(task.gpu.total_milli()), gpu_capacity);
        sum.checked_div(weights).map_or(0, |s| s as u32)
    }
}

wasmsched_sdk::export_plugin!(AllocationScore: score);

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cpu_alloc: u64, free_gpus: &[u32]) -> Node {
        Node {
            allocatable: Resources { cpu_milli: 10_000, memory_bytes: 100, ..Default::default() },
            allocated: Resources { cpu_milli: cpu_alloc, ..Default::default() },
            gpus: free_gpus
                .iter()
                .enumerate()
                .map(|(i, &f)| GpuDevice { index: i as u32, free_milli: f, ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn least_and_most_are_mirrors() {
        let t = Task { request: Resources { cpu_milli: 1000, ..Default::default() }, ..Default::default() };
        let n = node(4000, &[1000, 0]);
        let mut least = AllocationScore::new(r#"{"weights":{"memory":0}}"#).unwrap();
        let mut most = AllocationScore::new(r#"{"strategy":"most","weights":{"memory":0}}"#).unwrap();
        // cpu: 5000/10000 -> least 50, most 50; gpu: 1000/2000 -> 50/50.
        assert_eq!(least.score(&t, &n), 50);
        assert_eq!(most.score(&t, &n), 50);
        let n = node(8000, &[1000, 1000]);
        // least: cpu 10, gpu 100 -> 55; most: cpu 90, gpu 0 -> 45.
        assert_eq!(least.score(&t, &n), 55);
        assert_eq!(most.score(&t, &n), 45);
    }

    #[test]
    fn huge_quantities_do_not_overflow() {
        let s = AllocationScore::new(r#"{"strategy":"most"}"#).unwrap();
        assert_eq!(s.resource_score(u64::MAX / 2, u64::MAX), 49);
        assert_eq!(s.resource_score(u64::MAX, u64::MAX), 100);
        assert_eq!(s.resource_score(u64::MAX, 1), 0);
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(AllocationScore::new(r#"{"weights":{"cpu":0,"memory":0,"gpu":0}}"#).is_err());
        assert!(AllocationScore::new(r#"{"weights":{"cpu":101}}"#).is_err());
        assert!(AllocationScore::new(r#"{"strategy":"middle"}"#).is_err());
        assert!(AllocationScore::new("not json").is_err());
    }
}
