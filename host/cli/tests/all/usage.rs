//! `wasmsched usage`: the report from the events equals what the simulator billed from its own
//! state, and stays exact when the stream is read twice, out of order, in pieces, with holes, with
//! events it does not know — and through a NATS durable consumer read again after a crash.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::support::NatsServer;
use super::wasmsched;

/// The exact per-queue totals both sides give.
const EXACT: [&str; 5] =
    ["gpu_milli_seconds", "cpu_milli_seconds", "memory_byte_seconds", "lost_gpu_milli_seconds", "runs"];

/// Replay `args` publishing to `events`; the replay's JSON report.
fn replay(args: &[&str], events: &Path) -> Value {
    let mut all = vec!["replay", "--native", "--json", "--quiet", "--events", events.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = wasmsched(&all);
    assert!(o.status.success(), "replay {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `usage --json` with `args`; its report and whether it exited 0.
fn usage(args: &[&str]) -> (Value, bool, String) {
    let mut all = vec!["usage", "--json"];
    all.extend_from_slice(args);
    let o = wasmsched(&all);
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    let report = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("usage {args:?}: {e}: {stderr}"));
    (report, o.status.success(), stderr)
}

/// Virtual second `s` of a replay as the events stamp it.
fn instant(s: u64) -> String {
    let t = wasmsched_events::Timestamp(s * 1000).to_string();
    t.replace(".000Z", "Z")
}

/// Per queue, the exact totals of a usage report.
fn by_queue(report: &Value) -> Vec<(String, Vec<u128>)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let totals = EXACT
                .iter()
                .map(|k| r[*k].as_u64().map(u128::from).unwrap_or_else(|| r[*k].to_string().parse().unwrap()))
                .collect();
            (r["queue"].as_str().unwrap().to_string(), totals)
        })
        .collect()
}

/// The simulator's own totals, in the same shape.
fn billed_by_simulator(replayed: &Value) -> Vec<(String, Vec<u128>)> {
    replayed["usage"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, u)| u["runs"].as_u64() != Some(0))
        .map(|(q, u)| {
            let totals = EXACT.iter().map(|k| u[*k].to_string().parse::<u128>().unwrap()).collect();
            (q.clone(), totals)
        })
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(String::from).collect()
}

fn write(path: &Path, lines: &[String]) -> PathBuf {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
    path.to_path_buf()
}

#[test]
fn usage_from_the_events_equals_what_the_simulator_billed_on_every_scenario_and_openb() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenarios: Vec<PathBuf> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 6, "{scenarios:?}");
    let mut runs: Vec<(String, Vec<String>)> = scenarios
        .iter()
        .map(|s| (s.display().to_string(), vec!["--scenario".into(), s.display().to_string()]))
        .collect();
    // The default replay of the openb trace: 8,152 jobs on half the 6,212-GPU cluster, contended,
    // with preemption.
    runs.push(("openb".into(), vec![]));
    let mut lost_somewhere = false;
    for (i, (name, args)) in runs.iter().enumerate() {
        let events = dir.path().join(format!("events-{i}.jsonl"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let replayed = replay(&args, &events);
        let horizon = replayed["horizon_seconds"].as_u64().unwrap();
        let (report, ok, stderr) =
            usage(&["--file", events.to_str().unwrap(), "--by", "queue", "--to", &instant(horizon)]);
        assert!(ok && report["complete"] == true, "{name}: {stderr} {report}");
        let want = billed_by_simulator(&replayed);
        assert!(!want.is_empty(), "{name}: nothing ran");
        assert_eq!(by_queue(&report), want, "{name}");
        lost_somewhere |= want.iter().any(|(_, t)| t[3] > 0);
        // Runs going on at the end are counted up to `--to`: a window cut anywhere adds up.
        let cut = instant(horizon / 3);
        let (before, ..) = usage(&["--file", events.to_str().unwrap(), "--to", &cut]);
        let (after, ..) = usage(&["--file", events.to_str().unwrap(), "--from", &cut, "--to", &instant(horizon)]);
        for k in ["gpu_milli_seconds", "cpu_milli_seconds", "lost_gpu_milli_seconds"] {
            let sum = before["total"][k].as_u64().unwrap() + after["total"][k].as_u64().unwrap();
            assert_eq!(sum, report["total"][k].as_u64().unwrap(), "{name}: {k} split at {cut}");
        }
    }
    assert!(lost_somewhere, "some scenario evicts without a checkpoint: lost GPU time is checked");
}

#[test]
fn reading_twice_out_of_order_and_in_overlapping_pieces_counts_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let replayed = replay(&["--scenario", "examples/scenarios/queues-gangs-preemption.yaml"], &events);
    let to = instant(replayed["horizon_seconds"].as_u64().unwrap());
    let (want, ok, _) = usage(&["--file", events.to_str().unwrap(), "--by", "queue,namespace", "--to", &to]);
    assert!(ok);
    let all = lines(&events);

    // Every event twice, in one file and across two.
    let twice = write(&dir.path().join("twice.jsonl"), &[all.clone(), all.clone()].concat());
    // Reversed, and shuffled (a fixed permutation: every 7th line first, then the rest backwards).
    let reversed = write(&dir.path().join("reversed.jsonl"), &all.iter().rev().cloned().collect::<Vec<_>>());
    let mut shuffled: Vec<String> = all.iter().step_by(7).cloned().collect();
    shuffled.extend(all.iter().enumerate().filter(|(i, _)| i % 7 != 0).map(|(_, l)| l.clone()).rev());
    let shuffled = write(&dir.path().join("shuffled.jsonl"), &shuffled);
    // Two overlapping halves, as a consumer restarted mid-way would have read them.
    let (a, b) = (all.len() * 2 / 3, all.len() / 3);
    let first = write(&dir.path().join("first.jsonl"), &all[..a]);
    let second = write(&dir.path().join("second.jsonl"), &all[b..]);
    let cases: Vec<Vec<&str>> = vec![
        vec!["--file", twice.to_str().unwrap()],
        vec!["--file", events.to_str().unwrap(), "--file", events.to_str().unwrap()],
        vec!["--file", reversed.to_str().unwrap()],
        vec!["--file", shuffled.to_str().unwrap()],
        vec!["--file", second.to_str().unwrap(), "--file", first.to_str().unwrap()],
    ];
    for case in cases {
        let mut args = case.clone();
        args.extend(["--by", "queue,namespace", "--to", &to]);
        let (got, ok, stderr) = usage(&args);
        assert!(ok, "{case:?}: {stderr}");
        assert_eq!(got["rows"], want["rows"], "{case:?}");
        assert_eq!(got["total"], want["total"], "{case:?}");
        assert!(got["intake"]["duplicates"].as_u64().unwrap() <= all.len() as u64);
    }
    let (got, ..) = usage(&["--file", twice.to_str().unwrap(), "--to", &to]);
    assert_eq!(got["intake"]["duplicates"].as_u64(), Some(all.len() as u64), "each repeat is seen as one");
    // By queue: each queue's use beside its deserved share (from `queue-share-changed`), the same
    // read forwards or backwards.
    let shares = |file: &Path| -> Vec<(f64, f64)> {
        let (r, ..) = usage(&["--file", file.to_str().unwrap(), "--to", &to]);
        r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["share"]["used_percent"].as_f64().unwrap(), r["share"]["deserved_gpus"].as_f64().unwrap()))
            .collect()
    };
    let forwards = shares(&events);
    assert_eq!(forwards.len(), 2);
    assert!((forwards.iter().map(|s| s.0).sum::<f64>() - 100.0).abs() < 1e-9, "{forwards:?}");
    assert!(forwards.iter().all(|s| s.1 > 0.0 && s.1 <= 8.0), "two 4-GPU nodes: {forwards:?}");
    assert_eq!(shares(&reversed), forwards);
}

#[test]
fn a_stream_with_holes_is_reported_incomplete_with_the_window_and_never_billed_silently() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let replayed = replay(&["--scenario", "examples/scenarios/queues-gangs-preemption.yaml"], &events);
    let to = instant(replayed["horizon_seconds"].as_u64().unwrap());
    let all = lines(&events);
    let time_of = |l: &String| serde_json::from_str::<Value>(l).unwrap()["time"].as_str().unwrap().to_string();
    // Three events lost upstream, a few after the first instant (the cluster's description and the
    // first arrivals share it), so that a window can end before the hole.
    let first_later = all.iter().position(|l| time_of(l) > time_of(&all[0])).unwrap();
    let hole = first_later + 5..first_later + 8;
    let holed: Vec<String> =
        all.iter().enumerate().filter(|(i, _)| !hole.contains(i)).map(|(_, l)| l.clone()).collect();
    let holed = write(&dir.path().join("holed.jsonl"), &holed);
    let o = wasmsched(&["usage", "--file", holed.to_str().unwrap(), "--to", &to]);
    assert_eq!(o.status.code(), Some(1), "an incomplete report fails");
    let text = String::from_utf8_lossy(&o.stdout);
    let before: Value = serde_json::from_str(&all[hole.start - 1]).unwrap();
    let after: Value = serde_json::from_str(&all[hole.end]).unwrap();
    let window = format!(
        "missing: 3 events between {} and {}",
        before["time"].as_str().unwrap(),
        after["time"].as_str().unwrap()
    );
    assert!(text.contains(&window), "{text}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("incomplete: 3 events missing"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (report, ok, _) = usage(&["--file", holed.to_str().unwrap(), "--to", &to, "--allow-gaps"]);
    assert!(ok, "--allow-gaps accepts it");
    assert_eq!(report["complete"], false);
    assert_eq!(report["missing"][0]["events"], 3);
    assert_eq!(report["missing"][0]["found_by"], "sequence");
    // A window that ends before the hole is complete (the missing events came at or after the
    // last one read before them).
    let hole_from = before["time"].as_str().unwrap().to_string();
    let earlier =
        all[..hole.start - 1].iter().map(time_of).filter(|t| *t < hole_from).max().expect("events before the hole's");
    let (early, ok, _) = usage(&["--file", holed.to_str().unwrap(), "--to", &earlier]);
    assert!(ok && early["complete"] == true, "{early}");

    // The first events never read (a consumer that started late): a hole at the start.
    let late = write(&dir.path().join("late.jsonl"), &all[5..]);
    let (report, ok, _) = usage(&["--file", late.to_str().unwrap(), "--to", &to]);
    assert!(!ok);
    assert_eq!((report["missing"][0]["events"].as_u64(), report["missing"][0].get("from")), (Some(5), None));

    // Drops the publisher reported are holes too.
    let mut dropped = all.clone();
    let mut e: Value = serde_json::from_str(&all[0]).unwrap();
    e["id"] = "other-publisher-1".into();
    e["type"] = "io.wasmsched.events.dropped.v1".into();
    e["data"] = serde_json::json!({"count": 42, "first": instant(100), "last": instant(200), "reason": "outbox full"});
    dropped.push(e.to_string());
    let dropped = write(&dir.path().join("dropped.jsonl"), &dropped);
    let (report, ok, _) = usage(&["--file", dropped.to_str().unwrap(), "--to", &to]);
    assert!(!ok);
    assert_eq!(report["missing"][0]["found_by"], "dropped");
    assert_eq!(report["missing"][0]["events"], 42);

    // As a sink drops them: it numbered events 11–13 and reports them in event 14 — one hole of 3,
    // said once (not a numbering gap of 3 and a report of 3).
    let mut as_sink: Vec<String> =
        all.iter().enumerate().filter(|(i, _)| !(10..13).contains(i)).map(|(_, l)| l.clone()).collect();
    let mut report_event: Value = serde_json::from_str(&all[13]).unwrap();
    report_event["type"] = "io.wasmsched.events.dropped.v1".into();
    report_event["data"] =
        serde_json::json!({"count": 3, "first": before["time"], "last": after["time"], "reason": "outbox full"});
    as_sink[10] = report_event.to_string();
    let as_sink = write(&dir.path().join("as-sink.jsonl"), &as_sink);
    let (report, ok, _) = usage(&["--file", as_sink.to_str().unwrap(), "--to", &to]);
    assert!(!ok);
    let missing = report["missing"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!((missing[0]["found_by"].as_str(), missing[0]["events"].as_u64()), (Some("dropped"), Some(3)));
}

#[test]
fn unknown_event_types_are_skipped_with_a_count_and_malformed_lines_fail_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let replayed = replay(&["--scenario", "examples/scenarios/two-queues.json"], &events);
    let to = instant(replayed["horizon_seconds"].as_u64().unwrap());
    let (want, ..) = usage(&["--file", events.to_str().unwrap(), "--to", &to]);
    let mut all = lines(&events);
    let scheduled = all.iter().find(|l| l.contains("task.scheduled.v1")).unwrap().clone();
    for (n, kind) in [(1, "io.wasmsched.task.scheduled.v2"), (2, "com.example.audit.v1")] {
        let mut e: Value = serde_json::from_str(&scheduled).unwrap();
        e["id"] = format!("newer-{n}").into();
        e["type"] = kind.into();
        all.push(e.to_string());
    }
    let with_unknown = write(&dir.path().join("unknown.jsonl"), &all);
    let (got, ok, stderr) = usage(&["--file", with_unknown.to_str().unwrap(), "--to", &to]);
    assert!(ok, "{stderr}");
    assert_eq!((got["rows"].clone(), got["total"].clone()), (want["rows"].clone(), want["total"].clone()));
    assert_eq!(got["intake"]["unknown_types"]["io.wasmsched.task.scheduled.v2"], 1);
    assert_eq!(got["intake"]["unknown_types"]["com.example.audit.v1"], 1);
    let text =
        String::from_utf8_lossy(&wasmsched(&["usage", "--file", with_unknown.to_str().unwrap()]).stdout).to_string();
    assert!(text.contains("skipped: 1 events of unknown type com.example.audit.v1"), "{text}");

    // A truncated line and a `task-ended` without its start: not billed, named, and failing.
    let mut broken = lines(&events);
    broken.insert(3, "{\"specversion\":\"1.0\",\"id\":".into());
    let mut e: Value = serde_json::from_str(&scheduled).unwrap();
    e["id"] = "x-1".into();
    e["type"] = "io.wasmsched.task.ended.v1".into();
    let broken_at = broken.len() + 1;
    broken.push(e.to_string());
    let broken = write(&dir.path().join("broken.jsonl"), &broken);
    let o = wasmsched(&["usage", "--file", broken.to_str().unwrap(), "--json", "--to", &to]);
    assert_eq!(o.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["intake"]["malformed"], 2);
    let examples = report["intake"]["malformed_examples"].to_string();
    assert!(
        examples.contains("broken.jsonl:4") && examples.contains(&format!("broken.jsonl:{broken_at}")),
        "{examples}"
    );
    assert!(examples.contains("missing field `started`"), "{examples}");
    assert_eq!(report["total"], want["total"], "what could be read is billed as before");

    // Bad arguments: a clear error, exit 1.
    for (args, says) in [
        (vec!["usage", "--file", "/nonexistent/events.jsonl"], "open /nonexistent/events.jsonl"),
        (vec!["usage", "--file", events.to_str().unwrap(), "--by", "team"], "unknown dimension `team`"),
        (vec!["usage", "--file", events.to_str().unwrap(), "--from", "yesterday"], "RFC 3339"),
        (vec!["usage"], "give --file FILE"),
    ] {
        let o = wasmsched(&args);
        assert!(!o.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn a_durable_consumer_with_a_journal_reads_each_event_once_across_runs_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&[]);
    let url = nats.url();
    let publish = |scenario: &str| -> Value {
        let o = wasmsched(&[
            "replay",
            "--native",
            "--json",
            "--quiet",
            "--scenario",
            scenario,
            "--nats",
            &url,
            "--cluster",
            "test",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let journal = dir.path().join("billing/journal.jsonl");
    let read = |extra: &[&str]| {
        // The cluster of `NatsServer::config`, which the crash below reads with.
        let mut args = vec![
            "--nats",
            url.as_str(),
            "--cluster",
            "test",
            "--durable",
            "billing",
            "--journal",
            journal.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        usage(&args)
    };
    // First run: one replay's events.
    let first = publish("examples/scenarios/queues-gangs-preemption.yaml");
    let to = instant(first["horizon_seconds"].as_u64().unwrap());
    let (report, ok, stderr) = read(&["--to", &to]);
    assert!(ok, "{stderr}");
    assert_eq!(by_queue(&report), billed_by_simulator(&first));
    let kept = lines(&journal).len();
    assert!(kept > 10);

    // A crash after the journal was written and before the acknowledgement: the batch comes again
    // (after the ack wait) and is appended again; the report counts it once.
    let second = publish("examples/scenarios/two-queues.json");
    let config = nats.config();
    let mut appended = 0;
    let crashed = wasmsched_events::pull_durable(&config, "billing", 4096, |batch| {
        let mut text = String::new();
        for e in batch {
            text.push_str(std::str::from_utf8(e).unwrap());
            text.push('\n');
        }
        appended += batch.len();
        std::fs::OpenOptions::new().append(true).open(&journal).unwrap().write_all(text.as_bytes()).unwrap();
        Err("killed before acknowledging".into())
    });
    assert!(crashed.is_err());
    assert!(appended > 0, "{crashed:?}");
    // Half a line at the end, as a crash in the middle of a write leaves.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap()
        .write_all(b"{\"specversion\":\"1.0\",\"id\":\"trunc")
        .unwrap();
    let both_to = instant(first["horizon_seconds"].as_u64().unwrap().max(second["horizon_seconds"].as_u64().unwrap()));
    let (report, ok, stderr) = read(&["--to", &both_to]);
    assert!(ok && report["complete"] == true, "{stderr} {report}");
    assert_eq!(lines(&journal).len(), kept + 2 * appended, "the redelivered batch is in the journal twice");
    assert_eq!(report["intake"]["duplicates"].as_u64(), Some(appended as u64));

    // The same as reading both replays' events from files, once each.
    let files: Vec<PathBuf> = ["examples/scenarios/queues-gangs-preemption.yaml", "examples/scenarios/two-queues.json"]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let p = dir.path().join(format!("f{i}.jsonl"));
            replay(&["--scenario", s], &p);
            p
        })
        .collect();
    let (from_files, ..) =
        usage(&["--file", files[0].to_str().unwrap(), "--file", files[1].to_str().unwrap(), "--to", &both_to]);
    assert_eq!(report["rows"], from_files["rows"]);
    // Nothing new: the consumer's position is at the end; the report is the same.
    let (again, ok, _) = read(&["--to", &both_to]);
    assert!(ok);
    assert_eq!(again["total"], report["total"]);
    assert_eq!(lines(&journal).len(), kept + 2 * appended);
}
