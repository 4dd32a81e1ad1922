//! The paper's experiment grid: traces × policies × seeds, run in parallel, reduced to the
//! allocation and fragmentation columns and to the headline table (mean and standard deviation
//! over seeds of the allocation ratio at 100 % and 130 % arrived).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wasmsched_api::Node;
use wasmsched_api::fragmentation::TypicalPod;
use wasmsched_core::PolicySet;

use crate::replay;
use crate::trace::TracePod;
use crate::workload;

/// The last arrival column of the paper's figures and table.
pub const MAX_COLUMN: usize = 130;

/// One trace of the grid.
#[derive(Debug)]
pub struct Trace {
    /// Workload name (`default`, `cpu050`, ...).
    pub name: String,
    /// Its pods.
    pub pods: Vec<TracePod>,
}

/// What to run.
#[derive(Debug)]
pub struct Grid {
    /// The cluster.
    pub nodes: Vec<Node>,
    /// The traces.
    pub traces: Vec<Trace>,
    /// Policy names, passed to the set builder.
    pub policies: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Submit until this multiple of GPU capacity has arrived.
    pub tune: f64,
}

/// One experiment's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Trace name.
    pub trace: String,
    /// Policy name.
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Pods submitted, placed, failed.
    pub submitted: usize,
    /// Pods placed.
    pub placed: usize,
    /// Pods failed by plugin faults rather than lack of room.
    pub faulted: usize,
    /// GPUs in the cluster.
    pub total_gpus: u64,
    /// Allocation ratio (%) per arrival column 0..=130.
    pub allocation: Vec<Option<f64>>,
    /// Fragmented GPU share (% of capacity) per column.
    pub fragmentation: Vec<Option<f64>>,
    /// Fragmented share of idle GPU share (%) per column.
    pub fragmentation_ratio: Vec<Option<f64>>,
    /// Wall time of the replay.
    pub replay_time: Duration,
}

/// Progress of a grid run, reported after each experiment.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Experiments finished.
    pub done: usize,
    /// Experiments in the grid.
    pub total: usize,
    /// Since the grid started.
    pub elapsed: Duration,
}

/// Run every (trace, policy, seed) of `grid` on `jobs` threads. `policy_set(policy, seed,
/// target_workload)` builds the policies of one experiment; an error stops the grid. Outcomes come
/// back in grid order (trace, then policy, then seed) whatever the thread timing.
pub fn run<E: Send>(
    grid: &Grid,
    jobs: usize,
    policy_set: impl Fn(&str, u64, &[TypicalPod]) -> Result<PolicySet, E> + Sync,
    progress: impl Fn(Progress) + Sync,
) -> Result<Vec<Outcome>, E> {
    let targets: Vec<Vec<TypicalPod>> = grid.traces.iter().map(|t| workload::target_workload(&t.pods)).collect();
    let cells: Vec<(usize, usize, u64)> = (0..grid.traces.len())
        .flat_map(|t| (0..grid.policies.len()).flat_map(move |p| grid.seeds.iter().map(move |&s| (t, p, s))))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Outcome, E>>>> = Mutex::new((0..cells.len()).map(|_| None).collect());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, cells.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(t, p, seed)) = cells.get(i) else { break };
                    let trace = &grid.traces[t];
                    let policy = &grid.policies[p];
                    let outcome = policy_set(policy, seed, &targets[t]).map(|set| {
                        let work = workload::build(&trace.pods, &grid.nodes, seed, grid.tune);
                        let clock = Instant::now();
                        let run = replay::run(&set, &work.nodes, &work.pods, &targets[t]);
                        Outcome {
                            trace: trace.name.clone(),
                            policy: policy.clone(),
                            seed,
                            submitted: work.pods.len(),
                            placed: run.placed,
                            faulted: run.faulted,
                            total_gpus: work.capacity_milli / 1000,
                            allocation: replay::allocation_columns(&run, MAX_COLUMN),
                            fragmentation: replay::fragmentation_columns(&run, MAX_COLUMN),
                            fragmentation_ratio: replay::fragmentation_ratio_columns(&run, MAX_COLUMN),
                            replay_time: clock.elapsed(),
                        }
                    });
                    let failed = outcome.is_err();
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(outcome);
                    }
                    if failed {
                        // Stop handing out work; finished experiments are kept for nothing.
                        next.store(cells.len(), Ordering::Relaxed);
                        break;
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    progress(Progress { done: d, total: cells.len(), elapsed: started.elapsed() });
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    results.into_iter().flatten().collect()
}

/// One row of the headline table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Trace name.
    pub trace: String,
    /// Policy name.
    pub policy: String,
    /// Seeds averaged.
    pub seeds: usize,
    /// Allocation ratio at 100 % arrived: mean and sample standard deviation over seeds.
    pub at_100: (f64, f64),
    /// The same at 130 % arrived.
    pub at_130: (f64, f64),
}

fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Mean over seeds of `column` for each (trace, policy), in first-seen order.
pub fn mean_curve(
    outcomes: &[Outcome],
    trace: &str,
    policy: &str,
    column: impl Fn(&Outcome) -> &[Option<f64>],
) -> Vec<Option<f64>> {
    let runs: Vec<&[Option<f64>]> =
        outcomes.iter().filter(|o| o.trace == trace && o.policy == policy).map(&column).collect();
    (0..=MAX_COLUMN)
        .map(|c| {
            let vals: Vec<f64> = runs.iter().filter_map(|r| r.get(c).copied().flatten()).collect();
            (!vals.is_empty()).then(|| mean_std(&vals).0)
        })
        .collect()
}

/// The headline table: per (trace, policy), mean and standard deviation over seeds of the
/// allocation ratio at 100 % and 130 % arrived. Experiments missing a column are left out of it.
pub fn table(outcomes: &[Outcome]) -> Vec<Row> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for o in outcomes {
        if !keys.contains(&(o.trace.as_str(), o.policy.as_str())) {
            keys.push((&o.trace, &o.policy));
        }
    }
    keys.into_iter()
        .map(|(trace, policy)| {
            let runs: Vec<&Outcome> = outcomes.iter().filter(|o| o.trace == trace && o.policy == policy).collect();
            let at = |c: usize| mean_std(&runs.iter().filter_map(|o| o.allocation[c]).collect::<Vec<_>>());
            Row { trace: trace.into(), policy: policy.into(), seeds: runs.len(), at_100: at(100), at_130: at(130) }
        })
        .collect()
}

/// Traces on which `policy` does not have the strictly highest mean allocation at 130 % arrived.
pub fn not_best_at_130<'a>(rows: &'a [Row], policy: &str) -> Vec<&'a str> {
    let mut traces: Vec<&str> = rows.iter().map(|r| r.trace.as_str()).collect();
    traces.dedup();
    traces
        .into_iter()
        .filter(|&t| {
            let ours = rows.iter().find(|r| r.trace == t && r.policy == policy).map(|r| r.at_130.0);
            let others = rows.iter().filter(|r| r.trace == t && r.policy != policy).map(|r| r.at_130.0);
            match ours {
                Some(v) => others.into_iter().any(|o| v.partial_cmp(&o) != Some(std::cmp::Ordering::Greater)),
                None => true,
            }
        })
        .collect()
}

/// One trace's comparison of two policies at 130 % arrived, seed by seed (both saw the same
/// arrivals: a seed fixes the workload, `docs/openb-protocol.md` §2).
#[derive(Clone, Debug, PartialEq)]
pub struct Gain {
    /// Trace name.
    pub trace: String,
    /// Seeds both policies ran.
    pub seeds: usize,
    /// Mean over seeds of the allocation difference, percentage points (positive: the policy wins).
    pub mean: f64,
    /// Standard error of that mean (the per-seed differences' standard deviation / √seeds).
    pub paired_se: f64,
    /// Standard error of the baseline's own mean over seeds.
    pub baseline_se: f64,
}

impl Gain {
    /// Whether the policy is better by more than either standard error: the bar a claim of
    /// "better on this workload" has to clear.
    pub fn significant(&self) -> bool {
        self.mean > self.paired_se.max(self.baseline_se)
    }
}

/// `policy` against `baseline` at 130 % arrived, per trace in first-seen order; traces where the
/// two share fewer than two seeds are left out.
pub fn gains_at_130(outcomes: &[Outcome], policy: &str, baseline: &str) -> Vec<Gain> {
    let mut traces: Vec<&str> = Vec::new();
    for o in outcomes {
        if !traces.contains(&o.trace.as_str()) {
            traces.push(&o.trace);
        }
    }
    let at_130 = |trace: &str, name: &str, seed: u64| {
        outcomes.iter().find(|o| o.trace == trace && o.policy == name && o.seed == seed).and_then(|o| o.allocation[130])
    };
    traces
        .into_iter()
        .filter_map(|trace| {
            let pairs: Vec<(f64, f64)> = outcomes
                .iter()
                .filter(|o| o.trace == trace && o.policy == policy)
                .filter_map(|o| Some((o.allocation[130]?, at_130(trace, baseline, o.seed)?)))
                .collect();
            if pairs.len() < 2 {
                return None;
            }
            let n = (pairs.len() as f64).sqrt();
            let (mean, sd) = mean_std(&pairs.iter().map(|(p, b)| p - b).collect::<Vec<_>>());
            let (_, baseline_sd) = mean_std(&pairs.iter().map(|&(_, b)| b).collect::<Vec<_>>());
            Some(Gain {
                trace: trace.into(),
                seeds: pairs.len(),
                mean,
                paired_se: sd / n,
                baseline_se: baseline_sd / n,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(trace: &str, policy: &str, seed: u64, at_130: f64) -> Outcome {
        let mut allocation = vec![None; MAX_COLUMN + 1];
        allocation[100] = Some(at_130 - 10.0);
        allocation[130] = Some(at_130);
        Outcome {
            trace: trace.into(),
            policy: policy.into(),
            seed,
            submitted: 1,
            placed: 1,
            faulted: 0,
            total_gpus: 1,
            allocation,
            fragmentation: vec![],
            fragmentation_ratio: vec![],
            replay_time: Duration::ZERO,
        }
    }

    #[test]
    fn table_averages_seeds_and_finds_the_best_policy() {
        let o = vec![
            outcome("a", "fgd", 1, 90.0),
            outcome("a", "fgd", 2, 92.0),
            outcome("a", "best-fit", 1, 85.0),
            outcome("a", "best-fit", 2, 91.0),
            outcome("b", "fgd", 1, 80.0),
            outcome("b", "best-fit", 1, 80.0),
        ];
        let rows = table(&o);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0].at_130, (91.0, 2f64.sqrt()));
        assert_eq!(rows[0].at_100.0, 81.0);
        assert_eq!(rows[1].at_130.0, 88.0);
        assert_eq!(rows[2].at_130, (80.0, 0.0));
        assert_eq!(not_best_at_130(&rows, "fgd"), vec!["b"], "a tie is not a win");
        assert_eq!(mean_curve(&o, "a", "fgd", |o| &o.allocation)[130], Some(91.0));
    }

    #[test]
    fn gains_pair_the_seeds() {
        let o = vec![
            outcome("a", "fgd", 1, 90.0),
            outcome("a", "fgd", 2, 92.0),
            outcome("a", "new", 2, 93.0),
            outcome("a", "new", 1, 90.5),
            outcome("b", "fgd", 1, 80.0),
            outcome("b", "new", 1, 99.0),
        ];
        let gains = gains_at_130(&o, "new", "fgd");
        assert_eq!(gains.len(), 1, "b has one seed: no standard error, no claim");
        let g = &gains[0];
        // Differences 0.5 and 1.0: mean 0.75, sd √0.125, se 0.25; fgd's sd √2, se 1.
        assert_eq!((g.trace.as_str(), g.seeds, g.mean), ("a", 2, 0.75));
        assert!((g.paired_se - 0.25).abs() < 1e-12 && (g.baseline_se - 1.0).abs() < 1e-12, "{g:?}");
        assert!(!g.significant(), "0.75 is within fgd's own standard error");
        assert!(Gain { baseline_se: 0.5, ..g.clone() }.significant());
        assert!(!Gain { mean: -2.0, paired_se: 0.0, baseline_se: 0.0, ..g.clone() }.significant());
    }
}
