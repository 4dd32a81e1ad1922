//! The stream describes the cluster it schedules — each node's capacity, each queue's
//! configuration, each pod's arrival — once, and again only when they change: what `wasmsched
//! scenario from-events` rebuilds a team's cluster and work from.

use std::time::Duration;

use serde_json::{Value, json};
use wasmsched_events::{EventSink, Origin, OutboxConfig};

use crate::boundary::{NAME, eventually, node_of, start_full};
use crate::support::fake_api::{FakeApi, Kind, gpu_node, pod};

fn events_of(file: &std::path::Path, kind: &str) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_queues_and_arrivals_are_published_once_and_again_when_they_change() {
    let api = FakeApi::new();
    api.put(Kind::Node, gpu_node("gpu-0", 8, &[("wasmsched.io/node-pool", "train")]));
    api.put(Kind::Node, gpu_node("gpu-1", 4, &[]));
    api.put(Kind::Queue, json!({"metadata": {"name": "research"}, "spec": {"weight": 2}}));
    api.put(
        Kind::Queue,
        json!({"metadata": {"name": "prod"}, "spec": {"weight": 1, "guarantee": {"nvidia.com/gpu": "4"}}}),
    );
    let in_queue = |mut p: Value, queue: &str| {
        p["metadata"]["annotations"] = json!({"scheduling.wasmsched.io/queue": queue});
        p
    };
    api.put(Kind::Pod, in_queue(pod("ml", "a", NAME, 8, "4", "32Gi"), "research"));
    // Bound before this scheduler started (by its predecessor): taken over, and said as running.
    let mut before = in_queue(pod("ml", "before", NAME, 2, "2", "8Gi"), "prod");
    before["spec"]["nodeName"] = json!("gpu-1");
    before["status"] = json!({"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-22T10:00:05Z"}]});
    api.put(Kind::Pod, before);
    // Fits on no node: it waits, and is tried again and again.
    api.put(Kind::Pod, in_queue(pod("ml", "waits", NAME, 16, "4", "32Gi"), "prod"));
    let file = std::env::temp_dir().join(format!("wasmsched-kube-history-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let origin = Origin { source: "wasmsched/test/scheduler".into(), id_prefix: "h".into() };
    let sink = EventSink::jsonl(&file, origin, OutboxConfig::default()).unwrap();
    let run = start_full(api.clients("a", None), None, Some(sink.clone()));
    eventually("a bound", Duration::from_secs(30), || node_of(&api, "ml/a").is_some()).await;
    // Several cycles pass with `waits` pending.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A node is relabelled, the other leaves; a queue's weight changes.
    let mut relabelled = gpu_node("gpu-0", 8, &[("wasmsched.io/node-pool", "train-v2")]);
    relabelled["metadata"]["resourceVersion"] = json!("99");
    api.put(Kind::Node, relabelled);
    api.remove(Kind::Node, "gpu-1");
    api.put(Kind::Queue, json!({"metadata": {"name": "research"}, "spec": {"weight": 3}}));
    let file_ = file.clone();
    eventually("the changes published", Duration::from_secs(20), || {
        assert!(sink.flush(Duration::from_secs(5)));
        let nodes = events_of(&file_, "io.wasmsched.node.capacity-changed.v1");
        let queues = events_of(&file_, "io.wasmsched.queue.configured.v1");
        nodes.iter().any(|e| e["data"]["removed"] == true)
            && nodes.iter().any(|e| e["data"]["node_pool"] == "train-v2")
            && queues.iter().any(|e| e["data"]["weight"] == 3)
    })
    .await;
    // The waiting pod is deleted (its user gave up), and the running one: the first is
    // withdrawn, the second ended.
    api.remove(Kind::Pod, "ml/waits");
    api.remove(Kind::Pod, "ml/a");
    let file_ = file.clone();
    eventually("the deletions published", Duration::from_secs(20), || {
        assert!(sink.flush(Duration::from_secs(5)));
        !events_of(&file_, "io.wasmsched.task.withdrawn.v1").is_empty()
            && !events_of(&file_, "io.wasmsched.task.ended.v1").is_empty()
    })
    .await;
    run.stop().await;
    assert!(sink.flush(Duration::from_secs(10)));
    let withdrawn = events_of(&file, "io.wasmsched.task.withdrawn.v1");
    assert_eq!(withdrawn.len(), 1, "only the pod that never ran is withdrawn: {withdrawn:#?}");
    assert_eq!(
        (withdrawn[0]["data"]["task"]["id"].as_str(), withdrawn[0]["data"]["task"]["queue"].as_str()),
        (Some("ml/waits"), Some("prod"))
    );
    // Created at 10:00:00 of a day gone by: it waited from then.
    assert!(withdrawn[0]["data"]["waited_seconds"].as_u64().unwrap() > 3600, "{withdrawn:#?}");
    let ended = events_of(&file, "io.wasmsched.task.ended.v1");
    assert_eq!(
        (ended.len(), ended[0]["data"]["task"]["id"].as_str(), ended[0]["data"]["reason"].as_str()),
        (1, Some("ml/a"), Some("deleted"))
    );

    let nodes = events_of(&file, "io.wasmsched.node.capacity-changed.v1");
    let said: Vec<(String, String, bool)> = nodes
        .iter()
        .map(|e| {
            let d = &e["data"];
            (d["node"].as_str().unwrap().into(), d["node_pool"].as_str().unwrap_or("-").into(), d["removed"] == true)
        })
        .collect();
    let want = |node: &str, pool: &str, removed: bool| (node.to_string(), pool.to_string(), removed);
    // Binding `a` changed what gpu-0 has allocated, not what it offers: no event for that.
    assert_eq!(
        said.iter().filter(|s| s.0 == "gpu-0").cloned().collect::<Vec<_>>(),
        [want("gpu-0", "train", false), want("gpu-0", "train-v2", false)],
        "{nodes:#?}"
    );
    assert_eq!(
        said.iter().filter(|s| s.0 == "gpu-1").cloned().collect::<Vec<_>>(),
        [want("gpu-1", "-", false), want("gpu-1", "-", true)],
        "{nodes:#?}"
    );
    let first = &nodes.iter().find(|e| e["data"]["node"] == "gpu-0").unwrap()["data"];
    assert_eq!((first["gpus"].as_u64(), first["cpu_milli"].as_u64()), (Some(8), Some(191_450)), "{first}");
    assert_eq!(first["labels"]["wasmsched.io/node-pool"], "train");

    let queues = events_of(&file, "io.wasmsched.queue.configured.v1");
    let research: Vec<u64> = queues
        .iter()
        .filter(|e| e["data"]["queue"] == "research")
        .map(|e| e["data"]["weight"].as_u64().unwrap())
        .collect();
    assert_eq!(research, [2, 3], "{queues:#?}");
    let prod: Vec<&Value> = queues.iter().filter(|e| e["data"]["queue"] == "prod").collect();
    assert_eq!(prod.len(), 1, "unchanged queues are not published again: {queues:#?}");
    assert_eq!(prod[0]["data"]["guarantee"]["gpu_milli"], 4000);

    // Each pod arrived once, stamped with its creation, however often it was tried.
    let arrivals = events_of(&file, "io.wasmsched.task.submitted.v1");
    let ids: Vec<&str> = arrivals.iter().map(|e| e["data"]["task"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{arrivals:#?}");
    assert!(ids.contains(&"ml/a") && ids.contains(&"ml/waits") && ids.contains(&"ml/before"), "{ids:?}");
    let before = arrivals.iter().find(|e| e["data"]["task"]["id"] == "ml/before").unwrap();
    assert_eq!(before["data"]["running"], json!({"node": "gpu-1", "since": "2026-11-22T10:00:05.000Z"}));
    let arrivals: Vec<Value> = arrivals.into_iter().filter(|e| e["data"]["task"]["id"] != "ml/before").collect();
    let attempts = events_of(&file, "io.wasmsched.task.unschedulable.v1").len();
    assert!(attempts >= 1, "waits was tried");
    for e in &arrivals {
        assert_eq!(e["time"], "2026-11-22T10:00:00.000Z", "{e}");
        let r = &e["data"]["request"];
        let gpus = if e["data"]["task"]["id"] == "ml/a" { 8 } else { 16 };
        assert_eq!(
            (r["gpus"].as_u64(), r["gpu_milli"].as_u64(), r["cpu_milli"].as_u64()),
            (Some(gpus), Some(1000), Some(4000))
        );
        assert_eq!(r["memory_bytes"].as_u64(), Some(32 << 30));
    }
    let waits = arrivals.iter().find(|e| e["data"]["task"]["id"] == "ml/waits").unwrap();
    assert_eq!(waits["data"]["task"]["queue"], "prod");
    let _ = std::fs::remove_file(&file);
}

/// `wasmsched scenario from-cluster` reads the cluster through this: every node, every queue
/// (parents first), pods bound by anyone (they hold what they use) with their starts, and the
/// pods waiting for this scheduler, a gang's members with their group's min-member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_the_stream_of_the_cluster_as_it_is_now() {
    use wasmsched_events::schema::Payload;

    let api = FakeApi::new();
    api.put(Kind::Node, gpu_node("gpu-0", 8, &[("wasmsched.io/node-pool", "train")]));
    api.put(Kind::Node, gpu_node("gpu-1", 4, &[]));
    // A child listed before its parent: the snapshot puts parents first, as a queue tree needs.
    api.put(Kind::Queue, json!({"metadata": {"name": "research"}, "spec": {"weight": 2, "parent": "org"}}));
    api.put(Kind::Queue, json!({"metadata": {"name": "org"}, "spec": {"weight": 1}}));
    api.put(Kind::PodGroup, json!({"metadata": {"name": "train", "namespace": "ml"}, "spec": {"minMember": 2}}));
    let mut running = pod("ml", "running", NAME, 4, "4", "32Gi");
    running["spec"]["nodeName"] = json!("gpu-0");
    running["status"] = json!({"phase": "Running", "startTime": "2026-11-22T10:00:30Z"});
    api.put(Kind::Pod, running);
    // Bound by kube-scheduler: it holds its CPU all the same.
    let mut system = pod("kube-system", "dns", "default-scheduler", 0, "1", "1Gi");
    system["spec"]["nodeName"] = json!("gpu-1");
    system["status"] = json!({"phase": "Running"});
    api.put(Kind::Pod, system);
    for i in 0..2 {
        let mut member = pod("ml", &format!("train-{i}"), NAME, 8, "4", "32Gi");
        member["metadata"]["labels"]["scheduling.wasmsched.io/pod-group"] = json!("train");
        api.put(Kind::Pod, member);
    }
    api.put(Kind::Pod, pod("other", "theirs", "default-scheduler", 1, "1", "1Gi"));
    let mut done = pod("ml", "done", NAME, 1, "1", "1Gi");
    done["spec"]["nodeName"] = json!("gpu-1");
    done["status"] = json!({"phase": "Succeeded"});
    api.put(Kind::Pod, done);
    // DRA: a class, a slice of four devices, a claim allocated to a running pod (it holds its
    // device), a waiting pod's claim named by it and one whose template's claim is not made yet.
    api.put(Kind::DeviceClass, json!({"metadata": {"name": "gpu"}, "spec": {}}));
    let devices: Vec<Value> = (0..4).map(|i| json!({"name": format!("gpu-{i}")})).collect();
    api.put(
        Kind::ResourceSlice,
        json!({"metadata": {"name": "gpu-0-dra"},
               "spec": {"driver": "gpu.example.com", "nodeName": "gpu-0",
                        "pool": {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    );
    let request =
        json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 1}}]}});
    api.put(
        Kind::ResourceClaim,
        json!({"metadata": {"name": "held", "namespace": "ml"}, "spec": request,
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.example.com", "pool": "gpu-0", "device": "gpu-0"}]}}}}),
    );
    api.put(Kind::ResourceClaim, json!({"metadata": {"name": "wanted", "namespace": "ml"}, "spec": request}));
    for (name, source) in [
        ("wants", json!({"name": "gpu", "resourceClaimName": "wanted"})),
        ("templated", json!({"name": "gpu", "resourceClaimTemplateName": "one-gpu"})),
    ] {
        let mut p = pod("ml", name, NAME, 0, "1", "1Gi");
        p["spec"]["resourceClaims"] = json!([source]);
        p["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "gpu"}]);
        api.put(Kind::Pod, p);
    }

    let snapshot = wasmsched_kube::snapshot::take(api.client("snapshot"), NAME, &Default::default()).await.unwrap();
    let kinds: Vec<(&str, String)> = snapshot.events.iter().map(|e| (e.kind().name(), e.subject.clone())).collect();
    let of = |kind: &str| kinds.iter().filter(|(k, _)| *k == kind).map(|(_, s)| s.as_str()).collect::<Vec<_>>();
    assert_eq!(of("node-capacity-changed"), ["gpu-0", "gpu-1"]);
    assert_eq!(of("queue-configured"), ["org", "research"], "parents first");
    let mut arrived = of("task-submitted");
    arrived.sort();
    assert_eq!(
        arrived,
        ["kube-system/dns", "ml/running", "ml/templated", "ml/train-0", "ml/train-1", "ml/wants"],
        "live pods only, ours or bound"
    );
    assert!(of("task-scheduled").is_empty(), "a snapshot publishes no placement it did not make");
    assert!(snapshot.notes.iter().any(|n| n == "1 pending pods of other schedulers left out"), "{:?}", snapshot.notes);
    // Bound pods say where they run and since when (their start when no PodScheduled condition).
    let running: Vec<(String, String, String)> = snapshot
        .events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::TaskSubmitted(s) => {
                s.running.as_ref().map(|r| (s.task.id.clone(), r.node.clone(), r.since.to_string()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        running,
        [
            ("kube-system/dns".to_string(), "gpu-1".to_string(), "2026-11-22T10:00:00.000Z".to_string()),
            ("ml/running".to_string(), "gpu-0".to_string(), "2026-11-22T10:00:30.000Z".to_string()),
        ]
    );
    let gang = snapshot
        .events
        .iter()
        .find_map(|e| match &e.payload {
            Payload::TaskSubmitted(s) if s.task.id == "ml/train-0" => s.gang.clone(),
            _ => None,
        })
        .expect("a gang member says its gang");
    assert_eq!((gang.name.as_str(), gang.members, gang.min_member), ("train", 2, 2));
    assert!(snapshot.events.windows(2).all(|w| w[0].time <= w[1].time), "in time order");
    // DRA: the devices, what holds some now, and what each waiting pod asks for.
    let dra = snapshot.dra.expect("the cluster serves DRA");
    assert_eq!((dra.slices.len(), dra.classes.len()), (1, 1));
    let held: Vec<_> = dra.allocated.iter().map(|c| c.metadata.name.as_deref().unwrap_or_default()).collect();
    assert_eq!(held, ["held"], "only allocated claims hold devices");
    assert_eq!(dra.pending.keys().collect::<Vec<_>>(), ["ml/wants"]);
    let asked = &dra.pending["ml/wants"][0];
    assert_eq!(serde_json::to_value(asked).unwrap(), request);
    let notes = snapshot.notes.join("; ");
    assert!(notes.contains("pod ml/templated: template one-gpu of claim gpu not found"), "{notes}");
    assert!(notes.contains("pod ml/wants: claim wanted is named, not made from a template"), "{notes}");
}
