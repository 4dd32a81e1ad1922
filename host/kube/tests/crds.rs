//! The CRDs: the checked-in YAML is what the Rust types generate, and the validation rules in it
//! refuse bad objects with a clear message (evaluated with kube's client-side CEL validator on the
//! checked-in schema, the same rules the API server runs).

use std::path::PathBuf;

use kube::core::cel::Validator;
use serde_json::{Value, json};
use wasmsched_kube::crd;

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../charts/wasmsched/crds/crds.yaml")
}

/// Regenerate with `WASMSCHED_BLESS=1 cargo test -p wasmsched-kube --test crds` (or
/// `wasmsched crds > charts/wasmsched/crds/crds.yaml`).
#[test]
fn checked_in_crds_match_the_types() {
    let generated = crd::crds_yaml();
    let path = checked_in_path();
    if std::env::var_os("WASMSCHED_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(checked_in == generated, "{} is stale: run with WASMSCHED_BLESS=1", path.display());
}

/// The openAPIV3Schema of the checked-in CRD of `kind`.
fn schema(kind: &str) -> Value {
    let text = std::fs::read_to_string(checked_in_path()).unwrap();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let crd: Value = serde::Deserialize::deserialize(doc).unwrap();
        if crd["spec"]["names"]["kind"] == kind {
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
        }
    }
    panic!("no CRD for {kind}");
}

fn errors(kind: &str, object: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(kind), object, old) {
        Ok(()) => vec![],
        Err(e) => e.as_slice().iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn a_queue_cannot_be_its_own_parent_or_have_an_empty_parent() {
    let q = |parent: &str| json!({"metadata": {"name": "research"}, "spec": {"parent": parent, "weight": 2}});
    assert!(errors("Queue", &q("root"), None).is_empty());
    let own = errors("Queue", &q("research"), None);
    assert!(own.iter().any(|e| e.contains("a queue cannot be its own parent")), "{own:?}");
    let empty = errors("Queue", &q(""), None);
    assert!(empty.iter().any(|e| e.contains("parent must not be empty")), "{empty:?}");
}

#[test]
fn a_queue_lists_a_flavor_once_and_a_flavor_name_has_no_slash() {
    let q = |flavors: Value| json!({"metadata": {"name": "cq"}, "spec": {"flavors": flavors}});
    let a100 =
        json!({"name": "gpu-a100", "guarantee": {"nvidia.com/gpu": "64"}, "borrowingLimit": {"nvidia.com/gpu": "16"}});
    let v100 = json!({"name": "gpu-v100", "guarantee": {"nvidia.com/gpu": "32"}});
    assert_eq!(errors("Queue", &q(json!([a100, v100])), None), Vec::<String>::new());
    let twice = errors("Queue", &q(json!([a100, v100, a100])), None);
    assert!(twice.iter().any(|e| e.contains("a flavor is listed once")), "{twice:?}");
    let f = |name: &str| json!({"metadata": {"name": name}, "spec": {"nodeLabels": {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB"}}});
    assert!(errors("ResourceFlavor", &f("gpu-v100"), None).is_empty());
    let slash = errors("ResourceFlavor", &f("gpu/v100"), None);
    assert!(slash.iter().any(|e| e.contains("a flavor name cannot contain '/'")), "{slash:?}");
}

#[test]
fn a_pod_group_keeps_its_queue() {
    let g = |queue: &str| json!({"metadata": {"name": "job"}, "spec": {"minMember": 4, "queue": queue}});
    assert!(errors("PodGroup", &g("a"), None).is_empty());
    assert!(errors("PodGroup", &g("a"), Some(&g("a"))).is_empty());
    let moved = errors("PodGroup", &g("b"), Some(&g("a")));
    assert!(moved.iter().any(|e| e.contains("queue is immutable")), "{moved:?}");
}

#[test]
fn a_scheduling_policy_needs_a_complete_policy_set() {
    let p = |set: Value| json!({"metadata": {"name": "default"}, "spec": {"policySet": set}});
    let good = json!({"name": "default", "plugins": {"fit": {"source": "builtin:resource-fit"}}, "stages": {"filter": ["fit"]}});
    assert!(errors("SchedulingPolicy", &p(good), None).is_empty());
    let bad = errors("SchedulingPolicy", &p(json!({"name": "x"})), None);
    assert!(bad.iter().any(|e| e.contains("a policy set needs name, plugins and stages")), "{bad:?}");
}

#[test]
fn the_schemas_carry_the_bounds_the_api_server_enforces() {
    let queue = schema("Queue");
    let weight = &queue["properties"]["spec"]["properties"]["weight"];
    assert_eq!((weight["minimum"].as_f64(), weight["default"].as_u64()), (Some(1.0), Some(1)));
    let group = schema("PodGroup");
    assert_eq!(group["properties"]["spec"]["properties"]["minMember"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(group["properties"]["spec"]["required"], json!(["minMember"]));
    let policy = schema("SchedulingPolicy");
    assert_eq!(
        policy["properties"]["spec"]["properties"]["policySet"]["x-kubernetes-preserve-unknown-fields"],
        json!(true)
    );
    for kind in ["Queue", "PodGroup", "SchedulingPolicy"] {
        assert!(schema(kind)["properties"]["status"].is_object(), "{kind} has a status");
    }
}
