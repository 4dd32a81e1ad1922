//! Hostile plugins never crash or stall the host: each failure ends within the deadline plus a
//! small slack, names the plugin and stage, replaces the instance, and is recorded.

use std::time::{Duration, Instant};

use wasmsched_api::{Node, Stage, Task};
use wasmsched_core::{CallContext, FaultKind, NodeTable, PolicyPlugin};
use wasmsched_runtime::{PluginConfig, RuntimeConfig};
use wasmsched_tests::fixtures;

use crate::{hostile, runtime_with_faults};

fn nodes(n: usize) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        t.upsert(Node { name: format!("n{i}"), ..Default::default() });
    }
    t
}

fn task(id: &str) -> Task {
    Task { id: id.into(), ..Default::default() }
}

/// Slack over the deadline: one epoch tick plus scheduling noise on a loaded 2-core CI machine
/// running the whole suite in parallel. A stalled host would take seconds or forever; a bound a
/// few times the deadline still proves the call was cut, without failing on a busy machine.
const SLACK: Duration = Duration::from_millis(250);

/// Run the evil task through `stage`, assert the fault, then assert a benign call succeeds on a
/// fresh instance.
fn assert_contained(mode: &str, stage: Stage, kind: FaultKind, message_part: &str) {
    assert_contained_within(mode, stage, kind, message_part, Duration::from_millis(10));
}

/// As [`assert_contained`] with another deadline: faults that are not about time get a generous
/// one, so the budget under test (memory, stack, output checks) is what stops the call.
fn assert_contained_within(mode: &str, stage: Stage, kind: FaultKind, message_part: &str, deadline: Duration) {
    let (rt, seen) = runtime_with_faults(RuntimeConfig::default());
    let plugin = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            PluginConfig::new(format!("hostile-{mode}")).with_config(mode).with_deadline(deadline),
        )
        .unwrap();
    let table = nodes(4);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let call = |t: &Task| match stage {
        Stage::Filter => plugin.filter(ctx, t, &slots).map(|_| ()),
        Stage::Score => plugin.score(ctx, t, &slots).map(|_| ()),
        _ => unreachable!(),
    };

    let started = Instant::now();
    let fault = call(&task("evil-1")).expect_err("hostile call must fault");
    let elapsed = started.elapsed();
    assert!(elapsed < plugin.config().deadline + SLACK, "{mode}: took {elapsed:?}");
    assert_eq!(fault.kind, kind, "{mode}: {fault}");
    assert_eq!(fault.plugin, format!("hostile-{mode}"));
    assert_eq!(fault.stage, stage);
    assert!(fault.message.contains(message_part), "{mode}: message {:?} lacks {message_part:?}", fault.message);
    assert!(fault.to_string().contains(&format!("hostile-{mode}")) && fault.to_string().contains(stage.as_str()));

    let m = plugin.metrics();
    assert_eq!(m.faults(kind), 1);
    assert_eq!(m.instances_discarded(), 1);
    assert_eq!(seen.lock().unwrap().len(), 1, "observer saw the fault");

    call(&task("benign")).expect("a fresh instance serves the next call");
    assert_eq!(m.instances_created(), 2, "the failed instance was replaced");
    assert_eq!(m.stage(stage).calls, 2);
}

#[test]
fn infinite_loop_hits_the_deadline() {
    assert_contained("loop", Stage::Filter, FaultKind::Deadline, "deadline exceeded");
}

#[test]
fn memory_bomb_hits_the_cap() {
    assert_contained_within("memory", Stage::Filter, FaultKind::Memory, "memory limit", Duration::from_secs(2));
}

#[test]
fn deep_recursion_traps() {
    // Rust keeps large frames on a shadow stack in linear memory: overflowing it is an
    // out-of-bounds access; overflowing the native wasm stack is a stack-overflow trap.
    assert_contained_within("recurse", Stage::Filter, FaultKind::Trap, "wasm trap", Duration::from_secs(2));
}

#[test]
fn panic_traps_with_its_message() {
    assert_contained("panic", Stage::Filter, FaultKind::Trap, "hostile plugin panics on evil-1");
}

#[test]
fn huge_reason_is_bad_output() {
    assert_contained_within(
        "huge-reason",
        Stage::Filter,
        FaultKind::BadOutput,
        "rejection reason of 8388608 bytes",
        Duration::from_secs(2),
    );
}

#[test]
fn out_of_range_score_is_bad_output() {
    assert_contained("score-out-of-range", Stage::Score, FaultKind::BadOutput, "out of range");
}

#[test]
fn log_spam_is_bounded_and_harmless() {
    let (rt, seen) = runtime_with_faults(RuntimeConfig::default());
    let plugin = hostile(&rt, "log-spam");
    let table = nodes(1);
    let batch =
        plugin.filter(CallContext { worker: 0, nodes: &table }, &task("evil"), &[0]).expect("logs are not faults");
    assert_eq!(batch.codes, vec![0]);
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn guest_error_is_a_fault_with_its_message() {
    let (rt, _) = runtime_with_faults(RuntimeConfig::default());
    let plugin = hostile(&rt, "guest-error");
    let fault = plugin.fair_share(0, &[Default::default()], &Default::default()).unwrap_err();
    assert_eq!((fault.kind, fault.stage), (FaultKind::GuestError, Stage::FairShare));
    assert!(fault.message.contains("refuses"));
}

#[test]
fn fuel_bounds_loops_deterministically_and_wall_clock_does_not_decide() {
    let (rt, _) = runtime_with_faults(RuntimeConfig { deterministic: true, ..Default::default() });
    let plugin = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            PluginConfig::new("hostile-fuel")
                .with_config("loop")
                .with_fuel(50_000_000)
                // A deadline any call would miss: deterministic runtimes must not apply it, or
                // results would depend on machine load.
                .with_deadline(Duration::from_nanos(1)),
        )
        .unwrap();
    let table = nodes(2);
    let ctx = CallContext { worker: 0, nodes: &table };
    let fault = plugin.filter(ctx, &task("evil"), &[0, 1]).unwrap_err();
    assert_eq!(fault.kind, FaultKind::Fuel);
    // The benign path is unaffected, however long it takes on the wall clock.
    assert_eq!(plugin.filter(ctx, &task("ok"), &[0, 1]).unwrap().codes, vec![0, 0]);
}

/// Without deadlines (a measurement setting) fuel still bounds a looping plugin.
#[test]
fn without_deadlines_fuel_still_stops_a_loop() {
    let (rt, _) = runtime_with_faults(RuntimeConfig { deterministic: true, deadlines: false, ..Default::default() });
    let plugin = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            PluginConfig::new("hostile-fuel").with_config("loop").with_fuel(50_000_000),
        )
        .unwrap();
    let table = nodes(2);
    let ctx = CallContext { worker: 0, nodes: &table };
    assert_eq!(plugin.filter(ctx, &task("evil"), &[0, 1]).unwrap_err().kind, FaultKind::Fuel);
    assert_eq!(plugin.filter(ctx, &task("ok"), &[0, 1]).unwrap().codes, vec![0, 0]);
}

#[test]
fn memory_cap_is_per_plugin() {
    let (rt, _) = runtime_with_faults(RuntimeConfig::default());
    let small = rt
        .load(
            &fixtures::read(fixtures::HOSTILE),
            PluginConfig::new("small")
                .with_config("memory")
                .with_memory_limit(8 << 20)
                // The cap, not the clock, must stop the bomb: the default 10 ms deadline is missed
                // on a loaded CI machine before 8 MiB are grown (CI saw `Deadline` here once).
                .with_deadline(Duration::from_secs(2)),
        )
        .unwrap();
    let table = nodes(1);
    let started = Instant::now();
    let fault = small.filter(CallContext { worker: 0, nodes: &table }, &task("evil"), &[0]).unwrap_err();
    assert_eq!(fault.kind, FaultKind::Memory, "{fault}");
    assert!(started.elapsed() < small.config().deadline + SLACK);
}

#[test]
fn instances_are_per_worker_and_failures_stay_local() {
    let (rt, _) = runtime_with_faults(RuntimeConfig { workers: 2, ..Default::default() });
    let plugin = hostile(&rt, "panic");
    let table = nodes(3);
    let slots: Vec<u32> = table.slots().collect();
    std::thread::scope(|s| {
        for worker in 0..2 {
            let plugin = &plugin;
            let table = &table;
            let slots = &slots;
            s.spawn(move || {
                for i in 0..50 {
                    let r = plugin.filter(CallContext { worker, nodes: table }, &task(&format!("t{i}")), slots);
                    assert_eq!(r.unwrap().codes, vec![0, 0, 0]);
                }
            });
        }
    });
    assert_eq!(plugin.metrics().instances_created(), 2, "one instance per worker, none replaced");
}

/// A plugin that waits through WASI (a sleep, a far-off instant, `poll` over several pollables,
/// a blocking read, a socket) is never parked on the host's clock: each wait returns at once,
/// within the deadline, and the call answers.
#[test]
fn no_way_of_waiting_stalls_a_call() {
    for (mode, answer) in [
        ("sleep", "sleep returned"),
        ("wait-instant", "wait-instant returned"),
        ("poll-many", "poll answered"),
        ("stdin", "stdin answered"),
        ("socket", "socket returned"),
    ] {
        let (rt, seen) = runtime_with_faults(RuntimeConfig::default());
        let plugin = rt
            .load(
                &fixtures::read(fixtures::HOSTILE),
                PluginConfig::new(format!("hostile-{mode}")).with_config(mode).with_deadline(Duration::from_millis(10)),
            )
            .unwrap();
        let table = nodes(2);
        let started = Instant::now();
        let batch = plugin
            .filter(CallContext { worker: 0, nodes: &table }, &task("evil-1"), &[0, 1])
            .unwrap_or_else(|f| panic!("{mode}: {f}"));
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_millis(10) + SLACK, "{mode}: took {elapsed:?}");
        let reason = batch.reasons.first().map(|r| r.reason.clone()).unwrap_or_default();
        assert!(reason.contains(answer), "{mode}: answered {reason:?}");
        assert!(seen.lock().unwrap().is_empty(), "{mode}: {:?}", seen.lock().unwrap());
    }
}

#[test]
fn sleeping_forever_faults_within_the_deadline() {
    assert_contained("sleep-forever", Stage::Filter, FaultKind::Deadline, "deadline exceeded");
}

#[test]
fn hoarding_wasi_handles_is_a_named_fault() {
    assert_contained_within("handles", Stage::Filter, FaultKind::Trap, "WASI handles", Duration::from_secs(2));
}

#[test]
fn a_huge_random_request_is_refused_by_name_not_allocated() {
    assert_contained_within(
        "random-huge",
        Stage::Filter,
        FaultKind::Trap,
        "a host call failed: requested len 1099511627776 exceeds limit 1048576",
        Duration::from_secs(2),
    );
}

#[test]
fn exiting_is_a_named_fault_not_the_end_of_the_host() {
    assert_contained_within(
        "exit",
        Stage::Filter,
        FaultKind::Trap,
        "the plugin exited with status",
        Duration::from_secs(2),
    );
}

/// `init` has the same bounds as a call: waiting forever or looping fails the load, with the
/// cause in words, within the init budget (about a second of CPU) and a slack.
#[test]
fn init_that_never_returns_or_hoards_memory_fails_the_load_in_words() {
    let rt = wasmsched_runtime::Runtime::new(RuntimeConfig::default()).unwrap();
    // Compiled once first (the runtime keeps it): what is timed below is init, not the compiler,
    // which on a loaded CI machine alone can take seconds.
    rt.load(&fixtures::read(fixtures::HOSTILE), PluginConfig::new("hostile-burn").with_config("burn")).unwrap();
    for (mode, words) in [
        ("init-sleep", "init exceeded its deadline"),
        ("init-loop", "init exceeded its deadline"),
        ("init-memory", "the cap is 64 MiB"),
    ] {
        let started = Instant::now();
        let e = rt
            .load(&fixtures::read(fixtures::HOSTILE), PluginConfig::new(format!("hostile-{mode}")).with_config(mode))
            .unwrap_err();
        let elapsed = started.elapsed();
        assert!(matches!(e, wasmsched_runtime::LoadError::Init { .. }), "{mode}: {e}");
        assert!(e.to_string().contains(words), "{mode}: {e}");
        assert_eq!(e.to_string().matches(&format!("hostile-{mode}")).count(), 1, "the name once: {e}");
        assert!(elapsed < Duration::from_secs(4), "{mode}: took {elapsed:?}");
    }
}

/// The deadline is the plugin's CPU time, not the machine's: a call that needs about a third
/// of its budget in CPU, run while three busy threads share its CPU (so it takes longer than the
/// budget on the wall clock), is not cut; a loop still is.
#[test]
fn time_spent_waiting_for_a_cpu_is_not_charged_to_the_plugin() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let deadline = Duration::from_millis(30);
    let (rt, seen) = runtime_with_faults(RuntimeConfig::default());
    let config = |mode: &str| PluginConfig::new(format!("hostile-{mode}")).with_config(mode).with_deadline(deadline);
    let burn = rt.load(&fixtures::read(fixtures::HOSTILE), config("burn")).unwrap();
    let table = nodes(1);
    let ctx = CallContext { worker: 0, nodes: &table };
    let thread_cpu = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };

    // Pin this thread to one CPU, and calibrate a burn of about a third of the deadline in CPU.
    let original = rustix::thread::sched_getaffinity(None).expect("affinity");
    let cpu = rustix::thread::sched_getcpu();
    let mut only = rustix::thread::CpuSet::new();
    only.set(cpu);
    rustix::thread::sched_setaffinity(None, &only).expect("pin the test thread");
    let mut iterations: u64 = 100_000;
    let mut used = Duration::ZERO;
    for _ in 0..20 {
        let before = thread_cpu();
        burn.filter(ctx, &task(&format!("evil-{iterations}")), &[0]).expect("calibration");
        used = thread_cpu() - before;
        if used >= deadline / 4 {
            break;
        }
        iterations *= 2;
    }
    let iterations = (iterations as f64 * (deadline.as_secs_f64() / 3.0) / used.as_secs_f64()) as u64;

    let stop = AtomicBool::new(false);
    let mut longest = Duration::ZERO;
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                rustix::thread::sched_setaffinity(None, &only).expect("pin a hog");
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            });
        }
        for _ in 0..10 {
            let started = Instant::now();
            let r = burn.filter(ctx, &task(&format!("evil-{iterations}")), &[0]);
            longest = longest.max(started.elapsed());
            if let Err(fault) = r {
                stop.store(true, Ordering::Relaxed);
                panic!("a call using a third of its CPU budget was cut: {fault}");
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(seen.lock().unwrap().is_empty());
    // Sharing one CPU four ways, the calls took longer than the deadline on the wall clock: a
    // wall-clock deadline would have cut them.
    assert!(longest > deadline, "the hogs did not slow the calls ({longest:?}); the test proved nothing");

    // The same budget still cuts a plugin that uses it.
    let looping = rt.load(&fixtures::read(fixtures::HOSTILE), config("loop")).unwrap();
    let fault = looping.filter(ctx, &task("evil"), &[0]).unwrap_err();
    assert_eq!(fault.kind, FaultKind::Deadline, "{fault}");
    assert!(fault.message.contains("of CPU, over its 30ms budget"), "{}", fault.message);
    rustix::thread::sched_setaffinity(None, &original).expect("unpin");
}

/// Time from a hostile call's start to its fault, per attack (5 runs each, fresh instance each
/// time), printed for BENCHMARKS.md (`-- --nocapture`): every attack ends within its bound.
#[test]
fn time_to_fault_per_attack() {
    let (rt, _) = runtime_with_faults(RuntimeConfig::default());
    let table = nodes(4);
    let ctx = CallContext { worker: 0, nodes: &table };
    let slots: Vec<u32> = table.slots().collect();
    let mut rows = Vec::new();
    for (mode, deadline, kind) in [
        ("loop", Duration::from_millis(10), FaultKind::Deadline),
        ("sleep-forever", Duration::from_millis(10), FaultKind::Deadline),
        ("memory", Duration::from_secs(2), FaultKind::Memory),
        ("recurse", Duration::from_secs(2), FaultKind::Trap),
        ("handles", Duration::from_secs(2), FaultKind::Trap),
        ("exit", Duration::from_millis(10), FaultKind::Trap),
    ] {
        let plugin = rt
            .load(
                &fixtures::read(fixtures::HOSTILE),
                PluginConfig::new(format!("hostile-{mode}")).with_config(mode).with_deadline(deadline),
            )
            .unwrap();
        let mut times: Vec<Duration> = (0..5)
            .map(|_| {
                let started = Instant::now();
                let fault = plugin.filter(ctx, &task("evil-1"), &slots).expect_err("faults");
                assert_eq!(fault.kind, kind, "{mode}: {fault}");
                started.elapsed()
            })
            .collect();
        times.sort();
        assert!(times[4] < deadline + SLACK, "{mode}: {times:?}");
        rows.push((mode, deadline, times[2], times[4]));
    }
    for (mode, words) in [("init-loop", "deadline"), ("init-sleep", "deadline")] {
        let started = Instant::now();
        let e = rt.load(&fixtures::read(fixtures::HOSTILE), PluginConfig::new(mode).with_config(mode)).unwrap_err();
        let took = started.elapsed();
        assert!(e.to_string().contains(words), "{e}");
        assert!(took < Duration::from_secs(4), "{mode}: {took:?}");
        rows.push((mode, Duration::from_secs(1), took, took));
    }
    eprintln!("attack          budget      median to fault   slowest of 5");
    for (mode, budget, median, max) in rows {
        eprintln!("{mode:<15} {budget:>8.0?}  {median:>14.1?}  {max:>14.1?}");
    }
}
