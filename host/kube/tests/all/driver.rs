//! The scheduling loop driven without HTTP: its watch events handed in as streams
//! (`Scheduler::run_with`), its writes answered in memory (`executor::Recording`), this test
//! playing the API server between the two — a bind shows the pod bound on the pod watch, an
//! eviction shows it terminating, then gone. The client the scheduler is given refuses every
//! request and records it: the loop's whole input and output are the streams and the executor.
//!
//! The fake HTTP API server (`boundary.rs`) stays for what only that boundary shows: RBAC, 429s,
//! field ownership, graceful deletion as the server does it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use wasmsched_kube::bind::EffectError;
use wasmsched_kube::convert::{GPU_IDS_ANNOTATION, gpu_ids};
use wasmsched_kube::crd::PodGroup;
use wasmsched_kube::executor::{Recording, Write};
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::scheduler::{Watch, Watches};
use wasmsched_kube::{Clients, Scheduler, SchedulerConfig, policy};

use crate::boundary::{NAME, eventually, preparer, serve_budget};
use crate::support::fake_api::{gpu_node, pod};

/// An API server that is not there: every request fails, and is recorded.
#[derive(Clone, Default)]
struct NoServer(Arc<Mutex<Vec<String>>>);

impl tower_service::Service<http::Request<kube::client::Body>> for NoServer {
    type Response = http::Response<kube::client::Body>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        self.0.lock().unwrap().push(format!("{} {}", req.method(), req.uri()));
        std::future::ready(Err(std::io::Error::other("no API server: this loop is driven in memory")))
    }
}

/// What the test's API server holds.
#[derive(Default)]
struct State {
    pods: BTreeMap<String, Pod>,
    /// Every write the loop made, with how it was answered.
    writes: Vec<(Write, Result<(), EffectError>)>,
    /// Evicted pods terminate until [`Memory::delete`] (a kubelet that is slow to
    /// stop them); otherwise they are gone at once.
    slow_termination: bool,
    /// Pods another scheduler binds, and where, as our bind of them is refused with a 409.
    bound_elsewhere: BTreeMap<String, String>,
}

/// Where a test sends a watch's events.
type Feed<K> = mpsc::UnboundedSender<watcher::Result<Event<K>>>;

/// The scheduler over in-memory watches and writes.
struct Memory {
    pods: Feed<Pod>,
    budgets: Feed<PodDisruptionBudget>,
    state: Arc<Mutex<State>>,
    requests: NoServer,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn channel<K: Send + 'static>() -> (Feed<K>, Watch<K>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) }).boxed())
}

/// A list of `objects` on `feed`, as a watch starts.
fn listed<K>(feed: &Feed<K>, objects: Vec<K>) {
    feed.send(Ok(Event::Init)).unwrap();
    for o in objects {
        feed.send(Ok(Event::InitApply(o))).unwrap();
    }
    feed.send(Ok(Event::InitDone)).unwrap();
}

/// `value` as an object the API server holds (a pod gets the UID the server would give it).
fn object<K: serde::de::DeserializeOwned>(mut value: serde_json::Value) -> K {
    let meta = &mut value["metadata"];
    if meta["uid"].is_null() && !meta["namespace"].is_null() {
        meta["uid"] = json!(format!("uid-{}-{}", meta["namespace"].as_str().unwrap(), meta["name"].as_str().unwrap()));
    }
    serde_json::from_value(value).expect("a valid object")
}

/// A pending pod of ours asking for `gpus`, at `priority`.
fn ours(name: &str, gpus: u32, priority: i32) -> serde_json::Value {
    let mut p = pod("ml", name, NAME, gpus, "4", "32Gi");
    p["spec"]["priority"] = json!(priority);
    p
}

fn id(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What a test starts the scheduler on.
struct Setup {
    /// Listed at the start.
    nodes: Vec<Node>,
    /// Listed at the start.
    pods: Vec<Pod>,
    /// PodDisruptionBudgets listed at the start.
    budgets: Vec<PodDisruptionBudget>,
    /// PriorityClasses listed at the start.
    priority_classes: Vec<PriorityClass>,
    /// Our PodGroups listed at the start.
    groups: Vec<PodGroup>,
    slow_termination: bool,
    /// Pods another scheduler binds, and where, as ours are refused with a 409.
    bound_elsewhere: Vec<(&'static str, &'static str)>,
    answer: wasmsched_kube::executor::Answer,
}

impl Setup {
    fn new(nodes: Vec<serde_json::Value>, pods: Vec<serde_json::Value>) -> Setup {
        Setup {
            nodes: nodes.into_iter().map(object).collect(),
            pods: pods.into_iter().map(object).collect(),
            budgets: Vec::new(),
            priority_classes: Vec::new(),
            groups: Vec::new(),
            slow_termination: false,
            bound_elsewhere: Vec::new(),
            answer: Box::new(|_| Ok(())),
        }
    }

    fn start(self) -> Memory {
        Memory::start(self)
    }
}

impl Memory {
    /// The scheduler started on `setup`'s nodes and pods (listed), its writes answered by its
    /// `answer`.
    fn start(setup: Setup) -> Memory {
        let Setup { nodes, pods, budgets, priority_classes, groups, slow_termination, bound_elsewhere, answer } = setup;
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
            .with_test_writer()
            .try_init();
        let requests = NoServer::default();
        let client = kube::Client::new(requests.clone(), "default");
        let clients = Clients { api: client.clone(), events: None, election: client };
        let registry = policy::registry(preparer(), &policy::default_policy(), None, 0).expect("default policy");
        let config = SchedulerConfig::new(NAME);
        let (recording, mut writes) = Recording::new();
        let scheduler = Scheduler::new(clients, registry, Metrics::new(NAME), config.clone())
            .with_executor(Arc::new(recording.answering(answer)));

        let (node_tx, node_stream) = channel::<Node>();
        let (pod_tx, pod_stream) = channel::<Pod>();
        let bound_elsewhere = bound_elsewhere.into_iter().map(|(p, n)| (p.to_string(), n.to_string())).collect();
        let state = Arc::new(Mutex::new(State { slow_termination, bound_elsewhere, ..State::default() }));
        listed(&node_tx, nodes);
        state.lock().unwrap().pods.extend(pods.iter().map(|p| (id(p), p.clone())));
        listed(&pod_tx, pods);
        let (budget_tx, budget_stream) = channel::<PodDisruptionBudget>();
        listed(&budget_tx, budgets);
        let (class_tx, class_stream) = channel::<PriorityClass>();
        listed(&class_tx, priority_classes);
        let (group_tx, group_stream) = channel::<PodGroup>();
        listed(&group_tx, groups);
        std::mem::forget(class_tx);
        std::mem::forget(group_tx);
        // Keep the node watch open: a closed stream is a watch that ended.
        std::mem::forget(node_tx);

        // The API server's side: each write answered shows on the pod watch.
        let (server_state, server_pods) = (state.clone(), pod_tx.clone());
        tokio::spawn(async move {
            while let Some((write, answer)) = writes.recv().await {
                let mut s = server_state.lock().unwrap();
                s.writes.push((write.clone(), answer.clone()));
                if let (Write::Bind { pod, .. }, Err(_)) = (&write, &answer)
                    && let Some(node) = s.bound_elsewhere.get(&pod.to_string()).cloned()
                    && let Some(p) = s.pods.get_mut(&pod.to_string())
                {
                    p.spec.as_mut().unwrap().node_name = Some(node);
                    p.status.as_mut().unwrap().phase = Some("Running".into());
                    let _ = server_pods.send(Ok(Event::Apply(p.clone())));
                }
                if answer.is_err() {
                    continue;
                }
                match write {
                    Write::Bind { pod, node, devices, .. } => {
                        let Some(p) = s.pods.get_mut(&pod.to_string()) else { continue };
                        p.spec.as_mut().unwrap().node_name = Some(node);
                        p.metadata
                            .annotations
                            .get_or_insert_default()
                            .insert(GPU_IDS_ANNOTATION.into(), gpu_ids(&devices));
                        p.status.as_mut().unwrap().phase = Some("Running".into());
                        let _ = server_pods.send(Ok(Event::Apply(p.clone())));
                    }
                    Write::Evict { pod } => {
                        let key = pod.to_string();
                        if s.slow_termination {
                            let Some(p) = s.pods.get_mut(&key) else { continue };
                            p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                k8s_openapi::jiff::Timestamp::now(),
                            ));
                            let _ = server_pods.send(Ok(Event::Apply(p.clone())));
                        } else if let Some(p) = s.pods.remove(&key) {
                            let _ = server_pods.send(Ok(Event::Delete(p)));
                        }
                    }
                    _ => {}
                }
            }
        });

        let watches = Watches {
            nodes: node_stream,
            pods: pod_stream,
            budgets: budget_stream,
            priority_classes: class_stream,
            groups: group_stream,
            ..Watches::quiet(&config)
        };
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(scheduler.run_with(watches, rx));
        Memory { pods: pod_tx, budgets: budget_tx, state, requests, stop, task }
    }

    /// A pod created, or changed (as a user or another scheduler writes it).
    fn put(&self, pod: serde_json::Value) {
        let pod: Pod = object(pod);
        self.state.lock().unwrap().pods.insert(id(&pod), pod.clone());
        self.pods.send(Ok(Event::Apply(pod))).unwrap();
    }

    /// A PodDisruptionBudget created or changed (its status as the disruption controller wrote it).
    fn put_budget(&self, budget: serde_json::Value) {
        self.budgets.send(Ok(Event::Apply(object(budget)))).unwrap();
    }

    /// The pods evicted so far.
    fn evictions(&self) -> Vec<String> {
        self.writes(|w, ok| match w {
            Write::Evict { pod } if ok => Some(pod.to_string()),
            _ => None,
        })
    }

    /// The pod as the server holds it now.
    fn get(&self, key: &str) -> serde_json::Value {
        serde_json::to_value(&self.state.lock().unwrap().pods[key]).unwrap()
    }

    /// A pod deleted at once (no grace period).
    fn delete(&self, key: &str) {
        let gone = self.state.lock().unwrap().pods.remove(key).expect("the pod exists");
        self.pods.send(Ok(Event::Delete(gone))).unwrap();
    }

    /// Why pod `key` waits, as the loop last said it on the pod.
    fn reason(&self, key: &str) -> Option<String> {
        self.writes(|w, _| match w {
            Write::Unschedulable { pod, message, .. } if pod.to_string() == key => Some(message.clone()),
            _ => None,
        })
        .pop()
    }

    fn node_of(&self, key: &str) -> Option<String> {
        self.state.lock().unwrap().pods.get(key).and_then(|p| p.spec.as_ref()?.node_name.clone())
    }

    fn gpus_of(&self, key: &str) -> Vec<u32> {
        let s = self.state.lock().unwrap();
        let ids = s.pods[key].metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION)).cloned();
        wasmsched_kube::convert::parse_gpu_ids(&ids.unwrap_or_default()).unwrap().into_iter().map(|d| d.gpu).collect()
    }

    /// The writes made so far that `pick` picks.
    /// How many writes made so far `matches`.
    fn wrote(&self, matches: impl Fn(&Write) -> bool) -> usize {
        self.state.lock().unwrap().writes.iter().filter(|(w, _)| matches(w)).count()
    }

    fn writes<T>(&self, pick: impl Fn(&Write, bool) -> Option<T>) -> Vec<T> {
        self.state.lock().unwrap().writes.iter().filter_map(|(w, answer)| pick(w, answer.is_ok())).collect()
    }

    fn binds(&self) -> Vec<(String, bool)> {
        self.writes(|w, ok| match w {
            Write::Bind { pod, .. } => Some((pod.to_string(), ok)),
            _ => None,
        })
    }

    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("stops in time").unwrap();
        self.requests.0.lock().unwrap().clone()
    }
}

/// The requests the scheduler still sends its client (to a server that is not there): the
/// `ComputeDomain` keeper's and the `Queue`/`PodGroup` status writer's, which are not decisions'
/// writes — nothing about pods, bindings, evictions or events.
fn assert_only_status_traffic(requests: &[String]) {
    let status = |r: &&String| {
        let path = r.split_once(' ').map_or(r.as_str(), |(_, p)| p);
        path.starts_with("/apis/resource.nvidia.com/") || path.starts_with("/apis/scheduling.wasmsched.io/")
    };
    let others: Vec<&String> = requests.iter().filter(|r| !status(r)).collect();
    assert!(others.is_empty(), "the loop's decisions went to the API server: {others:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_bound_once_each_with_distinct_gpus_and_a_pod_that_fits_nowhere_is_told_why() {
    let mut resident: serde_json::Value = pod("infra", "resident", "default-scheduler", 4, "8", "64Gi");
    resident["spec"]["nodeName"] = json!("gpu-0");
    resident["metadata"]["annotations"] = json!({GPU_IDS_ANNOTATION: "0,1,2,3"});
    resident["status"]["phase"] = json!("Running");
    let nodes = (0..3).map(|n| gpu_node(&format!("gpu-{n}"), 8, &[])).collect();
    let names: Vec<String> = (0..10).map(|i| format!("ml/train-{i}")).collect();
    let mut pods: Vec<serde_json::Value> = (0..10).map(|i| ours(&format!("train-{i}"), 2, 0)).collect();
    pods.push(resident);
    let memory = Setup::new(nodes, pods).start();

    eventually("all pods bound", Duration::from_secs(60), || names.iter().all(|n| memory.node_of(n).is_some())).await;
    let binds = memory.binds();
    assert_eq!(binds.len(), names.len(), "one bind per pod: {binds:?}");
    // 20 GPUs asked of the 20 free: each device used once, never one of the resident's.
    let mut used: Vec<(String, u32)> = (0..4).map(|g| ("gpu-0".to_string(), g)).collect();
    for n in &names {
        let gpus = memory.gpus_of(n);
        assert_eq!(gpus.len(), 2, "{n} got {gpus:?}");
        used.extend(gpus.into_iter().map(|g| (memory.node_of(n).unwrap(), g)));
    }
    let total = used.len();
    used.sort();
    used.dedup();
    assert_eq!(used.len(), total, "a GPU was given twice: {used:?}");
    eventually("a Scheduled event per bind", Duration::from_secs(10), || {
        memory.wrote(|w| matches!(w, Write::Event { reason, .. } if reason == "Scheduled")) == names.len()
    })
    .await;

    // No room is left: the next pod is told why, and never bound.
    memory.put(ours("too-big", 8, 0));
    eventually("too-big told why", Duration::from_secs(20), || {
        memory.wrote(|w| {
            matches!(w, Write::Unschedulable { pod, message, .. }
                if pod.name == "too-big" && message.starts_with("0/3 nodes available"))
        }) > 0
    })
    .await;
    assert!(memory.binds().iter().all(|(p, _)| p != "ml/too-big"));
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_bind_is_tried_again_and_a_conflict_waits_for_the_watch() {
    let nodes = (0..3).map(|n| gpu_node(&format!("gpu-{n}"), 8, &[])).collect();
    let failed_once = Arc::new(Mutex::new(false));
    let pods = vec![ours("flaky", 4, 0), ours("raced", 4, 0), ours("unexplained", 4, 0)];
    let mut setup = Setup::new(nodes, pods);
    setup.bound_elsewhere = vec![("ml/raced", "gpu-2")];
    setup.answer = Box::new(move |w| match w {
        Write::Bind { pod, .. }
            if pod.name == "flaky" && !std::mem::replace(&mut *failed_once.lock().unwrap(), true) =>
        {
            Err(EffectError::Retryable("500 Internal Server Error".into()))
        }
        // Another scheduler bound it first: the watch shows where.
        Write::Bind { pod, .. } if pod.name == "raced" => Err(EffectError::Conflict("already bound".into())),
        // A 409 the watch never explains.
        Write::Bind { pod, .. } if pod.name == "unexplained" => Err(EffectError::Conflict("refused".into())),
        _ => Ok(()),
    });
    let memory = setup.start();
    eventually("flaky bound", Duration::from_secs(30), || memory.node_of("ml/flaky").is_some()).await;
    let attempts = |name: &str| -> Vec<bool> {
        memory.binds().into_iter().filter(|(p, _)| p == &format!("ml/{name}")).map(|(_, ok)| ok).collect()
    };
    assert_eq!(attempts("flaky"), [false, true], "the failed bind is tried again, once");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(attempts("raced"), [false], "a conflict the watch explains is never tried again");
    assert_eq!(memory.node_of("ml/raced").as_deref(), Some("gpu-2"));
    // Tried again only after a back-off each time (it was ~1,000 times a second without one).
    let unexplained = attempts("unexplained");
    assert!((1..=5).contains(&unexplained.len()), "{} binds in ~3 s", unexplained.len());
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemptor_binds_only_once_its_victim_is_gone() {
    let mut setup = Setup::new(vec![gpu_node("gpu-0", 8, &[])], vec![ours("low", 8, 0)]);
    setup.slow_termination = true;
    let memory = setup.start();
    eventually("low bound", Duration::from_secs(30), || memory.node_of("ml/low").is_some()).await;
    memory.put(ours("high", 8, 10));
    eventually("low evicted", Duration::from_secs(20), || {
        memory.wrote(|w| matches!(w, Write::Evict { pod } if pod.name == "low")) > 0
    })
    .await;
    eventually("high nominated", Duration::from_secs(10), || {
        memory.wrote(|w| {
            matches!(w, Write::Unschedulable { pod, nominated: Some(node), .. } if pod.name == "high" && node == "gpu-0")
        }) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(memory.node_of("ml/high"), None, "nothing is bound to GPUs a terminating pod still holds");
    memory.delete("ml/low"); // its kubelet stopped it
    eventually("high bound", Duration::from_secs(20), || memory.node_of("ml/high").is_some()).await;
    assert_eq!(memory.gpus_of("ml/high"), (0..8).collect::<Vec<u32>>());
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_affinity_is_required_or_preferred_and_a_malformed_one_is_reported() {
    let mut nodes = Vec::new();
    let mut listed = Vec::new();
    for (n, zone) in [(0, "a"), (1, "b"), (2, "c")] {
        nodes.push(gpu_node(&format!("gpu-{n}"), 8, &[("topology.kubernetes.io/zone", zone)]));
    }
    let term = |op: &str, values: &[&str]| json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": op, "values": values}]});
    // Required: zone b, or any node but gpu-1 and gpu-2 by name (so only gpu-0 or gpu-1).
    let mut pinned = pod("ml", "pinned", NAME, 1, "4", "32Gi");
    pinned["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [
        term("In", &["b"]),
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1", "gpu-2"]}],
         "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["a"]}]}
    ]}}});
    // Preferred: zone c over zone a; packing alone would put it beside `pinned`.
    let mut prefers = pod("ml", "prefers-c", NAME, 1, "4", "32Gi");
    prefers["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 80, "preference": term("In", &["c"])},
        {"weight": 10, "preference": term("In", &["a"])}
    ]}});
    // Required terms nothing satisfies: unschedulable, with the reason.
    let mut nowhere = pod("ml", "nowhere", NAME, 1, "4", "32Gi");
    nowhere["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term("In", &["z"])]}}});
    // Malformed: an operator Kubernetes does not have.
    let mut garbled = pod("ml", "garbled", NAME, 1, "4", "32Gi");
    garbled["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term("Near", &["b"])]}}});
    listed.push(pinned);
    let memory = Setup::new(nodes, listed).start();
    eventually("pinned bound", Duration::from_secs(30), || memory.node_of("ml/pinned").is_some()).await;
    assert_eq!(memory.node_of("ml/pinned").as_deref(), Some("gpu-1"), "only zone b satisfies a required term");
    for p in [prefers, nowhere, garbled] {
        memory.put(p);
    }
    eventually("prefers-c bound", Duration::from_secs(30), || memory.node_of("ml/prefers-c").is_some()).await;
    assert_eq!(memory.node_of("ml/prefers-c").as_deref(), Some("gpu-2"), "the heavier preferred term wins");
    eventually("nowhere and garbled reported", Duration::from_secs(30), || {
        memory.reason("ml/nowhere").is_some_and(|m| m.contains("required node affinity does not match"))
            && memory.reason("ml/garbled").is_some_and(|m| m.contains("unknown operator \"Near\""))
    })
    .await;
    assert!(memory.binds().iter().all(|(p, _)| p != "ml/nowhere" && p != "ml/garbled"));
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_pod_anti_affinity_spreads_replicas_and_keeps_clear_of_others_pods() {
    let mut nodes = Vec::new();
    let mut listed = Vec::new();
    for n in ["gpu-0", "gpu-1", "gpu-2"] {
        nodes.push(gpu_node(n, 8, &[]));
    }
    let away_from_train = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "kubernetes.io/hostname",
         "namespaceSelector": {}}
    ]}});
    // kube-scheduler placed this one on gpu-0, with an anti-affinity that keeps `train` pods (of
    // any namespace) off its node; it holds 2 GPUs.
    let mut resident = pod("infra", "resident", "default-scheduler", 2, "8", "64Gi");
    resident["spec"]["nodeName"] = json!("gpu-0");
    resident["metadata"]["labels"] = json!({"app": "infra"});
    resident["spec"]["affinity"] = away_from_train.clone();
    resident["status"]["phase"] = json!("Running");
    listed.push(resident);
    // Three replicas, one per node required; bin-packing alone would stack them.
    for i in 0..3 {
        let mut p = pod("ml", &format!("train-{i}"), NAME, 1, "4", "32Gi");
        p["metadata"]["labels"] = json!({"app": "train"});
        p["spec"]["affinity"] = away_from_train.clone();
        listed.push(p);
    }
    // Another scheduler's db pod, with no affinity of its own, on gpu-1; a pod of ours must run
    // on the db's node.
    let mut db = pod("infra", "db", "default-scheduler", 1, "2", "8Gi");
    db["metadata"]["labels"] = json!({"app": "db"});
    db["spec"]["nodeName"] = json!("gpu-1");
    db["status"]["phase"] = json!("Running");
    listed.push(db);
    let mut near_db = pod("ml", "near-db", NAME, 1, "4", "32Gi");
    near_db["metadata"]["labels"] = json!({"app": "cache"}); // not a `train` pod (the helper's label)
    near_db["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname", "namespaces": ["infra"]}
    ]}});
    listed.push(near_db);
    // A namespace selector needs namespace labels the scheduler does not watch: refused.
    let mut picky = pod("ml", "picky", NAME, 1, "4", "32Gi");
    picky["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname",
         "namespaceSelector": {"matchLabels": {"team": "data"}}}
    ]}});
    listed.push(picky);
    let memory = Setup::new(nodes, listed).start();
    eventually("two replicas bound", Duration::from_secs(30), || {
        (0..3).filter(|i| memory.node_of(&format!("ml/train-{i}")).is_some()).count() == 2
    })
    .await;
    let mut nodes: Vec<String> = (0..3).filter_map(|i| memory.node_of(&format!("ml/train-{i}"))).collect();
    nodes.sort();
    assert_eq!(nodes, ["gpu-1", "gpu-2"], "one per node, none beside the resident");
    eventually("near-db bound", Duration::from_secs(20), || memory.node_of("ml/near-db").is_some()).await;
    assert_eq!(memory.node_of("ml/near-db").as_deref(), Some("gpu-1"), "beside the db");
    let waiting = (0..3).map(|i| format!("ml/train-{i}")).find(|id| memory.node_of(id).is_none()).unwrap();
    eventually("the third explained", Duration::from_secs(20), || {
        memory.reason(&waiting).is_some_and(|m| {
            // Its own term keeps it off the replicas' nodes, theirs and the resident's keep it
            // off all three.
            m.contains("required pod (anti-)affinity: kubernetes.io/hostname not in [gpu-1, gpu-2], kubernetes.io/hostname not in [gpu-0, gpu-1, gpu-2]")
        })
    })
    .await;
    eventually("picky reported", Duration::from_secs(20), || {
        memory.reason("ml/picky").is_some_and(|m| m.contains("a namespaceSelector other than {}"))
    })
    .await;
    // The resident leaves: its node is open to the waiting replica.
    memory.delete("infra/resident");
    eventually("third bound", Duration::from_secs(30), || memory.node_of(&waiting).is_some()).await;
    assert_eq!(memory.node_of(&waiting).as_deref(), Some("gpu-0"));
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_of_another_scheduler_relabelled_is_what_pod_affinity_sees() {
    let mut nodes = Vec::new();
    let mut listed = Vec::new();
    for n in ["gpu-0", "gpu-1"] {
        nodes.push(gpu_node(n, 8, &[]));
    }
    // Another scheduler's pod on gpu-1, not (yet) labelled as the db.
    let mut db = pod("infra", "db", "default-scheduler", 1, "2", "8Gi");
    db["metadata"]["labels"] = json!({"app": "staging"});
    db["spec"]["nodeName"] = json!("gpu-1");
    db["status"]["phase"] = json!("Running");
    listed.push(db.clone());
    let mut near_db = pod("ml", "near-db", NAME, 1, "4", "32Gi");
    near_db["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname", "namespaces": ["infra"]}
    ]}});
    listed.push(near_db);
    let memory = Setup::new(nodes, listed).start();
    eventually("near-db explained", Duration::from_secs(20), || {
        memory.reason("ml/near-db").is_some_and(|m| m.contains("no running pod it selects"))
    })
    .await;
    assert!(memory.node_of("ml/near-db").is_none());
    // Relabelled where it runs (nothing else about it changes): the waiting pod joins it.
    db["metadata"]["labels"] = json!({"app": "db"});
    memory.put(db);
    eventually("near-db bound", Duration::from_secs(20), || memory.node_of("ml/near-db").is_some()).await;
    assert_eq!(memory.node_of("ml/near-db").as_deref(), Some("gpu-1"));
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_ours_relabelled_while_running_is_what_pod_affinity_sees() {
    let mut nodes = Vec::new();
    let mut listed = Vec::new();
    for n in ["gpu-0", "gpu-1"] {
        nodes.push(gpu_node(n, 8, &[]));
    }
    // Our own pod, placed by us as app=staging.
    let mut db = pod("infra", "db", NAME, 1, "2", "8Gi");
    db["metadata"]["labels"] = json!({"app": "staging"});
    listed.push(db);
    let memory = Setup::new(nodes, listed).start();
    eventually("db bound", Duration::from_secs(20), || memory.node_of("infra/db").is_some()).await;
    let db_node = memory.node_of("infra/db");
    let mut near_db = pod("ml", "near-db", NAME, 1, "4", "32Gi");
    near_db["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname", "namespaces": ["infra"]}
    ]}});
    memory.put(near_db);
    eventually("near-db explained", Duration::from_secs(20), || {
        memory.reason("ml/near-db").is_some_and(|m| m.contains("no running pod it selects"))
    })
    .await;
    assert!(memory.node_of("ml/near-db").is_none());
    // Relabelled where it runs: the core's view of its labels changes, and the waiting pod joins.
    let mut db = memory.get("infra/db");
    db["metadata"]["labels"] = json!({"app": "db"});
    db["status"]["phase"] = json!("Running");
    memory.put(db);
    eventually("near-db bound", Duration::from_secs(20), || memory.node_of("ml/near-db").is_some()).await;
    assert_eq!(memory.node_of("ml/near-db"), db_node);
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_never_takes_more_of_a_budget_s_pods_than_it_allows() {
    let serve = |name: &str| {
        let mut p = pod("ml", name, NAME, 4, "4", "32Gi");
        p["metadata"]["labels"]["app"] = json!("serve");
        p
    };
    let mut setup = Setup::new(vec![gpu_node("gpu-0", 8, &[])], vec![serve("s1"), serve("s2")]);
    setup.budgets = vec![object(serve_budget(1, 3))];
    let memory = setup.start();
    eventually("both bound", Duration::from_secs(30), || {
        memory.node_of("ml/s1").is_some() && memory.node_of("ml/s2").is_some()
    })
    .await;
    // The whole node is needed: both serve pods would have to go, and the budget allows one.
    memory.put(ours("high", 8, 10));
    eventually("high unschedulable", Duration::from_secs(30), || memory.reason("ml/high").is_some()).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(memory.evictions().is_empty(), "no plan takes two pods of a budget allowing one");
    // Two allowed: both go, and the high-priority pod gets the node.
    memory.put_budget(serve_budget(2, 3));
    eventually("high bound", Duration::from_secs(30), || memory.node_of("ml/high").is_some()).await;
    let mut evicted = memory.evictions();
    evicted.sort();
    assert_eq!(evicted, ["ml/s1", "ml/s2"]);
    assert_only_status_traffic(&memory.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_of_a_priority_class_waits_for_its_members_then_preempts_a_checkpointing_pod() {
    // A low-priority job that checkpoints when asked holds the whole node; a gang of two at the
    // priority of the class its PodGroup names (its pods' own priority is 0, like the victim's).
    let mut low = pod("ml", "low", NAME, 8, "4", "32Gi");
    low["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/checkpoint": "600"});
    let mut setup = Setup::new(vec![gpu_node("gpu-0", 8, &[])], vec![low]);
    setup.priority_classes = vec![object(json!({"metadata": {"name": "urgent"}, "value": 10}))];
    setup.groups = vec![object(json!({
        "apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 2, "priorityClassName": "urgent"}
    }))];
    let memory = setup.start();
    eventually("low bound", Duration::from_secs(30), || memory.node_of("ml/low").is_some()).await;
    let member = |name: &str| {
        let mut p = pod("ml", name, NAME, 4, "4", "32Gi");
        p["metadata"]["labels"]["scheduling.wasmsched.io/pod-group"] = json!("train");
        p["spec"]["priority"] = json!(0);
        p
    };
    memory.put(member("train-0"));
    eventually("waiting for members", Duration::from_secs(20), || {
        memory.reason("ml/train-0").is_some_and(|m| m.contains("waiting for its 2 members to exist"))
    })
    .await;
    memory.put(member("train-1"));
    // The gang does not fit: the victim is asked to checkpoint, not evicted.
    eventually("checkpoint requested", Duration::from_secs(20), || {
        memory.wrote(|w| {
            matches!(w, Write::CheckpointRequested { pod, preemptor } if pod.name == "low" && preemptor == "ml/train")
        }) > 0
    })
    .await;
    assert!(memory.evictions().is_empty(), "a checkpointing victim gets its grace period");
    assert!(memory.binds().iter().all(|(p, _)| !p.starts_with("ml/train")), "nothing bound before the room is free");
    // It reports its checkpoint saved: evicted at once, and the gang binds.
    let mut done = memory.get("ml/low");
    done["metadata"]["annotations"]["scheduling.wasmsched.io/checkpointed"] = json!("true");
    memory.put(done);
    eventually("gang bound", Duration::from_secs(30), || {
        memory.node_of("ml/train-0").is_some() && memory.node_of("ml/train-1").is_some()
    })
    .await;
    assert_eq!(memory.evictions(), ["ml/low"]);
    let mut gpus = [memory.gpus_of("ml/train-0"), memory.gpus_of("ml/train-1")].concat();
    gpus.sort();
    assert_eq!(gpus, (0..8).collect::<Vec<u32>>(), "the two members share the node's GPUs without overlap");
    assert_only_status_traffic(&memory.stop().await);
}
