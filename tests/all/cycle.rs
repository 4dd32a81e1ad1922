//! The scheduling cycle with its policies as Wasm components: it decides exactly as with the same
//! policies linked natively (a churn of gangs, elastic jobs, quotas, reclaim and checkpointing
//! preemption), and a hostile preempt plugin never makes the host evict anything or lose work.

use std::sync::Arc;

use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources, Stage, Task};
use wasmsched_core::{
    CoreConfig, Decision, FaultKind, NativePlugin, Phase, PolicyPlugin, PolicySet, QueueSpec, QueueTree, SchedulerCore,
    Workload,
};
use wasmsched_plugin_allocation_score::AllocationScore;
use wasmsched_plugin_fair_share::FairSharePolicy;
use wasmsched_plugin_priority_preempt::PriorityPreempt;
use wasmsched_plugin_resource_fit::ResourceFit;
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::Rng;

fn node(name: &str, gpus: u32) -> Node {
    Node {
        name: name.into(),
        allocatable: Resources {
            cpu_milli: 64_000,
            memory_bytes: 512 << 30,
            gpu_milli: u64::from(gpus) * 1000,
            extended: Default::default(),
        },
        gpus: (0..gpus).map(|i| GpuDevice { index: i, free_milli: 1000, ..Default::default() }).collect(),
        ..Default::default()
    }
}

fn gang(name: &str, queue: &str, priority: i32, members: usize, min: usize, gpus: u32) -> Workload {
    let tasks = (0..members)
        .map(|i| Task {
            id: format!("{name}-{i}"),
            request: Resources { cpu_milli: 1000, memory_bytes: 1 << 30, ..Default::default() },
            gpu: GpuRequest { count: gpus, milli_per_gpu: 1000, ..Default::default() },
            ..Default::default()
        })
        .collect();
    Workload::gang(name, queue, priority, tasks, min)
}

fn queues() -> QueueTree {
    let unlimited = Resources { cpu_milli: u64::MAX / 4, memory_bytes: u64::MAX / 4, ..Default::default() };
    QueueTree::new([
        QueueSpec { name: "org".into(), weight: 1, ..Default::default() },
        QueueSpec {
            name: "research".into(),
            parent: Some("org".into()),
            weight: 1,
            reclaimable: true,
            capability: Some(Resources { gpu_milli: 24_000, ..unlimited }),
            ..Default::default()
        },
        QueueSpec {
            name: "prod".into(),
            parent: Some("org".into()),
            weight: 3,
            guarantee: Resources { gpu_milli: 8000, ..Default::default() },
            reclaimable: true,
            ..Default::default()
        },
        QueueSpec { name: "batch".into(), weight: 1, reclaimable: true, ..Default::default() },
    ])
    .unwrap()
}

fn set(
    filter: Arc<dyn PolicyPlugin>,
    score: Arc<dyn PolicyPlugin>,
    fair: Arc<dyn PolicyPlugin>,
    preempt: Arc<dyn PolicyPlugin>,
) -> PolicySet {
    PolicySet::builder().filter(filter).score(score, 1).fair_share(fair).preempt(preempt).build()
}

fn native_set() -> PolicySet {
    set(
        Arc::new(NativePlugin::<ResourceFit>::new("", 1).unwrap()),
        Arc::new(NativePlugin::<AllocationScore>::new(r#"{"strategy":"most"}"#, 1).unwrap()),
        Arc::new(NativePlugin::<FairSharePolicy>::new("", 1).unwrap()),
        Arc::new(NativePlugin::<PriorityPreempt>::new(r#"{"min_runtime_seconds": 5}"#, 1).unwrap()),
    )
}

fn wasm_set(rt: &Runtime, preempt: Arc<dyn PolicyPlugin>) -> PolicySet {
    let load = |b: wasmsched_plugins::BuiltIn, config: &str| -> Arc<dyn PolicyPlugin> {
        Arc::new(rt.load(b.wasm, crate::unhurried(b.name).with_config(config)).unwrap())
    };
    set(
        load(wasmsched_plugins::RESOURCE_FIT, ""),
        load(wasmsched_plugins::MOST_ALLOCATED, r#"{"strategy":"most"}"#),
        load(wasmsched_plugins::PROPORTION, ""),
        preempt,
    )
}

/// A deterministic churn; returns every decision, in order, as text.
fn churn(set: &PolicySet, seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut core = SchedulerCore::new(queues(), CoreConfig::default());
    for i in 0..8 {
        core.upsert_node(node(&format!("n{i}"), [4, 8][i % 2]), 0);
    }
    let mut log = Vec::new();
    let mut n = 0;
    for t in 0..300u64 {
        if rng.percent(35) {
            let queue = ["research", "prod", "batch"][rng.below(3) as usize];
            let members = 1 + rng.below(4) as usize;
            let mut w = gang(
                &format!("w{n}"),
                queue,
                rng.below(4) as i32,
                members,
                1 + rng.below(members as u64) as usize,
                [1, 2, 4][rng.below(3) as usize],
            );
            w.checkpointable = rng.percent(50);
            w.grace_seconds = Some(1 + rng.below(4));
            core.submit(w, t).unwrap();
            n += 1;
        }
        if rng.percent(20) {
            let running = core.workloads_in(Phase::Running);
            if !running.is_empty() {
                let done = running[rng.below(running.len() as u64) as usize].to_string();
                core.finish(&done).unwrap();
                log.push(format!("t={t} finished {done}"));
            }
        }
        for d in core.schedule(set, t) {
            log.push(format!("t={t} {d:?}"));
        }
    }
    log
}

/// Every decision of whole churns with `preempt` (and the other built-ins as components) equals the
/// native build's, for two seeds that evict and checkpoint.
fn assert_decides_as_native(rt: &Runtime, preempt: Arc<dyn PolicyPlugin>) {
    let wasm = wasm_set(rt, preempt);
    for seed in [3, 17] {
        let native_log = churn(&native_set(), seed);
        let wasm_log = churn(&wasm, seed);
        let evictions = native_log.iter().filter(|l| l.contains("Evicted")).count();
        assert!(evictions > 5, "seed {seed}: the churn must exercise preemption ({evictions} evictions)");
        assert!(native_log.iter().any(|l| l.contains("PreemptionRequested")), "and checkpoints");
        if let Some(i) = (0..native_log.len().min(wasm_log.len())).find(|&i| native_log[i] != wasm_log[i]) {
            panic!("seed {seed}: decision {i} differs\nnative: {}\nwasm:   {}", native_log[i], wasm_log[i]);
        }
        assert_eq!(native_log.len(), wasm_log.len());
    }
}

#[test]
fn wasm_policies_decide_exactly_as_native_ones_through_whole_cycles() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let preempt = wasmsched_plugins::PRIORITY_PREEMPT;
    let wasm_preempt = Arc::new(
        rt.load(preempt.wasm, crate::unhurried(preempt.name).with_config(r#"{"min_runtime_seconds": 5}"#)).unwrap(),
    );
    assert_decides_as_native(&rt, wasm_preempt);
}

/// `examples/plugins/priority-preempt-py`, the built-in preempt policy written in Python, makes
/// every decision the native build makes through whole cycles of gangs, checkpoints and evictions.
#[test]
fn the_python_priority_preempt_decides_exactly_as_the_built_in_through_whole_cycles() {
    let rt = crate::python::rt();
    let component = wasmsched_tests::python::component(
        &wasmsched_tests::python::root().join("examples/plugins/priority-preempt-py"),
    );
    let python: Arc<dyn PolicyPlugin> = Arc::new(
        rt.load(
            &std::fs::read(component).unwrap(),
            crate::unhurried("priority-preempt").with_config(r#"{"min_runtime_seconds": 5}"#),
        )
        .unwrap(),
    );
    assert_eq!(python.stages(), [Stage::Preempt]);
    assert_decides_as_native(rt, python);
}

/// The same with `examples/plugins/priority-preempt-js`, the built-in preempt policy in JavaScript.
#[test]
fn the_javascript_priority_preempt_decides_exactly_as_the_built_in_through_whole_cycles() {
    let rt = crate::python::rt();
    let component =
        wasmsched_tests::javascript::component(&wasmsched_tests::root().join("examples/plugins/priority-preempt-js"));
    let js: Arc<dyn PolicyPlugin> = Arc::new(
        rt.load(
            &std::fs::read(component).unwrap(),
            crate::unhurried("priority-preempt")
                .with_config(r#"{"min_runtime_seconds": 5}"#)
                .with_memory_limit(256 << 20),
        )
        .unwrap(),
    );
    assert_eq!(js.stages(), [Stage::Preempt]);
    assert_decides_as_native(rt, js);
}

#[test]
fn a_hostile_preempt_plugin_evicts_nothing_and_loses_nothing() {
    let (rt, faults) = crate::runtime_with_faults(RuntimeConfig::default());
    for mode in ["bad-victims", "useless-victims", "loop", "memory", "panic"] {
        let hostile: Arc<dyn PolicyPlugin> = Arc::new(if mode == "loop" {
            rt.load(
                &wasmsched_tests::fixtures::read(wasmsched_tests::fixtures::HOSTILE),
                wasmsched_runtime::PluginConfig::new("hostile-loop")
                    .with_config(mode)
                    .with_deadline(std::time::Duration::from_millis(50)),
            )
            .unwrap()
        } else {
            crate::hostile(&rt, mode)
        });
        let set = wasm_set(&rt, hostile);
        let mut core = SchedulerCore::new(queues(), CoreConfig::default());
        core.upsert_node(node("n0", 8), 0);
        core.submit(gang("victim", "batch", 0, 1, 1, 8), 0).unwrap();
        assert!(core.schedule(&set, 0).iter().any(|d| matches!(d, Decision::Bound { .. })));
        core.submit(gang("evil", "batch", 10, 1, 1, 8), 10).unwrap();
        let d = core.schedule(&set, 10);
        assert!(
            !d.iter().any(|d| matches!(d, Decision::Evicted { .. } | Decision::PreemptionRequested { .. })),
            "{mode}: {d:?}"
        );
        assert_eq!(core.status("victim").unwrap().phase, Phase::Running, "{mode}");
        assert_eq!(core.status("evil").unwrap().phase, Phase::Pending, "{mode}");
        let why = core.explain("evil").unwrap().to_string();
        assert!(why.contains("preemption:"), "{mode}: {why}");
        assert_eq!(core.nodes().get(0).unwrap().allocated.gpu_milli, 8000, "{mode}: accounting intact");
        // The host still works: the victim finishes and the hostile plugin's preemptor runs.
        core.finish("victim").unwrap();
        let d = core.schedule(&set, 20);
        assert!(d.iter().any(|d| matches!(d, Decision::Bound { workload, .. } if workload == "evil")), "{mode}: {d:?}");
    }
    let seen = faults.lock().unwrap();
    for kind in [FaultKind::BadOutput, FaultKind::Deadline, FaultKind::Memory, FaultKind::Trap] {
        assert!(seen.iter().any(|f| f.kind == kind && f.stage == Stage::Preempt), "no {kind:?} fault among {seen:?}");
    }
}
