//! "Why is my job pending?": the reasons of the last attempt, per stage, with node rejections
//! aggregated by reason (one line per class of nodes, not per node).

use std::fmt;

use crate::placement::Diagnosis;

/// Why a workload is not running, as of its last attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explanation {
    /// Queue-level reason (capability reached, queue not served this cycle), if any.
    pub queue: Option<String>,
    /// `(placed, min_member)` of the best gang attempt, for groups.
    pub gang: Option<(usize, usize)>,
    /// Node rejections by plugin and reason, and plugin faults.
    pub nodes: Option<Diagnosis>,
    /// What preemption found (or why it was not tried).
    pub preemption: Option<String>,
    /// Where required pod (anti-)affinity lets it go, or why nowhere.
    pub pod_affinity: Option<String>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Earliest time of the next attempt (back-off), if it is waiting for one.
    pub retry_at: Option<u64>,
}

impl Explanation {
    /// Why the workload waits, as one of a few words (the metrics' `reason` label: the full
    /// explanation is per workload and unbounded): `queue` (its queue's quota or turn), `affinity`
    /// (required pod affinity), `gang` (too few members fit), `no_fit` (no node has room), or
    /// `not_tried`.
    pub fn category(&self) -> &'static str {
        match self {
            Explanation { queue: Some(_), .. } => "queue",
            Explanation { pod_affinity: Some(_), .. } => "affinity",
            Explanation { gang: Some(_), .. } => "gang",
            Explanation { nodes: Some(_), .. } => "no_fit",
            _ if self.attempts > 0 => "no_fit",
            _ => "not_tried",
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(q) = &self.queue {
            parts.push(q.clone());
        }
        if let Some((placed, min)) = self.gang {
            parts.push(format!("gang: {placed} of {min} required members fit"));
        }
        if let Some(d) = &self.nodes {
            parts.push(d.to_string());
        }
        if let Some(a) = &self.pod_affinity {
            parts.push(a.clone());
        }
        if let Some(p) = &self.preemption {
            parts.push(format!("preemption: {p}"));
        }
        if parts.is_empty() {
            parts.push("not attempted yet".into());
        }
        write!(f, "{}", parts.join("; "))?;
        if self.attempts > 0 {
            write!(f, " (attempt {}", self.attempts)?;
            if let Some(t) = self.retry_at {
                write!(f, ", retried after a cluster change, not before t={t}s")?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}
