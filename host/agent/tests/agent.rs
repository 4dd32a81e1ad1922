//! The node agent end to end: the real binary against a real `nats-server` (inventory published to
//! JetStream, report files written), and the health path fed with XID events (NVML's event source
//! needs a GPU; everything after it is the real code).

#[path = "../../events/tests/all/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use support::NatsServer;
use wasmsched_agent::{Agent, DEGRADED_ANNOTATION, Discovery, UNHEALTHY_ANNOTATION};
use wasmsched_events::schema::{GpuHealth, Payload};
use wasmsched_events::{EventSink, Filter, JsonlReader, NatsConfig, Origin, OutboxConfig, TailOptions, tail};
use wasmsched_nvml::{Health, XidEvent};
use wasmsched_topology::annotation::{TOPOLOGY_ANNOTATION, from_annotation};
use wasmsched_topology::{NodeTopology, smi};

fn fixture_path(name: &str) -> String {
    format!("{}/../topology/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wasmsched-agent")).args(args).output().expect("run wasmsched-agent")
}

#[test]
fn run_once_publishes_the_inventory_to_jetstream_and_writes_the_report() {
    let server = NatsServer::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let fixture = fixture_path("h100-sxm-8gpu-nv18.txt");
    let url = server.url();
    let o = agent(&[
        "run",
        "--node",
        "gpu-7",
        "--smi",
        &fixture,
        "--once",
        "--write",
        out.to_str().unwrap(),
        "--nats",
        &url,
        "--cluster",
        "agents",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let config = NatsConfig { url, cluster: "agents".into(), ..NatsConfig::default() };
    let mut events = Vec::new();
    tail(&config, &Filter::default(), &TailOptions { from_start: true, follow: false }, |e| {
        events.push(e);
        true
    })
    .unwrap();
    assert_eq!(events.len(), 1, "one inventory event");
    let Payload::NodeInventoryChanged(inv) = &events[0].payload else { panic!("{:?}", events[0]) };
    assert_eq!((inv.node.as_str(), inv.gpus, inv.interconnect.as_str()), ("gpu-7", 8, "nvswitch"));
    assert_eq!(inv.labels["wasmsched.io/single-numa-4gpu"], "true");
    let expected = smi::parse(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    assert_eq!(from_annotation(&inv.topology).unwrap(), expected, "the event carries the whole topology");

    let annotations: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("annotations.json")).unwrap()).unwrap();
    assert_eq!(from_annotation(annotations[TOPOLOGY_ANNOTATION].as_str().unwrap()).unwrap(), expected);
    let labels: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("labels.json")).unwrap()).unwrap();
    assert_eq!(labels["wasmsched.io/gpu-interconnect"], "nvswitch");
}

#[test]
fn bad_sources_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("topo.txt");
    std::fs::write(&garbage, "GPU0\tX\tNV4\n").unwrap();
    let o = agent(&["run", "--node", "n", "--smi", garbage.to_str().unwrap(), "--once"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("parsing") && err.contains("line 1"), "{err}");
    let o = agent(&["discover", "--smi", "/nonexistent/topo.txt"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/topo.txt"));
    // Without a driver, NVML discovery is an error with the reason, not a crash.
    let o = agent(&["discover"]);
    if !o.status.success() {
        assert!(String::from_utf8_lossy(&o.stderr).contains("NVML is not available"));
    }
}

fn with_uuids(name: &str) -> NodeTopology {
    let t = smi::parse(&std::fs::read_to_string(fixture_path(name)).unwrap()).unwrap();
    let mut gpus = t.gpus().to_vec();
    for g in &mut gpus {
        g.uuid = Some(format!("GPU-{}", g.index));
    }
    NodeTopology::new(gpus, |a, b| t.link(a, b).unwrap(), t.nics().to_vec()).unwrap()
}

#[test]
fn xids_mark_gpus_and_publish_health_and_the_new_report() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/agent".into(), id_prefix: "t".into() };
    let sink = EventSink::jsonl(&file, origin, OutboxConfig::default()).unwrap();
    let mut agent = Agent::new("gpu-3", Some(sink));
    let discovery =
        || Discovery { topology: with_uuids("h100-sxm-8gpu-nv18.txt"), driver: "550".into(), inventory: None };
    assert!(agent.observe(discovery()).is_some(), "first discovery is a change");
    assert!(agent.observe(discovery()).is_none(), "same inventory: nothing to publish");

    let xid = |gpu: u32, xid: u64, health: Health| XidEvent {
        uuid: format!("GPU-{gpu}"),
        xid: Some(xid),
        health,
        description: "test".into(),
    };
    assert!(agent.on_xid(&xid(5, 13, Health::Healthy)).is_none(), "application XIDs change nothing");
    let report = agent.on_xid(&xid(5, 74, Health::Degraded)).unwrap();
    assert_eq!(report.annotations[DEGRADED_ANNOTATION], "5");
    let report = agent.on_xid(&xid(5, 79, Health::Unhealthy)).unwrap();
    assert_eq!(report.annotations[UNHEALTHY_ANNOTATION], "5");
    assert!(!report.annotations.contains_key(DEGRADED_ANNOTATION));
    assert!(agent.on_xid(&xid(5, 74, Health::Degraded)).is_none(), "never back from unhealthy");
    assert!(
        agent
            .on_xid(&XidEvent {
                uuid: "GPU-unknown".into(),
                xid: Some(79),
                health: Health::Unhealthy,
                description: String::new()
            })
            .is_none()
    );
    assert_eq!(agent.unhealthy().into_iter().collect::<Vec<_>>(), vec![5]);
    // A rediscovery keeps the health it learned.
    assert!(agent.observe(discovery()).is_none());

    let sink = agent.into_sink().unwrap();
    assert!(sink.flush(Duration::from_secs(5)));
    sink.close(Duration::from_secs(1));
    let mut reader = JsonlReader::open(&file).unwrap();
    let mut kinds = Vec::new();
    while let Some(event) = reader.next_event().unwrap() {
        match event.payload {
            Payload::NodeGpuHealthChanged(h) => {
                kinds.push(format!("health {} {:?}->{:?} {}", h.gpu, h.from, h.to, h.reason))
            }
            Payload::NodeInventoryChanged(i) => kinds.push(format!("inventory unhealthy {:?}", i.unhealthy_gpus)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        kinds,
        [
            "inventory unhealthy []".to_string(),
            format!("health 5 {:?}->{:?} XID 74: test", GpuHealth::Healthy, GpuHealth::Degraded),
            "inventory unhealthy []".to_string(),
            format!("health 5 {:?}->{:?} XID 79: test", GpuHealth::Degraded, GpuHealth::Unhealthy),
            "inventory unhealthy [5]".to_string(),
        ]
    );
}

#[test]
fn gpus_out_of_service_are_unhealthy_while_listed_and_back_as_their_xids_left_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let origin = Origin { source: "wasmsched/test/agent".into(), id_prefix: "t".into() };
    let sink = EventSink::jsonl(&file, origin, OutboxConfig::default()).unwrap();
    let mut agent = Agent::new("gpu-3", Some(sink));
    agent.observe(Discovery { topology: with_uuids("h100-sxm-8gpu-nv18.txt"), driver: "550".into(), inventory: None });
    let xid = XidEvent { uuid: "GPU-6".into(), xid: Some(79), health: Health::Unhealthy, description: "bus".into() };
    agent.on_xid(&xid).unwrap();
    // The operator takes GPUs 2 and 6 out (6 is unhealthy already): one more unhealthy GPU.
    let report = agent.set_out_of_service([2, 6].into()).unwrap();
    assert_eq!(report.annotations[UNHEALTHY_ANNOTATION], "2,6");
    assert!(agent.set_out_of_service([2, 6].into()).is_none(), "the same list changes nothing");
    // Back in service: 2 is healthy again, 6 stays unhealthy by its XID.
    let report = agent.set_out_of_service([].into()).unwrap();
    assert_eq!(report.annotations[UNHEALTHY_ANNOTATION], "6");
    assert_eq!(agent.unhealthy(), [6].into());

    let sink = agent.into_sink().unwrap();
    assert!(sink.flush(Duration::from_secs(5)));
    sink.close(Duration::from_secs(1));
    let mut reader = JsonlReader::open(&file).unwrap();
    let mut health = Vec::new();
    while let Some(event) = reader.next_event().unwrap() {
        if let Payload::NodeGpuHealthChanged(h) = event.payload {
            health.push((h.gpu, h.to, h.reason));
        }
    }
    assert_eq!(health.len(), 3, "XID on 6, out on 2, back on 2 (6 never changed): {health:?}");
    assert_eq!((health[1].0, health[1].1), (2, GpuHealth::Unhealthy));
    assert!(health[1].2.contains("out of service by an operator"), "{health:?}");
    assert_eq!((health[2].0, health[2].1), (2, GpuHealth::Healthy));
}

/// On a GPU host (the lent device machine; without a driver this returns at once, the case above
/// covers it): the agent's NVML discovery and its reading of `nvidia-smi topo -m` of the same host
/// describe the same node — labels, links, NUMA and CPU affinity — and the NVML one adds identity.
#[test]
fn on_a_gpu_host_nvml_and_nvidia_smi_give_the_same_report() {
    let nvml = agent(&["discover"]);
    if !nvml.status.success() {
        return;
    }
    let topo = Command::new("nvidia-smi").args(["topo", "-m"]).output().expect("nvidia-smi on a GPU host");
    assert!(topo.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("topo.txt");
    std::fs::write(&file, &topo.stdout).unwrap();
    let smi = agent(&["discover", "--smi", file.to_str().unwrap()]);
    assert!(smi.status.success(), "{}", String::from_utf8_lossy(&smi.stderr));
    let doc = |o: &std::process::Output| serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap();
    let (nvml, smi) = (doc(&nvml), doc(&smi));
    assert_eq!(nvml["labels"], smi["labels"]);
    let topology = |d: &serde_json::Value| from_annotation(&d["annotations"][TOPOLOGY_ANNOTATION].to_string()).unwrap();
    let (a, b) = (topology(&nvml), topology(&smi));
    assert_eq!(a.len(), b.len());
    for i in 0..a.len() {
        for j in 0..a.len() {
            assert_eq!(a.link(i, j), b.link(i, j), "GPU{i}–GPU{j}");
        }
        assert_eq!((a.gpus()[i].numa, &a.gpus()[i].cpus), (b.gpus()[i].numa, &b.gpus()[i].cpus), "GPU{i}");
        assert!(a.gpus()[i].uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")), "NVML names the device");
    }
    let inventory = agent(&["discover", "--inventory"]);
    assert!(inventory.status.success());
    let inventory: wasmsched_nvml::Inventory = serde_json::from_slice(&inventory.stdout).unwrap();
    assert_eq!(inventory.devices.len(), a.len());
}

/// The report the agent printed from NVML on the lent H200 (`discover`, committed as a fixture)
/// is the one it makes from that machine's `nvidia-smi topo -m`, plus the identity NVML adds.
#[test]
fn the_recorded_h200_report_is_what_its_nvidia_smi_output_gives() {
    let recorded: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/../nvml/tests/fixtures/h200-driver-580.159.04-agent-discover.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    let o = agent(&["discover", "--smi", &fixture_path("h200-1gpu-vm-driver-580.159.04.txt")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let from_smi: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(recorded["labels"], from_smi["labels"]);
    assert_eq!(recorded["labels"]["wasmsched.io/numa-nodes"], "1");
    assert_eq!(recorded["driver"], "580.159.04");
    let gpu = |d: &serde_json::Value| d["annotations"][TOPOLOGY_ANNOTATION]["gpus"][0].clone();
    let (nvml, smi) = (gpu(&recorded), gpu(&from_smi));
    assert_eq!((&nvml["cpus"], &nvml["numa"]), (&smi["cpus"], &smi["numa"]));
    assert_eq!((nvml["model"].as_str(), nvml["pci"].as_str()), (Some("NVIDIA H200"), Some("0000:00:06.0")));
}

/// Runs the agent once with `flag` naming a STAND-IN for a vendor's tool: a script
/// that checks its arguments (`args_check`, a shell test) and prints `fixture`, a real published
/// output. Checks that the annotation's topology is what `parse` makes of the fixture; returns the
/// labels written.
fn run_with_stand_in(
    flag: &str,
    args_check: &str,
    fixture: &str,
    parse: fn(&str) -> Result<wasmsched_topology::NodeTopology, wasmsched_topology::Error>,
) -> serde_json::Value {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture_path(fixture);
    let tool = dir.path().join(flag.trim_start_matches('-'));
    std::fs::write(&tool, format!("#!/bin/sh\n{args_check} || exit 2\ncat '{fixture}'\n")).unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("report");
    let o = agent(&["run", "--node", "n-0", flag, tool.to_str().unwrap(), "--once", "--write", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let expected = parse(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let annotations: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("annotations.json")).unwrap()).unwrap();
    assert_eq!(from_annotation(annotations[TOPOLOGY_ANNOTATION].as_str().unwrap()).unwrap(), expected);
    serde_json::from_slice(&std::fs::read(out.join("labels.json")).unwrap()).unwrap()
}

/// An AMD node: the agent asks `amd-smi topology` on every discovery. The program here is a
/// STAND-IN (no AMD GPU in CI): a script printing the real output of an eight-MI300X machine, and
/// one that fails as the real tool does without a driver.
#[test]
fn on_an_amd_node_the_topology_comes_from_amd_smi() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let labels = run_with_stand_in(
        "--amd-smi",
        "[ \"$1\" = topology ]",
        "amd-smi-mi300x-8gpu-xgmi.txt",
        wasmsched_topology::amd_smi::parse,
    );
    assert_eq!(
        (labels["wasmsched.io/gpu-count"].as_str(), labels["wasmsched.io/gpu-interconnect"].as_str()),
        (Some("8"), Some("xgmi"))
    );
    assert!(labels.get("wasmsched.io/nvlink-bond").is_none(), "no NVLink on an AMD node: {labels}");
    // The same from a saved `rocm-smi --showtopo`, NUMA nodes included.
    let o = agent(&["discover", "--amd-smi-text", &fixture_path("rocm-smi-8gpu-two-xgmi-hives.txt")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["labels"]["wasmsched.io/single-numa-4gpu"], "true");
    // A tool that fails says so, with its message.
    let broken = dir.path().join("amd-smi-broken");
    std::fs::write(&broken, "#!/bin/sh\necho 'ERROR: amdgpu driver not initialized' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = agent(&["discover", "--amd-smi", broken.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("amdgpu driver not initialized"), "{err}");
    let o = agent(&["run", "--node", "n", "--amd-smi", "amd-smi", "--device-plugin", "--once"]);
    assert!(!o.status.success(), "the device plugin serves NVIDIA GPUs only");
}

/// A Trainium node: the agent runs `neuron-ls` on every discovery. The program here is a STAND-IN
/// (no Neuron device in CI): a script printing the real output AWS published for a trn1.32xlarge.
#[test]
fn on_a_trainium_node_the_devices_and_their_neuronlinks_come_from_neuron_ls() {
    let labels = run_with_stand_in(
        "--neuron-ls",
        "[ $# -eq 0 ]",
        "neuron-ls-trn1-16dev-torus-topology.txt",
        wasmsched_topology::neuron_ls::parse,
    );
    assert_eq!(
        (labels["wasmsched.io/gpu-count"].as_str(), labels["wasmsched.io/gpu-interconnect"].as_str()),
        (Some("16"), Some("neuronlink"))
    );
    // A saved output; a file that is not neuron-ls output says so; two vendors' tools at once are refused.
    let o = agent(&["discover", "--neuron-ls-text", &fixture_path("neuron-ls-inf1-4dev-ring-all-procs.txt")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["labels"]["wasmsched.io/gpu-count"], "4");
    let o = agent(&["discover", "--neuron-ls-text", &fixture_path("amd-smi-mi300x-8gpu-xgmi.txt")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no neuron-ls device table"));
    let o = agent(&["discover", "--neuron-ls", "neuron-ls", "--amd-smi", "amd-smi"]);
    assert!(!o.status.success(), "one vendor's tool per node");
    // Ascend: `npu-smi info -t topo`'s matrix, HCCS pairs as direct links.
    let labels = run_with_stand_in(
        "--npu-smi",
        "[ \"$*\" = \"info -t topo\" ]",
        "npu-smi-910b3-8npu-hccs.txt",
        wasmsched_topology::smi::parse_npu_smi,
    );
    assert_eq!(labels["wasmsched.io/gpu-interconnect"], "hccs");
    assert_eq!(labels["wasmsched.io/gpu-count"], "8");
    let o = agent(&["discover", "--npu-smi-text", "x", "--smi", "y"]);
    assert!(!o.status.success(), "nvidia-smi and npu-smi at once");
}
