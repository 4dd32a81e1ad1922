//! What the scheduler reports on `Queue` and `PodGroup` objects: allocation and task counts, the
//! phase of a gang, and a condition with the reason. Written by the leader through the status
//! subresource, only when something other than a timestamp changed, so a quiet cluster costs no
//! writes.

use ahash::AHashMap;
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

/// Writes statuses, remembering what it wrote.
pub struct StatusWriter {
    queues: Api<Queue>,
    client: Client,
    written: AHashMap<String, String>,
}

impl StatusWriter {
    /// A writer through `client`.
    pub fn new(client: Client) -> StatusWriter {
        StatusWriter { queues: Api::all(client.clone()), client, written: AHashMap::new() }
    }

    /// Writes `status` on queue `name` unless it already says this.
    pub fn queue(&mut self, name: &str, status: QueueStatus) {
        if !self.changed(&format!("queue/{name}"), &status) {
            return;
        }
        spawn_patch(self.queues.clone(), name.to_string(), json!({ "status": status }));
    }

    /// Writes `status` on pod group `key` (`namespace/name`) unless it already says this.
    pub fn group(&mut self, key: &str, status: PodGroupStatus) {
        if !self.changed(&format!("group/{key}"), &status) {
            return;
        }
        let Some((namespace, name)) = key.split_once('/') else { return };
        let api: Api<PodGroup> = Api::namespaced(self.client.clone(), namespace);
        spawn_patch(api, name.to_string(), json!({ "status": status }));
    }

    /// Writes `conditions` on the Workload API's pod group `key` (`namespace/name`, of
    /// `resource`'s version) unless they already say this. The whole list is written (a merge
    /// patch replaces a list), with the conditions others wrote as last seen.
    pub fn upstream_group(&mut self, resource: &kube::api::ApiResource, key: &str, conditions: Vec<Condition>) {
        let status = json!({ "conditions": conditions });
        if !self.changed(&format!("upstream-group/{key}"), &status) {
            return;
        }
        let Some((namespace, name)) = key.split_once('/') else { return };
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, resource);
        spawn_patch(api, name.to_string(), json!({ "status": status }));
    }

    /// Forgets what was written (a new leader writes everything once).
    pub fn reset(&mut self) {
        self.written.clear();
    }

    fn changed(&mut self, key: &str, status: &impl serde::Serialize) -> bool {
        let print = fingerprint(status);
        if self.written.get(key) == Some(&print) {
            return false;
        }
        self.written.insert(key.to_string(), print);
        true
    }
}

/// Merge-patches the status of `name` in the background; a failure is logged, the next change
/// writes again.
fn spawn_patch<K>(api: Api<K>, name: String, patch: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::debug!(object = %name, error = %e, "status not written");
        }
    });
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
