//! The chart's Grafana dashboards and alert rules against the metrics a real run exports: every
//! series and label their PromQL names must be on the scheduler's `/metrics` (scraped over HTTP
//! from a scheduler on the fake API server that binds, preempts, waits, faults and publishes
//! events), every expression must parse (`promtool`), the rules must pass `promtool check rules`
//! and their unit tests (`promtool test rules`), and the dashboards must carry what Grafana needs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use wasmsched_events::{EventSink, Origin, OutboxConfig};
use wasmsched_kube::metrics::Metrics;
use wasmsched_kube::{Scheduler, SchedulerConfig, policy};
use wasmsched_registry::{Fetched, PolicySetSpec};

use wasmsched_tests::promql::{
    alert_rules, chart, dashboards, exposition, panels, promtool, run_ok, scrape, used_series,
};

use crate::boundary::{NAME, eventually, node_of, preparer};
use crate::support::fake_api::{FakeApi, Kind, gpu_node, pod};

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let rules = chart().join("files/alerts.yaml");
    let checked = run_ok({
        let mut c = promtool();
        c.args(["check", "rules"]).arg(&rules);
        c
    });
    assert!(checked.contains("SUCCESS"), "{checked}");
    // The unit tests: each alert fires on a series that should page and stays quiet on one that
    // should not.
    let tested = run_ok({
        let mut c = promtool();
        c.args(["test", "rules"]).arg(chart().join("ci/alerts-test.yaml"));
        c
    });
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test that expects it to fire, and a runbook section.
    let alerts = alert_rules();
    let tests = std::fs::read_to_string(chart().join("ci/alerts-test.yaml")).unwrap();
    let runbooks = std::fs::read_to_string(chart().join("../../docs/observability.md")).unwrap();
    for (name, _) in &alerts {
        assert!(tests.contains(&format!("alertname: {name}")), "{name} has no promtool unit test");
        assert!(runbooks.contains(&format!("### {name}")), "{name} has no runbook section in docs/observability.md");
    }
    // The chart's values schema lists every alert an operator may disable, and no other.
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap()).unwrap();
    let listed: BTreeSet<&str> = schema["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"]
        .as_array()
        .expect("an enum of alert names")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let names: BTreeSet<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(listed, names, "values.schema.json's prometheusRule.disabled enum");
}

#[test]
fn the_dashboards_carry_what_grafana_needs() {
    let dashboards = dashboards();
    assert!(dashboards.len() >= 4, "{:?}", dashboards.keys());
    let mut uids = BTreeSet::new();
    for (file, d) in &dashboards {
        assert!(uids.insert(d["uid"].as_str().unwrap_or_else(|| panic!("{file}: no uid")).to_string()), "{file}: uid");
        assert!(d["title"].as_str().is_some_and(|t| t.starts_with("wasmsched / ")), "{file}: title");
        assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "{file}: schemaVersion");
        let vars = d["templating"]["list"].as_array().unwrap_or_else(|| panic!("{file}: no variables"));
        let datasource =
            vars.iter().find(|v| v["type"] == "datasource").unwrap_or_else(|| panic!("{file}: no datasource variable"));
        assert_eq!(datasource["query"], "prometheus", "{file}");
        let var = format!("${{{}}}", datasource["name"].as_str().unwrap());
        let mut ids = BTreeSet::new();
        for panel in panels(d) {
            let id = panel["id"].as_u64().unwrap_or_else(|| panic!("{file}: a panel without id: {panel}"));
            assert!(ids.insert(id), "{file}: panel id {id} twice");
            let pos = &panel["gridPos"];
            for k in ["x", "y", "w", "h"] {
                assert!(pos[k].is_u64(), "{file}: panel {id} gridPos.{k}");
            }
            assert!(
                pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24,
                "{file}: panel {id} wider than the grid"
            );
            if panel["type"] == "row" {
                continue;
            }
            assert!(panel["title"].as_str().is_some_and(|t| !t.is_empty()), "{file}: panel {id} title");
            assert_eq!(panel["datasource"]["uid"], var.as_str(), "{file}: panel {id} uses the datasource variable");
            let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("{file}: panel {id} has no queries"));
            assert!(!targets.is_empty(), "{file}: panel {id} has no queries");
            let mut refs = BTreeSet::new();
            for t in targets {
                assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()), "{file}: panel {id} empty query");
                assert!(refs.insert(t["refId"].as_str().unwrap().to_string()), "{file}: panel {id} refId twice");
            }
        }
        // No two panels overlap on the grid.
        let mut cells = BTreeSet::new();
        for panel in panels(d) {
            let p = &panel["gridPos"];
            let (x, y, w, h) = (
                p["x"].as_u64().unwrap(),
                p["y"].as_u64().unwrap(),
                p["w"].as_u64().unwrap(),
                p["h"].as_u64().unwrap(),
            );
            for cx in x..x + w {
                for cy in y..y + h {
                    assert!(cells.insert((cx, cy)), "{file}: panel {} overlaps another at ({cx}, {cy})", panel["id"]);
                }
            }
        }
    }
}

/// What a scheduler exports that its dashboards and alerts read, exercised: binds, a pod that
/// waits, a priority preemption and its eviction, a plugin that faults, an unhealthy GPU, a node
/// pool, queues with deserved shares, events to a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_and_label_the_dashboards_and_alerts_use_is_exported() {
    let api = FakeApi::new();
    let mut sick = gpu_node("gpu-0", 8, &[("wasmsched.io/node-pool", "train")]);
    sick["metadata"]["annotations"] = json!({"wasmsched.io/unhealthy-gpus": "7"});
    api.put(Kind::Node, sick);
    api.put(Kind::Node, gpu_node("gpu-1", 8, &[]));
    for team in ["research", "prod"] {
        api.put(Kind::Queue, json!({"metadata": {"name": team}, "spec": {"weight": 1}}));
    }
    let in_queue = |mut p: Value, queue: &str| {
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": queue});
        p
    };
    // gpu-0 has 7 usable GPUs: only gpu-1 takes 8.
    api.put(Kind::Pod, in_queue(pod("ml", "low", NAME, 8, "4", "32Gi"), "research"));
    let dir = std::env::temp_dir().join(format!("wasmsched-observability-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "o".into() };
    let sink = EventSink::jsonl(dir.join("events.jsonl"), origin, OutboxConfig::default()).unwrap();
    // The usage meter on `/metrics`, as `wasmsched run` hangs it on the scheduler.
    let (meter, usage) = wasmsched_usage::exporter::metered();
    let metrics = Metrics::with_collectors(NAME, vec![usage]);
    let registry = policy::registry(preparer(), &with_hostile_score(), None, 0).expect("the policy prepares");
    let scheduler = Scheduler::new(api.clients("a", None), registry, metrics.clone(), SchedulerConfig::new(NAME))
        .with_events(sink)
        .with_observer(meter);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(scheduler.run(rx));
    let listener = wasmsched_kube::metrics::listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(wasmsched_kube::metrics::serve(listener, metrics.clone()));

    eventually("low bound", Duration::from_secs(30), || node_of(&api, "ml/low").is_some()).await;
    // The hostile plugin panics scoring tasks whose id starts with "evil" (fail-open: skipped).
    api.put(Kind::Pod, in_queue(pod("evil", "evil-1", NAME, 1, "1", "1Gi"), "research"));
    eventually("evil-1 bound", Duration::from_secs(30), || node_of(&api, "evil/evil-1").is_some()).await;
    // A higher-priority pod of the same queue takes low's node; one of the other queue waits.
    let mut high = in_queue(pod("ml", "high", NAME, 8, "4", "32Gi"), "research");
    high["spec"]["priority"] = json!(10);
    api.put(Kind::Pod, high);
    api.put(Kind::Pod, in_queue(pod("ml", "waits", NAME, 8, "4", "32Gi"), "prod"));
    eventually("low evicted", Duration::from_secs(30), || !api.state().evictions.is_empty()).await;
    eventually("high bound", Duration::from_secs(30), || node_of(&api, "ml/high").is_some()).await;

    // Gauges refresh twice a second and the GPUs' rows every few: scrape until all are there.
    // (What the node agents export is checked against an agent: host/agent's tests.)
    let uses: Vec<_> = used_series().into_iter().filter(|u| !u.reads_agents()).collect();
    let started = std::time::Instant::now();
    let missing = loop {
        let exported = exposition(&scrape(addr));
        let missing: Vec<String> = uses.iter().filter_map(|u| u.check(&exported).err()).collect();
        if missing.is_empty() || started.elapsed() > Duration::from_secs(30) {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(missing.is_empty(), "{missing:#?}");
    // Counters of rare events are there from zero, so the first one is an increase an alert sees
    // (Prometheus' `increase` ignores a series' first sample).
    let text = scrape(addr);
    for zero in [
        r#"wasmsched_plugin_faults_total{plugin="fit",extension_point="Filter",kind="trap"} 0"#,
        r#"wasmsched_plugin_faults_total{plugin="hostile",extension_point="Score",kind="deadline"} 0"#,
        r#"wasmsched_preemptions_total{reason="reclaim"} 0"#,
        r#"wasmsched_evictions_total{result="abandoned"} 0"#,
        r#"wasmsched_binds_total{result="throttled"} 0"#,
        r#"wasmsched_events_dropped_total 0"#,
        r#"wasmsched_policy_outcomes_total{outcome="rolled-back"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == zero), "no {zero}: {text}");
    }
    assert!(text.contains(r#"wasmsched_plugin_faults_total{plugin="hostile",extension_point="Score",kind="trap"} "#));

    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(20), task).await.expect("stops in time").unwrap();
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default policy with one more score: the hostile fixture, panicking on `evil*` tasks.
fn with_hostile_score() -> Fetched {
    let hostile = std::fs::read(wasmsched_tests::fixtures::HOSTILE).expect("the hostile fixture is built");
    let digest = wasmsched_registry::digest_of(&hostile);
    let spec = policy::DEFAULT_POLICY
        .replace(
            "  preempt:                    # picks victims",
            &format!(
                "  hostile: {{ source: \"file:hostile.wasm\", digest: \"{digest}\", config: panic, failure: fail-open }}\n  preempt:                    # picks victims"
            ),
        )
        .replace("    - { plugin: affinity, weight: 2 }", "    - { plugin: affinity, weight: 2 }\n    - { plugin: hostile, weight: 1 }");
    assert!(spec.contains("plugin: hostile"), "the default policy's layout changed: {spec}");
    Fetched {
        spec: PolicySetSpec::parse("observability test", &spec).expect("valid spec"),
        origin: "test".into(),
        artifacts: [("hostile".to_string(), Arc::from(hostile.as_slice()))].into_iter().collect(),
        fingerprint: String::new(),
    }
}
