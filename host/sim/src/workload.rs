//! Workload construction of the FGD experiment (`docs/openb-protocol.md` §2): seeded shuffle, tuning to
//! a share of GPU capacity, and random node ranks for tie-breaking.

use wasmsched_api::{GPU_MILLI, Node};
use wasmsched_core::NodeTable;

use wasmsched_api::fragmentation::TypicalPod;

use crate::generate::Rng;
use crate::timed::{self, Job};
use crate::trace::TracePod;

/// One experiment's input: nodes in rank order and pods in submission order.
#[derive(Debug)]
pub struct Workload {
    /// Nodes, inserted in rank order so that the core's lowest-slot tie-break is the lowest rank.
    pub nodes: NodeTable,
    /// Pods in submission order.
    pub pods: Vec<TracePod>,
    /// Cluster GPU capacity in milli-GPUs.
    pub capacity_milli: u64,
}

fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// Build the experiment for `seed`: shuffle the name-sorted trace, then add sampled clones (or
/// remove random pods) until the requested GPU total reaches `tune` × capacity, reproducing the
/// protocol's per-GPU-milli stopping test; then rank nodes by a random permutation.
pub fn build(pods: &[TracePod], nodes: &[Node], seed: u64, tune: f64) -> Workload {
    let mut w: Vec<TracePod> = pods.to_vec();
    w.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rng = Rng::new(seed);
    let mut order = w.clone();
    shuffle(&mut rng, &mut order);

    let capacity_milli: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * u64::from(GPU_MILLI)).sum();
    let target = tune * capacity_milli as f64;
    let mut total: u64 = w.iter().map(TracePod::gpu_total_milli).sum();
    if !w.is_empty() && (total as f64) < target {
        let mut i = 0;
        loop {
            let p = &w[rng.below(w.len() as u64) as usize];
            // The protocol's quirk: the stopping test adds the per-GPU milli, not count × milli.
            if (total + u64::from(p.gpu_milli)) as f64 > target {
                break;
            }
            total += p.gpu_total_milli();
            let mut clone = p.clone();
            clone.name = format!("{}-tuned-{i}", p.name);
            order.push(clone);
            i += 1;
        }
    } else {
        while (total as f64) > target && !order.is_empty() {
            let idx = rng.below(order.len() as u64) as usize;
            total -= order[idx].gpu_total_milli();
            order.remove(idx);
        }
    }

    let mut by_name: Vec<&Node> = nodes.iter().collect();
    by_name.sort_by(|a, b| a.name.cmp(&b.name));
    let mut perm: Vec<usize> = (0..by_name.len()).collect();
    shuffle(&mut rng, &mut perm);
    let mut ranked: Vec<(usize, &Node)> = by_name.into_iter().enumerate().map(|(i, n)| (perm[i], n)).collect();
    ranked.sort_by_key(|(rank, _)| *rank);
    let mut table = NodeTable::new();
    for (_, n) in ranked {
        table.upsert(n.clone());
    }
    Workload { nodes: table, pods: order, capacity_milli }
}

/// The FGD target workload of a trace (`docs/openb-protocol.md` §4.6.1): the most popular pod shapes
/// covering 95 % of the trace's pods, from the whole original trace (not the tuned list).
pub fn target_workload(pods: &[TracePod]) -> Vec<TypicalPod> {
    let jobs: Vec<Job> = pods.iter().map(|p| Job::from_trace(p, 1.0)).collect();
    timed::target_workload(&jobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_nodes, parse_pods};

    #[test]
    fn tunes_to_target_and_is_deterministic() {
        let nodes = parse_nodes("n", "sn,cpu_milli,memory_mib,gpu,model\na,1,1,2,T4\nb,1,1,2,T4\n").unwrap();
        let pods =
            parse_pods("p", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1,1,1,500\np2,1,1,1,1000\n").unwrap();
        let a = build(&pods, &nodes, 42, 1.3);
        let b = build(&pods, &nodes, 42, 1.3);
        assert_eq!(a.pods, b.pods);
        assert_eq!(a.capacity_milli, 4000);
        let total: u64 = a.pods.iter().map(TracePod::gpu_total_milli).sum();
        assert!(total as f64 <= 1.3 * 4000.0 && total as f64 > 1.3 * 4000.0 - 1000.0, "{total}");
        assert!(a.pods[2..].iter().all(|p| p.name.contains("-tuned-")));
        let down = build(&pods, &nodes, 7, 0.25);
        let total: u64 = down.pods.iter().map(TracePod::gpu_total_milli).sum();
        assert!(total <= 1000);
    }
}
