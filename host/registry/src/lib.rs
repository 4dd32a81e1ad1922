//! Versioned policy sets, changed safely while the scheduler runs.
//!
//! A policy change flows through this crate as: **source** (a watched directory or NATS object
//! store bucket) → **fetch** (spec and artifacts) → **prepare** (verify digests, compile or load
//! the cached artifact, instantiate every worker's instance, smoke-test on a sample of the live
//! cluster) → optional **shadow run** beside the live version (decision diffs published) →
//! **atomic swap** between cycles → **probation** (fault rate, latency and unschedulable rate
//! against thresholds) → automatic **rollback** to the last good version. Every step is an event.
//!
//! # Core concepts
//! - [`PolicySetSpec`]: what operators write (YAML), validated with errors that name the field.
//! - [`Source`]: where versions come from ([`DirSource`], [`ObjectStoreSource`]).
//! - [`Preparer`] and [`PolicyVersion`]: a prepared, immutable version.
//! - [`Registry`]: the live version ([`Registry::current`], taken once per cycle so no cycle mixes
//!   versions), the candidate, history; [`Registry::record`] feeds the watch and the shadow run.
//! - [`Watcher`]: the thread that polls sources and prepares versions off the hot path.
//! - [`control`]: `policy status / promote / rollback` over NATS request/reply.
//!
//! The file format and the lifecycle are documented in `docs/hot-reload.md`.

mod builtins;
pub mod control;
mod error;
mod exercise;
mod object_store;
mod prepare;
mod registry;
mod source;
mod spec;
mod watch;

pub use builtins::{BuiltIn, BuiltIns};
pub use error::{PrepareError, SourceError, SpecError};
pub use exercise::{StageRun, StageTry, exercise, exercise_stage};
pub use object_store::{MAX_OBJECT_BYTES, ObjectStoreSource, push};
pub use prepare::{PluginInfo, PolicyVersion, Preparer, Sample, build_set};
pub use registry::{ControlError, Decision, HistoryEntry, Outcome, Registry, ShadowStats, Status, WindowStats};
pub use source::{DirSource, Fetched, SPEC_FILE, Source, fingerprint};
pub use spec::{
    ArtifactRef, Failure, PluginSpec, PolicySetSpec, RollbackSpec, ShadowSpec, SmokeSpec, Stages, Weighted, digest_of,
};
pub use watch::{Watcher, poll_once};

/// Compile-time check that what threads share stays thread-safe.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Registry>();
    check::<PolicyVersion>();
}
