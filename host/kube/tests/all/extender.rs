//! The kube-scheduler extender over real HTTP, its cache fed by the fake API server's watches
//! (a mock at the Kubernetes HTTP boundary): scenario S14 (filter with node names and reasons,
//! prioritize in 0–10, bind with GPU ids and the NUMA node) and S15 (two 4-GPU binds on an 8-GPU
//! node get disjoint sets, a third fails, concurrent binds never share a GPU).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_api::{FakeApi, Kind, gpu_node, pod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use wasmsched_kube::convert::{GPU_IDS_ANNOTATION, NUMA_NODE_ANNOTATION};
use wasmsched_kube::extender::Extender;
use wasmsched_registry::{Fetched, PolicySetSpec, Preparer, Registry, Sample};
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_topology::annotation::{TOPOLOGY_ANNOTATION, to_annotation};

/// Filter, topology score and topology-aware GPU selection, as Wasm components.
const POLICY: &str = r#"
name: extender
plugins:
  fit: { source: "builtin:resource-fit" }
  topo: { source: "builtin:gpu-topology" }
stages:
  filter: [fit]
  score: [{ plugin: topo, weight: 1 }]
  select_devices: topo
"#;

fn registry() -> Arc<Registry> {
    let preparer = Preparer::new(
        Arc::new(Runtime::new(RuntimeConfig::default()).expect("runtime")),
        wasmsched_plugins::table().collect(),
    );
    let fetched = Fetched {
        spec: PolicySetSpec::parse("extender", POLICY).unwrap(),
        origin: "test".into(),
        artifacts: Default::default(),
        fingerprint: "test".into(),
    };
    Arc::new(Registry::new(preparer.prepare(&fetched, 1, &Sample::synthetic()).unwrap(), None))
}

/// An 8 × H100 node with its real `nvidia-smi topo -m` (GPUs 0–3 on NUMA 0, 4–7 on NUMA 1) in
/// the agent's annotation.
fn h100_node(name: &str) -> Value {
    let text = include_str!("../../../topology/tests/fixtures/h100-sxm-8gpu-nv18.txt");
    let topology = wasmsched_topology::smi::parse(text).unwrap();
    let mut node = gpu_node(name, 8, &[]);
    node["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = json!(to_annotation(&topology));
    node
}

/// One HTTP/1.1 request; the status and the body.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

async fn post(addr: std::net::SocketAddr, verb: &str, body: Value) -> Value {
    let (status, text) = http(addr, "POST", &format!("/{verb}"), &body.to_string()).await;
    assert_eq!(status, 200, "{verb}: {text}");
    serde_json::from_str(&text).unwrap()
}

fn pending(api: &FakeApi, name: &str, gpus: u32) -> Value {
    // kube-scheduler's pod: the extender is asked about it, it does not pick it up by itself.
    api.put(Kind::Pod, pod("ml", name, "default-scheduler", gpus, "4", "16Gi"))
}

fn binding(p: &Value, node: &str) -> Value {
    json!({"PodName": p["metadata"]["name"], "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": node})
}

fn gpus_of(api: &FakeApi, id: &str) -> (Vec<u32>, Option<String>) {
    let pod = api.get(Kind::Pod, id).unwrap();
    let a = &pod["metadata"]["annotations"];
    let ids = a[GPU_IDS_ANNOTATION].as_str().unwrap_or_default();
    let gpus = wasmsched_kube::convert::parse_gpu_ids(ids).unwrap().into_iter().map(|d| d.gpu).collect();
    (gpus, a[NUMA_NODE_ANNOTATION].as_str().map(String::from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_s15_filter_prioritize_and_bind_over_the_extender_protocol() {
    let api = FakeApi::new();
    api.put(Kind::Node, h100_node("gpu-0"));
    api.put(Kind::Node, gpu_node("cpu-0", 0, &[]));
    let extender = Extender::new(api.client("extender"), registry(), "wasmsched-extender", Default::default());
    let (stop_tx, stop) = watch::channel(false);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let watching = tokio::spawn(extender.clone().watch(stop.clone()));
    let serving = tokio::spawn(extender.clone().serve(listener, stop));

    let a = pending(&api, "train-a", 4);
    let args = |p: &Value| json!({"Pod": p, "NodeNames": ["gpu-0", "cpu-0", "gone"]});
    // The cache fills from the watches: wait until the GPU node is known.
    let started = Instant::now();
    let filtered = loop {
        let r = post(addr, "filter", args(&a)).await;
        if r["NodeNames"] == json!(["gpu-0"]) {
            break r;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the extender never saw the node: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(filtered["FailedAndUnresolvableNodes"]["cpu-0"], "node has no GPU (fit)", "{filtered}");
    assert_eq!(filtered["FailedAndUnresolvableNodes"]["gone"], "node not found");
    assert_eq!(filtered["Error"], "");

    let scores = post(addr, "prioritize", json!({"Pod": a, "NodeNames": ["gpu-0"]})).await;
    assert_eq!(scores, json!([{"Host": "gpu-0", "Score": 10}]), "the best candidate gets the extender maximum");

    // S15: 4 + 4 GPUs on one 8-GPU node, disjoint, each within one NUMA node; the third fails.
    assert_eq!(post(addr, "bind", binding(&a, "gpu-0")).await, json!({"Error": ""}));
    let b = pending(&api, "train-b", 4);
    assert_eq!(post(addr, "bind", binding(&b, "gpu-0")).await, json!({"Error": ""}));
    let (ga, na) = gpus_of(&api, "ml/train-a");
    let (gb, nb) = gpus_of(&api, "ml/train-b");
    assert_eq!((ga.clone(), na.as_deref()), (vec![0, 1, 2, 3], Some("0")), "NUMA 0, not \"\"");
    assert_eq!((gb.clone(), nb.as_deref()), (vec![4, 5, 6, 7], Some("1")));
    let c = pending(&api, "train-c", 4);
    let refused = post(addr, "bind", binding(&c, "gpu-0")).await;
    assert!(refused["Error"].as_str().unwrap().contains("no GPUs for ml/train-c on gpu-0"), "{refused}");
    assert!(api.get(Kind::Pod, "ml/train-c").unwrap()["spec"]["nodeName"].is_null());
    // The filter now sees the node full.
    let full = post(addr, "filter", args(&c)).await;
    assert_eq!(full["FailedNodes"]["gpu-0"], "insufficient free GPUs (fit)", "{full}");

    // Once train-a is gone, its GPUs are free again.
    api.remove(Kind::Pod, "ml/train-a");
    let started = Instant::now();
    while post(addr, "filter", args(&c)).await["NodeNames"] != json!(["gpu-0"]) {
        assert!(started.elapsed() < Duration::from_secs(20), "train-a's GPUs never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(post(addr, "bind", binding(&c, "gpu-0")).await, json!({"Error": ""}));
    assert_eq!(gpus_of(&api, "ml/train-c").0, ga);

    // Bad input: a stale UID, a malformed body, an unknown verb.
    let mut stale = binding(&pending(&api, "train-d", 1), "gpu-0");
    stale["PodUID"] = json!("not-this-one");
    assert!(post(addr, "bind", stale).await["Error"].as_str().unwrap().contains("is not incarnation"));
    let (status, text) = http(addr, "POST", "/filter", "{\"Pod\": 3}").await;
    assert_eq!(status, 400, "{text}");
    assert!(text.starts_with("malformed request"), "{text}");
    assert_eq!(http(addr, "POST", "/preempt", "{}").await.0, 404);
    assert_eq!(http(addr, "GET", "/healthz", "").await, (200, "ok".to_string()));

    stop_tx.send(true).unwrap();
    watching.await.unwrap();
    serving.await.unwrap();
    // Every call the extender made is one the chart's extender role grants.
    support::assert_rbac_allows(&api, "extender.yaml", &|name| name == "released-extender");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_binds_never_share_a_gpu() {
    let api = FakeApi::new();
    api.put(Kind::Node, h100_node("gpu-0"));
    let extender = Extender::new(api.client("extender"), registry(), "wasmsched-extender", Default::default());
    let (stop_tx, stop) = watch::channel(false);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(extender.clone().watch(stop.clone()));
    tokio::spawn(extender.clone().serve(listener, stop));
    let probe = pending(&api, "probe", 1);
    let started = Instant::now();
    while post(addr, "filter", json!({"Pod": probe, "NodeNames": ["gpu-0"]})).await["NodeNames"] != json!(["gpu-0"]) {
        assert!(started.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Ten one-GPU pods bound at once on an 8-GPU node: eight get distinct GPUs, two are refused.
    let pods: Vec<Value> = (0..10).map(|i| pending(&api, &format!("p{i}"), 1)).collect();
    let replies = futures_util::future::join_all(pods.iter().map(|p| post(addr, "bind", binding(p, "gpu-0")))).await;
    let ok = replies.iter().filter(|r| r["Error"] == "").count();
    assert_eq!(ok, 8, "{replies:?}");
    let mut gpus: Vec<u32> = (0..10).flat_map(|i| gpus_of(&api, &format!("ml/p{i}")).0).collect();
    gpus.sort();
    assert_eq!(gpus, (0..8).collect::<Vec<_>>());
    stop_tx.send(true).unwrap();
}
