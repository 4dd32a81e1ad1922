//! Batch entry points shared by the guest SDK and the host's native runner, so that a policy run
//! natively and the same policy run as a component answer through identical code.

use std::borrow::Cow;

use crate::model::{Node, Rejection, Task};
use crate::stages::{Filter, Score, Verdict};

/// Filter verdicts for a batch of nodes, compactly: `codes[i]` = 0 means node `i` fits, `k > 0`
/// means it does not for `reasons[k - 1]`. Mirrors `wasmsched:policy/filter.filter-result`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterBatch {
    /// One code per node.
    pub codes: Vec<u16>,
    /// Distinct rejections.
    pub reasons: Vec<Rejection>,
}

/// The most distinct reasons one batch carries; further distinct reasons share the last entry, so
/// a plugin that formats a unique string per node cannot blow up the result.
pub const MAX_BATCH_REASONS: usize = 256;

const OVERFLOW_REASON: &str = "rejected (too many distinct reasons in one batch)";

impl FilterBatch {
    /// Append one verdict.
    pub fn push(&mut self, verdict: Verdict) {
        let (reason, unresolvable) = match verdict {
            Verdict::Fit => {
                self.codes.push(0);
                return;
            }
            Verdict::Unfit(reason) => (reason, false),
            Verdict::Unresolvable(reason) => (reason, true),
        };
        let same = |r: &Rejection| r.unresolvable == unresolvable && r.reason == *reason;
        // Neighbouring nodes are usually rejected for the same reason: try the last one first.
        let last = self.codes.iter().rev().find(|&&c| c != 0).map(|&c| usize::from(c) - 1);
        let found = match last {
            Some(at) if same(&self.reasons[at]) => Some(at),
            _ => self.reasons.iter().position(same),
        };
        let at = match found {
            Some(at) => at,
            None if self.reasons.len() < MAX_BATCH_REASONS - 1 => {
                self.reasons.push(Rejection { reason: reason.into_owned(), unresolvable });
                self.reasons.len() - 1
            }
            None => {
                if self.reasons.len() < MAX_BATCH_REASONS {
                    self.reasons.push(Rejection { reason: OVERFLOW_REASON.into(), unresolvable: false });
                }
                MAX_BATCH_REASONS - 1
            }
        };
        // `at` < MAX_BATCH_REASONS (256), so it always fits a u16.
        self.codes.push(at as u16 + 1);
    }
}

/// Run `filter` over `nodes` in order. Generic, so that a caller holding the concrete plugin type
/// (the SDK's component glue) can have the plugin's `filter` inlined; `dyn Filter` works too.
pub fn filter_batch<'a, F: Filter + ?Sized>(
    filter: &mut F,
    task: &Task,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> FilterBatch {
    filter_batch_until(filter, task, nodes, usize::MAX)
}

/// [`filter_batch`], stopping once `enough` nodes fit: the codes then cover the nodes up to that
/// one. A sampling scheduler needs the first `enough` feasible nodes in scan order; it can hand
/// a generous window and pay for no node past the last one it needs.
#[inline]
pub fn filter_batch_until<'a, F: Filter + ?Sized>(
    filter: &mut F,
    task: &Task,
    nodes: impl IntoIterator<Item = &'a Node>,
    enough: usize,
) -> FilterBatch {
    let nodes = nodes.into_iter();
    let mut left = enough;
    if left == 0 {
        return FilterBatch::default();
    }
    let mut batch = FilterBatch { codes: Vec::with_capacity(nodes.size_hint().0), reasons: Vec::new() };
    // The last fixed reason and its code: most rejections are a `&'static str` repeated node after
    // node, recognised by address without comparing text (a byte loop in Wasm, ~4 % of a filter).
    let mut last_static: Option<(*const u8, usize, bool, u16)> = None;
    for node in nodes {
        let verdict = filter.filter(task, node);
        let key = match &verdict {
            Verdict::Fit => {
                batch.codes.push(0);
                left -= 1;
                if left == 0 {
                    break;
                }
                continue;
            }
            Verdict::Unfit(Cow::Borrowed(r)) => Some((r.as_ptr(), r.len(), false)),
            Verdict::Unresolvable(Cow::Borrowed(r)) => Some((r.as_ptr(), r.len(), true)),
            _ => None,
        };
        match (key, last_static) {
            (Some((p, l, u)), Some((lp, ll, lu, code))) if (p, l, u) == (lp, ll, lu) => batch.codes.push(code),
            _ => {
                batch.push(verdict);
                if let Some((p, l, u)) = key {
                    last_static = batch.codes.last().map(|&code| (p, l, u, code));
                }
            }
        }
    }
    batch
}

/// Run `score` over `nodes` in order, then the plugin's normalisation over the batch (generic like
/// [`filter_batch`]).
pub fn score_batch<'a, S: Score + ?Sized>(
    score: &mut S,
    task: &Task,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Vec<u32> {
    let mut scores: Vec<u32> = nodes.into_iter().map(|n| score.score(task, n)).collect();
    score.normalize(task, &mut scores);
    scores
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_interned_and_capped() {
        let mut b = FilterBatch::default();
        b.push(Verdict::Fit);
        b.push(Verdict::unfit("cpu"));
        b.push(Verdict::unfit("cpu"));
        b.push(Verdict::unresolvable("cpu"));
        assert_eq!(b.codes, vec![0, 1, 1, 2]);
        assert_eq!(b.reasons.len(), 2);
        for i in 0..1000 {
            b.push(Verdict::unfit(format!("unique {i}")));
        }
        assert_eq!(b.reasons.len(), MAX_BATCH_REASONS);
        assert_eq!(*b.codes.last().unwrap() as usize, MAX_BATCH_REASONS);
        assert_eq!(b.reasons.last().unwrap().reason, OVERFLOW_REASON);
    }

    /// Answers from a script, one verdict per node, whatever the node.
    struct Scripted(std::vec::IntoIter<Verdict>);

    impl Filter for Scripted {
        fn filter(&mut self, _: &Task, _: &Node) -> Verdict {
            self.0.next().unwrap()
        }
    }

    #[test]
    fn a_batch_matches_verdicts_pushed_one_by_one_whatever_mix_of_fixed_and_formatted_reasons() {
        // Fixed and formatted texts that are equal, the same text unfit and unresolvable, and more
        // distinct reasons than a batch carries: the shortcut for repeated fixed reasons must give
        // exactly the codes and reasons of plain pushes.
        let mut script = Vec::new();
        for i in 0..3_000usize {
            script.push(match i % 7 {
                0 => Verdict::Fit,
                1 | 2 => Verdict::unfit("insufficient cpu"),
                3 => Verdict::unfit(String::from("insufficient cpu")),
                4 => Verdict::unresolvable("insufficient cpu"),
                5 => Verdict::unfit(format!("unique {}", i / 3)),
                _ => Verdict::unresolvable("node is cordoned"),
            });
        }
        let mut by_one = FilterBatch::default();
        for v in script.iter().cloned() {
            by_one.push(v);
        }
        let nodes = vec![Node::default(); script.len()];
        let batch = filter_batch(&mut Scripted(script.into_iter()), &Task::default(), &nodes);
        assert_eq!(batch, by_one);
        assert_eq!(batch.reasons.len(), MAX_BATCH_REASONS);
    }

    /// Fits nodes with at least the task's CPU free; scores by free CPU.
    struct Cpu;

    impl Filter for Cpu {
        fn filter(&mut self, task: &Task, node: &Node) -> Verdict {
            if node.free_cpu_milli() >= task.request.cpu_milli { Verdict::Fit } else { Verdict::unfit("cpu") }
        }
    }

    impl Score for Cpu {
        fn score(&mut self, _: &Task, node: &Node) -> u32 {
            (node.free_cpu_milli() / 1000).min(100) as u32
        }
    }

    crate::declare_stages!(Cpu: filter, score);

    struct OnlyFilter;

    impl Filter for OnlyFilter {
        fn filter(&mut self, _: &Task, _: &Node) -> Verdict {
            Verdict::Fit
        }
    }

    crate::declare_stages!(OnlyFilter: filter);

    #[test]
    fn declared_stages_batch_statically_with_the_same_answers_as_through_trait_objects() {
        use crate::Stages;
        let nodes: Vec<Node> = [500, 4000, 0]
            .iter()
            .map(|&cpu| Node {
                allocatable: crate::Resources { cpu_milli: cpu, ..Default::default() },
                ..Default::default()
            })
            .collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let task = Task { request: crate::Resources { cpu_milli: 1000, ..Default::default() }, ..Default::default() };
        let mut p = Cpu;
        let direct = p.filter_nodes(&task, &refs, usize::MAX).expect("declared filter");
        assert_eq!(direct, filter_batch(p.as_filter().unwrap(), &task, refs.iter().copied()));
        assert_eq!(direct.codes, vec![1, 0, 1]);
        let scores = p.score_nodes(&task, &refs).expect("declared score");
        assert_eq!(scores, score_batch(p.as_score().unwrap(), &task, refs.iter().copied()));
        assert_eq!(scores, vec![0, 4, 0]);
        // A stage not declared has no static batch either.
        assert!(OnlyFilter.score_nodes(&task, &refs).is_none());
        assert_eq!(OnlyFilter.filter_nodes(&task, &refs, usize::MAX).unwrap().codes, vec![0, 0, 0]);
        assert_eq!(OnlyFilter.filter_nodes(&task, &refs, 2).unwrap().codes, vec![0, 0], "stops at the 2nd fit");
    }

    #[test]
    fn a_batch_until_enough_fit_is_the_full_batch_cut_after_that_fit() {
        let script: Vec<Verdict> = (0..200usize)
            .map(|i| match i % 5 {
                0 | 3 => Verdict::Fit,
                1 => Verdict::unfit("insufficient cpu"),
                2 => Verdict::unfit(format!("unique {i}")),
                _ => Verdict::unresolvable("node is cordoned"),
            })
            .collect();
        let nodes = vec![Node::default(); script.len()];
        let full = filter_batch(&mut Scripted(script.clone().into_iter()), &Task::default(), &nodes);
        let fits = full.codes.iter().filter(|&&c| c == 0).count();
        for enough in [1, 2, 7, fits - 1, fits, fits + 1, usize::MAX] {
            let cut = filter_batch_until(&mut Scripted(script.clone().into_iter()), &Task::default(), &nodes, enough);
            // The full batch up to (and with) its `enough`-th fit; all of it when fewer fit.
            let end = full.codes.iter().enumerate().filter(|(_, c)| **c == 0).nth(enough - 1).map(|(i, _)| i + 1);
            let end = end.unwrap_or(full.codes.len());
            assert_eq!(cut.codes, full.codes[..end], "enough {enough}");
            assert_eq!(cut.reasons, full.reasons[..cut.reasons.len()], "enough {enough}");
        }
        let none = filter_batch_until(&mut Scripted(script.into_iter()), &Task::default(), &nodes, 0);
        assert!(none.codes.is_empty());
    }
}
