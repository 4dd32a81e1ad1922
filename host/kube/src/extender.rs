//! A kube-scheduler *extender*: for clusters that keep kube-scheduler, its `filter`, `prioritize`
//! and `bind` verbs over HTTP bring wasmsched's live policy set — GPU-aware filtering, topology-aware
//! scoring and exact GPU-set selection — to the pods it is configured for. kube-scheduler keeps
//! queueing, preemption and its own plugins; the extender answers from its own watch cache of nodes
//! and pods (`nodeCacheCapable: true`: requests carry node names only), and binds itself
//! (`bindVerb`), writing the chosen GPU ids and, when they share one, the NUMA node on the pod.
//!
//! The protocol is `k8s.io/kube-scheduler/extender/v1`: Go field names without JSON tags, so
//! requests and replies use `PascalCase` keys; scores are 0–10 (`MaxExtenderPriority`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use wasmsched_core::{Slot, filter_each, score_each, select_devices_on};
use wasmsched_registry::Registry;

use crate::bind::Effects;
use crate::cache::{Cache, pod_id};
use crate::convert::{self, PodKey};

/// The highest score an extender may give (`extenderv1.MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the pod and its candidate nodes (names when node-cache capable, else objects).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(alias = "pod")]
    pub pod: Pod,
    /// Candidate nodes as objects (`nodeCacheCapable: false`).
    #[serde(default, alias = "nodes")]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(default, alias = "nodenames", alias = "nodeNames")]
    pub node_names: Option<Vec<String>>,
}

/// The part of a `NodeList` the extender reads: the names.
#[derive(Deserialize, Debug, Default)]
pub struct NodeList {
    /// The nodes.
    #[serde(default)]
    pub items: Vec<KubeNode>,
}

/// `ExtenderFilterResult`.
#[derive(Serialize, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct FilterResult {
    /// Nodes that pass.
    pub node_names: Vec<String>,
    /// Nodes that do not, with the reason (preemption might help).
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that do not and never will for this pod (preemption cannot help).
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Set when the request itself failed.
    pub error: String,
}

/// `HostPriority`.
#[derive(Serialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    /// The node.
    pub host: String,
    /// 0–10.
    pub score: i64,
}

/// `ExtenderBindingArgs`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
pub struct BindingArgs {
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod UID: the bind applies to this incarnation only.
    #[serde(rename = "PodUID", alias = "PodUid")]
    pub pod_uid: String,
    /// The node kube-scheduler chose.
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Serialize, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct BindingResult {
    /// Empty on success.
    pub error: String,
}

/// The extender: a watch cache of the cluster, the live policy set, and the API effects.
pub struct Extender {
    cache: Mutex<Cache>,
    registry: Arc<Registry>,
    accelerators: Arc<crate::accelerators::AcceleratorTable>,
    effects: Effects,
    client: Client,
}

impl Extender {
    /// A client from the usual kubeconfig or in-cluster configuration, without a client-side
    /// rate: the extender writes only the binds kube-scheduler asks it for.
    pub async fn connect() -> Result<Client, kube::Error> {
        Client::try_default().await
    }

    /// An extender for `client`'s cluster deciding with `registry`'s live set; `name` is who
    /// events and bindings are attributed to.
    pub fn new(
        client: Client,
        registry: Arc<Registry>,
        name: &str,
        accelerators: Arc<crate::accelerators::AcceleratorTable>,
    ) -> Arc<Extender> {
        Arc::new(Extender {
            accelerators: Arc::clone(&accelerators),
            cache: Mutex::new(Cache::with_accelerators(accelerators)),
            registry,
            effects: Effects::new(client.clone(), name, name),
            client,
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `filter`: which candidates the live set's filters pass, and why the others fail.
    pub fn filter(&self, args: &ExtenderArgs) -> FilterResult {
        let task = match convert::extender_task(&args.pod, &self.accelerators) {
            Ok(t) => t,
            Err(e) => return FilterResult { error: format!("pod: {e}"), ..Default::default() },
        };
        let names = candidate_names(args);
        let live = self.registry.current();
        let cache = self.cache();
        let slots = slots_of(&cache, &names);
        let verdicts = match filter_each(&live.set, cache.nodes(), &task, 0, &slots) {
            Ok(v) => v,
            Err(fault) => return FilterResult { error: fault.to_string(), ..Default::default() },
        };
        let mut out = FilterResult::default();
        for (name, verdict) in names.into_iter().zip(verdicts) {
            match verdict {
                None => out.node_names.push(name),
                Some((reason, true)) => {
                    out.failed_and_unresolvable_nodes.insert(name, reason);
                }
                Some((reason, false)) => {
                    out.failed_nodes.insert(name, reason);
                }
            }
        }
        out
    }

    /// `prioritize`: the live set's weighted scores, scaled so the best candidate gets 10.
    pub fn prioritize(&self, args: &ExtenderArgs) -> Result<Vec<HostPriority>, String> {
        let task = convert::extender_task(&args.pod, &self.accelerators).map_err(|e| format!("pod: {e}"))?;
        let names = candidate_names(args);
        let live = self.registry.current();
        let cache = self.cache();
        let slots = slots_of(&cache, &names);
        let totals = score_each(&live.set, cache.nodes(), &task, 0, &slots).map_err(|f| f.to_string())?;
        let best = totals.iter().copied().max().unwrap_or(0);
        Ok(names
            .into_iter()
            .zip(totals)
            .map(|(host, t)| HostPriority {
                host,
                // Integer rounding of t / best × 10; 0 for every node when none scores.
                score: (t.saturating_mul(10).saturating_add(best / 2)).checked_div(best).map_or(0, |s| s as i64),
            })
            .collect())
    }

    /// `bind`: choose the pod's GPUs on the node kube-scheduler picked, hold them, and bind with
    /// their ids. Selection and holding happen under one lock, so concurrent binds never share a GPU.
    pub async fn bind(&self, args: &BindingArgs) -> BindingResult {
        let key = PodKey { namespace: args.pod_namespace.clone(), name: args.pod_name.clone() };
        let fail = |error: String| {
            tracing::warn!(pod = %key, node = %args.node, %error, "extender bind failed");
            BindingResult { error }
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let pod = match pods.get(&key.name).await {
            Ok(p) => p,
            Err(e) => return fail(format!("reading pod {key}: {e}")),
        };
        if pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            return fail(format!("pod {key} is not incarnation {}", args.pod_uid));
        }
        let (task, id) = match (convert::extender_task(&pod, &self.accelerators), pod_id(&pod)) {
            (Ok(t), Ok(id)) => (t, id),
            (Err(e), _) | (_, Err(e)) => return fail(format!("pod {key}: {e}")),
        };
        let live = self.registry.current();
        let (devices, numa) = {
            let mut cache = self.cache();
            let Some(slot) = cache.nodes().slot_of(&args.node) else {
                return fail(format!("node {} is not known to the extender", args.node));
            };
            let devices = match select_devices_on(&live.set, cache.nodes(), &task, 0, slot) {
                Ok(d) => d,
                Err(reason) => return fail(format!("no GPUs for {key} on {}: {reason}", args.node)),
            };
            let numa = cache.nodes().get(slot).and_then(|n| convert::numa_of(n, &devices));
            cache.assume(slot, &task, &devices);
            (devices, numa)
        };
        match self
            .effects
            .bind(&key, &args.pod_uid, &args.node, &devices, numa, wasmsched_events::Timestamp::now())
            .await
        {
            Ok(()) => BindingResult::default(),
            Err(e) => {
                self.cache().forget_assumed(&id);
                fail(format!("binding {key} to {}: {e}", args.node))
            }
        }
    }

    /// Keeps the cache current from the node and pod watches until `stop`.
    pub async fn watch(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let nodes =
            watcher::watcher(Api::<KubeNode>::all(self.client.clone()), watcher::Config::default()).default_backoff();
        let pod_config = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods = watcher::watcher(Api::<Pod>::all(self.client.clone()), pod_config).default_backoff();
        tokio::pin!(nodes, pods);
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                Some(event) = nodes.next() => match event {
                    Ok(Event::Apply(n) | Event::InitApply(n)) => {
                        if let Err(e) = self.cache().apply_node(&n) {
                            tracing::warn!(error = %e, "ignoring a node that does not convert");
                        }
                    }
                    Ok(Event::Delete(n)) => self.cache().delete_node(n.metadata.name.as_deref().unwrap_or_default()),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
                },
                Some(event) = pods.next() => match event {
                    Ok(Event::Apply(p) | Event::InitApply(p)) => {
                        // Only where pods are bound matters: pending pods are kube-scheduler's.
                        if let Err(e) = self.cache().apply_pod(&p, "") {
                            tracing::debug!(error = %e, "ignoring a pod that does not convert");
                        }
                    }
                    Ok(Event::Delete(p)) => self.cache().delete_pod(&p),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                },
            }
        }
    }

    /// Serves `POST /filter`, `/prioritize`, `/bind` and `GET /healthz` on `listener` until `stop`.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.changed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "extender accept failed");
                        continue;
                    }
                },
            };
            let this = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let this = this.clone();
                    async move { Ok::<_, Infallible>(this.handle(req).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                    tracing::debug!(error = %e, "extender connection ended");
                }
            });
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (method, path) = (req.method().clone(), req.uri().path().trim_end_matches('/').to_string());
        if method == Method::GET && path == "/healthz" {
            return reply(StatusCode::OK, b"ok".to_vec());
        }
        if method != Method::POST {
            return reply(StatusCode::METHOD_NOT_ALLOWED, b"POST only".to_vec());
        }
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return reply(StatusCode::BAD_REQUEST, format!("reading the body: {e}").into_bytes()),
        };
        let json = |v: serde_json::Result<Vec<u8>>| match v {
            Ok(bytes) => reply(StatusCode::OK, bytes),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, e.to_string().into_bytes()),
        };
        let bad = |e: serde_json::Error| reply(StatusCode::BAD_REQUEST, format!("malformed request: {e}").into_bytes());
        match path.rsplit('/').next().unwrap_or_default() {
            "filter" => match serde_json::from_slice::<ExtenderArgs>(&body) {
                Ok(args) => json(serde_json::to_vec(&self.filter(&args))),
                Err(e) => bad(e),
            },
            "prioritize" => match serde_json::from_slice::<ExtenderArgs>(&body) {
                // The protocol has no error field here: a failure is an HTTP error.
                Ok(args) => match self.prioritize(&args) {
                    Ok(list) => json(serde_json::to_vec(&list)),
                    Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, e.into_bytes()),
                },
                Err(e) => bad(e),
            },
            "bind" => match serde_json::from_slice::<BindingArgs>(&body) {
                Ok(args) => json(serde_json::to_vec(&self.bind(&args).await)),
                Err(e) => bad(e),
            },
            _ => reply(StatusCode::NOT_FOUND, b"unknown verb".to_vec()),
        }
    }
}

fn candidate_names(args: &ExtenderArgs) -> Vec<String> {
    match (&args.node_names, &args.nodes) {
        (Some(names), _) => names.clone(),
        (None, Some(list)) => list.items.iter().filter_map(|n| n.metadata.name.clone()).collect(),
        (None, None) => Vec::new(),
    }
}

/// Slots of `names`; a name the cache does not know maps to a slot that does not exist, which the
/// verdicts report as "node not found".
fn slots_of(cache: &Cache, names: &[String]) -> Vec<Slot> {
    names.iter().map(|n| cache.nodes().slot_of(n).unwrap_or(Slot::MAX)).collect()
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}
