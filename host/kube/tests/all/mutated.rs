//! Damaged API objects — realistic Pods, Nodes, Queues and PodGroups with a quantity made zero,
//! negative or huge, a line dropped, doubled or moved, the object cut short — either do not read,
//! convert with an error, or convert: never a panic or an overflow. What the API server validates
//! is not trusted here (objects of other schedulers, older CRD versions, edits during upgrades).
//! `MUTATIONS=N` runs N per object instead of the default.

use crate::support;

use std::panic::{AssertUnwindSafe, catch_unwind};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use support::fake_api::{gpu_node, pod};
use wasmsched_kube::{convert, crd, queues, workloads};
use wasmsched_sim::generate::{Rng, mutate_text};

fn objects() -> Vec<(&'static str, String)> {
    let mut p = pod("ml", "trainer", "wasmsched", 4, "7500m", "64Gi");
    p["metadata"]["labels"]["scheduling.wasmsched.io/pod-group"] = json!("train");
    p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": "team", "wasmsched.io/gpu-ids": "0,1,2,3"});
    p["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"});
    p["spec"]["affinity"] = json!({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "kubernetes.io/hostname"}]}
    });
    p["spec"]["overhead"] = json!({"cpu": "250m"});
    p["spec"]["initContainers"] = json!([{"name": "fetch", "image": "busybox",
        "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]);
    let queue = json!({"metadata": {"name": "team"}, "spec": {"parent": "org", "weight": 3,
        "guarantee": {"nvidia.com/gpu": "8", "cpu": "64"}, "capability": {"nvidia.com/gpu": "32", "memory": "2Ti"},
        "borrowingLimit": {"nvidia.com/gpu": "8"}, "lendingLimit": {"nvidia.com/gpu": "4"}, "reclaimable": true}});
    let group = json!({"metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 4, "queue": "team", "priorityClassName": "urgent", "scheduleTimeoutSeconds": 600}});
    let pretty = |v: serde_json::Value| serde_json::to_string_pretty(&v).unwrap();
    vec![
        ("pod", pretty(p)),
        ("node", pretty(gpu_node("gpu-0", 8, &[("zone", "a")]))),
        ("queue", pretty(queue)),
        ("podgroup", pretty(group)),
    ]
}

/// Whether the damaged object read and converted; a panic fails the test.
fn convert_one(kind: &str, text: &str) -> bool {
    match kind {
        "pod" => {
            let Ok(p) = serde_json::from_str::<Pod>(text) else { return false };
            let _ = convert::bound_task(&p, &Default::default());
            let _ = convert::extender_task(&p, &Default::default());
            convert::task(&p, &Default::default()).is_ok()
        }
        "node" => {
            serde_json::from_str::<Node>(text).ok().is_some_and(|n| convert::node(&n, &Default::default()).is_ok())
        }
        "queue" => serde_json::from_str::<crd::Queue>(text).ok().is_some_and(|q| queues::spec(&q).is_ok()),
        _ => serde_json::from_str::<crd::PodGroup>(text).ok().is_some_and(|g| {
            let _ = workloads::GroupInfo::new(&g);
            true
        }),
    }
}

#[test]
fn damaged_objects_do_not_read_fail_to_convert_or_convert() {
    let per_object: u64 = std::env::var("MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    for (kind, text) in objects() {
        assert!(convert_one(kind, &text), "the undamaged {kind} converts");
        let mut rng = Rng::new(0x5eed ^ text.len() as u64);
        let (mut refused, mut converted) = (0, 0);
        for i in 0..per_object {
            let mut input = mutate_text(&text, &mut rng);
            if rng.below(3) == 0 {
                input = mutate_text(&input, &mut rng);
            }
            match catch_unwind(AssertUnwindSafe(|| convert_one(kind, &input))) {
                Ok(true) => converted += 1,
                Ok(false) => refused += 1,
                Err(_) => panic!("{kind}, mutation {i}: panicked on\n{input}"),
            }
        }
        assert!(refused > 0 && converted > 0, "{kind}: refused {refused}, converted {converted}");
    }
}
