//! Node topologies the host answers plugins' `topology` questions from.

use std::sync::Arc;

use ahash::AHashMap;
use wasmsched_api::GpuHealth;
use wasmsched_api::topology::{GpuLink, GpuSet, NumaPolicy, TopologyView};
use wasmsched_topology::annotation::NodeFacts;
use wasmsched_topology::{Link, LinkCosts, NodeTopology, Prepared};

use crate::NodeTable;

/// Applies what a node's agent reported (read with `wasmsched_topology::annotation::read_node`) to
/// the node named `node`: its topology (and the NUMA node of each GPU), and the health of every GPU
/// (listed unhealthy or degraded, healthy otherwise), so placement stops using unhealthy GPUs.
/// Returns false when no such node exists.
pub fn apply_node_facts(nodes: &mut NodeTable, node: &str, facts: NodeFacts) -> bool {
    let Some(slot) = nodes.slot_of(node) else { return false };
    let topology = facts.topology;
    nodes.update(slot, |n| {
        n.gpus.update(|gpus| {
            for gpu in gpus.iter_mut() {
                gpu.health = if facts.unhealthy.contains(&gpu.index) {
                    GpuHealth::Unhealthy
                } else if facts.degraded.contains(&gpu.index) {
                    GpuHealth::Degraded
                } else {
                    GpuHealth::Healthy
                };
                if let Some(t) = &topology {
                    gpu.numa_node = t.gpus().get(gpu.index as usize).and_then(|g| g.numa);
                }
            }
        });
    });
    nodes.set_topology(node, topology);
    true
}

/// Bandwidth that scores 100 by default: NV18 (H100), 900 GB/s.
pub const DEFAULT_REFERENCE_MBPS: u32 = 900_000;

struct Known {
    topology: NodeTopology,
    prepared: Prepared,
}

/// Topologies by node name, with the link costs they were prepared with. Cheap to clone (shared
/// entries), so a [`crate::NodeTable`] can hand an immutable snapshot to every call.
#[derive(Clone)]
pub struct Topologies {
    by_name: AHashMap<String, Arc<Known>>,
    costs: LinkCosts,
    reference_mbps: u32,
}

impl Default for Topologies {
    fn default() -> Self {
        Topologies { by_name: AHashMap::new(), costs: LinkCosts::default(), reference_mbps: DEFAULT_REFERENCE_MBPS }
    }
}

impl std::fmt::Debug for Topologies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topologies").field("nodes", &self.by_name.len()).field("costs", &self.costs).finish()
    }
}

impl Topologies {
    /// Records (or replaces) a node's topology.
    pub fn insert(&mut self, node: &str, topology: NodeTopology) {
        let prepared = Prepared::new(&topology, &self.costs);
        self.by_name.insert(node.to_string(), Arc::new(Known { topology, prepared }));
    }

    /// Forgets a node's topology.
    pub fn remove(&mut self, node: &str) {
        self.by_name.remove(node);
    }

    /// Sets the link costs (re-preparing every topology) and the bandwidth that scores 100.
    pub fn configure(&mut self, costs: LinkCosts, reference_mbps: u32) {
        self.costs = costs;
        self.reference_mbps = reference_mbps.max(1);
        for known in self.by_name.values_mut() {
            let topology = known.topology.clone();
            let prepared = Prepared::new(&topology, &self.costs);
            *known = Arc::new(Known { topology, prepared });
        }
    }

    /// Number of nodes with a topology.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// No topology known.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The link costs topologies are scored (and shown) with.
    pub fn costs(&self) -> &LinkCosts {
        &self.costs
    }

    /// The topology of `node`.
    pub fn get(&self, node: &str) -> Option<&NodeTopology> {
        self.by_name.get(node).map(|k| &k.topology)
    }
}

impl TopologyView for Topologies {
    fn best_gpus(&self, node: &str, count: u32, numa: NumaPolicy, free: u64) -> Option<Result<GpuSet, String>> {
        let known = self.by_name.get(node)?;
        Some(known.prepared.select(free, count, numa).map_err(|e| e.to_string()).map(|choice| {
            let score = known.prepared.score_of(&choice, numa, self.reference_mbps);
            GpuSet {
                gpus: choice.gpus,
                bottleneck_mbps: choice.bottleneck_mbps,
                distance_milli: choice.distance_milli,
                numa_span: choice.numa_span,
                score,
            }
        }))
    }

    fn link(&self, node: &str, a: u32, b: u32) -> Option<GpuLink> {
        let known = self.by_name.get(node)?;
        let link = known.topology.link(a as usize, b as usize)?;
        let cost = self.costs.cost(link);
        Some(GpuLink {
            class: link.code(),
            nvswitch: matches!(link, Link::NvLink { switched: true, .. }),
            bandwidth_mbps: (cost.bandwidth_gbps * 1000.0).round().min(f64::from(u32::MAX)) as u32,
            distance_milli: (self.costs.distance(link) * 1000.0).round().min(f64::from(u32::MAX)) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nv12_pair() -> NodeTopology {
        let text = "\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tNV12\t0\nGPU1\tNV12\t X \t0\n";
        wasmsched_topology::smi::parse(text).unwrap()
    }

    #[test]
    fn answers_follow_the_configured_costs() {
        let mut t = Topologies::default();
        t.insert("n", nv12_pair());
        assert_eq!(t.link("n", 0, 1).unwrap().bandwidth_mbps, 600_000);
        let full = t.best_gpus("n", 2, NumaPolicy::BestEffort, 0b11).unwrap().unwrap();
        // Half the per-link bandwidth, and a reference equal to it: the same pair now scores 100.
        t.configure(LinkCosts { nvlink_per_link_gbps: 25.0, ..LinkCosts::default() }, 300_000);
        assert_eq!(t.link("n", 0, 1).unwrap().bandwidth_mbps, 300_000);
        let set = t.best_gpus("n", 2, NumaPolicy::BestEffort, 0b11).unwrap().unwrap();
        assert_eq!((set.bottleneck_mbps, set.score), (Some(300_000), 100));
        assert!(full.score < 100, "600 GB/s against the default 900 GB/s reference");
        assert!(t.best_gpus("other", 2, NumaPolicy::BestEffort, 0b11).is_none(), "unknown node");
        assert!(t.best_gpus("n", 3, NumaPolicy::BestEffort, 0b11).unwrap().is_err());
        t.remove("n");
        assert!(t.is_empty());
    }
}
