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
    run.stop().await;
    assert!(sink.flush(Duration::from_secs(10)));

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
    assert_eq!(ids.len(), 2, "{arrivals:#?}");
    assert!(ids.contains(&"ml/a") && ids.contains(&"ml/waits"), "{ids:?}");
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
