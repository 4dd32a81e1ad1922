//! What a policy costs in each language, in one run: the same policy in Rust (native and as a
//! component), in Python (componentize-py) and in JavaScript (componentize-js), for three stages:
//!
//! - score: `gpu-model-affinity` (`examples/plugins/gpu-model-affinity{,-py,-js}`), one task
//!   over 5,000 generated nodes in one batched call;
//! - filter: `gpu-model-filter` (`examples/plugins/gpu-model-filter{,-py,-js}`), the same;
//! - fair share: the built-in `fair-share` (`plugins/fair-share`, and its ports
//!   `examples/plugins/fair-share-{py,js}`), a tree of 1,000 queues, whole (`compute`) and after
//!   one queue changed (what the host sends within a cycle: `compute-changed`).
//!
//! Each language's answers are checked equal to the native build's first. Printed first, measured
//! once per component: its size, compile time, load time from the compiled-artefact cache (the
//! second start), and the smallest memory cap its instance starts under.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_api::{QueueState, Resources};
use wasmsched_core::{CallContext, NativePlugin, PolicyPlugin};
use wasmsched_example_gpu_model_affinity::GpuModelAffinity;
use wasmsched_example_gpu_model_filter::GpuModelFilter;
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig};
use wasmsched_sim::generate::{self, Rng};
use wasmsched_tests::{fixtures, javascript, python};

const NODES: usize = 5000;
const QUEUES: usize = 1000;
const CONFIG: &str = "A10,V100M32,T4";

/// A generous deadline: this measures cost, and a call over the default budget must still finish.
/// JavaScript's heap needs more than the default 64 MiB (see `sdk/js/README.md`).
fn config(name: &str, policy: &str) -> PluginConfig {
    let config = PluginConfig::new(name).with_config(policy).with_deadline(Duration::from_secs(2));
    if name.starts_with("javascript") { config.with_memory_limit(256 << 20) } else { config }
}

/// Size, compile time, cached load time and the smallest memory cap (MiB) of a component.
fn start_costs(name: &str, wasm: &[u8], policy: &str) {
    let cache = tempfile::tempdir().unwrap();
    let cached =
        || Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() });
    let t = Instant::now();
    cached().unwrap().load(wasm, config(name, policy)).unwrap();
    let compile = t.elapsed();
    let t = Instant::now();
    cached().unwrap().load(wasm, config(name, policy)).unwrap();
    let load = t.elapsed();
    // The smallest cap (in MiB) under which the instance starts and initialises.
    let rt = cached().unwrap();
    let starts =
        |mib: usize| rt.load(wasm, PluginConfig::new(name).with_config(policy).with_memory_limit(mib << 20)).is_ok();
    let (mut low, mut high) = (1usize, 1024usize);
    while low < high {
        let mid = (low + high) / 2;
        if starts(mid) { high = mid } else { low = mid + 1 }
    }
    eprintln!(
        "{name}: {:.1} MB, compile {:.2} s, cached load {:.0} ms, starts under a {low} MiB memory cap",
        wasm.len() as f64 / 1e6,
        compile.as_secs_f64(),
        load.as_secs_f64() * 1e3
    );
}

/// The Rust component and the Python and JavaScript apps of one example, read or built.
fn components(rust: &[u8], example: &str) -> [(&'static str, Vec<u8>); 3] {
    let dir = python::root().join("examples/plugins");
    let python = std::fs::read(python::component(&dir.join(format!("{example}-py")))).unwrap();
    let js = std::fs::read(javascript::component(&dir.join(format!("{example}-js")))).unwrap();
    [("rust-wasm", rust.to_vec()), ("python-wasm", python), ("javascript-wasm", js)]
}

/// `native` and the three components of an example, loaded; start costs printed for each.
fn plugins(
    rt: &Runtime,
    native: Arc<dyn PolicyPlugin>,
    rust: &[u8],
    example: &str,
    policy: &str,
) -> Vec<(&'static str, Arc<dyn PolicyPlugin>)> {
    let mut out = vec![("native", native)];
    for (name, wasm) in components(rust, example) {
        start_costs(&format!("{example} {name}"), &wasm, policy);
        out.push((name, Arc::new(rt.load(&wasm, config(name, policy)).unwrap())));
    }
    out
}

fn nodes_stages(c: &mut Criterion, rt: &Runtime) {
    let mut rng = Rng::new(7);
    let table = generate::cluster(&mut rng, NODES);
    let slots: Vec<u32> = table.slots().collect();
    let task = wasmsched_api::Task {
        id: "bench".into(),
        gpu: wasmsched_api::GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    };
    let ctx = CallContext { worker: 0, nodes: &table };

    let rust = fixtures::read(fixtures::GPU_MODEL_AFFINITY);
    let native = Arc::new(NativePlugin::<GpuModelAffinity>::new(CONFIG, 1).unwrap());
    let scorers = plugins(rt, native, &rust, "gpu-model-affinity", CONFIG);
    let expected = scorers[0].1.score(ctx, &task, &slots).unwrap();
    for (name, p) in &scorers {
        assert_eq!(p.score(ctx, &task, &slots).unwrap(), expected, "{name} scores as the native build");
    }
    let mut group = c.benchmark_group("score_5000");
    group.throughput(Throughput::Elements(NODES as u64));
    for (name, p) in &scorers {
        group.bench_with_input(BenchmarkId::from_parameter(name), p, |b, p| {
            b.iter(|| p.score(ctx, &task, &slots).unwrap().len())
        });
    }
    group.finish();

    let rust = fixtures::read(fixtures::GPU_MODEL_FILTER);
    let native = Arc::new(NativePlugin::<GpuModelFilter>::new(CONFIG, 1).unwrap());
    let filters = plugins(rt, native, &rust, "gpu-model-filter", CONFIG);
    // Every node is answered (`filter`: no early stop once enough fit).
    let expected = filters[0].1.filter(ctx, &task, &slots).unwrap();
    let fits = expected.codes.iter().filter(|&&c| c == 0).count();
    assert!(fits > 0 && fits < NODES, "a filter that admits some nodes and refuses others: {fits}");
    for (name, p) in &filters {
        assert_eq!(p.filter(ctx, &task, &slots).unwrap(), expected, "{name} filters as the native build");
    }
    let mut group = c.benchmark_group("filter_5000");
    group.throughput(Throughput::Elements(NODES as u64));
    for (name, p) in &filters {
        group.bench_with_input(BenchmarkId::from_parameter(name), p, |b, p| {
            b.iter(|| p.filter(ctx, &task, &slots).unwrap().codes.len())
        });
    }
    group.finish();
}

fn resources(rng: &mut Rng, scale: u64) -> Resources {
    Resources {
        cpu_milli: rng.below(scale * 1000),
        memory_bytes: rng.below(scale << 30),
        gpu_milli: rng.below(scale * 1000),
        extended: Default::default(),
    }
}

/// A tree of `n` queues under 10 departments (a common shape: teams under organisations), every
/// team with pending work.
fn queue_tree(rng: &mut Rng, n: usize) -> Vec<QueueState> {
    (0..n)
        .map(|i| {
            let allocated = resources(rng, 8);
            let mut request = resources(rng, 16);
            request.gpu_milli += allocated.gpu_milli + 1000;
            QueueState {
                name: format!("q{i:04}"),
                parent: (i >= 10).then(|| rng.below(10) as u32),
                weight: 1 + rng.below(4) as u32,
                guarantee: resources(rng, 1),
                capability: rng.percent(30).then(|| resources(rng, 40)),
                allocated,
                request,
                decayed_usage: rng.below(1_000_000) as f64,
                reclaimable: true,
            }
        })
        .collect()
}

fn fair_share(c: &mut Criterion, rt: &Runtime) {
    let builtin = wasmsched_plugins::PROPORTION;
    let native = Arc::new(NativePlugin::<FairSharePolicy>::new(builtin.config, 1).unwrap());
    let sharers = plugins(rt, native, builtin.wasm, "fair-share", builtin.config);
    let mut rng = Rng::new(9);
    let mut queues = queue_tree(&mut rng, QUEUES);
    let cluster = resources(&mut rng, 4 * QUEUES as u64);
    let expected = sharers[0].1.fair_share(0, &queues, &cluster).unwrap();
    for (name, p) in &sharers {
        assert_eq!(p.fair_share(0, &queues, &cluster).unwrap(), expected, "{name} shares as the native build");
    }
    let mut group = c.benchmark_group("fair_share_1000");
    group.throughput(Throughput::Elements(QUEUES as u64));
    for (name, p) in &sharers {
        // The same tree every call: after the first, the host sends no queue state.
        group.bench_with_input(BenchmarkId::new("unchanged", name), p, |b, p| {
            b.iter(|| p.fair_share(0, &queues, &cluster).unwrap().order.len())
        });
    }
    for (name, p) in &sharers {
        // One leaf's allocation moves per call, as when a cycle binds a task.
        let mut at = 0u64;
        group.bench_function(BenchmarkId::new("one-changed", name), |b| {
            b.iter(|| {
                at += 1;
                let q = 10 + (at as usize % (QUEUES - 10));
                queues[q].allocated.gpu_milli = at % 4000;
                p.fair_share(0, &queues, &cluster).unwrap().order.len()
            })
        });
    }
    group.finish();
}

fn languages(c: &mut Criterion) {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    nodes_stages(c, &rt);
    fair_share(c, &rt);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = languages
}
criterion_main!(benches);
