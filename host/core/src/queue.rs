//! The queue hierarchy, validated when built so that bad configuration is refused up front.

use ahash::AHashMap;
use wasmsched_api::{QueueState, Resources};

/// One queue as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueSpec {
    /// Unique name.
    pub name: String,
    /// Parent queue, `None` for a root.
    pub parent: Option<String>,
    /// Weight among siblings (positive).
    pub weight: u32,
    /// Always obtainable (and never reclaimed).
    pub guarantee: Resources,
    /// Upper bound of the allocation, `None` for unbounded.
    pub capability: Option<Resources>,
    /// Others may reclaim what it borrows.
    pub reclaimable: bool,
}

/// Why a queue configuration is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Two queues share a name.
    #[error("queue {0} already exists")]
    Duplicate(String),
    /// A parent is not defined (parents must be defined before their children).
    #[error("queue {queue}: parent queue {parent} not found")]
    UnknownParent {
        /// The queue.
        queue: String,
        /// The missing parent.
        parent: String,
    },
    /// A weight of 0 would starve the queue and divide by zero in shares.
    #[error("queue {0}: weight must be positive")]
    ZeroWeight(String),
    /// The guarantee exceeds the capability in some resource.
    #[error("queue {0}: guarantee exceeds capability")]
    GuaranteeAboveCapability(String),
    /// The children's guarantees together exceed the parent's guarantee or capability.
    #[error("queue {0}: children's guarantees exceed what the queue can hold")]
    ChildGuaranteesTooLarge(String),
    /// A queue name is empty.
    #[error("a queue has an empty name")]
    EmptyName,
}

/// A validated forest of queues. Parents always precede their children, so a cycle cannot be
/// expressed: a queue naming a later (or itself as) parent is an unknown parent.
#[derive(Clone, Debug, Default)]
pub struct QueueTree {
    queues: Vec<QueueSpec>,
    index: AHashMap<String, usize>,
    parent: Vec<Option<usize>>,
}

/// Whether `small` is within `big` in every resource.
pub(crate) fn fits(small: &Resources, big: &Resources) -> bool {
    small.cpu_milli <= big.cpu_milli
        && small.memory_bytes <= big.memory_bytes
        && small.gpu_milli <= big.gpu_milli
        // A bound limits the extended resources it names; the rest (a pod count) are unbounded.
        && small.extended.iter().all(|(n, v)| big.extended.iter().find(|(b, _)| b == n).is_none_or(|(_, b)| v <= b))
}

fn sum(list: &[&Resources]) -> Option<Resources> {
    list.iter().try_fold(Resources::default(), |total, r| total.checked_add(r))
}

impl QueueTree {
    /// Validate `specs` (parents first) into a tree.
    pub fn new(specs: impl IntoIterator<Item = QueueSpec>) -> Result<Self, QueueError> {
        let mut tree = QueueTree::default();
        for spec in specs {
            tree.add(spec)?;
        }
        tree.check_guarantees()?;
        Ok(tree)
    }

    fn add(&mut self, spec: QueueSpec) -> Result<(), QueueError> {
        if spec.name.is_empty() {
            return Err(QueueError::EmptyName);
        }
        if self.index.contains_key(&spec.name) {
            return Err(QueueError::Duplicate(spec.name));
        }
        if spec.weight == 0 {
            return Err(QueueError::ZeroWeight(spec.name));
        }
        if spec.capability.as_ref().is_some_and(|cap| !fits(&spec.guarantee, cap)) {
            return Err(QueueError::GuaranteeAboveCapability(spec.name));
        }
        let parent = match &spec.parent {
            None => None,
            Some(p) => Some(
                *self
                    .index
                    .get(p)
                    .ok_or_else(|| QueueError::UnknownParent { queue: spec.name.clone(), parent: p.clone() })?,
            ),
        };
        self.index.insert(spec.name.clone(), self.queues.len());
        self.parent.push(parent);
        self.queues.push(spec);
        Ok(())
    }

    /// Guarantees must be satisfiable: a parent's children cannot be promised more than the parent
    /// holds (its guarantee when it has one, else its capability).
    fn check_guarantees(&self) -> Result<(), QueueError> {
        for (p, spec) in self.queues.iter().enumerate() {
            let children: Vec<&Resources> = (0..self.queues.len())
                .filter(|&c| self.parent[c] == Some(p))
                .map(|c| &self.queues[c].guarantee)
                .collect();
            if children.is_empty() {
                continue;
            }
            let total = sum(&children).ok_or_else(|| QueueError::ChildGuaranteesTooLarge(spec.name.clone()))?;
            let bound =
                if spec.guarantee != Resources::default() { Some(&spec.guarantee) } else { spec.capability.as_ref() };
            if bound.is_some_and(|b| !fits(&total, b)) {
                return Err(QueueError::ChildGuaranteesTooLarge(spec.name.clone()));
            }
        }
        Ok(())
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    /// No queues.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Index of a queue by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// A queue by index.
    pub fn get(&self, i: usize) -> Option<&QueueSpec> {
        self.queues.get(i)
    }

    /// The parent of queue `i`.
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parent.get(i).copied().flatten()
    }

    /// Queue `i` and its ancestors, innermost first.
    pub fn chain(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(i), |&q| self.parent(q))
    }

    /// Whether the queue has no children (work is only submitted to leaves).
    pub fn is_leaf(&self, i: usize) -> bool {
        !self.parent.contains(&Some(i))
    }

    /// The fair-share plugin's view, with the current allocation, requests (allocated + pending)
    /// and decayed usage of each queue, in tree order.
    pub fn states(&self, allocated: &[Resources], request: &[Resources], decayed_usage: &[f64]) -> Vec<QueueState> {
        self.queues
            .iter()
            .enumerate()
            .map(|(i, q)| QueueState {
                name: q.name.clone(),
                parent: self.parent[i].map(|p| p as u32),
                weight: q.weight,
                guarantee: q.guarantee.clone(),
                capability: q.capability.clone(),
                allocated: allocated.get(i).cloned().unwrap_or_default(),
                request: request.get(i).cloned().unwrap_or_default(),
                decayed_usage: decayed_usage.get(i).copied().unwrap_or(0.0),
                reclaimable: q.reclaimable,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, parent: Option<&str>, weight: u32) -> QueueSpec {
        QueueSpec { name: name.into(), parent: parent.map(Into::into), weight, ..Default::default() }
    }

    fn gpus(milli: u64) -> Resources {
        Resources { gpu_milli: milli, ..Default::default() }
    }

    #[test]
    fn q1_parents_first_and_no_duplicates() {
        let t = QueueTree::new([q("root", None, 1), q("team-a", Some("root"), 2)]).unwrap();
        assert_eq!(t.len(), 2);
        assert!(!t.is_leaf(0) && t.is_leaf(1));
        assert_eq!(
            QueueTree::new([q("team-a", Some("root"), 1), q("root", None, 1)]).unwrap_err().to_string(),
            "queue team-a: parent queue root not found"
        );
        assert_eq!(QueueTree::new([q("a", None, 1), q("a", None, 1)]).unwrap_err(), QueueError::Duplicate("a".into()));
        assert!(matches!(QueueTree::new([q("self", Some("self"), 1)]), Err(QueueError::UnknownParent { .. })));
    }

    #[test]
    fn d4_zero_weight_and_bad_quantities_are_refused() {
        assert_eq!(QueueTree::new([q("z", None, 0)]).unwrap_err(), QueueError::ZeroWeight("z".into()));
        let mut bad = q("b", None, 1);
        bad.guarantee = gpus(2000);
        bad.capability = Some(gpus(1000));
        assert_eq!(QueueTree::new([bad]).unwrap_err(), QueueError::GuaranteeAboveCapability("b".into()));
        let mut parent = q("p", None, 1);
        parent.capability = Some(gpus(1000));
        let mut c1 = q("c1", Some("p"), 1);
        c1.guarantee = gpus(600);
        let mut c2 = q("c2", Some("p"), 1);
        c2.guarantee = gpus(600);
        assert_eq!(
            QueueTree::new([parent.clone(), c1.clone(), c2.clone()]).unwrap_err(),
            QueueError::ChildGuaranteesTooLarge("p".into())
        );
        c2.guarantee = gpus(u64::MAX);
        parent.capability = None;
        assert_eq!(QueueTree::new([parent, c1, c2]).unwrap_err(), QueueError::ChildGuaranteesTooLarge("p".into()));
        assert_eq!(QueueTree::new([q("", None, 1)]).unwrap_err(), QueueError::EmptyName);
    }

    #[test]
    fn states_carry_the_tree_for_fair_share() {
        let t = QueueTree::new([q("root", None, 1), q("a", Some("root"), 3)]).unwrap();
        let s = t.states(&[gpus(0), gpus(500)], &[gpus(0), gpus(2000)], &[0.0, 7.5]);
        assert_eq!(s[1].parent, Some(0));
        assert_eq!((s[1].weight, s[1].allocated.gpu_milli, s[1].decayed_usage), (3, 500, 7.5));
    }
}
