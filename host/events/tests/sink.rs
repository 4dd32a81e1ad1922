//! `emit` from many threads at once: every event arrives once, ids are unique and follow the file's
//! order, each thread's events keep their order, and so do events that cause one another.

use std::time::Duration;

use wasmsched_events::schema::{Payload, QueueShareChanged};
use wasmsched_events::{EventSink, JsonlReader, Origin, OutboxConfig};

#[test]
fn concurrent_emitters_lose_nothing_and_keep_their_own_order() {
    const THREADS: u64 = 4;
    const EACH: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "c".into() };
    let sink = EventSink::jsonl(&path, origin, OutboxConfig::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let sink = sink.clone();
            s.spawn(move || {
                for i in 0..EACH {
                    // The queue name carries (thread, index); any payload kind would do.
                    sink.emit(Payload::QueueShareChanged(QueueShareChanged {
                        queue: format!("t{t}-{i}"),
                        ..Default::default()
                    }));
                }
            });
        }
    });
    let stats = sink.close(Duration::from_secs(60));
    let n = THREADS * EACH;
    assert_eq!((stats.emitted, stats.delivered, stats.dropped, stats.pending), (n, n, 0, 0), "{stats:?}");

    let mut reader = JsonlReader::open(&path).unwrap();
    let mut next = [0u64; THREADS as usize];
    let mut count = 0u64;
    while let Some(e) = reader.next_event().unwrap() {
        count += 1;
        assert_eq!(e.id, format!("c-{count}"), "ids follow the file's order");
        let Payload::QueueShareChanged(q) = e.payload else { panic!("{:?}", e.payload) };
        let (t, i) = q.queue[1..].split_once('-').unwrap();
        let (t, i): (usize, u64) = (t.parse().unwrap(), i.parse().unwrap());
        assert_eq!(i, next[t], "thread {t}'s events in order");
        next[t] += 1;
    }
    assert_eq!(count, n);
}

/// A JSONL sink whose outbox overflows to a spill directory (a disk slower than the scheduler):
/// spilled events carry no subject, come back from disk, and arrive in order, none lost.
#[test]
fn a_jsonl_sink_spills_and_reads_back_in_order() {
    const N: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "s".into() };
    let outbox = OutboxConfig { max_events: 16, spill_dir: Some(dir.path().join("spill")), ..OutboxConfig::default() };
    let sink = EventSink::jsonl(&path, origin, outbox).unwrap();
    for i in 0..N {
        sink.emit(Payload::QueueShareChanged(QueueShareChanged { queue: format!("q-{i}"), ..Default::default() }));
    }
    let stats = sink.close(Duration::from_secs(60));
    assert!(stats.spilled > 0, "the outbox never spilled: {stats:?}");
    assert_eq!((stats.emitted, stats.delivered, stats.dropped, stats.pending), (N, N, 0, 0), "{stats:?}");
    let mut reader = JsonlReader::open(&path).unwrap();
    let mut i = 0u64;
    while let Some(e) = reader.next_event().unwrap() {
        let Payload::QueueShareChanged(q) = e.payload else { panic!("{:?}", e.payload) };
        assert_eq!(q.queue, format!("q-{i}"));
        i += 1;
    }
    assert_eq!(i, N);
}

/// Events that cause one another across threads (A emits, then hands over to B, which emits) keep
/// that order in the file: staging is one ring for all emitting threads, not one per thread.
#[test]
fn events_keep_their_causal_order_across_threads() {
    const ROUNDS: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "h".into() };
    let sink = EventSink::jsonl(&path, origin, OutboxConfig::default()).unwrap();
    let emit = |sink: &EventSink, n: u64| {
        sink.emit(Payload::QueueShareChanged(QueueShareChanged { queue: format!("q-{n}"), ..Default::default() }))
    };
    let (to_b, at_b) = std::sync::mpsc::channel::<u64>();
    let (to_a, at_a) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|s| {
        let b_sink = sink.clone();
        s.spawn(move || {
            while let Ok(n) = at_b.recv() {
                emit(&b_sink, n + 1);
                to_a.send(n + 2).unwrap();
            }
        });
        let mut n = 0;
        for _ in 0..ROUNDS {
            emit(&sink, n);
            to_b.send(n).unwrap();
            n = at_a.recv().unwrap();
        }
        drop(to_b);
    });
    let stats = sink.close(Duration::from_secs(60));
    assert_eq!((stats.delivered, stats.dropped), (2 * ROUNDS, 0), "{stats:?}");
    let mut reader = JsonlReader::open(&path).unwrap();
    let mut n = 0u64;
    while let Some(e) = reader.next_event().unwrap() {
        let Payload::QueueShareChanged(q) = e.payload else { panic!("{:?}", e.payload) };
        assert_eq!(q.queue, format!("q-{n}"), "the file follows the hand-overs");
        n += 1;
    }
    assert_eq!(n, 2 * ROUNDS);
}

/// A drainer that went idle wakes for the next event: one event at a time, each waited for, after
/// pauses of different lengths (some land while the drainer is falling asleep). Without the
/// wake-up an event would wait for the drainer's next periodic look (every 50 ms): the median
/// wait tells the two apart while tolerating a loaded machine's outliers.
#[test]
fn an_idle_drainer_wakes_for_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "w".into() };
    let sink = EventSink::jsonl(&path, origin, OutboxConfig::default()).unwrap();
    let mut waits = Vec::new();
    for i in 0..200u64 {
        std::thread::sleep(Duration::from_micros(i % 7 * 700));
        let t = std::time::Instant::now();
        sink.emit(Payload::QueueShareChanged(QueueShareChanged { queue: format!("q-{i}"), ..Default::default() }));
        assert!(sink.flush(Duration::from_secs(10)), "event {i} not written within 10 s: {:?}", sink.stats());
        waits.push(t.elapsed());
    }
    assert_eq!(sink.close(Duration::from_secs(10)).delivered, 200);
    waits.sort();
    let median = waits[waits.len() / 2];
    assert!(median < Duration::from_millis(15), "median wait {median:?}: the drainer was not woken");
}
