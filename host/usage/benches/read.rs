//! How fast `wasmsched usage` reads a JSONL event file: events per second into a ledger, then the
//! report. The file is what a replay publishes — placements, ends, unschedulable attempts — written
//! by the real sink. Goal (issue 39): at least 500,000 events/s on this machine.
//!
//! `cargo bench -p wasmsched-usage --bench read`

#![allow(missing_docs)]

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wasmsched_events::schema::{
    EndReason, GpuShare, Payload, PolicySetRef, Quantity, ScoreSummary, Stage, StageReason, TaskEnded, TaskRef,
    TaskScheduled, TaskUnschedulable,
};
use wasmsched_events::{EventSink, Origin, OutboxConfig, Timestamp};
use wasmsched_usage::{Dimension, Ledger, Query, journal};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tasks in the file; each has a placement, an end and one failed attempt: 3 events.
const TASKS: u64 = 100_000;

fn write_events(path: &std::path::Path) {
    let sink = EventSink::jsonl(
        path,
        Origin { source: "wasmsched/bench/replay".into(), id_prefix: "bench".into() },
        OutboxConfig { max_events: 1 << 20, ..OutboxConfig::default() },
    )
    .unwrap();
    let policy = PolicySetRef { name: "fgd".into(), version: 1 };
    for i in 0..TASKS {
        let task = TaskRef {
            id: format!("openb-pod-{i:06}"),
            namespace: format!("team-{}", i % 7),
            queue: format!("q{}", i % 5),
            group: None,
            priority: 0,
        };
        let gpus = vec![GpuShare { gpu: (i % 8) as u32, milli: if i % 3 == 0 { 1000 } else { 500 } }];
        let allocated = Quantity { cpu_milli: 4000, memory_bytes: 16 << 30, gpu_milli: gpus[0].milli.into() };
        let model = Some(["V100M32", "A10", "T4", "G2"][(i % 4) as usize].to_string());
        let started = Timestamp(1_700_000_000_000 + i * 1000);
        sink.emit_at(
            Timestamp(started.0 - 500),
            Payload::TaskUnschedulable(TaskUnschedulable {
                task: task.clone(),
                reasons: vec![StageReason { stage: Stage::Filter, reason: "insufficient GPU".into(), nodes: 812 }],
                policy_set: policy.clone(),
                attempt: 1,
            }),
        );
        sink.emit_at(
            started,
            Payload::TaskScheduled(TaskScheduled {
                task: task.clone(),
                node: format!("openb-node-{:04}", i % 1500),
                gpus: gpus.clone(),
                score: ScoreSummary { total: 87, feasible: 312, evaluated: 1523 },
                policy_set: policy.clone(),
                attempt: 2,
                allocated,
                gpu_model: model.clone(),
                gpu_kind: None,
                node_pool: None,
                submitted: Some(Timestamp(started.0 - 9000)),
                topology: None,
            }),
        );
        sink.emit_at(
            Timestamp(started.0 + 3_600_000),
            Payload::TaskEnded(TaskEnded {
                task,
                node: format!("openb-node-{:04}", i % 1500),
                started,
                gpus,
                allocated,
                gpu_model: model,
                gpu_kind: None,
                node_pool: None,
                reason: EndReason::Completed,
                work_kept: true,
            }),
        );
    }
    let stats = sink.close(Duration::from_secs(60));
    assert_eq!(stats.delivered, 3 * TASKS, "{stats:?}");
}

fn read(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    write_events(&path);
    let mut g = c.benchmark_group("usage");
    g.sample_size(10);
    g.throughput(Throughput::Elements(3 * TASKS));
    g.bench_function("read-jsonl", |b| {
        b.iter(|| {
            let mut ledger = Ledger::new();
            journal::read_file(&path, &mut ledger).unwrap();
            ledger
        })
    });
    g.bench_function("read-jsonl+report-by-queue,model", |b| {
        b.iter(|| {
            let mut ledger = Ledger::new();
            journal::read_file(&path, &mut ledger).unwrap();
            ledger.report(&Query { by: vec![Dimension::Queue, Dimension::Model], ..Query::default() })
        })
    });
    g.finish();
}

criterion_group!(benches, read);
criterion_main!(benches);
