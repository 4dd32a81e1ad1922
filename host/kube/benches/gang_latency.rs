//! How long a gang waits once it is complete: a 64-member Indexed Job on 1,000 nodes, against
//! the fake API server (a mock at the HTTP boundary; see `tests/all/support/fake_api.rs`). Its
//! first 63 pods exist (and wait); the time is from the 64th pod's creation to the last member
//! bound, over the Workload API (the Job controller's PodGroup, pods naming it) and over owner
//! grouping (pods owned by the Job, no PodGroup). Also the cost of owner resolution per pod.
//!
//! `cargo bench -p wasmsched-kube --bench gang_latency [-- NODES MEMBERS ROUNDS BIND_LATENCY_MS]`

#![allow(clippy::print_stdout)]

#[path = "../tests/all/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_api::{FakeApi, Kind, gpu_node, pod};
use tokio::sync::watch;
use wasmsched_kube::groups::owners::{self, OwnerRef, OwnerTable, Owners};
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::{Scheduler, SchedulerConfig, policy};
use wasmsched_registry::Preparer;
use wasmsched_runtime::{Runtime, RuntimeConfig};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    WorkloadApi,
    Owner,
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str, controller: bool) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller})
}

/// Member `i` of Indexed Job `job`, as the Job controller creates it.
fn member(job: &str, i: usize, path: Path, pod_group: &str) -> Value {
    let uid = format!("{job}-uid");
    let mut p = pod("bench", &format!("{job}-{i}-x"), "wasmsched", 8, "8", "64Gi");
    let mut owners = vec![owner("Job", "batch/v1", job, &uid, true)];
    if path == Path::WorkloadApi {
        owners.push(owner("PodGroup", "scheduling.k8s.io/v1alpha2", pod_group, "pg-uid", false));
        p["spec"]["schedulingGroup"] = json!({"podGroupName": pod_group});
    }
    p["metadata"]["ownerReferences"] = json!(owners);
    p["metadata"]["labels"] = json!({"batch.kubernetes.io/job-name": job, "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-completion-index": i.to_string()});
    p
}

fn job_objects(api: &FakeApi, job: &str, members: usize, path: Path) -> String {
    let uid = format!("{job}-uid");
    api.put(
        Kind::Job,
        json!({"metadata": {"name": job, "namespace": "bench", "uid": uid},
        "spec": {"parallelism": members, "completions": members, "completionMode": "Indexed", "template": {}}}),
    );
    let pod_group = format!("{job}-wl-{job}-pgt-0-x");
    if path == Path::WorkloadApi {
        api.put(Kind::UpstreamPodGroup, json!({"apiVersion": "scheduling.k8s.io/v1alpha2",
            "metadata": {"name": pod_group, "namespace": "bench", "ownerReferences": [owner("Job", "batch/v1", job, &uid, true)]},
            "spec": {"podGroupTemplateRef": {"workload": {"workloadName": format!("{job}-wl"), "podGroupTemplateName": format!("{job}-pgt-0")}},
                     "schedulingPolicy": {"gang": {"minCount": members}}}}));
    }
    pod_group
}

fn bound(api: &FakeApi, ids: &[String]) -> usize {
    ids.iter().filter(|id| api.get(Kind::Pod, id).is_some_and(|p| p["spec"]["nodeName"].is_string())).count()
}

fn waiting(api: &FakeApi, id: &str) -> bool {
    api.get(Kind::Pod, id).is_some_and(|p| {
        p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "PodScheduled"))
    })
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// Owner resolution per pod: a pod of a Job of a JobSet (two hops) among `owners` owners.
fn owner_resolution(count: usize) {
    let table = Arc::new(OwnerTable::new(owners::builtin()).unwrap());
    let mut cache = Owners::new(table.clone());
    let job_kind = table.index_of("batch/v1", "Job").unwrap();
    let jobset_kind = table.index_of("jobset.x-k8s.io/v1alpha2", "JobSet").unwrap();
    cache.relist_done(job_kind);
    cache.relist_done(jobset_kind);
    let started = Instant::now();
    for i in 0..count {
        let jobset: kube::api::DynamicObject = serde_json::from_value(json!({"apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet", "metadata": {"name": format!("js-{i}"), "namespace": "bench", "uid": format!("js-{i}")},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 4, "template": {"spec": {"parallelism": 2}}}]}}))
        .unwrap();
        cache.apply(jobset_kind, &jobset);
        let job: kube::api::DynamicObject = serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("js-{i}-w-0"), "namespace": "bench", "uid": format!("job-{i}"),
                         "ownerReferences": [owner("JobSet", "jobset.x-k8s.io/v1alpha2", &format!("js-{i}"), &format!("js-{i}"), true)]},
            "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed"}}))
        .unwrap();
        cache.apply(job_kind, &job);
    }
    let ingest = started.elapsed();
    let labels: BTreeMap<String, String> =
        [("jobset.sigs.k8s.io/restart-attempt".to_string(), "0".to_string())].into_iter().collect();
    let refs: Vec<OwnerRef> = (0..count)
        .map(|i| OwnerRef {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: format!("js-{i}-w-0"),
            uid: format!("job-{i}"),
        })
        .collect();
    let rounds = 20;
    let started = Instant::now();
    let mut gangs = 0;
    for _ in 0..rounds {
        for r in &refs {
            if matches!(cache.grouping("bench", Some(r), &labels), owners::Grouping::Gang { .. }) {
                gangs += 1;
            }
        }
    }
    let per_pod = started.elapsed() / (rounds * count) as u32;
    assert_eq!(gangs, rounds * count);
    let plain =
        OwnerRef { api_version: "apps/v1".into(), kind: "ReplicaSet".into(), name: "web".into(), uid: "rs".into() };
    let started = Instant::now();
    for _ in 0..rounds * count {
        std::hint::black_box(cache.grouping("bench", Some(&plain), &labels));
    }
    let unknown = started.elapsed() / (rounds * count) as u32;
    println!(
        "owner resolution: {per_pod:.2?} per pod (Job → JobSet, {count} JobSets cached), {unknown:.2?} for a pod of a kind not in the table; \
         {count} JobSets + Jobs read (CEL) in {:.2?} ({:.1?} per owner)",
        ingest,
        ingest / (2 * count) as u32
    );
}

fn main() {
    // RUST_LOG=wasmsched_kube=debug shows what the scheduler does meanwhile.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .try_init();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nodes = args.first().copied().unwrap_or(1_000);
    let members = args.get(1).copied().unwrap_or(64);
    let rounds = args.get(2).copied().unwrap_or(5);
    let latency_ms = args.get(3).copied().unwrap_or(5) as u64;
    owner_resolution(10_000);

    // kube-scheduler's default client rate (the chart's), then no limit: the scheduler's own time.
    for rate in [wasmsched_kube::ClientRate::default(), wasmsched_kube::ClientRate { qps: 0.0, burst: 1 }] {
        gangs(nodes, members, rounds, latency_ms, rate);
    }
}

fn gangs(nodes: usize, members: usize, rounds: usize, latency_ms: u64, rate: wasmsched_kube::ClientRate) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let api = FakeApi::new();
        api.state().upstream_version = Some("v1alpha2");
        for n in 0..nodes {
            api.put(Kind::Node, gpu_node(&format!("node-{n}"), 8, &[]));
        }
        api.state().bind_latency = Duration::from_millis(latency_ms);
        let preparer = Preparer::new(
            Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()),
            wasmsched_plugins::table().collect(),
        );
        let registry = policy::registry(&preparer, &policy::default_policy(), None, 0).unwrap();
        let metrics = Metrics::new("wasmsched");
        let scheduler =
            Scheduler::new(api.run_clients("bench", rate), registry, metrics.clone(), SchedulerConfig::new("wasmsched"));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(scheduler.run(stopped));
        while !metrics.is_ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for path in [Path::WorkloadApi, Path::Owner] {
            let mut took = Vec::new();
            for round in 0..rounds {
                let job = format!("{}-{round}", if path == Path::Owner { "own" } else { "wl" });
                let pod_group = job_objects(&api, &job, members, path);
                let pods: Vec<Value> = (0..members).map(|i| member(&job, i, path, &pod_group)).collect();
                let ids: Vec<String> = pods.iter().map(|p| format!("bench/{}", p["metadata"]["name"].as_str().unwrap())).collect();
                for p in &pods[..members - 1] {
                    api.put(Kind::Pod, p.clone());
                }
                // The first members were seen and told they wait.
                while !waiting(&api, &ids[0]) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(bound(&api, &ids), 0, "no member placed before the gang is complete");
                let started = Instant::now();
                api.put(Kind::Pod, pods[members - 1].clone());
                while bound(&api, &ids) < members {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                took.push(started.elapsed().as_secs_f64() * 1000.0);
                for id in &ids {
                    api.remove(Kind::Pod, id);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let (min, med, max) = median(took);
            println!(
                "{path:?}: last of {members} members created → all bound: {min:.0} / {med:.0} / {max:.0} ms (min / median / max of {rounds}; \
                 {nodes} nodes, bind latency {latency_ms} ms, 16 binds in flight, client {})",
                if rate.qps > 0.0 { format!("qps {} burst {}", rate.qps, rate.burst) } else { "unlimited".into() }
            );
        }
        let _ = stop.send(true);
        let _ = task.await;
    });
}
