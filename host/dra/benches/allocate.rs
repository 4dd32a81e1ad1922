//! The DRA allocator's costs.
//!
//! - `cel/compile`, `cel/evaluate`: a two-clause selector (a string test and a quantity comparison)
//!   compiled, and evaluated on one device.
//! - `allocate/one_node_cached_verdicts`: a one-GPU claim on one 8-GPU node once every verdict is
//!   cached (what a retry of the same pod costs).
//! - `claim_on_5000_nodes/*`: a 4-GPU claim with a CEL selector, with and without a
//!   `matchAttribute` constraint (one PCIe root), prepared once and tried on every node of a 5,000-node cluster of
//!   8-GPU nodes published as ResourceSlices (a quarter of each node's GPUs held): what filtering a
//!   pod with a claim across the cluster costs.
//!
//! Results in BENCHMARKS.md.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimSpec, ResourceSlice};
use wasmsched_dra::selector::{DeviceValue, Environment};
use wasmsched_dra::{Allocator, Inventory, Selector};

const CLASS: &str = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
  "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}"#;

fn cluster(nodes: usize) -> (Vec<Node>, Vec<ResourceSlice>, Vec<ResourceClaim>) {
    let mut all_nodes = Vec::new();
    let mut slices = Vec::new();
    let mut claims = Vec::new();
    for n in 0..nodes {
        let name = format!("node-{n:05}");
        all_nodes.push(serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap());
        let devices: Vec<serde_json::Value> = (0..8)
            .map(|i| {
                serde_json::json!({"name": format!("gpu-{i}"), "attributes": {
                    "type": {"string": "gpu"}, "index": {"int": i},
                    "productName": {"string": if n % 2 == 0 { "NVIDIA A100-SXM4-80GB" } else { "NVIDIA H100 80GB HBM3" }},
                    "resource.kubernetes.io/pcieRoot": {"string": if i < 4 { "pci0000:00" } else { "pci0000:80" }}},
                  "capacity": {"memory": {"value": "80Gi"}}})
            })
            .collect();
        slices.push(
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("{name}-gpus")}, "spec": {
                "driver": "gpu.nvidia.com", "nodeName": name,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
            .unwrap(),
        );
        // A quarter of the GPUs held: gpu-(n % 4) and gpu-(4 + n % 4).
        claims.push(
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("held-{n}")},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "g", "driver": "gpu.nvidia.com", "pool": name, "device": format!("gpu-{}", n % 4)},
                    {"request": "g", "driver": "gpu.nvidia.com", "pool": name, "device": format!("gpu-{}", 4 + n % 4)}]}}}}))
            .unwrap(),
        );
    }
    (all_nodes, slices, claims)
}

fn claim(constraint: bool) -> ResourceClaimSpec {
    let mut spec = serde_json::json!({"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 4,
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100') && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]}}]}});
    if constraint {
        spec["devices"]["constraints"] = serde_json::json!([{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]);
    }
    serde_json::from_value(spec).unwrap()
}

fn allocator(slices: &[ResourceSlice], claims: &[ResourceClaim]) -> Allocator {
    let (mut inventory, _) = Inventory::from_slices(slices);
    inventory.hold_allocated(claims);
    Allocator::new(inventory, [serde_json::from_str::<DeviceClass>(CLASS).unwrap()])
}

fn benches(c: &mut Criterion) {
    let (nodes, slices, claims) = cluster(5_000);
    let one_gpu: ResourceClaimSpec = serde_json::from_value(serde_json::json!({"devices": {"requests": [{"name": "g",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression":
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]}}]}}))
    .unwrap();
    let (one_node, one_slice) = (&nodes[1], &slices[1..2]);
    let expression = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100') && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0";
    c.bench_function("cel/compile", |b| b.iter(|| black_box(Selector::compile(expression).is_ok())));
    let selector = Selector::compile(expression).unwrap();
    let env = Environment::default();
    let (inventory, _) = Inventory::from_slices(one_slice);
    let device = DeviceValue::new(&inventory.devices()[0]);
    c.bench_function("cel/evaluate", |b| b.iter(|| black_box(selector.matches(&env, &device))));
    let mut warm = allocator(one_slice, &[]);
    c.bench_function("allocate/one_node_cached_verdicts", |b| {
        b.iter(|| black_box(warm.allocate(&one_gpu, one_node).is_ok()))
    });
    c.bench_function("cel/footprint_of_a_device", |b| b.iter(|| black_box(selector.seen(&inventory.devices()[0]))));
    // Cold: a fresh allocator, no selector asked yet (what the first pods after a start or a
    // slice change pay); devices with the same footprint share one evaluation.
    let spec = claim(false);
    c.bench_function("claim_on_5000_nodes_cold/selector", |b| {
        b.iter_batched_ref(
            || allocator(&slices, &claims),
            |a| {
                let prepared = a.prepare(&spec).unwrap();
                nodes.iter().filter(|n| a.fits_now(&prepared, n).is_ok()).count()
            },
            criterion::BatchSize::LargeInput,
        )
    });
    for (name, constraint) in [("selector", false), ("selector+matchAttribute", true)] {
        let spec = claim(constraint);
        let mut a = allocator(&slices, &claims);
        // Prepared once (PreFilter), then tried on every node (Filter).
        c.bench_function(&format!("claim_on_5000_nodes/{name}"), |b| {
            b.iter(|| {
                let prepared = a.prepare(&spec).unwrap();
                nodes.iter().filter(|n| a.fits_now(&prepared, n).is_ok()).count()
            })
        });
    }
}

criterion_group! {
    name = allocate;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(allocate);
