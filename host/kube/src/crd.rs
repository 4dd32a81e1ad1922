//! The custom resources: `Queue`, `ResourceFlavor`, `PodGroup` and `SchedulingPolicy` (group
//! `scheduling.wasmsched.io`, version `v1alpha1`).
//!
//! The YAML the API server is given is generated from these types ([`crds_yaml`]) and checked in
//! under `charts/wasmsched/crds/`; a test fails when the two drift. Validation the API server can do
//! (minimums, enumerations, CEL rules) lives in the schema so a bad object is refused at `kubectl
//! apply` with a message, not discovered by the scheduler later.
//!
//! What a real API server accepts is narrower than what a schema can say: it estimates each CEL
//! rule's worst-case cost from the bounds of what the rule reads (an unbounded list of unbounded
//! strings makes even a linear rule too expensive, a quadratic one by orders of magnitude), refuses
//! a rule naming a field the schema does not declare, and warns about formats it does not know. So
//! every list and string here is bounded, uniqueness is a list-map key rather than a rule, required
//! fields are `required` rather than `has()` rules, and unsigned formats are written as Kubernetes
//! ones ([`crds`]); the tests check these shapes on every generated CRD.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::crd::merge_crds;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

/// The API group of every wasmsched resource.
pub const GROUP: &str = "scheduling.wasmsched.io";

/// Amounts by resource name (`cpu`, `memory`, `nvidia.com/gpu`, …) as Kubernetes quantities.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A queue: a share of the cluster that jobs are submitted to. Queues form a hierarchy (a queue
/// names its parent); siblings share by weight, a queue always gets its guarantee, never more than
/// its capability, and borrows idle capacity up to its borrowing limit. Cluster-scoped, like the
/// queues of Volcano and Kueue's cluster queues.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "scheduling.wasmsched.io",
    version = "v1alpha1",
    kind = "Queue",
    status = "QueueStatus",
    shortname = "wq",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pending"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    validation = Rule::new("!has(self.spec.parent) || self.spec.parent != self.metadata.name").message("a queue cannot be its own parent"),
)]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// The parent queue; a root queue has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub parent: Option<String>,
    /// Weight among siblings (≥ 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1000000))]
    pub weight: u32,
    /// Guarantee, capability, borrowing and lending limits.
    #[serde(flatten)]
    pub quota: Quota,
    /// Whether what the queue borrows may be reclaimed (by preemption) when its owner needs it.
    #[serde(default = "yes")]
    pub reclaimable: bool,
    /// How long (seconds) a run of this queue is safe from reclaim by other queues; absent: the
    /// scheduler's `--reclaim-min-runtime`. Longer for jobs that lose hours of work when stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 31536000))]
    pub reclaim_min_runtime_seconds: Option<u64>,
    /// A run of this queue that has gone on longer (seconds) is never reclaimed by a queue taking
    /// more than its guarantee; 0: no limit; absent: the scheduler's `--reclaim-max-runtime`.
    /// Short for jobs that run for days without checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 31536000))]
    pub reclaim_max_runtime_seconds: Option<u64>,
    /// Limits checked when a pod (or pod group) is submitted to the queue; one they refuse waits
    /// with the reason and is tried again later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<QueueAdmission>,
    /// Quota per `ResourceFlavor` (Kueue's per-flavor nominal quota), in the order the queue's pods
    /// try the flavors; empty: its parent's flavors (a root's: every flavor).
    /// A flavor is listed once: the list is a map keyed by name, which the API server checks
    /// without a (quadratic) rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub flavors: Vec<FlavorQuota>,
}

/// A queue's quota — over the whole cluster, or on one flavor's nodes. Limits bound only what they
/// name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    /// Always obtainable, never reclaimed from this queue (Kueue's `nominalQuota`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub guarantee: ResourceList,
    /// Upper bound of what the queue holds; unbounded when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<ResourceList>,
    /// How much above its guarantee the queue may borrow from idle siblings; unbounded when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<ResourceList>,
    /// How much of its idle guarantee others may borrow; all of it when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<ResourceList>,
}

/// A queue's quota on the nodes of one `ResourceFlavor` (a guarantee it does not name is 0).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuota {
    /// The `ResourceFlavor`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The quota on its nodes.
    #[serde(flatten)]
    pub quota: Quota,
}

/// A kind of node with quotas of its own (Kueue's `ResourceFlavor`): the nodes carrying all of
/// `nodeLabels`. Queues give quota per flavor; a pod placed with a flavor gets its tolerations.
/// A node belongs to the first flavor, by name, whose labels it carries.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "scheduling.wasmsched.io",
    version = "v1alpha1",
    kind = "ResourceFlavor",
    shortname = "wrf",
    validation = Rule::new("!self.metadata.name.contains('/')").message("a flavor name cannot contain '/'"),
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    /// Labels the flavor's nodes carry, all of them (e.g. `nvidia.com/gpu.product`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Added to pods placed on the flavor's nodes (they are usually tainted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
}

/// A queue's admission limits.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueAdmission {
    /// Most workloads (pods, or pod groups) the queue holds at once, pending and running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_jobs: Option<u32>,
    /// Most GPUs one workload may request, all its pods counted.
    #[serde(default, rename = "maxGPUsPerJob", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_gpus_per_job: Option<u32>,
    /// Inclusive range of the priorities accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_range: Option<PriorityRange>,
}

/// An inclusive range of priorities.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("self.min <= self.max").message("min must not exceed max"))]
pub struct PriorityRange {
    /// Lowest accepted.
    pub min: i32,
    /// Highest accepted.
    pub max: i32,
}

/// What the scheduler reports about a queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// `Ready` (accepted into the hierarchy) with the reason it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// What the queue's running pods request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: ResourceList,
    /// Of that, what runs on each `ResourceFlavor`'s nodes (Kueue's `flavorsUsage`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flavors: BTreeMap<String, ResourceList>,
    /// Pods waiting in the queue.
    #[serde(default)]
    pub pending: u32,
    /// Pods of the queue running.
    #[serde(default)]
    pub running: u32,
}

/// A gang: pods that start together (at least `minMember` of them) or not at all. Pods join a group
/// with the label `scheduling.wasmsched.io/pod-group`, the upstream coscheduling label
/// `scheduling.x-k8s.io/pod-group` or Volcano's annotation `scheduling.k8s.io/group-name`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "scheduling.wasmsched.io",
    version = "v1alpha1",
    kind = "PodGroup",
    namespaced,
    status = "PodGroupStatus",
    shortname = "wpg",
    printcolumn = r#"{"name":"MinMember","type":"integer","jsonPath":".spec.minMember"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".spec.queue"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.running"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Members that must be placed together before any is bound (≥ 1).
    #[schemars(range(min = 1, max = 100000))]
    pub min_member: u32,
    /// The queue the group is submitted to (`default` when absent). Fixed once set: moving a running
    /// job between queues would corrupt both queues' accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("queue is immutable"))]
    pub queue: Option<String>,
    /// Priority among the queue's jobs (higher first). When absent: the value of
    /// `priorityClassName`, else the highest of the members' pod priorities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// A `PriorityClass` whose value is the group's priority (Volcano's field); a class that does
    /// not exist leaves the members' priority in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// How long the members may wait for the gang to be complete and placeable before the group is
    /// marked timed out (and its members' reservations released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub schedule_timeout_seconds: Option<u32>,
    /// Place all members inside one value of this node label (e.g. a rack or NVLink domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 317))]
    pub topology_key: Option<String>,
}

/// Lifecycle of a pod group, as Volcano and the coscheduling plugin name it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum PodGroupPhase {
    /// Waiting for members or capacity.
    #[default]
    Pending,
    /// At least `minMember` members bound.
    Running,
    /// The timeout passed before the gang could be placed.
    TimedOut,
    /// Every member finished.
    Finished,
}

/// What the scheduler reports about a pod group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// Lifecycle phase.
    #[serde(default)]
    pub phase: PodGroupPhase,
    /// `Scheduled` with the reason the gang cannot be placed yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Members bound and not finished.
    #[serde(default)]
    pub running: u32,
    /// Members waiting.
    #[serde(default)]
    pub pending: u32,
}

/// The policy set the scheduler runs, as a Kubernetes object: the same document as a `policy.yaml`
/// (plugins, stages, smoke test, shadow run, rollback), with components taken from ConfigMaps.
/// Applying a new version goes through the same gates as a directory or NATS source: digest,
/// compile, smoke test, optional shadow run, then the atomic swap. Cluster-scoped: one scheduler
/// runs one policy set, named by `--policy-object`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "scheduling.wasmsched.io",
    version = "v1alpha1",
    kind = "SchedulingPolicy",
    status = "SchedulingPolicyStatus",
    shortname = "wsp",
    printcolumn = r#"{"name":"Live","type":"string","jsonPath":".status.live"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicySpec {
    /// The policy set document (see `docs/hot-reload.md`); the scheduler validates it fully and
    /// reports a rejection in the status. The schema only requires its three top-level fields.
    #[schemars(schema_with = "policy_set_document")]
    pub policy_set: serde_json::Value,
    /// Components by the file name a `file:` source uses, each from a ConfigMap's `binaryData`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, ConfigMapKey>,
}

/// A key of a ConfigMap in the scheduler's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKey {
    /// ConfigMap name.
    pub name: String,
    /// Key in its `binaryData`.
    pub key: String,
}

/// What the scheduler reports about a policy object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicyStatus {
    /// `Accepted` (passed the gates) and `Live`, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the object the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The live version's label (`name@version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<String>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// A policy-set document: `name`, `plugins` and `stages` declared and required (the rest of the
/// document is the scheduler's to validate).
fn policy_set_document(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["name", "plugins", "stages"],
        "properties": {
            "name": { "type": "string", "minLength": 1, "maxLength": 253 },
            "plugins": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
            "stages": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        },
    })
}

/// Every CRD, in a stable order.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    // merge_crds validates that each single-version definition is well formed.
    [Queue::crd(), ResourceFlavor::crd(), PodGroup::crd(), SchedulingPolicy::crd()]
        .into_iter()
        .map(|crd| merge_crds(vec![crd], "v1alpha1").expect("one version per CRD"))
        .map(|mut crd| {
            for version in &mut crd.spec.versions {
                if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
                    let mut json = serde_json::to_value(&*schema).expect("a schema serializes");
                    kubernetes_formats(&mut json);
                    *schema = serde_json::from_value(json).expect("still a schema");
                }
            }
            crd
        })
        .collect()
}

/// Rewrite what schemars writes for Rust types into what the API server knows: unsigned integer
/// formats (`uint32`, which it warns about on every apply) become `int32`/`int64` with a minimum
/// of 0, and the many copies of `Quantity`'s page-long description become one line.
fn kubernetes_formats(schema: &mut serde_json::Value) {
    use serde_json::{Value, json};
    match schema {
        Value::Object(map) => {
            let signed = match map.get("format").and_then(Value::as_str) {
                Some("uint8" | "uint16" | "uint32") => Some("int32"),
                Some("uint" | "uint64") => Some("int64"),
                _ => None,
            };
            if let Some(format) = signed {
                map.insert("format".into(), json!(format));
                map.entry("minimum").or_insert(json!(0));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&json!(true))
                && map.get("description").and_then(Value::as_str).is_some_and(|d| d.starts_with("Quantity is"))
            {
                map.insert("description".into(), json!("A Kubernetes quantity, e.g. `8`, `500m`, `16Gi`."));
            }
            map.values_mut().for_each(kubernetes_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(kubernetes_formats),
        _ => {}
    }
}

/// The CRDs as the multi-document YAML checked in at `charts/wasmsched/crds/crds.yaml`.
pub fn crds_yaml() -> String {
    let mut out = String::from(
        "# Generated by `wasmsched crds` from host/kube/src/crd.rs: do not edit (a test checks for drift).\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd).expect("a CRD serializes"));
    }
    out
}

/// The watch failed because the cluster does not serve the resource (its CRD is not installed).
/// A real API server answers a group/version it does not serve with a plain-text `404 page not
/// found`, not a `Status` whose reason is `NotFound`: the code says it.
pub(crate) fn not_installed(e: &kube::runtime::watcher::Error) -> bool {
    matches!(e, kube::runtime::watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;

    #[test]
    fn a_kind_nobody_installed_is_told_by_its_404_whatever_the_body_says() {
        // kube-apiserver v1.36 answers an unknown group/version in plain text; the client makes
        // it a Status with the code and no `NotFound` reason.
        let plain = kube::core::Status::failure("404 page not found", "Failed to parse error data").with_code(404);
        assert!(not_installed(&watcher::Error::InitialListFailed(kube::Error::Api(plain.boxed()))));
        let forbidden = kube::core::Status::failure("jobsets is forbidden", "Forbidden").with_code(403);
        assert!(!not_installed(&watcher::Error::InitialListFailed(kube::Error::Api(forbidden.boxed()))));
    }
}
