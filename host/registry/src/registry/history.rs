//! What happened to each version, most recent last.

use super::*;

/// What happened to a version.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Live now, watched until its probation ends.
    Probation,
    /// Live now, past probation (or the first version).
    Live,
    /// Prepared, running beside the live version.
    Shadow,
    /// Passed its shadow run; waits for `policy promote`.
    Ready,
    /// Was live, then replaced by a newer version.
    Superseded,
    /// Was live and tripped a threshold (or was rolled back by hand).
    RolledBack,
    /// Failed a gate; never went live.
    Rejected,
    /// Prepared and due to go live, its mirrors catching up first (registries with warm-up).
    Staged,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// `name@version`.
    pub label: String,
    /// Where it came from.
    pub origin: String,
    /// What became of it.
    pub outcome: Outcome,
    /// Why (rejections and rollbacks), or how it went live.
    pub reason: String,
    /// Seconds since the Unix epoch of the last change.
    pub at: f64,
}

pub(super) fn push_history(inner: &mut Inner, v: &PolicyVersion, outcome: Outcome, reason: &str) {
    if inner.history.len() == HISTORY {
        inner.history.pop_back();
    }
    inner.history.push_front(HistoryEntry {
        label: v.label(),
        origin: v.origin.clone(),
        outcome,
        reason: reason.into(),
        at: now(),
    });
}

/// Update the most recent entry of `v` (or add one).
pub(super) fn update_history(inner: &mut Inner, v: &PolicyVersion, outcome: Outcome, reason: &str) {
    let label = v.label();
    match inner.history.iter_mut().find(|h| h.label == label) {
        Some(h) => {
            h.outcome = outcome;
            h.reason = reason.into();
            h.at = now();
        }
        None => push_history(inner, v, outcome, reason),
    }
}
