//! `wasmsched replay --compare`: the same input replayed with two policy sets, side by side — what
//! a platform team reads before it rolls a candidate out (`docs/hot-reload.md`): the placements
//! that differ, the work one set places and the other not (and why not), queueing delay,
//! allocation, fragmentation, fairness, evictions and GPU-hours lost. With `--serve`, the
//! dashboard's Compare tab shows the two replays as they go and the comparison when both are over.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use wasmsched_api::fragmentation::{self, TypicalPod};
use wasmsched_core::Decision;
use wasmsched_dashboard::View;
use wasmsched_dashboard::view::{ComparisonSide, ComparisonView, SeriesPoint};
use wasmsched_sim::timed::{self, Job, TimedRun};

use crate::replay_cmd::Inputs;
use crate::replay_policies::{Initial, ReplayPolicies};

/// A task's first placement: virtual second, node, GPUs (index:milli).
#[derive(Clone, Debug, PartialEq, Serialize)]
struct Placed {
    at: u64,
    node: String,
    gpus: Vec<(u32, u32)>,
}

/// One replay of the comparison.
struct Side {
    name: String,
    run: TimedRun,
    /// Each task's first placement.
    placed: BTreeMap<String, Placed>,
    /// Time-weighted mean of the GPUs no typical job could use (FGD's fragmentation), in GPUs.
    fragmented_gpus: f64,
}

/// Replay `inputs` with each of `sets`, both at once, and print the comparison; with `serve`,
/// the dashboard's Compare tab shows both replays as they go, then the comparison, until Ctrl-C.
pub fn run(
    inputs: &Inputs,
    runtime: Option<Arc<wasmsched_runtime::Runtime>>,
    sets: [Initial; 2],
    settings: timed::ReplaySettings,
    json: bool,
    serve: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let preparer = runtime.map(|rt| wasmsched_registry::Preparer::new(rt, crate::policy::builtins()));
    let sample = wasmsched_registry::Sample {
        nodes: Arc::new(inputs.table.snapshot()),
        tasks: inputs.jobs.iter().take(16).filter_map(|j| j.workload().members.into_iter().next()).collect(),
    };
    let typical = timed::target_workload(&inputs.jobs);
    // Both sets pass their gates before either replay starts.
    let mut prepared = Vec::new();
    for set in sets {
        prepared.push(ReplayPolicies::prepare(set, &[], preparer.as_ref(), &sample)?);
    }
    drop(sample);
    let progress: [Mutex<ComparisonSide>; 2] = [0, 1].map(|i| {
        Mutex::new(ComparisonSide { set: prepared[i].live[0].reference.name.clone(), ..ComparisonSide::default() })
    });
    let source = format!(
        "compare: {} vs {}, {} jobs on {} nodes",
        progress[0].lock().unwrap_or_else(PoisonError::into_inner).set,
        progress[1].lock().unwrap_or_else(PoisonError::into_inner).set,
        inputs.jobs.len(),
        inputs.table.len()
    );
    let view = |result: Option<&Comparison>| -> anyhow::Result<View> {
        let sides = [0, 1].map(|i| progress[i].lock().unwrap_or_else(PoisonError::into_inner).thinned());
        let result = result.map(serde_json::to_value).transpose()?;
        let comparison = ComparisonView { jobs: inputs.jobs.len(), sides, result };
        Ok(View { source: source.clone(), comparison: Some(Arc::new(comparison)), ..View::default() })
    };
    let board = serve.map(|addr| crate::dashboard::Board::start(addr, view(None)?)).transpose()?;
    // Two threads: each replay is independent of the other and deterministic on its own.
    let sides = std::thread::scope(|scope| -> anyhow::Result<Vec<Side>> {
        let replays: Vec<_> = prepared
            .iter()
            .zip(&progress)
            .map(|(policies, progress)| {
                let settings = settings.clone();
                let typical = &typical;
                scope.spawn(move || replay(inputs, policies, settings, typical, progress))
            })
            .collect();
        if let Some(board) = &board {
            while !replays.iter().all(|r| r.is_finished()) {
                board.publisher.publish(view(None)?);
                std::thread::sleep(PUBLISH_EVERY);
            }
        }
        replays.into_iter().map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })?;
    let [a, b]: [Side; 2] = sides.try_into().map_err(|_| anyhow::anyhow!("two replays"))?;
    let comparison = compare(&inputs.jobs, &a, &b);
    if json {
        println!("{}", serde_json::to_string_pretty(&comparison)?);
    } else {
        print!("{}", comparison.text());
    }
    match board {
        Some(board) => {
            board
                .publisher
                .publish(View { source: format!("{source}; both replays finished"), ..view(Some(&comparison))? });
            board.serve_until_interrupted()
        }
        None => Ok(()),
    }
}

/// How often the dashboard gets a new view while the replays run (wall time).
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// One replay of the comparison, its curves and counts kept in `progress` as it goes.
fn replay(
    inputs: &Inputs,
    policies: &ReplayPolicies,
    settings: timed::ReplaySettings,
    typical: &[TypicalPod],
    progress: &Mutex<ComparisonSide>,
) -> anyhow::Result<Side> {
    let mut placed: BTreeMap<String, Placed> = BTreeMap::new();
    // (virtual second, fragmented GPUs) after each instant that changed the cluster.
    let mut fragmented: Vec<(u64, f64)> = Vec::new();
    let mut changed = false;
    let timeline = policies.timeline();
    let lock = || progress.lock().unwrap_or_else(PoisonError::into_inner);
    let run = timed::run_with_devices(
        &timeline,
        &inputs.table,
        inputs.dra.as_ref(),
        &inputs.tree,
        &inputs.jobs,
        settings,
        |o| match o {
            timed::Observed::Arrived(..) => lock().arrived += 1,
            timed::Observed::Released(_) => changed = true,
            timed::Observed::Decision(d) => {
                changed = true;
                if let Decision::Bound { task, node, devices, .. } = d.decision
                    && !placed.contains_key(task)
                {
                    let gpus = devices.iter().map(|g| (g.gpu, g.milli)).collect();
                    placed.insert(task.clone(), Placed { at: d.at, node: node.clone(), gpus });
                    lock().placed += 1;
                }
            }
            // Sampled once per instant that changed the cluster, as the instant left it.
            timed::Observed::Settled { at, nodes, allocated_milli, capacity_milli } if std::mem::take(&mut changed) => {
                let f = fragmentation::of_cluster(typical, nodes.slots().filter_map(|s| nodes.get(s)));
                // An instant can settle more than once (retries in the same second): the last counts.
                if fragmented.last().is_some_and(|(t, _)| *t == at) {
                    fragmented.pop();
                }
                fragmented.push((at, f.fragmented / 1000.0));
                let percent =
                    |milli: f64| if capacity_milli == 0 { 0.0 } else { 100.0 * milli / capacity_milli as f64 };
                let mut side = lock();
                side.at_seconds = at;
                let point = SeriesPoint {
                    at: at as f64,
                    allocation_percent: percent(allocated_milli as f64),
                    fragmentation_percent: (!typical.is_empty()).then(|| percent(f.fragmented)),
                };
                match side.series.last_mut() {
                    Some(last) if last.at == point.at => *last = point,
                    _ => side.series.push(point),
                }
            }
            _ => {}
        },
    )?;
    let first = fragmented.first().map_or(0, |s| s.0);
    let fragmented_gpus = timed::time_weighted_mean(&fragmented, (first, run.horizon));
    let mut side = lock();
    side.at_seconds = run.horizon;
    side.finished = true;
    drop(side);
    Ok(Side { name: policies.live[0].reference.name.clone(), run, placed, fragmented_gpus })
}

/// One figure of each side.
#[derive(Serialize)]
struct Figure {
    name: &'static str,
    a: Option<f64>,
    b: Option<f64>,
}

/// A job one side started and the other did not.
#[derive(Serialize)]
struct OnlyOne {
    job: String,
    queue: String,
    /// Why the other side never started it (its last explanation).
    other_reason: String,
}

/// A task both placed, differently.
#[derive(Serialize)]
struct Differs {
    task: String,
    a: Placed,
    b: Placed,
}

#[derive(Serialize)]
struct Comparison {
    a: String,
    b: String,
    jobs: usize,
    figures: Vec<Figure>,
    /// Per queue: mean queueing delay (s) of each side.
    queue_delay_mean: BTreeMap<String, [f64; 2]>,
    /// Tasks both placed: how many on the same node with the same GPUs at the same time, and how
    /// many otherwise — on another node, on other GPUs of the same node, or only at another time.
    placements_same: usize,
    placements_differ: usize,
    placements_other_node: usize,
    placements_other_gpus: usize,
    placements_other_time: usize,
    /// The first differing placements, by task.
    differing: Vec<Differs>,
    started_only_by_a: Vec<OnlyOne>,
    started_only_by_b: Vec<OnlyOne>,
}

/// At most this many examples of each kind.
const EXAMPLES: usize = 20;

fn compare(jobs: &[Job], a: &Side, b: &Side) -> Comparison {
    let gpu_hours =
        |s: &Side, f: fn(&timed::QueueUsage) -> u64| s.run.usage.values().map(f).sum::<u64>() as f64 / 3.6e6;
    // Every started job's queueing delay, sorted: the queues' own figures, over all queues.
    let all_delays = |s: &Side| {
        let mut d: Vec<u64> = s.run.jobs.iter().filter_map(|o| o.start.map(|st| st - o.arrival)).collect();
        d.sort_unstable();
        d
    };
    let mean = |v: &[u64]| (!v.is_empty()).then(|| timed::mean(v));
    let p99 = |v: &[u64]| (!v.is_empty()).then(|| timed::percentile(v, 99.0) as f64);
    let (da, db) = (all_delays(a), all_delays(b));
    let started = |s: &Side| s.run.jobs.iter().filter(|o| o.start.is_some()).count() as f64;
    let figures = vec![
        Figure { name: "jobs started", a: Some(started(a)), b: Some(started(b)) },
        Figure { name: "queueing delay mean (s)", a: mean(&da), b: mean(&db) },
        Figure { name: "queueing delay p99 (s)", a: p99(&da), b: p99(&db) },
        Figure {
            name: "GPU allocation while work waited (%)",
            a: a.run.utilisation_mean_while_waiting,
            b: b.run.utilisation_mean_while_waiting,
        },
        Figure { name: "GPU allocation mean (%)", a: Some(a.run.utilisation_mean), b: Some(b.run.utilisation_mean) },
        Figure { name: "fragmented GPUs, mean", a: Some(a.fragmented_gpus), b: Some(b.fragmented_gpus) },
        Figure {
            name: "Jain's fairness while queues waited",
            a: a.run.jain_fairness_while_backlogged,
            b: b.run.jain_fairness_while_backlogged,
        },
        Figure { name: "pods evicted", a: Some(a.run.evictions as f64), b: Some(b.run.evictions as f64) },
        Figure {
            name: "GPU-hours lost to evictions",
            a: Some(gpu_hours(a, |u| u.lost_gpu_milli_seconds)),
            b: Some(gpu_hours(b, |u| u.lost_gpu_milli_seconds)),
        },
        Figure { name: "gang timeouts", a: Some(a.run.timed_out as f64), b: Some(b.run.timed_out as f64) },
        Figure { name: "horizon (s)", a: Some(a.run.horizon as f64), b: Some(b.run.horizon as f64) },
    ];
    let mut queue_delay_mean = BTreeMap::new();
    for (q, sa) in &a.run.queues {
        let sb = b.run.queues.get(q).map_or(0.0, |s| s.delay_mean);
        queue_delay_mean.insert(q.clone(), [sa.delay_mean, sb]);
    }
    let (mut same, mut differ, mut differing) = (0, 0, Vec::new());
    let (mut other_node, mut other_gpus, mut other_time) = (0, 0, 0);
    for (task, pa) in &a.placed {
        let Some(pb) = b.placed.get(task) else { continue };
        if pa == pb {
            same += 1;
        } else {
            differ += 1;
            if pa.node != pb.node {
                other_node += 1;
            } else if pa.gpus != pb.gpus {
                other_gpus += 1;
            } else {
                other_time += 1;
            }
            if differing.len() < EXAMPLES {
                differing.push(Differs { task: task.clone(), a: pa.clone(), b: pb.clone() });
            }
        }
    }
    let only = |x: &Side, y: &Side| -> Vec<OnlyOne> {
        jobs.iter()
            .zip(x.run.jobs.iter().zip(&y.run.jobs))
            .filter(|(_, (ox, oy))| ox.start.is_some() && oy.start.is_none())
            .map(|(j, (_, oy))| OnlyOne {
                job: j.name.clone(),
                queue: j.queue.clone(),
                other_reason: oy.waiting_reason.clone().unwrap_or_default(),
            })
            .collect()
    };
    Comparison {
        a: a.name.clone(),
        b: b.name.clone(),
        jobs: jobs.len(),
        figures,
        queue_delay_mean,
        placements_same: same,
        placements_differ: differ,
        placements_other_node: other_node,
        placements_other_gpus: other_gpus,
        placements_other_time: other_time,
        differing,
        started_only_by_a: only(a, b),
        started_only_by_b: only(b, a),
    }
}

impl Comparison {
    fn text(&self) -> String {
        let mut out = format!("wasmsched replay --compare: {} jobs, A = {}, B = {}\n\n", self.jobs, self.a, self.b);
        let show = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"));
        out += &format!("{:<40} {:>14} {:>14} {:>14}\n", "", "A", "B", "B − A");
        for f in &self.figures {
            let delta = f.a.zip(f.b).map(|(a, b)| b - a);
            out += &format!("{:<40} {:>14} {:>14} {:>14}\n", f.name, show(f.a), show(f.b), show(delta));
        }
        out += "\nqueueing delay mean by queue (s)\n";
        for (q, [a, b]) in &self.queue_delay_mean {
            out += &format!("  {q:<38} {a:>14.1} {b:>14.1} {:>14.1}\n", b - a);
        }
        let both = self.placements_same + self.placements_differ;
        out += &format!(
            "\nplacements: {} of {both} tasks both placed differ under B: {} on another node, {} on other GPUs of \
             the same node, {} only at another time\n",
            self.placements_differ, self.placements_other_node, self.placements_other_gpus, self.placements_other_time
        );
        for d in &self.differing {
            out += &format!(
                "  {}: A {} at {} s {:?}; B {} at {} s {:?}\n",
                d.task, d.a.node, d.a.at, d.a.gpus, d.b.node, d.b.at, d.b.gpus
            );
        }
        for (label, list) in [("A", &self.started_only_by_a), ("B", &self.started_only_by_b)] {
            if list.is_empty() {
                continue;
            }
            let other = if label == "A" { "B" } else { "A" };
            out += &format!("\nstarted under {label} only: {} jobs (why not under {other}):\n", list.len());
            for o in list.iter().take(EXAMPLES) {
                out += &format!("  {} ({}): {}\n", o.job, o.queue, o.other_reason);
            }
        }
        out
    }
}
