//! `wasmsched replay --compare`: the same input replayed with two policy sets, side by side — what
//! a platform team reads before it rolls a candidate out (`docs/hot-reload.md`): the placements
//! that differ, the work one set places and the other not (and why not), queueing delay,
//! allocation, fragmentation, fairness, evictions and GPU-hours lost.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use wasmsched_api::fragmentation::{self, TypicalPod};
use wasmsched_core::Decision;
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

/// Replay `inputs` with each of `sets` and print the comparison.
pub fn run(
    inputs: &Inputs,
    runtime: Option<Arc<wasmsched_runtime::Runtime>>,
    sets: [Initial; 2],
    settings: timed::ReplaySettings,
    json: bool,
) -> anyhow::Result<()> {
    let preparer = runtime.map(|rt| wasmsched_registry::Preparer::new(rt, crate::policy::builtins()));
    let sample = wasmsched_registry::Sample {
        nodes: Arc::new(inputs.table.snapshot()),
        tasks: inputs.jobs.iter().take(16).filter_map(|j| j.workload().members.into_iter().next()).collect(),
    };
    let typical = timed::target_workload(&inputs.jobs);
    let mut sides = Vec::new();
    for set in sets {
        let policies = ReplayPolicies::prepare(set, &[], preparer.as_ref(), &sample)?;
        sides.push(replay(inputs, &policies, settings.clone(), &typical)?);
    }
    let [a, b]: [Side; 2] = sides.try_into().map_err(|_| anyhow::anyhow!("two replays"))?;
    let comparison = compare(&inputs.jobs, &a, &b);
    if json {
        println!("{}", serde_json::to_string_pretty(&comparison)?);
    } else {
        print!("{}", comparison.text());
    }
    Ok(())
}

fn replay(
    inputs: &Inputs,
    policies: &ReplayPolicies,
    settings: timed::ReplaySettings,
    typical: &[TypicalPod],
) -> anyhow::Result<Side> {
    let mut placed: BTreeMap<String, Placed> = BTreeMap::new();
    // (virtual second, fragmented GPUs) after each instant with a decision.
    let mut fragmented: Vec<(u64, f64)> = Vec::new();
    let timeline = policies.timeline();
    let run = timed::run_with_devices(
        &timeline,
        &inputs.table,
        inputs.dra.as_ref(),
        &inputs.tree,
        &inputs.jobs,
        settings,
        |o| {
            let timed::Observed::Decision(d) = o else { return };
            // Sampled once per instant, at its first decision.
            if fragmented.last().is_none_or(|(t, _)| *t != d.at) {
                let f = fragmentation::of_cluster(typical, d.nodes.slots().filter_map(|s| d.nodes.get(s)));
                fragmented.push((d.at, f.fragmented / 1000.0));
            }
            if let Decision::Bound { task, node, devices, .. } = d.decision {
                placed.entry(task.clone()).or_insert_with(|| Placed {
                    at: d.at,
                    node: node.clone(),
                    gpus: devices.iter().map(|g| (g.gpu, g.milli)).collect(),
                });
            }
        },
    )?;
    let first = fragmented.first().map_or(0, |s| s.0);
    let fragmented_gpus = timed::time_weighted_mean(&fragmented, (first, run.horizon));
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
