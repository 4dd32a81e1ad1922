//! Where a sampled placement takes its nodes from, in kube-scheduler's scan order (the candidates
//! from a start position, wrapping), cut into the windows each filter call sees.
//!
//! [`EveryNode`] walks every candidate, the host's kind check run on each. [`KindNodes`] walks
//! only the nodes with a device of the task's kind (the table's per-kind slot lists) and counts
//! the others it passes over as rejected by the kind check, without reading them: on a cluster of
//! two vendors most nodes are the other vendor's. Both give the same nodes, scan positions and
//! rejection counts for the same start (checked in `tests.rs`).

use super::Run;
use super::filter::KindCheck;
use crate::node_table::{NodeTable, Slot};
use wasmsched_api::accelerators::KindName;

/// A sampled scan's source of nodes.
pub(super) trait Cursor {
    /// Appends up to `window` nodes the host's kind check admits, in scan order; the nodes it
    /// rejects on the way are counted in `run`'s diagnosis.
    fn fill(&mut self, chunk: &mut Vec<Slot>, window: usize, run: &mut Run);
    /// Nodes scanned so far, admitted or not.
    fn scanned(&self) -> usize;
    /// Nodes scanned up to and including `slot`, one the last fill gave.
    fn scanned_through(&self, slot: Slot) -> usize;
    /// Nodes in the whole scan.
    fn len(&self) -> usize;
}

/// Every candidate from the start, each through the kind check when there is one.
pub(super) struct EveryNode<'a> {
    candidates: &'a [Slot],
    from: usize,
    scanned: usize,
    kinds: Option<KindCheck<'a>>,
    /// Nodes scanned before the last fill.
    before_fill: usize,
}

impl<'a> EveryNode<'a> {
    pub(super) fn new(candidates: &'a [Slot], start: usize, kinds: Option<KindCheck<'a>>) -> Self {
        EveryNode { candidates, from: start % candidates.len().max(1), scanned: 0, kinds, before_fill: 0 }
    }
}

/// Position `offset` after `from` in a list of `n`, wrapping without a division per slot.
fn wrapped(from: usize, offset: usize, n: usize) -> usize {
    let at = from + offset;
    if at >= n { at - n } else { at }
}

impl Cursor for EveryNode<'_> {
    fn fill(&mut self, chunk: &mut Vec<Slot>, window: usize, run: &mut Run) {
        let n = self.candidates.len();
        self.before_fill = self.scanned;
        while chunk.len() < window && self.scanned < n {
            let slot = self.candidates[wrapped(self.from, self.scanned, n)];
            self.scanned += 1;
            if self.kinds.as_mut().is_none_or(|k| k.admits(slot)) {
                chunk.push(slot);
            }
        }
        if let Some(k) = self.kinds.as_mut() {
            k.record(run);
        }
    }

    fn scanned(&self) -> usize {
        self.scanned
    }

    fn scanned_through(&self, slot: Slot) -> usize {
        let n = self.candidates.len();
        let i = (self.before_fill..self.scanned)
            .position(|k| self.candidates[wrapped(self.from, k, n)] == slot)
            .expect("a slot of the last fill");
        self.before_fill + i + 1
    }

    fn len(&self) -> usize {
        self.candidates.len()
    }
}

/// The occupied nodes with a device of the task's kind, from the scan position of `start` in
/// every occupied node; the nodes between them are of other kinds and count as the kind check's
/// rejections. Scan positions come from the occupied slots' order (both lists ascend).
pub(super) struct KindNodes<'a> {
    occupied: &'a [Slot],
    /// `occupied`'s position the scan starts at.
    from: usize,
    of_kind: &'a [Slot],
    /// `of_kind`'s position of the first node at or after `from`.
    first: usize,
    visited: usize,
    scanned: usize,
    check: KindCheck<'a>,
}

impl<'a> KindNodes<'a> {
    pub(super) fn new(nodes: &'a NodeTable, kind: KindName, start: usize, check: KindCheck<'a>) -> Self {
        let occupied = nodes.occupied();
        let of_kind = nodes.slots_of_kind(kind);
        let from = start % occupied.len().max(1);
        let first = occupied.get(from).map_or(0, |&s| of_kind.partition_point(|&k| k < s));
        KindNodes { occupied, from, of_kind, first, visited: 0, scanned: 0, check }
    }

    /// Scan position of `slot` (an occupied slot), plus one.
    fn end_of(&self, slot: Slot) -> usize {
        let n = self.occupied.len();
        let at = self.occupied.partition_point(|&s| s < slot);
        (at + n - self.from) % n + 1
    }
}

impl Cursor for KindNodes<'_> {
    fn fill(&mut self, chunk: &mut Vec<Slot>, window: usize, run: &mut Run) {
        let (k, before, visited_before) = (self.of_kind.len(), self.scanned, self.visited);
        let mut last = None;
        while chunk.len() < window && self.visited < k {
            let slot = self.of_kind[wrapped(self.first, self.visited, k)];
            self.visited += 1;
            last = Some(slot);
            if self.check.admits(slot) {
                chunk.push(slot);
            }
        }
        // Done with the kind's nodes: the rest of the scan is other kinds'.
        self.scanned = match last {
            Some(slot) if self.visited < k => self.end_of(slot),
            _ => self.occupied.len(),
        };
        self.check.add_too_few(self.scanned - before - (self.visited - visited_before));
        self.check.record(run);
    }

    fn scanned(&self) -> usize {
        self.scanned
    }

    fn scanned_through(&self, slot: Slot) -> usize {
        self.end_of(slot)
    }

    fn len(&self) -> usize {
        self.occupied.len()
    }
}
