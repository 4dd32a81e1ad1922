//! Component glue used by `export_plugin!` on Wasm targets. Not public API: the macro is its only
//! user, and its shape may change with any release.

use std::any::Any;
use std::cell::{Cell, RefCell};

use wasmsched_api::batch::{filter_batch_until, score_batch};
use wasmsched_api::{Filter, Node, Plugin, Score, Stages, Task};

use crate::candidates::{missing_slot, resolve, resolved};

mod convert;

/// Bindings generated from `wit/policy.wit` (world `every-stage`: `policy` and the optional
/// `placement-counted`).
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "every-stage",
        default_bindings_module: "wasmsched_sdk::__private::bindings",
        pub_export_macro: true,
        export_macro_name: "__export_policy",
    });
}

pub use bindings::exports::wasmsched::policy::{
    fair_share, fair_share_delta, filter, mirror, mirror_usage, placement, placement_counted, plugin, preempt, score,
    select_claim_devices, select_devices,
};
use bindings::wasmsched::policy::{
    accelerators as wit_accelerators, domains as wit_domains, host, topology as wit_topology, types as wit,
};

/// The plugin as the glue holds it: its stages as trait objects, and its concrete type for the
/// stages the export macro dispatches statically ([`filter_static`], [`score_static`]).
trait Held: Stages + Any {}

impl<T: Stages + Any> Held for T {}

/// Everything the guest keeps between calls.
struct State {
    plugin: Option<Box<dyn Held>>,
    /// The node mirror, by host slot.
    nodes: Vec<Option<Node>>,
    generation: u64,
    /// `fair-share-delta`: the queue states received, whether each was (since the last reset),
    /// and the last answer's deserved shares.
    queues: Vec<wasmsched_api::QueueState>,
    received: Vec<bool>,
    deserved: Vec<wasmsched_api::Resources>,
}

thread_local! {
    static STATE: RefCell<State> = const {
        RefCell::new(State {
            plugin: None,
            nodes: Vec::new(),
            generation: 0,
            queues: Vec::new(),
            received: Vec::new(),
            deserved: Vec::new(),
        })
    };
}

pub(crate) fn log(level: crate::LogLevel, message: &str) {
    use host::LogLevel as L;
    let level = match level {
        crate::LogLevel::Trace => L::Trace,
        crate::LogLevel::Debug => L::Debug,
        crate::LogLevel::Info => L::Info,
        crate::LogLevel::Warn => L::Warn,
        crate::LogLevel::Error => L::Error,
    };
    host::log(level, message);
}

pub(crate) fn best_gpus(
    node: &str,
    count: u32,
    policy: wasmsched_api::topology::NumaPolicy,
    free: u64,
) -> Option<Result<wasmsched_api::topology::GpuSet, String>> {
    use wasmsched_api::topology::NumaPolicy as P;
    use wit_topology::NumaPolicy as W;
    let policy = match policy {
        P::None => W::None,
        P::BestEffort => W::BestEffort,
        P::Restricted => W::Restricted,
        P::SingleNumaNode => W::SingleNumaNode,
    };
    wit_topology::best_gpus(node, count, policy, free).map(|r| {
        r.map(|s| wasmsched_api::topology::GpuSet {
            gpus: s.gpus,
            bottleneck_mbps: s.bottleneck_mbps,
            distance_milli: s.distance_milli,
            numa_span: s.numa_span,
            score: s.score,
        })
    })
}

pub(crate) fn link(node: &str, a: u32, b: u32) -> Option<wasmsched_api::topology::GpuLink> {
    wit_topology::link(node, a, b).map(|l| wasmsched_api::topology::GpuLink {
        class: l.class,
        nvswitch: l.nvswitch,
        bandwidth_mbps: l.bandwidth_mbps,
        distance_milli: l.distance_milli,
    })
}

/// The host's kinds besides NVIDIA's, asked once per instance (the host's are fixed for its life).
pub(crate) fn kinds() -> &'static [wasmsched_api::accelerators::Kind] {
    static KINDS: std::sync::OnceLock<Vec<wasmsched_api::accelerators::Kind>> = std::sync::OnceLock::new();
    KINDS.get_or_init(|| {
        wit_accelerators::kinds()
            .into_iter()
            .map(|k| wasmsched_api::accelerators::Kind { name: k.name, resources: k.resources })
            .collect()
    })
}

/// The kinds of a node's devices, asked only when the host knows kinds besides NVIDIA's.
pub(crate) fn device_kinds(node: &str) -> Vec<String> {
    if kinds().is_empty() { Vec::new() } else { wit_accelerators::device_kinds(node) }
}

pub(crate) fn levels() -> Vec<String> {
    wit_domains::levels()
}

pub(crate) fn domain(level: u32, name: &str) -> Option<wasmsched_api::domains::Domain> {
    wit_domains::domain_named(level, name).map(|d| wasmsched_api::domains::Domain {
        name: d.name,
        nodes: d.nodes,
        idle_nodes: d.idle_nodes,
        gpu_milli: d.gpu_milli,
        free_gpu_milli: d.free_gpu_milli,
    })
}

/// `plugin.init`: build the plugin from its configuration.
pub fn init<P: Plugin + Stages + Any>(config: String) -> Result<plugin::PluginInfo, String> {
    // A panic aborts (traps) on wasm32; report its message first so the host can attribute it.
    std::panic::set_hook(Box::new(|info| host::log(host::LogLevel::Error, &format!("panic: {info}"))));
    let mut p = P::new(&config)?;
    let stages = p.stages().into_iter().map(convert::stage).collect();
    STATE.with_borrow_mut(|s| s.plugin = Some(Box::new(p)));
    Ok(plugin::PluginInfo { name: P::NAME.to_string(), stages, sdk_version: crate::SDK_VERSION.to_string() })
}

/// `mirror.reset`.
pub fn reset(generation: u64, slots: u32) {
    STATE.with_borrow_mut(|s| {
        s.nodes.clear();
        s.nodes.resize_with(slots as usize, || None);
        s.generation = generation;
    });
}

/// `mirror.upsert`.
pub fn upsert(generation: u64, nodes: Vec<(u32, wit::Node)>) {
    STATE.with_borrow_mut(|s| {
        for (slot, node) in nodes {
            let slot = slot as usize;
            if slot >= s.nodes.len() {
                s.nodes.resize_with(slot + 1, || None);
            }
            s.nodes[slot] = Some(convert::node(node));
        }
        s.generation = generation;
    });
}

/// `mirror-usage.update-usage`: only the fields binding and releasing change. Checked before
/// anything is applied, so an error leaves the mirror as it was (the host then resends it).
pub fn update_usage(generation: u64, nodes: Vec<(u32, mirror_usage::NodeUsage)>) -> Result<(), String> {
    STATE.with_borrow_mut(|s| {
        for (slot, usage) in &nodes {
            match s.nodes.get(*slot as usize).and_then(Option::as_ref) {
                None => return Err(format!("usage for slot {slot}, which the mirror does not hold")),
                Some(n) if n.gpus.len() != usage.gpus.len() => {
                    return Err(format!("usage of {} devices for {} with {}", usage.gpus.len(), n.name, n.gpus.len()));
                }
                Some(_) => {}
            }
        }
        for (slot, usage) in nodes {
            let Some(node) = s.nodes.get_mut(slot as usize).and_then(Option::as_mut) else { continue };
            node.allocated = convert::resources(usage.allocated);
            node.gpus.update(|gpus| {
                for (g, u) in gpus.iter_mut().zip(usage.gpus) {
                    g.free_milli = u.free_milli;
                    g.free_memory_bytes = u.free_memory_bytes;
                }
            });
        }
        s.generation = generation;
        Ok(())
    })
}

/// `mirror.remove`.
pub fn remove(generation: u64, slots: Vec<u32>) {
    STATE.with_borrow_mut(|s| {
        for slot in slots {
            if let Some(entry) = s.nodes.get_mut(slot as usize) {
                *entry = None;
            }
        }
        s.generation = generation;
    });
}

fn not_implemented(stage: &str) -> String {
    format!("this plugin does not implement the {stage} stage")
}

fn with_plugin<R>(f: impl FnOnce(&mut dyn Stages, &[Option<Node>], u64) -> Result<R, String>) -> Result<R, String> {
    STATE.with_borrow_mut(|s| {
        let State { plugin, nodes, generation, .. } = s;
        let plugin = plugin.as_deref_mut().ok_or("plugin called before init")?;
        f(plugin, nodes, *generation)
    })
}

/// [`with_plugin`] with the plugin as its concrete type `P` (what `init::<P>` stored).
fn with_concrete<P: Any, R>(f: impl FnOnce(&mut P, &[Option<Node>], u64) -> Result<R, String>) -> Result<R, String> {
    STATE.with_borrow_mut(|s| {
        let State { plugin, nodes, generation, .. } = s;
        let plugin: &mut dyn Any = plugin.as_deref_mut().ok_or("plugin called before init")?;
        let plugin = plugin.downcast_mut::<P>().ok_or("plugin state holds another type")?;
        f(plugin, nodes, *generation)
    })
}

/// A `filter` or `score` export of a plugin that does not list that stage in `export_plugin!`.
pub fn not_listed<R>(stage: &str) -> Result<R, String> {
    Err(not_implemented(stage))
}

/// `filter.filter` for a plugin type that implements [`Filter`], its `filter` called statically so
/// that LLVM can inline it into the batch loop: in Wasm every function entry also checks the stack
/// and the epoch deadline. (Native runners get the same through `Stages::filter_nodes`, over a
/// slice; here the mirror is walked lazily instead, without collecting the nodes first.)
pub fn filter_static<P: Filter + Any>(task: wit::Task, candidates: Vec<u32>) -> Result<filter::FilterResult, String> {
    filter_task::<P>(convert::task(task), candidates, usize::MAX)
}

fn filter_task<P: Filter + Any>(
    task: Task,
    candidates: Vec<u32>,
    enough: usize,
) -> Result<filter::FilterResult, String> {
    with_concrete::<P, _>(|p, nodes, generation| {
        let missing = Cell::new(None);
        let batch = filter_batch_until(p, &task, resolved(nodes, &candidates, &missing), enough);
        missing_slot(&missing, generation)?;
        Ok(filter::FilterResult {
            codes: batch.codes,
            reasons: batch.reasons.into_iter().map(convert::rejection).collect(),
        })
    })
}

/// `score.score`, statically dispatched (see [`filter_static`]).
pub fn score_static<P: Score + Any>(task: wit::Task, candidates: Vec<u32>) -> Result<Vec<u32>, String> {
    score_task::<P>(convert::task(task), candidates)
}

fn score_task<P: Score + Any>(task: Task, candidates: Vec<u32>) -> Result<Vec<u32>, String> {
    with_concrete::<P, _>(|p, nodes, generation| {
        let missing = Cell::new(None);
        let scores = score_batch(p, &task, resolved(nodes, &candidates, &missing));
        missing_slot(&missing, generation).map(|()| scores)
    })
}

/// The task of a `placement` or `placement-counted` call: brief, counted or full, the same task
/// to the plugin.
pub trait StageTaskForm {
    /// The task as the plugin sees it.
    fn into_task(self) -> Task;
}

impl StageTaskForm for placement::StageTask {
    fn into_task(self) -> Task {
        convert::stage_task(self)
    }
}

impl StageTaskForm for placement_counted::CountedStageTask {
    fn into_task(self) -> Task {
        convert::counted_stage_task(self)
    }
}

/// `placement.filter` and `placement-counted.filter`: the usage changes (all or nothing, as
/// `mirror-usage.update-usage`), then [`filter_static`], stopping at the `enough`-th fit.
pub fn placement_filter<P: Filter + Any>(
    generation: u64,
    usage: Vec<(u32, mirror_usage::NodeUsage)>,
    task: impl StageTaskForm,
    candidates: Vec<u32>,
    enough: Option<u32>,
) -> Result<filter::FilterResult, placement::StageError> {
    update_usage(generation, usage).map_err(placement::StageError::OutOfStep)?;
    let enough = enough.map_or(usize::MAX, |e| e as usize);
    filter_task::<P>(task.into_task(), candidates, enough).map_err(placement::StageError::Failed)
}

/// `placement.score` and `placement-counted.score`: the usage changes, then [`score_static`].
pub fn placement_score<P: Score + Any>(
    generation: u64,
    usage: Vec<(u32, mirror_usage::NodeUsage)>,
    task: impl StageTaskForm,
    candidates: Vec<u32>,
) -> Result<Vec<u32>, placement::StageError> {
    update_usage(generation, usage).map_err(placement::StageError::OutOfStep)?;
    score_task::<P>(task.into_task(), candidates).map_err(placement::StageError::Failed)
}

/// A `placement` export for a stage the plugin does not list: the usage still applies (the host
/// counts on it), the stage answers "not implemented".
pub fn placement_not_listed<R>(
    generation: u64,
    usage: Vec<(u32, mirror_usage::NodeUsage)>,
    stage: &str,
) -> Result<R, placement::StageError> {
    update_usage(generation, usage).map_err(placement::StageError::OutOfStep)?;
    not_listed(stage).map_err(placement::StageError::Failed)
}

/// `select-devices.select-devices`.
pub fn select_devices(
    task: wit::Task,
    node: u32,
) -> Result<Result<Vec<select_devices::DeviceShare>, wit::Rejection>, String> {
    let task: Task = convert::task(task);
    with_plugin(|p, nodes, generation| {
        let d = p.as_select_devices().ok_or_else(|| not_implemented("select-devices"))?;
        let node = resolve(nodes, &[node], generation)?[0];
        Ok(match d.select_devices(&task, node) {
            Ok(shares) => {
                Ok(shares.into_iter().map(|s| select_devices::DeviceShare { gpu: s.gpu, milli: s.milli }).collect())
            }
            Err(r) => Err(convert::rejection(r)),
        })
    })
}

/// `select-claim-devices.rank`: the plugin's order, or none (an empty list) when it does not rank.
pub fn rank_claim_devices(
    task: wit::Task,
    node: u32,
    request: select_claim_devices::ClaimRequest,
) -> Result<Vec<u32>, String> {
    use select_claim_devices::AttributeValue as W;
    let task: Task = convert::task(task);
    let request = wasmsched_api::ClaimRequest {
        name: request.name,
        count: request.count,
        candidates: request
            .candidates
            .into_iter()
            .map(|d| wasmsched_api::ClaimDevice {
                id: d.id,
                attributes: d
                    .attributes
                    .into_iter()
                    .map(|(k, v)| {
                        let v = match v {
                            W::Boolean(b) => wasmsched_api::AttributeValue::Bool(b),
                            W::Integer(i) => wasmsched_api::AttributeValue::Int(i),
                            W::Text(t) => wasmsched_api::AttributeValue::String(t),
                            W::Version(v) => wasmsched_api::AttributeValue::Version(v),
                        };
                        (k, v)
                    })
                    .collect(),
                capacity: d.capacity,
            })
            .collect(),
    };
    with_plugin(|p, nodes, generation| {
        let Some(r) = p.as_rank_claim_devices() else { return Ok(Vec::new()) };
        let node = resolve(nodes, &[node], generation)?[0];
        Ok(r.rank_claim_devices(&task, node, &request))
    })
}

/// `preempt.select-victims`.
pub fn select_victims(
    preemptor: wit::Task,
    candidates: Vec<preempt::Candidate>,
) -> Result<Option<preempt::Preemption>, String> {
    let preemptor = convert::task(preemptor);
    let candidates: Vec<_> = candidates.into_iter().map(convert::candidate).collect();
    with_plugin(|p, nodes, generation| {
        let pr = p.as_preempt().ok_or_else(|| not_implemented("preempt"))?;
        let slots: Vec<u32> = candidates.iter().map(|c| c.node).collect();
        let nodes = resolve(nodes, &slots, generation)?;
        Ok(pr
            .select_victims(&preemptor, &candidates, &nodes)
            .map(|x| preempt::Preemption { candidate: x.candidate, victims: x.victims }))
    })
}

/// `fair-share.compute`.
pub fn compute(
    queues: Vec<fair_share::QueueState>,
    cluster: wit::Resources,
) -> Result<fair_share::ShareDecision, String> {
    let queues: Vec<_> = queues.into_iter().map(convert::queue).collect();
    let cluster = convert::resources(cluster);
    with_plugin(|p, _, _| {
        let fs = p.as_fair_share().ok_or_else(|| not_implemented("fair-share"))?;
        let d = fs.compute(&queues, &cluster)?;
        Ok(fair_share::ShareDecision {
            deserved: d.deserved.into_iter().map(convert::resources_out).collect(),
            order: d.order,
        })
    })
}

/// `fair-share-delta.compute-changed`: apply the changed states, compute over all of them, answer
/// the shares that differ from the last answer. Any inconsistency is an error, after which the
/// host resets.
pub fn compute_changed(
    reset: bool,
    count: u32,
    changed: Vec<(u32, fair_share::QueueState)>,
    cluster: wit::Resources,
) -> Result<fair_share_delta::ShareDelta, String> {
    let cluster = convert::resources(cluster);
    STATE.with_borrow_mut(|s| {
        let State { plugin, queues, received, deserved: last, .. } = s;
        let fs = plugin.as_deref_mut().ok_or("plugin called before init")?;
        let fs = fs.as_fair_share().ok_or_else(|| not_implemented("fair-share"))?;
        if reset {
            queues.clear();
            received.clear();
            last.clear();
        }
        let count = count as usize;
        queues.resize_with(count, Default::default);
        received.resize(count, false);
        for (i, q) in changed {
            let at = i as usize;
            if at >= count {
                return Err(format!("queue {i} of {count} changed"));
            }
            queues[at] = convert::queue(q);
            received[at] = true;
        }
        if let Some(i) = received.iter().position(|r| !r) {
            return Err(format!("queue {i} was never sent"));
        }
        let d = fs.compute(queues, &cluster)?;
        let deserved = d
            .deserved
            .iter()
            .enumerate()
            .filter(|&(i, r)| last.get(i) != Some(r))
            .map(|(i, r)| (i as u32, convert::resources_out(r.clone())))
            .collect();
        *last = d.deserved;
        Ok(fair_share_delta::ShareDelta { deserved, order: d.order })
    })
}

/// The two placement interfaces' guest traits differ only in the task's type (the whole task, or
/// the brief one with its counted resources): one body serves both.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_placement {
    ($ty:ty : [$($stage:ident)+] $task:ident :: $task_ty:ident => $iface:ident) => {
        impl $crate::__private::$iface::Guest for __WasmschedComponent {
            fn filter(
                generation: u64,
                usage: Vec<(u32, $crate::__private::mirror_usage::NodeUsage)>,
                task: $crate::__private::$task::$task_ty,
                candidates: Vec<u32>,
                enough: Option<u32>,
            ) -> Result<$crate::__private::filter::FilterResult, $crate::__private::placement::StageError> {
                $crate::__if_stage!(filter [$($stage)+] {
                    $crate::__private::placement_filter::<$ty>(generation, usage, task, candidates, enough)
                } else {
                    {
                        let _ = (task, candidates, enough);
                        $crate::__private::placement_not_listed(generation, usage, "filter")
                    }
                })
            }
            fn score(
                generation: u64,
                usage: Vec<(u32, $crate::__private::mirror_usage::NodeUsage)>,
                task: $crate::__private::$task::$task_ty,
                candidates: Vec<u32>,
            ) -> Result<Vec<u32>, $crate::__private::placement::StageError> {
                $crate::__if_stage!(score [$($stage)+] {
                    $crate::__private::placement_score::<$ty>(generation, usage, task, candidates)
                } else {
                    {
                        let _ = (task, candidates);
                        $crate::__private::placement_not_listed(generation, usage, "score")
                    }
                })
            }
        }
    };
}

/// Implements the generated guest traits for the macro's local type by delegating to the functions
/// above, then exports it.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_component {
    ($ty:ty : $($stage:ident),+) => {
        const _: () = {
            use $crate::__private as __p;
            struct __WasmschedComponent;
            impl __p::plugin::Guest for __WasmschedComponent {
                fn init(config: String) -> Result<__p::plugin::PluginInfo, String> {
                    __p::init::<$ty>(config)
                }
            }
            impl __p::mirror::Guest for __WasmschedComponent {
                fn reset(generation: u64, slots: u32) {
                    __p::reset(generation, slots)
                }
                fn upsert(generation: u64, nodes: Vec<(u32, __p::bindings::wasmsched::policy::types::Node)>) {
                    __p::upsert(generation, nodes)
                }
                fn remove(generation: u64, slots: Vec<u32>) {
                    __p::remove(generation, slots)
                }
            }
            impl __p::mirror_usage::Guest for __WasmschedComponent {
                fn update_usage(generation: u64, nodes: Vec<(u32, __p::mirror_usage::NodeUsage)>) -> Result<(), String> {
                    __p::update_usage(generation, nodes)
                }
            }
            impl __p::filter::Guest for __WasmschedComponent {
                fn filter(
                    task: __p::bindings::wasmsched::policy::types::Task,
                    candidates: Vec<u32>,
                ) -> Result<__p::filter::FilterResult, String> {
                    $crate::__if_stage!(filter [$($stage)+] {
                        __p::filter_static::<$ty>(task, candidates)
                    } else {
                        {
                            let _ = (task, candidates);
                            __p::not_listed("filter")
                        }
                    })
                }
            }
            impl __p::score::Guest for __WasmschedComponent {
                fn score(task: __p::bindings::wasmsched::policy::types::Task, candidates: Vec<u32>) -> Result<Vec<u32>, String> {
                    $crate::__if_stage!(score [$($stage)+] {
                        __p::score_static::<$ty>(task, candidates)
                    } else {
                        {
                            let _ = (task, candidates);
                            __p::not_listed("score")
                        }
                    })
                }
            }
            $crate::__export_placement!($ty : [$($stage)+] placement::StageTask => placement);
            $crate::__export_placement!($ty : [$($stage)+] placement_counted::CountedStageTask => placement_counted);
            impl __p::select_devices::Guest for __WasmschedComponent {
                fn select_devices(
                    task: __p::bindings::wasmsched::policy::types::Task,
                    node: u32,
                ) -> Result<Result<Vec<__p::select_devices::DeviceShare>, __p::bindings::wasmsched::policy::types::Rejection>, String> {
                    __p::select_devices(task, node)
                }
            }
            impl __p::select_claim_devices::Guest for __WasmschedComponent {
                fn rank(
                    task: __p::bindings::wasmsched::policy::types::Task,
                    node: u32,
                    request: __p::select_claim_devices::ClaimRequest,
                ) -> Result<Vec<u32>, String> {
                    __p::rank_claim_devices(task, node, request)
                }
            }
            impl __p::preempt::Guest for __WasmschedComponent {
                fn select_victims(
                    preemptor: __p::bindings::wasmsched::policy::types::Task,
                    candidates: Vec<__p::preempt::Candidate>,
                ) -> Result<Option<__p::preempt::Preemption>, String> {
                    __p::select_victims(preemptor, candidates)
                }
            }
            impl __p::fair_share::Guest for __WasmschedComponent {
                fn compute(
                    queues: Vec<__p::fair_share::QueueState>,
                    cluster: __p::bindings::wasmsched::policy::types::Resources,
                ) -> Result<__p::fair_share::ShareDecision, String> {
                    __p::compute(queues, cluster)
                }
            }
            impl __p::fair_share_delta::Guest for __WasmschedComponent {
                fn compute_changed(
                    reset: bool,
                    count: u32,
                    changed: Vec<(u32, __p::fair_share::QueueState)>,
                    cluster: __p::bindings::wasmsched::policy::types::Resources,
                ) -> Result<__p::fair_share_delta::ShareDelta, String> {
                    __p::compute_changed(reset, count, changed, cluster)
                }
            }
            $crate::__private::bindings::__export_policy!(__WasmschedComponent with_types_in $crate::__private::bindings);
        };
    };
}
