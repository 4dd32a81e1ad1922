//! `gpu-share-score`: the six node scorers compared by the FGD paper ("Beware of Fragmentation:
//! Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23), each with
//! its GPU choice inside the node, as specified in `docs/openb-protocol.md` §3.5 and §4.
//!
//! One component, the policy chosen by configuration (JSON):
//!
//! | `policy`         | node score                                              | GPU for a sharing pod |
//! |------------------|---------------------------------------------------------|-----------------------|
//! | `random`         | one feasible node drawn uniformly (seeded by `seed`)    | reservoir-sampled     |
//! | `dot-prod`       | smallest dot product of free and requested (CPU, GPU)   | tightest fit          |
//! | `gpu-clustering` | nodes already holding pods of the same GPU shape        | tightest fit          |
//! | `gpu-packing`    | partly used GPUs first, then used nodes, then idle ones | tightest fit          |
//! | `best-fit`       | least CPU and GPU left after placement                  | tightest fit          |
//! | `fgd`            | least growth of the target workload's fragmentation     | the FGD-best GPU      |
//!
//! Whole-GPU pods always take the lowest-index fully free GPUs. `fgd` needs `typical`, the target
//! workload ([`TypicalPod`]s, e.g. from [`typical_pods`] over a trace). Its `usable` option picks
//! the fragmentation measure ([`Usable`]): the paper's (`any-fit`, the default) or `cpu-bounded`,
//! which counts only the GPUs the node's CPU can still feed — the built-in `fgd-cpu`, which
//! allocates more GPUs than FGD on 13 of the 17 openb workloads (`docs/openb/fgd-cpu.md`). `gpu-clustering` reads the
//! node label [`AFFINITY_LABEL`], which whoever binds pods keeps with [`record_affinity`] (the
//! simulator does). Scores use CPU and GPU only; memory is the filter's business.

mod fgd;
mod usable;

use serde::Deserialize;
use wasmsched_sdk::prelude::*;

// The measure and the shape label are shared with the simulator, so they live in the API crate.
pub use usable::Usable;
pub use wasmsched_sdk::fragmentation::{self, Fragmentation, Spec, TypicalPod, measure, typical_pods};
pub use wasmsched_sdk::gpu_affinity::{AFFINITY_LABEL, affinity, affinity_recorded, record_affinity};

/// The normalisation constants of the paper's scorers: the largest node's CPU and GPU share.
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;

/// Which scorer.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// A uniformly random feasible node.
    Random,
    /// Dot product of the node's free (CPU, GPU) and the pod's request, smallest first.
    DotProd,
    /// Co-locate pods of the same GPU shape.
    GpuClustering,
    /// Pack GPU share: partly used GPUs, then used nodes, then idle nodes.
    GpuPacking,
    /// Least resources left after placement.
    BestFit,
    /// Fragmentation Gradient Descent.
    Fgd,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    policy: Option<Policy>,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    typical: Vec<TypicalPod>,
    usable: Option<Usable>,
}

/// The GPU-sharing-aware scorer.
pub struct GpuShareScore {
    policy: Policy,
    rng: SplitMix64,
    fgd: Option<fgd::Fgd>,
}

impl Plugin for GpuShareScore {
    const NAME: &'static str = "gpu-share-score";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        let policy = config.policy.ok_or(
            "invalid gpu-share-score configuration: `policy` is required (random, dot-prod, gpu-clustering, gpu-packing, best-fit or fgd)",
        )?;
        if policy != Policy::Fgd && (!config.typical.is_empty() || config.usable.is_some()) {
            return Err("invalid gpu-share-score configuration: `typical` and `usable` are only for fgd".into());
        }
        let fgd = match policy {
            Policy::Fgd => Some(
                fgd::Fgd::new(config.typical, config.usable.unwrap_or_default())
                    .map_err(|e| format!("invalid gpu-share-score configuration: {e}"))?,
            ),
            _ => None,
        };
        Ok(GpuShareScore { policy, rng: SplitMix64(config.seed), fgd })
    }
}

impl GpuShareScore {
    /// The configured policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }
}

/// The node quantities the scorers read.
mod view {
    use wasmsched_sdk::prelude::*;

    pub fn cpu_left(node: &Node) -> u64 {
        node.allocatable.cpu_milli.saturating_sub(node.allocated.cpu_milli)
    }

    /// Free share per GPU, in index order; an unhealthy GPU has none.
    pub fn lefts(node: &Node) -> impl Iterator<Item = u32> + '_ {
        node.gpus.iter().map(|g| if g.health == GpuHealth::Unhealthy { 0 } else { g.free_milli.min(GPU_MILLI) })
    }

    /// The node's GPU model (nodes carry one model).
    pub fn model(node: &Node) -> &str {
        node.gpus.first().map_or("", |g| g.model.as_str())
    }
}

fn dot_prod(task: &Task, node: &Node) -> u32 {
    let free_gpu: u64 = view::lefts(node).map(u64::from).sum();
    let node_v = [view::cpu_left(node) as f64 / MAX_SPEC_CPU, free_gpu as f64 / MAX_SPEC_GPU];
    let pod_v = [task.request.cpu_milli as f64 / MAX_SPEC_CPU, task.gpu.total_milli() as f64 / MAX_SPEC_GPU];
    let dot = 0.0 + node_v[0] * pod_v[0] + node_v[1] * pod_v[1];
    (100.0 * (1.0 - dot / 2.0)).clamp(0.0, 100.0) as u32
}

fn gpu_clustering(task: &Task, node: &Node) -> u32 {
    let Some(aff) = affinity(task) else { return 0 };
    let free_gpu: i64 = view::lefts(node).map(i64::from).sum();
    let base = (25 * (8000 - free_gpu)).div_euclid(8000).max(0) as u32;
    let held: Vec<&str> = node
        .labels
        .iter()
        .find(|(k, _)| k == AFFINITY_LABEL)
        .map(|(_, v)| v.split(',').filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let bonus = if held.contains(&aff.as_str()) {
        if held.len() == 1 { 75 } else { 50 }
    } else if held.is_empty() {
        25
    } else {
        0
    };
    (base + bonus).min(MAX_SCORE)
}

fn gpu_packing(task: &Task, node: &Node) -> u32 {
    let m = task.gpu.milli_per_gpu;
    if m == 0 || task.gpu.count == 0 {
        return 0;
    }
    let lefts: Vec<u32> = view::lefts(node).collect();
    let free = lefts.iter().filter(|&&l| l == GPU_MILLI).count() as i64;
    if free == lefts.len() as i64 {
        // A completely idle node: the last resort, fuller nodes of GPUs first.
        return (33 - free).max(free).clamp(0, 100) as u32;
    }
    let mut order: Vec<usize> = (0..lefts.len()).collect();
    order.sort_by_key(|&g| lefts[g]);
    let taken: Vec<u32> = order.iter().map(|&g| lefts[g]).filter(|&l| l >= m).take(task.gpu.count as usize).collect();
    let whole = taken.iter().filter(|&&l| l == GPU_MILLI).count() as i64;
    if whole > 0 {
        return (50 - whole).max(33) as u32;
    }
    let r: u32 = taken.iter().map(|&l| l * 100 / GPU_MILLI).sum();
    100u32.saturating_sub(r / 10).max(50)
}

fn best_fit(task: &Task, node: &Node) -> u32 {
    let free_gpu: i64 = view::lefts(node).map(i64::from).sum();
    let cpu_after = view::cpu_left(node) as i64 - task.request.cpu_milli as i64;
    let gpu_after = free_gpu - task.gpu.total_milli() as i64;
    let mut s = 0.0;
    s += cpu_after as f64 / MAX_SPEC_CPU * 0.5;
    s += gpu_after as f64 / MAX_SPEC_GPU * 0.5;
    ((1.0 - s) * 100.0).clamp(0.0, 100.0) as u32
}

impl Score for GpuShareScore {
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        match self.policy {
            Policy::Random => 0,
            Policy::DotProd => dot_prod(task, node),
            Policy::GpuClustering => gpu_clustering(task, node),
            Policy::GpuPacking => gpu_packing(task, node),
            Policy::BestFit => best_fit(task, node),
            Policy::Fgd => self.fgd.as_mut().map_or(0, |f| f.evaluate(task, node).0),
        }
    }

    fn normalize(&mut self, _task: &Task, scores: &mut [u32]) {
        match self.policy {
            // One draw per decision, and none when there is nothing to choose between.
            Policy::Random if scores.len() > 1 => {
                let pick = self.rng.below(scores.len() as u64) as usize;
                scores[pick] = MAX_SCORE;
            }
            // Min-max to 0..=100; keeps order and ties, so it never changes the winner.
            Policy::BestFit => {
                let (lo, hi) = scores.iter().fold((u32::MAX, 0), |(lo, hi), &s| (lo.min(s), hi.max(s)));
                for s in scores.iter_mut() {
                    *s = if hi > lo { (*s - lo) * MAX_SCORE / (hi - lo) } else { 0 };
                }
            }
            _ => {}
        }
    }
}

impl SelectDevices for GpuShareScore {
    fn select_devices(&mut self, task: &Task, node: &Node) -> Result<Vec<DeviceShare>, Rejection> {
        let req = &task.gpu;
        if req.count == 0 || req.milli_per_gpu == 0 {
            return Ok(Vec::new());
        }
        let fits = |g: &&GpuDevice| req.fits_device(g);
        let chosen: Vec<u32> = if req.milli_per_gpu >= GPU_MILLI {
            node.gpus.iter().filter(fits).take(req.count as usize).map(|g| g.index).collect()
        } else {
            let pick = match self.policy {
                Policy::Random => {
                    let mut seen = 0;
                    let mut pick = None;
                    for g in node.gpus.iter().filter(fits) {
                        seen += 1;
                        if self.rng.below(seen) == 0 {
                            pick = Some(g.index);
                        }
                    }
                    pick
                }
                Policy::Fgd => self
                    .fgd
                    .as_mut()
                    .and_then(|f| f.evaluate(task, node).1)
                    .and_then(|at| node.gpus.get(at as usize))
                    .filter(|g| req.fits_device(g))
                    .map(|g| g.index),
                _ => node.gpus.iter().filter(fits).min_by_key(|g| (g.free_milli, g.index)).map(|g| g.index),
            };
            pick.into_iter().collect()
        };
        if chosen.len() < req.count as usize {
            return Err(Rejection { reason: "no GPU set fits the request".into(), unresolvable: false });
        }
        Ok(chosen.into_iter().map(|gpu| DeviceShare { gpu, milli: req.milli_per_gpu }).collect())
    }
}

/// A small seeded generator (SplitMix64): the same seed gives the same draws natively and in Wasm.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

wasmsched_sdk::export_plugin!(GpuShareScore: score, select_devices);

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu_left: u64, lefts: &[u32]) -> Node {
        Node {
            name: name.into(),
            allocatable: Resources { cpu_milli: cpu_left, memory_bytes: 1 << 40, ..Default::default() },
            gpus: lefts
                .iter()
                .enumerate()
                .map(|(i, &f)| GpuDevice { index: i as u32, model: "T4".into(), free_milli: f, ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    fn pod(cpu: u64, count: u32, milli: u32) -> Task {
        Task {
            request: Resources { cpu_milli: cpu, ..Default::default() },
            gpu: GpuRequest { count, milli_per_gpu: milli, ..Default::default() },
            ..Default::default()
        }
    }

    fn plugin(config: &str) -> GpuShareScore {
        GpuShareScore::new(config).unwrap()
    }

    #[test]
    fn best_fit_matches_the_worked_example() {
        let mut p = plugin(r#"{"policy":"best-fit"}"#);
        // P1 (1000 mCPU, 1×200) on A (8000, [1000, 1000]) and B (8000, [1000]): raw 86 and 92.
        assert_eq!(p.score(&pod(1000, 1, 200), &node("A", 8000, &[1000, 1000])), 86);
        assert_eq!(p.score(&pod(1000, 1, 200), &node("B", 8000, &[1000])), 92);
        let mut s = [86, 92];
        p.normalize(&pod(1000, 1, 200), &mut s);
        assert_eq!(s, [0, 100]);
        // P3 on A (6000, [0, 1000]) and B (7000, [800]): both 93, normalised to a tie at 0.
        assert_eq!(p.score(&pod(1000, 1, 200), &node("A", 6000, &[0, 1000])), 93);
        assert_eq!(p.score(&pod(1000, 1, 200), &node("B", 7000, &[800])), 93);
        let mut s = [93, 93];
        p.normalize(&pod(1000, 1, 200), &mut s);
        assert_eq!(s, [0, 0]);
    }

    #[test]
    fn gpu_packing_prefers_used_gpus_then_used_nodes_then_small_idle_nodes() {
        let mut p = plugin(r#"{"policy":"gpu-packing"}"#);
        let share = pod(1000, 1, 200);
        assert_eq!(p.score(&share, &node("n", 8000, &[1000; 8])), 25);
        assert_eq!(p.score(&share, &node("n", 8000, &[1000; 2])), 31);
        assert_eq!(p.score(&share, &node("n", 8000, &[1000])), 32);
        // A used node with a free GPU: 50 − 1.
        assert_eq!(p.score(&share, &node("n", 8000, &[0, 1000])), 49);
        // A partly used GPU: 100 − (30 div 10) = 97.
        assert_eq!(p.score(&share, &node("n", 8000, &[300, 1000])), 97);
        assert_eq!(p.score(&pod(1000, 0, 0), &node("n", 8000, &[300])), 0);
    }

    #[test]
    fn gpu_clustering_follows_the_affinity_label() {
        let mut p = plugin(r#"{"policy":"gpu-clustering"}"#);
        let share = pod(1000, 1, 200);
        let mut n = node("n", 8000, &[1000; 8]);
        assert_eq!(p.score(&share, &n), 25, "empty node: base 0 + 25");
        assert!(!affinity_recorded(&n, &share) && affinity_recorded(&n, &pod(1000, 0, 0)));
        record_affinity(&mut n, &share);
        assert!(affinity_recorded(&n, &share) && !affinity_recorded(&n, &pod(1000, 2, 1000)));
        n.gpus.update(|g| g[0].free_milli = 800);
        assert_eq!(p.score(&share, &n), 75, "same shape only: base 0 + 75");
        assert_eq!(p.score(&pod(1000, 2, 1000), &n), 0, "other shape present");
        record_affinity(&mut n, &pod(1000, 2, 1000));
        assert_eq!(n.labels, vec![(AFFINITY_LABEL.to_string(), "2-gpu,share".to_string())]);
        assert!(affinity_recorded(&n, &share) && affinity_recorded(&n, &pod(1000, 2, 1000)));
        assert_eq!(p.score(&share, &n), 50);
        assert_eq!(p.score(&pod(1000, 0, 0), &n), 0);
    }

    #[test]
    fn dot_prod_prefers_the_smaller_product() {
        let mut p = plugin(r#"{"policy":"dot-prod"}"#);
        let t = pod(16_000, 1, 1000);
        let roomy = p.score(&t, &node("a", 128_000, &[1000; 8]));
        let tight = p.score(&t, &node("b", 16_000, &[1000]));
        assert!(tight > roomy, "{tight} vs {roomy}");
        assert_eq!((tight, roomy), (98, 87), "1 − dot/2 with dot 0.03125 and 0.25");
    }

    #[test]
    fn fgd_matches_the_worked_example_and_picks_the_gpu() {
        let config = r#"{"policy":"fgd","typical":[
            {"cpu_milli":1000,"milli":500,"count":1,"weight":0.5},
            {"cpu_milli":1000,"milli":1000,"count":1,"weight":0.4},
            {"cpu_milli":1000,"milli":0,"count":0,"weight":0.1}]}"#;
        let mut p = plugin(config);
        let p1 = pod(1000, 1, 200);
        assert_eq!(p.score(&p1, &node("A", 8000, &[1000, 1000])), 42);
        assert_eq!(p.score(&p1, &node("B", 8000, &[1000])), 42);
        let a = node("A", 8000, &[1000, 1000]);
        assert_eq!(p.select_devices(&p1, &a).unwrap(), vec![DeviceShare { gpu: 0, milli: 200 }]);
        assert_eq!(p.score(&pod(2000, 1, 1000), &node("A", 7000, &[800, 1000])), 52);
        assert_eq!(p.score(&p1, &node("A", 5000, &[800, 0])), 52);
        assert_eq!(p.score(&p1, &node("B", 8000, &[1000])), 42);
        // The cache follows node changes: B's state changed back and forth, same answers.
        assert_eq!(p.score(&p1, &node("B", 7000, &[800])), p.score(&p1, &node("C", 7000, &[800])));
    }

    #[test]
    fn fgd_cpu_does_not_protect_gpus_the_cpu_has_stranded() {
        let typical = r#""typical":[{"cpu_milli":12000,"milli":1000,"count":1,"weight":1.0}]"#;
        let mut paper = plugin(&format!(r#"{{"policy":"fgd",{typical}}}"#));
        let mut cpu = plugin(&format!(r#"{{"policy":"fgd","usable":"cpu-bounded",{typical}}}"#));
        let light = pod(2000, 1, 1000);
        // Two free GPUs and CPU for one typical pod: one GPU is stranded already. The paper's
        // measure sees none stranded before and one after (the CPU then fits no typical pod);
        // the CPU-bounded one sees one before and after: placing here loses nothing.
        let tight = node("tight", 12_000, &[1000, 1000]);
        assert_eq!(paper.score(&light, &tight), 26);
        assert_eq!(cpu.score(&light, &tight), 50);
        // Plenty of CPU: neither measure sees a loss.
        let roomy = node("roomy", 60_000, &[1000; 4]);
        assert_eq!((paper.score(&light, &roomy), cpu.score(&light, &roomy)), (50, 50));
        // A CPU-heavy pod on eight free GPUs with CPU for three typical pods: it strands two
        // more GPUs, which only the CPU-bounded measure counts (5 → 6 of 7 stranded... −1000).
        let heavy = pod(24_000, 1, 1000);
        let eight = node("eight", 36_000, &[1000; 8]);
        assert_eq!((paper.score(&heavy, &eight), cpu.score(&heavy, &eight)), (50, 26));
    }

    #[test]
    fn random_draws_one_winner_reproducibly() {
        let mut a = plugin(r#"{"policy":"random","seed":7}"#);
        let mut b = plugin(r#"{"policy":"random","seed":7}"#);
        let t = pod(1000, 1, 200);
        let mut wins = [0usize; 4];
        for _ in 0..400 {
            let (mut sa, mut sb) = ([0u32; 4], [0u32; 4]);
            a.normalize(&t, &mut sa);
            b.normalize(&t, &mut sb);
            assert_eq!(sa, sb);
            assert_eq!(sa.iter().filter(|&&s| s == MAX_SCORE).count(), 1);
            wins[sa.iter().position(|&s| s == MAX_SCORE).unwrap()] += 1;
        }
        assert!(wins.iter().all(|&w| w > 60), "roughly uniform: {wins:?}");
        let mut one = [0u32];
        a.normalize(&t, &mut one);
        assert_eq!(one, [0], "no draw with a single candidate");
    }

    #[test]
    fn device_choice_per_policy() {
        let n = node("n", 8000, &[1000, 300, 1000, 500]);
        let mut best = plugin(r#"{"policy":"best-fit"}"#);
        assert_eq!(best.select_devices(&pod(1, 1, 200), &n).unwrap()[0].gpu, 1, "tightest fit");
        assert_eq!(
            best.select_devices(&pod(1, 2, 1000), &n).unwrap(),
            vec![DeviceShare { gpu: 0, milli: 1000 }, DeviceShare { gpu: 2, milli: 1000 }]
        );
        assert!(best.select_devices(&pod(1, 3, 1000), &n).is_err());
        assert!(best.select_devices(&pod(1, 0, 0), &n).unwrap().is_empty());
        let mut random = plugin(r#"{"policy":"random","seed":1}"#);
        let picks: std::collections::BTreeSet<u32> =
            (0..64).map(|_| random.select_devices(&pod(1, 1, 400), &n).unwrap()[0].gpu).collect();
        assert_eq!(picks, [0, 2, 3].into(), "every GPU that fits, and only those");
    }

    #[test]
    fn bad_configurations_are_rejected() {
        for bad in [
            "",
            r#"{"policy":"fastest"}"#,
            r#"{"policy":"fgd"}"#,
            r#"{"policy":"fgd","typical":[{"cpu_milli":1,"milli":100,"count":1,"weight":0.5}]}"#,
            r#"{"policy":"fgd","typical":[{"cpu_milli":1,"milli":0,"count":1,"weight":1.0}]}"#,
            r#"{"policy":"fgd","typical":[{"cpu_milli":1,"milli":100,"count":1,"weight":"NaN"}]}"#,
            r#"{"policy":"best-fit","typical":[{"cpu_milli":1,"milli":100,"count":1,"weight":1.0}]}"#,
            r#"{"policy":"best-fit","usable":"cpu-bounded"}"#,
            r#"{"policy":"fgd","usable":"cpu","typical":[{"cpu_milli":1,"milli":100,"count":1,"weight":1.0}]}"#,
        ] {
            assert!(GpuShareScore::new(bad).is_err(), "{bad}");
        }
    }
}
