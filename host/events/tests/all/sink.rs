//! `emit` from many threads at once: every event arrives once, ids are unique and follow the file's
//! order, each thread's events keep their order, and so do events that cause one another.

use crate::support;

use std::time::{Duration, Instant};

use support::jsonl_sink;
use wasmsched_events::schema::{Payload, QueueShareChanged};
use wasmsched_events::{EventSink, JsonlReader, Origin, OutboxConfig};

/// An event that carries `label` (as a queue name; any payload kind would do).
fn emit_labelled(sink: &EventSink, label: String) {
    sink.emit(Payload::QueueShareChanged(QueueShareChanged { queue: label, ..Default::default() }));
}

/// The file's events as (id, label), in file order.
fn read_labels(path: &std::path::Path) -> Vec<(String, String)> {
    let mut reader = JsonlReader::open(path).unwrap();
    let mut out = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        let Payload::QueueShareChanged(q) = e.payload else { panic!("{:?}", e.payload) };
        out.push((e.id, q.queue));
    }
    out
}

#[test]
fn concurrent_emitters_lose_nothing_and_keep_their_own_order() {
    const THREADS: u64 = 4;
    const EACH: u64 = 20_000;
    let (_dir, path, sink) = jsonl_sink("events.jsonl", "c", |_| OutboxConfig::default());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let sink = sink.clone();
            s.spawn(move || {
                for i in 0..EACH {
                    emit_labelled(&sink, format!("t{t}-{i}"));
                }
            });
        }
    });
    let stats = sink.close(Duration::from_secs(60));
    let n = THREADS * EACH;
    assert_eq!((stats.emitted, stats.delivered, stats.dropped, stats.pending), (n, n, 0, 0), "{stats:?}");

    let events = read_labels(&path);
    assert_eq!(events.len() as u64, n);
    let mut next = [0u64; THREADS as usize];
    for (k, (id, label)) in events.iter().enumerate() {
        assert_eq!(*id, format!("c-{}", k + 1), "ids follow the file's order");
        let (t, i) = label[1..].split_once('-').unwrap();
        let (t, i): (usize, u64) = (t.parse().unwrap(), i.parse().unwrap());
        assert_eq!(i, next[t], "thread {t}'s events in order");
        next[t] += 1;
    }
}

/// A JSONL sink whose outbox overflows to a spill directory (a disk slower than the scheduler):
/// spilled events carry no subject, come back from disk, and arrive in order, none lost.
#[test]
fn a_jsonl_sink_spills_and_reads_back_in_order() {
    const N: u64 = 20_000;
    let (_dir, path, sink) = jsonl_sink("events.jsonl", "s", |dir| OutboxConfig {
        max_events: 16,
        spill_dir: Some(dir.join("spill")),
        ..OutboxConfig::default()
    });
    for i in 0..N {
        emit_labelled(&sink, format!("q-{i}"));
    }
    let stats = sink.close(Duration::from_secs(60));
    assert!(stats.spilled > 0, "the outbox never spilled: {stats:?}");
    assert_eq!((stats.emitted, stats.delivered, stats.dropped, stats.pending), (N, N, 0, 0), "{stats:?}");
    let labels: Vec<String> = read_labels(&path).into_iter().map(|(_, l)| l).collect();
    assert_eq!(labels, (0..N).map(|i| format!("q-{i}")).collect::<Vec<_>>());
}

/// A sink that waits for room (the simulator's) behind a slow disk: the file is a pipe whose
/// reader takes 50 µs a line, the outbox holds 16 events with no spill directory, and the emitter
/// is far faster. Every event is written, in order, none dropped; the same sink without waiting
/// drops (so the set-up does press it).
#[test]
fn a_sink_that_waits_for_room_never_drops() {
    const N: u64 = 5_000;
    let run = |wait_when_full: bool| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.pipe");
        assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
        let reading = path.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let file = std::io::BufReader::new(std::fs::File::open(reading).unwrap());
            let mut labels = Vec::new();
            for line in file.lines() {
                let event: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
                labels.push(event["data"]["queue"].as_str().unwrap_or("<report>").to_string());
                std::thread::sleep(Duration::from_micros(50));
            }
            labels
        });
        let origin = Origin { source: "wasmsched/test/w".into(), id_prefix: "w".into() };
        let outbox = OutboxConfig { max_events: 16, wait_when_full, ..OutboxConfig::default() };
        let sink = EventSink::jsonl(&path, origin, outbox).unwrap();
        for i in 0..N {
            emit_labelled(&sink, format!("q-{i}"));
        }
        let stats = sink.close(Duration::from_secs(60));
        (stats, reader.join().unwrap())
    };
    let (stats, labels) = run(true);
    assert_eq!((stats.emitted, stats.delivered, stats.dropped, stats.pending), (N, N, 0, 0), "{stats:?}");
    assert_eq!(labels, (0..N).map(|i| format!("q-{i}")).collect::<Vec<_>>());
    let (stats, _) = run(false);
    assert!(stats.dropped > 0, "without waiting the slow file costs events: {stats:?}");
}

/// Events that cause one another across threads (A emits, then hands over to B, which emits) keep
/// that order in the file: staging is one ring for all emitting threads, not one per thread.
#[test]
fn events_keep_their_causal_order_across_threads() {
    const ROUNDS: u64 = 2_000;
    let (_dir, path, sink) = jsonl_sink("events.jsonl", "h", |_| OutboxConfig::default());
    let (to_b, at_b) = std::sync::mpsc::channel::<u64>();
    let (to_a, at_a) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|s| {
        let b_sink = sink.clone();
        s.spawn(move || {
            while let Ok(n) = at_b.recv() {
                emit_labelled(&b_sink, format!("q-{}", n + 1));
                to_a.send(n + 2).unwrap();
            }
        });
        let mut n = 0;
        for _ in 0..ROUNDS {
            emit_labelled(&sink, format!("q-{n}"));
            to_b.send(n).unwrap();
            n = at_a.recv().unwrap();
        }
        drop(to_b);
    });
    let stats = sink.close(Duration::from_secs(60));
    assert_eq!((stats.delivered, stats.dropped), (2 * ROUNDS, 0), "{stats:?}");
    let labels: Vec<String> = read_labels(&path).into_iter().map(|(_, l)| l).collect();
    assert_eq!(
        labels,
        (0..2 * ROUNDS).map(|n| format!("q-{n}")).collect::<Vec<_>>(),
        "the file follows the hand-overs"
    );
}

/// A drainer that went idle wakes for the next event: one event at a time, each waited for, after
/// pauses of different lengths (some land while the drainer is falling asleep). Without the
/// wake-up an event would wait for the drainer's next periodic look (every 50 ms): the median
/// wait tells the two apart while tolerating a loaded machine's outliers.
#[test]
fn an_idle_drainer_wakes_for_each_event() {
    let (_dir, _path, sink) = jsonl_sink("events.jsonl", "w", |_| OutboxConfig::default());
    let mut waits = Vec::new();
    for i in 0..200u64 {
        std::thread::sleep(Duration::from_micros(i % 7 * 700));
        let t = Instant::now();
        emit_labelled(&sink, format!("q-{i}"));
        assert!(sink.flush(Duration::from_secs(10)), "event {i} not written within 10 s: {:?}", sink.stats());
        waits.push(t.elapsed());
    }
    assert_eq!(sink.close(Duration::from_secs(10)).delivered, 200);
    waits.sort();
    let median = waits[waits.len() / 2];
    assert!(median < Duration::from_millis(15), "median wait {median:?}: the drainer was not woken");
}

/// A reader beside the destination (the dashboard's decision stream): it sees each event once,
/// as the destination gets it, in the same order, spilled ones included.
pub(crate) struct Recorder {
    pub(crate) wants: std::sync::atomic::AtomicBool,
    pub(crate) seen: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl Recorder {
    pub(crate) fn new(wants: bool) -> std::sync::Arc<Recorder> {
        std::sync::Arc::new(Recorder { wants: wants.into(), seen: Default::default() })
    }

    fn labels(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|json| {
                let e: wasmsched_events::Event = serde_json::from_slice(json).unwrap();
                let Payload::QueueShareChanged(q) = e.payload else { panic!("{:?}", e.payload) };
                q.queue
            })
            .collect()
    }
}

impl wasmsched_events::Tap for Recorder {
    fn wants(&self) -> bool {
        self.wants.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn event(&self, json: &[u8]) {
        self.seen.lock().unwrap().push(json.to_vec());
    }
}

#[test]
fn a_tap_reads_every_event_the_file_gets_in_its_order_spilled_ones_too() {
    const N: u64 = 20_000;
    let (_dir, path, sink) = jsonl_sink("events.jsonl", "t", |dir| OutboxConfig {
        max_events: 16,
        spill_dir: Some(dir.join("spill")),
        ..OutboxConfig::default()
    });
    let tap = Recorder::new(true);
    assert!(sink.tap(tap.clone()));
    assert!(!sink.tap(Recorder::new(true)), "one tap per sink");
    assert!(sink.wanted(), "a sink with a destination always wants its events");
    for i in 0..N {
        emit_labelled(&sink, format!("q-{i}"));
    }
    let stats = sink.close(Duration::from_secs(60));
    assert!(stats.spilled > 0, "{stats:?}");
    let file: Vec<String> = read_labels(&path).into_iter().map(|(_, l)| l).collect();
    assert_eq!(tap.labels(), file);
    let lines: Vec<Vec<u8>> =
        std::fs::read(&path).unwrap().split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
    assert_eq!(*tap.seen.lock().unwrap(), lines, "byte for byte what the file got");
}

#[test]
fn a_tap_only_sink_counts_what_its_reader_saw_and_encodes_nothing_while_none_reads() {
    let origin = wasmsched_events::Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "d".into() };
    let tap = Recorder::new(false);
    let sink = EventSink::tap_only(origin, OutboxConfig::default(), tap.clone()).unwrap();
    assert!(!sink.wanted(), "nobody reads: a source may skip building events");
    for i in 0..100 {
        emit_labelled(&sink, format!("unread-{i}"));
    }
    assert!(sink.flush(Duration::from_secs(10)));
    assert!(tap.seen.lock().unwrap().is_empty(), "nothing encoded for nobody");
    tap.wants.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(sink.wanted());
    for i in 0..100 {
        emit_labelled(&sink, format!("read-{i}"));
    }
    let stats = sink.close(Duration::from_secs(10));
    assert_eq!((stats.emitted, stats.delivered, stats.lost()), (200, 200, 0), "{stats:?}");
    assert_eq!(tap.labels(), (0..100).map(|i| format!("read-{i}")).collect::<Vec<_>>());
}
