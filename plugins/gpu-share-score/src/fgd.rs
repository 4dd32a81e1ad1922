//! The FGD scorer with the two caches the protocol allows (§7.6): fragmentation memoised by node
//! state, and each node's score and chosen GPU memoised per pod shape until the node changes.
//! Neither changes a result; together they turn ~10⁷ fragmentation evaluations per replay into
//! ~10⁵.

use std::collections::HashMap;

use ahash::RandomState;
use hashbrown::HashTable;
use wasmsched_sdk::prelude::*;

use crate::fragmentation::{TypicalPod, gradient_score};
use crate::usable::{self, Usable};
use crate::view;

/// Bounds on the caches, so that a cluster with endless distinct pod shapes or node states cannot
/// grow the plugin past its memory limit: a full cache is cleared and refilled.
const MAX_MEMO: usize = 1 << 18;
const MAX_SHAPES: usize = 4096;
const MAX_NODES: usize = 1 << 17;
const NOT_SCORED: u64 = u64::MAX;
const NO_GPU: u32 = u32::MAX;

fn hasher() -> RandomState {
    // Fixed seeds: the caches never change results, but fixed seeds keep even timing reproducible.
    RandomState::with_seeds(0x5eed, 0xf9d, 0x0b, 0x1213)
}

/// A pod shape the FGD score depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape {
    cpu_milli: u64,
    milli: u32,
    count: u32,
}

impl Shape {
    fn of(task: &Task) -> Shape {
        let count = if task.gpu.milli_per_gpu == 0 { 0 } else { task.gpu.count };
        Shape { cpu_milli: task.request.cpu_milli, milli: task.gpu.milli_per_gpu, count }
    }
}

#[derive(Hash, PartialEq, Eq)]
struct StateKey {
    cpu_left: u64,
    model: u16,
    sorted_lefts: Vec<u32>,
}

/// One node's last seen state, its fragmentation, and its results per shape id.
struct NodeEntry {
    name: String,
    cpu_left: u64,
    model_name: String,
    model: u16,
    epoch: u64,
    lefts: Vec<u32>,
    before: f64,
    results: Vec<u64>,
}

impl NodeEntry {
    /// Whether `node` is still in the state this entry describes: compared field by field, without
    /// allocating, because this runs for every node of every decision.
    fn describes(&self, node: &Node, epoch: u64) -> bool {
        self.epoch == epoch
            && self.cpu_left == view::cpu_left(node)
            && self.lefts.len() == node.gpus.len()
            && self.lefts.iter().copied().eq(view::lefts(node))
            && same_text(&self.model_name, view::model(node))
    }
}

/// Fragmentation of node states, per GPU model (which typical pods may use it).
struct Measure {
    usable: Usable,
    typical: Vec<TypicalPod>,
    models: Vec<(String, Vec<bool>)>,
    memo: HashMap<StateKey, f64, RandomState>,
    /// Bumped when model ids are reassigned, which invalidates every node entry.
    epoch: u64,
}

impl Measure {
    fn model_id(&mut self, model: &str) -> u16 {
        if let Some(i) = self.models.iter().position(|(m, _)| m == model) {
            return i as u16;
        }
        if self.models.len() >= usize::from(u16::MAX) {
            self.models.clear();
            self.memo.clear();
            self.epoch += 1;
        }
        let access = self.typical.iter().map(|t| t.accepts_model(model)).collect();
        self.models.push((model.to_string(), access));
        (self.models.len() - 1) as u16
    }

    fn fragmented(&mut self, cpu_left: u64, model: u16, lefts: &[u32]) -> f64 {
        let mut sorted_lefts = lefts.to_vec();
        sorted_lefts.sort_unstable();
        let key = StateKey { cpu_left, model, sorted_lefts };
        if let Some(&f) = self.memo.get(&key) {
            return f;
        }
        let f = usable::fragmented(self.usable, &self.typical, &self.models[usize::from(model)].1, cpu_left, lefts);
        if self.memo.len() >= MAX_MEMO {
            self.memo.clear();
        }
        self.memo.insert(key, f);
        f
    }
}

/// Fragmentation Gradient Descent: place the pod where it increases the expected fragmentation of
/// the target workload least (or decreases it most), fragmentation measured as `usable` says.
pub(crate) struct Fgd {
    measure: Measure,
    shapes: Vec<Shape>,
    last_shape: usize,
    /// Indices into `entries`, hashed by node name: a lookup hashes the name once and compares it
    /// with [`same_text`].
    index: HashTable<usize>,
    names: RandomState,
    entries: Vec<NodeEntry>,
}

impl Fgd {
    pub(crate) fn new(typical: Vec<TypicalPod>, usable: Usable) -> Result<Fgd, String> {
        if typical.is_empty() {
            return Err("fgd needs a target workload: `typical` lists the popular pod shapes and weights".into());
        }
        if let Some(t) = typical.iter().find(|t| !(t.weight.is_finite() && t.weight > 0.0 && t.weight <= 1.0)) {
            return Err(format!("typical pod weight {} is not in (0, 1]", t.weight));
        }
        if let Some(t) = typical.iter().find(|t| t.milli > GPU_MILLI || (t.milli == 0) != (t.count == 0)) {
            return Err(format!(
                "typical pod with {} × {} milli-GPU: shares are 1..=1000 per GPU, and 0 only for CPU-only pods",
                t.count, t.milli
            ));
        }
        let sum: f64 = typical.iter().map(|t| t.weight).sum();
        if (sum - 1.0).abs() > 1e-6 {
            return Err(format!("typical pod weights sum to {sum}, not 1"));
        }
        Ok(Fgd {
            measure: Measure { usable, typical, models: Vec::new(), memo: HashMap::with_hasher(hasher()), epoch: 0 },
            shapes: Vec::new(),
            last_shape: 0,
            index: HashTable::new(),
            names: hasher(),
            entries: Vec::new(),
        })
    }

    fn shape_id(&mut self, task: &Task) -> usize {
        let shape = Shape::of(task);
        if self.shapes.get(self.last_shape) == Some(&shape) {
            return self.last_shape;
        }
        self.last_shape = match self.shapes.iter().position(|s| *s == shape) {
            Some(i) => i,
            None => {
                if self.shapes.len() >= MAX_SHAPES {
                    self.shapes.clear();
                    self.entries.iter_mut().for_each(|n| n.results.clear());
                }
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        };
        self.last_shape
    }

    /// The score of `node` for `task`, and for a GPU-sharing task the GPU it should take.
    pub(crate) fn evaluate(&mut self, task: &Task, node: &Node) -> (u32, Option<u32>) {
        let shape = self.shape_id(task);
        let hash = self.names.hash_one(node.name.as_str());
        let entries = &mut self.entries;
        let at = match self.index.find(hash, |&i| same_text(&entries[i].name, &node.name)) {
            Some(&at) => at,
            None => {
                if entries.len() >= MAX_NODES {
                    self.index.clear();
                    entries.clear();
                }
                entries.push(NodeEntry {
                    name: node.name.clone(),
                    cpu_left: u64::MAX,
                    model_name: String::new(),
                    model: 0,
                    epoch: u64::MAX,
                    lefts: Vec::new(),
                    before: 0.0,
                    results: Vec::new(),
                });
                let names = &self.names;
                self.index.insert_unique(hash, entries.len() - 1, |&i| names.hash_one(entries[i].name.as_str()));
                entries.len() - 1
            }
        };
        let entry = &mut self.entries[at];
        if !entry.describes(node, self.measure.epoch) {
            entry.cpu_left = view::cpu_left(node);
            entry.model_name = view::model(node).to_string();
            entry.model = self.measure.model_id(&entry.model_name);
            entry.epoch = self.measure.epoch;
            entry.lefts = view::lefts(node).collect();
            entry.before = self.measure.fragmented(entry.cpu_left, entry.model, &entry.lefts);
            entry.results.clear();
        }
        if let Some(&r) = entry.results.get(shape)
            && r != NOT_SCORED
        {
            let gpu = r as u32;
            return ((r >> 32) as u32, (gpu != NO_GPU).then_some(gpu));
        }
        let (score, gpu) =
            gradient(&mut self.measure, &self.shapes[shape], entry.before, entry.cpu_left, entry.model, &entry.lefts);
        if entry.results.len() <= shape {
            entry.results.resize(shape + 1, NOT_SCORED);
        }
        entry.results[shape] = (u64::from(score) << 32) | u64::from(gpu.unwrap_or(NO_GPU));
        (score, gpu)
    }
}

/// String equality by 8-byte words. `==` on strings calls `memcmp`, which in Wasm is the C
/// library's byte loop; this runs twice for every node of every decision (node name, GPU model).
fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or_default());
    // Whole words, then the last eight bytes (overlapping the last word when n is not a multiple).
    (0..n - 8).step_by(8).all(|at| word(a, at) == word(b, at)) && word(a, n - 8) == word(b, n - 8)
}

/// Score one placement: the fragmentation change if `shape` lands on the node; for a sharing pod,
/// on each GPU that fits, keeping the first best (truncated) score.
fn gradient(
    measure: &mut Measure,
    shape: &Shape,
    before: f64,
    cpu_left: u64,
    model: u16,
    lefts: &[u32],
) -> (u32, Option<u32>) {
    let cpu_after = cpu_left.saturating_sub(shape.cpu_milli);
    let mut after = lefts.to_vec();
    if shape.count == 1 && shape.milli < GPU_MILLI {
        let mut best: Option<(u32, u32)> = None;
        for (g, &left) in lefts.iter().enumerate() {
            if left < shape.milli {
                continue;
            }
            after[g] = left - shape.milli;
            let s = gradient_score(before, measure.fragmented(cpu_after, model, &after));
            after[g] = left;
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, g as u32));
            }
        }
        return best.map_or((0, None), |(s, g)| (s, Some(g)));
    }
    if shape.count > 0 {
        // Ascending free share, stable: for whole GPUs these are the lowest-index free ones.
        let mut order: Vec<usize> = (0..lefts.len()).collect();
        order.sort_by_key(|&g| lefts[g]);
        let mut taken = 0;
        for g in order {
            if taken == shape.count {
                break;
            }
            if lefts[g] >= shape.milli {
                after[g] -= shape.milli;
                taken += 1;
            }
        }
        if taken < shape.count {
            return (0, None);
        }
    }
    (gradient_score(before, measure.fragmented(cpu_after, model, &after)), None)
}

#[cfg(test)]
mod tests {
    use super::same_text;

    #[test]
    fn same_text_is_string_equality_at_every_length_and_position() {
        for n in 0..40 {
            let a: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            assert!(same_text(&a, &a.clone()), "{n}");
            assert!(!same_text(&a, &format!("{a}x")) && !same_text(&format!("{a}x"), &a), "{n}: lengths differ");
            for at in 0..n {
                let mut b = a.clone().into_bytes();
                b[at] = b'Z';
                let b = String::from_utf8(b).unwrap();
                assert!(!same_text(&a, &b), "{n} bytes, differing at {at}");
            }
        }
        assert!(same_text("A100-SXM4-80GB", "A100-SXM4-80GB") && !same_text("A100-SXM4-80GB", "A100-SXM4-40GB"));
    }
}
