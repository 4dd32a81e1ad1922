//! The NATS JetStream sink against a real `nats-server` (started per test on a free port).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::{NatsServer, free_port, samples, task};
use wasmsched_events::schema::{Kind, Payload, TaskScheduled};
use wasmsched_events::{Error, Event, EventSink, Filter, NatsConfig, Origin, OutboxConfig, TailOptions, tail};

fn origin(prefix: &str) -> Origin {
    Origin { source: "wasmsched/test/scheduler".into(), id_prefix: prefix.into() }
}

/// Every event in the stream, in stream order (no de-duplication, no filter).
fn read_all(config: &NatsConfig) -> Vec<Event> {
    let mut out = Vec::new();
    let mut opts = TailOptions { from_start: true, follow: false };
    opts.follow = false;
    let raw = Filter::default();
    tail_raw(config, &raw, &opts, &mut out);
    out
}

fn tail_raw(config: &NatsConfig, filter: &Filter, opts: &TailOptions, out: &mut Vec<Event>) {
    tail(config, filter, opts, |e| {
        out.push(e);
        true
    })
    .expect("tail");
}

/// A configuration for a port where no server listens (yet), with short waits.
fn nobody_on(port: u16) -> NatsConfig {
    NatsConfig {
        url: format!("nats://127.0.0.1:{port}"),
        cluster: "test".into(),
        startup_wait_ms: 100,
        backoff_max_ms: 200,
        ..Default::default()
    }
}

fn scheduled(i: usize, ns: &str) -> Payload {
    Payload::TaskScheduled(TaskScheduled {
        task: task(&format!("pod-{i}"), ns),
        node: format!("n{}", i % 7),
        attempt: 1,
        ..Default::default()
    })
}

fn seq(e: &Event) -> u64 {
    e.id.rsplit('-').next().unwrap().parse().unwrap()
}

#[test]
fn every_kind_is_published_and_consumed_with_subject_filters() {
    let server = NatsServer::start(&[]);
    let config = server.config();
    let sink = EventSink::nats(config.clone(), origin("a"), OutboxConfig::default()).unwrap();
    for p in samples() {
        sink.emit(p);
    }
    assert!(sink.flush(Duration::from_secs(20)), "{:?}", sink.stats());
    let stats = sink.stats();
    assert_eq!((stats.delivered, stats.pending, stats.dropped), (samples().len() as u64, 0, 0));
    assert!(stats.connected);

    let all = read_all(&config);
    let payloads: Vec<Payload> = all.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, samples());

    // Kind and namespace filters become subject filters; the task filter is applied client-side.
    let mut got = Vec::new();
    let f = Filter { kinds: vec![Kind::TaskScheduled, Kind::TaskPreempted], namespace: None, task: None };
    tail_raw(&config, &f, &TailOptions { from_start: true, follow: false }, &mut got);
    assert_eq!(got.iter().map(|e| e.kind()).collect::<Vec<_>>(), vec![Kind::TaskScheduled, Kind::TaskPreempted]);
    got.clear();
    let f = Filter { namespace: Some("team-b".into()), ..Default::default() };
    tail_raw(&config, &f, &TailOptions { from_start: true, follow: false }, &mut got);
    assert_eq!(got.iter().map(|e| e.subject.as_str()).collect::<Vec<_>>(), vec!["pod-2", "low-1"]);
    got.clear();
    let f = Filter { task: Some("high-1".into()), ..Default::default() };
    tail_raw(&config, &f, &TailOptions { from_start: true, follow: false }, &mut got);
    assert_eq!(got.len(), 1, "the preemptor finds its preemption");
    sink.close(Duration::from_secs(5));
}

#[test]
fn killing_the_server_mid_stream_loses_nothing_duplicates_nothing_and_keeps_order() {
    const N: usize = 10_000;
    let mut server = NatsServer::start(&[]);
    let config = NatsConfig { ack_timeout_ms: 2_000, backoff_max_ms: 500, ..server.config() };
    let sink =
        EventSink::nats(config.clone(), origin("k"), OutboxConfig { max_events: N, ..Default::default() }).unwrap();
    let emitter = {
        let sink = sink.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            for i in 0..N {
                sink.emit(scheduled(i, ["ns-a", "ns-b", "ns-c", "ns-d"][i % 4]));
                // Bursts, so that the kill finds events in flight and events not yet emitted.
                if i % 1000 == 999 {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            started.elapsed()
        })
    };
    // Kill once a good part is delivered and the rest is still coming.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.stats().delivered < 2_500 {
        assert!(Instant::now() < deadline, "{:?}", sink.stats());
        std::thread::sleep(Duration::from_millis(2));
    }
    server.kill();
    std::thread::sleep(Duration::from_millis(700));
    let during = sink.stats();
    server.restart();
    let emit_time = emitter.join().unwrap();
    assert!(sink.flush(Duration::from_secs(60)), "{:?}", sink.stats());
    let stats = sink.close(Duration::from_secs(5));
    assert!(during.delivered < N as u64 && during.emitted < N as u64, "the kill happened mid-stream: {during:?}");
    assert!(stats.delivered == N as u64, "{stats:?}");
    assert_eq!((stats.emitted, stats.dropped, stats.pending), (N as u64, 0, 0), "{stats:?}");
    eprintln!("emitting took {emit_time:?}; at the kill {during:?}; final {stats:?}");

    let events = read_all(&config);
    let mut ids = std::collections::HashSet::new();
    let raw = events.len();
    let mut last_per_subject: HashMap<String, u64> = HashMap::new();
    for e in &events {
        assert!(ids.insert(e.id.clone()), "duplicate {} in the stream", e.id);
        let ns = e.namespace.clone().unwrap();
        let s = seq(e);
        if let Some(prev) = last_per_subject.insert(ns.clone(), s) {
            assert!(s > prev, "order broken on {ns}: {prev} then {s}");
        }
    }
    assert_eq!(raw, N, "every event exactly once");
}

#[test]
fn an_unreachable_server_holds_events_without_stalling_then_delivers_them() {
    let port = free_port();
    let config = NatsConfig { startup_wait_ms: 300, ..nobody_on(port) };
    let started = Instant::now();
    let sink = EventSink::nats(config.clone(), origin("u"), OutboxConfig::default()).unwrap();
    // Five times what `emit` stages for the drainer, which is busy reconnecting: the rest goes
    // into the outbox on the emitting thread, behind the staged events.
    for i in 0..5000 {
        sink.emit(scheduled(i, "ns"));
    }
    assert!(started.elapsed() < Duration::from_secs(5), "emitting waited on the network");
    let s = sink.stats();
    assert!(!s.connected);
    assert_eq!((s.pending, s.delivered), (5000, 0));
    assert!(s.last_error.as_deref().unwrap_or("").contains(&port.to_string()), "{s:?}");

    let server = NatsServer::start_on(port, &[]);
    assert!(sink.flush(Duration::from_secs(30)), "{:?}", sink.stats());
    let got = read_all(&NatsConfig { url: server.url(), ..config });
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), (1..=5000).collect::<Vec<_>>());
}

#[test]
fn wrong_credentials_are_a_clear_error_and_right_ones_work() {
    let server = NatsServer::start(&["--auth", "s3cret"]);
    let wrong = NatsConfig {
        auth: wasmsched_events::NatsAuth { token: Some("guess".into()), ..Default::default() },
        ..server.config()
    };
    let err = EventSink::nats(wrong, origin("w"), OutboxConfig::default()).err().expect("rejected");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("rejected the credentials"), "{err}");

    let none = NatsConfig { ..server.config() };
    assert!(matches!(EventSink::nats(none, origin("w"), OutboxConfig::default()), Err(Error::Auth { .. })));

    let right = NatsConfig {
        auth: wasmsched_events::NatsAuth { token: Some("s3cret".into()), ..Default::default() },
        ..server.config()
    };
    let sink = EventSink::nats(right.clone(), origin("r"), OutboxConfig::default()).unwrap();
    sink.emit(scheduled(1, "ns"));
    assert!(sink.flush(Duration::from_secs(10)));
    assert_eq!(read_all(&right).len(), 1);
}

#[test]
fn nkey_authentication_works() {
    let user = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("server.conf");
    std::fs::write(&conf, format!("authorization {{ users = [ {{ nkey: {} }} ] }}\n", user.public_key())).unwrap();
    let seed_file = dir.path().join("user.nk");
    std::fs::write(&seed_file, user.seed().unwrap()).unwrap();
    let server = NatsServer::start(&["-c", conf.to_str().unwrap()]);
    let config = NatsConfig {
        auth: wasmsched_events::NatsAuth { nkey_seed_file: Some(seed_file), ..Default::default() },
        ..server.config()
    };
    let sink = EventSink::nats(config.clone(), origin("n"), OutboxConfig::default()).unwrap();
    sink.emit(scheduled(1, "ns"));
    assert!(sink.flush(Duration::from_secs(10)), "{:?}", sink.stats());
    assert_eq!(read_all(&config).len(), 1);

    let other = nkeys::KeyPair::new_user();
    let bad_seed = dir.path().join("other.nk");
    std::fs::write(&bad_seed, other.seed().unwrap()).unwrap();
    let bad = NatsConfig {
        auth: wasmsched_events::NatsAuth { nkey_seed_file: Some(bad_seed), ..Default::default() },
        ..server.config()
    };
    assert!(matches!(EventSink::nats(bad, origin("n"), OutboxConfig::default()), Err(Error::Auth { .. })));
}

#[test]
fn a_full_outbox_drops_the_newest_counts_them_and_reports_the_gap() {
    let port = free_port();
    let config = NatsConfig { startup_wait_ms: 100, ..nobody_on(port) };
    let sink =
        EventSink::nats(config.clone(), origin("f"), OutboxConfig { max_events: 50, ..Default::default() }).unwrap();
    for i in 0..80 {
        sink.emit(scheduled(i, "ns"));
    }
    let s = sink.stats();
    assert_eq!((s.pending, s.dropped, s.emitted), (50, 30, 80));

    let server = NatsServer::start_on(port, &[]);
    assert!(sink.flush(Duration::from_secs(30)));
    sink.emit(scheduled(80, "ns"));
    assert!(sink.flush(Duration::from_secs(10)));
    let got = read_all(&NatsConfig { url: server.url(), ..config });
    assert_eq!(got.len(), 52);
    assert_eq!(got[..50].iter().map(seq).collect::<Vec<_>>(), (1..=50).collect::<Vec<_>>(), "the oldest are kept");
    match &got[50].payload {
        Payload::EventsDropped(d) => {
            assert_eq!(d.count, 30);
            assert!(d.reason.contains("outbox full (50 events in memory, spill disabled)"), "{}", d.reason);
        }
        other => panic!("expected the drop report, got {other:?}"),
    }
    assert_eq!(got[51].subject, "pod-80");
}

#[test]
fn spilled_events_survive_a_scheduler_restart_in_order() {
    let port = free_port();
    let spill = tempfile::tempdir().unwrap();
    let config = nobody_on(port);
    let outbox = OutboxConfig {
        max_events: 10,
        spill_dir: Some(spill.path().into()),
        segment_bytes: 4096,
        ..Default::default()
    };
    let sink = EventSink::nats(config.clone(), origin("s1"), outbox.clone()).unwrap();
    for i in 0..100 {
        sink.emit(scheduled(i, ["a", "b"][i % 2]));
    }
    let s = sink.stats();
    assert_eq!((s.pending, s.spilled, s.dropped), (100, 90, 0));
    // Shut down while the server is away: memory goes to disk ahead of what is there.
    let s = sink.close(Duration::from_millis(100));
    assert_eq!(s.dropped, 0, "{s:?}");
    assert!(std::fs::read_dir(spill.path()).unwrap().count() > 1, "several segments");

    let server = NatsServer::start_on(port, &[]);
    let sink = EventSink::nats(NatsConfig { url: server.url(), ..config.clone() }, origin("s2"), outbox).unwrap();
    assert_eq!(sink.stats().recovered, 100);
    sink.emit(scheduled(100, "a"));
    assert!(sink.flush(Duration::from_secs(20)), "{:?}", sink.stats());
    let got = read_all(&config);
    let ids: Vec<String> = got.iter().map(|e| e.id.clone()).collect();
    let mut want: Vec<String> = (1..=100).map(|i| format!("s1-{i}")).collect();
    want.push("s2-1".into());
    assert_eq!(ids, want);
    assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0, "delivered segments are deleted");
}

#[test]
fn invalid_configurations_are_refused_before_connecting() {
    for (config, needle) in [
        (NatsConfig { cluster: "a.b".into(), ..Default::default() }, "subject token"),
        (NatsConfig { max_in_flight: 0, ..Default::default() }, "max_in_flight"),
        (
            NatsConfig {
                auth: wasmsched_events::NatsAuth {
                    token: Some("t".into()),
                    user: Some("u".into()),
                    password: Some("p".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            "at most one",
        ),
        (NatsConfig { url: " ".into(), ..Default::default() }, "url is empty"),
    ] {
        let err = EventSink::nats(config, origin("c"), OutboxConfig::default()).err().expect("refused");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

/// A CA and a server certificate for 127.0.0.1, made with the `openssl` command.
fn make_certs(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let o = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=wasmsched test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
}

#[test]
fn tls_with_a_private_ca_works_and_an_unknown_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let p = |f: &str| dir.path().join(f);
    let server = NatsServer::start(&[
        "--tls",
        "--tlscert",
        p("server.pem").to_str().unwrap(),
        "--tlskey",
        p("server.key").to_str().unwrap(),
    ]);
    let tls = wasmsched_events::TlsSettings { ca_file: Some(p("ca.pem")), required: true, ..Default::default() };
    let config = NatsConfig { tls: Some(tls), ..server.config() };
    let sink = EventSink::nats(config.clone(), origin("t"), OutboxConfig::default()).unwrap();
    sink.emit(scheduled(1, "ns"));
    assert!(sink.flush(Duration::from_secs(10)), "{:?}", sink.stats());
    assert_eq!(read_all(&config).len(), 1);

    // Without our CA the server's certificate is not trusted: a clear error, not a hang.
    let untrusted = NatsConfig {
        tls: Some(wasmsched_events::TlsSettings { required: true, ..Default::default() }),
        startup_wait_ms: 3_000,
        ..server.config()
    };
    let started = Instant::now();
    let err = match EventSink::nats(untrusted, origin("t"), OutboxConfig::default()) {
        Ok(s) => panic!("accepted: {:?}", s.stats()),
        Err(e) => e,
    };
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("invalid peer certificate"), "{err}");
}
