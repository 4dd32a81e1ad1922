//! A `SchedulingPolicy` object as a policy source: `kubectl apply` of a new policy set goes through
//! the same gates (digest, compile, smoke test, shadow, probation) as a file or a NATS push, and the
//! outcome is written back to the object's status.
//!
//! The registry's watcher polls sources from its own thread, so [`PolicyObjectSource::poll`] runs
//! its API calls on the scheduler's tokio runtime through a handle, each under a timeout: a slow
//! API server delays the next policy version, never a scheduling cycle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use wasmsched_registry::{ArtifactRef, Fetched, Outcome, PolicySetSpec, Registry, Source, SourceError, fingerprint};

use crate::crd::{SchedulingPolicy, SchedulingPolicyStatus};

/// How long one API call of a poll may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Follows the cluster-scoped `SchedulingPolicy` named `name` and the ConfigMaps (in one namespace)
/// holding its components.
pub struct PolicyObjectSource {
    policies: Api<SchedulingPolicy>,
    config_maps: Api<ConfigMap>,
    name: String,
    runtime: tokio::runtime::Handle,
    registry: Arc<Registry>,
    /// Fingerprint of the last version delivered.
    last: Option<String>,
    /// The origin of the last version delivered (it names the object's generation).
    delivered: Option<(String, i64)>,
    /// The status last written, so an unchanged outcome is not patched again.
    written: Option<SchedulingPolicyStatus>,
}

impl PolicyObjectSource {
    /// A source for the `SchedulingPolicy` `name`, its artifacts read from ConfigMaps in
    /// `namespace`. `runtime` must not be the thread calling [`Source::poll`] (the registry's
    /// watcher runs on its own thread). Outcomes are read from `registry`.
    pub fn new(
        client: kube::Client,
        name: &str,
        namespace: &str,
        runtime: tokio::runtime::Handle,
        registry: Arc<Registry>,
    ) -> PolicyObjectSource {
        PolicyObjectSource {
            policies: Api::all(client.clone()),
            config_maps: Api::namespaced(client, namespace),
            name: name.into(),
            runtime,
            registry,
            last: None,
            delivered: None,
            written: None,
        }
    }

    fn call<T>(&self, what: &str, f: impl Future<Output = Result<T, kube::Error>>) -> Result<T, SourceError> {
        let fetch_error = |message: String| SourceError::Fetch { what: what.to_string(), message };
        match self.runtime.block_on(async { tokio::time::timeout(CALL_TIMEOUT, f).await }) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(fetch_error(e.to_string())),
            Err(_) => Err(fetch_error(format!("no answer within {CALL_TIMEOUT:?}"))),
        }
    }

    /// The object's policy set and components, read now.
    fn fetch(&self, object: &SchedulingPolicy) -> Result<Fetched, SourceError> {
        let generation = object.metadata.generation.unwrap_or_default();
        let origin = format!("kubernetes:schedulingpolicies/{}@{generation}", self.name);
        let text = serde_json::to_string_pretty(&object.spec.policy_set).unwrap_or_default();
        let spec = PolicySetSpec::parse(&origin, &text)?;
        let mut artifacts = BTreeMap::new();
        let mut config_maps: BTreeMap<&str, ConfigMap> = BTreeMap::new();
        for (plugin, p) in &spec.plugins {
            let file = match ArtifactRef::parse(&p.source) {
                Ok(ArtifactRef::File(file)) => file,
                Ok(ArtifactRef::Object(object)) => {
                    return Err(SourceError::Fetch {
                        what: format!("plugin {plugin}"),
                        message: format!("object:{object} needs a NATS object store source; name a ConfigMap key here"),
                    });
                }
                _ => continue,
            };
            let Some(key) = object.spec.artifacts.get(&file) else {
                return Err(SourceError::Fetch {
                    what: format!("plugin {plugin}"),
                    message: format!("file:{file} is not in the object's artifacts"),
                });
            };
            if !config_maps.contains_key(key.name.as_str()) {
                let what = format!("ConfigMap {}", key.name);
                let cm = self.call(&what, self.config_maps.get_opt(&key.name))?;
                let cm = cm.ok_or_else(|| SourceError::Fetch { what, message: "not found".into() })?;
                config_maps.insert(&key.name, cm);
            }
            let bytes =
                config_maps[key.name.as_str()].binary_data.as_ref().and_then(|d| d.get(&key.key)).ok_or_else(|| {
                    SourceError::Fetch {
                        what: format!("plugin {plugin}"),
                        message: format!("ConfigMap {} has no binaryData key {}", key.name, key.key),
                    }
                })?;
            artifacts.insert(plugin.clone(), Arc::from(bytes.0.as_slice()));
        }
        let fingerprint = fingerprint(&text, &artifacts);
        Ok(Fetched { spec, origin, artifacts, fingerprint })
    }

    /// Writes what became of the last version delivered: `Accepted` (passed the gates) and `Live`.
    fn report(&mut self) {
        let Some((origin, generation)) = self.delivered.clone() else { return };
        let status = self.registry.status();
        let Some(entry) = status.history.iter().rev().find(|h| h.origin == origin) else { return };
        let is_live = self.registry.current().origin == origin;
        let accepted = match entry.outcome {
            Outcome::Rejected => ("False", "Rejected"),
            Outcome::Shadow => ("Unknown", "ShadowRun"),
            _ => ("True", "PassedGates"),
        };
        let live = match entry.outcome {
            Outcome::Probation if is_live => ("True", "Probation"),
            _ if is_live => ("True", "Live"),
            Outcome::RolledBack => ("False", "RolledBack"),
            Outcome::Superseded => ("False", "Superseded"),
            Outcome::Ready => ("False", "AwaitingPromotion"),
            Outcome::Shadow => ("False", "ShadowRun"),
            _ => ("False", "NotLive"),
        };
        let message =
            if entry.reason.is_empty() { entry.label.clone() } else { format!("{}: {}", entry.label, entry.reason) };
        self.write_status(generation, accepted, live, &message);
    }

    /// Patches the status subresource unless it already says this.
    fn write_status(&mut self, generation: i64, accepted: (&str, &str), live: (&str, &str), message: &str) {
        let condition = |kind: &str, (status, reason): (&str, &str)| Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        };
        let wanted = SchedulingPolicyStatus {
            conditions: vec![condition("Accepted", accepted), condition("Live", live)],
            observed_generation: Some(generation),
            live: Some(self.registry.current().label()),
        };
        // Compared without the timestamps, which differ on every call.
        let key = |s: &SchedulingPolicyStatus| {
            let conditions: Vec<_> = s
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone()))
                .collect();
            (conditions, s.observed_generation, s.live.clone())
        };
        if self.written.as_ref().is_some_and(|w| key(w) == key(&wanted)) {
            return;
        }
        let patch = Patch::Merge(json!({ "status": wanted }));
        let what = format!("status of SchedulingPolicy {}", self.name);
        match self.call(&what, self.policies.patch_status(&self.name, &PatchParams::default(), &patch)) {
            Ok(_) => self.written = Some(wanted),
            Err(e) => tracing::warn!(error = %e, "writing the policy object's status"),
        }
    }
}

impl Source for PolicyObjectSource {
    fn describe(&self) -> String {
        format!("kubernetes:schedulingpolicies/{}", self.name)
    }

    fn poll(&mut self) -> Result<Option<Fetched>, SourceError> {
        self.report();
        let what = format!("SchedulingPolicy {}", self.name);
        let object = self.call(&what, self.policies.get_opt(&self.name))?;
        let Some(object) = object else {
            (self.last, self.delivered, self.written) = (None, None, None);
            return Err(SourceError::Fetch { what, message: "not found".into() });
        };
        let generation = object.metadata.generation.unwrap_or_default();
        let fetched = match self.fetch(&object) {
            Ok(f) => f,
            Err(e) => {
                // An invalid object is refused where its author looks; the live version runs on.
                let reason = if matches!(e, SourceError::Spec(_)) { "InvalidPolicySet" } else { "FetchFailed" };
                // Whatever comes next is judged afresh, even the content offered last.
                (self.last, self.delivered) = (None, None);
                self.write_status(generation, ("False", reason), ("False", reason), &e.to_string());
                return Err(e);
            }
        };
        if self.last.as_deref() == Some(fetched.fingerprint.as_str()) {
            return Ok(None);
        }
        self.last = Some(fetched.fingerprint.clone());
        self.delivered = Some((fetched.origin.clone(), generation));
        self.written = None;
        Ok(Some(fetched))
    }
}
