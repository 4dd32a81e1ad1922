//! Following the decisions in the process that makes them.

use crate::{Payload, Timestamp};

/// Follows the scheduler's decisions as they are published, in the same process: the usage meter
/// behind `/metrics`, a test. The scheduler calls it on its scheduling task, so it must be quick
/// (the meter takes a lock and updates a map). It sees every decision, whether or not an event
/// sink is configured.
pub trait Observer: Send + Sync {
    /// `payload` was published, stamped `at`.
    fn observe(&self, at: Timestamp, payload: &Payload);

    /// A run another process placed (before a restart, or a leader that failed over) is this
    /// process's to follow from `now`: `placed` is its `task-scheduled`, `started` its start.
    fn taken_over(&self, _now: Timestamp, _started: Timestamp, _placed: &Payload) {}

    /// The runs going on are no longer this process's to follow (it stopped leading).
    fn handed_over(&self) {}
}
