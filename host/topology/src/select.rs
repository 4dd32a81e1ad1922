//! Exact GPU-set selection on one node.
//!
//! For a request of `k` GPUs and the node's free GPUs, the chosen set is the minimum of this key,
//! compared in order (`docs/topology.md` explains each):
//!
//! 1. the **bottleneck bandwidth** (the slowest link inside the set), highest first: collective
//!    operations run at the speed of their slowest link;
//! 2. the **total distance** (sum over pairs of latency normalised to one NVLink hop), lowest first;
//! 3. the **NUMA span** (how many NUMA nodes the set touches), lowest first;
//! 4. the **NUMA best fit**: free GPUs left behind in the NUMA nodes the set touches, fewest first,
//!    so a small job fills a fragmented NUMA node rather than breaking up a whole one;
//! 5. the **cut**: total bandwidth from the set to the free GPUs left behind, lowest first, so a
//!    job does not take one GPU of a free NVLink pair when another GPU would do;
//! 6. the **lowest GPU indexes** (lexicographic), which makes the choice deterministic.
//!
//! Keys 3 and 4 are skipped under [`NumaPolicy::None`]. The NUMA policies are filters with kubelet
//! semantics. The search is a branch and bound over bandwidth levels that returns exactly what
//! exhaustive enumeration returns ([`Prepared::ranked`] is that enumeration; tests compare both).

use std::cmp::Ordering;
use std::fmt;

use serde::Serialize;

use crate::{LinkCosts, NodeTopology};

/// NUMA alignment, with the Kubernetes Topology Manager's meaning: the API's type, shared with
/// plugins (`none` ignores NUMA; `best-effort` prefers narrow spans and admits anyway;
/// `restricted` admits only the narrowest span the node could give; `single-numa-node` only one
/// NUMA node).
pub use wasmsched_api::topology::NumaPolicy;

/// Why no set was chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsatisfiable {
    /// Fewer free GPUs than requested.
    #[error("{free} free GPUs, {requested} requested")]
    NotEnoughFree {
        /// Free GPUs on the node.
        free: u32,
        /// GPUs requested.
        requested: u32,
    },
    /// The NUMA policy admits no set of the free GPUs.
    #[error("no {requested} free GPUs satisfy NUMA policy {policy} (at most {span} NUMA nodes)")]
    Numa {
        /// The policy.
        policy: &'static str,
        /// GPUs requested.
        requested: u32,
        /// The widest span the policy admits.
        span: u32,
    },
    /// The policy needs NUMA ids that discovery did not report.
    #[error("NUMA policy {0} needs the NUMA node of every GPU, and some are unknown")]
    NumaUnknown(&'static str),
    /// Zero GPUs requested.
    #[error("zero GPUs requested")]
    Zero,
    /// The search visited [`SEARCH_BUDGET`] partial sets without finishing: only possible on large
    /// asymmetric nodes (no real server has one); refused rather than answered inexactly.
    #[error("GPU-set search exceeded its budget of {} partial sets", SEARCH_BUDGET)]
    SearchBudget,
    /// [`Prepared::ranked`] only: too many free GPUs to enumerate every set.
    #[error("exhaustive ranking is limited to 24 free GPUs, {0} are free")]
    TooManyToRank(u32),
}

/// Partial sets one selection may visit. Real nodes need far fewer (a 16-GPU node at most a few
/// thousand); the bound keeps a host call answering a plugin short on a hostile or absurd topology.
pub const SEARCH_BUDGET: u64 = 1_000_000;

/// A chosen GPU set with the values of its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// GPU indexes, ascending.
    pub gpus: Vec<u32>,
    /// Slowest link inside the set in MB/s; None for a single GPU.
    pub bottleneck_mbps: Option<u32>,
    /// Sum over pairs of normalised distance, in thousandths.
    pub distance_milli: u64,
    /// NUMA nodes touched (unknown NUMA counts as one more node).
    pub numa_span: u32,
    /// Free GPUs left in the touched NUMA nodes.
    pub numa_leftover: u32,
    /// Bandwidth from the set to the free GPUs left behind, MB/s.
    pub cut_mbps: u64,
    #[serde(skip)]
    mask: u64,
}

impl Choice {
    /// The set as a bit mask (bit `i` = GPU `i`).
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Which key makes `self` better than `other` (`None` when they are the same set).
    pub fn decided_by(&self, other: &Choice, policy: NumaPolicy) -> Option<&'static str> {
        self.key()
            .orderings(&other.key(), policy)
            .into_iter()
            .find(|(_, o)| *o != Ordering::Equal)
            .map(|(name, _)| name)
    }

    fn key(&self) -> Key {
        Key {
            bottleneck: self.bottleneck_mbps.unwrap_or(u32::MAX),
            distance: self.distance_milli,
            span: self.numa_span,
            leftover: self.numa_leftover,
            cut: self.cut_mbps,
            mask: self.mask,
        }
    }
}

fn numa_cmp(policy: NumaPolicy, a: u32, b: u32) -> Ordering {
    if policy == NumaPolicy::None { Ordering::Equal } else { a.cmp(&b) }
}

/// Lexicographic order of two equal-sized sets' ascending index lists: the set holding the lowest
/// index where they differ comes first.
fn lex(a: u64, b: u64) -> Ordering {
    let diff = a ^ b;
    if diff == 0 {
        Ordering::Equal
    } else if a & diff & diff.wrapping_neg() != 0 {
        Ordering::Less
    } else {
        Ordering::Greater
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPUs {:?}", self.gpus)?;
        if let Some(bw) = self.bottleneck_mbps {
            write!(f, ", bottleneck {:.1} GB/s", f64::from(bw) / 1000.0)?;
        }
        write!(
            f,
            ", distance {:.1}, NUMA span {}, NUMA leftover {}, cut {:.1} GB/s",
            self.distance_milli as f64 / 1000.0,
            self.numa_span,
            self.numa_leftover,
            self.cut_mbps as f64 / 1000.0
        )
    }
}

/// A node's topology turned into integer matrices, built once per node and reused for every
/// selection (what a scheduler keeps in its node table).
#[derive(Clone, Debug)]
pub struct Prepared {
    n: usize,
    /// Bandwidth in MB/s, row-major `n × n`.
    bandwidth: Vec<u32>,
    /// Normalised distance in thousandths, row-major `n × n`.
    distance: Vec<u32>,
    /// NUMA group of each GPU (unknown NUMA is one extra group), and whether any is unknown.
    numa: Vec<u32>,
    numa_unknown: bool,
    /// GPU mask of each NUMA group.
    numa_masks: Vec<u64>,
    /// Per GPU, the lower-indexed GPUs interchangeable with it: same NUMA group and the same link
    /// to every other GPU. Swapping two of them maps any set to one with the same key, so the search
    /// only takes a GPU once its lower twins are taken (exact symmetry reduction: on an NVSwitch node
    /// the 12,870 8-of-16 sets collapse to 9).
    twins_below: Vec<u64>,
    /// Distinct pair bandwidths of the node, highest first, and each pair's index into them.
    levels: Vec<u32>,
    level_of: Vec<u8>,
    /// GPUs per NUMA group, largest first (for [`Prepared::min_span`]).
    numa_sizes: Vec<u32>,
}

impl Prepared {
    /// Converts a topology with the given link costs.
    pub fn new(topology: &NodeTopology, costs: &LinkCosts) -> Prepared {
        let n = topology.len();
        let mut bandwidth = vec![0; n * n];
        let mut distance = vec![0; n * n];
        for i in 0..n {
            for j in 0..n {
                if let Some(link) = topology.link(i, j) {
                    let cost = costs.cost(link);
                    bandwidth[i * n + j] = (cost.bandwidth_gbps * 1000.0).round().min(f64::from(u32::MAX)) as u32;
                    distance[i * n + j] = (costs.distance(link) * 1000.0).round().min(f64::from(u32::MAX / 64)) as u32;
                }
            }
        }
        let mut ids: Vec<u32> = topology.numa_nodes();
        let numa_unknown = topology.gpus().iter().any(|g| g.numa.is_none());
        let numa: Vec<u32> = topology
            .gpus()
            .iter()
            .map(|g| match g.numa {
                Some(id) => ids.iter().position(|&x| x == id).unwrap_or(0) as u32,
                None => ids.len() as u32,
            })
            .collect();
        if numa_unknown {
            ids.push(u32::MAX);
        }
        let mut numa_masks = vec![0u64; ids.len()];
        for (i, &group) in numa.iter().enumerate() {
            numa_masks[group as usize] |= 1 << i;
        }
        let twins_below = (0..n)
            .map(|i| {
                (0..i)
                    .filter(|&j| {
                        numa[i] == numa[j]
                            && (0..n).filter(|&k| k != i && k != j).all(|k| {
                                bandwidth[i * n + k] == bandwidth[j * n + k]
                                    && distance[i * n + k] == distance[j * n + k]
                            })
                    })
                    .fold(0u64, |mask, j| mask | 1 << j)
            })
            .collect();
        let mut levels: Vec<u32> = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if !levels.contains(&bandwidth[i * n + j]) {
                    levels.push(bandwidth[i * n + j]);
                }
            }
        }
        levels.sort_unstable_by(|a, b| b.cmp(a));
        // At most 64 distinct levels are tracked as bits; beyond that (never on real hardware) the
        // slowest ones share the last bit, which only costs a redundant search.
        let level_of =
            bandwidth.iter().map(|bw| levels.iter().position(|l| l == bw).unwrap_or(0).min(63) as u8).collect();
        let mut numa_sizes: Vec<u32> = numa_masks.iter().map(|m| m.count_ones()).collect();
        numa_sizes.sort_unstable_by(|a, b| b.cmp(a));
        Prepared { n, bandwidth, distance, numa, numa_unknown, numa_masks, twins_below, levels, level_of, numa_sizes }
    }

    /// Number of GPUs on the node.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True for a node without GPUs.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The mask of all GPUs.
    pub fn all(&self) -> u64 {
        if self.n == 64 { u64::MAX } else { (1u64 << self.n) - 1 }
    }

    /// Bandwidth between two GPUs in MB/s (0 for the same GPU).
    pub fn bandwidth_mbps(&self, a: usize, b: usize) -> u32 {
        self.bandwidth[a * self.n + b]
    }

    /// The narrowest NUMA span the node could give `k` GPUs if all were free (kubelet's
    /// "preferred" width for `restricted`).
    pub fn min_span(&self, k: u32) -> u32 {
        let mut total = 0;
        for (i, size) in self.numa_sizes.iter().enumerate() {
            total += size;
            if total >= k {
                return i as u32 + 1;
            }
        }
        self.numa_sizes.len() as u32
    }

    /// The best set of `k` GPUs among `free` (a mask), or why there is none.
    pub fn select(&self, free: u64, k: u32, policy: NumaPolicy) -> Result<Choice, Unsatisfiable> {
        let free = free & self.all();
        let max_span = self.admissible(free, k, policy)?;
        let mut search = Search::new(self, free, k, policy, max_span);
        if k == 1 {
            for i in bits(free).filter(|&i| self.twins_below[i] & free == 0) {
                let groups = 1u64 << self.numa[i];
                search.leaf(1 << i, 0, search.row_free[i], groups);
            }
        } else {
            for index in bits(self.present_levels(free)) {
                search.level(self.levels[index]);
                if search.best.is_some() {
                    break;
                }
            }
            // More than 64 distinct bandwidths share the last bit: search the slower ones in turn.
            for &level in self.levels.iter().skip(64) {
                if search.best.is_some() {
                    break;
                }
                search.level(level);
            }
        }
        if search.budget == 0 {
            return Err(Unsatisfiable::SearchBudget);
        }
        let best = search.best.ok_or(Unsatisfiable::Numa { policy: policy.as_str(), requested: k, span: max_span })?;
        Ok(self.choice(free, best.mask))
    }

    /// Every admissible set of `k` GPUs among `free`, best first: the exhaustive reference, for
    /// explanations and tests. Refuses more than 24 free GPUs (the count explodes).
    pub fn ranked(&self, free: u64, k: u32, policy: NumaPolicy) -> Result<Vec<Choice>, Unsatisfiable> {
        let free = free & self.all();
        let max_span = self.admissible(free, k, policy)?;
        if free.count_ones() > 24 {
            return Err(Unsatisfiable::TooManyToRank(free.count_ones()));
        }
        let mut all = Vec::new();
        let free_bits: Vec<u32> = (0..64).filter(|i| free >> i & 1 == 1).collect();
        let m = free_bits.len();
        // Gosper's hack over positions in `free_bits`.
        let mut combo: u64 = (1u64 << k) - 1;
        while combo < 1u64 << m {
            let mask = free_bits
                .iter()
                .enumerate()
                .filter(|(pos, _)| combo >> pos & 1 == 1)
                .fold(0u64, |acc, (_, &bit)| acc | 1 << bit);
            let choice = self.choice(free, mask);
            if choice.numa_span <= max_span {
                all.push(choice);
            }
            let c = combo & combo.wrapping_neg();
            let r = combo + c;
            combo = (((r ^ combo) >> 2) / c) | r;
        }
        all.sort_by(|a, b| self.compare(a, b, policy));
        Ok(all)
    }

    fn compare(&self, a: &Choice, b: &Choice, policy: NumaPolicy) -> Ordering {
        a.key().cmp(&b.key(), policy)
    }

    /// Checks the request against the free count and the policy; returns the widest span admitted.
    fn admissible(&self, free: u64, k: u32, policy: NumaPolicy) -> Result<u32, Unsatisfiable> {
        if k == 0 {
            return Err(Unsatisfiable::Zero);
        }
        if free.count_ones() < k {
            return Err(Unsatisfiable::NotEnoughFree { free: free.count_ones(), requested: k });
        }
        let needs_numa = matches!(policy, NumaPolicy::Restricted | NumaPolicy::SingleNumaNode);
        if needs_numa && self.numa_unknown {
            return Err(Unsatisfiable::NumaUnknown(policy.as_str()));
        }
        Ok(match policy {
            NumaPolicy::None | NumaPolicy::BestEffort => u32::MAX,
            NumaPolicy::Restricted => self.min_span(k),
            NumaPolicy::SingleNumaNode => 1,
        })
    }

    /// Distinct bandwidths of links among free GPUs, highest first, as bits of indexes into
    /// `self.levels` (no allocation: this runs for every node of every cycle).
    fn present_levels(&self, free: u64) -> u64 {
        let mut present = 0u64;
        for i in bits(free) {
            for j in bits(free & !((2u64 << i) - 1)) {
                present |= 1 << self.level_of[i * self.n + j];
            }
        }
        present
    }

    /// The full key of a set.
    fn choice(&self, free: u64, mask: u64) -> Choice {
        let n = self.n;
        let mut bottleneck = u32::MAX;
        let mut distance = 0u64;
        let mut cut = 0u64;
        let mut groups = 0u64;
        for i in bits(mask) {
            groups |= 1 << self.numa[i];
            for j in bits(mask & !((2u64 << i) - 1)) {
                bottleneck = bottleneck.min(self.bandwidth[i * n + j]);
                distance += u64::from(self.distance[i * n + j]);
            }
            for j in bits(free & !mask) {
                cut += u64::from(self.bandwidth[i * n + j]);
            }
        }
        let leftover = bits(groups).map(|g| (self.numa_masks[g] & free & !mask).count_ones()).sum();
        Choice {
            gpus: bits(mask).map(|i| i as u32).collect(),
            bottleneck_mbps: (mask.count_ones() > 1).then_some(bottleneck),
            distance_milli: distance,
            numa_span: groups.count_ones(),
            numa_leftover: leftover,
            cut_mbps: cut,
            mask,
        }
    }
}

/// The set bits of a mask, ascending.
fn bits(mask: u64) -> impl Iterator<Item = usize> {
    let mut rest = mask;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            i
        })
    })
}

/// The key of a set, without allocation: what the search compares at every leaf.
#[derive(Clone, Copy)]
struct Key {
    /// Bottleneck bandwidth, MB/s (`u32::MAX` for a single GPU).
    bottleneck: u32,
    distance: u64,
    span: u32,
    leftover: u32,
    cut: u64,
    mask: u64,
}

impl Key {
    /// Smaller is better, in the order of the module docs: the one definition of the key, used by
    /// the search, the exhaustive ranking and the explanations.
    fn cmp(&self, other: &Key, policy: NumaPolicy) -> Ordering {
        other
            .bottleneck
            .cmp(&self.bottleneck)
            .then(self.distance.cmp(&other.distance))
            .then(numa_cmp(policy, self.span, other.span))
            .then(numa_cmp(policy, self.leftover, other.leftover))
            .then(self.cut.cmp(&other.cut))
            .then(lex(self.mask, other.mask))
    }

    /// The same comparison key by key, named, for explanations.
    fn orderings(&self, other: &Key, policy: NumaPolicy) -> [(&'static str, Ordering); 6] {
        [
            ("bottleneck bandwidth", other.bottleneck.cmp(&self.bottleneck)),
            ("total distance", self.distance.cmp(&other.distance)),
            ("NUMA span", numa_cmp(policy, self.span, other.span)),
            ("NUMA best fit", numa_cmp(policy, self.leftover, other.leftover)),
            ("bandwidth cut from free GPUs", self.cut.cmp(&other.cut)),
            ("lowest GPU indexes", lex(self.mask, other.mask)),
        ]
    }
}

struct Search<'a> {
    p: &'a Prepared,
    free: u64,
    k: u32,
    policy: NumaPolicy,
    max_span: u32,
    /// Free GPUs linked at the current level or better, per GPU.
    adjacency: [u64; 64],
    /// Bandwidth from each GPU to all free GPUs: the cut of a set is the sum of its members' rows
    /// minus twice the bandwidth inside it, so leaves need no loop.
    row_free: [u64; 64],
    /// Smallest pair distance at the current level: the bound for pairs not yet chosen.
    min_distance: u64,
    /// The current bandwidth level: every set found at it has exactly this bottleneck.
    level: u32,
    best: Option<Key>,
    /// Partial sets left to visit before giving up ([`SEARCH_BUDGET`]).
    budget: u64,
}

impl<'a> Search<'a> {
    fn new(p: &'a Prepared, free: u64, k: u32, policy: NumaPolicy, max_span: u32) -> Self {
        let n = p.n;
        let mut row_free = [0u64; 64];
        for i in bits(free) {
            row_free[i] = bits(free).map(|j| u64::from(p.bandwidth[i * n + j])).sum();
        }
        Search {
            p,
            free,
            k,
            policy,
            max_span,
            adjacency: [0; 64],
            row_free,
            min_distance: 0,
            level: u32::MAX,
            best: None,
            budget: SEARCH_BUDGET,
        }
    }

    /// Looks for the best `k`-clique among links of bandwidth ≥ `level`.
    fn level(&mut self, level: u32) {
        let n = self.p.n;
        self.level = level;
        self.min_distance = u64::MAX;
        for i in bits(self.free) {
            let mut adj = 0u64;
            for j in bits(self.free) {
                if i != j && self.p.bandwidth[i * n + j] >= level {
                    adj |= 1 << j;
                    self.min_distance = self.min_distance.min(u64::from(self.p.distance[i * n + j]));
                }
            }
            self.adjacency[i] = adj;
        }
        self.extend(0, self.free, 0, 0, 0, 0);
    }

    /// Depth-first over sets in index order: `chosen` so far, `candidates` adjacent to all of
    /// them and above the last one, their pairwise `distance`, the bandwidth inside the set
    /// (`inner`), the sum of their free rows (`rows`) and their NUMA `groups`.
    fn extend(&mut self, chosen: u64, candidates: u64, distance: u64, inner: u64, rows: u64, groups: u64) {
        if self.budget == 0 {
            return;
        }
        self.budget -= 1;
        let depth = chosen.count_ones();
        if depth == self.k {
            self.leaf(chosen, distance, rows - 2 * inner, groups);
            return;
        }
        let remaining = u64::from(self.k - depth);
        if candidates.count_ones() < self.k - depth {
            return;
        }
        if let Some(best) = &self.best {
            let new_pairs = remaining * u64::from(depth) + remaining * (remaining - 1) / 2;
            if distance + new_pairs * self.min_distance > best.distance {
                return;
            }
        }
        let n = self.p.n;
        let mut rest = candidates;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if rest.count_ones() + 1 < self.k - depth {
                return;
            }
            if self.p.twins_below[i] & self.free & !chosen != 0 {
                continue;
            }
            let groups = groups | 1 << self.p.numa[i];
            if groups.count_ones() > self.max_span {
                continue;
            }
            let (mut added_distance, mut added_bandwidth) = (0u64, 0u64);
            for j in bits(chosen) {
                added_distance += u64::from(self.p.distance[i * n + j]);
                added_bandwidth += u64::from(self.p.bandwidth[i * n + j]);
            }
            self.extend(
                chosen | 1 << i,
                rest & self.adjacency[i],
                distance + added_distance,
                inner + added_bandwidth,
                rows + self.row_free[i],
                groups,
            );
        }
    }

    fn leaf(&mut self, mask: u64, distance: u64, cut: u64, groups: u64) {
        let span = groups.count_ones();
        if span > self.max_span {
            return;
        }
        let leftover = bits(groups).map(|g| (self.p.numa_masks[g] & self.free & !mask).count_ones()).sum();
        let key =
            Key { bottleneck: if self.k == 1 { u32::MAX } else { self.level }, distance, span, leftover, cut, mask };
        if self.best.as_ref().is_none_or(|best| key.cmp(best, self.policy) == Ordering::Less) {
            self.best = Some(key);
        }
    }
}
