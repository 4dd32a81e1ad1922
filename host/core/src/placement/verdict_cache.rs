//! Reuse of filter verdicts for equal tasks on unchanged nodes.
//!
//! The contract makes a filter verdict a function of the task, the node (and its topology) and the
//! plugin's configuration (`wit/policy.wit`, `filter`). Pods of one Deployment, Job or gang are
//! equal apart from their names, and one decision changes one node, so most of a task's verdicts
//! were already computed for an earlier, equal task. kube-scheduler once had an "equivalence cache"
//! for this and dropped it because its predicates read other pods and volumes, which made
//! invalidation fragile; here a verdict depends on nothing outside one node record, and every
//! change to that record gives it a new [`NodeTable::stamp`](crate::NodeTable::stamp), so a
//! verdict is reused only for the exact node state it was computed for.
//!
//! One cache belongs to one filter plugin of one [`crate::PolicySet`]; a new policy version starts
//! empty unless its filter is the same component with the same configuration
//! ([`crate::PolicySet::inherit_verdicts`]). Verdicts are kept only for *recurring* shapes — another task of the shape came within
//! the last [`RECENT`] calls — each in a dense table of `(stamp, code)` by slot (10 bytes per
//! node), at most [`TABLE_BYTES`] in all, least recently used out first. A stream of all-different
//! tasks therefore stores no verdicts: it pays a hash and a map lookup per call, plus a copy of
//! the task the first time a shape is seen (at most [`MAX_SHAPES`] are remembered).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ahash::AHashMap;
use wasmsched_api::batch::{FilterBatch, MAX_BATCH_REASONS};
use wasmsched_api::{Rejection, Task};

use crate::node_table::Slot;
use crate::plugin::{CallContext, PluginFault, PolicyPlugin};

/// Memory for verdict tables, over all shapes (about 80 shapes at 5,000 nodes).
const TABLE_BYTES: usize = 4 << 20;

/// Tables kept however large the cluster (a few interleaved workloads should all stay).
const MIN_TABLES: usize = 4;

/// Task shapes known before the cache starts over (each keeps a copy of the task and its reasons).
const MAX_SHAPES: usize = 1024;

/// Verdicts of one filter plugin.
#[derive(Debug, Default)]
pub(crate) struct VerdictCache {
    inner: Mutex<Inner>,
    /// Verdicts answered from the cache, and asked of the plugin.
    reused: AtomicU64,
    asked: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Shape ids by [`shape_hash`].
    by_hash: AHashMap<u64, u32>,
    shapes: Vec<Shape>,
    /// Verdict tables of the recurring shapes.
    tables: Vec<Table>,
    /// Bumped when everything is forgotten, so an answer computed before does not land after.
    epoch: u64,
    /// Filter calls so far.
    clock: u64,
}

/// The verdicts kept for one shape: per slot, the node stamp a code was computed for (0: none).
#[derive(Debug)]
struct Table {
    shape: u32,
    stamps: Vec<u64>,
    codes: Vec<u16>,
    last_used: u64,
}

/// Tasks equal to `task` (its id aside), and the reasons their codes refer to.
#[derive(Debug)]
struct Shape {
    task: Task,
    reasons: Vec<Rejection>,
    /// The plugin gave so many distinct reasons that codes would not fit: not cached.
    disabled: bool,
    /// Whether the current task of this shape is looked up and remembered: only when another
    /// task of the shape came within the last [`RECENT`] calls. A stream of all-different tasks
    /// would only pay for lookups and stores that never pay back.
    hot: bool,
    /// Hash of the id of the last task of this shape, and the call it came in.
    last_task: u64,
    last_seen: u64,
    /// Its index in `tables`, if it has one.
    table: Option<usize>,
}

/// How recent (in filter calls) another task of the same shape must be for verdicts to be kept.
const RECENT: u64 = 64;

/// The task as kept: everything a filter may read except its unique id.
fn shape_of(task: &Task) -> Task {
    Task { id: String::new(), ..task.clone() }
}

/// What a filter verdict may depend on in a task: all of it but its id. Destructured field by
/// field so a new `Task` field must be placed here or explicitly left out. Labels and pod affinity
/// are host-only (plugins see pod affinity resolved into node affinity): no verdict depends on them.
#[allow(clippy::type_complexity)]
fn shape(
    task: &Task,
) -> (
    (&String, &Option<String>, &String, &i32, &wasmsched_api::Qos),
    (&wasmsched_api::Resources, &wasmsched_api::GpuRequest),
    (&Vec<(String, String)>, &wasmsched_api::NodeAffinity, &Vec<wasmsched_api::Toleration>),
) {
    let Task {
        id: _,
        namespace,
        group,
        queue,
        priority,
        qos,
        request,
        gpu,
        node_selector,
        node_affinity,
        tolerations,
        labels: _,
        pod_affinity: _,
    } = task;
    ((namespace, group, queue, priority, qos), (request, gpu), (node_selector, node_affinity, tolerations))
}

/// A hash of everything [`same_shape`] compares.
fn shape_hash(task: &Task) -> u64 {
    // Fixed seeds: the hash only has to be consistent within the process.
    ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(shape(task))
}

/// A task's identity, for telling another task of a shape from the same task asking again (a
/// placement filters in several windows).
fn id_hash(task: &Task) -> u64 {
    ahash::RandomState::with_seeds(5, 6, 7, 8).hash_one(&task.id)
}

/// Whether `a` and `b` are the same task shape (compared through references: no key is built per
/// lookup).
fn same_shape(a: &Task, b: &Task) -> bool {
    shape(a) == shape(b)
}

impl Inner {
    /// The id of `task`'s shape, registering it; `None` when it is not cached (disabled, or a
    /// different task with the same hash already holds the id).
    fn shape_id(&mut self, hash: u64, task: &Task) -> Option<u32> {
        if let Some(&id) = self.by_hash.get(&hash) {
            let shape = &self.shapes[id as usize];
            return (!shape.disabled && same_shape(&shape.task, task)).then_some(id);
        }
        if self.shapes.len() == MAX_SHAPES {
            self.forget();
        }
        let id = self.shapes.len() as u32;
        self.shapes.push(Shape {
            task: shape_of(task),
            reasons: Vec::new(),
            disabled: false,
            hot: false,
            last_task: 0,
            last_seen: 0,
            table: None,
        });
        self.by_hash.insert(hash, id);
        Some(id)
    }

    fn forget(&mut self) {
        self.by_hash.clear();
        self.shapes.clear();
        self.tables.clear();
        self.epoch += 1;
    }

    /// The table of shape `id`, made (evicting the least recently used) if it has none.
    fn table_of(&mut self, id: u32, slots: usize) -> &mut Table {
        let at = match self.shapes[id as usize].table {
            Some(at) => at,
            None => {
                let capacity = (TABLE_BYTES / (10 * slots.max(1))).max(MIN_TABLES);
                let fresh = Table { shape: id, stamps: Vec::new(), codes: Vec::new(), last_used: 0 };
                let at = if self.tables.len() < capacity {
                    self.tables.push(fresh);
                    self.tables.len() - 1
                } else {
                    let oldest = (0..self.tables.len()).min_by_key(|&i| self.tables[i].last_used).unwrap_or(0);
                    let evicted = self.tables[oldest].shape;
                    self.shapes[evicted as usize].table = None;
                    self.tables[oldest] = fresh;
                    oldest
                };
                self.shapes[id as usize].table = Some(at);
                at
            }
        };
        let table = &mut self.tables[at];
        table.last_used = self.clock;
        table
    }
}

impl Table {
    fn cached(&self, slot: Slot, stamp: u64) -> Option<u16> {
        let i = slot as usize;
        (stamp != 0 && self.stamps.get(i) == Some(&stamp)).then(|| self.codes[i])
    }

    fn store(&mut self, slot: Slot, stamp: u64, code: u16) {
        let i = slot as usize;
        if i >= self.stamps.len() {
            self.stamps.resize(i + 1, 0);
            self.codes.resize(i + 1, 0);
        }
        self.stamps[i] = stamp;
        self.codes[i] = code;
    }
}

/// The code (index + 1) of `r` in `reasons`, appending it when new. Callers bound the length so
/// that codes fit in a `u16`.
fn intern(reasons: &mut Vec<Rejection>, r: &Rejection) -> u16 {
    let at = reasons.iter().position(|x| x == r).unwrap_or_else(|| {
        reasons.push(r.clone());
        reasons.len() - 1
    });
    at as u16 + 1
}

impl VerdictCache {
    /// Verdicts reused and verdicts asked of the plugin so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.reused.load(Ordering::Relaxed), self.asked.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every mutation leaves the cache consistent, so a poisoned lock is used as is.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `plugin.filter_until` for `candidates`, asking the plugin only about nodes whose verdict
    /// for an equal task is not known for their current state. The answer is what the plugin would
    /// give: one code per candidate into the returned reasons, up to where the plugin stopped when
    /// it stopped at its `enough`-th fit among the nodes asked (so at least `enough` fit in the
    /// answer). The lock is not held during the call.
    pub(crate) fn filter(
        &self,
        plugin: &dyn PolicyPlugin,
        ctx: CallContext<'_>,
        task: &Task,
        candidates: &[Slot],
        enough: usize,
    ) -> Result<FilterBatch, PluginFault> {
        let nodes = ctx.nodes;
        let hash = shape_hash(task);
        // Known verdicts, with the shape's reasons as they are now (the answer's own copy).
        let (mut batch, missing, id, epoch) = {
            let mut inner = self.lock();
            inner.clock += 1;
            let clock = inner.clock;
            let id = inner.shape_id(hash, task).filter(|&id| {
                let shape = &mut inner.shapes[id as usize];
                let this_task = id_hash(task);
                if shape.last_task != this_task {
                    shape.hot = shape.last_seen > 0 && clock - shape.last_seen <= RECENT;
                    shape.last_task = this_task;
                }
                shape.last_seen = clock;
                shape.hot
            });
            let Some(id) = id else {
                drop(inner);
                let batch = plugin.filter_until(ctx, task, candidates, enough)?;
                self.asked.fetch_add(batch.codes.len() as u64, Ordering::Relaxed);
                return Ok(batch);
            };
            let table = inner.table_of(id, nodes.slot_count() as usize);
            let mut codes = Vec::with_capacity(candidates.len());
            let mut missing = Vec::new();
            for (i, &slot) in candidates.iter().enumerate() {
                codes.push(table.cached(slot, nodes.stamp(slot)).unwrap_or_else(|| {
                    missing.push(i);
                    0
                }));
            }
            let shape = &inner.shapes[id as usize];
            let reasons = shape.reasons.clone();
            (FilterBatch { codes, reasons }, missing, id, inner.epoch)
        };
        if missing.is_empty() {
            self.reused.fetch_add(candidates.len() as u64, Ordering::Relaxed);
            return Ok(batch);
        }
        let asked: Vec<Slot> = missing.iter().map(|&i| candidates[i]).collect();
        // `enough` fits among the nodes asked are at least as many among all candidates.
        let fresh = plugin.filter_until(ctx, task, &asked, enough)?;
        // Where it stopped: the answer ends before the first candidate it did not answer for.
        let answered = fresh.codes.len().min(missing.len());
        if let Some(&unanswered) = missing.get(answered) {
            batch.codes.truncate(unanswered);
        }
        let missing = &missing[..answered];
        self.reused.fetch_add((batch.codes.len() - missing.len()) as u64, Ordering::Relaxed);
        self.asked.fetch_add(missing.len() as u64, Ordering::Relaxed);
        // Fresh verdicts into the answer: its reasons are the snapshot plus the new ones.
        // At most 2 × MAX_BATCH_REASONS reasons: the snapshot and this batch's.
        let answer_code: Vec<u16> = fresh.reasons.iter().map(|r| intern(&mut batch.reasons, r)).collect();
        for (k, &i) in missing.iter().enumerate() {
            batch.codes[i] = match usize::from(fresh.codes[k]) {
                0 => 0,
                r => answer_code[r - 1],
            };
        }
        // And into the cache, for the next equal task (unless it was emptied meanwhile).
        let mut inner = self.lock();
        if inner.epoch != epoch {
            return Ok(batch);
        }
        let shape = &mut inner.shapes[id as usize];
        if shape.reasons.len() + fresh.reasons.len() > MAX_BATCH_REASONS {
            // A plugin with (nearly) a reason per node gains nothing from reuse.
            shape.disabled = true;
            shape.reasons = Vec::new();
            return Ok(batch);
        }
        // At most MAX_BATCH_REASONS (256) reasons, checked above.
        let shape_code: Vec<u16> = fresh.reasons.iter().map(|r| intern(&mut shape.reasons, r)).collect();
        let table = inner.table_of(id, nodes.slot_count() as usize);
        for (k, &i) in missing.iter().enumerate() {
            let code = match usize::from(fresh.codes[k]) {
                0 => 0,
                r => shape_code[r - 1],
            };
            let slot = candidates[i];
            table.store(slot, nodes.stamp(slot), code);
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use wasmsched_api::{Filter, GpuDevice, GpuRequest, Node, Plugin, Resources, Verdict};

    use super::*;
    use crate::native::NativePlugin;
    use crate::node_table::NodeTable;

    thread_local! {
        /// Nodes asked about by [`Fits`] on this thread (tests run in parallel threads; native
        /// plugins run on the caller's).
        static ASKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Fits when the node has enough free GPUs; with `unique` config, every rejection has a reason
    /// of its own (the node name), which defeats reuse.
    struct Fits {
        unique: bool,
    }

    impl Plugin for Fits {
        const NAME: &'static str = "fits";
        fn new(config: &str) -> Result<Self, String> {
            Ok(Fits { unique: config == "unique" })
        }
    }

    impl Filter for Fits {
        fn filter(&mut self, task: &Task, node: &Node) -> Verdict {
            ASKED.set(ASKED.get() + 1);
            let free = node.gpus.iter().filter(|g| g.free_milli == 1000).count() as u32;
            match (free >= task.gpu.count, self.unique) {
                (true, _) => Verdict::Fit,
                (false, true) => Verdict::unfit(format!("full: {}", node.name)),
                (false, false) => Verdict::unfit("full"),
            }
        }
    }
    wasmsched_api::declare_stages!(Fits: filter);

    fn table(n: usize) -> NodeTable {
        let mut t = NodeTable::new();
        for i in 0..n {
            t.upsert(Node {
                name: format!("n{i}"),
                allocatable: Resources { gpu_milli: 2000, ..Default::default() },
                gpus: (0..2).map(|index| GpuDevice { index, free_milli: 1000, ..Default::default() }).collect(),
                ..Default::default()
            });
        }
        t
    }

    fn task(id: &str, gpus: u32) -> Task {
        Task {
            id: id.into(),
            gpu: GpuRequest { count: gpus, milli_per_gpu: 1000, ..Default::default() },
            ..Default::default()
        }
    }

    fn asked(f: impl FnOnce()) -> usize {
        let before = ASKED.get();
        f();
        ASKED.get() - before
    }

    #[test]
    fn equal_tasks_are_asked_only_about_changed_nodes() {
        let plugin = NativePlugin::<Fits>::new("", 1).unwrap();
        let cache = VerdictCache::default();
        let mut nodes = table(6);
        let all: Vec<Slot> = nodes.slots().collect();
        let run = |nodes: &NodeTable, t: &Task| {
            cache.filter(&plugin, CallContext { worker: 0, nodes }, t, &all, usize::MAX).unwrap()
        };
        // A shape's first task is not remembered (most shapes of a mixed stream never come back);
        // the second, coming soon after, is; the third finds its verdicts.
        assert_eq!(asked(|| assert_eq!(run(&nodes, &task("a", 2)).codes, vec![0; 6])), 6);
        assert_eq!(asked(|| assert_eq!(run(&nodes, &task("a", 2)).codes, vec![0; 6])), 6, "the same task again");
        assert_eq!(asked(|| assert_eq!(run(&nodes, &task("b", 2)).codes, vec![0; 6])), 6);
        assert_eq!(asked(|| assert_eq!(run(&nodes, &task("b2", 2)).codes, vec![0; 6])), 0, "only the id differs");
        // One node fills up: only it is asked again, and its new verdict is the answer.
        nodes.update(all[3], |n| n.gpus.update(|g| g[0].free_milli = 0));
        let mut answer = None;
        assert_eq!(asked(|| answer = Some(run(&nodes, &task("c", 2)))), 1);
        let answer = answer.unwrap();
        assert_eq!(answer.codes, vec![0, 0, 0, 1, 0, 0]);
        assert_eq!(answer.reasons[0].reason, "full");
        // Another shape is a cache of its own; a copy of the table reuses the original's verdicts.
        assert_eq!(asked(|| drop(run(&nodes, &task("d", 1)))), 6);
        assert_eq!(asked(|| drop(run(&nodes, &task("d2", 1)))), 6);
        assert_eq!(asked(|| drop(run(&nodes, &task("d3", 1)))), 0);
        let copy = nodes.clone();
        assert_eq!(asked(|| assert_eq!(run(&copy, &task("e", 2)).codes, answer.codes)), 0);
        // A different priority may change a filter's mind: not the same shape.
        let mut urgent = task("f", 2);
        urgent.priority = 7;
        assert_eq!(asked(|| drop(run(&nodes, &urgent))), 6);
        // A shape that comes back only after many other calls is not remembered.
        for i in 0..RECENT + 1 {
            run(&nodes, &task(&format!("other-{i}"), 1 + (i as u32 % 2)));
        }
        let mut rare = task("g", 2);
        rare.priority = 7;
        assert_eq!(asked(|| drop(run(&nodes, &rare))), 6);
        let mut rare = task("h", 2);
        rare.priority = 7;
        assert_eq!(asked(|| drop(run(&nodes, &rare))), 6, "nothing was kept of the rare shape's first comeback");
        let mut rare = task("i", 2);
        rare.priority = 7;
        assert_eq!(asked(|| drop(run(&nodes, &rare))), 0);
    }

    #[test]
    fn answers_equal_the_plugin_s_under_churn_many_shapes_and_reason_overflow() {
        for config in ["", "unique"] {
            let plugin = NativePlugin::<Fits>::new(config, 1).unwrap();
            let cache = VerdictCache::default();
            let mut nodes = table(300);
            let all: Vec<Slot> = nodes.slots().collect();
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            let mut next = |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            // Every other task of a shape of its own (its priority), so more shapes arrive than
            // are kept and the cache starts over a few times.
            for round in 0..3000 {
                let mut t = task(&format!("t{round}"), 1 + next(2) as u32);
                if round % 2 == 0 {
                    t.priority = round;
                }
                let window: Vec<Slot> = (0..40).map(|_| all[next(all.len() as u64) as usize]).collect();
                let ctx = CallContext { worker: 0, nodes: &nodes };
                // Every third call may stop early (as the last filter of a sampled scan does).
                let enough = if round % 3 == 0 { 1 + next(40) as usize } else { usize::MAX };
                let got = cache.filter(&plugin, ctx, &t, &window, enough).unwrap();
                let want = plugin.filter(ctx, &t, &window).unwrap();
                let text = |b: &FilterBatch| -> Vec<Option<String>> {
                    b.codes.iter().map(|&c| (c > 0).then(|| b.reasons[usize::from(c) - 1].reason.clone())).collect()
                };
                // The plugin's answer, or its beginning with at least `enough` fits.
                let (got, want) = (text(&got), text(&want));
                assert_eq!(got, want[..got.len()], "{config:?} round {round}");
                let fits = got.iter().filter(|v| v.is_none()).count();
                assert!(got.len() == want.len() || fits >= enough, "{config:?} round {round}: stopped early");
                for _ in 0..5 {
                    let s = all[next(all.len() as u64) as usize];
                    let free = if next(2) == 0 { 0 } else { 1000 };
                    nodes.update(s, |n| n.gpus.update(|g| g[next(2) as usize].free_milli = free));
                }
            }
            let (reused, asked) = cache.counts();
            if config.is_empty() {
                assert!(reused > asked / 10, "equal tasks reused verdicts: {reused} of {}", reused + asked);
            }
        }
    }

    #[test]
    fn a_fault_is_the_answer_and_nothing_is_remembered() {
        struct Faulty(AtomicUsize);
        impl PolicyPlugin for Faulty {
            fn name(&self) -> &str {
                "faulty"
            }
            fn stages(&self) -> &[wasmsched_api::Stage] {
                &[wasmsched_api::Stage::Filter]
            }
            fn failure_policy(&self) -> crate::FailurePolicy {
                crate::FailurePolicy::FailClosed
            }
            fn filter_until(
                &self,
                _: CallContext<'_>,
                _: &Task,
                c: &[Slot],
                _: usize,
            ) -> Result<FilterBatch, PluginFault> {
                if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                    return Err(PluginFault::new(
                        "faulty",
                        wasmsched_api::Stage::Filter,
                        crate::FaultKind::Trap,
                        "boom",
                    ));
                }
                Ok(FilterBatch { codes: vec![0; c.len()], reasons: vec![] })
            }
            fn score(&self, _: CallContext<'_>, _: &Task, _: &[Slot]) -> Result<Vec<u32>, PluginFault> {
                unreachable!()
            }
            fn select_devices(
                &self,
                _: CallContext<'_>,
                _: &Task,
                _: Slot,
            ) -> Result<Result<Vec<wasmsched_api::DeviceShare>, Rejection>, PluginFault> {
                unreachable!()
            }
            fn select_victims(
                &self,
                _: CallContext<'_>,
                _: &Task,
                _: &[wasmsched_api::PreemptCandidate],
            ) -> Result<Option<wasmsched_api::Preemption>, PluginFault> {
                unreachable!()
            }
            fn fair_share(
                &self,
                _: usize,
                _: &[wasmsched_api::QueueState],
                _: &Resources,
            ) -> Result<wasmsched_api::ShareDecision, PluginFault> {
                unreachable!()
            }
        }
        let plugin = Arc::new(Faulty(AtomicUsize::new(0)));
        let cache = VerdictCache::default();
        let nodes = table(3);
        let all: Vec<Slot> = nodes.slots().collect();
        let ctx = CallContext { worker: 0, nodes: &nodes };
        assert!(cache.filter(plugin.as_ref(), ctx, &task("a", 1), &all, usize::MAX).is_err());
        assert_eq!(cache.filter(plugin.as_ref(), ctx, &task("b", 1), &all, usize::MAX).unwrap().codes, vec![0; 3]);
        assert_eq!(plugin.0.load(Ordering::Relaxed), 2, "the fault left nothing to reuse");
    }
}
