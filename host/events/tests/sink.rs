//! `emit` from many threads at once: every event arrives once, ids are unique and follow the file's
//! order, and each thread's events keep their order.

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
