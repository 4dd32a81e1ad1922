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

impl Outcome {
    /// Every outcome, in the order of [`Outcome::index`].
    pub const ALL: [Outcome; 8] = [
        Outcome::Probation,
        Outcome::Live,
        Outcome::Shadow,
        Outcome::Ready,
        Outcome::Superseded,
        Outcome::RolledBack,
        Outcome::Rejected,
        Outcome::Staged,
    ];

    fn index(&self) -> usize {
        Outcome::ALL.iter().position(|o| o == self).unwrap_or(0)
    }

    /// The name `policy status` shows (kebab-case), also the metrics' `outcome` label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Probation => "probation",
            Outcome::Live => "live",
            Outcome::Shadow => "shadow",
            Outcome::Ready => "ready",
            Outcome::Superseded => "superseded",
            Outcome::RolledBack => "rolled-back",
            Outcome::Rejected => "rejected",
            Outcome::Staged => "staged",
        }
    }
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
    inner.outcomes[outcome.index()] += 1;
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
            if h.outcome != outcome {
                inner.outcomes[outcome.index()] += 1;
            }
            h.outcome = outcome;
            h.reason = reason.into();
            h.at = now();
        }
        None => push_history(inner, v, outcome, reason),
    }
}
