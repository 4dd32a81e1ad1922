//! What domains beyond the node cost per decision at 5,000 nodes in 100 NVLink domains (50 nodes
//! each, 10 blocks): the `domain-packing` score over every node (one `domains` host call per
//! distinct domain) against `least-allocated` on the same nodes, native and Wasm; and a bind and
//! release on the node table with the two levels kept against none. Results in BENCHMARKS.md.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

mod support;

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_api::{DeviceShare, GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_core::{CallContext, NativePlugin, NodeTable, PolicyPlugin, bind, release};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_domain_packing::DomainPacking;
use wasmsched_runtime::{Runtime, RuntimeConfig};

const NODES: usize = 5000;
const DOMAINS: usize = 100;

fn cluster(levels: bool) -> NodeTable {
    let mut table = NodeTable::new();
    if levels {
        table.set_levels(vec!["nvidia.com/gpu.clique".into(), "example.com/block".into()]);
    }
    for i in 0..NODES {
        let domain = i % DOMAINS;
        // Some domains whole, the others partly used.
        let used = if domain.is_multiple_of(3) { 0 } else { (i % 5) as u32 };
        table.upsert(Node {
            name: format!("node-{i}"),
            labels: vec![
                ("example.com/block".into(), format!("block-{}", domain / 10)),
                ("nvidia.com/gpu.clique".into(), format!("clique-{domain}")),
            ],
            allocatable: Resources {
                cpu_milli: 128_000,
                memory_bytes: 1 << 40,
                gpu_milli: 4000,
                extended: Default::default(),
            },
            allocated: Resources { gpu_milli: u64::from(used) * 1000, ..Default::default() },
            gpus: (0..4u32)
                .map(|g| GpuDevice { index: g, free_milli: if g < used { 0 } else { 1000 }, ..Default::default() })
                .collect(),
            ..Default::default()
        });
    }
    table
}

fn task() -> Task {
    Task {
        id: "small".into(),
        request: Resources { gpu_milli: 1000, ..Default::default() },
        gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    }
}

fn score(c: &mut Criterion) {
    let table = cluster(true);
    let slots: Vec<u32> = table.slots().collect();
    let task = task();
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let load = |b| support::load(&rt, b);
    let least = wasmsched_plugins::LEAST_ALLOCATED;
    let plugins: Vec<(&str, &str, Arc<dyn PolicyPlugin>)> = vec![
        ("domain-packing", "native", Arc::new(NativePlugin::<DomainPacking>::new("", 1).unwrap())),
        ("domain-packing", "wasm", load(wasmsched_plugins::DOMAIN_PACKING)),
        ("least-allocated", "native", Arc::new(NativePlugin::<AllocationScore>::new(least.config, 1).unwrap())),
        ("least-allocated", "wasm", load(least)),
    ];
    let mut g = c.benchmark_group("domain_score_5000");
    g.throughput(Throughput::Elements(NODES as u64));
    let ctx = CallContext { worker: 0, nodes: &table };
    for (plugin, kind, p) in &plugins {
        // The answers differ between whole and broken domains: the score reads the domains.
        let scores = p.score(ctx, &task, &slots).unwrap();
        if *plugin == "domain-packing" {
            assert!(scores[0] < scores[1], "{kind}: {:?}", &scores[..3]);
        }
        g.bench_function(BenchmarkId::new(*plugin, kind), |b| b.iter(|| p.score(ctx, &task, &slots).unwrap()));
    }
    g.finish();
}

fn bind_release(c: &mut Criterion) {
    let task = task();
    let devices = [DeviceShare { gpu: 3, milli: 1000 }];
    let mut g = c.benchmark_group("bind_release_5000");
    for (name, levels) in [("no-levels", false), ("two-levels", true)] {
        let mut table = cluster(levels);
        let slot = table.slot_of("node-1").unwrap();
        g.bench_function(name, |b| {
            b.iter(|| {
                table.update_usage(slot, |n| bind(n, &task, &devices)).unwrap().unwrap();
                table.update_usage(slot, |n| release(n, &task, &devices));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, score, bind_release);
criterion_main!(benches);
