//! The queue hierarchy, validated when built so that bad configuration is refused up front.

use ahash::AHashMap;
use wasmsched_api::{Node, QueueState, Resources};

use crate::flavor::Flavor;

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
    /// How far above its guarantee the allocation may go (Kueue's `borrowingLimit`), `None` for
    /// unbounded. Together with the capability it makes the queue's [`QueueTree::limit`].
    pub borrowing_limit: Option<Resources>,
    /// How much of its *unused* guarantee queues outside its subtree may use (Kueue's
    /// `lendingLimit`), `None` for all of it. The rest stays free for the queue's own work.
    pub lending_limit: Option<Resources>,
    /// Others may reclaim what it borrows.
    pub reclaimable: bool,
    /// How long (s) a run of this queue must have run before another queue may reclaim it;
    /// `None`: [`crate::CoreConfig::reclaim_min_runtime_seconds`]. Longer for queues whose jobs
    /// do not checkpoint and lose hours of work, shorter for queues of short or restartable work.
    pub reclaim_min_runtime_seconds: Option<u64>,
    /// A run of this queue older than this (s) is never reclaimed by a queue above its guarantee;
    /// 0: no limit. `None`: [`crate::CoreConfig::reclaim_max_runtime_seconds`]. Short for queues
    /// whose jobs run for days without checkpoints, 0 for queues of restartable work.
    pub reclaim_max_runtime_seconds: Option<u64>,
    /// What a workload must satisfy to be accepted into the queue at all.
    pub admission: Admission,
    /// The [`Flavor`]s its work may use, in the order they are tried; empty: its parent's (a
    /// root's: every flavor, in declaration order). Quota per flavor is in the resources above,
    /// under [`crate::flavored_resource`] names.
    pub flavors: Vec<String>,
}

/// Limits checked when a workload is submitted to a leaf queue: a workload they
/// refuse never waits in the queue; the submitter gets the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// Most workloads the queue holds at once, pending and running together.
    pub max_jobs: Option<u32>,
    /// Most GPUs one workload may ask for, all its members (replicas) counted; shares count as
    /// their fraction of a GPU.
    pub max_gpus_per_job: Option<u32>,
    /// Inclusive range of the priorities accepted.
    pub priority_range: Option<(i32, i32)>,
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
    /// An admission priority range whose minimum is above its maximum admits nothing.
    #[error("queue {0}: priority range minimum above its maximum")]
    EmptyPriorityRange(String),
    /// A flavor name is empty, contains `/`, or is declared twice.
    #[error("flavor {0:?}: names must be unique, non-empty and without '/'")]
    BadFlavor(String),
    /// A queue lists a flavor that is not declared.
    #[error("queue {queue}: unknown flavor {flavor}")]
    UnknownFlavor {
        /// The queue.
        queue: String,
        /// The flavor it named.
        flavor: String,
    },
}

/// A validated forest of queues. Parents always precede their children, so a cycle cannot be
/// expressed: a queue naming a later (or itself as) parent is an unknown parent.
#[derive(Clone, Debug, Default)]
pub struct QueueTree {
    queues: Vec<QueueSpec>,
    index: AHashMap<String, usize>,
    parent: Vec<Option<usize>>,
    /// Capability and borrowing limit folded into one bound, per queue.
    limit: Vec<Option<Resources>>,
    /// What the queue keeps for itself of its guarantee (guarantee minus lending limit).
    reserve: Vec<Option<Resources>>,
    flavors: Vec<Flavor>,
    /// Per queue, the flavor indices its work tries, in order.
    flavor_order: Vec<Vec<usize>>,
    /// The qualified (per-flavor) resources some quota bounds or guarantees: the only ones fair
    /// share and reserves need to count (a flavor quota naming only GPUs adds one dimension).
    flavored: ahash::AHashSet<String>,
    /// Per queue, whether some queue names it as parent.
    has_children: Vec<bool>,
}

/// Every subtree's unused reserve for one allocation state: the part of
/// [`QueueTree::reserved_against`] that walks all queues, computed once per state and shared by
/// every leaf's check.
#[derive(Clone, Debug, Default)]
pub struct UnusedReserves {
    /// Per queue, what its subtree keeps unused.
    unused: Vec<Resources>,
    /// Per queue, the sum of its children's `unused`.
    children: Vec<Resources>,
    /// The sum of the roots' `unused`.
    roots: Resources,
}

impl UnusedReserves {
    /// What the roots' subtrees keep unused in all: capacity no queue outside them may take.
    pub fn total(&self) -> &Resources {
        &self.roots
    }
}

/// Whether `small` is within `big` in every resource.
pub(crate) fn fits(small: &Resources, big: &Resources) -> bool {
    small.cpu_milli <= big.cpu_milli
        && small.memory_bytes <= big.memory_bytes
        && small.gpu_milli <= big.gpu_milli
        // A bound limits the extended resources it names; the rest (a pod count) are unbounded.
        && small.extended.iter().all(|(n, v)| big.extended.iter().find(|(b, _)| b == n).is_none_or(|(_, b)| v <= b))
}

/// `f` of two amounts in every resource; an extended resource one of them does not name is taken
/// from the other alone (for bounds: unbounded there).
fn combine(a: &Resources, b: &Resources, f: fn(u64, u64) -> u64) -> Resources {
    let mut extended = a.extended.clone();
    for (name, v) in &b.extended {
        match extended.iter_mut().find(|(n, _)| n == name) {
            Some((_, x)) => *x = f(*x, *v),
            None => extended.push((*name, *v)),
        }
    }
    extended.sort_by_key(|e| e.0); // lookups binary-search them
    Resources {
        cpu_milli: f(a.cpu_milli, b.cpu_milli),
        memory_bytes: f(a.memory_bytes, b.memory_bytes),
        gpu_milli: f(a.gpu_milli, b.gpu_milli),
        extended,
    }
}

/// `a + b` saturating, where an extended resource `b` does not name stays unbounded: a borrowing
/// limit that names only GPUs says nothing of a pod count.
fn plus_bound(a: &Resources, b: &Resources) -> Resources {
    Resources {
        cpu_milli: a.cpu_milli.saturating_add(b.cpu_milli),
        memory_bytes: a.memory_bytes.saturating_add(b.memory_bytes),
        gpu_milli: a.gpu_milli.saturating_add(b.gpu_milli),
        extended: b.extended.iter().map(|(n, v)| (*n, a.extended(n).saturating_add(*v))).collect(),
    }
}

fn sum(list: &[&Resources]) -> Option<Resources> {
    list.iter().try_fold(Resources::default(), |total, r| total.checked_add(r))
}

impl QueueTree {
    /// Validate `specs` (parents first) into a tree.
    pub fn new(specs: impl IntoIterator<Item = QueueSpec>) -> Result<Self, QueueError> {
        Self::with_flavors(Vec::new(), specs)
    }

    /// Validate `specs` (parents first) into a tree whose quotas may be per [`Flavor`].
    pub fn with_flavors(flavors: Vec<Flavor>, specs: impl IntoIterator<Item = QueueSpec>) -> Result<Self, QueueError> {
        for (i, f) in flavors.iter().enumerate() {
            if f.name.is_empty() || f.name.contains('/') || flavors[..i].iter().any(|o| o.name == f.name) {
                return Err(QueueError::BadFlavor(f.name.clone()));
            }
        }
        let mut tree = QueueTree { flavors, ..QueueTree::default() };
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
        if spec.admission.priority_range.is_some_and(|(min, max)| min > max) {
            return Err(QueueError::EmptyPriorityRange(spec.name));
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
        let limit = match (&spec.capability, &spec.borrowing_limit) {
            (None, None) => None,
            (Some(c), None) => Some(c.clone()),
            (None, Some(b)) => Some(plus_bound(&spec.guarantee, b)),
            (Some(c), Some(b)) => Some(combine(c, &plus_bound(&spec.guarantee, b), u64::min)),
        };
        let reserve = spec.lending_limit.as_ref().map(|l| Resources {
            // An extended resource the lending limit does not name is lent in full.
            extended: l.extended.iter().map(|(n, v)| (*n, spec.guarantee.extended(n).saturating_sub(*v))).collect(),
            ..spec.guarantee.saturating_sub(l)
        });
        let order = if spec.flavors.is_empty() {
            match parent {
                Some(p) => self.flavor_order[p].clone(),
                None => (0..self.flavors.len()).collect(),
            }
        } else {
            let index = |f: &String| {
                self.flavors
                    .iter()
                    .position(|x| &x.name == f)
                    .ok_or_else(|| QueueError::UnknownFlavor { queue: spec.name.clone(), flavor: f.clone() })
            };
            spec.flavors.iter().map(index).collect::<Result<Vec<_>, _>>()?
        };
        self.flavor_order.push(order);
        self.index.insert(spec.name.clone(), self.queues.len());
        self.parent.push(parent);
        self.has_children.push(false);
        if let Some(p) = parent {
            self.has_children[p] = true;
        }
        self.limit.push(limit);
        self.reserve.push(reserve.filter(|r| *r != Resources::default()));
        // A guarantee of 0 and a bound of u64::MAX / 4 or more (the frontends' "unbounded") say
        // nothing; anything else makes the qualified resource one to count.
        let flavored =
            |n: &str| self.flavors.iter().any(|f| n.strip_prefix(&f.name).is_some_and(|r| r.starts_with('/')));
        let said = spec.guarantee.extended.iter().filter(|(_, v)| *v > 0).chain(
            [&spec.capability, &spec.borrowing_limit, &spec.lending_limit]
                .into_iter()
                .flatten()
                .flat_map(|r| r.extended.iter())
                .filter(|(_, v)| *v < u64::MAX / 4),
        );
        let named: Vec<String> = said.map(|(n, _)| n).filter(|n| flavored(n)).map(|n| n.to_string()).collect();
        self.flavored.extend(named);
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

    /// The most queue `i` may hold: its capability, and its guarantee plus its borrowing limit,
    /// whichever is tighter; `None` for unbounded.
    pub fn limit(&self, i: usize) -> Option<&Resources> {
        self.limit.get(i)?.as_ref()
    }

    /// The declared flavors.
    pub fn flavors(&self) -> &[Flavor] {
        &self.flavors
    }

    /// Whether `resource` is a qualified resource no quota names (fair share and reserves skip it).
    pub fn unbounded_flavored(&self, resource: &str) -> bool {
        !self.flavored.contains(resource)
            && self.flavors.iter().any(|f| resource.strip_prefix(&f.name).is_some_and(|r| r.starts_with('/')))
    }

    /// The flavor `node` belongs to: the first whose labels it carries.
    pub fn flavor_of(&self, node: &Node) -> Option<usize> {
        self.flavors.iter().position(|f| f.matches(node))
    }

    /// The flavors work of queue `i` tries, in order.
    pub fn flavors_for(&self, i: usize) -> &[usize] {
        self.flavor_order.get(i).map_or(&[], Vec::as_slice)
    }

    /// Whether any queue keeps part of its guarantee from others (a lending limit below it).
    pub fn has_reserves(&self) -> bool {
        self.reserve.iter().any(Option::is_some)
    }

    /// Every subtree's unused reserve under `allocated` (per queue, its subtree's allocation). A
    /// queue's reserve covers its subtree, so a subtree keeps the larger of its own unused reserve
    /// and the sum of its children's, per resource. O(queues).
    pub fn unused_reserves(&self, allocated: &[Resources]) -> UnusedReserves {
        let n = self.queues.len();
        let mut unused = vec![Resources::default(); n];
        let mut children = vec![Resources::default(); n];
        let mut roots = Resources::default();
        // Children follow their parents, so a reverse walk sees every child before its parent.
        for q in (0..n).rev() {
            let own = match &self.reserve[q] {
                Some(r) => r.saturating_sub(allocated.get(q).unwrap_or(&Resources::default())),
                None => Resources::default(),
            };
            unused[q] = combine(&own, &children[q], u64::max);
            match self.parent[q] {
                Some(p) => children[p].saturating_add_assign(&unused[q]),
                None => roots.saturating_add_assign(&unused[q]),
            }
        }
        UnusedReserves { unused, children, roots }
    }

    /// What queues outside the subtrees on `leaf`'s path keep unused for themselves: capacity work
    /// of `leaf` must leave free. O(depth) given the [`Self::unused_reserves`] of the state.
    pub fn reserved_against(&self, leaf: usize, reserves: &UnusedReserves) -> Resources {
        let UnusedReserves { unused, children, roots } = reserves;
        let mut total = Resources::default();
        for c in self.chain(leaf) {
            let (Some(own), Some(siblings)) = (unused.get(c), self.parent(c).map_or(Some(roots), |p| children.get(p)))
            else {
                continue;
            };
            total.saturating_add_assign(&siblings.saturating_sub(own));
        }
        total
    }

    /// Whether the queue has no children (work is only submitted to leaves).
    pub fn is_leaf(&self, i: usize) -> bool {
        !self.has_children.get(i).copied().unwrap_or(false)
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
                // Fair share water-fills up to what the queue may actually hold.
                capability: self.limit[i].clone(),
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
    fn limits_fold_capability_and_borrowing_and_reserves_nest() {
        let mut p = q("p", None, 1);
        p.guarantee = gpus(10_000);
        p.lending_limit = Some(gpus(6_000));
        p.borrowing_limit = Some(gpus(2_000));
        let mut c = q("c", Some("p"), 1);
        c.guarantee = gpus(8_000);
        c.lending_limit = Some(gpus(2_000));
        c.capability = Some(gpus(9_000));
        c.borrowing_limit = Some(gpus(4_000));
        let t = QueueTree::new([p, c, q("d", Some("p"), 1), q("x", None, 1)]).unwrap();
        assert_eq!(t.limit(0).unwrap().gpu_milli, 12_000, "guarantee + borrowing limit");
        assert_eq!(t.limit(1).unwrap().gpu_milli, 9_000, "the capability is tighter");
        assert!(t.limit(2).is_none());
        assert!(t.has_reserves());
        let idle = vec![Resources::default(); 4];
        // p keeps 4, its child c keeps 6: outside p, the larger covers both.
        assert_eq!(t.reserved_against(3, &t.unused_reserves(&idle)).gpu_milli, 6_000);
        // d is inside p: only its sibling c's reserve is kept from it.
        assert_eq!(t.reserved_against(2, &t.unused_reserves(&idle)).gpu_milli, 6_000);
        assert_eq!(t.reserved_against(1, &t.unused_reserves(&idle)).gpu_milli, 0);
        // c uses 3 (so does p, its parent): c keeps 3 more, p 1 more.
        let used = vec![gpus(3_000), gpus(3_000), Resources::default(), Resources::default()];
        assert_eq!(t.reserved_against(3, &t.unused_reserves(&used)).gpu_milli, 3_000);
        assert_eq!(t.reserved_against(2, &t.unused_reserves(&used)).gpu_milli, 3_000);
        assert_eq!(t.states(&used, &used, &[0.0; 4])[0].capability.as_ref().unwrap().gpu_milli, 12_000);
    }

    #[test]
    fn states_carry_the_tree_for_fair_share() {
        let t = QueueTree::new([q("root", None, 1), q("a", Some("root"), 3)]).unwrap();
        let s = t.states(&[gpus(0), gpus(500)], &[gpus(0), gpus(2000)], &[0.0, 7.5]);
        assert_eq!(s[1].parent, Some(0));
        assert_eq!((s[1].weight, s[1].allocated.gpu_milli, s[1].decayed_usage), (3, 500, 7.5));
    }
}
