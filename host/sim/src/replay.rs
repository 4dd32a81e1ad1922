//! The submit-until-X % experiment: every pod is submitted once, in order; it is placed with the
//! policy set or fails; nothing is deleted (`openb-protocol.md` §3 and §5).

use wasmsched_core::{NodeTable, PolicySet, bind, place};

use crate::trace::TracePod;

/// After one submitted pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// Milli-GPUs requested by all pods submitted so far, failed ones included.
    pub arrived_milli: u64,
    /// Milli-GPUs allocated.
    pub used_milli: u64,
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

/// Replay `pods` on a copy of `nodes` with `set` (worker 0).
pub fn run(set: &PolicySet, nodes: &NodeTable, pods: &[TracePod]) -> Run {
    let mut table = nodes.clone();
    let capacity_milli: u64 = table.slots().filter_map(|s| table.get(s)).map(|n| n.allocatable.gpu_milli).sum();
    let (mut arrived, mut used) = (0u64, 0u64);
    let mut out = Run { placed: 0, failed: 0, series: Vec::with_capacity(pods.len()), capacity_milli, faulted: 0 };
    for pod in pods {
        let task = pod.to_task();
        arrived += pod.gpu_total_milli();
        match place(set, &table, &task, 0) {
            Ok(p) => match table.update(p.node, |n| bind(n, &task, &p.devices)) {
                Some(Ok(())) => {
                    used += pod.gpu_total_milli();
                    out.placed += 1;
                }
                _ => out.failed += 1,
            },
            Err(e) => {
                out.failed += 1;
                if !e.diagnosis.faults.is_empty() {
                    out.faulted += 1;
                }
            }
        }
        out.series.push(Point { arrived_milli: arrived, used_milli: used });
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

/// The paper's table row: GPU allocation ratio (percent of capacity) at arrived workload
/// 0..=`max_column` percent, each the mean over the events whose rounded arrival equals the column
/// (or within ±1 when none does); `None` where no event is near (`openb-protocol.md` §5.2).
pub fn allocation_columns(run: &Run, max_column: usize) -> Vec<Option<f64>> {
    let gpus = run.capacity_milli as f64 / 1000.0;
    let rows: Vec<(i64, f64)> = run
        .series
        .iter()
        .map(|p| {
            let arrive = ((p.arrived_milli as f64 / gpus) / 10.0).round_ties_even() as i64;
            let alloc: f64 = format!("{:.2}", (p.used_milli as f64 / gpus) / 10.0).parse().unwrap_or(0.0);
            (arrive, alloc)
        })
        .collect();
    (0..=max_column as i64)
        .map(|r| {
            let mut vals: Vec<f64> = rows.iter().filter(|(a, _)| *a == r).map(|(_, v)| *v).collect();
            if vals.is_empty() {
                vals = rows.iter().filter(|(a, _)| (r - 1..=r + 1).contains(a)).map(|(_, v)| *v).collect();
            }
            (!vals.is_empty()).then(|| ((pairwise_sum(&vals) / vals.len() as f64) * 100.0).round_ties_even() / 100.0)
        })
        .collect()
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
                Point { arrived_milli: 500, used_milli: 500 },
                Point { arrived_milli: 1000, used_milli: 1000 },
                Point { arrived_milli: 1004, used_milli: 1000 },
                Point { arrived_milli: 1300, used_milli: 1000 },
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
