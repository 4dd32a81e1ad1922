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
    let mut total = 0u64;
    for s in specs {
        *counts.entry(s).or_default() += 1;
        total += 1;
    }
    let mut sorted: Vec<(Spec, u64)> = counts.into_iter().collect();
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
        if cum as f64 >= expected {
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
    fn lack_of_cpu_or_model_makes_all_idle_share_fragmented() {
        let mut w = example();
        assert_eq!(measure(&w, &[true; 3], 500, &[1000]).fragmented, 1000.0);
        w[0].models = vec!["A100".into()];
        assert!(!w[0].accepts_model("T4"));
        // t1 cannot use a T4 at all: its 0.5 weight of the idle 1000 is fragmented.
        assert_eq!(measure(&w, &[false, true, true], 8000, &[1000]).fragmented, 500.0 + 100.0);
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
