//! `resource-fit`: the reference filter. A node fits a task when it is schedulable, matches the
//! task's node selector and required node affinity, every `NoSchedule`/`NoExecute` taint is tolerated, and it has the CPU,
//! memory, extended resources and GPUs (count, per-device share, device memory, model, health)
//! that the task requests.
//!
//! Selector, affinity, taint and GPU-model mismatches are *unresolvable* (preemption cannot change labels or
//! hardware); shortages are plain *unfit*.
//!
//! Configuration (JSON, all optional): `{"ignore_gpu_memory": false}`.

use serde::Deserialize;
use wasmsched_sdk::prelude::*;

/// The resource-fit filter.
#[derive(Debug, Default)]
pub struct ResourceFit {
    config: Config,
    /// `insufficient <name>` per extended resource seen, made once: a shortage is the common
    /// answer on a full cluster, and formatting it per node cost more than the check itself (DRA
    /// device classes are extended resources: `wasmsched bench --dra`). At most
    /// [`MAX_REASONS`] names are kept (they live as long as the plugin); others are formatted.
    shortages: Vec<(wasmsched_sdk::ResourceName, &'static str)>,
}

/// Extended-resource names whose shortage reason is kept.
const MAX_REASONS: usize = 64;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Do not check per-device memory (for clusters whose traces carry no GPU memory).
    #[serde(default)]
    ignore_gpu_memory: bool,
}

impl Plugin for ResourceFit {
    const NAME: &'static str = "resource-fit";

    fn new(config: &str) -> Result<Self, String> {
        Ok(ResourceFit { config: wasmsched_sdk::config::json(Self::NAME, config)?, shortages: Vec::new() })
    }
}

impl Filter for ResourceFit {
    // `always` (here and on `gpu_verdict`): as a component, an out-of-line call per node costs a
    // prologue with its stack and deadline checks and the verdict's round trip through linear
    // memory, and LLVM's size heuristics kept these out of the SDK's loop despite `#[inline]`.
    // Folded in, a Wasm decision of `wasmsched bench` went from 27 to 22 µs (BENCHMARKS.md).
    #[inline(always)]
    fn filter(&mut self, task: &Task, node: &Node) -> Verdict {
        if node.unschedulable {
            return Verdict::unresolvable("node is cordoned");
        }
        for (key, value) in &task.node_selector {
            if node.label(key) != Some(value.as_str()) {
                return Verdict::unresolvable(format!("node selector {key}={value} does not match"));
            }
        }
        if !task.node_affinity.allows(node) {
            return Verdict::unresolvable("required node affinity does not match");
        }
        for taint in &node.taints {
            if taint.effect != TaintEffect::PreferNoSchedule && !task.tolerations.iter().any(|t| t.tolerates(taint)) {
                return Verdict::unresolvable(format!(
                    "untolerated taint {}={}:{:?}",
                    taint.key, taint.value, taint.effect
                ));
            }
        }
        if node.free_cpu_milli() < task.request.cpu_milli {
            return Verdict::unfit("insufficient cpu");
        }
        if node.free_memory_bytes() < task.request.memory_bytes {
            return Verdict::unfit("insufficient memory");
        }
        for (name, want) in &task.request.extended {
            let free = node.allocatable.extended(name).saturating_sub(node.allocated.extended(name));
            if free < *want {
                return Verdict::unfit(self.shortage(name));
            }
        }
        self.gpu_verdict(&task.gpu, node)
    }
}

impl ResourceFit {
    /// `insufficient <name>`, made once per name. Found in the filter's own loop: as a call,
    /// its answer's round trip through the stack cost a quarter of the filter on a cluster full
    /// of DRA-counted pods (`wasmsched bench --dra`).
    #[inline(always)]
    fn shortage(&mut self, name: &wasmsched_sdk::ResourceName) -> std::borrow::Cow<'static, str> {
        match self.shortages.iter().find(|(n, _)| n == name) {
            Some((_, reason)) => std::borrow::Cow::Borrowed(*reason),
            None => self.new_shortage(name),
        }
    }

    #[cold]
    #[inline(never)]
    fn new_shortage(&mut self, name: &wasmsched_sdk::ResourceName) -> std::borrow::Cow<'static, str> {
        let reason = format!("insufficient {name}");
        if self.shortages.len() >= MAX_REASONS {
            return std::borrow::Cow::Owned(reason);
        }
        let kept: &'static str = Box::leak(reason.into_boxed_str());
        self.shortages.push((*name, kept));
        std::borrow::Cow::Borrowed(kept)
    }

    #[inline(always)]
    fn gpu_verdict(&self, req: &GpuRequest, node: &Node) -> Verdict {
        if req.count == 0 {
            return Verdict::Fit;
        }
        if node.gpus.is_empty() {
            return Verdict::unresolvable("node has no GPU");
        }
        if !node.gpus.iter().any(|g| req.allows_model(&g.model)) {
            return Verdict::unresolvable("no GPU of an allowed model");
        }
        // Most requests ask only for a share of any device: the node's aggregates answer those
        // without walking its devices (the walk was this filter's largest cost).
        if req.models.is_empty()
            && (self.config.ignore_gpu_memory || req.memory_bytes_per_gpu == 0)
            && req.milli_per_gpu <= GPU_MILLI
        {
            let s = node.gpus.summary();
            if s.whole_free >= req.count {
                return Verdict::Fit;
            }
            if req.milli_per_gpu == GPU_MILLI || s.max_free_milli < req.milli_per_gpu || s.usable < req.count {
                return Self::short(req);
            }
        }
        // No clone of the request per node (a heap allocation in the guest), and stop counting
        // once enough devices are found.
        let need = req.count as usize;
        let usable = if self.config.ignore_gpu_memory {
            node.gpus
                .iter()
                .filter(|g| {
                    g.health != GpuHealth::Unhealthy && g.free_milli >= req.milli_per_gpu && req.allows_model(&g.model)
                })
                .take(need)
                .count()
        } else {
            node.gpus.iter().filter(|g| req.fits_device(g)).take(need).count()
        };
        if usable >= need { Verdict::Fit } else { Self::short(req) }
    }

    fn short(req: &GpuRequest) -> Verdict {
        if req.milli_per_gpu < GPU_MILLI {
            Verdict::unfit("insufficient GPU share")
        } else {
            Verdict::unfit("insufficient free GPUs")
        }
    }
}

wasmsched_sdk::export_plugin!(ResourceFit: filter);

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, free_milli: u32, model: &str) -> GpuDevice {
        GpuDevice {
            index,
            model: model.into(),
            free_milli,
            memory_bytes: 32 << 30,
            free_memory_bytes: 32 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn a_shortage_of_an_extended_resource_names_it_however_many_names_there_are() {
        let mut f = ResourceFit::default();
        let mut n = node();
        for i in 0..(MAX_REASONS + 3) {
            let name = format!("example.com/r{i}");
            n.allocatable.extended = vec![(name.as_str().into(), 1)].into();
            let task = Task {
                request: Resources { extended: vec![(name.as_str().into(), 2)].into(), ..Default::default() },
                ..Default::default()
            };
            for _ in 0..2 {
                assert_eq!(f.filter(&task, &n).rejection().map(|r| r.reason), Some(format!("insufficient {name}")));
            }
        }
        assert_eq!(f.shortages.len(), MAX_REASONS);
    }

    fn node() -> Node {
        Node {
            name: "n".into(),
            allocatable: Resources {
                cpu_milli: 8000,
                memory_bytes: 64 << 30,
                gpu_milli: 2000,
                extended: Default::default(),
            },
            gpus: vec![gpu(0, 1000, "V100"), gpu(1, 300, "V100")].into(),
            ..Default::default()
        }
    }

    fn task(count: u32, milli: u32) -> Task {
        Task {
            request: Resources { cpu_milli: 1000, ..Default::default() },
            gpu: GpuRequest { count, milli_per_gpu: milli, ..Default::default() },
            ..Default::default()
        }
    }

    /// The GPU verdict by walking every device, as the filter did before it used the node's
    /// aggregates.
    fn gpu_fits_by_walking(req: &GpuRequest, node: &Node, ignore_memory: bool) -> bool {
        let usable = node
            .gpus
            .iter()
            .filter(|g| {
                g.health != GpuHealth::Unhealthy
                    && g.free_milli >= req.milli_per_gpu
                    && (ignore_memory || g.free_memory_bytes >= req.memory_bytes_per_gpu)
                    && req.allows_model(&g.model)
            })
            .count();
        usable >= req.count as usize
    }

    #[test]
    fn the_aggregates_shortcut_agrees_with_walking_the_devices() {
        let mut rng = 0x5eed_u64;
        let mut next = |n: u64| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        for ignore in [false, true] {
            let mut f = ResourceFit { config: Config { ignore_gpu_memory: ignore }, shortages: Vec::new() };
            for _ in 0..20_000 {
                let shares = [0, 1, 250, 500, 999, 1000, 1001];
                let gpus: Gpus = (0..next(9) as u32)
                    .map(|index| GpuDevice {
                        index,
                        model: ["V100", "A100"][next(2) as usize].into(),
                        free_milli: shares[next(shares.len() as u64) as usize],
                        free_memory_bytes: next(3) << 30,
                        health: [GpuHealth::Healthy, GpuHealth::Degraded, GpuHealth::Unhealthy][next(3) as usize],
                        ..Default::default()
                    })
                    .collect();
                let n = Node { gpus, ..node() };
                let req = GpuRequest {
                    count: next(10) as u32,
                    milli_per_gpu: shares[next(shares.len() as u64) as usize],
                    memory_bytes_per_gpu: [0, 1 << 30][next(2) as usize],
                    models: if next(4) == 0 { vec!["A100".into()] } else { vec![] },
                    ..Default::default()
                };
                let got = f.filter(&Task { gpu: req.clone(), ..Default::default() }, &n);
                let want = req.count == 0 || (!n.gpus.is_empty() && gpu_fits_by_walking(&req, &n, ignore));
                assert_eq!(got.fits(), want, "{req:?} on {:?}: {got:?}", n.gpus);
            }
        }
    }

    #[test]
    fn gpu_share_and_count() {
        let mut f = ResourceFit::default();
        assert!(f.filter(&task(1, 1000), &node()).fits());
        assert_eq!(f.filter(&task(2, 1000), &node()), Verdict::unfit("insufficient free GPUs"));
        assert!(f.filter(&task(2, 300), &node()).fits());
        let mut n = node();
        n.gpus.update(|g| g[0].free_milli = 200);
        assert_eq!(f.filter(&task(1, 500), &n), Verdict::unfit("insufficient GPU share"));
    }

    #[test]
    fn selector_taint_model_are_unresolvable() {
        let mut f = ResourceFit::default();
        let mut t = task(1, 1000);
        t.gpu.models = vec!["A100".into()];
        assert_eq!(f.filter(&t, &node()), Verdict::unresolvable("no GPU of an allowed model"));
        let mut t = task(0, 0);
        t.node_selector = vec![("zone".into(), "a".into())];
        assert!(matches!(f.filter(&t, &node()), Verdict::Unresolvable(_)));
        let mut n = node();
        n.taints.push(Taint { key: "gpu".into(), value: "reserved".into(), effect: TaintEffect::NoSchedule });
        assert!(matches!(f.filter(&task(0, 0), &n), Verdict::Unresolvable(_)));
        let mut t = task(0, 0);
        t.tolerations.push(Toleration {
            key: "gpu".into(),
            operator: TolerationOperator::Exists,
            ..Default::default()
        });
        assert!(f.filter(&t, &n).fits());
    }

    #[test]
    fn required_node_affinity_is_unresolvable() {
        let mut f = ResourceFit::default();
        let mut t = task(1, 1000);
        let term = |value: &str| NodeSelectorTerm {
            match_expressions: vec![SelectorRequirement {
                key: "zone".into(),
                operator: SelectorOperator::In,
                values: vec![value.into()],
            }],
            match_fields: vec![],
        };
        t.node_affinity.required = vec![term("a")];
        let mut n = node();
        assert_eq!(f.filter(&t, &n), Verdict::unresolvable("required node affinity does not match"));
        n.labels.push(("zone".into(), "a".into()));
        assert!(f.filter(&t, &n).fits());
        t.node_affinity.required = vec![term("b")];
        assert!(!f.filter(&t, &n).fits());
        t.node_affinity.required.push(term("a"));
        assert!(f.filter(&t, &n).fits(), "terms are alternatives");
    }

    #[test]
    fn cpu_memory_and_bad_config() {
        let mut f = ResourceFit::default();
        let mut t = task(0, 0);
        t.request.cpu_milli = 9000;
        assert_eq!(f.filter(&t, &node()), Verdict::unfit("insufficient cpu"));
        assert!(ResourceFit::new("{\"nope\": 1}").unwrap_err().contains("unknown field"));
        assert!(ResourceFit::new("").is_ok());
    }
}
