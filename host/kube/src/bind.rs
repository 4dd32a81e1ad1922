//! The effects of a decision on the API server: the `pods/binding` subresource (with the GPUs in an
//! annotation, which the API server copies onto the pod in the same write), the `PodScheduled`
//! condition and a `FailedScheduling` event for a pod that cannot be placed, and evictions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{EvictParams, Patch, PatchParams, PostParams};
pub use kube::runtime::events::EventType;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::Semaphore;
use wasmsched_api::DeviceShare;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};

use crate::convert::{GPU_IDS_ANNOTATION, NUMA_NODE_ANNOTATION, PodKey, gpu_ids};
use crate::dra::{ClaimWrite, FINALIZER, MadeClaim};
use crate::workloads::PREEMPTION_REQUESTED_ANNOTATION;

/// How a bind (or eviction) failed, which decides what happens to the pod.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EffectError {
    /// 409: the pod is already bound (another scheduler or a previous attempt won). Never retried:
    /// the watch stream shows where it went.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 404: the pod is gone.
    #[error("not found: {0}")]
    NotFound(String),
    /// 429 (eviction refused by a PodDisruptionBudget, or throttled), with the server's
    /// `Retry-After` when it gave one.
    #[error("refused for now: {0}")]
    TooManyRequests(String, Option<std::time::Duration>),
    /// Other failures (5xx, transport): retried after back-off.
    #[error("{0}")]
    Retryable(String),
    /// This replica is not the leader: nothing was written.
    #[error("not the leader")]
    NotLeader,
}

impl EffectError {
    /// How long the server asked to wait before trying again (a 429's `Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            EffectError::TooManyRequests(_, Some(after)) => Some(*after),
            _ => None,
        }
    }

    fn from_kube(e: kube::Error) -> EffectError {
        match e {
            kube::Error::Api(s) if s.code == 409 => EffectError::Conflict(s.message),
            kube::Error::Api(s) if s.code == 404 => EffectError::NotFound(s.message),
            kube::Error::Api(s) if s.code == 429 => {
                let after = s.details.as_ref().map(|d| d.retry_after_seconds).filter(|s| *s > 0);
                EffectError::TooManyRequests(s.message, after.map(|s| std::time::Duration::from_secs(s.into())))
            }
            kube::Error::Api(s) => EffectError::Retryable(format!("{} {}: {}", s.code, s.reason, s.message)),
            other => EffectError::Retryable(other.to_string()),
        }
    }
}

/// Events queued or in flight at most; more are dropped, as kube-scheduler's event broadcaster
/// drops them when its queue is full: events are best effort, and a storm of them must neither
/// grow memory nor hold anything up.
pub const EVENTS_QUEUED: usize = 1000;

/// Events sent at once. Each request in flight holds a connection of its own (HTTP/1.1), and a
/// new leader facing hundreds of pending pods once opened ~650 connections, each a TLS handshake
/// for the API server, to say why each waits: so a bound. Not a tighter one: a `Scheduled` event
/// follows every bind, and with 16 in flight a real API server busy with 800 binds a second took
/// only ~350 events a second, so more than a third of a 5,000-pod batch's events were dropped
/// (the queue full); 64, as many as the binds' usual bound, keep up (1.00 event per bind).
pub const EVENTS_IN_FLIGHT: usize = 64;

/// Tries per event: with the back-off, an event waits up to about 24 s for room at the server.
const EVENT_TRIES: u32 = 8;

/// Writes decisions to the API server.
#[derive(Clone)]
pub struct Effects {
    client: Client,
    /// Why pods wait (`PodScheduled=False`): on the events' client when there is one, so a wave
    /// of pending reasons never queues ahead of binds in the same rate limit.
    reports: Client,
    recorder: Recorder,
    scheduler_name: String,
    event_slots: Arc<Semaphore>,
    /// Permits to send: [`EVENTS_IN_FLIGHT`].
    event_sends: Arc<Semaphore>,
    /// Where events not recorded are counted (by why), when the scheduler exports metrics.
    events_lost: Option<
        prometheus_client::metrics::family::Family<
            crate::metrics::LostLabels,
            prometheus_client::metrics::counter::Counter,
        >,
    >,
}

impl Effects {
    /// Effects written as `scheduler_name` (the events' reporting controller).
    pub fn new(client: Client, scheduler_name: &str, instance: &str) -> Effects {
        let reporter = Reporter { controller: scheduler_name.into(), instance: Some(instance.into()) };
        Effects {
            recorder: Recorder::new(client.clone(), reporter),
            reports: client.clone(),
            client,
            scheduler_name: scheduler_name.into(),
            event_slots: Arc::new(Semaphore::new(EVENTS_QUEUED)),
            event_sends: Arc::new(Semaphore::new(EVENTS_IN_FLIGHT)),
            events_lost: None,
        }
    }

    /// Events not recorded are counted in `metrics`' `wasmsched_kubernetes_events_lost_total`.
    pub fn counting_lost_events(mut self, metrics: &crate::metrics::Metrics) -> Effects {
        self.events_lost = Some(metrics.events_lost.clone());
        self
    }

    fn lost_event(&self, reason: &'static str) {
        if let Some(lost) = &self.events_lost {
            lost.get_or_create(&crate::metrics::LostLabels { reason }).inc();
        }
    }

    /// Kubernetes events and pending pods' conditions through `client` (like kube-scheduler's event
    /// client: a rate limit of its own, so reports never delay binds).
    pub fn with_event_client(mut self, client: Client, instance: &str) -> Effects {
        let reporter = Reporter { controller: self.scheduler_name.clone(), instance: Some(instance.into()) };
        self.recorder = Recorder::new(client.clone(), reporter);
        self.reports = client;
        self
    }

    /// Binds the pod `key` (incarnation `uid`) to `node`, recording its GPUs and, when they share
    /// one, their NUMA node. The UID precondition makes a bind meant for a deleted pod fail instead
    /// of binding its same-named successor.
    pub async fn bind(
        &self,
        key: &PodKey,
        uid: &str,
        node: &str,
        devices: &[DeviceShare],
        numa: Option<u32>,
        at: wasmsched_events::Timestamp,
    ) -> Result<(), EffectError> {
        let mut annotations = BTreeMap::new();
        annotations.insert(crate::convert::SCHEDULED_AT_ANNOTATION.to_string(), at.to_string());
        if !devices.is_empty() {
            annotations.insert(GPU_IDS_ANNOTATION.to_string(), gpu_ids(devices));
        }
        if let Some(n) = numa {
            annotations.insert(NUMA_NODE_ANNOTATION.to_string(), n.to_string());
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(key.name.clone()),
                namespace: Some(key.namespace.clone()),
                uid: Some(uid.to_string()),
                annotations: Some(annotations),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            },
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        pods.create_subresource::<_, serde_json::Value>("binding", &key.name, &PostParams::default(), &binding)
            .await
            .map(drop)
            .map_err(EffectError::from_kube)
    }

    /// Marks a pod unschedulable (`PodScheduled=False`, reason `Unschedulable`, with the message
    /// kube-scheduler users know: `0/N nodes are available: …`) and records a `FailedScheduling`
    /// event. A preemptor waiting for its victims also gets `status.nominatedNodeName`, as
    /// kube-scheduler sets it (`kubectl get pod -o wide` shows it), in the same write.
    pub async fn unschedulable(
        &self,
        key: &PodKey,
        uid: &str,
        message: &str,
        nominated: Option<&str>,
    ) -> Result<(), EffectError> {
        let pods: Api<Pod> = Api::namespaced(self.reports.clone(), &key.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut patch = serde_json::json!({
            "status": { "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now.to_string(),
            }]}
        });
        if let Some(node) = nominated {
            patch["status"]["nominatedNodeName"] = node.into();
        }
        pods.patch_status(&key.name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(EffectError::from_kube)?;
        // An event is best effort: the condition above is the record.
        self.event(key, Some(uid), EventType::Warning, "FailedScheduling", message).await;
        Ok(())
    }

    /// Asks a victim that can checkpoint to do so: the annotation names who needs the room and
    /// the deadline after which it is evicted anyway; a `Preempting` event says the same to people.
    pub async fn request_checkpoint(&self, key: &PodKey, preemptor: &str, deadline: &str) -> Result<(), EffectError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let value = format!("preemptor={preemptor},deadline={deadline}");
        let patch = serde_json::json!({"metadata": {"annotations": {PREEMPTION_REQUESTED_ANNOTATION: value}}});
        pods.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(EffectError::from_kube)?;
        let note = format!("checkpoint and exit by {deadline}: {preemptor} needs the room");
        self.event(key, None, EventType::Normal, "Preempting", &note).await;
        Ok(())
    }

    /// Records a Kubernetes event about a pod. A 429 (the API server's priority level is full: a
    /// burst of binds brings a burst of `Scheduled` events) or a 5xx is tried again after the
    /// server's `Retry-After`, else a back-off doubling from 250 ms, up to [`EVENT_TRIES`] times;
    /// any other client error (a 403 without RBAC for events), or a queue already
    /// [`EVENTS_QUEUED`] long, loses the event at once. Each loss is logged and counted.
    pub async fn event(&self, key: &PodKey, uid: Option<&str>, type_: EventType, reason: &str, note: &str) {
        let Ok(_slot) = self.event_slots.try_acquire() else {
            tracing::debug!(pod = %key, reason, "event dropped: {EVENTS_QUEUED} already queued");
            self.lost_event("queue_full");
            return;
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: uid.map(String::from),
            ..Default::default()
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, 1024)),
            action: "Scheduling".into(),
            secondary: None,
        };
        let mut backoff = Duration::from_millis(250);
        for tries in 1..=EVENT_TRIES {
            let sent = match self.event_sends.acquire().await {
                Ok(_sending) => self.recorder.publish(&event, &reference).await,
                Err(_) => return,
            };
            let wait = match sent {
                Ok(()) => return,
                // A client error other than throttling (403: no RBAC for events; 422) stays.
                Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                    tracing::debug!(pod = %key, reason, code = s.code, error = %s.message, "event refused");
                    self.lost_event("refused");
                    return;
                }
                Err(e) => match EffectError::from_kube(e) {
                    e @ (EffectError::TooManyRequests(..) | EffectError::Retryable(_)) if tries < EVENT_TRIES => {
                        e.retry_after().unwrap_or(backoff)
                    }
                    e => {
                        tracing::debug!(pod = %key, reason, error = %e, tries, "event not recorded");
                        let retryable = matches!(e, EffectError::TooManyRequests(..) | EffectError::Retryable(_));
                        self.lost_event(if retryable { "retries_exhausted" } else { "refused" });
                        return;
                    }
                },
            };
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(Duration::from_secs(8));
        }
    }

    /// Gives the pod `key` (incarnation `uid`) its claim as kube-scheduler does before a bind:
    /// with `write.allocation`, the claim gets the delete-protection finalizer, then the
    /// allocation and the pod in `status.reservedFor` in one status write; without, the claim must
    /// be allocated already and only the reservation is added. Each write carries the
    /// `resourceVersion` just read: a conflict reads the claim again and tries again; a claim
    /// allocated by someone else in the meantime is a failure (nothing of ours is on it then).
    pub async fn reserve_claim(&self, key: &PodKey, uid: &str, write: &ClaimWrite) -> Result<(), EffectError> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &write.namespace);
        let mut last = None;
        let mut waits = 0;
        let mut tries = 0;
        while tries < CLAIM_WRITE_TRIES {
            tries += 1;
            let mut claim = match write.seen.clone().filter(|_| tries == 1) {
                Some(seen) => seen,
                None => claims.get(&write.name).await.map_err(claim_error)?,
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return Err(EffectError::Retryable(format!("ResourceClaim {} is being deleted", write.name)));
            }
            let status = claim.status.get_or_insert_default();
            let reserved = status.reserved_for.iter().flatten().any(|r| r.uid == uid);
            match (&write.allocation, &status.allocation) {
                // Our own earlier write (a retry after a lost answer).
                (Some(_), Some(_)) if reserved => return Ok(()),
                (Some(_), Some(_)) => {
                    return Err(EffectError::Retryable(format!(
                        "ResourceClaim {} was allocated by someone else in the meantime",
                        write.name
                    )));
                }
                (None, None) if write.after_ours && waits < CLAIM_ALLOCATION_WAITS => {
                    // Another pod of ours is writing its allocation right now.
                    waits += 1;
                    tries -= 1;
                    tokio::time::sleep(CLAIM_ALLOCATION_WAIT).await;
                    continue;
                }
                (None, None) => {
                    return Err(EffectError::Retryable(format!(
                        "ResourceClaim {} was deallocated in the meantime",
                        write.name
                    )));
                }
                _ => {}
            }
            if reserved {
                return Ok(());
            }
            if let Some(allocation) = &write.allocation {
                let finalizers = claim.metadata.finalizers.get_or_insert_default();
                if !finalizers.iter().any(|f| f == FINALIZER) {
                    finalizers.push(FINALIZER.to_string());
                    claim = match claims.replace(&write.name, &PostParams::default(), &claim).await {
                        Ok(c) => c,
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            last = Some(s.message);
                            continue;
                        }
                        Err(e) => return Err(claim_error(e)),
                    };
                }
                claim.status.get_or_insert_default().allocation = Some(allocation.clone());
            }
            claim.status.get_or_insert_default().reserved_for.get_or_insert_default().push(
                ResourceClaimConsumerReference {
                    api_group: None,
                    resource: "pods".into(),
                    name: key.name.clone(),
                    uid: uid.into(),
                },
            );
            match claims.replace_status(&write.name, &PostParams::default(), &claim).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => last = Some(s.message),
                Err(e) => return Err(claim_error(e)),
            }
        }
        Err(EffectError::Retryable(format!(
            "ResourceClaim {}: still conflicting after {CLAIM_WRITE_TRIES} tries: {}",
            write.name,
            last.unwrap_or_default()
        )))
    }

    /// Writes each of a pod's claims in turn ([`Effects::reserve_claim`]); when one fails, those
    /// written before it are taken back and the failure returned.
    /// A claim still to be made for the pod's extended resources is created first (its name
    /// replaces the placeholder in `writes`), and once all are written the pod's
    /// `status.extendedResourceClaimStatus` names it with the container mappings, as the kubelet
    /// reads them.
    pub async fn reserve_claims(&self, key: &PodKey, uid: &str, writes: &mut [ClaimWrite]) -> Result<(), EffectError> {
        for i in 0..writes.len() {
            let result = match writes[i].create.clone() {
                Some(made) => match self.create_claim(&made).await {
                    Ok(created) => {
                        writes[i].name = created.metadata.name.clone().unwrap_or_default();
                        writes[i].seen = Some(created);
                        self.reserve_claim(key, uid, &writes[i]).await
                    }
                    Err(e) => Err(e),
                },
                None => self.reserve_claim(key, uid, &writes[i]).await,
            };
            if let Err(e) = result {
                // A claim created here and not reserved is deleted with the rest.
                let upto =
                    if writes[i].create.is_some() && writes[i].name != placeholder(&writes[i]) { i + 1 } else { i };
                self.unreserve_claims(key, uid, &writes[..upto]).await;
                return Err(e);
            }
        }
        if let Some(made) = writes.iter().find(|w| w.create.is_some()) {
            let mappings = made.create.as_ref().map(|m| m.mappings.clone()).unwrap_or_default();
            let patch = serde_json::json!({"status": {"extendedResourceClaimStatus": {
                "resourceClaimName": made.name, "requestMappings": mappings}}});
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
            if let Err(e) = pods.patch_status(&key.name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                self.unreserve_claims(key, uid, writes).await;
                return Err(EffectError::from_kube(e));
            }
        }
        Ok(())
    }

    /// Creates the claim for a pod's extended resources, as the API server stored it (named).
    async fn create_claim(&self, made: &MadeClaim) -> Result<ResourceClaim, EffectError> {
        let namespace = made.claim.metadata.namespace.clone().unwrap_or_default();
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
        let mut claim = made.claim.clone();
        claim.metadata.name = None;
        // Allocated at once: protected from deletion while allocated, as any claim we allocate.
        claim.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        let created = claims.create(&PostParams::default(), &claim).await.map_err(claim_error)?;
        match created.metadata.name {
            Some(_) => Ok(created),
            None => Err(EffectError::Retryable("the API server named no claim".into())),
        }
    }

    /// Takes back what [`Effects::reserve_claims`] wrote (the bind failed), logging what could
    /// not be: kube-scheduler leaves the same to the next attempt and the resource-claim controller.
    pub async fn unreserve_claims(&self, key: &PodKey, uid: &str, writes: &[ClaimWrite]) {
        for write in writes {
            let made = write.create.is_some();
            if made && write.name == placeholder(write) {
                continue;
            }
            let mut result = self.unreserve_claim(uid, write).await;
            if made && result.is_ok() {
                // The claim made for the pod goes with the attempt, as kube-scheduler deletes it.
                let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &write.namespace);
                result = match claims.delete(&write.name, &Default::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(claim_error(e)),
                };
            }
            if let Err(e) = result {
                tracing::warn!(pod = %key, claim = %write.name, error = %e, "could not take back a claim's reservation");
            }
        }
    }

    /// Takes back what [`Effects::reserve_claim`] wrote for pod `uid` (its bind failed): the pod
    /// leaves `status.reservedFor`, and a claim allocated by that write with no one else reserved
    /// is deallocated. A claim that is gone needs nothing.
    pub async fn unreserve_claim(&self, uid: &str, write: &ClaimWrite) -> Result<(), EffectError> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &write.namespace);
        for _ in 0..CLAIM_WRITE_TRIES {
            let mut claim = match claims.get(&write.name).await {
                Ok(c) => c,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(claim_error(e)),
            };
            let status = claim.status.get_or_insert_default();
            let reserved = status.reserved_for.get_or_insert_default();
            let before = reserved.len();
            reserved.retain(|r| r.uid != uid);
            let ours_alone = write.allocation.is_some() && reserved.is_empty() && status.allocation == write.allocation;
            if reserved.len() == before && !ours_alone {
                return Ok(());
            }
            if reserved.is_empty() {
                status.reserved_for = None;
            }
            if ours_alone {
                status.allocation = None;
            }
            match claims.replace_status(&write.name, &PostParams::default(), &claim).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(claim_error(e)),
            }
        }
        Err(EffectError::Retryable(format!("ResourceClaim {}: could not take back the reservation", write.name)))
    }

    /// Evicts a pod through the Eviction API, so PodDisruptionBudgets are respected: a refusal is
    /// [`EffectError::TooManyRequests`] and the victim keeps running.
    pub async fn evict(&self, key: &PodKey) -> Result<(), EffectError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        pods.evict(&key.name, &EvictParams::default()).await.map(drop).map_err(EffectError::from_kube)
    }
}

/// The placeholder name of a claim still to be made.
fn placeholder(write: &ClaimWrite) -> String {
    write.create.as_ref().and_then(|m| m.claim.metadata.name.clone()).unwrap_or_default()
}

/// How often a claim write is tried when others change the claim in between.
const CLAIM_WRITE_TRIES: usize = 5;
/// How long a reservation waits for the allocation another pod of ours is writing on the same
/// claim: `CLAIM_ALLOCATION_WAITS` times `CLAIM_ALLOCATION_WAIT` at most.
const CLAIM_ALLOCATION_WAITS: usize = 25;
const CLAIM_ALLOCATION_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A failed claim read or write: a pod whose claim write failed waits and is tried again (a 409
/// on a claim is never "bound elsewhere").
fn claim_error(e: kube::Error) -> EffectError {
    match EffectError::from_kube(e) {
        EffectError::Conflict(m) | EffectError::NotFound(m) => EffectError::Retryable(m),
        other => other,
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl crate::executor::Executor for Effects {
    fn bind<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        node: &'a str,
        devices: &'a [DeviceShare],
        numa: Option<u32>,
        at: wasmsched_events::Timestamp,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(Effects::bind(self, key, uid, node, devices, numa, at))
    }

    fn reserve_claims<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        writes: &'a mut [ClaimWrite],
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(Effects::reserve_claims(self, key, uid, writes))
    }

    fn unreserve_claims<'a>(&'a self, key: &'a PodKey, uid: &'a str, writes: &'a [ClaimWrite]) -> BoxFuture<'a, ()> {
        Box::pin(Effects::unreserve_claims(self, key, uid, writes))
    }

    fn unschedulable<'a>(
        &'a self,
        key: &'a PodKey,
        uid: &'a str,
        message: &'a str,
        nominated: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(Effects::unschedulable(self, key, uid, message, nominated))
    }

    fn request_checkpoint<'a>(
        &'a self,
        key: &'a PodKey,
        preemptor: &'a str,
        deadline: &'a str,
    ) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(Effects::request_checkpoint(self, key, preemptor, deadline))
    }

    fn evict<'a>(&'a self, key: &'a PodKey) -> BoxFuture<'a, Result<(), EffectError>> {
        Box::pin(Effects::evict(self, key))
    }

    fn event<'a>(
        &'a self,
        key: &'a PodKey,
        uid: Option<&'a str>,
        type_: EventType,
        reason: &'a str,
        note: &'a str,
    ) -> BoxFuture<'a, ()> {
        Box::pin(Effects::event(self, key, uid, type_, reason, note))
    }

    fn ended_as<'a>(&'a self, key: &'a PodKey) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
            match pods.get_opt(&key.name).await {
                Ok(pod) => pod.and_then(|p| p.status).and_then(|s| {
                    if s.reason.as_deref() == Some("Evicted") { Some("Evicted".into()) } else { s.phase }
                }),
                Err(e) => {
                    tracing::info!(pod = %key, error = %e, "cannot read how a pod ended; its run ends as deleted");
                    None
                }
            }
        })
    }
}
