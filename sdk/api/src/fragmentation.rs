//! GPU fragmentation with respect to a target workload (FGD paper §4; `docs/openb-protocol.md` §4.6).
//!
//! It lives here, beside the model, because two sides need the very same numbers: the `fgd` scorer
//! (a plugin) descends its gradient, and the simulator reports the cluster's fragmentation. Neither
//! depends on the other.
//!
//! Idle GPU share on a node is *fragmented* for a typical pod when that pod could not use it: the
//! node lacks CPU, the GPU model is wrong, too few GPUs have enough free share, or the share sits
//! on GPUs too small for the pod. A node's fragmentation is the popularity-weighted sum over the
//! target workload. Float accumulation follows the paper's simulator exactly, so scores truncated
//! to integers tie (or not) the same way.

/// The shape of a pod, as the target workload counts it (memory is not part of it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Spec {
    /// CPU request (milli-cores).
    pub cpu_milli: u64,
    /// Share of each GPU (milli-GPU); 0 for CPU-only pods.
    pub milli: u32,
    /// Number of GPUs; 0 for CPU-only pods.
    pub count: u32,
    /// Allowed GPU models joined with `|`, empty for any.
    pub models: String,
}

/// One popular pod shape and its weight in the target workload.
///
/// With the `serde` feature it is (de)serialisable, as the `fgd` scorer's configuration carries it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(deny_unknown_fields))]
pub struct TypicalPod {
    /// CPU request (milli-cores).
    pub cpu_milli: u64,
    /// Share of each GPU (milli-GPU); 0 for CPU-only.
    pub milli: u32,
    /// Number of GPUs.
    pub count: u32,
    /// Allowed GPU models; empty for any.
    #[cfg_attr(feature = "serde", serde(default))]
    pub models: Vec<String>,
    /// Popularity weight; the weights of a target workload sum to 1.
    pub weight: f64,
}

impl TypicalPod {
    /// Whether this shape may run on GPUs of `model`.
    pub fn accepts_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// The target workload of a trace: the most popular shapes covering `popularity_percent` of the
/// pods, each weighted by its share among them. Ties in popularity are ordered by CPU, share,
/// count and model string, all descending, so the result (and the float summation order that
/// follows from it) is unique.
pub fn typical_pods(specs: impl IntoIterator<Item = Spec>, popularity_percent: u32) -> Vec<TypicalPod> {
    let mut counts: std::collections::BTreeMap<Spec, u64> = std::collections::BTreeMap::new();
    for s in specs {
        *counts.entry(s).or_default() += 1;
    }
    typical_of_counts(counts, popularity_percent, usize::MAX)
}

/// [`typical_pods`] of shapes already counted (how many pods had each), keeping at most
/// `max_shapes` of them: a live cluster's pods ask for every CPU amount there is, and the long
/// tail would make each measure cost shapes × nodes × GPUs for little weight.
pub fn typical_of_counts(
    counts: std::collections::BTreeMap<Spec, u64>,
    popularity_percent: u32,
    max_shapes: usize,
) -> Vec<TypicalPod> {
    let total: u64 = counts.values().sum();
    let mut sorted: Vec<(Spec, u64)> = counts.into_iter().filter(|(_, n)| *n > 0).collect();
    sorted.sort_by(|(a, na), (b, nb)| {
        nb.cmp(na)
            .then(b.cpu_milli.cmp(&a.cpu_milli))
            .then(b.milli.cmp(&a.milli))
            .then(b.count.cmp(&a.count))
            .then(b.models.cmp(&a.models))
    });
    let expected = (u64::from(popularity_percent) * total) as f64 / 100.0;
    let mut cum = 0u64;
    let mut kept = 0;
    for (_, n) in &sorted {
        cum += n;
        kept += 1;
        if cum as f64 >= expected || kept >= max_shapes {
            break;
        }
    }
    sorted.truncate(kept);
    let (total, cum) = (total as f64, cum as f64);
    sorted
        .into_iter()
        .map(|(s, n)| TypicalPod {
            cpu_milli: s.cpu_milli,
            milli: s.milli,
            count: s.count,
            models: s.models.split('|').filter(|m| !m.is_empty()).map(String::from).collect(),
            weight: (n as f64 / total) / (cum / total),
        })
        .collect()
}

impl Spec {
    /// The shape of `task`: its CPU and whole-or-shared GPU request (a task without GPUs is
    /// CPU-only, whatever models it names).
    pub fn of(task: &crate::Task) -> Spec {
        let gpu = task.gpu.count > 0 && task.gpu.milli_per_gpu > 0;
        Spec {
            cpu_milli: task.request.cpu_milli,
            milli: if gpu { task.gpu.milli_per_gpu } else { 0 },
            count: if gpu { task.gpu.count } else { 0 },
            models: if gpu { task.gpu.models.join("|") } else { String::new() },
        }
    }
}

/// A node's fragmentation and its idle GPU share, both in milli-GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fragmentation {
    /// Idle share no typical pod could use, weighted by popularity.
    pub fragmented: f64,
    /// All idle share, weighted the same way (≈ the free share of the node).
    pub idle: f64,
}

/// Fragmentation of a node with `cpu_left` milli-cores and GPUs with `lefts` milli free each, for
/// `typical` pods; `accessible[i]` says whether typical pod `i` accepts the node's GPU model.
pub fn measure(typical: &[TypicalPod], accessible: &[bool], cpu_left: u64, lefts: &[u32]) -> Fragmentation {
    let total: u64 = lefts.iter().map(|&l| u64::from(l)).sum();
    let total_f = total as f64;
    // [lack both, lack GPU, satisfied, lack CPU, CPU-only satisfied, CPU-only lacking CPU, no access]
    let mut q = [0.0f64; 7];
    for (t, &access) in typical.iter().zip(accessible) {
        let cpu_ok = cpu_left >= t.cpu_milli;
        if t.milli == 0 {
            q[if cpu_ok { 4 } else { 5 }] += t.weight * total_f;
            continue;
        }
        if !access {
            q[6] += t.weight * total_f;
            continue;
        }
        let fits = lefts.iter().filter(|&&l| l >= t.milli).count() >= t.count as usize;
        match (fits, cpu_ok) {
            (true, true) => {
                let small: u64 = lefts.iter().filter(|&&l| l < t.milli).map(|&l| u64::from(l)).sum();
                q[1] += t.weight * small as f64;
                q[2] += t.weight * (total - small) as f64;
            }
            (true, false) => q[3] += t.weight * total_f,
            (false, true) => q[1] += t.weight * total_f,
            (false, false) => q[0] += t.weight * total_f,
        }
    }
    Fragmentation {
        fragmented: (((((0.0 + q[0]) + q[1]) + q[3]) + q[4]) + q[5]) + q[6],
        idle: q.iter().fold(0.0, |s, x| s + x),
    }
}

/// [`measure`] of `node` as it is now (its free CPU and each GPU's free share). An unhealthy GPU
/// has no share to give: it counts as neither idle nor fragmented (it is unhealthy).
pub fn of_node(typical: &[TypicalPod], accessible: &[bool], node: &crate::Node) -> Fragmentation {
    let lefts: Vec<u32> =
        node.gpus.iter().map(|g| if g.health == crate::GpuHealth::Unhealthy { 0 } else { g.free_milli }).collect();
    measure(typical, accessible, node.free_cpu_milli(), &lefts)
}

/// Which of `typical` accept each GPU model, computed once per model: a cluster has a handful
/// of models and thousands of nodes.
#[derive(Debug, Default)]
pub struct ModelAccess {
    models: Vec<(String, Vec<bool>)>,
}

impl ModelAccess {
    /// `accessible` for `measure` on a node whose GPUs are `model`.
    pub fn of(&mut self, typical: &[TypicalPod], model: &str) -> &[bool] {
        let i = match self.models.iter().position(|(m, _)| m == model) {
            Some(i) => i,
            None => {
                self.models.push((model.into(), typical.iter().map(|t| t.accepts_model(model)).collect()));
                self.models.len() - 1
            }
        };
        &self.models[i].1
    }
}

/// The fragmentation of a whole cluster: its nodes' [`measure`]s summed, in node order.
pub fn of_cluster<'a>(typical: &[TypicalPod], nodes: impl IntoIterator<Item = &'a crate::Node>) -> Fragmentation {
    let mut access = ModelAccess::default();
    nodes.into_iter().fold(Fragmentation::default(), |sum, node| {
        let model = node.gpus.first().map_or("", |g| g.model.as_str());
        let f = of_node(typical, access.of(typical, model), node);
        Fragmentation { fragmented: sum.fragmented + f.fragmented, idle: sum.idle + f.idle }
    })
}

/// The FGD node score for a fragmentation change: `trunc(100 · sigmoid((before − after) / 1000))`,
/// exactly 50 when nothing changes, above 50 when the pod uses share that was fragmented anyway.
pub fn gradient_score(before: f64, after: f64) -> u32 {
    let x = (before - after) / 1000.0;
    (100.0 * (1.0 / (1.0 + (-x).exp()))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(cpu: u64, milli: u32, count: u32, weight: f64) -> TypicalPod {
        TypicalPod { cpu_milli: cpu, milli, count, models: vec![], weight }
    }

    /// The protocol's worked example (§6): target workload 0.5·(1×500) + 0.4·(1×1000) + 0.1·CPU-only.
    fn example() -> Vec<TypicalPod> {
        vec![t(1000, 500, 1, 0.5), t(1000, 1000, 1, 0.4), t(1000, 0, 0, 0.1)]
    }

    #[test]
    fn worked_example_fragmentation() {
        let w = example();
        let all = [true; 3];
        assert_eq!(measure(&w, &all, 8000, &[1000, 1000]).fragmented, 200.0);
        assert_eq!(measure(&w, &all, 8000, &[1000]).fragmented, 100.0);
        assert_eq!(measure(&w, &all, 7000, &[800, 1000]).fragmented, 500.0);
        assert_eq!(measure(&w, &all, 7000, &[800]).fragmented, 400.0);
        assert_eq!(measure(&w, &all, 4000, &[600, 0]).fragmented, 300.0);
        assert_eq!(measure(&w, &all, 4000, &[600, 0]).idle, 600.0);
        assert_eq!(gradient_score(200.0, 500.0), 42);
        assert_eq!(gradient_score(500.0, 400.0), 52);
        assert_eq!(gradient_score(300.0, 300.0), 50);
    }

    #[test]
    fn an_unhealthy_gpu_is_neither_idle_nor_fragmented() {
        let gpu = |index, free_milli, health| crate::GpuDevice {
            index,
            model: "H100".into(),
            memory_bytes: 80 << 30,
            free_milli,
            free_memory_bytes: 80 << 30,
            health,
            numa_node: None,
            kind: Default::default(),
        };
        let node = |second| crate::Node {
            name: "n".into(),
            allocatable: crate::Resources { cpu_milli: 8000, ..Default::default() },
            gpus: vec![gpu(0, 600, crate::GpuHealth::Healthy), gpu(1, 1000, second)].into(),
            ..Default::default()
        };
        let w = example();
        let healthy = of_node(&w, &[true; 3], &node(crate::GpuHealth::Healthy));
        let sick = of_node(&w, &[true; 3], &node(crate::GpuHealth::Unhealthy));
        assert_eq!((healthy.idle, sick.idle), (1600.0, 600.0));
        assert_eq!(sick.fragmented, measure(&w, &[true; 3], 8000, &[600, 0]).fragmented);
    }

    #[test]
    fn lack_of_cpu_or_model_makes_all_idle_share_fragmented() {
        let mut w = example();
        assert_eq!(measure(&w, &[true; 3], 500, &[1000]).fragmented, 1000.0);
        w[0].models = vec!["A100".into()];
        assert!(!w[0].accepts_model("T4"));
        // t1 cannot use a T4 at all: its 0.5 weight of the idle 1000 is fragmented.
        assert_eq!(measure(&w, &[false, true, true], 8000, &[1000]).fragmented, 500.0 + 100.0);
    }

    #[test]
    fn shapes_counted_elsewhere_give_the_same_target_workload() {
        let spec = |cpu, milli, count| Spec { cpu_milli: cpu, milli, count, models: String::new() };
        let specs = [spec(1000, 500, 1), spec(1000, 500, 1), spec(4000, 1000, 8), spec(2000, 0, 0)];
        let mut counts = std::collections::BTreeMap::new();
        for s in &specs {
            *counts.entry(s.clone()).or_insert(0) += 1;
        }
        counts.insert(spec(1, 1, 1), 0);
        assert_eq!(typical_of_counts(counts.clone(), 60, usize::MAX), typical_pods(specs, 60));
        // At most one shape: the most popular, weighing all.
        let one = typical_of_counts(counts, 100, 1);
        assert_eq!((one.len(), one[0].milli, one[0].weight), (1, 500, 1.0));
    }

    #[test]
    fn a_cluster_is_fragmented_as_much_as_its_nodes_together() {
        let node = |name: &str, model: &str, cpu_used: u64, lefts: &[u32]| {
            let mut n = crate::Node { name: name.into(), ..Default::default() };
            n.allocatable.cpu_milli = 8000;
            n.allocated.cpu_milli = cpu_used;
            n.gpus = lefts
                .iter()
                .enumerate()
                .map(|(i, &l)| crate::GpuDevice {
                    index: i as u32,
                    model: model.into(),
                    free_milli: l,
                    ..Default::default()
                })
                .collect();
            n
        };
        let mut w = example();
        w[1].models = vec!["A100".into()];
        let nodes =
            [node("a", "A100", 1000, &[1000, 1000]), node("b", "T4", 0, &[800]), node("c", "A100", 8000, &[600])];
        let whole = of_cluster(&w, &nodes);
        // a: 200 (the example's first line); b: 0.4 of 800 for the A100-only shape, 0.5·0 + 0.1·800
        // for the rest; c: no CPU left, all 600.
        assert_eq!(whole.fragmented, 200.0 + (320.0 + 80.0) + 600.0);
        assert_eq!(whole.idle, 2000.0 + 800.0 + 600.0);
        let task = crate::Task {
            request: crate::Resources { cpu_milli: 3000, ..Default::default() },
            gpu: crate::GpuRequest {
                count: 2,
                milli_per_gpu: 1000,
                models: vec!["A100".into(), "H100".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(Spec::of(&task), Spec { cpu_milli: 3000, milli: 1000, count: 2, models: "A100|H100".into() });
        let cpu_only =
            crate::Task { gpu: crate::GpuRequest { models: vec!["A100".into()], ..Default::default() }, ..task };
        assert_eq!(Spec::of(&cpu_only), Spec { cpu_milli: 3000, milli: 0, count: 0, models: String::new() });
    }

    #[test]
    fn typical_pods_keep_the_popular_shapes_and_renormalise() {
        let spec = |cpu, milli, count| Spec { cpu_milli: cpu, milli, count, models: String::new() };
        let mut specs = vec![spec(1000, 500, 1); 5];
        specs.extend(vec![spec(1000, 1000, 1); 4]);
        specs.push(spec(2000, 0, 0));
        let all = typical_pods(specs.clone(), 100);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].weight, 0.5);
        // 85 % of 10 pods = 8.5: the first two shapes (9 pods) cover it; weights renormalise to 9.
        let top = typical_pods(specs, 85);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].weight, (5.0 / 10.0) / (9.0 / 10.0));
        // Equal popularity: higher CPU first.
        let tie = typical_pods(vec![spec(1, 0, 0), spec(2, 0, 0)], 100);
        assert_eq!(tie[0].cpu_milli, 2);
    }
}
