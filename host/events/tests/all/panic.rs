//! A panic keeps the events its process still holds ([`cli::end_on_panic`], what both binaries
//! install first): each test runs itself again as a child process that emits events and then
//! panics, the way a bug would; the child must end by abort, and every event it emitted must be in
//! its file, or in its spill directory for the next run to publish.

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{NatsServer, free_port};
use wasmsched_events::schema::{Payload, QueueShareChanged};
use wasmsched_events::{EventSink, JsonlReader, NatsConfig, Origin, OutboxConfig, cli};

/// Set in the child: the directory it works in.
const CHILD: &str = "WASMSCHED_TEST_PANIC_CHILD";
/// Set in the child of the NATS test: the port nobody listens on.
const PORT: &str = "WASMSCHED_TEST_PANIC_PORT";

fn emit(sink: &EventSink, i: u64) {
    sink.emit(Payload::QueueShareChanged(QueueShareChanged { queue: format!("q-{i}"), ..Default::default() }));
}

/// Events the JSONL file sink of the first test is given.
const FILE_EVENTS: u64 = 50_000;

/// The ids of a JSONL file's events, in order.
fn ids_in(path: &Path) -> Vec<String> {
    let mut reader = JsonlReader::open(path).unwrap();
    let mut ids = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        ids.push(e.id);
    }
    ids
}

fn origin(prefix: &str) -> Origin {
    Origin { source: "wasmsched/test/scheduler".into(), id_prefix: prefix.into() }
}

/// Run `test` (this binary's test of that name) again as a child working in `dir`, and check that
/// it ended by abort, its panic's message printed.
fn run_child(test: &str, dir: &Path, env: &[(&str, String)]) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(6), "the child must abort (SIGABRT): {:?}\n{stderr}", out.status);
    assert!(stderr.contains("a bug"), "the panic's message is printed first: {stderr}");
}

/// The server is away: 5,000 events, 4,000 of them spilled while the outbox was full and 1,000 in
/// memory, when a thread other than main panics. Without `keep_events_at_panic` the 1,000 vanish
/// with the process; with it they join the spill directory, in order, and the next run publishes
/// all 5,000. A second sink open at the same time (a JSONL file given 50,000 events just before)
/// is kept within the same grace.
#[test]
fn a_panic_on_a_worker_thread_spills_what_the_server_did_not_get() {
    const N: u64 = 5_000;
    let config = |port: u16| NatsConfig {
        url: format!("nats://127.0.0.1:{port}"),
        cluster: "test".into(),
        startup_wait_ms: 100,
        backoff_max_ms: 200,
        ..Default::default()
    };
    let outbox = |dir: &Path| OutboxConfig { max_events: 1_000, spill_dir: Some(dir.into()), ..Default::default() };
    if let Ok(dir) = std::env::var(CHILD) {
        cli::end_on_panic();
        let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
        let dir = Path::new(&dir);
        let sink = EventSink::nats(config(port), origin("p1"), outbox(&dir.join("spill"))).unwrap();
        for i in 0..N {
            emit(&sink, i);
        }
        let file = EventSink::jsonl(dir.join("events.jsonl"), origin("j"), OutboxConfig::default()).unwrap();
        for i in 0..FILE_EVENTS {
            emit(&file, i);
        }
        let _ = std::thread::spawn(|| panic!("a bug on a worker thread")).join();
        unreachable!("the panic ends the process");
    }

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    run_child(
        "panic::a_panic_on_a_worker_thread_spills_what_the_server_did_not_get",
        dir.path(),
        &[(PORT, port.to_string())],
    );
    assert_eq!(ids_in(&dir.path().join("events.jsonl")).len() as u64, FILE_EVENTS, "the other sink's file");

    let server = NatsServer::start_on(port, &[]);
    let sink = EventSink::nats(config(server.port), origin("p2"), outbox(&dir.path().join("spill"))).unwrap();
    assert_eq!(sink.stats().recovered, N, "every event the child emitted is kept");
    assert!(sink.flush(Duration::from_secs(30)), "{:?}", sink.stats());
    let mut got = Vec::new();
    let opts = wasmsched_events::TailOptions { from_start: true, follow: false };
    wasmsched_events::tail(&config(server.port), &wasmsched_events::Filter::default(), &opts, |e| {
        got.push(e.id);
        true
    })
    .unwrap();
    assert_eq!(got, (1..=N).map(|i| format!("p1-{i}")).collect::<Vec<_>>(), "all of them, in order");
}

/// A JSONL run that panics on its main thread right after a burst of 50,000 events: the file gets
/// every one of them before the process ends.
#[test]
fn a_panic_on_the_main_thread_still_writes_every_event_to_the_file() {
    const N: u64 = 50_000;
    if let Ok(dir) = std::env::var(CHILD) {
        cli::end_on_panic();
        let sink =
            EventSink::jsonl(Path::new(&dir).join("events.jsonl"), origin("j"), OutboxConfig::default()).unwrap();
        for i in 0..N {
            emit(&sink, i);
        }
        panic!("a bug on the main thread");
    }

    let dir = tempfile::tempdir().unwrap();
    run_child("panic::a_panic_on_the_main_thread_still_writes_every_event_to_the_file", dir.path(), &[]);
    let ids = ids_in(&dir.path().join("events.jsonl"));
    assert_eq!(ids.len() as u64, N, "events in the file");
    assert_eq!(ids.last().map(String::as_str), Some(format!("j-{N}").as_str()));
}
