//! What the scheduler reports on `Queue` and `PodGroup` objects: allocation and task counts, the
//! phase of a gang, and a condition with the reason. Written by the leader through the status
//! subresource, only when something other than a timestamp changed, so a quiet cluster costs no
//! writes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ahash::AHashMap;
use futures_util::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use wasmsched_api::{GPU_MILLI, Resources};

use crate::convert::GPU_RESOURCE;
use crate::crd::{PodGroup, PodGroupPhase, PodGroupStatus, Queue, QueueStatus, ResourceList};

/// Resources as a Kubernetes resource list (GPUs in whole devices, `m` for shares).
pub fn resource_list(r: &Resources) -> ResourceList {
    let mut list = ResourceList::new();
    if r.cpu_milli > 0 {
        list.insert("cpu".into(), Quantity(format!("{}m", r.cpu_milli)));
    }
    if r.memory_bytes > 0 {
        list.insert("memory".into(), Quantity(r.memory_bytes.to_string()));
    }
    if r.gpu_milli > 0 {
        let gpus = if r.gpu_milli.is_multiple_of(u64::from(GPU_MILLI)) {
            (r.gpu_milli / u64::from(GPU_MILLI)).to_string()
        } else {
            format!("{}m", r.gpu_milli)
        };
        list.insert(GPU_RESOURCE.into(), Quantity(gpus));
    }
    // Extended resources too: a DeviceClass's DRA devices (`deviceclass.resource.kubernetes.io/…`)
    // count in a queue like GPUs, and its status shows them.
    for (name, n) in r.extended.iter().filter(|(_, n)| *n > 0) {
        list.insert(name.to_string(), Quantity(n.to_string()));
    }
    list
}

/// A condition as of now.
pub fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// A status without its timestamps, for "did anything change".
fn fingerprint(status: &impl serde::Serialize) -> String {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    for c in v["conditions"].as_array_mut().into_iter().flatten() {
        c.as_object_mut().map(|o| o.remove("lastTransitionTime"));
    }
    v.to_string()
}

/// Status writes in flight at most. A new leader writes every Queue and PodGroup once: on a
/// real API server, one task and one connection per object (thousands of PodGroups after hours
/// of gangs) opened 14,000 connections and starved the server of TLS handshakes.
pub const WRITES_IN_FLIGHT: usize = 8;

/// Writes statuses, remembering what it wrote. Writes wait in a queue, the latest per object (an
/// object that changes again before its write goes out is written once, as it is then), and go
/// out [`WRITES_IN_FLIGHT`] at a time; a write that fails is forgotten, so the next pass writes
/// that object again.
pub struct StatusWriter {
    queues: Api<Queue>,
    client: Client,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<tokio::sync::Notify>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

/// What the writer and its workers share.
#[derive(Default)]
struct Shared {
    /// What each object's status was last set to say (written or queued), by key.
    written: AHashMap<String, String>,
    /// Objects waiting for their write, in order, and each one's latest write.
    order: VecDeque<String>,
    waiting: AHashMap<String, Write>,
}

type Write = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), kube::Error>> + Send>;

impl StatusWriter {
    /// A writer through `client`.
    pub fn new(client: Client) -> StatusWriter {
        StatusWriter {
            queues: Api::all(client.clone()),
            client,
            shared: Arc::default(),
            wake: Arc::default(),
            workers: Vec::new(),
        }
    }

    /// Writes `status` on queue `name` unless it already says this.
    pub fn queue(&mut self, name: &str, status: QueueStatus) {
        let key = format!("queue/{name}");
        if !self.changed(&key, &status) {
            return;
        }
        self.enqueue(key, patch(self.queues.clone(), name.to_string(), json!({ "status": status })));
    }

    /// Writes `status` on pod group `key` (`namespace/name`) unless it already says this.
    pub fn group(&mut self, key: &str, status: PodGroupStatus) {
        let Some((namespace, name)) = key.split_once('/') else { return };
        let key = format!("group/{key}");
        if !self.changed(&key, &status) {
            return;
        }
        let api: Api<PodGroup> = Api::namespaced(self.client.clone(), namespace);
        self.enqueue(key, patch(api, name.to_string(), json!({ "status": status })));
    }

    /// Status writes waiting to go out.
    pub fn waiting(&self) -> usize {
        self.shared.lock().unwrap().order.len()
    }

    /// Writes `conditions` on the Workload API's pod group `key` (`namespace/name`, of
    /// `resource`'s version) unless they already say this. The whole list is written (a merge
    /// patch replaces a list), with the conditions others wrote as last seen.
    pub fn upstream_group(&mut self, resource: &kube::api::ApiResource, key: &str, conditions: Vec<Condition>) {
        let status = json!({ "conditions": conditions });
        let Some((namespace, name)) = key.split_once('/') else { return };
        let key = format!("upstream-group/{key}");
        if !self.changed(&key, &status) {
            return;
        }
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, resource);
        self.enqueue(key, patch(api, name.to_string(), json!({ "status": status })));
    }

    /// Forgets what was written and drops what waits (a replica that stopped leading writes
    /// nothing; a new leader writes everything once).
    pub fn reset(&mut self) {
        let mut shared = self.shared.lock().unwrap();
        shared.written.clear();
        shared.order.clear();
        shared.waiting.clear();
    }

    fn changed(&mut self, key: &str, status: &impl serde::Serialize) -> bool {
        let print = fingerprint(status);
        let mut shared = self.shared.lock().unwrap();
        if shared.written.get(key) == Some(&print) {
            return false;
        }
        shared.written.insert(key.to_string(), print);
        true
    }

    fn enqueue(&mut self, key: String, write: Write) {
        {
            let mut shared = self.shared.lock().unwrap();
            if shared.waiting.insert(key.clone(), write).is_none() {
                shared.order.push_back(key);
            }
        }
        if self.workers.is_empty() {
            self.workers =
                (0..WRITES_IN_FLIGHT).map(|_| tokio::spawn(work(self.shared.clone(), self.wake.clone()))).collect();
        }
        self.wake.notify_one();
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        for worker in &self.workers {
            worker.abort();
        }
    }
}

/// One of the writer's workers: the next waiting write, until none waits, then sleep.
async fn work(shared: Arc<Mutex<Shared>>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let next = {
            let mut s = shared.lock().unwrap();
            s.order.pop_front().and_then(|key| s.waiting.remove(&key).map(|write| (key, write)))
        };
        let Some((key, write)) = next else {
            wake.notified().await;
            continue;
        };
        if let Err(e) = write().await {
            tracing::debug!(object = %key, error = %e, "status not written; written again on the next pass");
            shared.lock().unwrap().written.remove(&key);
        }
    }
}

/// A merge patch of the status of `name`.
fn patch<K>(api: Api<K>, name: String, patch: serde_json::Value) -> Write
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    Box::new(move || {
        Box::pin(
            async move { api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ()) },
        )
    })
}

/// A pod group's status from what the core knows of it: `(phase, running, pending, message)`.
pub fn group_status(phase: PodGroupPhase, running: u32, pending: u32, message: &str) -> PodGroupStatus {
    let scheduled = matches!(phase, PodGroupPhase::Running);
    let reason = match phase {
        PodGroupPhase::Running => "Scheduled",
        PodGroupPhase::TimedOut => "TimedOut",
        _ => "Unschedulable",
    };
    PodGroupStatus { phase, conditions: vec![condition("Scheduled", scheduled, reason, message)], running, pending }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_and_fingerprints_ignore_what_does_not_matter() {
        let r = Resources { cpu_milli: 1500, memory_bytes: 1 << 30, gpu_milli: 2500, extended: Default::default() };
        let list = resource_list(&r);
        assert_eq!(list["cpu"].0, "1500m");
        assert_eq!(list[GPU_RESOURCE].0, "2500m");
        assert_eq!(resource_list(&Resources { gpu_milli: 3000, ..Default::default() })[GPU_RESOURCE].0, "3");
        let dra = Resources {
            extended: vec![("deviceclass.resource.kubernetes.io/gpu".into(), 4)].into(),
            ..Default::default()
        };
        assert_eq!(resource_list(&dra)["deviceclass.resource.kubernetes.io/gpu"].0, "4", "DRA devices by class show");
        let a = group_status(PodGroupPhase::Pending, 0, 2, "waiting");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = group_status(PodGroupPhase::Pending, 0, 2, "waiting");
        assert_ne!(a, b, "the timestamps differ");
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&group_status(PodGroupPhase::Running, 2, 0, "")));
    }
}
