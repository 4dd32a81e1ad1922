//! Accelerators beyond NVIDIA at the HTTP boundary (the fake API server, a MOCK): nodes labelled
//! as each vendor's operator labels them, pods asking for each vendor's resource, a cluster of two
//! kinds with a quota per kind, and a node carrying two kinds.

use std::time::Duration;

use serde_json::{Value, json};
use wasmsched_kube::convert::{GPU_IDS_ANNOTATION, parse_gpu_ids};

use crate::boundary::{NAME, condition_of, eventually, node_of, start};
use crate::support::fake_api::{FakeApi, Kind, gpu_node, pod};

/// A node with `count` of `resource` and the labels its vendor's operator writes, no NVIDIA GPU.
fn vendor_node(name: &str, resource: &str, count: u32, labels: &[(&str, &str)]) -> Value {
    let mut node = gpu_node(name, 0, labels);
    for list in ["capacity", "allocatable"] {
        let l = &mut node["status"][list];
        l.as_object_mut().unwrap().remove("nvidia.com/gpu");
        l[resource] = json!(count.to_string());
    }
    for label in ["nvidia.com/gpu.product", "nvidia.com/gpu.memory"] {
        node["metadata"]["labels"].as_object_mut().unwrap().remove(label);
    }
    node
}

/// A pending pod asking for `count` of `resource` instead of NVIDIA GPUs.
fn vendor_pod(name: &str, resource: &str, count: u32) -> Value {
    let mut p = pod("ml", name, NAME, 0, "1", "1Gi");
    let c = &mut p["spec"]["containers"][0]["resources"];
    c["limits"][resource] = json!(count.to_string());
    c["requests"][resource] = json!(count.to_string());
    p
}

fn devices(api: &FakeApi, id: &str) -> Vec<u32> {
    let pod = api.get(Kind::Pod, id).unwrap();
    let ids = pod["metadata"]["annotations"][GPU_IDS_ANNOTATION].as_str().unwrap_or_default().to_string();
    parse_gpu_ids(&ids).unwrap().into_iter().map(|d| d.gpu).collect()
}

fn every_vendor(api: &FakeApi) {
    api.put(Kind::Node, gpu_node("nvidia-0", 8, &[]));
    api.put(
        Kind::Node,
        vendor_node(
            "amd-0",
            "amd.com/gpu",
            8,
            &[("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"), ("amd.com/gpu.vram", "192G")],
        ),
    );
    api.put(Kind::Node, vendor_node("gaudi-0", "habana.ai/gaudi", 8, &[]));
    api.put(
        Kind::Node,
        vendor_node(
            "ascend-0",
            "huawei.com/Ascend910",
            8,
            &[("accelerator", "huawei-Ascend910"), ("accelerator-type", "module-910b-8")],
        ),
    );
    api.put(
        Kind::Node,
        vendor_node("trn-0", "aws.amazon.com/neuron", 16, &[("node.kubernetes.io/instance-type", "trn1.32xlarge")]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_vendor_s_pods_get_devices_of_their_own_kind_and_nothing_else() {
    let api = FakeApi::new();
    every_vendor(&api);
    let mut mi300 = vendor_pod("mi300", "amd.com/gpu", 2);
    mi300["metadata"]["annotations"] = json!({"wasmsched.io/gpu-models": "AMD_Instinct_MI300X_OAM"});
    let pods = [
        ("ml/h100", pod("ml", "h100", NAME, 8, "1", "1Gi"), "nvidia-0"),
        ("ml/mi300", mi300, "amd-0"),
        ("ml/gaudi", vendor_pod("gaudi", "habana.ai/gaudi", 4), "gaudi-0"),
        ("ml/ascend", vendor_pod("ascend", "huawei.com/Ascend910", 8), "ascend-0"),
        ("ml/trainium", vendor_pod("trainium", "aws.amazon.com/neuron", 16), "trn-0"),
    ];
    // More than any node of the kind has, a model no node has, and two kinds in one pod.
    let mut mi250 = vendor_pod("mi250", "amd.com/gpu", 1);
    mi250["metadata"]["annotations"] = json!({"wasmsched.io/gpu-models": "MI250"});
    let mut both = vendor_pod("both", "amd.com/gpu", 1);
    for list in ["limits", "requests"] {
        both["spec"]["containers"][0]["resources"][list]["nvidia.com/gpu"] = json!("1");
    }
    let waiting = [vendor_pod("too-many", "amd.com/gpu", 9), mi250, both];
    for (_, p, _) in &pods {
        api.put(Kind::Pod, p.clone());
    }
    for p in &waiting {
        api.put(Kind::Pod, p.clone());
    }
    let run = start(&api, "t", None);
    for (id, _, node) in &pods {
        eventually(&format!("{id} bound"), Duration::from_secs(20), || node_of(&api, id).is_some()).await;
        assert_eq!(node_of(&api, id).as_deref(), Some(*node), "{id} on its vendor's node");
    }
    assert_eq!(devices(&api, "ml/gaudi"), [0, 1, 2, 3], "Gaudi's devices chosen and written like NVIDIA's");
    assert_eq!(devices(&api, "ml/trainium").len(), 16);
    for id in ["ml/too-many", "ml/mi250", "ml/both"] {
        eventually(&format!("{id} told why"), Duration::from_secs(20), || condition_of(&api, id).is_some()).await;
    }
    let too_many = condition_of(&api, "ml/too-many").unwrap();
    assert!(too_many.contains("too few amd devices"), "{too_many}");
    let both = condition_of(&api, "ml/both").unwrap();
    assert!(both.contains("amd devices and another kind"), "{both}");
    for id in ["ml/too-many", "ml/mi250", "ml/both"] {
        assert_eq!(node_of(&api, id), None, "{id} must not be placed");
    }
    // A pod asking for NVIDIA GPUs never lands on another vendor's devices, though every other
    // node has eight or more free.
    api.put(Kind::Pod, pod("ml", "one-more-h100", NAME, 1, "1", "1Gi"));
    eventually("told why", Duration::from_secs(20), || condition_of(&api, "ml/one-more-h100").is_some()).await;
    let why = condition_of(&api, "ml/one-more-h100").unwrap();
    assert!(why.contains("nvidia devices"), "{why}");
    assert_eq!(node_of(&api, "ml/one-more-h100"), None);
    // The GPU metrics say each device's kind (refreshed every 10 s).
    let amd = r#"wasmsched_gpus{kind="amd",model="AMD_Instinct_MI300X_OAM",pool=""} 8"#;
    eventually("GPU metrics by kind", Duration::from_secs(25), || run.metrics.render().contains(amd)).await;
    let metrics = run.metrics.render();
    assert!(
        metrics.contains(r#"wasmsched_gpus_allocated{kind="amd",model="AMD_Instinct_MI300X_OAM",pool=""} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"wasmsched_gpus{kind="gaudi","#), "{metrics}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_s_quota_names_its_kind() {
    let api = FakeApi::new();
    api.put(Kind::Node, gpu_node("nvidia-0", 8, &[]));
    api.put(Kind::Node, vendor_node("amd-0", "amd.com/gpu", 8, &[("amd.com/gpu.product-name", "MI300X")]));
    // Four AMD GPUs and eight NVIDIA GPUs for the team.
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "team"}, "spec": {"capability": {"amd.com/gpu": "4", "nvidia.com/gpu": "8"}}}),
    );
    let in_team = |mut p: Value| {
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team"});
        p
    };
    for i in 0..3 {
        api.put(Kind::Pod, in_team(vendor_pod(&format!("amd-{i}"), "amd.com/gpu", 2)));
    }
    api.put(Kind::Pod, in_team(pod("ml", "nv", NAME, 8, "1", "1Gi")));
    let run = start(&api, "t", None);
    for id in ["ml/amd-0", "ml/amd-1", "ml/nv"] {
        eventually(&format!("{id} bound"), Duration::from_secs(20), || node_of(&api, id).is_some()).await;
    }
    eventually("the third AMD pod refused by the AMD quota", Duration::from_secs(20), || {
        condition_of(&api, "ml/amd-2").is_some_and(|m| m.contains("queue team at capability"))
    })
    .await;
    assert_eq!(node_of(&api, "ml/amd-2"), None, "4 AMD GPUs are the team's: the third pair waits");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_two_kinds_gives_each_pod_devices_of_its_own_kind() {
    let api = FakeApi::new();
    let mut node = gpu_node("mixed-0", 4, &[("amd.com/gpu.product-name", "MI300X")]);
    node["status"]["allocatable"]["amd.com/gpu"] = json!("4");
    node["status"]["capacity"]["amd.com/gpu"] = json!("4");
    api.put(Kind::Node, node);
    api.put(Kind::Pod, vendor_pod("amd", "amd.com/gpu", 3));
    api.put(Kind::Pod, pod("ml", "nv", NAME, 3, "1", "1Gi"));
    let run = start(&api, "t", None);
    eventually("both bound", Duration::from_secs(20), || {
        node_of(&api, "ml/amd").is_some() && node_of(&api, "ml/nv").is_some()
    })
    .await;
    assert_eq!(devices(&api, "ml/nv"), [0, 1, 2], "NVIDIA's devices come first");
    assert_eq!(devices(&api, "ml/amd"), [4, 5, 6], "then AMD's");
    api.put(Kind::Pod, pod("ml", "nv-2", NAME, 2, "1", "1Gi"));
    eventually("told why", Duration::from_secs(20), || condition_of(&api, "ml/nv-2").is_some()).await;
    assert_eq!(node_of(&api, "ml/nv-2"), None, "one NVIDIA GPU left, though an AMD one is free too");
    run.stop().await;
}
