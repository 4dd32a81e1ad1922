//! The policy set `wasmsched run` starts with when no `--policy` directory is given, and the
//! registry built from it.

use std::sync::Arc;

use wasmsched_events::EventSink;
use wasmsched_registry::{Fetched, PolicySetSpec, PrepareError, Preparer, Registry, Sample};

/// The default policy set: the file the Helm chart ships in its ConfigMap, so the two never differ.
pub const DEFAULT_POLICY: &str = include_str!("../../../charts/wasmsched/files/policy.yaml");

/// The default policy set as a fetched version.
pub fn default_policy() -> Fetched {
    Fetched {
        spec: PolicySetSpec::parse("builtin default policy", DEFAULT_POLICY).expect("the embedded policy is valid"),
        origin: "builtin:default".into(),
        artifacts: Default::default(),
        fingerprint: "builtin:default".into(),
    }
}

/// A registry whose first live version is `initial`, prepared (compiled and smoke-tested) now.
pub fn registry(
    preparer: &Preparer,
    initial: &Fetched,
    events: Option<EventSink>,
) -> Result<Arc<Registry>, PrepareError> {
    let version = preparer.prepare(initial, 1, &Sample::synthetic())?;
    Ok(Arc::new(Registry::new(version, events)))
}
