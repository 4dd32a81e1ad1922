//! Multi-node NVLink for the workloads that ask for it: NVIDIA's DRA driver shares GPU memory
//! across the nodes of one NVLink domain (an NVL72 rack) through a `ComputeDomain` object, whose
//! IMEX channel the pods claim. Left to users, the object is one more manifest to write and, worse,
//! to delete; and nothing keeps the pods inside one NVLink domain. Here a pod annotated
//! `scheduling.wasmsched.io/compute-domain: NAME` gets both:
//!
//! - **placement**: its workload (its gang, or the pod alone) must stay inside one domain of
//!   [`CLIQUE_LABEL`], the label the driver puts on each node of an NVLink domain;
//! - **the object**: the leader creates `ComputeDomain` NAME in the pod's namespace — `numNodes: 0`
//!   (the driver's advice: the workload counts its own peers) and a channel whose
//!   `ResourceClaimTemplate` is named by the pod's `…/compute-domain-channel` annotation, else
//!   NAME; the pods name that template in `spec.resourceClaims`, and the driver creates it — labelled
//!   [`MANAGED_BY`] and owned by the pods' controller when they share one (so deleting the Job
//!   deletes it too);
//! - **removal**: once none of our pods that ask for it is left (finished pods leave the
//!   scheduler's watch), the leader deletes it — only a domain it created, never a user's.
//!
//! One task does the API writes ([`ComputeDomains::start`]); the loop tells it what its pods ask for
//! ([`ComputeDomains::want`]), so a slow or missing API never holds up a scheduling cycle.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

use crate::groups::owners::OwnerRef;

/// Pod annotation: the pod's workload runs in this `ComputeDomain` (created if missing).
pub const COMPUTE_DOMAIN_ANNOTATION: &str = "scheduling.wasmsched.io/compute-domain";
/// Pod annotation: the name of the domain's channel `ResourceClaimTemplate` (default: the domain's).
pub const CHANNEL_ANNOTATION: &str = "scheduling.wasmsched.io/compute-domain-channel";
/// The node label of an NVLink domain, as NVIDIA's DRA driver and GPU feature discovery write it.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
/// The label on the domains the scheduler created: those (and only those) it deletes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "wasmsched");

/// How often the domains are listed again (one the user deleted while pods still ask for it is
/// created again) and a failed write is retried.
const RESYNC: Duration = Duration::from_secs(30);

/// What a pod asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRequest {
    /// The `ComputeDomain`'s name, in the pod's namespace.
    pub name: String,
    /// Its channel's `ResourceClaimTemplate`.
    pub channel: String,
}

impl DomainRequest {
    /// The request `pod`'s annotations make, if any.
    pub fn of(pod: &Pod) -> Option<DomainRequest> {
        let annotations = pod.metadata.annotations.as_ref()?;
        let value = |k: &str| annotations.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let name = value(COMPUTE_DOMAIN_ANNOTATION)?;
        let channel = value(CHANNEL_ANNOTATION).unwrap_or_else(|| name.clone());
        Some(DomainRequest { name, channel })
    }
}

/// One domain as the pods asking for it want it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The channel's template.
    pub channel: String,
    /// The controller all those pods share, if they share one.
    pub owner: Option<OwnerRef>,
}

/// The domains wanted, by `namespace/name`.
pub type Wanted = BTreeMap<String, Want>;

/// Adds to `wanted` what one pod of `namespace` asks for: the first pod names the channel; the
/// owner stays only while every pod has the same controller.
pub fn add(wanted: &mut Wanted, namespace: &str, request: &DomainRequest, owner: Option<&OwnerRef>) {
    let key = format!("{namespace}/{}", request.name);
    match wanted.get_mut(&key) {
        Some(w) => {
            if w.owner.as_ref() != owner {
                w.owner = None;
            }
        }
        None => {
            wanted.insert(key, Want { channel: request.channel.clone(), owner: owner.cloned() });
        }
    }
}

/// The handle the scheduling loop tells what its pods ask for; cheap, never blocks.
pub struct ComputeDomains {
    tx: watch::Sender<Option<Wanted>>,
}

impl ComputeDomains {
    /// Starts the task that creates and deletes domains while `leader` is `true`; it does nothing
    /// before the first [`ComputeDomains::want`] (before the pods are listed, "no pod asks" is not
    /// known), and ends with the handle.
    pub fn start(client: Client, leader: watch::Receiver<bool>) -> ComputeDomains {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(Keeper::new(client, leader).run(rx));
        ComputeDomains { tx }
    }

    /// Every domain the pods of ours ask for now.
    pub fn want(&self, wanted: Wanted) {
        self.tx.send_if_modified(|w| {
            let changed = w.as_ref() != Some(&wanted);
            if changed {
                *w = Some(wanted);
            }
            changed
        });
    }
}

/// `resource.nvidia.com/v1beta1` `ComputeDomain`.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.nvidia.com", "v1beta1", "ComputeDomain"),
        "computedomains",
    )
}

/// The object created for `key` (`namespace/name`).
pub fn object(key: &str, want: &Want) -> DynamicObject {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    let mut object = DynamicObject::new(name, &api_resource()).within(namespace);
    object.metadata.labels = Some([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())].into());
    object.metadata.owner_references = want.owner.as_ref().map(|o| {
        vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            controller: Some(false),
            block_owner_deletion: None,
        }]
    });
    object.data = json!({"spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": want.channel}}}});
    object
}

/// The task that carries the wants out.
struct Keeper {
    client: Client,
    leader: watch::Receiver<bool>,
    /// Domains that exist, by `namespace/name`, and whether we created them.
    present: BTreeMap<String, bool>,
    /// `present` is as the last list showed (else it is listed first).
    listed: bool,
    /// The resource is not served (the driver's CRD is not installed): said once.
    unserved_said: bool,
}

impl Keeper {
    fn new(client: Client, leader: watch::Receiver<bool>) -> Keeper {
        Keeper { client, leader, present: BTreeMap::new(), listed: false, unserved_said: false }
    }

    async fn run(mut self, mut rx: watch::Receiver<Option<Wanted>>) {
        loop {
            let wanted = rx.borrow_and_update().clone();
            if *self.leader.borrow()
                && let Some(wanted) = wanted
            {
                self.reconcile(&wanted).await;
            } else {
                // Another replica may create and delete meanwhile: list again when leading.
                self.listed = false;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                changed = self.leader.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(RESYNC) => self.listed = false,
            }
        }
    }

    /// Creates what is wanted and missing, deletes ours that nothing wants.
    async fn reconcile(&mut self, wanted: &Wanted) {
        let all: Api<DynamicObject> = Api::all_with(self.client.clone(), &api_resource());
        if !self.listed {
            if wanted.is_empty() && self.present.is_empty() && self.unserved_said {
                return;
            }
            let params = ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
            match all.list(&params).await {
                Ok(list) => {
                    self.present.retain(|_, ours| !*ours);
                    // One being deleted (the driver's finalizer holds it) is gone for us already.
                    for d in list.items.into_iter().filter(|d| d.metadata.deletion_timestamp.is_none()) {
                        let key = format!(
                            "{}/{}",
                            d.metadata.namespace.unwrap_or_default(),
                            d.metadata.name.unwrap_or_default()
                        );
                        self.present.insert(key, true);
                    }
                    self.listed = true;
                }
                Err(e) => return self.failed("list", "", &e),
            }
        }
        let missing: Vec<(&String, &Want)> = wanted.iter().filter(|(k, _)| !self.present.contains_key(*k)).collect();
        for (key, want) in missing {
            let object = object(key, want);
            let api: Api<DynamicObject> = Api::namespaced_with(
                self.client.clone(),
                object.metadata.namespace.as_deref().unwrap_or_default(),
                &api_resource(),
            );
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => {
                    tracing::info!(domain = %key, channel = %want.channel, "ComputeDomain created");
                    self.present.insert(key.clone(), true);
                }
                // Someone made it first (the user, or we before a restart): used as it is.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let ours = match api.get(object.metadata.name.as_deref().unwrap_or_default()).await {
                        Ok(d) => d
                            .metadata
                            .labels
                            .is_some_and(|l| l.get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)),
                        Err(_) => false,
                    };
                    self.present.insert(key.clone(), ours);
                }
                Err(e) => return self.failed("create", key, &e),
            }
        }
        let unwanted: Vec<String> = self
            .present
            .iter()
            .filter(|(k, ours)| **ours && !wanted.contains_key(*k))
            .map(|(k, _)| k.clone())
            .collect();
        for key in unwanted {
            let (namespace, name) = key.split_once('/').unwrap_or(("", &key));
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &api_resource());
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => tracing::info!(domain = %key, "ComputeDomain deleted: no pod asks for it any more"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return self.failed("delete", &key, &e),
            }
            self.present.remove(&key);
        }
        // A user's domain nothing asks for is forgotten: if asked for again, it is looked at again.
        self.present.retain(|k, ours| *ours || wanted.contains_key(k));
    }

    /// A write or list failed: said (a missing resource once), retried at the next resync.
    fn failed(&mut self, what: &str, key: &str, e: &kube::Error) {
        self.listed = false;
        if matches!(e, kube::Error::Api(s) if s.code == 404) {
            if !self.unserved_said {
                self.unserved_said = true;
                tracing::warn!(
                    "ComputeDomain (resource.nvidia.com/v1beta1) is not served: pods asking for one are placed inside \
                     one {CLIQUE_LABEL} domain, but no domain is created until NVIDIA's DRA driver is installed"
                );
            }
            return;
        }
        tracing::warn!(domain = key, error = %e, "ComputeDomain {what} failed; retried in {}s", RESYNC.as_secs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "w-0", "namespace": "ml", "annotations": annotations}}))
            .unwrap()
    }

    #[test]
    fn a_pod_names_its_domain_and_the_channel_defaults_to_the_domain_s_name() {
        let r = DomainRequest::of(&pod(json!({COMPUTE_DOMAIN_ANNOTATION: " train-a "}))).unwrap();
        assert_eq!((r.name.as_str(), r.channel.as_str()), ("train-a", "train-a"));
        let r = DomainRequest::of(&pod(json!({COMPUTE_DOMAIN_ANNOTATION: "a", CHANNEL_ANNOTATION: "a-ch"}))).unwrap();
        assert_eq!(r.channel, "a-ch");
        assert_eq!(DomainRequest::of(&pod(json!({COMPUTE_DOMAIN_ANNOTATION: ""}))), None);
        assert_eq!(DomainRequest::of(&pod(json!({CHANNEL_ANNOTATION: "x"}))), None);
    }

    #[test]
    fn the_owner_is_kept_only_while_every_pod_shares_it() {
        let job = |uid: &str| OwnerRef {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "j".into(),
            uid: uid.into(),
        };
        let request = DomainRequest { name: "d".into(), channel: "c".into() };
        let mut wanted = Wanted::new();
        add(&mut wanted, "ml", &request, Some(&job("1")));
        add(&mut wanted, "ml", &request, Some(&job("1")));
        assert_eq!(wanted["ml/d"].owner, Some(job("1")));
        add(&mut wanted, "ml", &request, Some(&job("2")));
        add(&mut wanted, "other", &request, None);
        assert_eq!((wanted["ml/d"].owner.as_ref(), wanted.len()), (None, 2));
    }

    #[test]
    fn the_object_is_the_driver_s_shape_labelled_ours() {
        let job = OwnerRef { api_version: "batch/v1".into(), kind: "Job".into(), name: "j".into(), uid: "u".into() };
        let d = object("ml/train", &Want { channel: "train-ch".into(), owner: Some(job) });
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            (v["apiVersion"].as_str(), v["kind"].as_str()),
            (Some("resource.nvidia.com/v1beta1"), Some("ComputeDomain"))
        );
        assert_eq!((v["metadata"]["namespace"].as_str(), v["metadata"]["name"].as_str()), (Some("ml"), Some("train")));
        assert_eq!(v["spec"], json!({"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "train-ch"}}}));
        assert_eq!(v["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u");
    }
}
