//! `wasmsched topo` through the real command: show a parsed topology, choose GPUs with reasons.

use std::process::{Command, Output};

fn wasmsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched")).args(args).output().expect("run wasmsched")
}

fn fixture(name: &str) -> String {
    format!("{}/../topology/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn json(o: Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn shows_a_topology_and_its_labels() {
    let doc = json(wasmsched(&["topo", &fixture("dgx1v-8gpu-nv1-nv2-cube-mesh.txt"), "--json"]));
    assert_eq!(doc["topology"]["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(doc["topology"]["links"].as_array().unwrap().len(), 28);
    assert_eq!(doc["labels"]["wasmsched.io/gpu-interconnect"], "nvlink");
    let text = String::from_utf8(wasmsched(&["topo", &fixture("dgx1v-8gpu-nv1-nv2-cube-mesh.txt")]).stdout).unwrap();
    assert!(text.contains("NV2") && text.contains("interconnect: nvlink"), "{text}");
}

#[test]
fn chooses_gpus_and_says_why_the_others_lose() {
    // The classic example: NVLink pairs, GPUs {0,4,5} free, 2 wanted → {4,5}, not {0,4} over SYS.
    let doc = json(wasmsched(&["topo", &fixture("pcie-6gpu-pix-pairs.txt"), "-k", "2", "--free", "0,4,5", "--json"]));
    assert_eq!(doc["choice"]["gpus"], serde_json::json!([4, 5]));
    assert_eq!(doc["candidates"], 3);
    let alternatives = doc["alternatives"].as_array().unwrap();
    assert_eq!(alternatives.len(), 2);
    assert!(alternatives.iter().all(|a| a["loses_on"] == "bottleneck bandwidth"), "{alternatives:?}");
    // Reading back the agent's annotation format works the same.
    let shown = json(wasmsched(&["topo", &fixture("pcie-6gpu-pix-pairs.txt"), "--json"]));
    let dir = tempfile::tempdir().unwrap();
    let annotation = dir.path().join("topology.json");
    std::fs::write(&annotation, shown["topology"].to_string()).unwrap();
    let again = json(wasmsched(&["topo", annotation.to_str().unwrap(), "-k", "2", "--free", "0,4,5", "--json"]));
    assert_eq!(again["choice"], doc["choice"]);
    // CPUs next to the chosen GPUs (NUMA 1 here: GPUs 4 and 5), as a numactl line.
    let pinned = json(wasmsched(&[
        "topo",
        &fixture("pcie-6gpu-pix-pairs.txt"),
        "-k",
        "2",
        "--free",
        "0,4,5",
        "--cpus",
        "8",
        "--json",
    ]));
    assert_eq!(
        pinned["numactl"],
        serde_json::json!(["numactl", "--physcpubind=24-31", "--membind=1", "--", "<command>"])
    );
    // Unsatisfiable requests say why, and fail.
    let none = wasmsched(&[
        "topo",
        &fixture("pcie-6gpu-pix-pairs.txt"),
        "-k",
        "3",
        "--free",
        "0,1,4,5",
        "--policy",
        "single-numa-node",
        "--json",
    ]);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no 3 GPUs fit"));
    let none: serde_json::Value = serde_json::from_slice(&none.stdout).unwrap();
    assert!(none["choice"].is_null());
    assert!(none["unsatisfiable"].as_str().unwrap().contains("single-numa-node"), "{none}");
}

/// The H200 machine lent to the project (one GPU in a virtual machine, driver 580.159.04): its
/// recorded `nvidia-smi topo -m` and the agent's NVML report of it give the same answers.
#[test]
fn the_recorded_h200_machine_answers_from_both_sources() {
    let report =
        format!("{}/../nvml/tests/fixtures/h200-driver-580.159.04-agent-discover.json", env!("CARGO_MANIFEST_DIR"));
    for source in [fixture("h200-1gpu-vm-driver-580.159.04.txt"), report] {
        let one = json(wasmsched(&["topo", &source, "-k", "1", "--cpus", "8", "--json"]));
        assert_eq!(one["choice"]["gpus"], serde_json::json!([0]), "{source}");
        assert_eq!(
            one["numactl"],
            serde_json::json!(["numactl", "--physcpubind=0-7", "--membind=0", "--", "<command>"])
        );
        let two = wasmsched(&["topo", &source, "-k", "2"]);
        assert_eq!(two.status.code(), Some(1), "{source}");
        assert!(String::from_utf8_lossy(&two.stdout).contains("1 free GPUs, 2 requested"));
    }
}

#[test]
fn bad_input_is_refused_clearly() {
    let cases: [(&[&str], &str); 4] = [
        (&["topo", "/nonexistent"], "reading /nonexistent"),
        (&["topo", &fixture("README.md")], "no header line"),
        (&["topo", &fixture("pcie-6gpu-pix-pairs.txt"), "-k", "2", "--policy", "numa-ish"], "unknown NUMA policy"),
        (&["topo", &fixture("pcie-6gpu-pix-pairs.txt"), "-k", "2", "--free", "0,9"], "GPU 9"),
    ];
    for (args, expected) in cases {
        let o = wasmsched(args);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

fn replay(args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "replay",
        "--scenario",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/scenarios/topology.json"),
        "--json",
        // Every job placed exactly once under every policy (reclaim would re-place some).
        "--no-preemption",
    ];
    all.extend_from_slice(args);
    json(wasmsched(&all))
}

#[test]
fn topology_aware_replay_keeps_multi_gpu_jobs_on_fast_links() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let topo = replay(&["--policy", "gpu-topology", "--events", events.to_str().unwrap()]);
    let spread = replay(&["--policy", "least-allocated", "--native"]);
    let (t, s) = (&topo["topology"], &spread["topology"]);
    assert_eq!(t["multi_gpu_placements"], s["multi_gpu_placements"], "same jobs placed: {t} {s}");
    assert!(t["spanning_numa"].as_u64() < s["spanning_numa"].as_u64(), "{t} vs {s}");
    assert!(t["bottlenecked"].as_u64() < s["bottlenecked"].as_u64(), "{t} vs {s}");
    // Not asserted: the mean bottleneck bandwidth. Spreading puts multi-GPU jobs on empty
    // NVSwitch nodes when the queue order happens to leave them free (it did with strict priority
    // order across queues, not with fair share interleaving them); the alerts above are what the
    // topology policy promises.
    // The component and the native build decide identically.
    let native = replay(&["--policy", "gpu-topology", "--native"]);
    assert_eq!(native["topology"], topo["topology"]);
    // Every alert is an event.
    let alerts = wasmsched(&["events", "tail", "--file", events.to_str().unwrap(), "--kind", "task-topology-alert"]);
    let lines = String::from_utf8(alerts.stdout).unwrap();
    let expected = t["spanning_numa"].as_u64().unwrap() + t["bottlenecked"].as_u64().unwrap();
    assert_eq!(lines.lines().count() as u64, expected);
    assert!(lines.contains("\"severity\":\"warning\"") && lines.contains("span NUMA nodes"), "{lines}");
}

#[test]
fn scenario_topologies_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let topo = fixture("pcie-6gpu-pix-pairs.txt");
    let scenario = |gpus: u32, file: &str| {
        serde_json::json!({
            "nodes": [{"name": "n0", "cpu_milli": 1000, "memory_mib": 1024, "gpus": gpus, "model": "X", "topology": file}],
            "queues": ["q"], "jobs": []
        })
        .to_string()
    };
    let path = dir.path().join("s.json");
    for (gpus, file, expected) in [(8, topo.as_str(), "has 8 GPUs, its topology"), (6, "missing.txt", "missing.txt")] {
        std::fs::write(&path, scenario(gpus, file)).unwrap();
        let o = wasmsched(&["replay", "--scenario", path.to_str().unwrap(), "--native"]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(expected) && err.contains("node \"n0\""), "{err}");
    }
}
