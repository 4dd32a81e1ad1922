//! `wasmsched bench --dra`: DRA allocation in the placement loop, next to the device-plugin path on
//! the same cluster and pods. Every node publishes 8 GPUs as devices of a ResourceSlice (two PCIe
//! roots, two NUMA nodes); every pod asks for its GPUs through a claim with a CEL selector, a
//! quarter of them with a `matchAttribute` constraint on the PCIe root. The core places a pod by
//! the class's device count (as the Kubernetes path counts them), then the allocator picks the
//! devices on that node — selectors, constraint, topology — and holds them; a node whose free
//! devices cannot serve the claim is left out and the pod placed again. The device-plugin path
//! places the same pods asking `count` GPUs of the core's own GPU model, devices chosen by the
//! policy's device stage.

use std::time::Instant;

use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimSpec, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use wasmsched_api::{
    GPU_MILLI, GpuRequest, NODE_NAME_FIELD, Node, NodeSelectorTerm, Resources, SelectorOperator, SelectorRequirement,
    Task,
};
use wasmsched_core::{NodeTable, PolicySet, bind, place_sampled};
use wasmsched_dra::{Allocator, Inventory, class_resource};
use wasmsched_sim::generate::Rng;

/// The DeviceClass every claim names.
const CLASS: &str = "gpu.nvidia.com";

/// How often a pod is placed again after its claim could not be allocated where it was put.
const RETRIES: usize = 3;

/// One runtime's DRA and device-plugin runs.
#[derive(Clone, Debug, Serialize)]
pub struct DraRun {
    pub runtime: &'static str,
    pub nodes: usize,
    pub pods: usize,
    /// Pods/s placing through claims (count, then allocation).
    pub dra_pods_per_second: f64,
    /// Pods/s placing the same pods as device-plugin GPUs.
    pub plugin_pods_per_second: f64,
    /// Pods/s placing the same pods by the class's count alone, as a plain extended resource
    /// (no device chosen): what allocating the devices adds is the difference.
    pub counted_pods_per_second: f64,
    /// DRA over device plugin.
    pub dra_over_plugin: f64,
    /// DRA over the count alone.
    pub dra_over_counted: f64,
    /// Building the devices (inventory, allocator) from the slices, before the clock starts: a
    /// scheduler does it when it starts and when slices change, not per pod.
    pub inventory_ms: f64,
    pub dra_placed: usize,
    pub plugin_placed: usize,
    /// Placements taken back because the node's free devices could not serve the claim.
    pub dra_retries: usize,
    /// Allocations naming a device another allocation holds (checked on every run: 0).
    pub devices_given_twice: usize,
}

/// What one DRA run did.
struct DraOutcome {
    placed: usize,
    retries: usize,
    seconds: f64,
    /// Devices the allocator holds at the end, and devices the placed pods' allocations name.
    held: usize,
    asked: usize,
    inventory_ms: f64,
}

/// The cluster and the pods, built once and copied for every run.
pub struct Setup {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    kube_nodes: Vec<KubeNode>,
    dra_nodes: NodeTable,
    plugin_nodes: NodeTable,
    /// Per pod: its task asking for the class's devices, its claim, and the same pod as a
    /// device-plugin GPU request.
    pods: Vec<(Task, ResourceClaimSpec, Task)>,
    find: usize,
}

fn slice(node: &str) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            serde_json::json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "index": {"int": i},
                    "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                    "architecture": {"string": "Ampere"},
                    "numaNode": {"int": i / 4},
                    "resource.kubernetes.io/pcieRoot": {"string": if i < 4 { "pci0000:00" } else { "pci0000:80" }},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {
            "driver": CLASS,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))
    .expect("a well-formed slice")
}

fn claim(count: u32, one_root: bool) -> ResourceClaimSpec {
    let constraints = if one_root {
        serde_json::json!([{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    } else {
        serde_json::json!([])
    };
    serde_json::from_value(serde_json::json!({
        "devices": {
            "requests": [{
                "name": "gpus",
                "exactly": {
                    "deviceClassName": CLASS,
                    "count": count,
                    "selectors": [{"cel": {"expression":
                        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}],
                },
            }],
            "constraints": constraints,
        },
    }))
    .expect("a well-formed claim")
}

impl Setup {
    /// `nodes` nodes of 8 GPUs and `pods` pods of 1, 2, 4 or 8 GPUs (a quarter of those asking 2
    /// or 4 under one PCIe root), a third of the cluster's GPUs asked in all.
    pub fn new(nodes: usize, pods: usize, find: usize, seed: u64) -> Setup {
        let mut rng = Rng::new(seed);
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();
        let slices = names.iter().map(|n| slice(n)).collect();
        let classes = vec![
            serde_json::from_value(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": CLASS},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
            }))
            .expect("a well-formed class"),
        ];
        let kube_nodes = names
            .iter()
            .map(|n| KubeNode {
                metadata: ObjectMeta { name: Some(n.clone()), ..Default::default() },
                ..Default::default()
            })
            .collect();
        let node = |name: &str, extended: Vec<(wasmsched_api::ResourceName, u64)>, gpus: u32| Node {
            name: name.into(),
            allocatable: Resources {
                cpu_milli: 128_000,
                memory_bytes: 1 << 40,
                gpu_milli: u64::from(gpus * GPU_MILLI),
                extended: extended.into(),
            },
            gpus: crate::bench::gpu_devices("A100-SXM4-80GB", gpus).into(),
            ..Default::default()
        };
        let (mut dra_nodes, mut plugin_nodes) = (NodeTable::new(), NodeTable::new());
        for n in &names {
            dra_nodes.upsert(node(n, vec![(class_resource(CLASS), 8)], 0));
            plugin_nodes.upsert(node(n, Vec::new(), 8));
        }
        let pods = (0..pods)
            .map(|i| {
                let count = *rng.pick(&[1u32, 1, 2, 2, 4, 8]);
                let one_root = (count == 2 || count == 4) && rng.below(2) == 0;
                let base = crate::bench::cpu_memory_pod(&mut rng, i);
                let mut dra = base.clone();
                dra.request.extended = vec![(class_resource(CLASS), u64::from(count))].into();
                let plugin = Task { gpu: GpuRequest { count, milli_per_gpu: GPU_MILLI, ..Default::default() }, ..base };
                (dra, claim(count, one_root), plugin)
            })
            .collect();
        Setup { slices, classes, kube_nodes, dra_nodes, plugin_nodes, pods, find }
    }

    /// Places every pod through its claim (or, without `allocate`, by the class's count alone), on
    /// a fresh copy of the cluster.
    fn run_dra(&self, set: &PolicySet, allocate: bool) -> DraOutcome {
        let set = &set.with_fresh_verdicts();
        let mut table = self.dra_nodes.clone();
        set.catch_up(&table, usize::MAX);
        let t = Instant::now();
        let (inventory, _) = Inventory::from_slices(&self.slices);
        let mut allocator = Allocator::new(inventory, self.classes.iter().cloned());
        let inventory_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let (mut placed, mut retries, mut start, mut asked) = (0, 0, 0, 0);
        let total = table.len().max(1);
        let ranks = set.ranks_claim_devices();
        for (task, spec, _) in &self.pods {
            // Copied only when a retry keeps it off a node (the device-plugin run copies none).
            let mut task = std::borrow::Cow::Borrowed(task);
            for attempt in 0..=RETRIES {
                let sampled = place_sampled(set, &table, &task, 0, start, self.find);
                start = (start + sampled.examined) % total;
                let Ok(p) = sampled.result else { break };
                let node = &self.kube_nodes[p.node as usize];
                if !allocate {
                    if matches!(table.update_usage(p.node, |n| bind(n, &task, &p.devices)), Some(Ok(()))) {
                        placed += 1;
                    }
                    break;
                }
                let name = node.metadata.name.as_deref().unwrap_or_default();
                let mut rank =
                    |request: &wasmsched_api::ClaimRequest| set.rank_claim_devices(&table, &task, name, request);
                let rank: Option<&mut wasmsched_dra::allocator::Rank> = ranks.then_some(&mut rank);
                match allocator.allocate_ranked(spec, node, rank) {
                    Ok(a) => {
                        allocator.hold(&a, true);
                        if matches!(table.update_usage(p.node, |n| bind(n, &task, &p.devices)), Some(Ok(()))) {
                            placed += 1;
                            asked += a.results.len();
                        }
                        break;
                    }
                    Err(_) if attempt < RETRIES => {
                        retries += 1;
                        let name = node.metadata.name.clone().unwrap_or_default();
                        avoid(task.to_mut(), name);
                    }
                    Err(_) => {}
                }
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        let inventory = allocator.inventory();
        let held = inventory.devices().iter().filter(|d| inventory.is_in_use(&d.id)).count();
        DraOutcome { placed, retries, seconds, held, asked, inventory_ms }
    }

    /// Places every pod as a device-plugin GPU request: (placed, s).
    fn run_plugin(&self, set: &PolicySet) -> (usize, f64) {
        let set = &set.with_fresh_verdicts();
        let mut table = self.plugin_nodes.clone();
        set.catch_up(&table, usize::MAX);
        let t = Instant::now();
        let (mut placed, mut start) = (0, 0);
        let total = table.len().max(1);
        for (_, _, task) in &self.pods {
            let sampled = place_sampled(set, &table, task, 0, start, self.find);
            start = (start + sampled.examined) % total;
            if let Ok(p) = sampled.result
                && matches!(table.update_usage(p.node, |n| bind(n, task, &p.devices)), Some(Ok(())))
            {
                placed += 1;
            }
        }
        (placed, t.elapsed().as_secs_f64())
    }

    /// Both paths `repeat` times, alternating; the median of each.
    pub fn measure(&self, set: &PolicySet, runtime: &'static str, repeat: usize) -> DraRun {
        let (mut dra, mut plugin, mut counted, mut inventory) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut last, mut twice) = ((0, 0, 0), 0);
        let rate = |s: f64| self.pods.len() as f64 / s.max(1e-9);
        for _ in 0..repeat.max(1) {
            let o = self.run_dra(set, true);
            dra.push(rate(o.seconds));
            inventory.push(o.inventory_ms);
            let (plugin_placed, s) = self.run_plugin(set);
            plugin.push(rate(s));
            counted.push(rate(self.run_dra(set, false).seconds));
            last = (o.placed, o.retries, plugin_placed);
            twice = twice.max(o.asked - o.held);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (d, p, c) = (median(dra), median(plugin), median(counted));
        DraRun {
            runtime,
            nodes: self.kube_nodes.len(),
            pods: self.pods.len(),
            dra_pods_per_second: d,
            plugin_pods_per_second: p,
            counted_pods_per_second: c,
            dra_over_plugin: d / p,
            dra_over_counted: d / c,
            inventory_ms: median(inventory),
            dra_placed: last.0,
            plugin_placed: last.2,
            dra_retries: last.1,
            devices_given_twice: twice,
        }
    }
}

/// Keeps `task` off `node` from now on.
fn avoid(task: &mut Task, node: String) {
    let term = match task.node_affinity.required.first_mut() {
        Some(t) => t,
        None => {
            task.node_affinity.required.push(NodeSelectorTerm::default());
            &mut task.node_affinity.required[0]
        }
    };
    match term.match_fields.iter_mut().find(|r| r.operator == SelectorOperator::NotIn) {
        Some(r) => r.values.push(node),
        None => term.match_fields.push(SelectorRequirement {
            key: NODE_NAME_FIELD.into(),
            operator: SelectorOperator::NotIn,
            values: vec![node],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_is_placed_both_ways_and_no_device_is_given_twice() {
        let setup = Setup::new(40, 120, 40, 3);
        let set = crate::policy::policy_set(None, "least-allocated", 3, &[]).unwrap();
        let run = setup.measure(&set, "native", 1);
        // 120 pods ask about 400 of 320 GPUs: both paths fill the cluster alike.
        assert!(run.dra_placed > 60 && run.plugin_placed > 60, "{run:?}");
        assert!(run.dra_placed.abs_diff(run.plugin_placed) <= run.plugin_placed / 10, "{run:?}");
        assert_eq!(run.devices_given_twice, 0);
        // Every device an allocation names is held, none by two: as many held as named.
        let o = setup.run_dra(&set, true);
        assert_eq!(o.placed, run.dra_placed, "deterministic");
        assert_eq!(o.held, o.asked);
        assert!(o.asked >= o.placed);
    }
}
