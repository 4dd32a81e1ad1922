//! A fake Kubernetes API server at the HTTP boundary — a MOCK, named as such: no API server can run
//! on these machines. kube-rs talks to it through `kube::Client::new(service, ns)` (kube-rs's
//! mock-service pattern) with real request paths and real API response bodies: lists with
//! resource versions and continue tokens, watch streams of newline-delimited events with `410 Gone`
//! for expired versions, the `pods/binding` subresource with Kubernetes' conflict rules, status
//! patches, events, evictions guarded by a disruption budget, and Leases with optimistic
//! concurrency. Faults (status codes, latency) can be injected per route.
//!
//! As strict as a real API server where one proved to differ: evicting a pod bound to a node is a
//! graceful deletion (a `deletionTimestamp` and grace period first; the pod is gone only when its
//! kubelet has stopped it), while an unbound pod is deleted at once; with API Priority and
//! Fairness on ([`FakeApi::enable_apf`]), each request is classified into a priority level by the
//! chart's FlowSchemas (else the service accounts' `workload-low`) and answered `429` with
//! `Retry-After: 1` when its level is over its rate.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Resource kinds the fake serves, by their collection path segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Node,
    Pod,
    PodGroup,
    Lease,
    SchedulingPolicy,
    ConfigMap,
    Queue,
    ResourceFlavor,
    PriorityClass,
    PodDisruptionBudget,
    ResourceSlice,
    DeviceClass,
    ResourceClaim,
    /// `resource.k8s.io/v1beta2` DeviceTaintRule (like every kind, answered `404` as a real API
    /// server does when in [`State::unserved`]).
    DeviceTaintRule,
    /// The Workload API's `PodGroup` (`scheduling.k8s.io`, at [`State::upstream_version`]).
    UpstreamPodGroup,
    /// The Workload API's `Workload`.
    Workload,
    /// The coscheduling plugin's `PodGroup` (`scheduling.x-k8s.io/v1alpha1`).
    CoschedulingPodGroup,
    /// Volcano's `PodGroup` (`scheduling.volcano.sh/v1beta1`).
    VolcanoPodGroup,
    Job,
    JobSet,
    PyTorchJob,
    TfJob,
    MpiJob,
    RayCluster,
    LeaderWorkerSet,
    /// NVIDIA's DRA driver's `resource.nvidia.com/v1beta1` ComputeDomain, validated as its CRD's
    /// schema does (spec required, `numNodes` and the channel's template name required, spec
    /// immutable, `allocationMode` defaulted to `Single`).
    ComputeDomain,
}

impl Kind {
    fn list_kind(self) -> &'static str {
        match self {
            Kind::Node => "NodeList",
            Kind::Pod => "PodList",
            Kind::PodGroup => "PodGroupList",
            Kind::Lease => "LeaseList",
            Kind::SchedulingPolicy => "SchedulingPolicyList",
            Kind::ConfigMap => "ConfigMapList",
            Kind::Queue => "QueueList",
            Kind::ResourceFlavor => "ResourceFlavorList",
            Kind::PriorityClass => "PriorityClassList",
            Kind::PodDisruptionBudget => "PodDisruptionBudgetList",
            Kind::ResourceSlice => "ResourceSliceList",
            Kind::DeviceTaintRule => "DeviceTaintRuleList",
            Kind::DeviceClass => "DeviceClassList",
            Kind::ResourceClaim => "ResourceClaimList",
            Kind::UpstreamPodGroup | Kind::CoschedulingPodGroup | Kind::VolcanoPodGroup => "PodGroupList",
            Kind::Workload => "WorkloadList",
            Kind::Job => "JobList",
            Kind::JobSet => "JobSetList",
            Kind::PyTorchJob => "PyTorchJobList",
            Kind::TfJob => "TFJobList",
            Kind::MpiJob => "MPIJobList",
            Kind::RayCluster => "RayClusterList",
            Kind::LeaderWorkerSet => "LeaderWorkerSetList",
            Kind::ComputeDomain => "ComputeDomainList",
        }
    }
    fn kind_name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::PodGroup | Kind::UpstreamPodGroup | Kind::CoschedulingPodGroup | Kind::VolcanoPodGroup => "PodGroup",
            Kind::Lease => "Lease",
            Kind::SchedulingPolicy => "SchedulingPolicy",
            Kind::ConfigMap => "ConfigMap",
            Kind::Queue => "Queue",
            Kind::ResourceFlavor => "ResourceFlavor",
            Kind::PriorityClass => "PriorityClass",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
            Kind::ResourceSlice => "ResourceSlice",
            Kind::DeviceTaintRule => "DeviceTaintRule",
            Kind::DeviceClass => "DeviceClass",
            Kind::ResourceClaim => "ResourceClaim",
            Kind::Workload => "Workload",
            Kind::Job => "Job",
            Kind::JobSet => "JobSet",
            Kind::PyTorchJob => "PyTorchJob",
            Kind::TfJob => "TFJob",
            Kind::MpiJob => "MPIJob",
            Kind::RayCluster => "RayCluster",
            Kind::LeaderWorkerSet => "LeaderWorkerSet",
            Kind::ComputeDomain => "ComputeDomain",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::Node | Kind::Pod | Kind::ConfigMap => "v1",
            Kind::PodGroup | Kind::SchedulingPolicy | Kind::Queue | Kind::ResourceFlavor => {
                "scheduling.wasmsched.io/v1alpha1"
            }
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::PriorityClass => "scheduling.k8s.io/v1",
            Kind::PodDisruptionBudget => "policy/v1",
            Kind::ResourceSlice | Kind::DeviceClass | Kind::ResourceClaim => "resource.k8s.io/v1",
            Kind::DeviceTaintRule => "resource.k8s.io/v1beta2",
            // The version served is the state's: objects keep the one they were made with.
            Kind::UpstreamPodGroup | Kind::Workload => "scheduling.k8s.io/v1beta1",
            Kind::CoschedulingPodGroup => "scheduling.x-k8s.io/v1alpha1",
            Kind::VolcanoPodGroup => "scheduling.volcano.sh/v1beta1",
            Kind::Job => "batch/v1",
            Kind::JobSet => "jobset.x-k8s.io/v1alpha2",
            Kind::PyTorchJob | Kind::TfJob => "kubeflow.org/v1",
            Kind::MpiJob => "kubeflow.org/v2beta1",
            Kind::RayCluster => "ray.io/v1",
            Kind::LeaderWorkerSet => "leaderworkerset.x-k8s.io/v1",
            Kind::ComputeDomain => "resource.nvidia.com/v1beta1",
        }
    }
}

/// A bind the fake accepted or refused.
#[derive(Clone, Debug)]
pub struct BindCall {
    pub pod: String,
    pub node: String,
    pub annotations: BTreeMap<String, String>,
    pub status: u16,
    /// The client that sent it (see [`FakeApi::client`]).
    pub client: String,
}

/// What an injected fault does to the next matching request.
#[derive(Clone, Debug)]
pub struct Fault {
    pub status: u16,
    pub reason: &'static str,
    pub message: String,
    /// For a 409 on a bind: bind the pod to this node first, as if another scheduler won.
    pub bound_elsewhere: Option<String>,
}

type Key = (Kind, String); // (kind, "namespace/name" or "name")

struct Watcher {
    kind: Kind,
    /// Its `fieldSelector`, if any.
    fields: Option<String>,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
pub struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change: (rv, kind, type, object).
    /// (resource version, kind, type, object, the object before).
    history: Vec<(u64, Kind, &'static str, Value, Option<Value>)>,
    /// Watches from before this version get `410 Gone`.
    compacted: u64,
    watchers: Vec<Watcher>,
    pub binds: Vec<BindCall>,
    /// Pods whose bind arrived (before its latency and its answer), in order.
    pub bind_arrivals: Vec<String>,
    pub status_patches: Vec<(String, Value)>,
    pub events: Vec<Value>,
    pub evictions: Vec<(String, u16)>,
    /// Pod metadata merge patches, by pod.
    pub metadata_patches: Vec<(String, Value)>,
    pub lease_writes: Vec<(String, String, u16)>,
    /// Faults for the next binds of a pod (`namespace/name`), in order.
    pub bind_faults: BTreeMap<String, VecDeque<Fault>>,
    /// Faults for lease writes by a client.
    pub lease_faults: BTreeMap<String, u32>,
    /// Pods an eviction would take below their disruption budget.
    pub protected: Vec<String>,
    /// Latency added to every bind.
    pub bind_latency: Duration,
    /// Latency added to every event write.
    pub event_latency: Duration,
    /// Event writes in flight now, and the most ever at once.
    pub events_in_flight: (usize, usize),
    /// Latency added to every PodGroup status write.
    pub status_latency: Duration,
    /// PodGroup status writes in flight now, and the most ever at once.
    pub status_in_flight: (usize, usize),
    /// API Priority and Fairness, when on.
    pub apf: Option<Apf>,
    /// Requests answered 429 by APF: (priority level, verb, resource).
    pub throttled: Vec<(String, String, String)>,
    /// When each Lease write was answered, with its status.
    pub lease_times: Vec<(Instant, u16)>,
    /// How long the "kubelet" takes to stop an evicted pod after its graceful deletion starts;
    /// `None`: never by itself (a finalizer, a long grace period) until [`FakeApi::finish_termination`].
    pub termination: Option<Duration>,
    pub lists: BTreeMap<Kind, u32>,
    /// Time spent building list responses: the API server's share of a cold start.
    pub list_time: Duration,
    pub watches: BTreeMap<Kind, u32>,
    /// Every request as RBAC sees it: (verb, API group, resource[/subresource]).
    pub requests: Vec<(String, String, String)>,
    /// The Workload API's version served (`None`: the API is off, as by default before 1.37).
    pub upstream_version: Option<&'static str>,
    /// Kinds answered `404` (a CRD not installed).
    pub unserved: std::collections::BTreeSet<Kind>,
    /// ComputeDomain requests: (method, `namespace/name`).
    pub compute_domain_calls: Vec<(String, String)>,
    /// Event creation is forbidden (RBAC without `events` create, as a mis-installed chart).
    pub events_refused: bool,
    /// ResourceClaim status writes accepted: (claim, status written).
    pub claim_writes: Vec<(String, Value)>,
    /// The next ResourceClaim status writes that fail with a 500.
    pub claim_faults: u32,
}

/// API Priority and Fairness, as far as a client can see it: per priority level a rate (a token
/// bucket of seats per second); a request over it is rejected with 429, never queued.
pub struct Apf {
    /// `(level, API group, resource, verb)` in matching order; unmatched requests go to
    /// `workload-low`, where a service account's requests land by default.
    pub rules: Vec<(String, String, String, String)>,
    /// Per level: requests per second and burst. A level not named is unlimited.
    pub limits: BTreeMap<String, (f64, f64)>,
    buckets: BTreeMap<String, (f64, Instant)>,
}

impl Apf {
    pub fn new(rules: Vec<(String, String, String, String)>, limits: &[(&str, f64, f64)]) -> Apf {
        let limits = limits.iter().map(|(l, qps, burst)| (l.to_string(), (*qps, *burst))).collect();
        Apf { rules, limits, buckets: BTreeMap::new() }
    }

    fn level(&self, (verb, group, resource): &(String, String, String)) -> String {
        self.rules
            .iter()
            .find(|(_, g, r, v)| g == group && r == resource && v == verb)
            .map_or_else(|| "workload-low".to_string(), |(l, ..)| l.clone())
    }

    /// Whether a request of `level` is admitted now.
    fn admit(&mut self, level: &str) -> bool {
        let Some(&(qps, burst)) = self.limits.get(level) else { return true };
        let now = Instant::now();
        let (tokens, at) = self.buckets.entry(level.to_string()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * qps).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The fake API server. Cheap to clone; every clone shares the state.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": if code < 300 { "Success" } else { "Failure" },
           "message": message, "reason": reason, "code": code})
}

type Body = BoxBody<Bytes, Infallible>;

fn respond(code: u16, body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    r.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
    r
}

fn key_of(kind: Kind, obj: &Value) -> Key {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match obj["metadata"]["namespace"].as_str() {
        Some(ns)
            if !matches!(
                kind,
                Kind::Node
                    | Kind::SchedulingPolicy
                    | Kind::Queue
                    | Kind::ResourceFlavor
                    | Kind::PriorityClass
                    | Kind::ResourceSlice
                    | Kind::DeviceClass
                    | Kind::DeviceTaintRule
            ) =>
        {
            (kind, format!("{ns}/{name}"))
        }
        _ => (kind, name.to_string()),
    }
}

/// The resource a discovery request is recorded under.
pub const DISCOVERY: &str = "(discovery)";

/// A request as RBAC authorises it: the verb, API group and resource (with its subresource).
fn authorization(m: &Method, path: &[&str], q: &BTreeMap<String, String>) -> (String, String, String) {
    // Discovery (`/apis/<group>/<version>`) is a non-resource URL every authenticated client may
    // read (the `system:discovery` role), not a grant of the chart.
    if let ["apis", _group, _version] = path {
        return ("get".into(), "".into(), DISCOVERY.into());
    }
    let (group, rest) = match path {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => ("?", path),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
        _ => ("?".to_string(), false),
    };
    let verb = match *m {
        Method::GET if !named && q.get("watch").map(String::as_str) == Some("true") => "watch",
        Method::GET if !named => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if !named => "deletecollection",
        Method::DELETE => "delete",
        _ => "?",
    };
    (verb.to_string(), group.to_string(), resource)
}

fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a watch with `fields` sees of a change, as kube-apiserver's watch cache decides it: an
/// object that comes to match is `ADDED`, one that stops matching is `DELETED` with its previous
/// content (and the change's resource version), one that matched neither before nor after is not
/// seen.
fn as_watched(kind_type: &str, obj: &Value, before: Option<&Value>, fields: Option<&String>) -> Option<Value> {
    let now = kind_type != "DELETED" && matches_fields(obj, fields);
    let was = before.is_some_and(|b| matches_fields(b, fields));
    let (t, o) = match (now, was) {
        (true, false) => ("ADDED", obj.clone()),
        (true, true) => ("MODIFIED", obj.clone()),
        (false, true) => {
            let mut old = before?.clone();
            old["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"].clone();
            ("DELETED", old)
        }
        (false, false) => return None,
    };
    Some(json!({"type": t, "object": o}))
}

/// Field selectors of `field=value` and `field!=value` terms on the fields a real server selects
/// pods by (the scheduler's `status.phase!=X`, a binder's `spec.schedulerName=X,spec.nodeName=`,
/// a namespaced request's namespace); a missing field is the empty string, as there.
fn matches_fields(obj: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else { return true };
    let field = |path: &str| -> Option<&str> {
        let v = match path {
            "status.phase" => &obj["status"]["phase"],
            "spec.nodeName" => &obj["spec"]["nodeName"],
            "spec.schedulerName" => &obj["spec"]["schedulerName"],
            "metadata.namespace" => &obj["metadata"]["namespace"],
            "metadata.name" => &obj["metadata"]["name"],
            _ => return None,
        };
        Some(v.as_str().unwrap_or_default())
    };
    selector.split(',').all(|term| match term.split_once("!=") {
        Some((path, v)) => field(path).is_none_or(|f| f != v),
        None => match term.split_once("==").or_else(|| term.split_once('=')) {
            Some((path, v)) => field(path).is_none_or(|f| f == v),
            None => true,
        },
    })
}

/// `labelSelector` of `key=value` terms (all the scheduler sends).
fn matches_labels(obj: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else { return true };
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => obj["metadata"]["labels"][k].as_str() == Some(v),
        None => obj["metadata"]["labels"][term].is_string(),
    })
}

impl State {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, kind: Kind, kind_type: &'static str, obj: Value, before: Option<Value>) {
        let rv: u64 = obj["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(self.rv);
        self.watchers.retain(|w| {
            if w.kind != kind {
                return true;
            }
            let Some(event) = as_watched(kind_type, &obj, before.as_ref(), w.fields.as_ref()) else { return true };
            let mut l = serde_json::to_vec(&event).unwrap();
            l.push(b'\n');
            w.tx.send(Bytes::from(l)).is_ok()
        });
        self.history.push((rv, kind, kind_type, obj, before));
    }

    fn upsert(&mut self, kind: Kind, mut obj: Value) -> Value {
        let rv = self.bump();
        if !(matches!(kind, Kind::UpstreamPodGroup | Kind::Workload) && obj["apiVersion"].is_string()) {
            obj["apiVersion"] = json!(kind.api_version());
        }
        obj["kind"] = json!(kind.kind_name());
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{rv}"));
        }
        let key = key_of(kind, &obj);
        let kind_type = if self.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
        // As a real server: `metadata.generation` is 1 at creation and goes up with each change of
        // the spec (status and metadata writes leave it), whatever the writer sent.
        // kube-apiserver 1.36 leaves a `v1alpha2` PodGroup without a generation, and puts its
        // delete-protection finalizer on it.
        let alpha_group = kind == Kind::UpstreamPodGroup && obj["apiVersion"] == "scheduling.k8s.io/v1alpha2";
        if alpha_group && !self.objects.contains_key(&key) {
            obj["metadata"]["finalizers"] = json!(["scheduling.k8s.io/podgroup-protection"]);
        }
        if !obj["spec"].is_null() && !alpha_group {
            let generation = match self.objects.get(&key) {
                Some(old) if old["spec"] == obj["spec"] => old["metadata"]["generation"].as_i64().unwrap_or(1),
                Some(old) => old["metadata"]["generation"].as_i64().unwrap_or(1) + 1,
                None => 1,
            };
            obj["metadata"]["generation"] = json!(generation);
        }
        let before = self.objects.insert(key, obj.clone());
        self.record(kind, kind_type, obj.clone(), before);
        obj
    }

    fn delete(&mut self, kind: Kind, key: &str) -> Option<Value> {
        let mut obj = self.objects.remove(&(kind, key.to_string()))?;
        let rv = self.bump();
        let before = obj.clone();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(kind, "DELETED", obj.clone(), Some(before));
        Some(obj)
    }
}

impl FakeApi {
    pub fn new() -> FakeApi {
        let api = FakeApi::default();
        // Containers that stop promptly on SIGTERM: gone a moment after the eviction.
        api.state().termination = Some(Duration::from_millis(300));
        api
    }

    /// The kubelet has stopped a pod in graceful deletion: it is deleted now. `false` when there
    /// was no such pod.
    pub fn finish_termination(&self, id: &str) -> bool {
        let mut s = self.state();
        let terminating =
            s.objects.get(&(Kind::Pod, id.to_string())).is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null());
        terminating && s.delete(Kind::Pod, id).is_some()
    }

    /// A `kube::Client` talking to this fake, whose requests are recorded as `name`'s.
    pub fn client(&self, name: &str) -> kube::Client {
        kube::Client::new(FakeService { api: self.clone(), client: name.to_string() }, "default")
    }

    /// The scheduler's clients as `wasmsched run` builds them, recorded as `name`'s: the API
    /// client limited to `rate` (kube-scheduler's defaults unless given), the Lease's on its own.
    pub fn clients(&self, name: &str, rate: Option<wasmsched_kube::ClientRate>) -> wasmsched_kube::Clients {
        use tower::Layer;
        let layer = wasmsched_kube::throttle::ThrottleLayer::new(rate.unwrap_or_default());
        let service = layer.layer(FakeService { api: self.clone(), client: name.to_string() });
        wasmsched_kube::Clients {
            api: kube::Client::new(service, "default"),
            events: None,
            election: self.client(name),
        }
    }

    /// The clients exactly as `wasmsched run` builds them: the API client and the events client
    /// each limited to `rate` on a bucket of its own, the Lease's unlimited.
    pub fn run_clients(&self, name: &str, rate: wasmsched_kube::ClientRate) -> wasmsched_kube::Clients {
        use tower::Layer;
        let limited = || {
            let layer = wasmsched_kube::throttle::ThrottleLayer::new(rate);
            kube::Client::new(layer.layer(FakeService { api: self.clone(), client: name.to_string() }), "default")
        };
        wasmsched_kube::Clients { api: limited(), events: Some(limited()), election: self.client(name) }
    }

    /// API Priority and Fairness from now on.
    pub fn enable_apf(&self, apf: Apf) {
        self.state().apf = Some(apf);
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub fn put(&self, kind: Kind, obj: Value) -> Value {
        self.state().upsert(kind, obj)
    }

    pub fn remove(&self, kind: Kind, key: &str) -> Option<Value> {
        self.state().delete(kind, key)
    }

    pub fn get(&self, kind: Kind, key: &str) -> Option<Value> {
        self.state().objects.get(&(kind, key.to_string())).cloned()
    }

    pub fn objects(&self, kind: Kind) -> Vec<Value> {
        self.state().objects.iter().filter(|((k, _), _)| *k == kind).map(|(_, v)| v.clone()).collect()
    }

    /// Ends every open watch, deletes `gone` and adds `added` (of `kind`) and compacts, all under
    /// one lock: no watch can see the change (a client re-watching gets `410 Gone`, as after an
    /// etcd compaction), only a re-list.
    pub fn replace_unseen(&self, kind: Kind, gone: &str, added: Value) {
        let mut s = self.state();
        s.watchers.clear();
        s.delete(kind, gone);
        s.upsert(kind, added);
        s.compacted = s.rv;
        s.history.clear();
    }

    pub fn binds(&self) -> Vec<BindCall> {
        self.state().binds.clone()
    }

    async fn handle(&self, req: Request<kube::client::Body>, client: String) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
        let q = query(&parts.uri);
        let m = &parts.method;
        let call = authorization(m, &path, &q);
        {
            let mut s = self.state();
            s.requests.push(call.clone());
            // Long-running watches are exempt from APF's limits, as on a real server.
            if call.0 != "watch"
                && let Some(apf) = s.apf.as_mut()
            {
                let level = apf.level(&call);
                if !apf.admit(&level) {
                    s.throttled.push((level, call.0.clone(), call.2.clone()));
                    if call.2 == "leases" {
                        s.lease_times.push((Instant::now(), 429));
                    }
                    let mut body = status(429, "TooManyRequests", "too many requests, please try again later");
                    body["details"] = json!({"retryAfterSeconds": 1});
                    let mut r = respond(429, &body);
                    r.headers_mut().insert(http::header::RETRY_AFTER, "1".parse().unwrap());
                    return r;
                }
            }
        }
        match path.as_slice() {
            ["api", "v1", "nodes"] if m == Method::GET => self.collection(Kind::Node, &q),
            ["api", "v1", "pods"] if m == Method::GET => self.collection(Kind::Pod, &q),
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "podgroups"] => self.collection(Kind::PodGroup, &q),
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "queues"] => self.collection(Kind::Queue, &q),
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "resourceflavors"] => {
                self.collection(Kind::ResourceFlavor, &q)
            }
            ["apis", "scheduling.k8s.io", "v1", "priorityclasses"] if m == Method::GET => {
                self.collection(Kind::PriorityClass, &q)
            }
            ["apis", "scheduling.k8s.io", version] if m == Method::GET => self.discovery(version),
            ["apis", "scheduling.k8s.io", version, "podgroups"] if self.serves_upstream(version) => {
                self.collection(Kind::UpstreamPodGroup, &q)
            }
            ["apis", "scheduling.k8s.io", version, "namespaces", ns, "podgroups", name, "status"]
                if m == Method::PATCH && self.serves_upstream(version) =>
            {
                self.merge_status(Kind::UpstreamPodGroup, &format!("{ns}/{name}"), body)
            }
            ["apis", group, version, resource] if self.dynamic_kind(group, version, resource).is_some() => {
                self.collection(self.dynamic_kind(group, version, resource).unwrap(), &q)
            }
            ["apis", "policy", "v1", "poddisruptionbudgets"] => self.collection(Kind::PodDisruptionBudget, &q),
            ["apis", "resource.k8s.io", "v1", "resourceslices"] if m == Method::GET => {
                self.collection(Kind::ResourceSlice, &q)
            }
            ["apis", "resource.k8s.io", "v1", "deviceclasses"] if m == Method::GET => {
                self.collection(Kind::DeviceClass, &q)
            }
            ["apis", "resource.k8s.io", "v1", "resourceclaims"] => self.collection(Kind::ResourceClaim, &q),
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name] if m == Method::GET => {
                self.get_one(Kind::ResourceClaim, &format!("{ns}/{name}"))
            }
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims"] if m == Method::POST => {
                self.create_claim(ns, body)
            }
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name] if m == Method::DELETE => {
                match self.remove(Kind::ResourceClaim, &format!("{ns}/{name}")) {
                    Some(obj) => respond(200, &obj),
                    None => respond(
                        404,
                        &status(404, "NotFound", &format!("resourceclaims.resource.k8s.io \"{name}\" not found")),
                    ),
                }
            }
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name] if m == Method::PUT => {
                self.update_claim(ns, name, body, false)
            }
            ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name, "status"]
                if m == Method::PUT =>
            {
                self.update_claim(ns, name, body, true)
            }
            ["apis", "resource.nvidia.com", "v1beta1", "namespaces", ns, "computedomains", rest @ ..] => {
                self.compute_domain(m, ns, rest.first().copied(), body)
            }
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "queues", name, "status"] if m == Method::PATCH => {
                self.merge_status(Kind::Queue, name, body)
            }
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "namespaces", ns, "podgroups", name, "status"]
                if m == Method::PATCH =>
            {
                self.slow_write(|s| s.status_latency, |s| &mut s.status_in_flight).await;
                self.merge_status(Kind::PodGroup, &format!("{ns}/{name}"), body)
            }
            ["api", "v1", "namespaces", ns, "pods", name] if m == Method::PATCH => self.patch_metadata(ns, name, &body),
            ["api", "v1", "namespaces", ns, "pods", name, "binding"] if m == Method::POST => {
                self.bind(ns, name, &body, client).await
            }
            ["api", "v1", "namespaces", ns, "pods", name, "status"] if m == Method::PATCH => {
                self.patch_status(ns, name, body)
            }
            ["api", "v1", "namespaces", ns, "pods", name, "eviction"] if m == Method::POST => self.evict(ns, name),
            ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] if m == Method::POST => {
                self.slow_write(|s| s.event_latency, |s| &mut s.events_in_flight).await;
                let mut s = self.state();
                if s.events_refused {
                    let msg = format!(
                        "events.events.k8s.io is forbidden: User \"system:serviceaccount:wasmsched-system:wasmsched\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"{ns}\""
                    );
                    return respond(403, &status(403, "Forbidden", &msg));
                }
                s.events.push(body.clone());
                respond(201, &body)
            }
            ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _] => respond(200, &body),
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "schedulingpolicies", name] if m == Method::GET => {
                self.get_one(Kind::SchedulingPolicy, name)
            }
            ["apis", "scheduling.wasmsched.io", "v1alpha1", "schedulingpolicies", name, "status"]
                if m == Method::PATCH =>
            {
                self.merge_status(Kind::SchedulingPolicy, name, body)
            }
            ["api", "v1", "namespaces", ns, "pods", name] if m == Method::GET => {
                self.get_one(Kind::Pod, &format!("{ns}/{name}"))
            }
            ["api", "v1", "namespaces", ns, "configmaps", name] if m == Method::GET => {
                self.get_one(Kind::ConfigMap, &format!("{ns}/{name}"))
            }
            ["apis", "coordination.k8s.io", "v1", "namespaces", ns, "leases", rest @ ..] => {
                self.lease(m, ns, rest.first().copied(), body, client)
            }
            _ => match self.cluster_bench_route(m, &path, &q, body) {
                Some(response) => response,
                None => respond(404, &status(404, "NotFound", &format!("fake api: no route for {m} {}", parts.uri))),
            },
        }
    }

    fn serves_upstream(&self, version: &str) -> bool {
        self.state().upstream_version == Some(version)
    }

    /// `GET /apis/scheduling.k8s.io/<version>`: the resources of a version served, else `404`.
    fn discovery(&self, version: &str) -> Response<Body> {
        if !self.serves_upstream(version) && version != "v1" {
            return respond(404, &status(404, "NotFound", "the server could not find the requested resource"));
        }
        let resources: Vec<Value> = if version == "v1" {
            vec![json!({"name": "priorityclasses", "singularName": "priorityclass", "namespaced": false,
                        "kind": "PriorityClass", "verbs": ["list", "watch"]})]
        } else {
            ["podgroups", "podgroups/status", "workloads"]
                .iter()
                .map(|r| {
                    json!({"name": r, "singularName": "", "namespaced": true,
                                "kind": if r.starts_with("workload") { "Workload" } else { "PodGroup" },
                                "verbs": ["get", "list", "watch", "patch"]})
                })
                .collect()
        };
        respond(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("scheduling.k8s.io/{version}"), "resources": resources}),
        )
    }

    /// The CRD-like kinds the fake serves by `(group, version, resource)`.
    fn dynamic_kind(&self, group: &str, version: &str, resource: &str) -> Option<Kind> {
        Some(match (group, version, resource) {
            ("scheduling.x-k8s.io", "v1alpha1", "podgroups") => Kind::CoschedulingPodGroup,
            ("scheduling.volcano.sh", "v1beta1", "podgroups") => Kind::VolcanoPodGroup,
            ("batch", "v1", "jobs") => Kind::Job,
            ("jobset.x-k8s.io", "v1alpha2", "jobsets") => Kind::JobSet,
            ("kubeflow.org", "v1", "pytorchjobs") => Kind::PyTorchJob,
            ("kubeflow.org", "v1", "tfjobs") => Kind::TfJob,
            ("kubeflow.org", "v2beta1", "mpijobs") => Kind::MpiJob,
            ("ray.io", "v1", "rayclusters") => Kind::RayCluster,
            ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets") => Kind::LeaderWorkerSet,
            ("resource.k8s.io", "v1beta2", "devicetaintrules") => Kind::DeviceTaintRule,
            ("resource.nvidia.com", "v1beta1", "computedomains") => Kind::ComputeDomain,
            _ => return None,
        })
    }

    fn collection(&self, kind: Kind, q: &BTreeMap<String, String>) -> Response<Body> {
        let fields = q.get("fieldSelector");
        let mut s = self.state();
        if s.unserved.contains(&kind) {
            // As kube-apiserver v1.36 answers a group/version nobody installed: plain text, no
            // `Status`.
            let mut r = Response::new(Full::new(Bytes::from_static(b"404 page not found\n")).boxed());
            *r.status_mut() = StatusCode::NOT_FOUND;
            r.headers_mut().insert(http::header::CONTENT_TYPE, "text/plain; charset=utf-8".parse().unwrap());
            return r;
        }
        if q.get("watch").map(String::as_str) == Some("true") {
            *s.watches.entry(kind).or_default() += 1;
            let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
            if from < s.compacted {
                let gone = json!({"type": "ERROR", "object": status(410, "Expired",
                    &format!("too old resource version: {from} ({})", s.compacted))});
                let mut l = serde_json::to_vec(&gone).unwrap();
                l.push(b'\n');
                let _ = tx.send(Bytes::from(l));
                drop(tx);
            } else {
                for (rv, k, t, obj, before) in &s.history {
                    if *k == kind
                        && *rv > from
                        && let Some(event) = as_watched(t, obj, before.as_ref(), fields)
                    {
                        let mut l = serde_json::to_vec(&event).unwrap();
                        l.push(b'\n');
                        let _ = tx.send(Bytes::from(l));
                    }
                }
                s.watchers.push(Watcher { kind, fields: fields.cloned(), tx });
            }
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            r.headers_mut().insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
            return r;
        }
        *s.lists.entry(kind).or_default() += 1;
        let started = Instant::now();
        // resourceVersion=0 is served from the cache, where the API server ignores the limit.
        let limit = match q.get("resourceVersion").map(String::as_str) {
            Some("0") => usize::MAX,
            _ => q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(usize::MAX),
        };
        // Like etcd, a continue token names the last key served, so a page costs its own size.
        let (list_rv, after) = match q.get("continue").and_then(|c| c.split_once(':')) {
            Some((rv, last)) => (rv.parse().unwrap_or(s.rv), Bound::Excluded((kind, last.to_string()))),
            None => (s.rv, Bound::Included((kind, String::new()))),
        };
        let mut page = s
            .objects
            .range((after, Bound::Unbounded))
            .take_while(|((k, _), _)| *k == kind)
            .filter(|(_, v)| matches_fields(v, fields) && matches_labels(v, q.get("labelSelector")));
        let items: Vec<(&String, &Value)> = page.by_ref().take(limit).map(|((_, key), v)| (key, v)).collect();
        let mut metadata = json!({"resourceVersion": list_rv.to_string()});
        if page.next().is_some()
            && let Some((last, _)) = items.last()
        {
            metadata["continue"] = json!(format!("{list_rv}:{last}"));
        }
        let items: Vec<&Value> = items.into_iter().map(|(_, v)| v).collect();
        let response = respond(
            200,
            &json!({"kind": kind.list_kind(), "apiVersion": kind.api_version(), "metadata": metadata, "items": items}),
        );
        s.list_time += started.elapsed();
        response
    }

    async fn bind(&self, ns: &str, name: &str, body: &Value, client: String) -> Response<Body> {
        let latency = {
            let mut s = self.state();
            s.bind_arrivals.push(format!("{ns}/{name}"));
            s.bind_latency
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let (response, raced) = self.bind_now(ns, name, body, client);
        if raced {
            // The other scheduler's bind reaches the watchers well before our answer does: the
            // order that once lost the raced pod's usage, made certain.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        response
    }

    /// The bind itself; whether it lost a race to another scheduler's bind.
    fn bind_now(&self, ns: &str, name: &str, body: &Value, client: String) -> (Response<Body>, bool) {
        let mut s = self.state();
        let id = format!("{ns}/{name}");
        let node = body["target"]["name"].as_str().unwrap_or_default().to_string();
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(body["metadata"]["annotations"].clone()).unwrap_or_default();
        let mut call =
            BindCall { pod: id.clone(), node: node.clone(), annotations: annotations.clone(), status: 201, client };
        let fault = s.bind_faults.get_mut(&id).and_then(VecDeque::pop_front);
        if let Some(f) = fault {
            let raced = f.bound_elsewhere.is_some();
            if let Some(other) = &f.bound_elsewhere
                && let Some(mut pod) = s.objects.get(&(Kind::Pod, id.clone())).cloned()
            {
                pod["spec"]["nodeName"] = json!(other);
                s.upsert(Kind::Pod, pod);
            }
            call.status = f.status;
            s.binds.push(call);
            return (respond(f.status, &status(f.status, f.reason, &f.message)), raced);
        }
        let Some(mut pod) = s.objects.get(&(Kind::Pod, id.clone())).cloned() else {
            call.status = 404;
            s.binds.push(call);
            return (respond(404, &status(404, "NotFound", &format!("pods \"{name}\" not found"))), false);
        };
        let uid = body["metadata"]["uid"].as_str();
        if uid.is_some_and(|u| Some(u) != pod["metadata"]["uid"].as_str()) {
            call.status = 409;
            s.binds.push(call);
            return (
                respond(409, &status(409, "Conflict", "Precondition failed: UID in precondition does not match")),
                false,
            );
        }
        if let Some(bound) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            call.status = 409;
            s.binds.push(call);
            let msg = format!(
                "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{bound}\""
            );
            return (respond(409, &status(409, "Conflict", &msg)), false);
        }
        pod["spec"]["nodeName"] = json!(node);
        for (k, v) in &annotations {
            pod["metadata"]["annotations"][k] = json!(v);
        }
        let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conditions: Vec<Value> = conditions.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        // The server's clock, to the second, as a real API server stamps it.
        let now = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap_or_default();
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now.to_string()}));
        pod["status"]["conditions"] = json!(conditions);
        s.upsert(Kind::Pod, pod);
        s.binds.push(call);
        (respond(201, &status(201, "", "")), false)
    }

    fn patch_status(&self, ns: &str, name: &str, patch: Value) -> Response<Body> {
        let mut s = self.state();
        let id = format!("{ns}/{name}");
        s.status_patches.push((id.clone(), patch.clone()));
        let Some(mut pod) = s.objects.get(&(Kind::Pod, id)).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("pods \"{name}\" not found")));
        };
        // Strategic merge of conditions by type, as the API server does for pods.
        let mut conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        for c in patch["status"]["conditions"].as_array().into_iter().flatten() {
            conditions.retain(|old| old["type"] != c["type"]);
            conditions.push(c.clone());
        }
        pod["status"]["conditions"] = json!(conditions);
        if let Some(node) = patch["status"].get("nominatedNodeName") {
            pod["status"]["nominatedNodeName"] = node.clone();
        }
        if let Some(claim) = patch["status"].get("extendedResourceClaimStatus") {
            pod["status"]["extendedResourceClaimStatus"] = claim.clone();
        }
        let pod = s.upsert(Kind::Pod, pod);
        respond(200, &pod)
    }

    fn get_one(&self, kind: Kind, key: &str) -> Response<Body> {
        match self.get(kind, key) {
            Some(obj) => respond(200, &obj),
            None => respond(404, &status(404, "NotFound", &format!("{kind:?} \"{key}\" not found"))),
        }
    }

    /// A merge patch of a custom resource's status subresource: only `status` changes.
    fn merge_status(&self, kind: Kind, key: &str, patch: Value) -> Response<Body> {
        let mut s = self.state();
        s.status_patches.push((key.to_string(), patch.clone()));
        let Some(mut obj) = s.objects.get(&(kind, key.to_string())).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("{kind:?} \"{key}\" not found")));
        };
        obj["status"] = patch["status"].clone();
        let obj = s.upsert(kind, obj);
        respond(200, &obj)
    }

    /// A namespaced ComputeDomain: create (its CRD's validation and default), get, delete. Its
    /// resource is answered like any unserved one while its CRD is "not installed".
    fn compute_domain(&self, m: &Method, ns: &str, name: Option<&str>, mut body: Value) -> Response<Body> {
        let mut s = self.state();
        s.compute_domain_calls.push((m.to_string(), format!("{ns}/{}", name.unwrap_or_default())));
        if s.unserved.contains(&Kind::ComputeDomain) {
            let mut r = Response::new(Full::new(Bytes::from_static(b"404 page not found\n")).boxed());
            *r.status_mut() = StatusCode::NOT_FOUND;
            r.headers_mut().insert(http::header::CONTENT_TYPE, "text/plain; charset=utf-8".parse().unwrap());
            return r;
        }
        let not_found = |name: &str| {
            respond(404, &status(404, "NotFound", &format!("computedomains.resource.nvidia.com \"{name}\" not found")))
        };
        match (m.clone(), name) {
            (Method::POST, None) => {
                body["metadata"]["namespace"] = json!(ns);
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let spec = &body["spec"];
                let mut invalid = Vec::new();
                if !spec.is_object() {
                    invalid.push("spec: Required value".to_string());
                } else {
                    if !spec["numNodes"].is_i64() {
                        invalid.push("spec.numNodes: Required value".into());
                    }
                    if !spec["channel"]["resourceClaimTemplate"]["name"].is_string() {
                        invalid.push("spec.channel.resourceClaimTemplate.name: Required value".into());
                    }
                }
                if !invalid.is_empty() {
                    let msg =
                        format!("ComputeDomain.resource.nvidia.com \"{name}\" is invalid: {}", invalid.join(", "));
                    return respond(422, &status(422, "Invalid", &msg));
                }
                if s.objects.contains_key(&(Kind::ComputeDomain, format!("{ns}/{name}"))) {
                    let msg = format!("computedomains.resource.nvidia.com \"{name}\" already exists");
                    return respond(409, &status(409, "AlreadyExists", &msg));
                }
                if body["spec"]["channel"]["allocationMode"].is_null() {
                    body["spec"]["channel"]["allocationMode"] = json!("Single");
                }
                body["metadata"]["uid"] = json!(format!("cd-{}", s.rv + 1));
                let obj = s.upsert(Kind::ComputeDomain, body);
                respond(201, &obj)
            }
            (Method::GET, Some(name)) => match s.objects.get(&(Kind::ComputeDomain, format!("{ns}/{name}"))) {
                Some(obj) => respond(200, &obj.clone()),
                None => not_found(name),
            },
            (Method::DELETE, Some(name)) => match s.delete(Kind::ComputeDomain, &format!("{ns}/{name}")) {
                Some(obj) => respond(200, &obj),
                None => not_found(name),
            },
            _ => respond(405, &status(405, "MethodNotAllowed", "fake api: unsupported ComputeDomain operation")),
        }
    }

    /// A ResourceClaim created: `generateName` gets a random suffix, a status given is dropped (a
    /// create never sets status).
    fn create_claim(&self, ns: &str, mut body: Value) -> Response<Body> {
        let mut s = self.state();
        if body["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            let Some(prefix) = body["metadata"]["generateName"].as_str().map(String::from) else {
                return respond(
                    422,
                    &status(422, "Invalid", "metadata.name: Required value: name or generateName is required"),
                );
            };
            let suffix = format!("{:05x}", (s.rv * 2_654_435_761) % 0xfffff);
            body["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
        }
        body["metadata"]["namespace"] = json!(ns);
        let key = (Kind::ResourceClaim, format!("{ns}/{}", body["metadata"]["name"].as_str().unwrap_or_default()));
        if s.objects.contains_key(&key) {
            return respond(409, &status(409, "AlreadyExists", "resourceclaims.resource.k8s.io already exists"));
        }
        body.as_object_mut().map(|o| o.remove("status"));
        let obj = s.upsert(Kind::ResourceClaim, body);
        respond(201, &obj)
    }

    /// A ResourceClaim update (`status`: of its status subresource), as strict as the real API
    /// server: the `resourceVersion` must be the stored one (409 otherwise); a status write
    /// changes only the status and an update only the rest; `status.reservedFor` needs an
    /// allocation, takes each pod once and no new pod while the claim is being deleted; an
    /// allocation once written cannot change (only be cleared). Every accepted status write is
    /// recorded in `claim_writes`.
    fn update_claim(&self, ns: &str, name: &str, body: Value, status_write: bool) -> Response<Body> {
        let mut s = self.state();
        let key = format!("{ns}/{name}");
        let Some(old) = s.objects.get(&(Kind::ResourceClaim, key.clone())).cloned() else {
            return respond(
                404,
                &status(404, "NotFound", &format!("resourceclaims.resource.k8s.io \"{name}\" not found")),
            );
        };
        if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
            let msg = format!(
                "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            );
            return respond(409, &status(409, "Conflict", &msg));
        }
        if s.claim_faults > 0 && status_write {
            s.claim_faults -= 1;
            return respond(500, &status(500, "InternalError", "etcdserver: request timed out"));
        }
        let mut new = old.clone();
        if status_write {
            let st = &body["status"];
            let reserved: Vec<&Value> = st["reservedFor"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
            let invalid = |msg: &str| {
                respond(
                    422,
                    &status(422, "Invalid", &format!("ResourceClaim.resource.k8s.io \"{name}\" is invalid: {msg}")),
                )
            };
            if !reserved.is_empty() && st["allocation"].is_null() {
                return invalid("status.reservedFor: Forbidden: may not be specified when `allocated` is not set");
            }
            let mut uids: Vec<&str> = reserved.iter().filter_map(|r| r["uid"].as_str()).collect();
            uids.sort();
            if uids.windows(2).any(|w| w[0] == w[1]) || uids.len() != reserved.len() {
                return invalid("status.reservedFor: Duplicate value (or a consumer without a uid)");
            }
            if !old["metadata"]["deletionTimestamp"].is_null() {
                let before: Vec<&str> = old["status"]["reservedFor"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["uid"].as_str())
                    .collect();
                if uids.iter().any(|u| !before.contains(u)) {
                    return invalid(
                        "status.reservedFor: Forbidden: new entries may not be added while `deletionTimestamp` is set",
                    );
                }
            }
            if !old["status"]["allocation"].is_null()
                && !st["allocation"].is_null()
                && old["status"]["allocation"] != st["allocation"]
            {
                return invalid("status.allocation: Invalid value: field is immutable");
            }
            // What the API server authorises besides the request itself (a synthetic subresource,
            // cluster-wide): without it the write is refused with a 422.
            if old["status"]["allocation"] != st["allocation"] || old["status"]["reservedFor"] != st["reservedFor"] {
                s.requests.push(("update".into(), "resource.k8s.io".into(), "resourceclaims/binding".into()));
            }
            new["status"] = st.clone();
            s.claim_writes.push((key, st.clone()));
        } else {
            new["metadata"] = body["metadata"].clone();
            new["spec"] = old["spec"].clone();
        }
        let obj = s.upsert(Kind::ResourceClaim, new);
        respond(200, &obj)
    }

    /// A merge patch of a pod's annotations (the checkpoint request), recorded and applied.
    fn patch_metadata(&self, ns: &str, name: &str, patch: &Value) -> Response<Body> {
        let mut s = self.state();
        let id = format!("{ns}/{name}");
        let Some(mut pod) = s.objects.get(&(Kind::Pod, id.clone())).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("pods \"{name}\" not found")));
        };
        s.metadata_patches.push((id, patch.clone()));
        for (k, v) in patch["metadata"]["annotations"].as_object().into_iter().flatten() {
            pod["metadata"]["annotations"][k] = v.clone();
        }
        let pod = s.upsert(Kind::Pod, pod);
        respond(200, &pod)
    }

    fn evict(&self, ns: &str, name: &str) -> Response<Body> {
        let mut s = self.state();
        let id = format!("{ns}/{name}");
        if s.protected.contains(&id) {
            s.evictions.push((id, 429));
            return respond(
                429,
                &status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."),
            );
        }
        let Some(mut pod) = s.objects.get(&(Kind::Pod, id.clone())).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("pods \"{name}\" not found")));
        };
        s.evictions.push((id.clone(), 201));
        if pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
            // No kubelet runs it: deleted at once.
            s.delete(Kind::Pod, &id);
            return respond(201, &status(201, "", ""));
        }
        if pod["metadata"]["deletionTimestamp"].is_null() {
            let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
            let at = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(grace);
            pod["metadata"]["deletionTimestamp"] = json!(at.to_string());
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            s.upsert(Kind::Pod, pod);
            if let Some(after) = s.termination {
                let api = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    api.finish_termination(&id);
                });
            }
        }
        respond(201, &status(201, "", ""))
    }

    fn lease(&self, m: &Method, ns: &str, name: Option<&str>, body: Value, client: String) -> Response<Body> {
        let mut s = self.state();
        let write = *m == Method::POST || *m == Method::PUT;
        if write && let Some(n) = s.lease_faults.get_mut(&client).filter(|n| **n > 0) {
            *n -= 1;
            s.lease_writes.push((client, String::new(), 500));
            return respond(500, &status(500, "InternalError", "etcdserver: request timed out"));
        }
        match (m.clone(), name) {
            (Method::GET, Some(name)) => match s.objects.get(&(Kind::Lease, format!("{ns}/{name}"))) {
                Some(l) => respond(200, &l.clone()),
                None => {
                    respond(404, &status(404, "NotFound", &format!("leases.coordination.k8s.io \"{name}\" not found")))
                }
            },
            (Method::POST, _) => {
                let mut lease = body;
                lease["metadata"]["namespace"] = json!(ns);
                let key = key_of(Kind::Lease, &lease);
                let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string();
                if s.objects.contains_key(&key) {
                    s.lease_writes.push((client, holder, 409));
                    return respond(409, &status(409, "AlreadyExists", "leases already exists"));
                }
                s.lease_writes.push((client, holder, 201));
                s.lease_times.push((Instant::now(), 201));
                let l = s.upsert(Kind::Lease, lease);
                respond(201, &l)
            }
            (Method::PUT, Some(name)) => {
                let key = (Kind::Lease, format!("{ns}/{name}"));
                let holder = body["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string();
                let current = s.objects.get(&key).map(|l| l["metadata"]["resourceVersion"].clone());
                if current.is_none() || current.as_ref() != Some(&body["metadata"]["resourceVersion"]) {
                    s.lease_writes.push((client, holder, 409));
                    return respond(
                        409,
                        &status(
                            409,
                            "Conflict",
                            "the object has been modified; please apply your changes to the latest version and try again",
                        ),
                    );
                }
                s.lease_writes.push((client, holder, 200));
                s.lease_times.push((Instant::now(), 200));
                let mut lease = body;
                lease["metadata"]["namespace"] = json!(ns);
                let l = s.upsert(Kind::Lease, lease);
                respond(200, &l)
            }
            _ => respond(405, &status(405, "MethodNotAllowed", "fake api: unsupported lease operation")),
        }
    }

    /// Rewrites the lease's holder directly (another replica took it over).
    pub fn set_lease_holder(&self, ns: &str, name: &str, holder: &str) {
        let mut s = self.state();
        let key = (Kind::Lease, format!("{ns}/{name}"));
        let mut lease = s.objects.get(&key).cloned().expect("lease exists");
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!("2099-01-01T00:00:00.000000Z");
        s.upsert(Kind::Lease, lease);
    }
}

struct FakeService {
    api: FakeApi,
    client: String,
}

impl tower_service::Service<Request<kube::client::Body>> for FakeService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let (api, client) = (self.api.clone(), self.client.clone());
        Box::pin(async move { Ok(api.handle(req, client).await) })
    }
}

/// A GPU node as the API server returns it (fields as a real node carries them, trimmed of
/// conditions and images).
pub fn gpu_node(name: &str, gpus: u32, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
    });
    for (k, v) in extra_labels {
        labels[*k] = json!(v);
    }
    json!({
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": format!("aws:///us-east-1a/i-{name}")},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152000Ki", "nvidia.com/gpu": gpus.to_string(), "pods": "110", "ephemeral-storage": "30428560Ki", "hugepages-1Gi": "0"},
            "allocatable": {"cpu": "191450m", "memory": "2063187968Ki", "nvidia.com/gpu": gpus.to_string(), "pods": "110", "ephemeral-storage": "28042139190", "hugepages-1Gi": "0"},
            "nodeInfo": {"kubeletVersion": "v1.33.1", "containerRuntimeVersion": "containerd://1.7.27", "architecture": "amd64", "operatingSystem": "linux"}
        }
    })
}

/// A pod as a user creates it (after admission: defaults filled in), pending for `scheduler`.
pub fn pod(ns: &str, name: &str, scheduler: &str, gpus: u32, cpu: &str, memory: &str) -> Value {
    let mut limits = json!({"cpu": cpu, "memory": memory});
    if gpus > 0 {
        limits["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "train"}, "creationTimestamp": "2026-11-22T10:00:00Z"},
        "spec": {
            "schedulerName": scheduler,
            "priority": 0,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                "resources": {"limits": limits.clone(), "requests": limits},
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"
            }],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ]
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"}
    })
}

/// The writes a cluster benchmark makes (`wasmsched cluster-bench`), as kube-apiserver v1.36 answers
/// them: nodes created (the `not-ready` taint added, as its admission does) then their status
/// patched, pods created and deleted (graceful for a bound pod unless the
/// grace period is 0, with the UID precondition), collections deleted by label, and `/metrics`
/// with `apiserver_request_total` counted from the requests recorded.
impl FakeApi {
    fn cluster_bench_route(
        &self,
        m: &Method,
        path: &[&str],
        q: &BTreeMap<String, String>,
        body: Value,
    ) -> Option<Response<Body>> {
        Some(match (m.clone(), path) {
            (Method::GET, ["metrics"]) => self.metrics(),
            (Method::POST, ["api", "v1", "namespaces"] | ["api", "v1", "namespaces", _, "serviceaccounts"]) => {
                respond(201, &body)
            }
            (Method::POST, ["api", "v1", "nodes"]) => {
                let mut node = body;
                node["spec"]["taints"] = json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]);
                self.create(Kind::Node, node)
            }
            (Method::PATCH, ["api", "v1", "nodes", name, "status"]) => self.merge_patch(Kind::Node, name, &body),
            (Method::PATCH, ["api", "v1", "nodes", name]) => self.merge_patch(Kind::Node, name, &body),
            (Method::DELETE, ["api", "v1", "nodes", name]) => self.delete_now(Kind::Node, name),
            (Method::DELETE, ["api", "v1", "nodes"]) => self.delete_collection(Kind::Node, None, q),
            (Method::POST, ["apis", "scheduling.k8s.io", "v1", "priorityclasses"]) => {
                self.create(Kind::PriorityClass, body)
            }
            (Method::POST, ["apis", "scheduling.wasmsched.io", "v1alpha1", "namespaces", ns, "podgroups"]) => {
                let mut group = body;
                group["metadata"]["namespace"] = json!(ns);
                self.create(Kind::PodGroup, group)
            }
            (Method::DELETE, ["apis", "scheduling.wasmsched.io", "v1alpha1", "namespaces", ns, "podgroups"]) => {
                self.delete_collection(Kind::PodGroup, Some(ns), q)
            }
            (Method::GET, ["api", "v1", "namespaces", ns, "pods"]) => {
                let mut q = q.clone();
                let own = format!("metadata.namespace={ns}");
                let fields = q.get("fieldSelector").map_or(own.clone(), |f| format!("{f},{own}"));
                q.insert("fieldSelector".into(), fields);
                self.collection(Kind::Pod, &q)
            }
            (Method::POST, ["api", "v1", "namespaces", ns, "pods"]) => {
                let mut pod = body;
                pod["metadata"]["namespace"] = json!(ns);
                pod["metadata"]["creationTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
                pod["status"] = json!({"phase": "Pending", "qosClass": "Burstable"});
                pod["spec"]["priority"] = json!(self.priority_of(&pod));
                self.create(Kind::Pod, pod)
            }
            (Method::DELETE, ["api", "v1", "namespaces", ns, "pods"]) => self.delete_collection(Kind::Pod, Some(ns), q),
            (Method::POST, ["apis", "resource.k8s.io", "v1", "deviceclasses"]) => self.create(Kind::DeviceClass, body),
            (Method::POST, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                self.create(Kind::ResourceSlice, body)
            }
            (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                self.delete_collection(Kind::ResourceSlice, None, q)
            }
            (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                self.delete_now(Kind::ResourceSlice, name)
            }
            (Method::GET, ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims"]) => {
                let mut q = q.clone();
                let own = format!("metadata.namespace={ns}");
                let fields = q.get("fieldSelector").map_or(own.clone(), |f| format!("{f},{own}"));
                q.insert("fieldSelector".into(), fields);
                self.collection(Kind::ResourceClaim, &q)
            }
            (Method::DELETE, ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims"]) => {
                self.delete_collection(Kind::ResourceClaim, Some(ns), q)
            }
            (Method::PATCH, ["apis", "resource.k8s.io", "v1", "namespaces", ns, "resourceclaims", name]) => {
                self.merge_patch(Kind::ResourceClaim, &format!("{ns}/{name}"), &body)
            }
            (Method::DELETE, ["api", "v1", "namespaces", ns, "pods", name]) => self.delete_pod(ns, name, &body),
            _ => return None,
        })
    }

    /// Waits the write's injected latency, counting it in flight meanwhile (now, most at once).
    async fn slow_write(&self, latency: fn(&State) -> Duration, in_flight: fn(&mut State) -> &mut (usize, usize)) {
        let latency = latency(&self.state());
        if latency.is_zero() {
            return;
        }
        {
            let mut s = self.state();
            let count = in_flight(&mut s);
            count.0 += 1;
            count.1 = count.1.max(count.0);
        }
        tokio::time::sleep(latency).await;
        in_flight(&mut self.state()).0 -= 1;
    }

    /// The value of the pod's priority class, as the Priority admission plugin fills it in.
    fn priority_of(&self, pod: &Value) -> i64 {
        let Some(class) = pod["spec"]["priorityClassName"].as_str() else { return 0 };
        self.get(Kind::PriorityClass, class).and_then(|c| c["value"].as_i64()).unwrap_or(0)
    }

    fn create(&self, kind: Kind, obj: Value) -> Response<Body> {
        let mut s = self.state();
        let key = key_of(kind, &obj);
        if s.objects.contains_key(&key) {
            let msg = format!("{} \"{}\" already exists", kind.kind_name(), key.1);
            return respond(409, &status(409, "AlreadyExists", &msg));
        }
        let obj = s.upsert(kind, obj);
        respond(201, &obj)
    }

    /// A JSON merge patch (RFC 7386) of any part of the object.
    fn merge_patch(&self, kind: Kind, key: &str, patch: &Value) -> Response<Body> {
        fn merge(target: &mut Value, patch: &Value) {
            let Some(fields) = patch.as_object() else {
                *target = patch.clone();
                return;
            };
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    target.as_object_mut().unwrap().remove(k);
                } else {
                    merge(&mut target[k], v);
                }
            }
        }
        let mut s = self.state();
        let Some(mut obj) = s.objects.get(&(kind, key.to_string())).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("{kind:?} \"{key}\" not found")));
        };
        merge(&mut obj, patch);
        // Its last finalizer removed while it is being deleted: gone now, as on a real server.
        let finalized = obj["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        if finalized && !obj["metadata"]["deletionTimestamp"].is_null() {
            s.delete(kind, key);
            return respond(200, &obj);
        }
        let obj = s.upsert(kind, obj);
        respond(200, &obj)
    }

    fn delete_now(&self, kind: Kind, key: &str) -> Response<Body> {
        match self.remove(kind, key) {
            Some(obj) => respond(200, &obj),
            None => respond(404, &status(404, "NotFound", &format!("{kind:?} \"{key}\" not found"))),
        }
    }

    /// Deletes the objects of `kind` (in `namespace`) that the `labelSelector` selects, at once.
    fn delete_collection(&self, kind: Kind, namespace: Option<&str>, q: &BTreeMap<String, String>) -> Response<Body> {
        let mut s = self.state();
        let keys: Vec<String> = s
            .objects
            .iter()
            .filter(|((k, _), v)| {
                *k == kind
                    && namespace.is_none_or(|ns| v["metadata"]["namespace"] == ns)
                    && matches_labels(v, q.get("labelSelector"))
            })
            .map(|((_, key), _)| key.clone())
            .collect();
        for key in keys {
            // One with finalizers stays, marked for deletion, until they are removed.
            match s.objects.get(&(kind, key.clone())).cloned() {
                Some(mut obj) if obj["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()) => {
                    if obj["metadata"]["deletionTimestamp"].is_null() {
                        obj["metadata"]["deletionTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
                        s.upsert(kind, obj);
                    }
                }
                _ => {
                    s.delete(kind, &key);
                }
            }
        }
        respond(200, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
    }

    /// A pod deleted: at once when unbound or with a grace period of 0, else gracefully (the
    /// kubelet finishes it); a UID precondition that does not match is a 409.
    fn delete_pod(&self, ns: &str, name: &str, options: &Value) -> Response<Body> {
        let id = format!("{ns}/{name}");
        let mut s = self.state();
        let Some(mut pod) = s.objects.get(&(Kind::Pod, id.clone())).cloned() else {
            return respond(404, &status(404, "NotFound", &format!("pods \"{name}\" not found")));
        };
        if let Some(uid) = options["preconditions"]["uid"].as_str()
            && pod["metadata"]["uid"].as_str() != Some(uid)
        {
            let msg = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                pod["metadata"]["uid"]
            );
            return respond(409, &status(409, "Conflict", &msg));
        }
        let grace = options["gracePeriodSeconds"].as_u64();
        if grace == Some(0) || pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
            // As kube-apiserver does, a pod deleted at once goes with its deletion stamped on it
            // (what watchers see in the DELETED event; a soak on a real server showed it).
            if let Some(p) = s.objects.get_mut(&(Kind::Pod, id.clone())) {
                p["metadata"]["deletionTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
                p["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            let gone = s.delete(Kind::Pod, &id);
            return respond(200, &gone.unwrap_or_default());
        }
        if pod["metadata"]["deletionTimestamp"].is_null() {
            let grace = grace.or(pod["spec"]["terminationGracePeriodSeconds"].as_u64()).unwrap_or(30);
            let at = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(grace);
            pod["metadata"]["deletionTimestamp"] = json!(at.to_string());
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            pod = s.upsert(Kind::Pod, pod);
        }
        respond(200, &pod)
    }

    /// `/metrics`: `apiserver_request_total` by verb and resource, from the requests recorded.
    fn metrics(&self) -> Response<Body> {
        let s = self.state();
        let mut counts: BTreeMap<(String, String, String, String), u64> = BTreeMap::new();
        for (verb, group, resource) in &s.requests {
            let (resource, sub) = resource.split_once('/').unwrap_or((resource.as_str(), ""));
            let verb = match verb.as_str() {
                "create" => "POST",
                "update" => "PUT",
                other => &other.to_uppercase(),
            };
            *counts.entry((verb.to_string(), group.clone(), resource.to_string(), sub.to_string())).or_default() += 1;
        }
        let mut text = String::from("# TYPE apiserver_request_total counter\n");
        for ((verb, group, resource, sub), n) in counts {
            text.push_str(&format!(
                "apiserver_request_total{{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"{group}\",resource=\"{resource}\",scope=\"namespace\",subresource=\"{sub}\",verb=\"{verb}\",version=\"v1\"}} {n}\n"
            ));
        }
        let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
        r.headers_mut().insert(http::header::CONTENT_TYPE, "text/plain; version=0.0.4".parse().unwrap());
        r
    }
}
