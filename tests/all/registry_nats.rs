//! The object store source and the control endpoint against a real `nats-server` (started per test
//! on a free port).

use crate::nats_support as support;

use std::sync::Arc;
use std::time::Duration;

use support::NatsServer;
use wasmsched_registry::control::{self, Op};
use wasmsched_registry::{
    ObjectStoreSource, PolicySetSpec, Preparer, Registry, Sample, Source, digest_of, poll_once, push,
};
use wasmsched_runtime::{Runtime, RuntimeConfig};

const INITIAL: &str =
    "name: packing\nplugins:\n  fit: { source: \"builtin:resource-fit\" }\nstages:\n  filter: [fit]\n";

fn registry() -> (Arc<Registry>, Preparer) {
    let preparer =
        Preparer::new(Arc::new(Runtime::new(RuntimeConfig::default()).unwrap()), wasmsched_plugins::table().collect());
    let fetched = wasmsched_registry::Fetched {
        spec: PolicySetSpec::parse("initial", INITIAL).unwrap(),
        origin: "initial".into(),
        artifacts: Default::default(),
        fingerprint: String::new(),
    };
    let first = preparer.prepare(&fetched, 1, &Sample::synthetic()).unwrap();
    (Arc::new(Registry::new(first, None)), preparer)
}

fn spec_for(object: &str, digest: &str, extra: &str) -> String {
    format!(
        "name: spreading\nplugins:\n  fit: {{ source: \"builtin:resource-fit\" }}\n  spread: {{ source: \"object:{object}\", digest: \"{digest}\", config: {{ strategy: least }} }}\nstages:\n  filter: [fit]\n  score: [{{ plugin: spread }}]\n{extra}"
    )
}

#[test]
fn pushed_artifacts_go_live_from_the_bucket_and_a_vanished_bucket_changes_nothing() {
    let server = NatsServer::start(&[]);
    let nats = server.config();
    let (registry, preparer) = registry();
    let wasm = wasmsched_plugins::LEAST_ALLOCATED.wasm;

    // The spec arrives before its artifact: a fetch error, retried at the next poll.
    let mut source = ObjectStoreSource::new(nats.clone(), "policies", "policy.yaml").unwrap();
    push(&nats, "policies", "policy.yaml", spec_for("spread.wasm", &digest_of(wasm), "").as_bytes()).unwrap();
    poll_once(&registry, &preparer, &mut source);
    let errors = registry.status().source_errors;
    assert!(errors[0].1.contains("object spread.wasm in bucket policies"), "{errors:?}");
    assert_eq!(registry.current().version, 1);

    assert_eq!(push(&nats, "policies", "spread.wasm", wasm).unwrap(), wasm.len());
    poll_once(&registry, &preparer, &mut source);
    let live = registry.current();
    assert_eq!((live.spec.name.as_str(), live.origin.as_str()), ("spreading", "object:policies/policy.yaml"));
    assert!(registry.status().source_errors.is_empty());
    assert!(source.poll().unwrap().is_none(), "unchanged bucket, no new version");

    // A tampered artifact fails its digest; the live version stays.
    push(&nats, "policies", "spread.wasm", &wasm[..wasm.len() - 1]).unwrap();
    poll_once(&registry, &preparer, &mut source);
    assert_eq!(registry.current().version, live.version);
    assert!(registry.status().history[0].reason.contains("digest mismatch"));

    // The bucket disappears: a clear error, and scheduling state is untouched.
    wasmsched_events::nats_io::Bucket::new(nats.clone(), "policies").delete(Duration::from_secs(10)).unwrap();
    poll_once(&registry, &preparer, &mut source);
    let errors = registry.status().source_errors;
    assert!(errors[0].0 == "object:policies/policy.yaml" && errors[0].1.contains("policies"), "{errors:?}");
    assert_eq!(registry.current().version, live.version);

    // The server goes away too: still an error, not a hang (bounded by the request timeout).
    drop(server);
    let started = std::time::Instant::now();
    poll_once(&registry, &preparer, &mut source);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(registry.current().version, live.version);
}

/// A Python policy (an interpreter inside: ~19 MB, far past a ConfigMap's 1 MiB) goes live from
/// the bucket, and polling it every few seconds reads the spec, not the component, until the
/// component is pushed again.
#[test]
fn a_python_component_goes_live_from_the_bucket_and_is_read_once_per_push() {
    let server = NatsServer::start(&[]);
    let nats = server.config();
    let (registry, preparer) = registry();
    let app = wasmsched_tests::python::root().join("examples/plugins/gpu-model-affinity-py");
    let wasm = std::fs::read(wasmsched_tests::python::component(&app)).unwrap();
    assert!(wasm.len() > 10 << 20, "{} bytes", wasm.len());
    let spec = format!(
        "name: by-model\nplugins:\n  fit: {{ source: \"builtin:resource-fit\" }}\n  gma: {{ source: \"object:gma.wasm\", digest: \"{}\", config: \"A100\" }}\nstages:\n  filter: [fit]\n  score: [{{ plugin: gma }}]\n",
        digest_of(&wasm)
    );
    push(&nats, "policies", "gma.wasm", &wasm).unwrap();
    push(&nats, "policies", "policy.yaml", spec.as_bytes()).unwrap();
    let mut source = ObjectStoreSource::new(nats.clone(), "policies", "policy.yaml").unwrap();
    poll_once(&registry, &preparer, &mut source);
    let live = registry.current();
    assert_eq!((live.spec.name.as_str(), live.version), ("by-model", 2), "{:?}", registry.status().history);
    let first = source.read_bytes();
    assert_eq!(first, (wasm.len() + spec.len()) as u64);
    for _ in 0..3 {
        assert!(source.poll().unwrap().is_none());
    }
    assert_eq!(source.read_bytes(), first + 3 * spec.len() as u64, "only the spec is read again");
    // Pushed again (the same bytes): read once more, and no new version, its content is the same.
    push(&nats, "policies", "gma.wasm", &wasm).unwrap();
    assert!(source.poll().unwrap().is_none());
    assert_eq!(source.read_bytes(), first + 4 * spec.len() as u64 + wasm.len() as u64);
    assert_eq!(registry.current().version, 2);
}

#[test]
fn status_promote_and_rollback_over_nats() {
    let server = NatsServer::start(&[]);
    let nats = server.config();
    let (registry, preparer) = registry();
    let _control = control::ControlServer::start(&nats, registry.clone()).unwrap();
    let wait = Duration::from_secs(10);

    let status = control::request(&nats, Op::Status, wait).unwrap();
    assert!(status.ok);
    assert_eq!(status.result["live"], "packing@1");

    let refused = control::request(&nats, Op::Promote, wait).unwrap();
    assert_eq!((refused.ok, refused.error.as_deref()), (false, Some("no candidate to promote")));

    // A candidate waiting in shadow is promoted by hand, then rolled back by hand.
    let wasm = wasmsched_plugins::LEAST_ALLOCATED.wasm;
    let spec = spec_for("x", &digest_of(wasm), "shadow: { decisions: 1000, auto_promote: false }\n")
        .replace("object:x", "file:x");
    let fetched = wasmsched_registry::Fetched {
        spec: PolicySetSpec::parse("t", &spec).unwrap(),
        origin: "t".into(),
        artifacts: [("spread".to_string(), Arc::<[u8]>::from(wasm))].into(),
        fingerprint: String::new(),
    };
    let v = registry.offer(&fetched, &preparer).unwrap();
    let status = control::request(&nats, Op::Status, wait).unwrap();
    assert_eq!(status.result["candidate"], format!("spreading@{v}"));
    assert_eq!(status.result["history"][0]["outcome"], "shadow");

    let promoted = control::request(&nats, Op::Promote, wait).unwrap();
    assert_eq!((promoted.ok, promoted.result.as_str()), (true, Some(format!("spreading@{v}").as_str())));
    assert_eq!(registry.current().version, v);
    let rolled = control::request(&nats, Op::Rollback, wait).unwrap();
    assert_eq!((rolled.ok, rolled.result.as_str()), (true, Some("packing@1")));
    assert_eq!(registry.current().version, 1);

    drop(_control);
    let gone = control::request(&nats, Op::Status, Duration::from_millis(500)).unwrap_err().to_string();
    assert!(gone.contains("no scheduler answered") || gone.contains("no responders"), "{gone}");
}
