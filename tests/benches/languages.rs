//! What a policy costs in each language: `gpu-model-affinity` in Rust (native and as a component)
//! in Python (`examples/plugins/gpu-model-affinity-py`, componentize-py) and in JavaScript
//! (`examples/plugins/gpu-model-affinity-js`, componentize-js), scoring one task over
//! 5,000 generated nodes in one batched call, in one run. Printed first, measured once each: the
//! component's size, its compile time, its load time from the compiled-artefact cache (the second
//! start), and the smallest memory cap its instance starts under.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_core::{CallContext, NativePlugin, PolicyPlugin};
use wasmsched_example_gpu_model_affinity::GpuModelAffinity;
use wasmsched_runtime::{PluginConfig, Runtime, RuntimeConfig};
use wasmsched_sim::generate::{self, Rng};
use wasmsched_tests::{fixtures, javascript, python};

const NODES: usize = 5000;
const CONFIG: &str = "A10,V100M32,T4";

/// A generous deadline: this measures cost, and a call over the default budget must still finish.
/// JavaScript's heap needs more than the default 64 MiB (see `sdk/js/README.md`).
fn config(name: &str) -> PluginConfig {
    let config = PluginConfig::new(name).with_config(CONFIG).with_deadline(Duration::from_secs(2));
    if name == "javascript" { config.with_memory_limit(256 << 20) } else { config }
}

/// Size, compile time, cached load time and the smallest memory cap (MiB) of a component.
fn start_costs(name: &str, wasm: &[u8]) {
    let cache = tempfile::tempdir().unwrap();
    let cached =
        || Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() });
    let t = Instant::now();
    cached().unwrap().load(wasm, config(name)).unwrap();
    let compile = t.elapsed();
    let t = Instant::now();
    cached().unwrap().load(wasm, config(name)).unwrap();
    let load = t.elapsed();
    // The smallest cap (in MiB) under which the instance starts and initialises.
    let rt = cached().unwrap();
    let starts =
        |mib: usize| rt.load(wasm, PluginConfig::new(name).with_config(CONFIG).with_memory_limit(mib << 20)).is_ok();
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

fn languages(c: &mut Criterion) {
    let rust = fixtures::read(fixtures::GPU_MODEL_AFFINITY);
    let python =
        std::fs::read(python::component(&python::root().join("examples/plugins/gpu-model-affinity-py"))).unwrap();
    let js =
        std::fs::read(javascript::component(&python::root().join("examples/plugins/gpu-model-affinity-js"))).unwrap();
    start_costs("rust", &rust);
    start_costs("python", &python);
    start_costs("javascript", &js);

    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let plugins: Vec<(&str, Arc<dyn PolicyPlugin>)> = vec![
        ("native", Arc::new(NativePlugin::<GpuModelAffinity>::new(CONFIG, 1).unwrap())),
        ("rust-wasm", Arc::new(rt.load(&rust, config("rust")).unwrap())),
        ("python-wasm", Arc::new(rt.load(&python, config("python")).unwrap())),
        ("javascript-wasm", Arc::new(rt.load(&js, config("javascript")).unwrap())),
    ];
    let mut rng = Rng::new(7);
    let table = generate::cluster(&mut rng, NODES);
    let slots: Vec<u32> = table.slots().collect();
    let task = wasmsched_api::Task {
        id: "bench".into(),
        gpu: wasmsched_api::GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    };
    let ctx = CallContext { worker: 0, nodes: &table };
    let expected = plugins[0].1.score(ctx, &task, &slots).unwrap();
    for (name, p) in &plugins {
        assert_eq!(p.score(ctx, &task, &slots).unwrap(), expected, "{name} scores as the native build");
    }
    let mut group = c.benchmark_group("score_5000");
    group.throughput(Throughput::Elements(NODES as u64));
    for (name, p) in &plugins {
        group.bench_with_input(BenchmarkId::from_parameter(name), p, |b, p| {
            b.iter(|| p.score(ctx, &task, &slots).unwrap().len())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = languages
}
criterion_main!(benches);
