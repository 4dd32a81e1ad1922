//! Boundary tests of the `SchedulingPolicy` policy source against the fake API server (a mock at
//! the HTTP boundary, see `support/fake_api.rs`): a policy set applied as an object goes live
//! through the registry's gates with a component from a ConfigMap, and what the gates decide —
//! live, invalid, rejected, missing component — is written to the object's status while the live
//! version runs on.

use crate::support;

use std::sync::Arc;

use k8s_openapi::ByteString;
use serde_json::{Value, json};
use support::fake_api::{FakeApi, Kind};
use wasmsched_kube::policy::{self, DEFAULT_POLICY};
use wasmsched_kube::policy_source::PolicyObjectSource;
use wasmsched_registry::{Preparer, Registry, Source, digest_of, poll_once};
use wasmsched_runtime::{Runtime, RuntimeConfig};

const COMPONENT: &[u8] = wasmsched_plugins::MOST_ALLOCATED.wasm;

fn policy_object(generation: i64, policy_set: Value) -> Value {
    json!({
        "metadata": {"name": "gpu", "generation": generation},
        "spec": {
            "policySet": policy_set,
            "artifacts": {"pack.wasm": {"name": "policy-components", "key": "pack.wasm"}}
        }
    })
}

/// A set whose score plugin is the component in the ConfigMap, pinned by `digest`.
fn packing_set(digest: &str) -> Value {
    json!({
        "name": "packing",
        "plugins": {
            "fit": {"source": "builtin:resource-fit"},
            "pack": {"source": "file:pack.wasm", "digest": digest, "config": {"strategy": "most"}}
        },
        "stages": {"filter": ["fit"], "score": [{"plugin": "pack", "weight": 1}]}
    })
}

/// One poll on a blocking thread (the source drives the runtime through its handle), as the
/// registry's watcher does.
async fn poll(registry: &Arc<Registry>, preparer: &Preparer, source: PolicyObjectSource) -> PolicyObjectSource {
    let (registry, preparer) = (registry.clone(), preparer.clone());
    tokio::task::spawn_blocking(move || {
        let mut source = source;
        poll_once(&registry, &preparer, &mut source);
        source
    })
    .await
    .unwrap()
}

fn condition(api: &FakeApi, kind: &str) -> Value {
    let object = api.get(Kind::SchedulingPolicy, "gpu").expect("object");
    let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.into_iter().find(|c| c["type"] == kind).unwrap_or_else(|| panic!("no {kind} condition: {object}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_object_goes_live_through_the_gates_and_reports_what_they_decided() {
    assert!(DEFAULT_POLICY.contains("gpu-packing"), "the test starts from the default set");
    let api = FakeApi::new();
    let preparer =
        Preparer::new(Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()), wasmsched_plugins::table().collect());
    let registry = policy::registry(&preparer, &policy::default_policy(), None, 0).unwrap();
    let mut source = PolicyObjectSource::new(
        api.client("scheduler"),
        "gpu",
        "wasmsched-system",
        tokio::runtime::Handle::current(),
        registry.clone(),
    );
    assert_eq!(source.describe(), "kubernetes:schedulingpolicies/gpu");

    // No object yet: a fetch failure in the registry's status, the default set runs on.
    source = poll(&registry, &preparer, source).await;
    assert_eq!(registry.current().origin, "builtin:default");
    let errors = registry.status().source_errors;
    assert!(errors.iter().any(|(s, e)| s.contains("schedulingpolicies/gpu") && e.contains("not found")), "{errors:?}");

    // The object and its component: live after the smoke test, then reported Accepted and Live.
    let encoded = serde_json::to_value(ByteString(COMPONENT.to_vec())).unwrap(); // base64, as the API serves it
    api.put(
        Kind::ConfigMap,
        json!({"metadata": {"name": "policy-components", "namespace": "wasmsched-system"}, "binaryData": {"pack.wasm": encoded}}),
    );
    api.put(Kind::SchedulingPolicy, policy_object(1, packing_set(&digest_of(COMPONENT))));
    source = poll(&registry, &preparer, source).await;
    let live = registry.current();
    assert_eq!(live.origin, "kubernetes:schedulingpolicies/gpu@1");
    assert_eq!(live.spec.name, "packing");
    source = poll(&registry, &preparer, source).await;
    assert_eq!(condition(&api, "Accepted")["status"], "True");
    assert_eq!(condition(&api, "Live")["status"], "True");
    let object = api.get(Kind::SchedulingPolicy, "gpu").unwrap();
    assert_eq!(object["status"]["observedGeneration"], 1);
    assert_eq!(object["status"]["live"], json!(live.label()));

    // Nothing changed: no new version is offered and the status is not rewritten.
    let (versions, patches) = (registry.status().history.len(), api.state().status_patches.len());
    source = poll(&registry, &preparer, source).await;
    assert_eq!(registry.status().history.len(), versions);
    assert_eq!(api.state().status_patches.len(), patches);

    // An invalid set (a stage naming an undefined plugin passes the API server's rules, not ours).
    let mut invalid = packing_set(&digest_of(COMPONENT));
    invalid["stages"]["score"][0]["plugin"] = json!("missing");
    api.put(Kind::SchedulingPolicy, policy_object(2, invalid));
    source = poll(&registry, &preparer, source).await;
    let accepted = condition(&api, "Accepted");
    assert_eq!((accepted["status"].as_str(), accepted["reason"].as_str()), (Some("False"), Some("InvalidPolicySet")));
    assert!(accepted["message"].as_str().unwrap().contains("missing"), "{accepted}");
    assert_eq!(accepted["observedGeneration"], 2);
    assert_eq!(registry.current().origin, "kubernetes:schedulingpolicies/gpu@1", "the live version runs on");

    // A component that is not the pinned one: fetched, refused by the digest gate, reported.
    let other = "sha256:".to_string() + &"0".repeat(64);
    api.put(Kind::SchedulingPolicy, policy_object(3, packing_set(&other)));
    source = poll(&registry, &preparer, source).await;
    assert_eq!(registry.current().origin, "kubernetes:schedulingpolicies/gpu@1");
    source = poll(&registry, &preparer, source).await;
    let accepted = condition(&api, "Accepted");
    assert_eq!((accepted["status"].as_str(), accepted["reason"].as_str()), (Some("False"), Some("Rejected")));
    assert!(accepted["message"].as_str().unwrap().contains("digest mismatch"), "{accepted}");
    assert_eq!(condition(&api, "Live")["status"], "False");

    // A component the ConfigMap does not hold.
    let mut object = policy_object(4, packing_set(&digest_of(COMPONENT)));
    object["spec"]["artifacts"]["pack.wasm"]["key"] = json!("absent.wasm");
    api.put(Kind::SchedulingPolicy, object);
    source = poll(&registry, &preparer, source).await;
    let accepted = condition(&api, "Accepted");
    assert_eq!(accepted["reason"], "FetchFailed");
    assert!(accepted["message"].as_str().unwrap().contains("no binaryData key absent.wasm"), "{accepted}");

    // Fixed: the same content as generation 1 goes live again as a new version.
    api.put(Kind::SchedulingPolicy, policy_object(5, packing_set(&digest_of(COMPONENT))));
    source = poll(&registry, &preparer, source).await;
    assert_eq!(registry.current().origin, "kubernetes:schedulingpolicies/gpu@5");
    poll(&registry, &preparer, source).await;
    assert_eq!(condition(&api, "Live")["status"], "True");
    assert_eq!(condition(&api, "Live")["observedGeneration"], 5);
}
