//! DRA at the Kubernetes boundary: pods with ResourceClaims against the fake API server, which
//! checks claim writes as strictly as a real one (resourceVersion, an allocation written once,
//! reservations only on allocated claims). What must hold: a claim is allocated and reserved for
//! its pod before the pod is bound, on the node it is bound to; no device is in two claims; a
//! failed bind takes its claim back; a claim allocated before a restart is taken over, not
//! allocated again.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::fake_api::{FakeApi, Fault, Kind, gpu_node, pod};

use crate::boundary::{NAME, eventually, node_of, start};
use crate::support;

const DRIVER: &str = "gpu.example.com";

/// A node without extended-resource GPUs and a slice publishing `gpus` H100s on it.
fn dra_node(api: &FakeApi, name: &str, gpus: u32) {
    dra_node_of(api, name, gpus, "NVIDIA H100 80GB HBM3");
}

/// A node without extended-resource GPUs and a slice publishing `gpus` devices of `product`.
fn dra_node_of(api: &FakeApi, name: &str, gpus: u32, product: &str) {
    api.put(Kind::Node, gpu_node(name, 0, &[]));
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"name": format!("gpu-{i}"),
                   "attributes": {"index": {"int": i}, "productName": {"string": product}},
                   "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    api.put(
        Kind::ResourceSlice,
        json!({"metadata": {"name": format!("{name}-{DRIVER}")},
               "spec": {"driver": DRIVER, "nodeName": name,
                        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    );
}

/// Class `name` over the driver's devices, serving extended resource `resource` (KEP-5004).
fn gpu_class_serving(api: &FakeApi, name: &str, resource: &str) {
    api.put(
        Kind::DeviceClass,
        json!({"metadata": {"name": name},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}],
                        "extendedResourceName": resource}}),
    );
}

fn gpu_class(api: &FakeApi) {
    api.put(
        Kind::DeviceClass,
        json!({"metadata": {"name": "gpu"},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}}),
    );
}

fn claim(name: &str, gpus: u32) -> Value {
    json!({"metadata": {"name": name, "namespace": "ml"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": gpus}}]}}})
}

/// A pending pod using claim `claim` by name (or made from `template` when `claim` is `None`).
fn claiming_pod(name: &str, claim: Option<&str>, template: Option<&str>) -> Value {
    let mut p = pod("ml", name, NAME, 0, "4", "32Gi");
    let mut source = json!({"name": "gpu"});
    if let Some(c) = claim {
        source["resourceClaimName"] = json!(c);
    }
    if let Some(t) = template {
        source["resourceClaimTemplateName"] = json!(t);
    }
    p["spec"]["resourceClaims"] = json!([source]);
    p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
    p
}

/// The devices `claim` has allocated, as `pool/device`.
fn devices_of(api: &FakeApi, claim: &str) -> Vec<String> {
    let c = api.get(Kind::ResourceClaim, claim).unwrap();
    c["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| format!("{}/{}", r["pool"].as_str().unwrap(), r["device"].as_str().unwrap()))
        .collect()
}

fn reserved_for(api: &FakeApi, claim: &str) -> Vec<String> {
    let c = api.get(Kind::ResourceClaim, claim).unwrap();
    c["status"]["reservedFor"].as_array().into_iter().flatten().map(|r| r["uid"].as_str().unwrap().into()).collect()
}

fn uid_of(api: &FakeApi, pod: &str) -> String {
    api.get(Kind::Pod, pod).unwrap()["metadata"]["uid"].as_str().unwrap().into()
}

fn message_of(api: &FakeApi, pod: &str) -> String {
    let p = api.get(Kind::Pod, pod).unwrap();
    let conditions = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.iter().find(|c| c["type"] == "PodScheduled").and_then(|c| c["message"].as_str()).unwrap_or("").into()
}

/// What the resource-claim controller does when a claim's pod is gone: its reservation and
/// allocation are cleared (the fake has no controller).
fn deallocate(api: &FakeApi, claim: &str) {
    let mut c = api.get(Kind::ResourceClaim, claim).unwrap();
    c["status"] = json!({});
    api.put(Kind::ResourceClaim, c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_allocated_on_the_pods_node_before_the_bind_and_no_device_twice() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    dra_node(&api, "n2", 2);
    gpu_class(&api);
    // Three pods of two GPUs each on four GPUs: two run, the third waits for devices.
    for name in ["a", "b", "c"] {
        api.put(Kind::ResourceClaim, claim(&format!("{name}-gpus"), 2));
        api.put(Kind::Pod, claiming_pod(name, Some(&format!("{name}-gpus")), None));
    }
    let running = start(&api, "scheduler", None);
    let bound = |api: &FakeApi| ["a", "b", "c"].iter().filter(|p| node_of(api, &format!("ml/{p}")).is_some()).count();
    eventually("two pods bound", Duration::from_secs(20), || bound(&api) == 2).await;
    let waiting = ["a", "b", "c"].into_iter().find(|p| node_of(&api, &format!("ml/{p}")).is_none()).unwrap();
    // The core counts each class's devices like an extended resource: it says so, as for GPUs.
    eventually("the third told why", Duration::from_secs(10), || {
        message_of(&api, &format!("ml/{waiting}"))
            .contains("2 nodes: insufficient deviceclass.resource.kubernetes.io/gpu")
    })
    .await;

    let mut all = BTreeSet::new();
    for p in ["a", "b", "c"].into_iter().filter(|p| *p != waiting) {
        let id = format!("ml/{p}");
        let node = node_of(&api, &id).unwrap();
        let claim_id = format!("ml/{p}-gpus");
        let devices = devices_of(&api, &claim_id);
        assert_eq!(devices.len(), 2, "{devices:?}");
        assert!(devices.iter().all(|d| d.starts_with(&format!("{node}/"))), "{p} on {node} got {devices:?}");
        assert_eq!(reserved_for(&api, &claim_id), vec![uid_of(&api, &id)]);
        let c = api.get(Kind::ResourceClaim, &claim_id).unwrap();
        assert_eq!(c["metadata"]["finalizers"], json!(["resource.kubernetes.io/delete-protection"]));
        let terms = &c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchFields"][0]["values"], json!([node]), "{terms}");
        for d in devices {
            assert!(all.insert(d.clone()), "device {d} allocated twice");
        }
    }
    // Each bind came after its claim's status write: at every bind, at least as many claim
    // writes as binds so far.
    let requests = api.state().requests.clone();
    let (mut writes, mut binds) = (0, 0);
    for (verb, _, resource) in &requests {
        match (verb.as_str(), resource.as_str()) {
            ("update", "resourceclaims/status") => writes += 1,
            ("create", "pods/binding") => {
                binds += 1;
                assert!(writes >= binds, "a bind before its claim was written: {requests:?}");
            }
            _ => {}
        }
    }
    assert_eq!((writes, binds), (2, 2));

    // One finishes; the claim controller deallocates its claim: the third pod takes the devices.
    let done = ["a", "b", "c"].into_iter().find(|p| *p != waiting).unwrap();
    api.remove(Kind::Pod, &format!("ml/{done}"));
    deallocate(&api, &format!("ml/{done}-gpus"));
    eventually("the third bound once devices are freed", Duration::from_secs(20), || {
        node_of(&api, &format!("ml/{waiting}")).is_some()
    })
    .await;
    assert_eq!(devices_of(&api, &format!("ml/{waiting}-gpus")).len(), 2);
    running.stop().await;
    support::assert_rbac_allows(&api, "rbac.yaml", &|n| !n.contains("leader"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_the_claim_made_from_its_template() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 4);
    gpu_class(&api);
    api.put(Kind::Pod, claiming_pod("t", None, Some("two-gpus")));
    let running = start(&api, "scheduler", None);
    eventually("told it waits for the claim", Duration::from_secs(10), || {
        message_of(&api, "ml/t").contains("waiting for the ResourceClaim of \"gpu\" (from template ml/two-gpus)")
    })
    .await;
    assert!(node_of(&api, "ml/t").is_none());
    // The resource-claim controller creates the claim and names it in the pod's status.
    api.put(Kind::ResourceClaim, claim("t-gpu-x7k2p", 2));
    let mut p = api.get(Kind::Pod, "ml/t").unwrap();
    p["status"]["resourceClaimStatuses"] = json!([{"name": "gpu", "resourceClaimName": "t-gpu-x7k2p"}]);
    api.put(Kind::Pod, p);
    eventually("bound with its claim", Duration::from_secs(20), || node_of(&api, "ml/t").is_some()).await;
    assert_eq!(devices_of(&api, "ml/t-gpu-x7k2p"), vec!["n1/gpu-0", "n1/gpu-1"]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_bind_takes_its_claim_back_and_a_failed_claim_write_binds_nothing() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    api.put(Kind::ResourceClaim, claim("x-gpus", 2));
    api.put(Kind::Pod, claiming_pod("x", Some("x-gpus"), None));
    {
        let mut s = api.state();
        // The first claim write fails; the second succeeds but its bind fails.
        s.claim_faults = 1;
        let fault =
            Fault { status: 500, reason: "InternalError", message: "etcd timeout".into(), bound_elsewhere: None };
        s.bind_faults.insert("ml/x".into(), [fault].into());
    }
    let running = start(&api, "scheduler", None);
    eventually("bound at the third try", Duration::from_secs(30), || node_of(&api, "ml/x").is_some()).await;
    let (binds, claim_writes) = {
        let s = api.state();
        (s.binds.clone(), s.claim_writes.clone())
    };
    let binds: Vec<u16> = binds.iter().filter(|b| b.pod == "ml/x").map(|b| b.status).collect();
    assert_eq!(binds, vec![500, 201], "no bind after the failed claim write");
    // Written, taken back (deallocated: no one else was reserved), written again.
    let writes: Vec<(bool, usize)> = claim_writes
        .iter()
        .map(|(_, st)| (st["allocation"].is_null(), st["reservedFor"].as_array().map_or(0, Vec::len)))
        .collect();
    assert_eq!(writes, vec![(false, 1), (true, 0), (false, 1)], "{claim_writes:?}");
    assert_eq!(reserved_for(&api, "ml/x-gpus"), vec![uid_of(&api, "ml/x")]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_allocated_before_a_restart_is_taken_over_not_allocated_again() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    dra_node(&api, "n2", 2);
    gpu_class(&api);
    api.put(Kind::Pod, claiming_pod("r", Some("r-gpus"), None));
    let uid = uid_of(&api, "ml/r");
    // A previous leader allocated the claim on n2 and reserved it, then stopped before the bind.
    let mut c = claim("r-gpus", 2);
    c["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    c["status"] = json!({
        "allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"},
                {"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-1"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}
        },
        "reservedFor": [{"resource": "pods", "name": "r", "uid": uid}]
    });
    api.put(Kind::ResourceClaim, c);
    // And another pod wants two GPUs: only n1's are free.
    api.put(Kind::ResourceClaim, claim("o-gpus", 2));
    api.put(Kind::Pod, claiming_pod("o", Some("o-gpus"), None));
    let running = start(&api, "scheduler", None);
    eventually("both bound", Duration::from_secs(20), || {
        node_of(&api, "ml/r").is_some() && node_of(&api, "ml/o").is_some()
    })
    .await;
    assert_eq!(node_of(&api, "ml/r").as_deref(), Some("n2"), "where its claim is");
    assert_eq!(node_of(&api, "ml/o").as_deref(), Some("n1"), "n2's devices are held");
    let claim_writes = api.state().claim_writes.clone();
    assert!(claim_writes.iter().all(|(c, _)| c != "ml/r-gpus"), "nothing written again: {claim_writes:?}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_devices_of_running_pods_count_in_their_queue() {
    // A pod of ours runs on n1 with a claim of two devices (allocated, reserved, bound before the
    // restart). Taken over, it counts them in queue "team" again: a second pair does not fit
    // under the queue's capability of three, though n2's devices are free.
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    dra_node(&api, "n2", 2);
    gpu_class(&api);
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "team"}, "spec": {"capability": {"deviceclass.resource.kubernetes.io/gpu": "3"}}}),
    );
    let queued = |name: &str| {
        let mut p = claiming_pod(name, Some(&format!("{name}-gpus")), None);
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team"});
        p
    };
    let mut old = queued("old");
    old["spec"]["nodeName"] = json!("n1");
    old["status"]["phase"] = json!("Running");
    api.put(Kind::Pod, old);
    let uid = uid_of(&api, "ml/old");
    let mut c = claim("old-gpus", 2);
    c["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    c["status"] = json!({
        "allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
        },
        "reservedFor": [{"resource": "pods", "name": "old", "uid": uid}]
    });
    api.put(Kind::ResourceClaim, c);
    api.put(Kind::ResourceClaim, claim("pair-gpus", 2));
    api.put(Kind::Pod, queued("pair"));
    let running = start(&api, "scheduler", None);
    eventually("the pair refused by the quota", Duration::from_secs(20), || {
        message_of(&api, "ml/pair").contains("queue team at capability")
    })
    .await;
    assert!(node_of(&api, "ml/pair").is_none());
    assert!(devices_of(&api, "ml/pair-gpus").is_empty(), "its claim is not allocated");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_gets_all_its_claims_split_across_nodes_as_their_devices_allow() {
    let api = FakeApi::new();
    // Two GPUs free on each node: a gang of two members of two GPUs each runs only split.
    dra_node(&api, "n1", 2);
    dra_node(&api, "n2", 2);
    gpu_class(&api);
    api.put(Kind::PodGroup, json!({"metadata": {"name": "train", "namespace": "ml"}, "spec": {"minMember": 2}}));
    for i in 0..2 {
        api.put(Kind::ResourceClaim, claim(&format!("train-{i}-gpus"), 2));
        let mut p = claiming_pod(&format!("train-{i}"), Some(&format!("train-{i}-gpus")), None);
        p["metadata"]["labels"]["scheduling.wasmsched.io/pod-group"] = json!("train");
        api.put(Kind::Pod, p);
    }
    let running = start(&api, "scheduler", None);
    eventually("both members bound", Duration::from_secs(20), || {
        node_of(&api, "ml/train-0").is_some() && node_of(&api, "ml/train-1").is_some()
    })
    .await;
    let nodes: BTreeSet<String> = (0..2).map(|i| node_of(&api, &format!("ml/train-{i}")).unwrap()).collect();
    assert_eq!(nodes.len(), 2, "split across the two nodes");
    for i in 0..2 {
        let node = node_of(&api, &format!("ml/train-{i}")).unwrap();
        let devices = devices_of(&api, &format!("ml/train-{i}-gpus"));
        assert_eq!(devices, vec![format!("{node}/gpu-0"), format!("{node}/gpu-1")]);
    }
    // Every claim write allocated on the first try: no member was taken back.
    assert_eq!(api.state().claim_writes.len(), 2, "{:?}", api.state().claim_writes);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_preempts_for_devices_held_by_a_lower_one() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    api.put(Kind::ResourceClaim, claim("low-gpus", 2));
    api.put(Kind::Pod, claiming_pod("low", Some("low-gpus"), None));
    let running = start(&api, "scheduler", None);
    eventually("low bound", Duration::from_secs(20), || node_of(&api, "ml/low").is_some()).await;
    api.put(Kind::ResourceClaim, claim("high-gpus", 2));
    let mut high = claiming_pod("high", Some("high-gpus"), None);
    high["spec"]["priority"] = json!(100);
    api.put(Kind::Pod, high);
    // The devices' class count says the node is full: the lower pod is evicted for them.
    eventually("low evicted", Duration::from_secs(20), || api.state().evictions.iter().any(|(p, _)| p == "ml/low"))
        .await;
    eventually("low gone", Duration::from_secs(10), || api.get(Kind::Pod, "ml/low").is_none()).await;
    assert!(node_of(&api, "ml/high").is_none(), "its claim still holds the devices");
    // The resource-claim controller deallocates the claim of the pod that is gone.
    deallocate(&api, "ml/low-gpus");
    eventually("high bound", Duration::from_secs(20), || node_of(&api, "ml/high").is_some()).await;
    assert_eq!(devices_of(&api, "ml/high-gpus"), vec!["n1/gpu-0", "n1/gpu-1"]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_selector_fails_is_told_why_and_others_keep_scheduling() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    // An attribute no device has, used as a number: a run-time error on every device.
    let mut bad = claim("bad-gpus", 1);
    bad["spec"]["devices"]["requests"][0]["exactly"]["selectors"] =
        json!([{"cel": {"expression": "device.attributes['gpu.example.com'].nosuch > 1"}}]);
    api.put(Kind::ResourceClaim, bad);
    api.put(Kind::Pod, claiming_pod("bad", Some("bad-gpus"), None));
    // A claim naming a class that does not exist.
    let mut orphan = claim("orphan-gpus", 1);
    orphan["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = json!("nosuch");
    api.put(Kind::ResourceClaim, orphan);
    api.put(Kind::Pod, claiming_pod("orphan", Some("orphan-gpus"), None));
    api.put(Kind::ResourceClaim, claim("good-gpus", 2));
    api.put(Kind::Pod, claiming_pod("good", Some("good-gpus"), None));
    let running = start(&api, "scheduler", None);
    eventually("the good one bound", Duration::from_secs(20), || node_of(&api, "ml/good").is_some()).await;
    eventually("both told why", Duration::from_secs(10), || {
        message_of(&api, "ml/bad").contains("request gpu: ") && message_of(&api, "ml/orphan").contains("nosuch")
    })
    .await;
    let bad = message_of(&api, "ml/bad");
    assert!(bad.contains("0/1 nodes can serve its ResourceClaims"), "{bad}");
    let orphan = message_of(&api, "ml/orphan");
    assert!(orphan.contains("device class \"nosuch\" does not exist"), "{orphan}");
    assert!(node_of(&api, "ml/bad").is_none() && node_of(&api, "ml/orphan").is_none());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_available_prefers_the_node_that_has_its_first_choice() {
    let api = FakeApi::new();
    // The A100 node is already busier (a pod of others' runs there): packing would choose it.
    dra_node_of(&api, "a100", 4, "NVIDIA A100-SXM4-80GB");
    dra_node_of(&api, "h100", 4, "NVIDIA H100 80GB HBM3");
    gpu_class(&api);
    let mut others = pod("ml", "others", "default-scheduler", 0, "64", "256Gi");
    others["spec"]["nodeName"] = json!("a100");
    others["status"]["phase"] = json!("Running");
    api.put(Kind::Pod, others);
    let mut c = claim("pref-gpu", 1);
    c["spec"]["devices"]["requests"][0] = json!({"name": "gpu", "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu",
         "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].productName.startsWith('NVIDIA H100')")}}]},
        {"name": "any", "deviceClassName": "gpu"}]});
    api.put(Kind::ResourceClaim, c);
    api.put(Kind::Pod, claiming_pod("pref", Some("pref-gpu"), None));
    let running = start(&api, "scheduler", None);
    eventually("bound", Duration::from_secs(20), || node_of(&api, "ml/pref").is_some()).await;
    assert_eq!(node_of(&api, "ml/pref").as_deref(), Some("h100"));
    let c = api.get(Kind::ResourceClaim, "ml/pref-gpu").unwrap();
    assert_eq!(c["status"]["allocation"]["devices"]["results"][0]["request"], "gpu/h100");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_caps_the_devices_of_a_class_its_pods_claim() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 8);
    gpu_class(&api);
    // Queue "team" may hold three devices of class gpu: the second pair does not fit under it.
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "team"}, "spec": {"capability": {"deviceclass.resource.kubernetes.io/gpu": "3"}}}),
    );
    for name in ["q0", "q1"] {
        api.put(Kind::ResourceClaim, claim(&format!("{name}-gpus"), 2));
        let mut p = claiming_pod(name, Some(&format!("{name}-gpus")), None);
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team"});
        api.put(Kind::Pod, p);
    }
    let running = start(&api, "scheduler", None);
    eventually("one bound", Duration::from_secs(20), || {
        ["q0", "q1"].iter().any(|p| node_of(&api, &format!("ml/{p}")).is_some())
    })
    .await;
    let waiting = ["q0", "q1"].into_iter().find(|p| node_of(&api, &format!("ml/{p}")).is_none()).unwrap();
    eventually("the other refused by the quota", Duration::from_secs(20), || {
        message_of(&api, &format!("ml/{waiting}")).contains("queue team at capability")
    })
    .await;
    assert!(devices_of(&api, &format!("ml/{waiting}-gpus")).is_empty(), "its claim is not allocated");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_an_all_request_gets_count_against_its_queue_once_allocated() {
    // An `All` request has no count ahead of its node: what it gets is charged to its queue when
    // it is allocated, so a queue's capability holds against it too.
    let api = FakeApi::new();
    dra_node(&api, "n1", 4);
    dra_node(&api, "n2", 4);
    gpu_class(&api);
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "team"}, "spec": {"capability": {"deviceclass.resource.kubernetes.io/gpu": "5"}}}),
    );
    let queued = |name: &str| {
        let mut p = claiming_pod(name, Some(&format!("{name}-gpus")), None);
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team"});
        p
    };
    let mut all = claim("all-gpus", 1);
    all["spec"]["devices"]["requests"][0]["exactly"] = json!({"deviceClassName": "gpu", "allocationMode": "All"});
    api.put(Kind::ResourceClaim, all);
    api.put(Kind::Pod, queued("all"));
    let running = start(&api, "scheduler", None);
    eventually("the All pod bound", Duration::from_secs(20), || node_of(&api, "ml/all").is_some()).await;
    assert_eq!(devices_of(&api, "ml/all-gpus").len(), 4, "every device of its node");
    eventually("the queue's status shows them", Duration::from_secs(20), || {
        api.get(Kind::Queue, "team")
            .is_some_and(|q| q["status"]["allocated"]["deviceclass.resource.kubernetes.io/gpu"] == json!("4"))
    })
    .await;
    // 4 of the queue's 5 are held: a pair does not fit under it, though n2 has 4 free.
    api.put(Kind::ResourceClaim, claim("pair-gpus", 2));
    api.put(Kind::Pod, queued("pair"));
    eventually("the pair refused by the quota", Duration::from_secs(20), || {
        message_of(&api, "ml/pair").contains("queue team at capability")
    })
    .await;
    assert!(devices_of(&api, "ml/pair-gpus").is_empty(), "its claim is not allocated");
    running.stop().await;

    // A queue that cannot hold what the `All` request would get on any node: not bound, its claim
    // not kept, and told why.
    let api = FakeApi::new();
    dra_node(&api, "n1", 4);
    gpu_class(&api);
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "team"}, "spec": {"capability": {"deviceclass.resource.kubernetes.io/gpu": "3"}}}),
    );
    let mut all = claim("all-gpus", 1);
    all["spec"]["devices"]["requests"][0]["exactly"] = json!({"deviceClassName": "gpu", "allocationMode": "All"});
    api.put(Kind::ResourceClaim, all);
    api.put(Kind::Pod, queued("all"));
    let running = start(&api, "scheduler", None);
    eventually("the All pod told why", Duration::from_secs(20), || {
        message_of(&api, "ml/all").contains("beyond what was counted ahead")
    })
    .await;
    assert!(node_of(&api, "ml/all").is_none());
    assert!(devices_of(&api, "ml/all-gpus").is_empty(), "its claim is not allocated");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_request_is_served_by_dra_devices_through_a_claim_made_for_the_pod() {
    let api = FakeApi::new();
    // The GPUs are DRA devices; the class says it serves `nvidia.com/gpu` (KEP-5004).
    dra_node(&api, "n1", 4);
    gpu_class_serving(&api, "gpu", "nvidia.com/gpu");
    api.put(Kind::Pod, pod("ml", "classic", NAME, 2, "4", "32Gi"));
    api.put(Kind::Pod, pod("ml", "too-many", NAME, 3, "4", "32Gi"));
    let running = start(&api, "scheduler", None);
    eventually("bound", Duration::from_secs(20), || node_of(&api, "ml/classic").is_some()).await;
    let p = api.get(Kind::Pod, "ml/classic").unwrap();
    let status = &p["status"]["extendedResourceClaimStatus"];
    let claim_name = status["resourceClaimName"].as_str().expect("the pod names its claim").to_string();
    assert!(claim_name.starts_with("classic-extended-resources-"), "{claim_name}");
    // One request for the container's GPUs, named by its index and the resource's among its requests.
    assert_eq!(
        status["requestMappings"],
        json!([{"containerName": "trainer", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-2"}])
    );
    let c = api.get(Kind::ResourceClaim, &format!("ml/{claim_name}")).unwrap();
    assert_eq!(c["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"], "true");
    assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], p["metadata"]["uid"]);
    assert_eq!(c["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(c["spec"]["devices"]["requests"][0]["exactly"]["count"], 2);
    assert_eq!(devices_of(&api, &format!("ml/{claim_name}")), vec!["n1/gpu-0", "n1/gpu-1"]);
    assert_eq!(reserved_for(&api, &format!("ml/{claim_name}")), vec![uid_of(&api, "ml/classic")]);
    // Three more do not fit in the two left: counted by class, it waits with no claim made.
    eventually("the second told why", Duration::from_secs(10), || {
        message_of(&api, "ml/too-many").contains("insufficient deviceclass.resource.kubernetes.io/gpu")
    })
    .await;
    assert_eq!(api.objects(Kind::ResourceClaim).len(), 1, "no claim made for a pod that waits");
    running.stop().await;
    support::assert_rbac_allows(&api, "rbac.yaml", &|n| !n.contains("leader"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_made_for_a_pod_whose_bind_fails_is_deleted() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class_serving(&api, "gpu", "nvidia.com/gpu");
    api.put(Kind::Pod, pod("ml", "x", NAME, 2, "4", "32Gi"));
    let fault = Fault { status: 500, reason: "InternalError", message: "etcd timeout".into(), bound_elsewhere: None };
    api.state().bind_faults.insert("ml/x".into(), [fault].into());
    let running = start(&api, "scheduler", None);
    eventually("bound at the second try", Duration::from_secs(30), || node_of(&api, "ml/x").is_some()).await;
    let claims = api.objects(Kind::ResourceClaim);
    assert_eq!(claims.len(), 1, "the first attempt's claim is gone: {claims:?}");
    let name = claims[0]["metadata"]["name"].as_str().unwrap();
    let p = api.get(Kind::Pod, "ml/x").unwrap();
    assert_eq!(p["status"]["extendedResourceClaimStatus"]["resourceClaimName"], name);
    assert_eq!(devices_of(&api, &format!("ml/{name}")).len(), 2);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_of_two_classes_held_under_one_counts_as_held_under_the_other() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    // A second class over the same devices, serving `nvidia.com/gpu`.
    gpu_class_serving(&api, "gpu-ext", "nvidia.com/gpu");
    api.put(Kind::ResourceClaim, claim("a-gpus", 2));
    api.put(Kind::Pod, claiming_pod("a", Some("a-gpus"), None));
    let running = start(&api, "scheduler", None);
    eventually("a bound", Duration::from_secs(20), || node_of(&api, "ml/a").is_some()).await;
    api.put(Kind::Pod, pod("ml", "b", NAME, 2, "4", "32Gi"));
    // The cycle itself sees no gpu-ext device free (not a placement taken back after it).
    eventually("b told why", Duration::from_secs(20), || {
        message_of(&api, "ml/b").contains("insufficient deviceclass.resource.kubernetes.io/gpu-ext")
    })
    .await;
    assert!(node_of(&api, "ml/b").is_none());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_free_devices_the_claim_cannot_use_is_left_out_until_devices_are_freed() {
    let api = FakeApi::new();
    // n1: gpu-0 tainted (NoSchedule), gpu-1 held by another claim. By count one is free, but not
    // for a claim that does not tolerate the taint.
    api.put(Kind::Node, gpu_node("n1", 0, &[]));
    api.put(
        Kind::ResourceSlice,
        json!({"metadata": {"name": "n1-gpus"}, "spec": {"driver": DRIVER, "nodeName": "n1",
               "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
               "devices": [{"name": "gpu-0", "taints": [{"key": "ecc", "effect": "NoSchedule"}]}, {"name": "gpu-1"}]}}),
    );
    gpu_class(&api);
    let mut other = claim("other", 1);
    other["status"] = json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1"}]}}});
    api.put(Kind::ResourceClaim, other);
    api.put(Kind::ResourceClaim, claim("w-gpu", 1));
    api.put(Kind::Pod, claiming_pod("w", Some("w-gpu"), None));
    let running = start(&api, "scheduler", None);
    // Placed there once by count, taken back, then kept off n1: it waits there, written nowhere.
    eventually("kept off n1", Duration::from_secs(20), || {
        message_of(&api, "ml/w").contains("required node affinity does not match")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(message_of(&api, "ml/w").contains("required node affinity does not match"), "it stays off n1");
    assert!(api.state().claim_writes.is_empty());
    // The other claim is deallocated: n1 is tried again and gives it gpu-1.
    deallocate(&api, "ml/other");
    eventually("bound", Duration::from_secs(20), || node_of(&api, "ml/w").is_some()).await;
    assert_eq!(devices_of(&api, "ml/w-gpu"), vec!["n1/gpu-1"]);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_missing_a_slice_is_left_out_and_counted_and_a_claim_on_a_gone_node_says_so() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    // A pool whose second slice was never published: not offered, counted as refused.
    api.put(Kind::Node, gpu_node("n2", 0, &[]));
    api.put(
        Kind::ResourceSlice,
        json!({"metadata": {"name": "n2-half"}, "spec": {"driver": DRIVER, "nodeName": "n2",
               "pool": {"name": "n2", "generation": 1, "resourceSliceCount": 2}, "devices": [{"name": "gpu-0"}]}}),
    );
    // A claim someone allocated to a node that is gone since.
    let mut stale = claim("stale-gpus", 1);
    stale["status"] = json!({"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "gone", "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gone"]}]}]}}});
    api.put(Kind::ResourceClaim, stale);
    api.put(Kind::Pod, claiming_pod("stale", Some("stale-gpus"), None));
    api.put(Kind::ResourceClaim, claim("ok-gpus", 2));
    api.put(Kind::Pod, claiming_pod("ok", Some("ok-gpus"), None));
    let running = start(&api, "scheduler", None);
    eventually("ok bound", Duration::from_secs(20), || node_of(&api, "ml/ok").is_some()).await;
    assert_eq!(node_of(&api, "ml/ok").as_deref(), Some("n1"), "n2's devices are not offered");
    eventually("the stale claim's pod told why", Duration::from_secs(10), || {
        message_of(&api, "ml/stale").contains("ResourceClaim ml/stale-gpus is allocated to other nodes")
    })
    .await;
    let gauge = |state| running.metrics.dra_devices.get_or_create(&wasmsched_kube::metrics::DraLabels { state }).get();
    eventually("gauges", Duration::from_secs(5), || gauge("held") == 3).await;
    assert_eq!((gauge("usable"), gauge("refused")), (2, 1), "n1's two; n2's pool");
    running.stop().await;
}

/// Seen on a real API server (kube-apiserver 1.36): with a DeviceClass serving `nvidia.com/gpu`
/// (KEP-5004) next to device-plugin nodes, pods asking `nvidia.com/gpu` were kept to the DRA
/// nodes, as if the plugin's GPUs were not there. Both kinds serve them: a device-plugin node as
/// it is, a DRA node through a claim made for the pod. With both full a pod waits with both
/// reasons and goes where room appears. Also seen there: once the class is deleted, a pod that
/// was tried with a claim to make must run without one (no stale claim retried forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_mixed_cluster_gpu_pods_use_device_plugin_nodes_and_dra_nodes() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    api.put(Kind::Node, gpu_node("plain", 2, &[]));
    gpu_class_serving(&api, "gpu-ext", "nvidia.com/gpu");
    api.put(Kind::Pod, pod("ml", "a", NAME, 2, "4", "32Gi"));
    api.put(Kind::Pod, pod("ml", "b", NAME, 2, "4", "32Gi"));
    let running = start(&api, "scheduler", None);
    eventually("a and b bound", Duration::from_secs(20), || {
        node_of(&api, "ml/a").is_some() && node_of(&api, "ml/b").is_some()
    })
    .await;
    let on = |node: &str| ["a", "b"].into_iter().find(|p| node_of(&api, &format!("ml/{p}")).as_deref() == Some(node));
    let (on_plain, on_dra) = (on("plain").expect("one on the plugin's node"), on("n1").expect("one on the DRA node"));
    let claim_status =
        |p: &str| api.get(Kind::Pod, &format!("ml/{p}")).unwrap()["status"]["extendedResourceClaimStatus"].clone();
    assert!(claim_status(on_plain).is_null(), "the device plugin's GPUs need no claim");
    let claim = claim_status(on_dra)["resourceClaimName"].as_str().expect("a claim made for it").to_string();
    assert_eq!(devices_of(&api, &format!("ml/{claim}")).len(), 2);

    // Both full: the third waits, told why on each kind of node.
    api.put(Kind::Pod, pod("ml", "p", NAME, 2, "4", "32Gi"));
    eventually("p told why on both kinds", Duration::from_secs(20), || {
        let m = message_of(&api, "ml/p");
        m.contains("device-plugin nodes:")
            && m.contains("DRA nodes:")
            && m.contains("deviceclass.resource.kubernetes.io/gpu-ext")
    })
    .await;
    assert!(node_of(&api, "ml/p").is_none());
    // The class goes, and the plugin's node frees up: p runs there, with no claim.
    api.remove(Kind::DeviceClass, "gpu-ext");
    api.remove(Kind::Pod, &format!("ml/{on_plain}"));
    eventually("p bound on the device-plugin node", Duration::from_secs(20), || node_of(&api, "ml/p").is_some()).await;
    assert_eq!(node_of(&api, "ml/p").as_deref(), Some("plain"));
    assert_eq!(api.objects(Kind::ResourceClaim).len(), 1, "no claim made for a class that is gone");
    assert!(claim_status("p").is_null());
    running.stop().await;
}

/// The dashboard shows each node's DRA devices and the claim that holds each, as the scheduler
/// allocated them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_each_nodes_dra_devices_and_the_claims_holding_them() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    api.put(Kind::ResourceClaim, claim("a-gpus", 1));
    api.put(Kind::Pod, claiming_pod("a", Some("a-gpus"), None));
    let publisher = wasmsched_dashboard::Publisher::new();
    let server = wasmsched_dashboard::Server::start("127.0.0.1:0".parse().unwrap(), publisher.clone()).await.unwrap();
    let run = crate::boundary::start_with_dashboard(&api, "a", publisher);
    eventually("a bound", Duration::from_secs(20), || node_of(&api, "ml/a").is_some()).await;
    let held = devices_of(&api, "ml/a-gpus");
    assert_eq!(held.len(), 1);
    let started = std::time::Instant::now();
    let node = loop {
        let n = crate::workloads::dashboard_get(server.addr(), "/api/v1/nodes/n1").await;
        if n["devices"].as_array().is_some_and(|d| d.iter().any(|d| d["held_by"] != json!([]))) {
            break n;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the view caught up: {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let devices = node["devices"].as_array().unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [format!("{DRIVER}/n1/gpu-0"), format!("{DRIVER}/n1/gpu-1")]);
    // A node whose GPUs only DRA publishes is listed with their model.
    assert_eq!(node["model"], "NVIDIA H100 80GB HBM3", "{node}");
    for d in devices {
        assert_eq!(d["model"], "NVIDIA H100 80GB HBM3");
        let id = d["id"].as_str().unwrap();
        let holders = if id.ends_with(&held[0]) { json!(["ml/a-gpus"]) } else { json!([]) };
        assert_eq!(d["held_by"], holders, "{id} (claim holds {held:?})");
    }
    // A second pod takes the other device: the view follows that node's change alone.
    api.put(Kind::ResourceClaim, claim("b-gpus", 1));
    api.put(Kind::Pod, claiming_pod("b", Some("b-gpus"), None));
    eventually("b bound", Duration::from_secs(20), || node_of(&api, "ml/b").is_some()).await;
    let b = devices_of(&api, "ml/b-gpus");
    let started = std::time::Instant::now();
    loop {
        let n = crate::workloads::dashboard_get(server.addr(), "/api/v1/nodes/n1").await;
        let holders: Vec<Value> = n["devices"].as_array().unwrap().iter().map(|d| d["held_by"].clone()).collect();
        if holders.iter().all(|h| h != &json!([])) {
            let of = |device: &str| {
                n["devices"].as_array().unwrap().iter().find(|d| d["id"].as_str().unwrap().ends_with(device)).unwrap()["held_by"].clone()
            };
            assert_eq!(of(&held[0]), json!(["ml/a-gpus"]));
            assert_eq!(of(&b[0]), json!(["ml/b-gpus"]));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the view caught up: {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.stop().await;
    server.stop();
}

/// A DeviceTaintRule keeps the device it selects from claims that do not tolerate its taint, and
/// its removal gives the device back; a cluster that does not serve the rules schedules from the
/// slices alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_taint_rule_keeps_its_device_from_claims_until_it_is_removed() {
    let api = FakeApi::new();
    dra_node(&api, "n1", 2);
    gpu_class(&api);
    // gpu-0 drained for maintenance: the first claim gets gpu-1, the next waits.
    api.put(
        Kind::DeviceTaintRule,
        json!({"metadata": {"name": "drain-gpu-0"}, "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
            "taint": {"key": "example.com/maintenance", "value": "drain", "effect": "NoSchedule"}}}),
    );
    api.put(Kind::ResourceClaim, claim("one-gpu", 1));
    api.put(Kind::Pod, claiming_pod("one", Some("one-gpu"), None));
    let running = start(&api, "scheduler", None);
    eventually("one bound", Duration::from_secs(20), || node_of(&api, "ml/one").is_some()).await;
    assert_eq!(devices_of(&api, "ml/one-gpu"), vec!["n1/gpu-1"], "the tainted device is not given");
    api.put(Kind::ResourceClaim, claim("next-gpu", 1));
    api.put(Kind::Pod, claiming_pod("next", Some("next-gpu"), None));
    // Its reason names the taint, beside the core's count of the class's devices.
    eventually("next told why", Duration::from_secs(20), || {
        let why = message_of(&api, "ml/next");
        why.contains("now: 0/1 nodes can serve its ResourceClaims")
            && why.contains("1 with a taint it does not tolerate")
    })
    .await;
    assert!(node_of(&api, "ml/next").is_none(), "gpu-0 stays drained while the rule stands");
    // The maintenance is over.
    api.remove(Kind::DeviceTaintRule, "drain-gpu-0");
    eventually("next bound", Duration::from_secs(20), || node_of(&api, "ml/next").is_some()).await;
    assert_eq!(devices_of(&api, "ml/next-gpu"), vec!["n1/gpu-0"]);
    running.stop().await;
    crate::boundary::assert_chart_rbac_allows(&api);

    // Not served (`resource.k8s.io/v1beta2` off): the slices' devices are given as they are.
    let api = FakeApi::new();
    api.state().unserved.insert(Kind::DeviceTaintRule);
    dra_node(&api, "n1", 1);
    gpu_class(&api);
    api.put(Kind::ResourceClaim, claim("a-gpu", 1));
    api.put(Kind::Pod, claiming_pod("a", Some("a-gpu"), None));
    let running = start(&api, "scheduler", None);
    eventually("bound without the rules", Duration::from_secs(20), || node_of(&api, "ml/a").is_some()).await;
    running.stop().await;
}
