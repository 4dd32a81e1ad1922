//! DRA on the Kubernetes path at scale, against the fake API server (a mock at the HTTP boundary;
//! see `tests/all/support/fake_api.rs`): pods placed per second when their GPUs are DRA devices
//! (ResourceSlices of 8 GPUs per node, a ResourceClaim with a CEL selector per pod, a quarter of
//! them with a `matchAttribute` constraint), next to the same pods asking `nvidia.com/gpu` of
//! device-plugin nodes, and the DRA pods again with the dashboard's view built every second (every
//! node's devices and their holders included), in one run.
//!
//! `cargo bench -p wasmsched-kube --bench dra_scale [-- NODES PENDING]` (`RUST_LOG=wasmsched_kube=info`
//! shows each bind).

#![allow(clippy::print_stdout)]

#[path = "../tests/all/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_api::{FakeApi, Kind, gpu_node, pod};
use tokio::sync::watch;
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::{Scheduler, SchedulerConfig, policy};
use wasmsched_registry::Preparer;
use wasmsched_runtime::{Runtime, RuntimeConfig};

const DRIVER: &str = "gpu.nvidia.com";

/// A slice of 8 GPUs on `node`, two NVLink domains of four (a `pcieRoot` each).
fn slice(node: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "index": {"int": i},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "resource.kubernetes.io/pcieRoot": {"string": format!("pci0000:{:02x}", i / 4)}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    json!({"metadata": {"name": format!("{node}-{DRIVER}")},
           "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices}})
}

/// Claim `i`: 1 or 2 H100s of at least 40 GiB; every fourth under one PCIe root.
fn claim(i: usize) -> Value {
    let selector = format!(
        "device.attributes['{DRIVER}'].productName.startsWith('NVIDIA H100') && device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0"
    );
    let mut c = json!({"metadata": {"name": format!("c-{i}"), "namespace": "bench"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu", "count": 1 + i % 2, "selectors": [{"cel": {"expression": selector}}]}}]}}});
    if i % 4 == 3 {
        c["spec"]["devices"]["constraints"] =
            json!([{"requests": ["gpus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]);
    }
    c
}

/// Places `pending` pods on `nodes` nodes with the default policy; pods placed per second from the
/// first bind to the last.
async fn run(nodes: usize, pending: usize, dra: bool, dashboard: bool) -> f64 {
    let api = FakeApi::new();
    for n in 0..nodes {
        let name = format!("node-{n}");
        api.put(Kind::Node, gpu_node(&name, if dra { 0 } else { 8 }, &[]));
        if dra {
            api.put(Kind::ResourceSlice, slice(&name));
        }
    }
    if dra {
        api.put(
            Kind::DeviceClass,
            json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}}),
        );
    }
    for i in 0..pending {
        let gpus = 1 + (i % 2) as u32;
        let mut p = pod("bench", &format!("p-{i}"), "wasmsched", if dra { 0 } else { gpus }, "1", "4Gi");
        if dra {
            api.put(Kind::ResourceClaim, claim(i));
            p["spec"]["resourceClaims"] = json!([{"name": "gpus", "resourceClaimName": format!("c-{i}")}]);
        }
        api.put(Kind::Pod, p);
    }
    let preparer =
        Preparer::new(Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()), wasmsched_plugins::table().collect());
    let registry = policy::registry(&preparer, &policy::default_policy(), None, 0).unwrap();
    let metrics = Metrics::new("wasmsched");
    let rate = wasmsched_kube::ClientRate { qps: 0.0, burst: 1 };
    let mut scheduler =
        Scheduler::new(api.clients("bench", Some(rate)), registry, metrics, SchedulerConfig::new("wasmsched"));
    if dashboard {
        scheduler = scheduler.with_dashboard(wasmsched_dashboard::Publisher::new());
    }
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(scheduler.run(stopped));
    while api.state().binds.is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = Instant::now();
    let deadline = first + Duration::from_secs(600);
    while api.state().binds.len() < pending && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = first.elapsed();
    let bound = api.binds().iter().filter(|b| b.status == 201).count();
    let _ = stop.send(true);
    let _ = task.await;
    if dra {
        // Every device in one claim at most.
        let mut seen = std::collections::BTreeSet::new();
        for c in api.objects(Kind::ResourceClaim) {
            for r in c["status"]["allocation"]["devices"]["results"].as_array().into_iter().flatten() {
                let id = format!("{}/{}", r["pool"], r["device"]);
                assert!(seen.insert(id.clone()), "device {id} allocated twice");
            }
        }
    }
    let rate = bound as f64 / took.as_secs_f64();
    println!(
        "{}: {bound}/{pending} pods bound in {:.2} s after the first = {rate:.0} pods/s",
        match (dra, dashboard) {
            (true, false) => "DRA claims (CEL selector, a quarter matchAttribute)",
            (true, true) => "the same, dashboard view built every second",
            _ => "nvidia.com/gpu (device plugin)",
        },
        took.as_secs_f64()
    );
    rate
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nodes = args.first().copied().unwrap_or(5_000);
    let pending = args.get(1).copied().unwrap_or(2_000);
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        println!("{nodes} nodes of 8 GPUs, {pending} pending pods of 1-2 GPUs, default (Wasm) policy, no API latency");
        let classic = run(nodes, pending, false, false).await;
        let dra = run(nodes, pending, true, false).await;
        let shown = run(nodes, pending, true, true).await;
        println!("DRA / device plugin: {:.2}x; DRA with the dashboard / without: {:.2}", dra / classic, shown / dra);
    });
}
