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
/// `warm_up` > 0 stages each new version until its plugins' mirrors caught up, at most that many
/// changes per plugin instance before each cycle ([`Registry::with_warm_up`]); 0 swaps at once.
pub fn registry(
    preparer: &Preparer,
    initial: &Fetched,
    events: Option<EventSink>,
    warm_up: usize,
) -> Result<Arc<Registry>, PrepareError> {
    let version = preparer.prepare(initial, 1, &Sample::synthetic())?;
    let registry = Registry::new(version, events);
    Ok(Arc::new(if warm_up > 0 { registry.with_warm_up(warm_up) } else { registry }))
}
