//! `wasmsched bench --queues N`: the whole cycle ([`SchedulerCore`]) under churn on a deep queue
//! tree — borrowing, reclaim and priority preemption — measuring decisions per second of cycle time
//! and how far queue allocations are from the deserved shares the fair-share plugin computes.

use std::time::{Duration, Instant};

use serde::Serialize;
use wasmsched_api::{GPU_MILLI, GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_core::{
    CoreConfig, Decision, Flavor, Phase, PolicySet, QueueSpec, QueueTree, SchedulerCore, Workload, add_flavored,
};
use wasmsched_sim::generate::Rng;

/// One runtime's result.
#[derive(Clone, Debug, Serialize)]
pub struct QueueRun {
    pub runtime: &'static str,
    pub queues: usize,
    pub nodes: usize,
    pub rounds: usize,
    /// Leaves had borrowing and lending limits.
    pub limits: bool,
    /// Resource flavors the nodes were split into (0: none).
    pub flavors: usize,
    pub submitted: usize,
    pub bound: usize,
    pub evicted: usize,
    pub unschedulable: usize,
    /// Decisions (binds, evictions, checkpoint requests, unschedulable verdicts) per second of
    /// time spent inside `schedule`.
    pub decisions_per_second: f64,
    /// Mean and slowest cycle.
    pub mean_cycle_ms: f64,
    pub max_cycle_ms: f64,
    /// Σ over leaf queues of |allocated − deserved| GPUs, as a fraction of the cluster's GPUs,
    /// after each round (warm-up rounds excluded): mean and worst.
    pub share_error_mean: f64,
    pub share_error_max: f64,
}

/// The queue-churn scenario.
#[derive(Clone, Copy, Debug)]
pub struct Churn {
    /// Queues in the tree.
    pub queues: usize,
    /// Borrowing and lending limits on the leaves.
    pub limits: bool,
    /// Resource flavors the nodes are split into (0: none).
    pub flavors: usize,
    /// Nodes, 8 GPUs each.
    pub nodes: usize,
    /// Cycles, one virtual second apart.
    pub rounds: usize,
    /// Random seed.
    pub seed: u64,
}

/// Ten parents, the rest leaves spread over them; weights 1–4; every tenth leaf guaranteed 8 GPUs.
/// With `limits`, a guaranteed leaf lends at most half its guarantee and every leaf borrows at
/// most 32 GPUs above its guarantee. With `flavors`, node `i` is of flavor `i % flavors`, a
/// guaranteed leaf's 8 GPUs are on one flavor (its borrowing limit there too), and each leaf tries
/// the flavors starting from its own.
fn tree(queues: usize, limits: bool, flavors: usize, rng: &mut Rng) -> QueueTree {
    let parents = 10.min(queues.max(1));
    let mut specs: Vec<QueueSpec> = (0..parents)
        .map(|p| QueueSpec { name: format!("org{p}"), weight: 1 + rng.below(3) as u32, ..Default::default() })
        .collect();
    for i in 0..queues.saturating_sub(parents) {
        let mut spec = QueueSpec {
            name: format!("team{i:04}"),
            parent: Some(format!("org{}", i % parents)),
            weight: 1 + rng.below(4) as u32,
            guarantee: Resources { gpu_milli: if i % 10 == 0 { 8 * 1000 } else { 0 }, ..Default::default() },
            borrowing_limit: limits.then(|| Resources { gpu_milli: 32 * 1000, ..unbounded() }),
            lending_limit: (limits && i % 10 == 0).then(|| Resources { gpu_milli: 4 * 1000, ..unbounded() }),
            reclaimable: true,
            ..Default::default()
        };
        if flavors > 0 {
            let own = flavor_name(i % flavors);
            spec.flavors = (0..flavors).map(|k| flavor_name((i + k) % flavors)).collect();
            if i % 10 == 0 {
                add_flavored(&mut spec.guarantee, &own, &Resources { gpu_milli: 8 * 1000, ..Default::default() });
            }
            if let Some(b) = spec.borrowing_limit.as_mut() {
                add_flavored(b, &own, &Resources { gpu_milli: 32 * 1000, ..unbounded() });
            }
        }
        specs.push(spec);
    }
    let flavors = (0..flavors)
        .map(|k| Flavor {
            name: flavor_name(k),
            node_labels: vec![("gpu-model".into(), flavor_name(k))],
            tolerations: Vec::new(),
        })
        .collect();
    QueueTree::with_flavors(flavors, specs).expect("the generated tree is valid")
}

fn flavor_name(k: usize) -> String {
    format!("model{k}")
}

/// A limit on GPUs only.
fn unbounded() -> Resources {
    Resources {
        cpu_milli: u64::MAX / 4,
        memory_bytes: u64::MAX / 4,
        gpu_milli: u64::MAX / 4,
        extended: Default::default(),
    }
}

/// Run the churn once with `set`.
pub fn run(set: &PolicySet, runtime: &'static str, churn: Churn) -> QueueRun {
    let Churn { queues, limits, flavors, nodes, rounds, seed } = churn;
    let mut rng = Rng::new(seed);
    let tree = tree(queues, limits, flavors, &mut rng);
    let leaves: Vec<String> =
        (0..tree.len()).filter(|&q| tree.is_leaf(q)).filter_map(|q| tree.get(q).map(|s| s.name.clone())).collect();
    // kube-scheduler's adaptive percentage of nodes to score.
    let config = CoreConfig { percentage_of_nodes_to_score: Some(0), ..CoreConfig::default() };
    let mut core = SchedulerCore::new(tree, config);
    for i in 0..nodes {
        core.upsert_node(
            Node {
                name: format!("node{i:05}"),
                allocatable: Resources {
                    cpu_milli: 128_000,
                    memory_bytes: 1 << 40,
                    gpu_milli: 8 * u64::from(GPU_MILLI),
                    extended: Default::default(),
                },
                gpus: (0..8).map(|g| GpuDevice { index: g, free_milli: GPU_MILLI, ..Default::default() }).collect(),
                labels: if flavors > 0 { vec![("gpu-model".into(), flavor_name(i % flavors))] } else { Vec::new() },
                ..Default::default()
            },
            0,
        );
    }
    let cluster_gpus = (nodes * 8 * GPU_MILLI as usize) as f64;
    // Enough arrivals to keep the cluster oversubscribed (mean 3 GPUs for ~30 rounds each).
    let per_round = (nodes * 8 / 60).max(5);
    let mut ends: Vec<(u64, String)> = Vec::new();
    let (mut submitted, mut bound, mut evicted, mut unschedulable, mut decisions) = (0, 0, 0, 0, 0usize);
    let mut cycle_time = Duration::ZERO;
    let mut slowest = Duration::ZERO;
    let mut errors: Vec<f64> = Vec::new();
    for t in 0..rounds as u64 {
        for _ in 0..per_round {
            // Skewed: low-numbered teams are busier, so some borrow and others reclaim.
            let q = (rng.below(leaves.len() as u64) * rng.below(leaves.len() as u64) / leaves.len() as u64) as usize;
            let gpus = [1, 2, 4, 8][rng.below(4) as usize];
            let name = format!("job{submitted}");
            let task = Task {
                id: name.clone(),
                request: Resources { cpu_milli: 4000, memory_bytes: 16 << 30, ..Default::default() },
                gpu: GpuRequest { count: gpus, milli_per_gpu: GPU_MILLI, ..Default::default() },
                ..Default::default()
            };
            let mut w = Workload::single(task);
            w.queue = leaves[q].clone();
            w.priority = rng.below(3) as i32;
            if core.submit(w, t).is_ok() {
                submitted += 1;
                ends.push((t + 10 + rng.below(40), name));
            }
        }
        ends.retain(|(end, name)| {
            let running = core.status(name).is_some_and(|s| s.phase == Phase::Running);
            if *end <= t && running {
                let _ = core.finish(name);
                return false;
            }
            true
        });
        let started = Instant::now();
        let out = core.schedule(set, t);
        let took = started.elapsed();
        cycle_time += took;
        slowest = slowest.max(took);
        for d in &out {
            match d {
                Decision::Bound { .. } => bound += 1,
                Decision::Evicted { .. } => evicted += 1,
                Decision::Unschedulable { .. } => unschedulable += 1,
                _ => {}
            }
            if !matches!(d, Decision::Fault(_) | Decision::TimedOut { .. }) {
                decisions += 1;
            }
        }
        if t >= (rounds as u64 / 5).max(1) {
            let shares = core.queue_shares();
            let error: u64 = shares
                .iter()
                .enumerate()
                .filter(|(q, _)| core.queues().is_leaf(*q))
                .filter_map(|(_, s)| s.deserved.as_ref().map(|d| s.allocated.gpu_milli.abs_diff(d.gpu_milli)))
                .sum();
            errors.push(error as f64 / cluster_gpus);
        }
    }
    let secs = cycle_time.as_secs_f64().max(1e-9);
    QueueRun {
        runtime,
        queues: core.queues().len(),
        nodes,
        rounds,
        limits,
        flavors,
        submitted,
        bound,
        evicted,
        unschedulable,
        decisions_per_second: decisions as f64 / secs,
        mean_cycle_ms: secs * 1000.0 / rounds.max(1) as f64,
        max_cycle_ms: slowest.as_secs_f64() * 1000.0,
        share_error_mean: errors.iter().sum::<f64>() / errors.len().max(1) as f64,
        share_error_max: errors.iter().copied().fold(0.0, f64::max),
    }
}
