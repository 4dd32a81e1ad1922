//! The order in which leaf queues are served.

use std::cmp::Ordering;

use wasmsched_sdk::prelude::*;

use crate::Policy;
use crate::tree::Tree;
use crate::water::{Columns, Table};

/// Keys are compared at this resolution, so that 2/3 ÷ 2 ties with 1/3 despite rounding.
const RESOLUTION: f64 = 1e9;

fn ratio(a: u64, b: u64) -> f64 {
    match (a, b) {
        (0, _) => 0.0,
        (_, 0) => f64::INFINITY,
        (a, b) => a as f64 / b as f64,
    }
}

/// `max` over dimensions of `a / b`.
fn max_ratio(a: &[u64], b: &[u64]) -> f64 {
    a.iter().zip(b).map(|(&a, &b)| ratio(a, b)).fold(0.0, f64::max)
}

/// Quantise, then compare exactly: a tolerance test (`|a - b| < ε`) is not transitive, and a sort
/// given a comparison that is not a total order may panic — a trap, inside a guest.
fn cmp_key(a: f64, b: f64) -> Ordering {
    // `as` saturates: infinity maps to i128::MAX; NaN (never produced here) to 0.
    let q = |x: f64| (x * RESOLUTION).round() as i128;
    q(a).cmp(&q(b))
}

fn pending(request: &[u64], allocated: &[u64]) -> bool {
    request.iter().zip(allocated).any(|(r, a)| r > a)
}

/// Serving order of the leaves that have pending work.
pub(crate) fn order(
    policy: Policy,
    tree: &Tree,
    queues: &[QueueState],
    columns: &Columns,
    deserved: &Table,
) -> Vec<u32> {
    let cluster = columns.cluster.row(0);
    let (allocated, request) = (&columns.allocated, &columns.request);
    // Subtree allocation: a parent's own allocation plus its descendants'.
    let mut subtree = allocated.clone();
    fn accumulate(tree: &Tree, q: usize, subtree: &mut Table) {
        for &c in &tree.children[q] {
            accumulate(tree, c, subtree);
            for d in 0..subtree.row(q).len() {
                let child = subtree.get(c, d);
                let own = &mut subtree.row_mut(q)[d];
                *own = own.saturating_add(child);
            }
        }
    }
    for &r in &tree.roots {
        accumulate(tree, r, &mut subtree);
    }
    let dominant: Vec<f64> = (0..queues.len()).map(|q| max_ratio(subtree.row(q), cluster)).collect();
    // Tie-break shared by all policies: lower unweighted dominant share, then name.
    let tie = |a: usize, b: usize| cmp_key(dominant[a], dominant[b]).then_with(|| queues[a].name.cmp(&queues[b].name));

    let mut out = Vec::new();
    match policy {
        Policy::Drf => {
            fn visit(
                tree: &Tree,
                level: &[usize],
                key: &dyn Fn(usize) -> f64,
                tie: &dyn Fn(usize, usize) -> Ordering,
                leaf_ok: &dyn Fn(usize) -> bool,
                out: &mut Vec<u32>,
            ) {
                let mut level = level.to_vec();
                level.sort_by(|&a, &b| cmp_key(key(a), key(b)).then_with(|| tie(a, b)));
                for q in level {
                    if tree.children[q].is_empty() {
                        if leaf_ok(q) {
                            out.push(q as u32);
                        }
                    } else {
                        visit(tree, &tree.children[q], key, tie, leaf_ok, out);
                    }
                }
            }
            let key = |q: usize| dominant[q] / f64::from(queues[q].weight);
            let leaf_ok = |q: usize| pending(request.row(q), allocated.row(q));
            visit(tree, &tree.roots, &key, &tie, &leaf_ok, &mut out);
        }
        Policy::Proportion | Policy::DecayedUsage => {
            let mut leaves = Vec::new();
            for &r in &tree.roots {
                tree.leaves(r, &mut leaves);
            }
            leaves.retain(|&q| pending(request.row(q), allocated.row(q)));
            let key: Vec<f64> = match policy {
                Policy::Proportion => (0..queues.len()).map(|q| max_ratio(allocated.row(q), deserved.row(q))).collect(),
                _ => {
                    let share = normalized_shares(tree, queues);
                    queues.iter().zip(&share).map(|(q, s)| q.decayed_usage.max(0.0) / s).collect()
                }
            };
            leaves.sort_by(|&a, &b| cmp_key(key[a], key[b]).then_with(|| tie(a, b)));
            out.extend(leaves.into_iter().map(|q| q as u32));
        }
    }
    out
}

/// Each queue's share of the whole tree: its weight among its siblings times its parent's share.
fn normalized_shares(tree: &Tree, queues: &[QueueState]) -> Vec<f64> {
    let mut share = vec![0.0; queues.len()];
    fn walk(tree: &Tree, queues: &[QueueState], level: &[usize], parent: f64, share: &mut [f64]) {
        let total: f64 = level.iter().map(|&q| f64::from(queues[q].weight)).sum();
        for &q in level {
            share[q] = parent * f64::from(queues[q].weight) / total;
            walk(tree, queues, &tree.children[q], share[q], share);
        }
    }
    walk(tree, queues, &tree.roots, 1.0, &mut share);
    share
}
