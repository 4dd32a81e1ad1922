//! The Kubernetes path at scale, against the fake API server (a mock at the HTTP boundary; see
//! `tests/all/support/fake_api.rs`): cache memory and cold start at 5,000 nodes / 150,000 pods, and the
//! binds per second the scheduler issues with a realistic API latency.
//!
//! `cargo bench -p wasmsched-kube --bench kube_scale [-- NODES PODS PENDING BIND_LATENCY_MS OURS_PERCENT QPS]`
//!
//! `QPS` is the scheduler's client rate (`--kube-api-qps`, burst twice that); 0, the default
//! here, lifts the limit so the figure is the scheduler's own capacity.

#![allow(clippy::print_stdout)]

#[path = "../tests/all/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use support::fake_api::{FakeApi, Kind, gpu_node, pod};
use tokio::sync::watch;
use wasmsched_kube::cache::Cache;
use wasmsched_kube::convert::GPU_IDS_ANNOTATION;
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::{Scheduler, SchedulerConfig, policy};
use wasmsched_registry::Preparer;
use wasmsched_runtime::{Runtime, RuntimeConfig};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// Bound pod `i`: 30 per node, a quarter of them with 1–2 GPUs (recorded devices), like a busy
/// training cluster.
fn bound_pod(i: usize, nodes: usize, ours_percent: usize) -> Value {
    let node = i % nodes;
    let slot = i / nodes;
    let gpus = if slot < 4 { 1 + (slot % 2) as u32 } else { 0 };
    let scheduler = if i % 100 < ours_percent { "wasmsched" } else { "default-scheduler" };
    let mut p = pod(&format!("team-{}", i % 97), &format!("worker-{i}"), scheduler, gpus, "2", "8Gi");
    p["spec"]["nodeName"] = json!(format!("node-{node}"));
    p["status"]["phase"] = json!("Running");
    if gpus > 0 {
        let first = (slot * 2) as u32;
        let ids: Vec<String> = (first..first + gpus).map(|g| g.to_string()).collect();
        p["metadata"]["annotations"] = json!({ GPU_IDS_ANNOTATION: ids.join(",") });
    }
    p["metadata"]["uid"] = json!(format!("uid-{i}"));
    p
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nodes = args.first().copied().unwrap_or(5_000);
    let pods = args.get(1).copied().unwrap_or(150_000);
    let pending = args.get(2).copied().unwrap_or(2_000);
    let latency_ms = args.get(3).copied().unwrap_or(5) as u64;
    // Bound pods placed by this scheduler before a restart (taken over at start), in percent.
    let ours_percent = args.get(4).copied().unwrap_or(0).min(100);
    let qps = args.get(5).copied().unwrap_or(0);
    let rate = wasmsched_kube::ClientRate { qps: qps as f64, burst: (qps * 2).max(1) as u32 };

    // 1. The cache alone: objects converted and dropped one at a time, so the RSS growth is what
    //    the scheduler keeps.
    let node_objects: Vec<Node> =
        (0..nodes).map(|n| serde_json::from_value(gpu_node(&format!("node-{n}"), 8, &[])).unwrap()).collect();
    let pod_objects: Vec<Pod> =
        (0..pods).map(|i| serde_json::from_value(bound_pod(i, nodes, ours_percent)).unwrap()).collect();
    let before = rss_bytes();
    let started = Instant::now();
    let mut cache = Cache::new();
    for n in &node_objects {
        cache.apply_node(n).unwrap();
    }
    for p in &pod_objects {
        cache.apply_pod(p, "wasmsched").unwrap();
    }
    let ingest = started.elapsed();
    let cache_bytes = rss_bytes().saturating_sub(before);
    assert_eq!(cache.holders(), pods);
    drop((cache, node_objects, pod_objects));
    println!(
        "cache ingest: {nodes} nodes + {pods} pods in {:.2} s ({:.0} objects/s)",
        ingest.as_secs_f64(),
        (nodes + pods) as f64 / ingest.as_secs_f64()
    );
    println!(
        "cache memory: {:.1} MiB ({:.0} bytes per pod)",
        cache_bytes as f64 / 1048576.0,
        cache_bytes as f64 / pods as f64
    );

    // 2. Cold start through the API: list (over HTTP-shaped requests), watch, ready, first bind.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let api = FakeApi::new();
        for n in 0..nodes {
            api.put(Kind::Node, gpu_node(&format!("node-{n}"), 8, &[]));
        }
        for i in 0..pods {
            api.put(Kind::Pod, bound_pod(i, nodes, ours_percent));
        }
        for i in 0..pending {
            api.put(Kind::Pod, pod("bench", &format!("new-{i}"), "wasmsched", (i % 2) as u32, "1", "4Gi"));
        }
        api.state().bind_latency = Duration::from_millis(latency_ms);
        let preparer = Preparer::new(Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()), wasmsched_plugins::table().collect());
        let registry = policy::registry(&preparer, &policy::default_policy(), None, 0).unwrap();
        let metrics = Metrics::new("wasmsched");
        let scheduler = Scheduler::new(api.clients("bench", Some(rate)), registry, metrics.clone(), SchedulerConfig::new("wasmsched"));
        let (stop, stopped) = watch::channel(false);
        let started = Instant::now();
        let task = tokio::spawn(scheduler.run(stopped));
        while !metrics.is_ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ready = started.elapsed();
        while api.state().binds.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let first = started.elapsed();
        while api.state().binds.len() < pending {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let all = started.elapsed();
        let ok = api.binds().iter().filter(|b| b.status == 201).count();
        let serving = api.state().list_time;
        println!(
            "cold start (lists of {nodes} nodes + {} pods through the fake API): ready in {:.2} s, first bind at {:.2} s; \
             the fake API spent {:.2} s building the lists, so the scheduler's processing was {:.2} s",
            pods + pending,
            ready.as_secs_f64(),
            first.as_secs_f64(),
            serving.as_secs_f64(),
            (first.saturating_sub(serving)).as_secs_f64()
        );
        println!(
            "binds: {ok}/{pending} in {:.2} s after the first = {:.0} binds/s (API latency {latency_ms} ms, 16 in flight)",
            (all - first).as_secs_f64(),
            pending as f64 / (all - first).as_secs_f64()
        );
        let _ = stop.send(true);
        let _ = task.await;
    });
}
