//! The submit-until-X % experiment: every pod is submitted once, in order; it is placed with the
//! policy set or fails; nothing is deleted (`docs/openb-protocol.md` §3 and §5).

use wasmsched_api::fragmentation::{ModelAccess, TypicalPod, of_node};
use wasmsched_api::gpu_affinity::{affinity_recorded, record_affinity};
use wasmsched_api::{Node, Task};
use wasmsched_core::{NodeTable, Placement, PolicySet, Unschedulable, bind, place};

use crate::trace::TracePod;

/// After one submitted pod.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    /// Milli-GPUs requested by all pods submitted so far, failed ones included.
    pub arrived_milli: u64,
    /// Milli-GPUs allocated.
    pub used_milli: u64,
    /// Fragmented milli-GPUs over the cluster for the target workload, rounded to 2 decimals as
    /// the paper's log prints it.
    pub frag_milli: f64,
    /// Fragmented share of the idle GPU share (%), rounded to 2 decimals.
    pub frag_ratio: f64,
}

/// The outcome of one experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Pods placed.
    pub placed: usize,
    /// Pods that found no node.
    pub failed: usize,
    /// One point per submitted pod.
    pub series: Vec<Point>,
    /// Cluster GPU capacity in milli-GPUs.
    pub capacity_milli: u64,
    /// Failures caused by plugin faults (not by lack of room).
    pub faulted: usize,
}

/// Per-node fragmentation for the target workload, kept current as pods land.
struct FragTracker<'a> {
    typical: &'a [TypicalPod],
    access: ModelAccess,
    per_node: Vec<(f64, f64)>,
}

impl<'a> FragTracker<'a> {
    fn new(typical: &'a [TypicalPod], table: &NodeTable) -> Self {
        let mut t = FragTracker { typical, access: ModelAccess::default(), per_node: Vec::new() };
        for slot in table.slots() {
            if let Some(n) = table.get(slot) {
                t.update(slot as usize, n);
            }
        }
        t
    }

    fn update(&mut self, at: usize, node: &Node) {
        let model = node.gpus.first().map_or("", |g| g.model.as_str());
        let f = of_node(self.typical, self.access.of(self.typical, model), node);
        if self.per_node.len() <= at {
            self.per_node.resize(at + 1, (0.0, 0.0));
        }
        self.per_node[at] = (f.fragmented, f.idle);
    }

    /// (fragmented milli, fragmented % of idle), each rounded to 2 decimals like the paper's log.
    fn report(&self) -> (f64, f64) {
        let (frag, idle) = self.per_node.iter().fold((0.0, 0.0), |(f, i), (nf, ni)| (f + nf, i + ni));
        let ratio = if idle > 0.0 { 100.0 * frag / idle } else { 0.0 };
        (round2(frag), round2(ratio))
    }
}

/// Round to 2 decimals the way `printf("%.2f")` followed by parsing does.
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// Replay `pods` on a copy of `nodes` with `set` (worker 0), measuring fragmentation against the
/// `typical` target workload. Each bound pod's GPU shape is recorded on its node
/// ([`record_affinity`]), as shape-aware scorers expect of the cluster state.
pub fn run(set: &PolicySet, nodes: &NodeTable, pods: &[TracePod], typical: &[TypicalPod]) -> Run {
    run_observed(set, nodes, pods, typical, |_| {})
}

/// One scheduling decision of a replay, for observers (events, logs).
#[derive(Debug)]
pub struct Decision<'a> {
    /// The task.
    pub task: &'a Task,
    /// Where it went (the node after binding), or why it could not be placed.
    pub outcome: Result<(&'a Placement, &'a Node), &'a Unschedulable>,
    /// The run's figures after it: allocation and fragmentation as the replay records them.
    pub after: Point,
}

/// [`run`], calling `observe` after every decision.
pub fn run_observed(
    set: &PolicySet,
    nodes: &NodeTable,
    pods: &[TracePod],
    typical: &[TypicalPod],
    mut observe: impl FnMut(Decision<'_>),
) -> Run {
    let mut table = nodes.clone();
    let capacity_milli: u64 = table.slots().filter_map(|s| table.get(s)).map(|n| n.allocatable.gpu_milli).sum();
    let (mut arrived, mut used) = (0u64, 0u64);
    let mut frag = FragTracker::new(typical, &table);
    let mut out = Run { placed: 0, failed: 0, series: Vec::with_capacity(pods.len()), capacity_milli, faulted: 0 };
    for pod in pods {
        let task = pod.to_task();
        arrived += pod.gpu_total_milli();
        let point = |frag: &FragTracker<'_>, used| {
            let (frag_milli, frag_ratio) = frag.report();
            Point { arrived_milli: arrived, used_milli: used, frag_milli, frag_ratio }
        };
        match place(set, &table, &task, 0) {
            // A usage change for mirrors; the affinity label changes only with a new shape.
            Ok(p) => match table.update_usage(p.node, |n| bind(n, &task, &p.devices)) {
                Some(Ok(())) => {
                    if table.get(p.node).is_some_and(|n| !affinity_recorded(n, &task)) {
                        table.update(p.node, |n| record_affinity(n, &task));
                    }
                    used += pod.gpu_total_milli();
                    out.placed += 1;
                    if let Some(n) = table.get(p.node) {
                        frag.update(p.node as usize, n);
                        let after = point(&frag, used);
                        out.series.push(after);
                        observe(Decision { task: &task, outcome: Ok((&p, n)), after });
                        continue;
                    }
                }
                _ => out.failed += 1,
            },
            Err(e) => {
                out.failed += 1;
                if !e.diagnosis.faults.is_empty() {
                    out.faulted += 1;
                }
                let after = point(&frag, used);
                out.series.push(after);
                observe(Decision { task: &task, outcome: Err(&e), after });
                continue;
            }
        }
        out.series.push(point(&frag, used));
    }
    out
}

/// numpy's pairwise summation, so column means match the paper's scripts to the last digit.
fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        return a.iter().fold(0.0, |s, x| s + x);
    }
    if n <= 128 {
        let mut r = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]];
        let full = n - n % 8;
        for block in a[8..full].chunks_exact(8) {
            for j in 0..8 {
                r[j] += block[j];
            }
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for x in &a[full..] {
            res += x;
        }
        return res;
    }
    let mut n2 = n / 2;
    n2 -= n2 % 8;
    pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
}

/// Group the events by rounded arrival percent (0..=`max_column`) and reduce each column with
/// `reduce`; a column with no event uses the events within ±1, and stays `None` if there are none.
fn columns(
    run: &Run,
    max_column: usize,
    value: impl Fn(&Point) -> f64,
    reduce: impl Fn(&[f64]) -> f64,
) -> Vec<Option<f64>> {
    let gpus = run.capacity_milli as f64 / 1000.0;
    let rows: Vec<(i64, f64)> = run
        .series
        .iter()
        .map(|p| (((p.arrived_milli as f64 / gpus) / 10.0).round_ties_even() as i64, value(p)))
        .collect();
    (0..=max_column as i64)
        .map(|r| {
            let mut vals: Vec<f64> = rows.iter().filter(|(a, _)| *a == r).map(|(_, v)| *v).collect();
            if vals.is_empty() {
                vals = rows.iter().filter(|(a, _)| (r - 1..=r + 1).contains(a)).map(|(_, v)| *v).collect();
            }
            (!vals.is_empty()).then(|| reduce(&vals))
        })
        .collect()
}

fn mean(vals: &[f64]) -> f64 {
    pairwise_sum(vals) / vals.len() as f64
}

/// numpy's `round(x, 2)`: scale, round half to even, unscale.
fn np_round2(x: f64) -> f64 {
    (x * 100.0).round_ties_even() / 100.0
}

/// The paper's table row: GPU allocation ratio (percent of capacity) at arrived workload
/// 0..=`max_column` percent, each the mean over the events whose rounded arrival equals the column
/// (or within ±1 when none does); `None` where no event is near (`docs/openb-protocol.md` §5.2).
pub fn allocation_columns(run: &Run, max_column: usize) -> Vec<Option<f64>> {
    let gpus = run.capacity_milli as f64 / 1000.0;
    columns(run, max_column, |p| round2((p.used_milli as f64 / gpus) / 10.0), |v| np_round2(mean(v)))
}

/// Fragmented GPU share as a percentage of GPU capacity, per arrival column (§5.3).
pub fn fragmentation_columns(run: &Run, max_column: usize) -> Vec<Option<f64>> {
    let gpus = run.capacity_milli as f64 / 1000.0;
    columns(run, max_column, |p| p.frag_milli, |v| np_round2(100.0 * mean(v) / 1000.0 / gpus))
}

/// Fragmented share of the idle GPU share (%), per arrival column, not rounded (§5.3).
pub fn fragmentation_ratio_columns(run: &Run, max_column: usize) -> Vec<Option<f64>> {
    columns(run, max_column, |p| p.frag_ratio, mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_matches_plain_sum_on_exact_values() {
        let v: Vec<f64> = (0..300).map(f64::from).collect();
        assert_eq!(pairwise_sum(&v), 44850.0);
        assert_eq!(pairwise_sum(&v[..5]), 10.0);
        assert_eq!(pairwise_sum(&v[..20]), 190.0);
    }

    #[test]
    fn columns_average_events_at_each_arrival_percent() {
        let run = Run {
            placed: 3,
            failed: 1,
            capacity_milli: 1000,
            faulted: 0,
            series: vec![
                Point { arrived_milli: 500, used_milli: 500, ..Default::default() },
                Point { arrived_milli: 1000, used_milli: 1000, ..Default::default() },
                Point { arrived_milli: 1004, used_milli: 1000, ..Default::default() },
                Point { arrived_milli: 1300, used_milli: 1000, ..Default::default() },
            ],
        };
        let c = allocation_columns(&run, 130);
        assert_eq!(c[50], Some(50.0));
        assert_eq!(c[100], Some(100.0));
        assert_eq!(c[130], Some(100.0));
        assert_eq!(c[49], Some(50.0), "neighbouring columns fall back to ±1");
        assert_eq!(c[10], None);
    }
}
