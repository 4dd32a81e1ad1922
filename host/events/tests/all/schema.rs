//! The schema: every kind round-trips through JSON, and the checked-in JSON Schema is current.

use crate::support;

use wasmsched_events::schema::{Event, Kind};
use wasmsched_events::{JsonlReader, OutboxConfig, json_schema};

#[test]
fn samples_cover_every_kind_in_order() {
    let kinds: Vec<Kind> = support::samples().iter().map(|p| p.kind()).collect();
    assert_eq!(kinds, Kind::ALL.to_vec());
    for k in Kind::ALL {
        assert_eq!(k.name().parse::<Kind>(), Ok(k));
    }
    assert!("task-scheduledx".parse::<Kind>().unwrap_err().contains("task-scheduled, task-unschedulable"));
}

#[test]
fn every_kind_round_trips_through_a_jsonl_file() {
    let (_dir, path, sink) = support::jsonl_sink("sub/events.jsonl", "t", |_| OutboxConfig::default());
    for (i, p) in support::samples().into_iter().enumerate() {
        sink.emit_at(wasmsched_events::Timestamp(1_700_000_000_000 + i as u64), p);
    }
    let stats = sink.close(std::time::Duration::from_secs(10));
    // Every kind has a sample.
    let n = support::samples().len() as u64;
    assert_eq!(n, Kind::ALL.len() as u64);
    assert_eq!((stats.emitted, stats.delivered, stats.pending, stats.dropped), (n, n, 0, 0));

    let mut reader = JsonlReader::open(&path).unwrap();
    let mut read = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        read.push(e);
    }
    assert_eq!(read.len() as u64, n);
    for (i, (e, p)) in read.iter().zip(support::samples()).enumerate() {
        assert_eq!(e.payload, p);
        assert_eq!(e.id, format!("t-{}", i + 1));
        assert_eq!(e.specversion, "1.0");
        assert_eq!(e.source, "wasmsched/test/scheduler");
        // The text form is CloudEvents: `type` and `data` at the top level.
        let v = serde_json::to_value(e).unwrap();
        assert_eq!(v["type"].as_str().unwrap(), e.kind().event_type(), "{v}");
        assert!(v["data"].is_object());
        assert_eq!(serde_json::from_value::<Event>(v).unwrap(), *e);
    }
    assert_eq!(read[0].namespace.as_deref(), Some("team-a"));
    assert_eq!(read[0].subject, "pod-1");
    let queue = read.iter().find(|e| e.kind() == Kind::QueueShareChanged).unwrap();
    assert_eq!(queue.namespace, None, "queue events are cluster-scoped");
    assert_eq!(read[0].time.to_string(), "2023-11-14T22:13:20.000Z");

    // Text output spells every value as the JSON does: one spelling per value.
    let summaries: Vec<String> = read.iter().map(Event::summary).collect();
    let preempted = summaries.iter().find(|s| s.contains("task-preempted")).unwrap();
    assert!(preempted.ends_with("(priority, checkpoint done)"), "{preempted}");
    let evicted = summaries.iter().find(|s| s.contains("task-evicted")).unwrap();
    assert!(evicted.ends_with("(gang-broken)"), "{evicted}");
    let ended = summaries.iter().find(|s| s.contains("task-ended")).unwrap();
    assert!(ended.ends_with("on node-2 since 2025-11-24T16:00:00.000Z (preempted, work kept)"), "{ended}");
    for s in &summaries {
        // CamelCase: a capital first and a capital after a small letter (`ElasticShrink`).
        let camel = s.split(|c: char| !c.is_alphanumeric()).any(|w| {
            let c: Vec<char> = w.chars().collect();
            c.first().is_some_and(|c| c.is_uppercase())
                && c.windows(2).any(|p| p[0].is_lowercase() && p[1].is_uppercase())
        });
        assert!(!camel, "a Rust variant name in text output: {s}");
    }
}

#[test]
fn a_malformed_line_names_file_and_line_and_reading_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let good = serde_json::to_string(&Event {
        specversion: "1.0".into(),
        id: "x-1".into(),
        source: "s".into(),
        time: wasmsched_events::Timestamp(0),
        subject: "pod-1".into(),
        namespace: None,
        datacontenttype: "application/json".into(),
        payload: support::samples().remove(0),
    })
    .unwrap();
    std::fs::write(&path, format!("{good}\n{{\"type\":\"io.wasmsched.nope.v1\"}}\n\n{good}\n{}", &good[..10])).unwrap();
    let mut r = JsonlReader::open(&path).unwrap();
    assert!(r.next_event().unwrap().is_some());
    let err = r.next_event().unwrap_err().to_string();
    assert!(err.contains("events.jsonl:2: not an event"), "{err}");
    assert!(r.next_event().unwrap().is_some(), "the blank line is skipped, line 4 is read");
    // A torn last line is not an event yet: it waits for the rest.
    assert!(r.next_event().unwrap().is_none());
    let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, format!("{}\n", &good[10..]).as_bytes()).unwrap();
    assert_eq!(r.next_event().unwrap().unwrap().id, "x-1");
}

/// `docs/events.schema.json` is generated from the types; regenerate with
/// `WASMSCHED_BLESS=1 cargo test -p wasmsched-events --test all schema::`.
#[test]
fn the_checked_in_json_schema_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/events.schema.json");
    let generated = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
    for k in Kind::ALL {
        let tag = serde_json::to_value(Event {
            specversion: "1.0".into(),
            id: "i".into(),
            source: "s".into(),
            time: wasmsched_events::Timestamp(0),
            subject: "x".into(),
            namespace: None,
            datacontenttype: "application/json".into(),
            payload: support::samples().into_iter().find(|p| p.kind() == k).unwrap(),
        })
        .unwrap()["type"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(generated.contains(&format!("\"{tag}\"")), "schema lacks {tag}");
    }
    if std::env::var_os("WASMSCHED_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(checked_in == generated, "{} is stale: run with WASMSCHED_BLESS=1", path.display());
}

#[test]
fn a_task_is_shown_as_namespace_slash_name_once() {
    let task = |id: &str, namespace: &str| wasmsched_events::schema::TaskRef {
        id: id.into(),
        namespace: namespace.into(),
        queue: "default".into(),
        group: None,
        priority: 0,
    };
    // The simulator's ids are bare names; a pod's id on Kubernetes is already `namespace/name`.
    assert_eq!(task("j1", "default").to_string(), "default/j1");
    assert_eq!(task("ml/train-0", "ml").to_string(), "ml/train-0");
    assert_eq!(task("mlx/p", "ml").to_string(), "ml/mlx/p");
}
