//! `wasmsched bench --vendors`: the benchmark's cluster and pods with two accelerator vendors next
//! to the same run with NVIDIA alone. Every other 8-GPU node is an AMD node (kind `amd`, resource
//! `amd.com/gpu`), and a third of the whole-GPU pods ask for AMD GPUs; shares stay NVIDIA's. What
//! the kinds cost is the host's per-node kind check (run once a node of another kind exists), the
//! SDK asking the host for device kinds when a node's mirror changes, and the request's kind in
//! every device test. The two runs alternate, the ratio is taken per pair.

use serde::Serialize;
use wasmsched_api::accelerators::Kind;
use wasmsched_api::{GpuRequest, Node, Task};
use wasmsched_core::PolicySet;

use crate::bench::{Scenario, run_once};

const KIND: &str = "amd";
const RESOURCE: &str = "amd.com/gpu";

/// One runtime's runs on the NVIDIA-only and the two-vendor cluster.
#[derive(Clone, Debug, Serialize)]
pub struct VendorRun {
    pub runtime: &'static str,
    /// Median pods/s with NVIDIA GPUs alone.
    pub nvidia_pods_per_second: f64,
    /// Median pods/s with AMD nodes and pods in the mix.
    pub mixed_pods_per_second: f64,
    /// Median over the pairs of mixed / NVIDIA-only.
    pub mixed_over_nvidia: f64,
    pub nvidia_placed: usize,
    pub mixed_placed: usize,
    /// Pods of one kind placed on a device of the other (checked on every mixed run: 0).
    pub wrong_kind: usize,
}

/// The two-vendor version of `s`: every other 8-GPU node AMD's, every third whole-GPU pod asking
/// for AMD GPUs. The same nodes and pods otherwise.
pub fn mixed(s: &Scenario) -> Scenario {
    let mut base = s.base.clone();
    base.set_accelerator_kinds(vec![Kind { name: KIND.into(), resources: vec![RESOURCE.into()] }]);
    let slots: Vec<_> = base.slots().collect();
    let mut eight = 0;
    for slot in slots {
        let convert = base.get(slot).is_some_and(|n| n.gpus.len() == 8 && n.allocated.gpu_milli == 0);
        if !convert {
            continue;
        }
        eight += 1;
        if eight % 2 == 0 {
            base.update(slot, amd_node);
        }
    }
    let mut whole = 0;
    let pods = s
        .pods
        .iter()
        .map(|p| {
            let is_whole = p.gpu.count > 0 && p.gpu.milli_per_gpu == wasmsched_api::GPU_MILLI;
            whole += usize::from(is_whole);
            if is_whole && whole % 3 == 0 { amd_pod(p) } else { p.clone() }
        })
        .collect();
    Scenario { base, pods, ..s.clone() }
}

/// Places `s`'s pods one after the other (untimed) and counts those given a device of another
/// kind than they asked for.
fn misplaced(set: &PolicySet, s: &Scenario) -> usize {
    let mut nodes = s.base.clone();
    let mut wrong = 0;
    let mut start = 0;
    for task in &s.pods {
        let placed = wasmsched_core::place_sampled(set, &nodes, task, 0, start, s.find);
        start = (start + placed.examined) % nodes.len().max(1);
        let Ok(p) = placed.result else { continue };
        let node = nodes.get(p.node).expect("placed on a node");
        wrong += p
            .devices
            .iter()
            .filter(|d| node.gpus.iter().find(|g| g.index == d.gpu).is_none_or(|g| g.kind != task.gpu.kind))
            .count()
            .min(1);
        nodes.update_usage(p.node, |n| wasmsched_core::bind(n, task, &p.devices));
    }
    wrong
}

fn amd_node(n: &mut Node) {
    let gpus = n.gpus.len() as u64;
    n.allocatable.gpu_milli = 0;
    n.allocatable.extended = vec![(RESOURCE.into(), gpus)].into();
    n.gpus.update(|devices| {
        for d in devices.iter_mut() {
            d.kind = KIND.into();
            d.model = "MI300X".into();
        }
    });
    for (k, v) in &mut n.labels {
        if k == "gpu-model" {
            *v = "MI300X".into();
        }
    }
}

fn amd_pod(p: &Task) -> Task {
    let mut t = p.clone();
    t.gpu = GpuRequest { kind: KIND.into(), ..p.gpu.clone() };
    t.request.gpu_milli = 0;
    let mut extended: Vec<_> = t.request.extended.iter().cloned().collect();
    extended.push((RESOURCE.into(), u64::from(p.gpu.count)));
    extended.sort();
    t.request.extended = extended.into();
    t
}

/// `repeat` alternating pairs of runs of `set` on `nvidia` and `two_vendors`.
pub fn measure(
    set: &PolicySet,
    name: &'static str,
    nvidia: &Scenario,
    two_vendors: &Scenario,
    repeat: usize,
) -> VendorRun {
    let (mut plain, mut mixed, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut wrong_kind = 0;
    for r in 0..repeat.max(1) {
        let one = |s: &Scenario| run_once(set, s, None, name);
        let (a, b) = if r % 2 == 0 {
            let a = one(nvidia);
            (a, one(two_vendors))
        } else {
            let b = one(two_vendors);
            (one(nvidia), b)
        };
        ratios.push(b.pods_per_second / a.pods_per_second);
        plain.push(a);
        mixed.push(b);
    }
    wrong_kind += misplaced(set, two_vendors);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    VendorRun {
        runtime: name,
        nvidia_pods_per_second: median(plain.iter().map(|m| m.pods_per_second).collect()),
        mixed_pods_per_second: median(mixed.iter().map(|m| m.pods_per_second).collect()),
        mixed_over_nvidia: median(ratios),
        nvidia_placed: plain[0].placed,
        mixed_placed: mixed[0].placed,
        wrong_kind,
    }
}
