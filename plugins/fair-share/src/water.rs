//! Deserved shares by hierarchical weighted water-filling, one resource dimension at a time.
//!
//! At each level, in each dimension, the parent's amount (the cluster for roots) is split among its
//! children:
//! 1. each child first gets its guarantee, capped by its demand; if the guarantees together exceed
//!    the amount they are scaled down proportionally, so guarantees are never over-committed;
//! 2. the rest is split by weight among children whose demand is not met, repeatedly, each capped
//!    at its demand (work-conserving: what one child cannot use goes to the others); a remainder too
//!    small to split by weight goes to the heaviest unmet child (ties: input order).
//!
//! A child's demand is its request (for a parent: the sum of its children's demands, or its own
//! request if larger), capped by its capability. Unrequested capacity stays undistributed.

use wasmsched_sdk::prelude::*;

use crate::tree::Tree;

/// A resource dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Dim {
    Cpu,
    Memory,
    Gpu,
    Extended(String),
}

impl Dim {
    pub fn get(&self, r: &Resources) -> u64 {
        match self {
            Dim::Cpu => r.cpu_milli,
            Dim::Memory => r.memory_bytes,
            Dim::Gpu => r.gpu_milli,
            Dim::Extended(name) => r.extended(name),
        }
    }

    fn set(&self, r: &mut Resources, v: u64) {
        match self {
            Dim::Cpu => r.cpu_milli = v,
            Dim::Memory => r.memory_bytes = v,
            Dim::Gpu => r.gpu_milli = v,
            Dim::Extended(name) => match r.extended.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
                Ok(i) => r.extended[i].1 = v,
                Err(i) => r.extended.insert(i, (name.clone(), v)),
            },
        }
    }
}

/// The dimensions of `cluster`.
pub(crate) fn dims(cluster: &Resources) -> Vec<Dim> {
    let mut d = vec![Dim::Cpu, Dim::Memory, Dim::Gpu];
    d.extend(cluster.extended.iter().map(|(n, _)| Dim::Extended(n.clone())));
    d
}

/// Deserved share of every queue, in input order.
pub(crate) fn deserved(tree: &Tree, queues: &[QueueState], cluster: &Resources) -> Vec<Resources> {
    let mut out = vec![Resources::default(); queues.len()];
    for dim in dims(cluster) {
        let mut demand = vec![0u64; queues.len()];
        for &r in &tree.roots {
            compute_demand(tree, queues, &dim, r, &mut demand);
        }
        let mut amount = vec![0u64; queues.len()];
        split(tree, queues, &dim, &tree.roots, dim.get(cluster), &demand, &mut amount);
        for (q, v) in amount.into_iter().enumerate() {
            dim.set(&mut out[q], v);
        }
    }
    out
}

fn compute_demand(tree: &Tree, queues: &[QueueState], dim: &Dim, q: usize, demand: &mut [u64]) -> u64 {
    let mut d = dim.get(&queues[q].request);
    if !tree.children[q].is_empty() {
        let sum = tree.children[q]
            .iter()
            .fold(0u64, |acc, &c| acc.saturating_add(compute_demand(tree, queues, dim, c, demand)));
        d = d.max(sum);
    }
    if let Some(cap) = &queues[q].capability {
        d = d.min(dim.get(cap));
    }
    demand[q] = d;
    d
}

fn split(
    tree: &Tree,
    queues: &[QueueState],
    dim: &Dim,
    children: &[usize],
    total: u64,
    demand: &[u64],
    out: &mut [u64],
) {
    if children.is_empty() {
        return;
    }
    // 1. Guarantees, capped by demand and scaled down to fit.
    let guaranteed: Vec<u64> = children.iter().map(|&c| dim.get(&queues[c].guarantee).min(demand[c])).collect();
    let sum: u128 = guaranteed.iter().map(|&g| u128::from(g)).sum();
    for (&c, &g) in children.iter().zip(&guaranteed) {
        out[c] = if sum > u128::from(total) { (u128::from(g) * u128::from(total) / sum) as u64 } else { g };
    }
    let mut remaining = total - children.iter().map(|&c| out[c]).sum::<u64>();

    // 2. Weighted rounds among the unmet.
    let mut active: Vec<usize> = children.iter().copied().filter(|&c| out[c] < demand[c]).collect();
    while remaining > 0 && !active.is_empty() {
        let weights: u128 = active.iter().map(|&c| u128::from(queues[c].weight)).sum();
        let mut given = 0u64;
        for &c in &active {
            let share = (u128::from(remaining) * u128::from(queues[c].weight) / weights) as u64;
            let give = share.min(demand[c] - out[c]);
            out[c] += give;
            given += give;
        }
        if given == 0 {
            // Less than one unit per weight is left: the heaviest unmet child takes it.
            let &c = active
                .iter()
                .max_by(|&&a, &&b| queues[a].weight.cmp(&queues[b].weight).then(b.cmp(&a)))
                .unwrap_or(&active[0]);
            given = remaining.min(demand[c] - out[c]);
            out[c] += given;
        }
        remaining -= given;
        active.retain(|&c| out[c] < demand[c]);
    }

    for &c in children {
        split(tree, queues, dim, &tree.children[c], out[c], demand, out);
    }
}
