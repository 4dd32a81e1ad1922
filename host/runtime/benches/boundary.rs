//! The cost of the Wasm boundary, measured against the same policies compiled natively.
//!
//! - `filter_score_5000/*`: one task, resource-fit filter + least-allocated score over 5,000 random
//!   nodes (one batched call per stage), native vs Wasm, with the mirror already current
//!   (`steady`) and with one node changed before every task (`one_delta`, as after a bind).
//! - `mirror_catch_up/{full,usage}/N`: N nodes changed (any change / usage only), then one filter
//!   call on one node: what a mirror's catch-up costs.
//! - `instantiate`: a fresh instance from `InstancePre`, including the plugin's `init`.
//! - `load/*`: `Runtime::load` with the compiled component in memory, on disk, or compiled anew.
//!
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]
//! Numbers in BENCHMARKS.md were taken on the project's 2-core CI machine (see that file).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_core::{CallContext, NativePlugin, NodeTable, PolicyPlugin};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig, WasmPlugin};
use wasmsched_sim::generate::{self, Rng};

const NODES: usize = 5000;

type Plugin = Arc<dyn PolicyPlugin>;

/// A generous deadline: this measures throughput, and a descheduled benchmark thread must not
/// turn into a deadline fault.
fn wasm(rt: &Runtime, b: wasmsched_plugins::BuiltIn) -> WasmPlugin {
    rt.load(b.wasm, PluginConfig::new(b.name).with_config(b.config).with_deadline(Duration::from_secs(1))).unwrap()
}

/// Filter all nodes, then score the feasible ones: one task's placement work.
fn filter_then_score(
    filter: &dyn PolicyPlugin,
    score: &dyn PolicyPlugin,
    table: &NodeTable,
    slots: &[u32],
    task: &wasmsched_api::Task,
) -> usize {
    let ctx = CallContext { worker: 0, nodes: table };
    let batch = filter.filter(ctx, task, slots).unwrap();
    let feasible: Vec<u32> = slots.iter().zip(&batch.codes).filter(|(_, c)| **c == 0).map(|(s, _)| *s).collect();
    score.score(ctx, task, &feasible).unwrap().len()
}

fn boundary(c: &mut Criterion) {
    let mut rng = Rng::new(7);
    let mut table = generate::cluster(&mut rng, NODES);
    // A task most nodes can take, so the score stage sees a full batch.
    let task = wasmsched_api::Task {
        id: "bench".into(),
        request: wasmsched_api::Resources { cpu_milli: 100, memory_bytes: 1 << 20, ..Default::default() },
        tolerations: vec![wasmsched_api::Toleration {
            operator: wasmsched_api::TolerationOperator::Exists,
            ..Default::default()
        }],
        ..Default::default()
    };
    let slots: Vec<u32> = table.slots().collect();
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let least = wasmsched_plugins::LEAST_ALLOCATED;
    let plugins: Vec<(&str, Plugin, Plugin)> = vec![
        (
            "native",
            Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()),
            Arc::new(NativePlugin::<AllocationScore>::new(least.config, 1).unwrap()),
        ),
        ("wasm", Arc::new(wasm(&rt, wasmsched_plugins::RESOURCE_FIT)), Arc::new(wasm(&rt, least))),
    ];

    // Each plugin alone: the per-node, per-plugin cost the issue targets.
    let mut g = c.benchmark_group("per_plugin_5000");
    g.throughput(Throughput::Elements(NODES as u64));
    let ctx = CallContext { worker: 0, nodes: &table };
    for (kind, filter, score) in &plugins {
        g.bench_function(BenchmarkId::new("filter", kind), |b| b.iter(|| filter.filter(ctx, &task, &slots).unwrap()));
        g.bench_function(BenchmarkId::new("score", kind), |b| b.iter(|| score.score(ctx, &task, &slots).unwrap()));
    }
    g.finish();

    let mut g = c.benchmark_group("filter_score_5000");
    g.throughput(Throughput::Elements(NODES as u64));
    for (kind, filter, score) in &plugins {
        g.bench_function(BenchmarkId::new("steady", kind), |b| {
            b.iter(|| filter_then_score(filter.as_ref(), score.as_ref(), &table, &slots, &task))
        });
        g.bench_function(BenchmarkId::new("one_delta", kind), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % slots.len();
                table.update(slots[i], |n| n.allocated.cpu_milli ^= 1);
                filter_then_score(filter.as_ref(), score.as_ref(), &table, &slots, &task)
            })
        });
    }
    g.finish();

    // What a policy version's sample costs the scheduling loop: a snapshot of the live table, and
    // the bind right after it (the first change to a node a snapshot still shares).
    let mut g = c.benchmark_group("node_table_5000");
    g.bench_function("snapshot", |b| b.iter(|| table.snapshot()));
    g.bench_function("snapshot_then_bind", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let snapshot = table.snapshot();
            i = (i + 1) % slots.len();
            table.update_usage(slots[i], |n| n.allocated.cpu_milli ^= 1);
            snapshot
        })
    });
    g.finish();

    // What a mirror costs to catch up: `changed` nodes changed since the last call, then a filter
    // call on one node (the first decision after a swap catches up on the decisions since that
    // version last ran). `full`: any change, the whole node is resent; `usage`: binds and releases,
    // only the allocation and device usage are sent (`mirror-usage`). Per node: (N=200 − N=0) / 200.
    let mut g = c.benchmark_group("mirror_catch_up");
    let (_, filter, _) = &plugins[1];
    for (kind, changed) in [("full", 0usize), ("full", 200), ("usage", 200)] {
        g.throughput(Throughput::Elements(changed.max(1) as u64));
        g.bench_function(BenchmarkId::new(kind, changed), |b| {
            let mut i = 0usize;
            b.iter(|| {
                for _ in 0..changed {
                    i = (i + 1) % slots.len();
                    match kind {
                        "full" => table.update(slots[i], |n| n.allocated.cpu_milli ^= 1),
                        _ => table.update_usage(slots[i], |n| n.allocated.cpu_milli ^= 1),
                    };
                }
                filter.filter(CallContext { worker: 0, nodes: &table }, &task, &slots[..1]).unwrap()
            })
        });
    }
    g.finish();

    let fit = wasm(&rt, wasmsched_plugins::RESOURCE_FIT);
    c.bench_function("instantiate", |b| {
        b.iter(|| {
            fit.clear_instances();
            fit.prewarm().unwrap();
        })
    });

    let mut g = c.benchmark_group("load");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    let bytes = wasmsched_plugins::RESOURCE_FIT.wasm;
    g.bench_function("memory_cached", |b| b.iter(|| rt.load(bytes, PluginConfig::new("fit")).unwrap()));
    let dir = std::env::temp_dir().join(format!("wasmsched-bench-cache-{}", std::process::id()));
    let disk = RuntimeConfig { cache_dir: Some(dir.clone()), ..Default::default() };
    Runtime::new(disk.clone()).unwrap().load(bytes, PluginConfig::new("fit")).unwrap();
    g.bench_function("disk_cached", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let fresh = Runtime::new(disk.clone()).unwrap();
                let t = Instant::now();
                fresh.load(bytes, PluginConfig::new("fit")).unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("uncached_compile", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let fresh = Runtime::new(RuntimeConfig::default()).unwrap();
                let t = Instant::now();
                fresh.load(bytes, PluginConfig::new("fit")).unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, boundary);
criterion_main!(benches);
