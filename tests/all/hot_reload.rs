//! Hot reload under load: versions swapped while tasks are scheduled, bad candidates rejected with
//! their reason, live versions rolled back when they misbehave — with real components, a real
//! directory source and the events a JSONL sink wrote.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmsched_api::batch::FilterBatch;
use wasmsched_api::{
    DeviceShare, PreemptCandidate, Preemption, QueueState, Rejection, Resources, ShareDecision, Stage, Task,
};
use wasmsched_core::{
    CallContext, FailurePolicy, NodeTable, PluginFault, PolicyPlugin, PolicySet, Slot, bind, place, release,
};
use wasmsched_events::{EventSink, JsonlReader, Kind, Origin, OutboxConfig, Payload};
use wasmsched_registry::{
    Decision, DirSource, Fetched, Outcome, PolicyVersion, Preparer, Registry, SPEC_FILE, Source, digest_of, poll_once,
};
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_sim::generate::{self, Rng};
use wasmsched_tests::fixtures;

/// A cluster under continuous scheduling: tasks arrive, are decided once with the version live at
/// the start of their cycle, run for a while and leave.
struct Loop {
    nodes: NodeTable,
    running: VecDeque<(Slot, Task, Vec<DeviceShare>)>,
    rng: Rng,
    next_id: u64,
    /// `(task id, version that decided it, placed)`.
    decided: Vec<(String, u64, bool)>,
}

impl Loop {
    fn new(nodes: usize, seed: u64) -> Loop {
        let mut rng = Rng::new(seed);
        let nodes = generate::cluster(&mut rng, nodes);
        Loop { nodes, running: VecDeque::new(), rng, next_id: 0, decided: Vec::new() }
    }

    fn next_task(&mut self, prefix: &str) -> Task {
        self.next_id += 1;
        generate::task(&mut self.rng, format!("{prefix}-{}", self.next_id))
    }

    /// One cycle of one task. Returns the version that decided it.
    fn decide(&mut self, registry: &Registry, task: Task) -> u64 {
        let live = registry.current();
        if registry.wants_sample() {
            registry.offer_sample(&self.nodes);
        }
        let started = Instant::now();
        let result = place(&live.set, &self.nodes, &task, 0);
        let latency = started.elapsed();
        registry.record(&live, Decision { task: &task, nodes: &self.nodes, result: &result, latency });
        let placed = result.is_ok();
        if let Ok(p) = result {
            self.nodes
                .update(p.node, |n| bind(n, &task, &p.devices))
                .expect("the chosen node exists")
                .unwrap_or_else(|e| panic!("{} placed where it does not fit (double placement?): {e}", task.id));
            self.running.push_back((p.node, task.clone(), p.devices));
        }
        // Keep the cluster about half full: the oldest tasks finish.
        while self.running.len() > self.nodes.len() * 2 {
            let (slot, t, devices) = self.running.pop_front().unwrap();
            self.nodes.update(slot, |n| release(n, &t, &devices));
        }
        self.decided.push((task.id, live.version, placed));
        live.version
    }

    fn run(&mut self, registry: &Registry, decisions: usize, prefix: &str) {
        for _ in 0..decisions {
            let t = self.next_task(prefix);
            self.decide(registry, t);
        }
    }
}

fn runtime() -> Arc<Runtime> {
    Arc::new(Runtime::new(RuntimeConfig::default()).expect("runtime"))
}

const FIT_AND_PACK: &str = r#"
name: packing
plugins:
  fit: { source: "builtin:resource-fit", deadline_ms: 2000 }
  pack: { source: "builtin:most-allocated", deadline_ms: 2000 }
stages:
  filter: [fit]
  score: [{ plugin: pack }]
"#;

fn fetched(spec: &str, artifacts: &[(&str, &[u8])]) -> Fetched {
    let spec = wasmsched_registry::PolicySetSpec::parse("test", spec).expect("valid spec");
    Fetched {
        spec,
        origin: "test".into(),
        artifacts: artifacts.iter().map(|(n, b)| (n.to_string(), Arc::from(*b))).collect(),
        fingerprint: String::new(),
    }
}

/// A registry with the packing set live, events to a JSONL file (the sink is returned to flush).
fn registry(events: &Path) -> (Arc<Registry>, Preparer, EventSink) {
    let preparer = Preparer::new(runtime(), wasmsched_plugins::table().collect());
    let sink =
        EventSink::jsonl(events, Origin { source: "test".into(), id_prefix: "t".into() }, OutboxConfig::default())
            .unwrap();
    let first = preparer
        .prepare(&fetched(FIT_AND_PACK, &[]), 1, &wasmsched_registry::Sample::synthetic())
        .expect("the initial set prepares");
    (Arc::new(Registry::new(first, Some(sink.clone()))), preparer, sink)
}

fn events(sink: &EventSink, path: &Path) -> Vec<Payload> {
    assert!(sink.flush(Duration::from_secs(10)), "events flushed");
    let mut r = JsonlReader::open(path).unwrap();
    let mut all = Vec::new();
    while let Some(e) = r.next_event().unwrap() {
        all.push(e.payload);
    }
    all
}

/// A native plugin that logs the version of the set it belongs to on every call, so a decision
/// can prove every stage it ran came from one version.
struct Tracer {
    version: u64,
    log: Arc<Mutex<Vec<u64>>>,
}

impl PolicyPlugin for Tracer {
    fn name(&self) -> &str {
        "tracer"
    }
    fn stages(&self) -> &[Stage] {
        &[Stage::Filter, Stage::Score]
    }
    fn failure_policy(&self) -> FailurePolicy {
        FailurePolicy::FailClosed
    }
    fn filter_until(
        &self,
        _: CallContext<'_>,
        _: &Task,
        candidates: &[Slot],
        _: usize,
    ) -> Result<FilterBatch, PluginFault> {
        self.log.lock().unwrap().push(self.version);
        Ok(FilterBatch { codes: vec![0; candidates.len()], reasons: vec![] })
    }
    fn score(&self, _: CallContext<'_>, _: &Task, candidates: &[Slot]) -> Result<Vec<u32>, PluginFault> {
        self.log.lock().unwrap().push(self.version);
        Ok(vec![50; candidates.len()])
    }
    fn select_devices(
        &self,
        _: CallContext<'_>,
        _: &Task,
        _: Slot,
    ) -> Result<Result<Vec<DeviceShare>, Rejection>, PluginFault> {
        unreachable!("not a device plugin")
    }
    fn select_victims(
        &self,
        _: CallContext<'_>,
        _: &Task,
        _: &[PreemptCandidate],
    ) -> Result<Option<Preemption>, PluginFault> {
        unreachable!("not a preemption plugin")
    }
    fn fair_share(&self, _: usize, _: &[QueueState], _: &Resources) -> Result<ShareDecision, PluginFault> {
        unreachable!("not a fair-share plugin")
    }
}

/// Versions of one shape: resource-fit, the tracer, and packing or spreading by version parity.
struct Versions {
    fit: Arc<dyn PolicyPlugin>,
    scores: Vec<Arc<dyn PolicyPlugin>>,
    log: Arc<Mutex<Vec<u64>>>,
    template: PolicyVersion,
}

impl Versions {
    fn make(&self, v: u64) -> PolicyVersion {
        let tracer = Arc::new(Tracer { version: v, log: self.log.clone() });
        let set = PolicySet::builder()
            .filter(self.fit.clone())
            .filter(tracer.clone())
            .score(self.scores[(v % 2) as usize].clone(), 1)
            .score(tracer, 1)
            .version(v)
            .build();
        PolicyVersion {
            set,
            spec: self.template.spec.clone(),
            version: v,
            origin: "swap-test".into(),
            fingerprint: String::new(),
            plugins: self.template.plugins.clone(),
            prepare_time: Duration::ZERO,
        }
    }
}

#[test]
fn swapping_every_10ms_for_100k_decisions_never_mixes_versions_drops_or_double_places() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, preparer, _sink) = registry(&dir.path().join("events.jsonl"));
    let rt = runtime();
    let fit: Arc<dyn PolicyPlugin> =
        Arc::new(rt.load(wasmsched_plugins::RESOURCE_FIT.wasm, crate::unhurried("fit")).unwrap());
    let scores: Vec<Arc<dyn PolicyPlugin>> = [wasmsched_plugins::MOST_ALLOCATED, wasmsched_plugins::LEAST_ALLOCATED]
        .iter()
        .map(|b| {
            Arc::new(rt.load(b.wasm, crate::unhurried(b.name).with_config(b.config)).unwrap()) as Arc<dyn PolicyPlugin>
        })
        .collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    let template = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 0, &wasmsched_registry::Sample::synthetic()).unwrap();
    let factory = Arc::new(Versions { fit, scores, log: log.clone(), template });

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (registry, stop, factory) = (registry.clone(), stop.clone(), factory.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                registry.install(factory.make(registry.next_version()));
                swaps += 1;
            }
            swaps
        })
    };

    let mut lp = Loop::new(64, 7);
    let mut tasks = 0u64;
    for _ in 0..100_000 {
        let task = lp.next_task("t");
        log.lock().unwrap().clear();
        let used = lp.decide(&registry, task);
        tasks += 1;
        let calls = log.lock().unwrap().clone();
        assert!(
            calls.iter().all(|&v| v == used) || (used == 1 && calls.is_empty()),
            "decision recorded as version {used} ran stages of versions {calls:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();

    // Every task decided exactly once; no bind failed (asserted in `decide`); what is bound
    // is exactly what is still running.
    assert_eq!(lp.decided.len() as u64, tasks);
    let mut ids: Vec<&str> = lp.decided.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, tasks, "a task was decided twice");
    let mut used_cpu: BTreeMap<Slot, u64> = BTreeMap::new();
    for (slot, t, _) in &lp.running {
        *used_cpu.entry(*slot).or_default() += t.request.cpu_milli;
    }
    let before = Loop::new(64, 7).nodes;
    for slot in lp.nodes.slots() {
        let free =
            |n: &NodeTable| n.get(slot).unwrap().allocatable.cpu_milli - n.get(slot).unwrap().allocated.cpu_milli;
        assert_eq!(
            free(&before) - free(&lp.nodes),
            used_cpu.get(&slot).copied().unwrap_or(0),
            "node {slot} accounting"
        );
    }
    let versions: std::collections::BTreeSet<u64> = lp.decided.iter().map(|(_, v, _)| *v).collect();
    assert!(swaps >= 50 && versions.len() >= 50, "{swaps} swaps, {} versions decided", versions.len());
    let placed = lp.decided.iter().filter(|(_, _, p)| *p).count();
    assert!(placed > 50_000, "only {placed} of 100000 placed");
}

/// Write a directory source: `policy.yaml` and artifacts.
fn write_source(dir: &Path, spec: &str, files: &[(&str, &[u8])]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    std::fs::write(dir.join(SPEC_FILE), spec).unwrap();
}

fn pinned(file: &str, digest: &str) -> String {
    FIT_AND_PACK.replace(
        r#"pack: { source: "builtin:most-allocated", deadline_ms: 2000 }"#,
        &format!(r#"pack: {{ source: "file:{file}", digest: "{digest}", config: '{{"strategy":"least"}}' }}"#),
    )
}

#[test]
fn candidates_that_fail_a_gate_never_go_live_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let events_path = dir.path().join("events.jsonl");
    let (registry, preparer, sink) = registry(&events_path);
    let mut lp = Loop::new(32, 3);
    lp.run(&registry, 200, "warm");
    let mut source = DirSource::new(src.path());
    let score = wasmsched_plugins::LEAST_ALLOCATED.wasm;

    let truncated = &score[..score.len() / 2];
    let garbage: Vec<u8> = (0..50_000u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let wrong_world = fixtures::read(fixtures::WRONG_CONTRACT);
    let hostile = fixtures::read(fixtures::HOSTILE);
    // (spec, files, gate, reason)
    type Case<'a> = (String, Vec<(&'a str, &'a [u8])>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (pinned("s.wasm", &digest_of(b"something else")), vec![("s.wasm", score)], "digest", "digest mismatch"),
        (
            pinned("s.wasm", &digest_of(truncated)),
            vec![("s.wasm", truncated)],
            "load",
            "not a valid WebAssembly component",
        ),
        (
            pinned("s.wasm", &digest_of(&garbage)),
            vec![("s.wasm", &garbage)],
            "load",
            "not a valid WebAssembly component",
        ),
        (
            pinned("s.wasm", &digest_of(&wrong_world)),
            vec![("s.wasm", &wrong_world)],
            "load",
            "incompatible with wasmsched:policy",
        ),
        (
            // Filters only: used as a score it fails the stage check.
            pinned("s.wasm", &digest_of(wasmsched_plugins::RESOURCE_FIT.wasm))
                .replace(r#"config: '{"strategy":"least"}'"#, "config: ''"),
            vec![("s.wasm", wasmsched_plugins::RESOURCE_FIT.wasm)],
            "stage",
            "used for score but implements only filter",
        ),
        (
            // Panics on `evil-*` tasks, which the smoke sample holds.
            pinned("s.wasm", &digest_of(&hostile)).replace(r#"'{"strategy":"least"}'"#, "panic"),
            vec![("s.wasm", &hostile)],
            "smoke",
            "hostile plugin panics on evil",
        ),
    ];
    let live = registry.current().version;
    for (i, (spec, files, gate, why)) in cases.iter().enumerate() {
        if *gate == "smoke" {
            lp.run(&registry, 200, "evil");
        }
        write_source(src.path(), spec, files);
        poll_once(&registry, &preparer, &mut source);
        let status = registry.status();
        assert_eq!(registry.current().version, live, "case {i} ({gate}) went live");
        let entry = &status.history[0];
        assert_eq!(entry.outcome, Outcome::Rejected, "case {i}: {entry:?}");
        assert!(entry.reason.contains(why), "case {i}: {why:?} not in {:?}", entry.reason);
        // Scheduling goes on with the live version.
        lp.run(&registry, 50, "after");
        assert!(lp.decided.iter().rev().take(50).all(|(_, v, _)| *v == live));
    }

    // A malformed spec and a vanished source: errors in status and events, nothing else changes.
    std::fs::write(src.path().join(SPEC_FILE), "name: [unclosed").unwrap();
    poll_once(&registry, &preparer, &mut source);
    let errors = registry.status().source_errors;
    assert!(errors[0].1.contains("policy.yaml"), "{errors:?}");
    std::fs::remove_dir_all(src.path()).unwrap();
    poll_once(&registry, &preparer, &mut source);
    let errors = registry.status().source_errors;
    assert!(errors[0].1.contains("No such file"), "{errors:?}");
    lp.run(&registry, 50, "after");
    assert_eq!(registry.current().version, live);

    let gates: Vec<String> = events(&sink, &events_path)
        .into_iter()
        .filter_map(|p| match p {
            Payload::PolicyRejected(r) => Some(r.gate),
            _ => None,
        })
        .collect();
    assert_eq!(gates, ["digest", "load", "load", "load", "stage", "smoke", "fetch", "fetch"]);
}

#[test]
fn a_live_version_that_faults_is_rolled_back_and_a_good_one_passes_probation() {
    let dir = tempfile::tempdir().unwrap();
    let events_path = dir.path().join("events.jsonl");
    let (registry, preparer, sink) = registry(&events_path);
    let mut lp = Loop::new(32, 5);
    lp.run(&registry, 600, "ok");
    let hostile = fixtures::read(fixtures::HOSTILE);

    // Faults only on `evil-*` tasks: it passes the smoke test (recent tasks are benign), then
    // faults on up to 1 decision in 20 once live (evil tasks that reach scoring), over the 1 %
    // threshold.
    let spec = pinned("h.wasm", &digest_of(&hostile)).replace(r#"'{"strategy":"least"}'"#, "panic, failure: fail-open")
        + "rollback: { window: 200, probation: 1000, max_p99_ratio: null }\n";
    let bad = registry.offer(&fetched(&spec, &[("pack", &hostile)]), &preparer).expect("passes its gates");
    assert_eq!(registry.current().version, bad);
    for i in 0..400 {
        let t = lp.next_task(if i % 20 == 0 { "evil" } else { "ok" });
        lp.decide(&registry, t);
    }
    assert_eq!(registry.current().version, 1, "rolled back to the initial version");
    let status = registry.status();
    let entry = status.history.iter().find(|h| h.label == format!("packing@{bad}")).unwrap();
    assert_eq!(entry.outcome, Outcome::RolledBack);
    assert!(
        entry.reason.starts_with("fault rate ") && entry.reason.contains("> 1.00% over 200 decisions"),
        "{}",
        entry.reason
    );

    // The same plugin without evil tasks (none left in the smoke sample either) passes probation
    // and becomes the last good version.
    lp.run(&registry, 600, "ok");
    let good = registry.offer(&fetched(&spec, &[("pack", &hostile)]), &preparer).unwrap();
    lp.run(&registry, 1000, "ok");
    let status = registry.status();
    assert_eq!(status.live, format!("packing@{good}"));
    assert!(!status.on_probation);
    assert_eq!(status.last_good.as_deref(), Some(status.live.as_str()));

    // A latency threshold no decision can meet trips on the first window.
    let slow = FIT_AND_PACK.to_string() + "rollback: { window: 100, probation: 500, max_p99_ms: 0.0001 }\n";
    let v = registry.offer(&fetched(&slow, &[]), &preparer).unwrap();
    lp.run(&registry, 100, "ok");
    assert_eq!(registry.current().version, good, "version {v} rolled back");
    assert!(
        registry
            .status()
            .history
            .iter()
            .any(|h| h.outcome == Outcome::RolledBack && h.reason.starts_with("p99 latency"))
    );

    let rolled: Vec<(u64, u64)> = events(&sink, &events_path)
        .into_iter()
        .filter_map(|p| match p {
            Payload::PolicyRolledBack(r) => Some((r.from.version, r.to.version)),
            _ => None,
        })
        .collect();
    assert_eq!(rolled, [(bad, 1), (v, good)]);
    // What the metrics export: every rollback counted, whatever the history still shows.
    let counts = registry.outcome_counts();
    let count = |o: Outcome| counts.iter().find(|(c, _)| *c == o).map(|(_, n)| *n);
    assert_eq!(count(Outcome::RolledBack), Some(2), "{counts:?}");
    assert_eq!(count(Outcome::Rejected), Some(0), "{counts:?}");
}

#[test]
fn shadow_runs_publish_diffs_and_gate_promotion() {
    let dir = tempfile::tempdir().unwrap();
    let events_path = dir.path().join("events.jsonl");
    let (registry, preparer, sink) = registry(&events_path);
    let mut lp = Loop::new(32, 9);
    lp.run(&registry, 100, "ok");

    // Spreading instead of packing disagrees on most placements: below 90 % identical, rejected.
    let spread =
        FIT_AND_PACK.replace("most-allocated", "least-allocated") + "shadow: { decisions: 300, min_identical: 0.9 }\n";
    let v = registry.offer(&fetched(&spread, &[]), &preparer).unwrap();
    assert_eq!(registry.status().candidate, Some(format!("packing@{v}")));
    lp.run(&registry, 100, "ok");
    // Mid-run, the status shows the last decisions it would make differently (the dashboard's
    // Policies page), newest first, at most 20.
    let shadow = registry.status().shadow.expect("a shadow run");
    let recent = &shadow.recent_differences;
    assert!(!recent.is_empty() && recent.len() <= 20, "{recent:?}");
    assert!(recent.iter().all(|d| d.live != d.shadow && d.live.is_some()), "{recent:?}");
    assert!(shadow.compared as usize > recent.len() || shadow.identical_share < 0.5, "{shadow:?}");
    lp.run(&registry, 200, "ok");
    assert_eq!(registry.current().version, 1);
    let rejected = &registry.status().history[0];
    assert_eq!((rejected.outcome.clone(), rejected.label.clone()), (Outcome::Rejected, format!("packing@{v}")));
    assert!(rejected.reason.contains("identical placements < min_identical 90.0%"), "{}", rejected.reason);

    // The same policy as live agrees everywhere and waits for promotion when asked to.
    let same = FIT_AND_PACK.to_string() + "shadow: { decisions: 200, min_identical: 0.99, auto_promote: false }\n";
    let w = registry.offer(&fetched(&same, &[]), &preparer).unwrap();
    lp.run(&registry, 250, "ok");
    let status = registry.status();
    assert_eq!(status.history[0].outcome, Outcome::Ready);
    assert_eq!(registry.current().version, 1, "not live before promotion");
    assert_eq!(registry.promote().unwrap(), format!("packing@{w}"));
    assert_eq!(registry.current().version, w);
    assert_eq!(registry.rollback().unwrap(), "packing@1");
    assert_eq!(registry.current().version, 1);
    assert!(registry.rollback().is_err(), "the last good version has nothing behind it");
    assert!(registry.promote().is_err(), "no candidate left");

    let all = events(&sink, &events_path);
    let diffs: Vec<_> = all
        .iter()
        .filter_map(|p| match p {
            Payload::PolicyShadowDiff(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(diffs.len(), 2);
    assert_eq!(diffs[0].shadow.version, v);
    assert!(diffs[0].differing > 30 && !diffs[0].examples.is_empty(), "{:?}", diffs[0]);
    assert!(diffs[0].examples.iter().all(|e| e.live != e.shadow));
    assert_eq!((diffs[1].shadow.version, diffs[1].differing, diffs[1].decisions), (w, 0, 200));
    let kinds: Vec<Kind> = all.iter().map(Payload::kind).collect();
    for k in [Kind::PolicyLoaded, Kind::PolicySwapped, Kind::PolicyRolledBack, Kind::PolicyRejected] {
        assert!(kinds.contains(&k), "no {k:?} event");
    }
}

#[test]
fn a_watched_directory_goes_live_on_change_and_keeps_running_when_it_vanishes() {
    let dir = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let (registry, preparer, _sink) = registry(&dir.path().join("events.jsonl"));
    let score = wasmsched_plugins::LEAST_ALLOCATED.wasm;
    write_source(src.path(), &pinned("s.wasm", &digest_of(score)), &[("s.wasm", score)]);
    let watcher = wasmsched_registry::Watcher::spawn(
        registry.clone(),
        preparer,
        vec![Box::new(DirSource::new(src.path())) as Box<dyn Source>],
        Duration::from_millis(20),
    )
    .unwrap();
    let mut lp = Loop::new(16, 1);
    let wait_for = |lp: &mut Loop, what: &str, f: &dyn Fn(&Registry) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f(&registry) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}", registry.status());
            lp.run(&registry, 10, "ok");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(&mut lp, "the directory's version", &|r| r.current().origin.starts_with("file:"));
    let first = registry.current().version;

    std::fs::remove_dir_all(src.path()).unwrap();
    wait_for(&mut lp, "the source error", &|r| !r.status().source_errors.is_empty());
    assert_eq!(registry.current().version, first);

    std::fs::create_dir_all(src.path()).unwrap();
    let spec = pinned("s.wasm", &digest_of(score)).replace("name: packing", "name: spreading");
    write_source(src.path(), &spec, &[("s.wasm", score)]);
    wait_for(&mut lp, "the new version", &|r| r.current().spec.name == "spreading");
    assert!(registry.status().source_errors.is_empty());
    watcher.stop();
}

#[test]
fn a_new_version_with_the_same_filter_keeps_its_verdicts_and_a_changed_filter_starts_cold() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, preparer, _sink) = registry(&dir.path().join("events.jsonl"));
    let mut lp = Loop::new(64, 3);
    let spec = lp.next_task("spec");
    let replicas = |lp: &mut Loop, registry: &Registry, n: usize| {
        for _ in 0..n {
            lp.next_id += 1;
            let task = Task { id: format!("replica-{}", lp.next_id), ..spec.clone() };
            lp.decide(registry, task);
        }
    };
    replicas(&mut lp, &registry, 30);
    let before = registry.current().set.verdict_counts();
    assert!(before.0 > 0, "replicas reuse verdicts: {before:?}");
    // Only the score changes: the filter is the same component with the same configuration.
    let spread = FIT_AND_PACK.replace("most-allocated", "least-allocated");
    let v = registry.offer(&fetched(&spread, &[]), &preparer).unwrap();
    assert_eq!(registry.current().version, v);
    assert_eq!(registry.current().set.verdict_counts(), before, "the new version shares the verdicts");
    replicas(&mut lp, &registry, 1);
    let after = registry.current().set.verdict_counts();
    assert!(after.0 > before.0 + after.1 - before.1, "its first decision mostly reuses: {before:?} → {after:?}");
    // A filter configured differently may judge differently: its verdicts are its own.
    let v_live = registry.current();
    let other = spread.replace(
        "fit: { source: \"builtin:resource-fit\", deadline_ms: 2000 }",
        "fit: { source: \"builtin:resource-fit\", deadline_ms: 2000, config: { ignore_gpu_memory: true } }",
    );
    let w = registry.offer(&fetched(&other, &[]), &preparer).unwrap();
    assert_eq!(registry.current().version, w);
    let shared = v_live.set.verdict_counts();
    replicas(&mut lp, &registry, 3);
    assert_eq!(v_live.set.verdict_counts(), shared, "decisions of the new version do not touch the old verdicts");
    assert_ne!(registry.current().set.verdict_counts(), shared);
}

#[test]
fn with_warm_up_a_new_version_catches_up_in_bounded_steps_before_it_goes_live() {
    let preparer = Preparer::new(runtime(), wasmsched_plugins::table().collect());
    let mut rng = Rng::new(5);
    let mut nodes = generate::cluster(&mut rng, 50);
    let slots: Vec<Slot> = nodes.slots().collect();
    let task = generate::task(&mut rng, "t".into());
    let sample =
        |nodes: &NodeTable| wasmsched_registry::Sample { nodes: Arc::new(nodes.snapshot()), tasks: vec![task.clone()] };
    let prepare = |v: u64, nodes: &NodeTable| preparer.prepare(&fetched(FIT_AND_PACK, &[]), v, &sample(nodes)).unwrap();
    let registry = Registry::new(prepare(1, &nodes), None).with_warm_up(16);
    // v2's smoke test syncs its mirrors to the cluster as it is now; 100 usage changes follow.
    let second = prepare(2, &nodes);
    for i in 0..100 {
        nodes.update_usage(slots[i % slots.len()], |n| n.allocated.cpu_milli ^= 1);
    }
    registry.install(second);
    assert_eq!(registry.current().version, 1, "staged, not live yet");
    assert_eq!(registry.status().history[0].outcome, Outcome::Staged);
    let mut steps = 0;
    while registry.current().version == 1 {
        registry.warm(&nodes);
        steps += 1;
        assert!(steps <= 10, "100 changes, 16 a step");
    }
    assert_eq!(steps, 7, "ceil(100 / 16) steps, then live");
    let h = &registry.status().history[0];
    assert_eq!((h.label.as_str(), &h.outcome), ("packing@2", &Outcome::Probation));
    // Its mirrors are right: it decides as a version synced in one go.
    let cold = prepare(9, &NodeTable::new());
    assert_eq!(
        place(&registry.current().set, &nodes, &task, 0).map(|p| p.node),
        place(&cold.set, &nodes, &task, 0).map(|p| p.node)
    );
    // A rollback drops a version still warming up.
    nodes.update_usage(slots[0], |n| n.allocated.cpu_milli ^= 1);
    registry.install(prepare(3, &NodeTable::new()));
    registry.rollback().unwrap();
    registry.warm(&nodes);
    assert_eq!(registry.current().version, 1);
    let dropped = registry.status().history.into_iter().find(|h| h.label == "packing@3").unwrap();
    assert_eq!(dropped.outcome, Outcome::Superseded);
    assert!(dropped.reason.contains("rolled back"), "{}", dropped.reason);
}

#[test]
fn a_version_prepared_while_the_loop_decides_is_caught_up_before_it_goes_live() {
    // Every plugin loaded anew: this loop records decisions without calling the live plugins, so
    // kept ones (the same spec keeps both) would be as far behind as the live version's.
    let preparer = Preparer::new(runtime(), wasmsched_plugins::table().collect()).keep_unchanged(false);
    let mut rng = Rng::new(6);
    let nodes = generate::cluster(&mut rng, 50);
    let slots: Vec<Slot> = nodes.slots().collect();
    let task = generate::task(&mut rng, "t".into());
    let sample =
        |nodes: &NodeTable| wasmsched_registry::Sample { nodes: Arc::new(nodes.snapshot()), tasks: vec![task.clone()] };
    let first = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 1, &sample(&nodes)).unwrap();
    // With warm-up, what a staged version still has to catch up is counted in steps of 16 changes.
    let registry = Arc::new(Registry::new(first, None).with_warm_up(16));
    let result = place(&registry.current().set, &nodes, &task, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let offered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The loop: decisions and usage changes, samples when asked. After the sample the version is
    // prepared on and at least 64 changes, it hands over the next sample asked for and stands still.
    let looping = {
        let (registry, stop, task, offered) = (registry.clone(), stop.clone(), task.clone(), offered.clone());
        std::thread::spawn(move || {
            let mut nodes = nodes;
            let (mut since, mut i) = (0, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let samples = offered.load(Ordering::Relaxed);
                if samples < 2 && registry.wants_sample() && (samples == 0 || since >= 64) {
                    registry.offer_sample(&nodes);
                    offered.fetch_add(1, Ordering::Relaxed);
                    since = 0;
                }
                // Deciding all along; after the second sample, without changing anything.
                if offered.load(Ordering::Relaxed) < 2 {
                    i += 1;
                    nodes.update_usage(slots[i % slots.len()], |n| n.allocated.cpu_milli ^= 1);
                    since += 1;
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
                let live = registry.current();
                let d = Decision { task: &task, nodes: &nodes, result: &result, latency: Duration::from_micros(50) };
                registry.record(&live, d);
            }
            nodes
        })
    };
    while offered.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let version = registry.offer(&fetched(FIT_AND_PACK, &[]), &preparer).unwrap();
    stop.store(true, Ordering::Relaxed);
    let nodes = looping.join().unwrap();
    // Caught up to the last sample during `offer`: live on the first warm-up step. (Without it,
    // the ≥ 64 changes since the preparation's sample take five steps.)
    registry.warm(&nodes);
    assert_eq!(registry.current().version, version, "live at once: nothing left to catch up");
    let cold = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 9, &sample(&NodeTable::new())).unwrap();
    assert_eq!(
        place(&registry.current().set, &nodes, &task, 0).map(|p| p.node),
        place(&cold.set, &nodes, &task, 0).map(|p| p.node),
        "its mirrors are right"
    );
}

#[test]
fn a_version_installed_again_or_rolled_back_to_is_caught_up_before_it_goes_live() {
    let preparer = Preparer::new(runtime(), wasmsched_plugins::table().collect());
    let mut rng = Rng::new(8);
    let mut nodes = generate::cluster(&mut rng, 50);
    let slots: Vec<Slot> = nodes.slots().collect();
    let task = generate::task(&mut rng, "t".into());
    let sample =
        |nodes: &NodeTable| wasmsched_registry::Sample { nodes: Arc::new(nodes.snapshot()), tasks: vec![task.clone()] };
    // Two versions prepared now; the second goes live only after the cluster has moved on.
    let first = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 1, &sample(&nodes)).unwrap();
    let second = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 2, &sample(&nodes)).unwrap();
    let registry = Arc::new(Registry::new(first, None));
    let result = place(&registry.current().set, &nodes, &task, 0);
    // The loop: 100 usage changes while deciding, then the sample asked for, then decisions only.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let looping = {
        let (registry, stop, task, slots, changes) =
            (registry.clone(), stop.clone(), task.clone(), slots.clone(), changes.clone());
        std::thread::spawn(move || {
            let mut offered = false;
            while !stop.load(Ordering::Relaxed) {
                let changed = changes.load(Ordering::Relaxed);
                if changed < 100 {
                    nodes.update_usage(slots[changed % slots.len()], |n| n.allocated.cpu_milli ^= 1);
                    changes.store(changed + 1, Ordering::Relaxed);
                } else if !offered && registry.wants_sample() {
                    registry.offer_sample(&nodes);
                    offered = true;
                }
                let live = registry.current();
                let d = Decision { task: &task, nodes: &nodes, result: &result, latency: Duration::from_micros(50) };
                registry.record(&live, d);
                std::thread::sleep(Duration::from_micros(50));
            }
            nodes
        })
    };
    while changes.load(Ordering::Relaxed) < 100 {
        std::thread::yield_now();
    }
    registry.install(second);
    stop.store(true, Ordering::Relaxed);
    let mut nodes = looping.join().unwrap();
    assert_eq!(registry.current().version, 2);
    // At most one change left to apply per plugin: caught up during `install`, not on the loop's
    // first decision with it (without, 100 changes are left).
    assert!(registry.current().set.catch_up(&nodes, 1), "installed with its mirrors 100 changes behind");
    let cold = preparer.prepare(&fetched(FIT_AND_PACK, &[]), 9, &sample(&NodeTable::new())).unwrap();
    assert_eq!(
        place(&registry.current().set, &nodes, &task, 0).map(|p| p.node),
        place(&cold.set, &nodes, &task, 0).map(|p| p.node),
        "its mirrors are right"
    );

    // Rolling back to the first version, 200 changes later, with the loop idle: the newest sample
    // serves, and the first version's mirrors are brought to it.
    let before = nodes.snapshot();
    for i in 0..200 {
        nodes.update_usage(slots[i % slots.len()], |n| n.allocated.cpu_milli ^= 1);
    }
    registry.offer_sample(&nodes);
    assert_eq!(registry.rollback().unwrap(), "packing@1");
    assert_eq!(registry.current().version, 1);
    assert!(registry.current().set.catch_up(&nodes, 1), "rolled back to mirrors 300 changes behind");
    // A sample older than a plugin's mirror is no reason to step back to it (resending every
    // node): the mirrors stay where they are.
    registry.current().set.catch_up(&before, usize::MAX);
    assert!(registry.current().set.catch_up(&nodes, 1), "stepped back to an older sample");
}

#[test]
fn a_new_version_keeps_the_live_instances_of_the_plugins_it_does_not_change() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, preparer, _sink) = registry(&dir.path().join("events.jsonl"));
    let mut lp = Loop::new(64, 11);
    lp.run(&registry, 50, "ok");
    let info = |v: &PolicyVersion, name: &str| v.plugins.iter().find(|p| p.name == name).unwrap().clone();
    let first = registry.current();
    let live_filter_calls = info(&first, "fit").metrics.stage(Stage::Filter).calls;

    // Only the score changes: the filter goes live as it is, instances and mirrors included, and
    // the smoke test ran on an instance of its own (the live one was not called).
    let spread = FIT_AND_PACK.replace("most-allocated", "least-allocated");
    let v = registry.offer(&fetched(&spread, &[]), &preparer).unwrap();
    let second = registry.current();
    assert_eq!(second.version, v);
    let (fit, pack) = (info(&second, "fit"), info(&second, "pack"));
    assert_eq!(fit.kept_from, Some(first.version));
    assert!(Arc::ptr_eq(&fit.plugin, &info(&first, "fit").plugin));
    assert_eq!(fit.metrics.stage(Stage::Filter).calls, live_filter_calls, "the smoke test called the live filter");
    assert_eq!(pack.kept_from, None, "a changed component is loaded anew");
    assert!(!Arc::ptr_eq(&pack.plugin, &info(&first, "pack").plugin));

    // It decides as the same version loaded anew does.
    lp.run(&registry, 50, "ok");
    let tasks: Vec<Task> = (0..20).map(|_| lp.next_task("cmp")).collect();
    let sample = wasmsched_registry::Sample { nodes: Arc::new(lp.nodes.snapshot()), tasks: tasks.clone() };
    let cold = Preparer::new(runtime(), wasmsched_plugins::table().collect())
        .prepare(&fetched(&spread, &[]), 99, &sample)
        .unwrap();
    for t in &tasks {
        let kept = place(&registry.current().set, &lp.nodes, t, 0).map(|p| p.node);
        assert_eq!(kept, place(&cold.set, &lp.nodes, t, 0).map(|p| p.node), "{}", t.id);
    }

    // A set-level change (a weight) keeps every plugin; the kept ones name the version they
    // came from.
    let weighted = spread.replace("{ plugin: pack }", "{ plugin: pack, weight: 2 }");
    registry.offer(&fetched(&weighted, &[]), &preparer).unwrap();
    let third = registry.current();
    assert_eq!((info(&third, "fit").kept_from, info(&third, "pack").kept_from), (Some(v), Some(v)));
    assert!(Arc::ptr_eq(&info(&third, "fit").plugin, &fit.plugin));
    // Changed budgets load a plugin anew, and so does every plugin when keeping is off.
    let slower = weighted.replace("least-allocated\", deadline_ms: 2000", "least-allocated\", deadline_ms: 3000");
    assert_ne!(slower, weighted);
    registry.offer(&fetched(&slower, &[]), &preparer).unwrap();
    let fourth = registry.current();
    assert_eq!((info(&fourth, "fit").kept_from, info(&fourth, "pack").kept_from), (Some(third.version), None));
    registry.offer(&fetched(&slower, &[]), &preparer.clone().keep_unchanged(false)).unwrap();
    let fifth = registry.current();
    assert!(fifth.plugins.iter().all(|p| p.kept_from.is_none()));
    assert!(!Arc::ptr_eq(&info(&fifth, "fit").plugin, &fit.plugin));
    lp.run(&registry, 20, "ok");
}

#[test]
fn a_baseline_older_than_a_probation_is_not_compared_with() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, preparer, _sink) = registry(&dir.path().join("events.jsonl"));
    // The unschedulable baseline alone: the latency ratio (a wall-clock p99, 5× by default) can trip
    // first on a loaded machine — it did once in a CI run, rolling back for latency.
    let spec = FIT_AND_PACK.to_string() + "rollback: { window: 100, probation: 300, max_p99_ratio: null }\n";
    let unschedulable = |lp: &mut Loop, n: usize| {
        for _ in 0..n {
            let mut t = lp.next_task("huge");
            t.request.cpu_milli = u64::MAX / 4;
            lp.decide(&registry, t);
        }
    };
    let mut lp = Loop::new(32, 4);
    // The initial version's window (500 decisions by its spec) is the baseline.
    lp.run(&registry, 500, "ok");
    let base = registry.status().live_window.expect("a full window");
    assert!(base.unschedulable_rate < 0.5, "{base:?}");
    // Against a fresh baseline the rise trips.
    let v = registry.offer(&fetched(&spec, &[]), &preparer).unwrap();
    unschedulable(&mut lp, 100);
    assert_eq!(registry.current().version, 1, "version {v} rolled back");
    assert!(registry.status().history[1].reason.starts_with("unschedulable 100.0% > previous set's"));

    // Versions replaced while on probation, one after the other: 450 decisions later the last
    // good version's window is older than a probation and a window (400 decisions).
    registry.offer(&fetched(&spec, &[]), &preparer).unwrap();
    lp.run(&registry, 250, "ok");
    let last = registry.offer(&fetched(&spec, &[]), &preparer).unwrap();
    lp.run(&registry, 200, "ok");
    unschedulable(&mut lp, 100);
    assert_eq!(registry.current().version, last, "judged against a stale baseline: {:?}", registry.status().history);
    let label = format!("packing@{last}");
    assert!(registry.status().history.iter().all(|h| h.label != label || h.outcome != Outcome::RolledBack));
}

/// The synthetic sample with every task renamed `evil-…`, so the hostile fixture misbehaves.
fn evil_sample() -> wasmsched_registry::Sample {
    let mut sample = wasmsched_registry::Sample::synthetic();
    for t in &mut sample.tasks {
        t.id = t.id.replace("smoke", "evil");
    }
    sample
}

/// The smoke gate calls the preempt and fair-share plugins, which placing the sample never
/// reaches: a set whose fair-share plugin answers an error, or whose preempt plugin answers a
/// plan that points nowhere, is refused offline instead of faulting once live.
#[test]
fn the_smoke_gate_calls_preempt_and_fair_share_too() {
    let hostile = fixtures::read(fixtures::HOSTILE);
    let digest = digest_of(&hostile);
    let spec = |victims: &str, shares: &str| {
        format!(
            "name: guarded\nplugins:\n  fit: {{ source: \"builtin:resource-fit\", deadline_ms: 2000 }}\n  victims: {{ source: \"file:h.wasm\", digest: \"{digest}\", config: {victims}, deadline_ms: 2000 }}\n  shares: {{ source: \"file:h.wasm\", digest: \"{digest}\", config: {shares}, deadline_ms: 2000 }}\nstages:\n  filter: [fit]\n  preempt: victims\n  fair_share: shares\n"
        )
    };
    let preparer = Preparer::new(runtime(), wasmsched_plugins::table().collect());
    let prepare = |victims: &str, shares: &str| {
        preparer.prepare(
            &fetched(&spec(victims, shares), &[("victims", &hostile), ("shares", &hostile)]),
            1,
            &evil_sample(),
        )
    };
    prepare("ok", "ok").expect("well-behaved preempt and fair share pass");
    let e = prepare("ok", "guest-error").expect_err("a failing fair share is refused").to_string();
    assert!(e.contains("fair-share on the sample cluster") && e.contains("refuses to compute shares"), "{e}");
    let e = prepare("bad-victims", "ok").expect_err("a garbage preemption plan is refused").to_string();
    assert!(e.contains("preempt on the sample cluster") && e.contains("(bad-output)"), "{e}");
}

/// The gates give a deadline fault one more try on a fresh instance, because a busy machine can
/// charge a call for time that was not the guest's. An attacker cannot ride that: a plugin that
/// loops overruns its retry too and fails, after exactly two cut calls.
#[test]
fn a_looping_plugin_fails_its_retry_too() {
    use wasmsched_api::Stage;
    use wasmsched_core::FaultKind;
    let rt = runtime();
    let looping = rt
        .load(&fixtures::read(fixtures::HOSTILE), wasmsched_runtime::PluginConfig::new("looping").with_config("loop"))
        .unwrap();
    let tried = wasmsched_registry::exercise_stage(&looping, Stage::Filter, &evil_sample());
    let fault = tried.run.outcome.expect_err("a loop never answers");
    assert_eq!(fault.kind, FaultKind::Deadline, "{fault}");
    assert!(tried.overran.is_none(), "nothing was forgiven");
    assert_eq!(looping.metrics().faults(FaultKind::Deadline), 2, "one retry, no more");
    assert_eq!(looping.metrics().instances_discarded(), 2, "each overrun discards its instance");
}

/// `exercise` (what `plugin check` runs) calls every stage the plugin exports and reports each
/// answer or fault on its own.
#[test]
fn exercise_calls_every_exported_stage_and_reports_each_fault() {
    use wasmsched_api::Stage;
    use wasmsched_core::{FaultKind, PolicyPlugin};
    let rt = runtime();
    let hostile = fixtures::read(fixtures::HOSTILE);
    let sample = evil_sample();
    let ok = rt.load(&hostile, crate::unhurried("ok").with_config("ok")).unwrap();
    let runs = wasmsched_registry::exercise(&ok, ok.stages(), &sample);
    let stages: Vec<Stage> = runs.iter().map(|r| r.stage).collect();
    assert_eq!(stages, [Stage::Filter, Stage::Score, Stage::Preempt, Stage::FairShare]);
    for r in &runs {
        let answer = r.outcome.as_ref().unwrap_or_else(|f| panic!("{}: {f}", r.stage));
        assert!(!answer.is_empty());
    }
    assert!(runs[0].outcome.as_ref().unwrap().contains("4 of 4 nodes fit"), "{:?}", runs[0].outcome);

    let panicking = rt.load(&hostile, crate::unhurried("panicking").with_config("panic")).unwrap();
    let runs = wasmsched_registry::exercise(&panicking, panicking.stages(), &sample);
    let kinds: Vec<Option<FaultKind>> = runs.iter().map(|r| r.outcome.as_ref().err().map(|f| f.kind)).collect();
    // Filter, score and preempt panic on evil tasks; its fair share does not look at tasks.
    assert_eq!(kinds, [Some(FaultKind::Trap), Some(FaultKind::Trap), Some(FaultKind::Trap), None]);
}
