//! What publishing one placement costs the scheduling thread, old path against new in one run.
//!
//! - `emit/payload`: build the `task-scheduled` [`Payload`](wasmsched_events::Payload) (six
//!   strings and a vector) and `emit_at` it with `Timestamp::now`, as `decisions::publish` did before session 22.
//! - `emit/packed`: `decisions::publish` itself, which packs the same facts into a 120-byte
//!   record and stamps them with the coarse wall clock. Its names here (74 bytes) are longer than
//!   the record holds inline (48), so they take one allocation.
//! - `emit/packed-inline`: the same with a short policy set name (48 bytes of names, like the
//!   openb simulation's): no allocation.
//!
//! Both publish to a JSONL sink whose drainer runs, and both are paced: between two timed
//! emissions the thread does ~10 µs of other work, as a scheduler does between decisions (an
//! unpaced loop fills the outbox and measures the drop path instead). Only the emission is timed;
//! the clock read is the same on both sides. Uses mimalloc, the scheduler binary's allocator.
//! Issue 6's target (events on vs off within 2 % of a ~14 µs decision) means ≤ ~280 ns here.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use wasmsched_api::{DeviceShare, GpuDevice, Node, Task};
use wasmsched_core::Placement;
use wasmsched_events::decisions::{self, Decision};
use wasmsched_events::schema::PolicySetRef;
use wasmsched_events::{EventSink, Origin, OutboxConfig, Timestamp};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Work between emissions: touches memory like a decision does, so that caches are not left
/// holding only the emit path.
fn between_decisions(scratch: &mut [u64]) {
    let until = Instant::now() + Duration::from_micros(10);
    let mut i = 0usize;
    while Instant::now() < until {
        for _ in 0..64 {
            scratch[i % scratch.len()] = scratch[i % scratch.len()].wrapping_mul(31).wrapping_add(i as u64);
            i = i.wrapping_add(97);
        }
    }
    black_box(&scratch);
}

/// Time `emit_one` alone, `iters` times, with other work between the calls.
fn paced(iters: u64, scratch: &mut [u64], mut emit_one: impl FnMut()) -> Duration {
    let mut spent = Duration::ZERO;
    for _ in 0..iters {
        between_decisions(scratch);
        let t = Instant::now();
        emit_one();
        spent += t.elapsed();
    }
    spent
}

fn emit(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let sink = EventSink::jsonl(
        dir.path().join("events.jsonl"),
        Origin { source: "wasmsched/bench/scheduler".into(), id_prefix: "b".into() },
        OutboxConfig::default(),
    )
    .unwrap();
    let policy = PolicySetRef { name: "resource-fit+least-allocated".into(), version: 3 };
    let task = Task {
        id: "openb-pod-004217".into(),
        namespace: "default".into(),
        queue: "default".into(),
        group: None,
        priority: 0,
        ..Default::default()
    };
    let placement = Placement {
        node: 1234,
        devices: vec![DeviceShare { gpu: 2, milli: 500 }],
        score: 87,
        feasible: 312,
        skipped_faults: Vec::new(),
    };
    // An openb node: its GPUs' model, no pool label.
    let gpus =
        (0..8).map(|index| GpuDevice { index, model: "V100M32".into(), ..Default::default() }).collect::<Vec<_>>();
    let node = Node { name: "openb-node-1234".into(), gpus: gpus.into(), ..Default::default() };
    let node = &node;
    let mut scratch = vec![1u64; 256 << 10];

    let mut g = c.benchmark_group("emit");
    g.bench_function("payload", |b| {
        b.iter_custom(|iters| {
            paced(iters, &mut scratch, || {
                let payload = decisions::scheduled(&task, Ok(node), &placement, 5000, &policy, 1, None);
                sink.emit_at(Timestamp::now(), payload);
            })
        })
    });
    // The hot path as the simulator calls it, with a policy name that overflows the inline text
    // and with one that fits.
    let publish = |policy: &PolicySetRef| {
        let d = Decision { task: &task, outcome: Ok((&placement, node)), evaluated: 5000, attempt: 1, submitted: None };
        decisions::publish(Some(&sink), None, d, policy);
    };
    let short = PolicySetRef { name: "fgd".into(), version: 3 };
    for (name, policy) in [("packed", &policy), ("packed-inline", &short)] {
        g.bench_function(name, |b| b.iter_custom(|iters| paced(iters, &mut scratch, || publish(policy))));
    }
    g.finish();
    let stats = sink.close(Duration::from_secs(30));
    assert_eq!(stats.dropped, 0, "the outbox overflowed: the pacing is too short for the drainer");
}

criterion_group!(benches, emit);
criterion_main!(benches);
