//! Runtime mechanics: garbage from raw bindings, failure policies, circuit breaker, artifact cache.

use std::sync::Arc;

use wasmsched_api::{
    GpuDevice, GpuRequest, Node, NodeSelectorTerm, PreferredTerm, QueueState, Resources, Stage, Task, Toleration,
    TolerationOperator,
};
use wasmsched_core::{CallContext, FailurePolicy, FaultKind, NodeTable, PolicyPlugin, PolicySet, place};
use wasmsched_runtime::{BreakerConfig, Runtime, RuntimeConfig};
use wasmsched_tests::fixtures;

fn gpu_nodes(n: usize) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        t.upsert(Node {
            name: format!("n{i}"),
            allocatable: Resources {
                cpu_milli: 8000,
                memory_bytes: 1 << 36,
                gpu_milli: 1000,
                extended: Default::default(),
            },
            gpus: vec![GpuDevice { index: 0, free_milli: 1000, ..Default::default() }].into(),
            ..Default::default()
        });
    }
    t
}

fn gpu_task(id: &str) -> Task {
    Task {
        id: id.into(),
        gpu: GpuRequest { count: 1, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    }
}

/// Runtimes that call a component's `placement` export (the default) and that ignore it: the raw
/// fixture answers the same garbage through both.
fn both_call_paths() -> [Runtime; 2] {
    [true, false].map(|placement_calls| Runtime::new(RuntimeConfig { placement_calls, ..Default::default() }).unwrap())
}

#[test]
fn garbage_from_raw_bindings_is_bad_output() {
    for rt in both_call_paths() {
        garbage_is_bad_output(&rt);
    }
}

fn garbage_is_bad_output(rt: &Runtime) {
    let table = gpu_nodes(4);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    for (mode, stage, needle) in [
        ("short", Stage::Filter, "2 verdicts for 4 candidates"),
        ("bad-code", Stage::Filter, "verdict code 7"),
        ("any", Stage::Score, "7 scores for 4 candidates"),
        ("any", Stage::SelectDevices, "GPU 99 does not exist"),
        ("delta-out-of-range", Stage::FairShare, "share for queue 2 (of 2), out of range"),
        ("delta-missing", Stage::FairShare, "answered no share for queue 0"),
    ] {
        let p = rt.load(&fixtures::read(fixtures::RAW_GARBAGE), crate::unhurried("raw").with_config(mode)).unwrap();
        assert_eq!(p.sdk_version(), "raw-bindings");
        let fault = match stage {
            Stage::Filter => p.filter(ctx, &gpu_task("t"), &slots).map(|_| ()).unwrap_err(),
            Stage::Score => p.score(ctx, &gpu_task("t"), &slots).map(|_| ()).unwrap_err(),
            Stage::FairShare => {
                let queues = [
                    QueueState { name: "a".into(), weight: 1, ..Default::default() },
                    QueueState { name: "b".into(), weight: 1, ..Default::default() },
                ];
                p.fair_share(0, &queues, &Resources::default()).map(|_| ()).unwrap_err()
            }
            _ => p.select_devices(ctx, &gpu_task("t"), 0).map(|_| ()).unwrap_err(),
        };
        assert_eq!(fault.kind, FaultKind::BadOutput, "{mode}: {fault}");
        assert!(fault.message.contains(needle), "{mode}: {}", fault.message);
        assert_eq!(p.metrics().instances_discarded(), 1);
    }
}

#[test]
fn usage_changes_reach_mirrors_alone_a_refusal_resends_everything_and_older_components_get_upserts() {
    for rt in both_call_paths() {
        usage_changes_reach_mirrors(&rt);
    }
}

fn usage_changes_reach_mirrors(rt: &Runtime) {
    let mut table = gpu_nodes(3);
    let slots: Vec<u32> = table.slots().collect();
    let fits = |p: &dyn PolicyPlugin, table: &NodeTable| -> Vec<bool> {
        let batch = p.filter(CallContext { worker: 0, nodes: table }, &gpu_task("t"), &slots).unwrap();
        batch.codes.iter().map(|c| *c == 0).collect()
    };
    // The SDK's mirror applies usage updates: resource-fit sees a device taken and given back.
    let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
    assert_eq!(fits(&fit, &table), [true, true, true]);
    let g = table.generation();
    table.update_usage(slots[1], |n| n.gpus.update(|g| g[0].free_milli = 0));
    assert!(
        matches!(table.changes_since(table.id(), g), wasmsched_core::Changes::Delta { ref usage, .. } if usage == &[slots[1]])
    );
    assert_eq!(fits(&fit, &table), [true, false, true]);
    table.update_usage(slots[1], |n| n.gpus.update(|g| g[0].free_milli = 1000));
    assert_eq!(fits(&fit, &table), [true, true, true]);
    // A mirror that refuses (and forgets what it held) is sent every node again, without a fault.
    let raw =
        rt.load(&fixtures::read(fixtures::RAW_GARBAGE), crate::unhurried("raw").with_config("usage-refused")).unwrap();
    assert_eq!(fits(&raw, &table), [true, true, true]);
    table.update_usage(slots[2], |n| n.gpus.update(|g| g[0].free_milli = 500));
    assert_eq!(fits(&raw, &table), [true, true, true], "every node resent after the refusal");
    assert_eq!(raw.metrics().instances_discarded(), 0);
    // A component without the optional export gets usage changes as full upserts.
    let legacy = rt.load(&fixtures::read(fixtures::LEGACY_MIRROR), crate::unhurried("legacy")).unwrap();
    table.update_usage(slots[2], |n| n.gpus.update(|g| g[0].free_milli = 1000));
    assert_eq!(fits(&legacy, &table), [true, true, true]);
    table.update_usage(slots[0], |n| n.gpus.update(|g| g[0].free_milli = 0));
    assert_eq!(fits(&legacy, &table), [false, true, true], "the taken device reached the legacy mirror");
    assert_eq!(legacy.metrics().instances_discarded(), 0);
    // Without `fair-share-delta` it is sent every queue each time: its answers follow every change.
    let gpus = |milli| Resources { gpu_milli: milli, ..Default::default() };
    let mut queues: Vec<QueueState> = (0..3)
        .map(|i| QueueState { name: format!("q{i}"), weight: 1, request: gpus(1000 * i), ..Default::default() })
        .collect();
    for step in 0..3u64 {
        queues[1].request = gpus(7 + step);
        queues.push(QueueState { name: format!("late{step}"), weight: 1, request: gpus(step), ..Default::default() });
        let d = legacy.fair_share(0, &queues, &Resources::default()).unwrap();
        assert_eq!(d.deserved, queues.iter().map(|q| q.request.clone()).collect::<Vec<_>>(), "step {step}");
    }
}

#[test]
fn placement_sends_a_task_brief_only_when_every_list_is_empty() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = gpu_nodes(2);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    // The fixture's `placement.filter` fails for a brief task and passes a full one.
    let raw = rt
        .load(&fixtures::read(fixtures::RAW_GARBAGE), crate::unhurried("raw").with_config("brief-task-error"))
        .unwrap();
    let fault = raw.filter(ctx, &gpu_task("t"), &slots).unwrap_err();
    assert_eq!(fault.kind, FaultKind::GuestError);
    assert!(fault.message.contains("the task came brief"), "{fault}");
    let one_list_each: [fn(&mut Task); 6] = [
        |t| t.request.extended = vec![("rdma/hca".into(), 1)].into(),
        |t| t.gpu.models = vec!["H100".into()],
        |t| t.node_selector = vec![("zone".into(), "a".into())],
        |t| t.node_affinity.required = vec![NodeSelectorTerm::default()],
        |t| t.node_affinity.preferred = vec![PreferredTerm { weight: 1, preference: NodeSelectorTerm::default() }],
        |t| t.tolerations = vec![Toleration { operator: TolerationOperator::Exists, ..Default::default() }],
    ];
    for (i, set) in one_list_each.iter().enumerate() {
        let mut task = gpu_task("t");
        set(&mut task);
        assert!(raw.filter(ctx, &task, &slots).is_ok(), "list {i} set: the task goes in full");
    }
    // Host-only fields are never sent, so they do not make a task full.
    let mut labelled = gpu_task("t");
    labelled.labels = vec![("app".into(), "x".into())];
    assert!(raw.filter(ctx, &labelled, &slots).is_err());
    // A runtime that ignores `placement` calls the plain export, which has no such mode.
    let plain = Runtime::new(RuntimeConfig { placement_calls: false, ..Default::default() }).unwrap();
    let raw = plain
        .load(&fixtures::read(fixtures::RAW_GARBAGE), crate::unhurried("raw").with_config("brief-task-error"))
        .unwrap();
    assert!(raw.filter(ctx, &gpu_task("t"), &slots).is_ok());
}

#[test]
fn a_filter_may_stop_at_enough_fits_only() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = gpu_nodes(6);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    // The SDK's filter stops at the 2nd fit of 6 fitting nodes.
    let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
    assert_eq!(fit.filter_until(ctx, &gpu_task("t"), &slots, 2).unwrap().codes, [0, 0]);
    assert_eq!(fit.filter_until(ctx, &gpu_task("t"), &slots, 6).unwrap().codes, [0; 6]);
    // One that stops a fit short has given a wrong answer.
    let raw =
        rt.load(&fixtures::read(fixtures::RAW_GARBAGE), crate::unhurried("raw").with_config("stops-short")).unwrap();
    let fault = raw.filter_until(ctx, &gpu_task("t"), &slots, 3).unwrap_err();
    assert_eq!(fault.kind, FaultKind::BadOutput);
    assert!(
        fault.message.contains("2 verdicts for 6 candidates (stopping is allowed only at fit 3; 2 fit)"),
        "{fault}"
    );
}

#[test]
fn many_usage_changes_at_once_all_reach_the_mirror() {
    // More changed nodes than go along with one `placement` call: the rest go in `mirror-usage`
    // calls first. Either way the filter sees every change.
    for rt in both_call_paths() {
        let mut table = gpu_nodes(150);
        let slots: Vec<u32> = table.slots().collect();
        let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
        let fits = |table: &NodeTable| -> usize {
            let batch = fit.filter(CallContext { worker: 0, nodes: table }, &gpu_task("t"), &slots).unwrap();
            batch.codes.iter().filter(|c| **c == 0).count()
        };
        assert_eq!(fits(&table), 150);
        for &s in &slots[..120] {
            table.update_usage(s, |n| n.gpus.update(|g| g[0].free_milli = 0));
        }
        assert_eq!(fits(&table), 30);
        for &s in &slots[..3] {
            table.update_usage(s, |n| n.gpus.update(|g| g[0].free_milli = 1000));
        }
        assert_eq!(fits(&table), 33);
        assert_eq!(fit.metrics().instances_discarded(), 0);
    }
}

/// A fresh instance's copy of the nodes (reset, then upserts) gets ten deadlines per mirror call,
/// as the README says, and no more: a guest whose reset or upsert never returns is cut at ten
/// times its 10 ms deadline, its instance discarded, and the host goes on.
#[test]
fn a_mirror_call_that_never_returns_is_cut_at_ten_deadlines() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = gpu_nodes(4);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    for mode in ["reset-loop", "upsert-loop"] {
        let p = rt
            .load(&fixtures::read(fixtures::RAW_GARBAGE), wasmsched_runtime::PluginConfig::new(mode).with_config(mode))
            .unwrap();
        let fault = p.filter(ctx, &gpu_task("t"), &slots).map(|_| ()).unwrap_err();
        assert_eq!(fault.kind, FaultKind::Deadline, "{mode}: {fault}");
        assert!(fault.message.contains("over its 100ms budget"), "{mode}: {}", fault.message);
        assert_eq!(p.metrics().instances_discarded(), 1, "{mode}");
    }
}

#[test]
fn not_implemented_stage_is_a_fault_not_a_crash() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
    let table = gpu_nodes(1);
    let f = fit.score(CallContext { worker: 0, nodes: &table }, &gpu_task("t"), &[0]).unwrap_err();
    assert_eq!(f.kind, FaultKind::NotImplemented);
}

#[test]
fn fail_closed_blocks_the_task_and_fail_open_skips_the_plugin() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let table = gpu_nodes(3);
    let load = |failure| {
        Arc::new(
            rt.load(
                &fixtures::read(fixtures::HOSTILE),
                crate::unhurried("hostile-panic").with_config("panic").with_failure_policy(failure),
            )
            .unwrap(),
        )
    };
    let closed = PolicySet::builder().filter(load(FailurePolicy::FailClosed)).build();
    let err = place(&closed, &table, &gpu_task("evil"), 0).unwrap_err();
    assert_eq!(err.diagnosis.faults.len(), 1);
    assert!(err.to_string().contains("hostile-panic"), "{err}");

    let open = PolicySet::builder().filter(load(FailurePolicy::FailOpen)).build();
    let placed = place(&open, &table, &gpu_task("evil"), 0).expect("fail-open skips the plugin");
    assert_eq!(placed.skipped_faults.len(), 1);
    assert_eq!(placed.node, 0, "ties go to the lowest slot");
}

#[test]
fn circuit_breaker_opens_after_repeated_failures_and_recovers() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let p = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            crate::unhurried("flaky")
                .with_config("panic")
                .with_breaker(BreakerConfig { threshold: 3, cooldown_calls: 4 }),
        )
        .unwrap();
    let table = gpu_nodes(1);
    let ctx = CallContext { worker: 0, nodes: &table };
    for _ in 0..3 {
        assert_eq!(p.filter(ctx, &gpu_task("evil"), &[0]).unwrap_err().kind, FaultKind::Trap);
    }
    for _ in 0..4 {
        assert_eq!(p.filter(ctx, &gpu_task("fine"), &[0]).unwrap_err().kind, FaultKind::CircuitOpen);
    }
    assert!(p.filter(ctx, &gpu_task("fine"), &[0]).is_ok(), "half-open trial succeeds and closes");
    assert_eq!(p.metrics().faults(FaultKind::CircuitOpen), 4);
}

#[test]
fn compiled_artifacts_are_cached_on_disk_and_verified() {
    let dir = std::env::temp_dir().join(format!("wasmsched-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = RuntimeConfig { cache_dir: Some(dir.clone()), ..Default::default() };
    let wasm = wasmsched_plugins::RESOURCE_FIT.wasm;
    Runtime::new(cfg.clone()).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    let artifact = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("artifact written");
    // A second runtime loads from disk; a corrupted artifact is detected and rebuilt.
    Runtime::new(cfg.clone()).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();
    let p = Runtime::new(cfg).unwrap().load(wasm, crate::unhurried("fit")).expect("rebuilt after corruption");
    let table = gpu_nodes(1);
    assert_eq!(p.filter(CallContext { worker: 0, nodes: &table }, &gpu_task("t"), &[0]).unwrap().codes, vec![0]);
    assert_ne!(std::fs::read(&artifact).unwrap(), bytes, "the corrupt artifact was replaced");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `deadlines: false` exists to measure what epoch checks cost (`bench --compare-deadlines`): the
/// plugin must answer exactly as with deadlines, and its artifact, compiled without the checks,
/// must never be handed to a runtime that relies on them (nor the reverse) through a shared cache.
#[test]
fn a_runtime_without_deadlines_answers_the_same_and_keeps_its_own_artifacts() {
    let dir = std::env::temp_dir().join(format!("wasmsched-deadline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let wasm = wasmsched_plugins::RESOURCE_FIT.wasm;
    let artifacts = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "cwasm"))
            .count()
    };
    let bounded = RuntimeConfig { cache_dir: Some(dir.clone()), ..Default::default() };
    let unbounded = RuntimeConfig { deadlines: false, ..bounded.clone() };
    let with = Runtime::new(bounded.clone()).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    assert_eq!(artifacts(), 1);
    let without = Runtime::new(unbounded.clone()).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    assert_eq!(artifacts(), 2, "compiled anew, not the artifact with epoch checks");
    // Each kind reloads its own artifact from disk: no third one appears.
    Runtime::new(unbounded).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    Runtime::new(bounded).unwrap().load(wasm, crate::unhurried("fit")).unwrap();
    assert_eq!(artifacts(), 2);

    let mut table = gpu_nodes(3);
    let slots: Vec<u32> = table.slots().collect();
    let busy = slots[1];
    table.update_usage(busy, |n| n.gpus.update(|g| g[0].free_milli = 0));
    let ctx = CallContext { worker: 0, nodes: &table };
    let (a, b) =
        (with.filter(ctx, &gpu_task("t"), &slots).unwrap(), without.filter(ctx, &gpu_task("t"), &slots).unwrap());
    assert_eq!(a, b);
    assert_eq!(a.codes.iter().filter(|&&c| c != 0).count(), 1, "the busy node is rejected: {a:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zero_workers_is_a_configuration_error() {
    let e = Runtime::new(RuntimeConfig { workers: 0, ..Default::default() }).err().expect("refused");
    assert!(e.to_string().contains("workers"), "{e}");
}

#[test]
fn plugins_see_no_environment_files_or_clock() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let p = rt.load(&fixtures::read(fixtures::HOSTILE), crate::unhurried("probe").with_config("probe")).unwrap();
    let table = gpu_nodes(1);
    let batch = p.filter(CallContext { worker: 0, nodes: &table }, &gpu_task("evil"), &[0]).unwrap();
    assert_eq!(batch.reasons[0].reason, "env=0 args=0 file=false dir=false clock=0s tcp=false");
}

#[test]
fn prewarm_fills_every_worker_and_clear_empties_them() {
    let rt = Runtime::new(RuntimeConfig { workers: 3, ..Default::default() }).unwrap();
    let fit = rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("resource-fit")).unwrap();
    assert_eq!(fit.metrics().instances_created(), 1, "load initialises one instance");
    fit.prewarm().unwrap();
    assert_eq!(fit.metrics().instances_created(), 3);
    fit.prewarm().unwrap();
    assert_eq!(fit.metrics().instances_created(), 3, "prewarm only fills empty slots");
    fit.clear_instances();
    let table = gpu_nodes(2);
    for worker in 0..3 {
        assert_eq!(
            fit.filter(CallContext { worker, nodes: &table }, &gpu_task("t"), &[0, 1]).unwrap().codes,
            vec![0, 0]
        );
    }
    assert_eq!(fit.metrics().instances_created(), 6, "each worker re-created its instance and re-synced its mirror");
    let snapshot = fit.metrics().stage(Stage::Filter);
    assert_eq!((snapshot.calls, snapshot.latency.count), (3, 3));
    assert!(snapshot.latency.p99 >= snapshot.latency.p50 && snapshot.latency.mean > std::time::Duration::ZERO);
}

#[test]
fn a_plugin_stands_in_for_the_same_component_and_configuration_only_while_healthy() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let hostile = fixtures::read(fixtures::HOSTILE);
    let config = crate::unhurried("h").with_config("panic");
    let p = rt.load(&hostile, config.clone()).unwrap();
    let digest = p.digest().to_string();
    assert!(p.can_stand_in_for(&rt, &digest, &config));
    // Any difference in what would be loaded, or where, means loading it anew.
    let other_digest = wasmsched_registry::digest_of(wasmsched_plugins::RESOURCE_FIT.wasm);
    assert!(!p.can_stand_in_for(&rt, other_digest.trim_start_matches("sha256:"), &config));
    assert!(!p.can_stand_in_for(&rt, &digest, &config.clone().with_config("loop")));
    assert!(!p.can_stand_in_for(&rt, &digest, &config.clone().with_deadline(std::time::Duration::from_secs(3))));
    assert!(!p.can_stand_in_for(&rt, &digest, &config.clone().with_failure_policy(FailurePolicy::FailOpen)));
    assert!(!p.can_stand_in_for(&rt, &digest, &crate::unhurried("renamed").with_config("panic")));
    let elsewhere = Runtime::new(RuntimeConfig::default()).unwrap();
    assert!(!p.can_stand_in_for(&elsewhere, &digest, &config), "another engine");
    // A plugin that failed since its last success is not carried into a new version.
    let table = gpu_nodes(1);
    let ctx = CallContext { worker: 0, nodes: &table };
    assert_eq!(p.filter(ctx, &gpu_task("evil"), &[0]).unwrap_err().kind, FaultKind::Trap);
    assert!(!p.can_stand_in_for(&rt, &digest, &config));
    p.filter(ctx, &gpu_task("fine"), &[0]).unwrap();
    assert!(p.can_stand_in_for(&rt, &digest, &config));
}
