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

/// Regenerate with `WASMSCHED_BLESS=1 cargo test -p wasmsched-kube --test all crds::` (or
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
    // An empty parent is refused by the schema itself (no rule needed, no rule cost).
    let parent = &schema("Queue")["properties"]["spec"]["properties"]["parent"];
    assert_eq!((parent["minLength"].as_u64(), parent["maxLength"].as_u64()), (Some(1), Some(253)));
}

#[test]
fn a_queue_lists_a_flavor_once_and_a_flavor_name_has_no_slash() {
    let q = |flavors: Value| json!({"metadata": {"name": "cq"}, "spec": {"flavors": flavors}});
    let a100 =
        json!({"name": "gpu-a100", "guarantee": {"nvidia.com/gpu": "64"}, "borrowingLimit": {"nvidia.com/gpu": "16"}});
    let v100 = json!({"name": "gpu-v100", "guarantee": {"nvidia.com/gpu": "32"}});
    assert_eq!(errors("Queue", &q(json!([a100, v100])), None), Vec::<String>::new());
    // Listed twice: a list-map keyed by name, which the API server refuses as a duplicate entry
    // (it was a quadratic CEL rule that a real server refused to install).
    let flavors = &schema("Queue")["properties"]["spec"]["properties"]["flavors"];
    assert_eq!(flavors["x-kubernetes-list-type"], "map");
    assert_eq!(flavors["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(flavors["items"]["required"], json!(["name"]), "a list-map key must be required");
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
    // Required by the schema (declared, so the server knows them), not by a `has()` rule over an
    // undeclared object, which a real server refused to compile.
    let set = &schema("SchedulingPolicy")["properties"]["spec"]["properties"]["policySet"];
    assert_eq!(set["required"], json!(["name", "plugins", "stages"]));
    assert_eq!(set["properties"]["name"]["type"], "string");
}

/// Formats the API server knows; any other one draws a warning on every apply.
const KNOWN_FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "binary",
    "date",
    "date-time",
    "datetime",
    "password",
    "duration",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "quantity",
];

/// The shapes a real API server refuses or warns about, found without one: an unknown format; a
/// CEL rule naming a field its object does not declare ("undefined field"); a rule over a list or
/// string without a bound (the server's cost estimate then assumes the largest request); a rule
/// with nested list macros (quadratic). Not a CEL cost estimator: a conservative shape check.
fn problems(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(map) = node.as_object() else { return };
    if let Some(format) = map.get("format").and_then(Value::as_str)
        && !KNOWN_FORMATS.contains(&format)
    {
        out.push(format!("{path}: unknown format {format}"));
    }
    for rule in map.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        let rule = rule["rule"].as_str().unwrap_or_default();
        for field in fields_read(rule) {
            let declared = map.get("properties").is_some_and(|p| p.get(&field).is_some());
            if !declared && field != "metadata" {
                out.push(format!("{path}: rule `{rule}` reads undefined field {field}"));
            }
        }
        let macros = ["all(", "exists(", "exists_one(", "map(", "filter("]
            .iter()
            .map(|m| rule.matches(m).count())
            .sum::<usize>();
        match map.get("type").and_then(Value::as_str) {
            Some("array") if map.get("maxItems").is_none() => {
                out.push(format!("{path}: rule `{rule}` over an unbounded list"))
            }
            Some("string") if map.get("maxLength").is_none() => {
                out.push(format!("{path}: rule `{rule}` over an unbounded string"))
            }
            _ => {}
        }
        if macros > 1 {
            out.push(format!("{path}: rule `{rule}` nests list macros (quadratic cost)"));
        }
    }
    for (key, child) in map {
        match key.as_str() {
            "properties" => {
                for (name, schema) in child.as_object().into_iter().flatten() {
                    problems(schema, &format!("{path}.{name}"), out);
                }
            }
            "items" | "additionalProperties" => problems(child, &format!("{path}[]"), out),
            _ => {}
        }
    }
}

/// The fields a rule reads directly on `self` (`self.name`, not `self.size()`).
fn fields_read(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in rule.match_indices("self.") {
        let rest = &rule[at + 5..];
        let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !ident.is_empty() && !rest[ident.len()..].starts_with('(') {
            out.push(ident);
        }
    }
    out
}

#[test]
fn every_crd_has_the_shapes_a_real_api_server_accepts() {
    for kind in ["Queue", "ResourceFlavor", "PodGroup", "SchedulingPolicy"] {
        let mut found = Vec::new();
        problems(&schema(kind), kind, &mut found);
        assert!(found.is_empty(), "{kind}: {found:#?}");
    }
}

/// The check finds each shape that made a real API server refuse the chart's CRDs before.
#[test]
fn the_shape_check_finds_what_a_real_api_server_refused() {
    let quadratic = json!({"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        "x-kubernetes-validations": [{"rule": "self.all(f, self.exists_one(g, g.name == f.name))"}]});
    let undeclared = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-validations": [{"rule": "has(self.name) && has(self.plugins)"}]});
    let unsigned = json!({"type": "integer", "format": "uint32"});
    let unbounded = json!({"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]});
    for (schema, words) in [
        (quadratic, "nests list macros"),
        (quadratic_unbounded(), "over an unbounded list"),
        (undeclared, "undefined field name"),
        (unsigned, "unknown format uint32"),
        (unbounded, "over an unbounded string"),
    ] {
        let mut found = Vec::new();
        problems(&schema, "x", &mut found);
        assert!(found.iter().any(|p| p.contains(words)), "{words}: {found:?}");
    }
}

fn quadratic_unbounded() -> Value {
    json!({"type": "array", "x-kubernetes-validations": [{"rule": "self.all(f, f.size() > 0)"}]})
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
