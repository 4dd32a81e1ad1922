//! The trivial binder: binds each pending pod of the run's `schedulerName` to the next fake node
//! in turn, with no scheduling at all — what the API server can bind with that many requests in
//! flight, the ceiling a scheduler is measured against. With `events`, it also records one
//! `Scheduled` event per pod, as a scheduler does.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;

use crate::{Config, objects};

/// How the binder binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BinderConfig {
    /// Binds in flight at once.
    pub in_flight: usize,
    /// One `Scheduled` event per pod, after its bind.
    pub events: bool,
}

/// The running binder.
pub struct Binder {
    task: tokio::task::JoinHandle<()>,
}

impl Binder {
    /// Starts binding the pending pods of `config.scheduler_name` in `config.namespace` (those
    /// already there first).
    pub fn start(client: Client, config: &Config, binder: BinderConfig) -> Binder {
        let api = Api::<Pod>::namespaced(client.clone(), &config.namespace);
        let events = Api::<Event>::namespaced(client, &config.namespace);
        let fields = format!("spec.schedulerName={},spec.nodeName=", config.scheduler_name);
        let stream = watcher(api.clone(), watcher::Config::default().fields(&fields));
        let nodes: Arc<Vec<String>> = Arc::new((0..config.nodes).map(objects::node_name).collect());
        let task = tokio::spawn(bind_each(stream, api, binder.events.then_some(events), nodes, binder.in_flight));
        Binder { task }
    }

    /// Stops binding (binds in flight finish on their own).
    pub fn stop(self) {
        self.task.abort();
    }
}

async fn bind_each(
    stream: impl futures_util::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
    api: Api<Pod>,
    events: Option<Api<Event>>,
    nodes: Arc<Vec<String>>,
    in_flight: usize,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let next = Arc::new(AtomicUsize::new(0));
    let mut taken = HashSet::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "binder: watching pending pods");
                continue;
            }
        };
        let uid = pod.uid().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() || !taken.insert(uid.clone()) {
            continue;
        }
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let node = nodes[next.fetch_add(1, Ordering::Relaxed) % nodes.len()].clone();
        let (api, events) = (api.clone(), events.clone());
        tokio::spawn(async move {
            let name = pod.name_any();
            match bind(&api, &name, &uid, &node).await {
                Ok(()) => {
                    if let Some(events) = events
                        && let Err(e) = events.create(&PostParams::default(), &scheduled(&pod, &node)).await
                    {
                        tracing::debug!(pod = %name, error = %e, "binder: event not recorded");
                    }
                }
                Err(e) => tracing::warn!(pod = %name, %node, error = %e, "binder: bind failed"),
            }
            drop(permit);
        });
    }
}

async fn bind(api: &Api<Pod>, name: &str, uid: &str, node: &str) -> Result<(), kube::Error> {
    let binding = Binding {
        metadata: ObjectMeta { name: Some(name.to_string()), uid: Some(uid.to_string()), ..ObjectMeta::default() },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..ObjectReference::default()
        },
    };
    api.create_subresource::<_, serde_json::Value>("binding", name, &PostParams::default(), &binding).await.map(drop)
}

/// The `Scheduled` event kube-scheduler records (`Successfully assigned ns/pod to node`).
fn scheduled(pod: &Pod, node: &str) -> Event {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    Event {
        metadata: ObjectMeta { generate_name: Some(format!("{name}.")), ..ObjectMeta::default() },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some("Binding".into()),
        reason: Some("Scheduled".into()),
        note: Some(format!("Successfully assigned {namespace}/{name} to {node}")),
        type_: Some("Normal".into()),
        reporting_controller: Some("wasmsched.io/bench-binder".into()),
        reporting_instance: Some("bench-binder".into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace),
            name: Some(name),
            uid: pod.uid(),
            ..ObjectReference::default()
        }),
        ..Event::default()
    }
}
