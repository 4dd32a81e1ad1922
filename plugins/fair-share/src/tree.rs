//! The queue tree, validated: parents in range, no cycles, positive weights.

use wasmsched_sdk::prelude::*;

/// Children lists of a validated queue forest.
pub(crate) struct Tree {
    /// Queues without a parent, in input order.
    pub roots: Vec<usize>,
    /// Children of each queue, in input order.
    pub children: Vec<Vec<usize>>,
}

impl Tree {
    /// Validate `queues` and index their children. Errors name the offending queue.
    pub fn new(queues: &[QueueState]) -> Result<Self, String> {
        let n = queues.len();
        let mut children = vec![Vec::new(); n];
        let mut roots = Vec::new();
        for (i, q) in queues.iter().enumerate() {
            if q.weight == 0 {
                return Err(format!("queue {}: weight must be positive", q.name));
            }
            match q.parent {
                None => roots.push(i),
                Some(p) if (p as usize) < n && p as usize != i => children[p as usize].push(i),
                Some(p) => return Err(format!("queue {}: parent index {p} is not another queue", q.name)),
            }
        }
        // Every queue must reach a root within n steps, or its ancestry has a cycle.
        for (i, q) in queues.iter().enumerate() {
            let mut at = i;
            for _ in 0..=n {
                match queues[at].parent {
                    Some(p) => at = p as usize,
                    None => break,
                }
            }
            if queues[at].parent.is_some() {
                return Err(format!("queue {}: its ancestry has a cycle", q.name));
            }
        }
        Ok(Tree { roots, children })
    }

    /// Leaves of the subtree at `q`, depth first in input order.
    pub fn leaves(&self, q: usize, out: &mut Vec<usize>) {
        if self.children[q].is_empty() {
            out.push(q);
        }
        for &c in &self.children[q] {
            self.leaves(c, out);
        }
    }
}
