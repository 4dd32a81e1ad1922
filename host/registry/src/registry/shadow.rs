//! A candidate run in the shadow of the live version: the same decisions placed both ways and
//! compared, with a verdict before it may go live.

use super::*;

pub(super) struct ShadowRun {
    pub(super) candidate: Arc<PolicyVersion>,
    pub(super) spec: ShadowSpec,
    pub(super) started: Instant,
    pub(super) offered: u64,
    pub(super) compared: u64,
    pub(super) identical: u64,
    pub(super) faults: u64,
    pub(super) both_placed: u64,
    pub(super) score_delta_sum: f64,
    pub(super) examples: Vec<DecisionDiff>,
    /// The last differing decisions, whatever was reported: what a person looks at.
    pub(super) recent: std::collections::VecDeque<DecisionDiff>,
    pub(super) reported: u64,
}

impl ShadowRun {
    pub(super) fn stats(&self) -> ShadowStats {
        ShadowStats {
            compared: self.compared,
            identical_share: if self.compared == 0 { 1.0 } else { self.identical as f64 / self.compared as f64 },
            fault_rate: if self.compared == 0 { 0.0 } else { self.faults as f64 / self.compared as f64 },
            mean_score_delta: if self.both_placed == 0 { 0.0 } else { self.score_delta_sum / self.both_placed as f64 },
            seconds: self.started.elapsed().as_secs_f64(),
            recent_differences: self.recent.iter().rev().cloned().collect(),
        }
    }

    pub(super) fn done(&self) -> bool {
        self.compared >= self.spec.decisions
            || (self.compared > 0 && self.started.elapsed().as_secs_f64() >= self.spec.seconds)
    }

    pub(super) fn verdict(&self) -> Result<(), String> {
        let s = self.stats();
        if s.identical_share < self.spec.min_identical {
            return Err(format!(
                "{:.1}% identical placements < min_identical {:.1}% over {} decisions",
                s.identical_share * 100.0,
                self.spec.min_identical * 100.0,
                s.compared
            ));
        }
        if s.fault_rate > self.spec.max_fault_rate {
            return Err(format!(
                "fault rate {:.2}% > max_fault_rate {:.2}% over {} decisions",
                s.fault_rate * 100.0,
                self.spec.max_fault_rate * 100.0,
                s.compared
            ));
        }
        Ok(())
    }
}

/// A shadow run's comparison so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShadowStats {
    /// Decisions compared.
    pub compared: u64,
    /// Share placed on the same node (both unschedulable counts as identical).
    pub identical_share: f64,
    /// Share on which a shadow plugin faulted.
    pub fault_rate: f64,
    /// Mean absolute difference of the two sets' normalised scores (0..=100), over decisions both
    /// placed.
    pub mean_score_delta: f64,
    /// Seconds since the run began.
    pub seconds: f64,
    /// The last differing decisions, newest first (at most 20): the task, the node each set chose
    /// (none: unschedulable) and each one's score of it.
    pub recent_differences: Vec<DecisionDiff>,
}

impl Registry {
    pub(super) fn compare(
        &self,
        inner: &mut Inner,
        used: &Arc<PolicyVersion>,
        candidate: &Arc<PolicyVersion>,
        d: &Decision<'_>,
        shadow: &Result<Placement, Unschedulable>,
    ) {
        let Some(run) = &mut inner.shadow else { return };
        if run.candidate.version != candidate.version {
            return; // replaced while this decision was compared
        }
        run.compared += 1;
        let faulted = match shadow {
            Ok(p) => !p.skipped_faults.is_empty(),
            Err(u) => !u.diagnosis.faults.is_empty(),
        };
        run.faults += u64::from(faulted);
        let node = |r: &Result<Placement, Unschedulable>| r.as_ref().ok().map(|p| p.node);
        let (live_node, shadow_node) = (node(d.result), node(shadow));
        let live_score = d.result.as_ref().ok().map(|p| normalised(p.score, used));
        let shadow_score = shadow.as_ref().ok().map(|p| normalised(p.score, candidate));
        if let (Some(a), Some(b)) = (live_score, shadow_score) {
            run.both_placed += 1;
            run.score_delta_sum += (f64::from(a) - f64::from(b)).abs();
        }
        if live_node == shadow_node {
            run.identical += 1;
        } else {
            let name = |s: Option<u32>| s.and_then(|s| d.nodes.get(s)).map(|n| n.name.clone());
            let diff = DecisionDiff {
                task: task_ref(d.task),
                live: name(live_node),
                shadow: name(shadow_node),
                live_score,
                shadow_score,
            };
            if run.recent.len() == SHADOW_RECENT {
                run.recent.pop_front();
            }
            run.recent.push_back(diff.clone());
            if run.examples.len() < SHADOW_EXAMPLES {
                run.examples.push(diff);
            }
        }
        let done = run.done();
        if done || run.compared - run.reported >= SHADOW_REPORT_EVERY {
            let report = PolicyShadowDiff {
                live: used.reference(),
                shadow: candidate.reference(),
                decisions: run.compared - run.reported,
                differing: run.compared - run.identical,
                mean_score_delta_milli: (run.stats().mean_score_delta * 1e3) as u64,
                shadow_faults: run.faults,
                examples: std::mem::take(&mut run.examples),
            };
            run.reported = run.compared;
            self.emit(Payload::PolicyShadowDiff(report));
        }
        if done {
            let run = inner.shadow.take().expect("a shadow run");
            match run.verdict() {
                Ok(()) if run.spec.auto_promote => self.swap_in(inner, run.candidate, "passed its shadow run"),
                Ok(()) => {
                    update_history(inner, &run.candidate, Outcome::Ready, "passed its shadow run; waits for promote");
                    inner.ready = Some(run.candidate);
                }
                Err(reason) => {
                    self.reject(inner, &run.candidate.label(), &run.candidate.origin, PrepareError::Shadow(reason))
                }
            }
        }
    }
}
