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
//! request if larger), capped by its capability (which bounds only the extended resources it
//! names). Unrequested capacity stays undistributed.

use wasmsched_sdk::prelude::*;

use crate::tree::Tree;

/// A resource dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Dim {
    Cpu,
    Memory,
    Gpu,
    Extended(wasmsched_sdk::ResourceName),
}

impl Dim {
    /// `r`'s amount, or `unnamed` for an extended resource `r` does not name.
    fn get_or(&self, r: &Resources, unnamed: u64) -> u64 {
        match self {
            Dim::Cpu => r.cpu_milli,
            Dim::Memory => r.memory_bytes,
            Dim::Gpu => r.gpu_milli,
            Dim::Extended(name) => {
                r.extended.binary_search_by(|(n, _)| n.cmp(name)).map_or(unnamed, |i| r.extended[i].1)
            }
        }
    }
}

/// The dimensions of `cluster`: CPU, memory, GPU, then its extended resources in name order.
fn dims(cluster: &Resources) -> Vec<Dim> {
    let mut d = vec![Dim::Cpu, Dim::Memory, Dim::Gpu];
    d.extend(cluster.extended.iter().map(|(n, _)| Dim::Extended(*n)));
    d
}

/// One quantity per queue and dimension, read out of the queues' `Resources` once per
/// computation: the water-filling and the ordering then index numbers instead of looking up
/// extended resources by name (with per-flavor quotas, most dimensions are extended).
#[derive(Clone)]
pub(crate) struct Table {
    width: usize,
    cells: Vec<u64>,
}

impl Table {
    /// Rows in order. An absent row (no capability) reads `absent` in every dimension, and so
    /// does an extended resource a row does not name: 0 for amounts, `u64::MAX` for bounds (the
    /// contract's "a bound limits only the extended resources it names").
    pub fn read<'a>(dims: &[Dim], rows: impl Iterator<Item = Option<&'a Resources>>, absent: u64) -> Table {
        let mut cells = Vec::with_capacity(rows.size_hint().0 * dims.len());
        for row in rows {
            match row {
                Some(r) => cells.extend(dims.iter().map(|d| d.get_or(r, absent))),
                None => cells.extend(std::iter::repeat_n(absent, dims.len())),
            }
        }
        Table { width: dims.len(), cells }
    }

    /// Queue `q`'s quantity in dimension `d`.
    #[inline]
    pub fn get(&self, q: usize, d: usize) -> u64 {
        self.cells[q * self.width + d]
    }

    /// Queue `q`'s quantities, in dimension order.
    #[inline]
    pub fn row(&self, q: usize) -> &[u64] {
        &self.cells[q * self.width..(q + 1) * self.width]
    }

    /// Mutable access to queue `q`'s quantities.
    pub fn row_mut(&mut self, q: usize) -> &mut [u64] {
        &mut self.cells[q * self.width..(q + 1) * self.width]
    }
}

/// Everything the computation reads of the queues and the cluster, per dimension, read once.
pub(crate) struct Columns {
    pub dims: Vec<Dim>,
    /// The cluster's amount per dimension (one row).
    pub cluster: Table,
    pub request: Table,
    pub allocated: Table,
    pub capability: Table,
    pub guarantee: Table,
}

impl Columns {
    pub fn read(queues: &[QueueState], cluster: &Resources) -> Columns {
        let dims = dims(cluster);
        let column = |f: fn(&QueueState) -> &Resources| Table::read(&dims, queues.iter().map(|q| Some(f(q))), 0);
        Columns {
            cluster: Table::read(&dims, std::iter::once(Some(cluster)), 0),
            request: column(|q| &q.request),
            allocated: column(|q| &q.allocated),
            capability: Table::read(&dims, queues.iter().map(|q| q.capability.as_ref()), u64::MAX),
            guarantee: column(|q| &q.guarantee),
            dims,
        }
    }

    /// `table`'s rows as `Resources`, naming every extended dimension.
    pub fn resources(&self, table: &Table) -> Vec<Resources> {
        (0..table.cells.len() / table.width.max(1))
            .map(|q| {
                let row = table.row(q);
                Resources {
                    cpu_milli: row[0],
                    memory_bytes: row[1],
                    gpu_milli: row[2],
                    // `dims` lists extended resources in name order, so this stays sorted.
                    extended: self.dims[3..]
                        .iter()
                        .zip(&row[3..])
                        .filter_map(|(dim, &v)| match dim {
                            Dim::Extended(name) => Some((*name, v)),
                            _ => None,
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// What the water-filling reads.
struct Inputs<'a> {
    tree: &'a Tree,
    queues: &'a [QueueState],
    columns: &'a Columns,
}

/// Deserved share of every queue, in input order.
pub(crate) fn deserved(tree: &Tree, queues: &[QueueState], columns: &Columns) -> Table {
    let n = queues.len();
    let width = columns.dims.len();
    let inputs = Inputs { tree, queues, columns };
    let mut share = Table { width, cells: vec![0; n * width] };
    let mut demand = vec![0u64; n];
    let mut amount = vec![0u64; n];
    for d in 0..width {
        for &r in &tree.roots {
            compute_demand(&inputs, d, r, &mut demand);
        }
        amount.fill(0);
        split(&inputs, d, &tree.roots, columns.cluster.get(0, d), &demand, &mut amount);
        for (q, &v) in amount.iter().enumerate() {
            share.row_mut(q)[d] = v;
        }
    }
    share
}

fn compute_demand(inputs: &Inputs, d: usize, q: usize, demand: &mut [u64]) -> u64 {
    let mut own = inputs.columns.request.get(q, d);
    let children = &inputs.tree.children[q];
    if !children.is_empty() {
        let sum = children.iter().fold(0u64, |acc, &c| acc.saturating_add(compute_demand(inputs, d, c, demand)));
        own = own.max(sum);
    }
    let capped = own.min(inputs.columns.capability.get(q, d));
    demand[q] = capped;
    capped
}

fn split(inputs: &Inputs, d: usize, children: &[usize], total: u64, demand: &[u64], out: &mut [u64]) {
    let queues = inputs.queues;
    if children.is_empty() {
        return;
    }
    // 1. Guarantees, capped by demand and scaled down to fit.
    let guaranteed: Vec<u64> = children.iter().map(|&c| inputs.columns.guarantee.get(c, d).min(demand[c])).collect();
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
        split(inputs, d, &inputs.tree.children[c], out[c], demand, out);
    }
}
