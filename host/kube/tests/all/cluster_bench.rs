//! `wasmsched cluster-bench` against the fake API server: the tool's requests are the ones a real
//! server answers (the fake is as strict on them: nodes tainted not-ready on create, graceful pod
//! deletion, UID preconditions, field selectors), and with the scheduler under test running, its
//! figures are the scheduler's. The tool on a real kube-apiserver is in BENCHMARKS.md.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;
use wasmsched_clusterbench::{Arrival, BinderConfig, Config, UnderTest, Workload, objects};
use wasmsched_kube::convert::{GPU_IDS_ANNOTATION, parse_gpu_ids};

use crate::boundary::{NAME, start};
use crate::support::fake_api::{FakeApi, Kind};

fn config(nodes: usize, pods: usize, workload: Workload) -> Config {
    Config {
        scheduler_name: NAME.into(),
        under_test: UnderTest::Running { pid: Some(std::process::id()) },
        namespace: "bench".into(),
        nodes,
        gpus_per_node: 8,
        pods,
        gpus_per_pod: 1,
        arrival: Arrival::Burst,
        workload: workload.into(),
        create_in_flight: 8,
        warm_up: Duration::ZERO,
        timeout: Duration::from_secs(60),
        settle: Duration::ZERO,
        delete_nodes: false,
        lifetime: None,
        sample_every: None,
    }
}

/// The binds the server accepted, by node: the GPU ids each pod was given.
fn accepted_gpus(api: &FakeApi) -> BTreeMap<String, Vec<u32>> {
    let mut by_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for call in api.binds().into_iter().filter(|b| b.status == 201) {
        let ids = call.annotations.get(GPU_IDS_ANNOTATION).cloned().unwrap_or_default();
        by_node.entry(call.node).or_default().extend(parse_gpu_ids(&ids).unwrap().into_iter().map(|d| d.gpu));
    }
    by_node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trivial_binder_binds_each_pod_once_round_robin_with_one_event_each() {
    let api = FakeApi::new();
    // A fake node left by an earlier, larger run would take pods: the run removes it.
    api.put(Kind::Node, json!({"metadata": {"name": "bench-node-9", "labels": {objects::NODE_LABEL: "true"}}}));
    let mut config = config(5, 30, Workload::Plain);
    config.scheduler_name = "nobody".into();
    config.under_test = UnderTest::Binder(BinderConfig { in_flight: 4, events: true });
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();

    assert!(report.complete(), "{report}");
    assert_eq!(report.requests_per_pod.get("POST pods/binding"), Some(&1.0), "{report}");
    assert_eq!(report.requests_per_pod.get("POST events"), Some(&1.0), "{report}");
    assert!(
        !report.requests_per_pod.contains_key("POST pods"),
        "the tool's own creations are not the binder's: {report}"
    );
    let binds = api.binds();
    assert_eq!(binds.len(), 30);
    assert!(binds.iter().all(|b| b.status == 201));
    let pods: BTreeSet<_> = binds.iter().map(|b| b.pod.clone()).collect();
    assert_eq!(pods.len(), 30, "each pod bound once");
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for b in &binds {
        *per_node.entry(b.node.clone()).or_default() += 1;
    }
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), vec![6; 5], "round-robin: {per_node:?}");
    let nodes = api.objects(Kind::Node);
    assert_eq!(nodes.len(), 5, "the extra fake node is gone");
    for n in &nodes {
        assert_eq!(n["status"]["allocatable"]["nvidia.com/gpu"], "8");
        assert!(n["spec"]["taints"].is_null(), "the not-ready taint was cleared: {n}");
    }
    assert!(api.objects(Kind::Pod).is_empty(), "the run's pods are deleted at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_under_test_places_a_burst_and_the_server_counts_its_requests_per_pod() {
    let api = FakeApi::new();
    let scheduler = start(&api, "scheduler", None);
    let report = wasmsched_clusterbench::run(api.client("bench"), &config(6, 40, Workload::Plain)).await.unwrap();
    scheduler.stop().await;

    assert!(report.complete(), "{report}");
    assert!(report.pods_per_second > 0.0 && report.latency_ms.p50 <= report.latency_ms.p99, "{report}");
    assert_eq!(report.requests_per_pod.get("POST pods/binding"), Some(&1.0), "{report}");
    assert!(report.scheduler_process.is_some_and(|p| p.rss_mib > 0.0), "{report}");
    for (node, gpus) in accepted_gpus(&api) {
        let distinct: BTreeSet<_> = gpus.iter().collect();
        assert_eq!(distinct.len(), gpus.len(), "no GPU of {node} given twice: {gpus:?}");
        assert!(gpus.iter().all(|g| *g < 8));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_of_a_run_are_podgroups_the_scheduler_honours() {
    let api = FakeApi::new();
    let scheduler = start(&api, "scheduler", None);
    let report = wasmsched_clusterbench::run(api.client("bench"), &config(4, 16, Workload::Gang(4))).await.unwrap();
    scheduler.stop().await;
    assert!(report.complete(), "{report}");
    let created = api.state().requests.iter().filter(|(verb, _, r)| verb == "create" && r == "podgroups").count();
    assert_eq!(created, 4, "one PodGroup per gang of 4");
    assert!(api.objects(Kind::PodGroup).is_empty(), "the run's PodGroups are deleted at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_run_fills_the_cluster_then_each_preemptor_evicts_one_and_is_bound() {
    let api = FakeApi::new();
    // No kubelet finishes an evicted pod: the tool does, as it would on a cluster of fake nodes.
    api.state().termination = None;
    let scheduler = start(&api, "scheduler", None);
    let mut config = config(3, 6, Workload::Preempt);
    config.gpus_per_node = 4;
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    scheduler.stop().await;

    assert!(report.complete(), "{report}");
    let evicted = api.state().evictions.iter().filter(|(_, code)| *code == 201).count();
    assert!(evicted >= 6, "each preemptor needed a filler's GPU: {evicted} evictions");
    assert!(report.deletions_finished >= 6, "{report}");
    assert!(report.requests_per_pod.get("POST pods/eviction").is_some_and(|n| *n >= 1.0), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_no_scheduler_serves_are_reported_unbound_not_counted_as_done() {
    let api = FakeApi::new();
    let mut config = config(2, 5, Workload::Plain);
    config.scheduler_name = "nobody".into();
    config.timeout = Duration::from_millis(500);
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    assert_eq!(report.bound, 0);
    assert!(!report.complete());
    assert_eq!(report.pods_per_second, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_all_created_before_the_binder_starts_and_timed_from_its_start() {
    let api = FakeApi::new();
    let mut config = config(3, 12, Workload::Plain);
    config.scheduler_name = "nobody".into();
    config.arrival = Arrival::Batch;
    config.under_test = UnderTest::Binder(BinderConfig { in_flight: 2, events: false });
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    assert!(report.complete(), "{report}");
    let requests = api.state().requests.clone();
    let last_create = requests.iter().rposition(|(v, _, r)| v == "create" && r == "pods").unwrap();
    let first_bind = requests.iter().position(|(_, _, r)| r == "pods/binding").unwrap();
    assert!(last_create < first_bind, "every pod was waiting before the first bind");
    assert!(report.first_bound_seconds <= report.seconds && report.seconds < 30.0, "{report}");
    assert_eq!(report.requests_per_pod.get("POST pods/binding"), Some(&1.0), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churn_run_ends_pods_so_later_ones_fit_and_no_node_ever_holds_more_than_its_gpus() {
    let api = FakeApi::new();
    let scheduler = start(&api, "scheduler", None);
    // 3 nodes of 8 GPUs, 60 pods of 1: only churn makes room for the last 36.
    let mut config = config(3, 60, Workload::Plain);
    config.arrival = Arrival::Rate(40.0);
    config.lifetime = Some(Duration::from_millis(300));
    config.sample_every = Some(Duration::from_millis(200));
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    scheduler.stop().await;

    assert!(report.complete(), "{report}");
    assert!(report.ended >= 36, "{report}");
    assert_eq!((report.overcommit.times, report.overcommit.most), (0, 0), "{report}");
    assert!(report.series.len() >= 3, "{report}");
    assert!(report.series.iter().all(|s| s.alive <= 24 && s.rss_mib.is_some_and(|r| r > 0.0)), "{:?}", report.series);
    // Each pod ended held its GPU at least its lifetime.
    assert_eq!(report.history.bound, 60, "{report}");
    assert!(report.history.gpu_seconds >= report.ended as f64 * 0.3, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_churn_a_preempted_filler_is_replaced_so_gangs_and_pods_keep_preempting() {
    let api = FakeApi::new();
    api.state().termination = None;
    let scheduler = start(&api, "scheduler", None);
    // 2 nodes of 4 GPUs filled with low-priority pods; gangs of 2 and single pods take turns,
    // all outranking the fillers, each ending 300 ms after its bind.
    let mut config = config(2, 12, Workload::Plain);
    config.workload = wasmsched_clusterbench::Mix::parse("gang:2,preempt").unwrap();
    config.gpus_per_node = 4;
    config.arrival = Arrival::Rate(10.0);
    config.lifetime = Some(Duration::from_millis(300));
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    scheduler.stop().await;

    assert!(report.complete(), "{report}");
    assert_eq!((report.overcommit.times, report.overcommit.most), (0, 0), "{report}");
    // The first arrivals found the cluster full; their victims were replaced, so later ones
    // found it full again.
    assert!(report.refilled >= 4, "{report}");
    assert_eq!(report.refilled, report.deletions_finished, "every victim replaced once: {report}");
    assert!(report.history.bound >= 8 + 12, "fillers and measured pods bound: {report}");
    let created = api.state().requests.iter().filter(|(v, _, r)| v == "create" && r == "pods").count();
    assert_eq!(created, 8 + 12 + report.refilled, "the replacements were created: {report}");
    let groups = api.state().requests.iter().filter(|(v, _, r)| v == "create" && r == "podgroups").count();
    assert_eq!(groups, 4, "12 pods dealt gang:2 then one: 4 gangs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overcommit_check_catches_a_binder_that_ignores_capacity() {
    let api = FakeApi::new();
    let mut config = config(2, 6, Workload::Plain);
    config.gpus_per_node = 2;
    config.scheduler_name = "nobody".into();
    config.under_test = UnderTest::Binder(BinderConfig { in_flight: 2, events: false });
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    assert!(report.complete(), "{report}");
    assert!(report.overcommit.times > 0 && report.overcommit.most == 1, "{report}");
    assert!(report.to_string().contains("OVERCOMMIT"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_run_publishes_slices_and_binds_each_pod_with_its_claim_allocated_once() {
    let api = FakeApi::new();
    let scheduler = start(&api, "scheduler", None);
    // 3 nodes of 4 GPUs as ResourceSlices only; 10 pods of 1 GPU, each through its own claim.
    let mut config = config(3, 10, Workload::Dra);
    config.gpus_per_node = 4;
    let report = wasmsched_clusterbench::run(api.client("bench"), &config).await.unwrap();
    scheduler.stop().await;

    assert!(report.complete(), "{report}");
    assert_eq!(report.devices_allocated_twice, 0, "{report}");
    assert_eq!(api.objects(Kind::ResourceSlice).len(), 3, "one slice per node, kept with the nodes");
    assert!(api.objects(Kind::Node).iter().all(|n| n["status"]["allocatable"]["nvidia.com/gpu"] == "0"));
    let claim_writes = api.state().claim_writes.len();
    assert!(claim_writes >= 10, "each pod's claim allocated before its bind: {claim_writes} writes");
    assert!(api.objects(Kind::ResourceClaim).is_empty(), "the run's claims are deleted at the end");
}
