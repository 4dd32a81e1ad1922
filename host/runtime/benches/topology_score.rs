//! The added cost of topology-aware scoring inside a scheduling cycle: a 4-GPU task scored over
//! 5,000 eight-GPU nodes (H100 NVSwitch, DGX-1 cube-mesh and PCIe topologies, random free GPUs) by
//! `gpu-topology` (one host `best-gpus` call per node), against `least-allocated` on the same nodes
//! as the no-topology baseline; native and Wasm. Results in BENCHMARKS.md.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

mod support;

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_core::{CallContext, NativePlugin, NodeTable, PolicyPlugin};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_gpu_topology::GpuTopology;
use wasmsched_runtime::{Runtime, RuntimeConfig};

const NODES: usize = 5000;

fn fixture(name: &str) -> wasmsched_topology::NodeTopology {
    let path = format!("{}/../topology/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    wasmsched_topology::smi::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cluster() -> NodeTable {
    let kinds = [
        fixture("h100-sxm-8gpu-nv18.txt"),
        fixture("dgx1v-8gpu-nv1-nv2-cube-mesh.txt"),
        fixture("pcie-8gpu-node-sys.txt"),
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut table = NodeTable::new();
    for i in 0..NODES {
        let free = next() as u8;
        let name = format!("node-{i}");
        table.upsert(Node {
            name: name.clone(),
            allocatable: Resources {
                cpu_milli: 128_000,
                memory_bytes: 1 << 40,
                gpu_milli: 8000,
                extended: Default::default(),
            },
            gpus: (0..8u32)
                .map(|g| GpuDevice {
                    index: g,
                    free_milli: if free >> g & 1 == 1 { 1000 } else { 0 },
                    numa_node: Some(g / 4),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        table.topologies_mut().insert(&name, kinds[i % kinds.len()].clone());
    }
    table
}

fn score(c: &mut Criterion) {
    let table = cluster();
    let slots: Vec<u32> = table.slots().collect();
    let task = Task {
        id: "job".into(),
        gpu: GpuRequest { count: 4, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    };
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let load = |b| support::load(&rt, b);
    let least = wasmsched_plugins::LEAST_ALLOCATED;
    let plugins: Vec<(&str, &str, Arc<dyn PolicyPlugin>)> = vec![
        ("gpu-topology", "native", Arc::new(NativePlugin::<GpuTopology>::new("", 1).unwrap())),
        ("gpu-topology", "wasm", load(wasmsched_plugins::GPU_TOPOLOGY)),
        ("least-allocated", "native", Arc::new(NativePlugin::<AllocationScore>::new(least.config, 1).unwrap())),
        ("least-allocated", "wasm", load(least)),
    ];
    let mut g = c.benchmark_group("topology_score_5000");
    g.throughput(Throughput::Elements(NODES as u64));
    let ctx = CallContext { worker: 0, nodes: &table };
    for (plugin, kind, p) in &plugins {
        g.bench_function(BenchmarkId::new(*plugin, kind), |b| b.iter(|| p.score(ctx, &task, &slots).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, score);
criterion_main!(benches);
