//! Plugins ask the host about GPU topology (`topology` import): the built-in `gpu-topology`
//! component and the same crate run natively must give the host's exact answers, and the answers
//! must drive placement (filter, score, device selection).

use std::sync::Arc;

use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources, Task};
use wasmsched_core::{CallContext, NativePlugin, NodeTable, PolicyPlugin, PolicySet, Slot, place};
use wasmsched_plugin_gpu_topology::GpuTopology;
use wasmsched_runtime::{Runtime, RuntimeConfig};
use wasmsched_topology::{NodeTopology, smi};

use crate::unhurried;

fn fixture(name: &str) -> NodeTopology {
    let path = format!("{}/../host/topology/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    smi::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The "PCIe-pair box" (docs/topology.md): NVLink pairs, PIX inside a NUMA node, SYS across.
fn pcie_pairs() -> NodeTopology {
    let mut text = String::from("\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\n");
    for i in 0..8 {
        text.push_str(&format!("GPU{i}"));
        for j in 0..8 {
            let cell = if i == j {
                " X "
            } else if i / 2 == j / 2 {
                "NV12"
            } else if i / 4 == j / 4 {
                "PIX"
            } else {
                "SYS"
            };
            text.push_str(&format!("\t{cell}"));
        }
        text.push_str(&format!("\t{}\t{}\n", if i < 4 { "0-63" } else { "64-127" }, i / 4));
    }
    smi::parse(&text).unwrap()
}

fn node(name: &str, free: &[u32]) -> Node {
    Node {
        name: name.into(),
        allocatable: Resources {
            cpu_milli: 128_000,
            memory_bytes: 1 << 40,
            gpu_milli: 8000,
            extended: Default::default(),
        },
        gpus: (0..8)
            .map(|i| GpuDevice {
                index: i,
                free_milli: if free.contains(&i) { 1000 } else { 0 },
                numa_node: Some(i / 4),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Nodes: an NVSwitch node, an NVLink-pair node, a PCIe node (all free), a pair node with only
/// {0,4,5} free, and a node whose topology is unknown.
fn cluster() -> (NodeTable, Vec<Slot>) {
    let mut nodes = NodeTable::new();
    let all: Vec<u32> = (0..8).collect();
    let slots = vec![
        nodes.upsert(node("nvswitch", &all)),
        nodes.upsert(node("pairs", &all)),
        nodes.upsert(node("pcie", &all)),
        nodes.upsert(node("pairs-busy", &[0, 4, 5])),
        nodes.upsert(node("unknown", &all)),
    ];
    let t = nodes.topologies_mut();
    t.insert("nvswitch", fixture("h100-sxm-8gpu-nv18.txt"));
    t.insert("pairs", pcie_pairs());
    t.insert("pcie", fixture("pcie-8gpu-node-sys.txt"));
    t.insert("pairs-busy", pcie_pairs());
    (nodes, slots)
}

fn gpus(count: u32) -> Task {
    Task {
        id: "job".into(),
        gpu: GpuRequest { count, milli_per_gpu: 1000, ..Default::default() },
        ..Default::default()
    }
}

fn both(config: &str) -> (Arc<dyn PolicyPlugin>, Arc<dyn PolicyPlugin>) {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let wasm = rt.load(wasmsched_plugins::GPU_TOPOLOGY.wasm, unhurried("gpu-topology").with_config(config)).unwrap();
    let native = NativePlugin::<GpuTopology>::new(config, 1).unwrap();
    (Arc::new(wasm), Arc::new(native))
}

#[test]
fn scores_follow_the_interconnect_natively_and_in_wasm() {
    let (nodes, slots) = cluster();
    let (wasm, native) = both("");
    let ctx = CallContext { worker: 0, nodes: &nodes };
    let w = wasm.score(ctx, &gpus(4), &slots).unwrap();
    let n = native.score(CallContext { worker: 0, nodes: &nodes }, &gpus(4), &slots).unwrap();
    assert_eq!(w, n, "the component and the native build agree");
    let [nvswitch, pairs, pcie, busy, unknown] = w[..] else { panic!("{w:?}") };
    assert!(nvswitch > pairs && pairs > pcie, "{w:?}");
    assert_eq!(busy, 0, "3 free GPUs cannot take 4");
    assert_eq!(unknown, 50, "unknown topology scores the configured neutral value");
    // One GPU: topology does not matter.
    assert!(wasm.score(CallContext { worker: 0, nodes: &nodes }, &gpus(1), &slots).unwrap().iter().all(|&s| s == 100));
}

#[test]
fn device_selection_takes_the_exact_best_set() {
    let (nodes, slots) = cluster();
    let (wasm, native) = both("");
    for plugin in [&wasm, &native] {
        // The counter-example to a greedy choice: {0,4,5} free, 2 wanted → the NVLink pair {4,5}.
        let got = plugin.select_devices(CallContext { worker: 0, nodes: &nodes }, &gpus(2), slots[3]).unwrap().unwrap();
        assert_eq!(got.iter().map(|d| d.gpu).collect::<Vec<_>>(), [4, 5], "{}", plugin.name());
        // Unknown topology: the default lowest-index choice.
        let got = plugin.select_devices(CallContext { worker: 0, nodes: &nodes }, &gpus(2), slots[4]).unwrap().unwrap();
        assert_eq!(got.iter().map(|d| d.gpu).collect::<Vec<_>>(), [0, 1]);
    }
}

#[test]
fn single_numa_node_filters_with_the_hosts_reason() {
    let (mut nodes, _) = cluster();
    // NUMA0 has 3 free, NUMA1 has 3 free: 4 GPUs in one NUMA node are impossible.
    let split = nodes.upsert(node("split", &[1, 2, 3, 5, 6, 7]));
    nodes.topologies_mut().insert("split", pcie_pairs());
    let (wasm, native) = both(r#"{"numa_policy":"single-numa-node"}"#);
    let ctx = || CallContext { worker: 0, nodes: &nodes };
    let w = wasm.filter(ctx(), &gpus(4), &[split]).unwrap();
    let n = native.filter(ctx(), &gpus(4), &[split]).unwrap();
    assert_eq!(w, n);
    assert_eq!(w.codes, [1]);
    assert!(w.reasons[0].reason.contains("single-numa-node"), "{:?}", w.reasons);
    let (best_effort, _) = both(r#"{"numa_policy":"best-effort"}"#);
    assert_eq!(best_effort.filter(ctx(), &gpus(4), &[split]).unwrap().codes, [0]);
}

#[test]
fn placement_uses_topology_end_to_end() {
    let (nodes, _) = cluster();
    let (wasm, _) = both("");
    let fit = wasmsched_plugins::RESOURCE_FIT;
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let fit = rt.load(fit.wasm, unhurried(fit.name).with_config(fit.config)).unwrap();
    let set = PolicySet::builder().filter(Arc::new(fit)).score(wasm.clone(), 1).devices(wasm).build();
    let placed = place(&set, &nodes, &gpus(4), 0).unwrap();
    assert_eq!(nodes.get(placed.node).unwrap().name, "nvswitch");
    assert_eq!(placed.devices.len(), 4);
}

#[test]
fn bad_configuration_is_refused() {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    for (config, expected) in [
        (r#"{"numa_policy":"numa"}"#, "numa_policy `numa`"),
        (r#"{"unknown_score":101}"#, "above 100"),
        (r#"{"x":1}"#, "unknown field"),
    ] {
        let err =
            rt.load(wasmsched_plugins::GPU_TOPOLOGY.wasm, unhurried("gpu-topology").with_config(config)).err().unwrap();
        assert!(err.to_string().contains(expected), "{config}: {err}");
    }
}

/// S15: GPU accounting with topology-chosen devices. Two 4-GPU binds on one 8-GPU NVSwitch node
/// get disjoint sets, a third finds no set, and releasing the first makes its GPUs choosable again.
#[test]
fn s15_binds_are_disjoint_and_released_gpus_return() {
    let mut nodes = NodeTable::new();
    let slot = nodes.upsert(node("dgx", &(0..8).collect::<Vec<_>>()));
    nodes.topologies_mut().insert("dgx", fixture("h100-sxm-8gpu-nv18.txt"));
    let (wasm, _) = both("");
    let task = |id: &str| Task { id: id.into(), ..gpus(4) };
    let mut bound = Vec::new();
    for id in ["first", "second"] {
        let devices = wasm.select_devices(CallContext { worker: 0, nodes: &nodes }, &task(id), slot).unwrap().unwrap();
        nodes.update(slot, |n| wasmsched_core::bind(n, &task(id), &devices)).unwrap().unwrap();
        bound.push(devices.iter().map(|d| d.gpu).collect::<Vec<_>>());
    }
    assert_eq!(bound, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]], "one NUMA node each, disjoint");
    let third = wasm.select_devices(CallContext { worker: 0, nodes: &nodes }, &task("third"), slot).unwrap();
    assert!(third.unwrap_err().reason.contains("0 free GPUs, 4 requested"));
    let first: Vec<wasmsched_api::DeviceShare> =
        bound[0].iter().map(|&gpu| wasmsched_api::DeviceShare { gpu, milli: 1000 }).collect();
    nodes.update(slot, |n| wasmsched_core::release(n, &task("first"), &first)).unwrap();
    let again = wasm.select_devices(CallContext { worker: 0, nodes: &nodes }, &task("third"), slot).unwrap().unwrap();
    assert_eq!(again.iter().map(|d| d.gpu).collect::<Vec<_>>(), [0, 1, 2, 3]);
}

/// The agent marks a GPU unhealthy after an XID; the scheduler reads the node's annotations back and
/// never places on that GPU again (what the Kubernetes source does with a Node's annotations).
#[test]
fn unhealthy_gpus_in_the_agents_report_are_not_used() {
    use wasmsched_agent::{Agent, Discovery};
    use wasmsched_nvml::{Health, XidEvent};
    use wasmsched_topology::annotation::read_node;

    let mut with_uuids = fixture("h100-sxm-8gpu-nv18.txt").gpus().to_vec();
    for g in &mut with_uuids {
        g.uuid = Some(format!("GPU-{}", g.index));
    }
    let h100 = fixture("h100-sxm-8gpu-nv18.txt");
    let topology = NodeTopology::new(with_uuids, |a, b| h100.link(a, b).unwrap(), Vec::new()).unwrap();
    let mut agent = Agent::new("dgx", None);
    agent.observe(Discovery { topology, driver: String::new(), inventory: None });
    let report = agent
        .on_xid(&XidEvent {
            uuid: "GPU-2".into(),
            xid: Some(79),
            health: Health::Unhealthy,
            description: "fell off the bus".into(),
        })
        .unwrap();

    let mut nodes = NodeTable::new();
    nodes.upsert(node("dgx", &(0..8).collect::<Vec<_>>()));
    let facts = read_node(report.annotations.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
    assert_eq!(facts.unhealthy, [2]);
    assert!(wasmsched_core::apply_node_facts(&mut nodes, "dgx", facts));

    let (wasm, _) = both("");
    let fit = wasmsched_plugins::RESOURCE_FIT;
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let fit = Arc::new(rt.load(fit.wasm, unhurried(fit.name).with_config(fit.config)).unwrap());
    let set = PolicySet::builder().filter(fit).score(wasm.clone(), 1).devices(wasm).build();
    // A 4-GPU job takes a NUMA node without GPU 2; 7 GPUs still fit; 8 no longer do.
    let four = place(&set, &nodes, &gpus(4), 0).unwrap();
    assert_eq!(four.devices.iter().map(|d| d.gpu).collect::<Vec<_>>(), [4, 5, 6, 7]);
    let seven = place(&set, &nodes, &gpus(7), 0).unwrap();
    assert!(seven.devices.iter().all(|d| d.gpu != 2));
    assert!(place(&set, &nodes, &gpus(8), 0).is_err());
    // A malformed health annotation is refused with its name; the node keeps its facts.
    let err = read_node([("wasmsched.io/unhealthy-gpus", "2,x")]).unwrap_err().to_string();
    assert!(err.contains("wasmsched.io/unhealthy-gpus") && err.contains("GPU"), "{err}");
}

/// The first candidate in the host's order.
fn given_by_host(request: &wasmsched_api::ClaimRequest) -> String {
    request.candidates[0].id.clone()
}

/// DRA devices through the contract: the `gpu-topology` component ranks a claim request's
/// candidates as its native build does, the allocator gives the claim what it ranked first, and
/// a component built before the export (the legacy fixture) leaves the host's order, unasked.
#[test]
fn the_component_ranks_dra_devices_as_natively_and_the_allocator_follows_it() {
    use wasmsched_api::ClaimRequest;
    let mut objects = wasmsched_dra::Objects::default();
    let path = format!("{}/../examples/dra/cluster.yaml", env!("CARGO_MANIFEST_DIR"));
    objects.read(std::path::Path::new(&path)).unwrap();
    let (mut inventory, _) = wasmsched_dra::Inventory::from_slices(&objects.slices);
    inventory.hold_allocated(&objects.claims);
    let mut allocator = wasmsched_dra::Allocator::new(inventory, objects.classes.clone());
    let dgx = objects.nodes.iter().find(|n| n.metadata.name.as_deref() == Some("dgx-a100-0")).unwrap();
    // Three GPUs of the first PCIe root taken: it has one left, the second root four.
    let three: k8s_openapi::api::resource::v1::ResourceClaimSpec = serde_json::from_value(serde_json::json!({
        "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}]}
    }))
    .unwrap();
    let taken = allocator.allocate(&three, dgx).unwrap();
    allocator.hold(&taken, true);
    let mut table = NodeTable::new();
    let slot = table.upsert(Node { name: "dgx-a100-0".into(), ..Default::default() });
    let (wasm, native) = both("");
    // A device stage that ranks says so (the host builds a request only for one that may);
    // gpu-share-score's does not, nor does a set without a device stage.
    assert!(wasm.ranks_claim_devices() && native.ranks_claim_devices());
    let share = Arc::new(
        NativePlugin::<wasmsched_plugin_gpu_share_score::GpuShareScore>::new(r#"{"policy": "best-fit"}"#, 1).unwrap(),
    );
    assert!(!share.ranks_claim_devices());
    assert!(!PolicySet::builder().devices(share).build().ranks_claim_devices());
    assert!(PolicySet::builder().devices(native.clone()).build().ranks_claim_devices());
    let task = Task { id: "pod".into(), ..Default::default() };
    let mut asked: Vec<ClaimRequest> = Vec::new();
    let one: k8s_openapi::api::resource::v1::ResourceClaimSpec = serde_json::from_value(serde_json::json!({
        "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}
    }))
    .unwrap();
    let got = allocator
        .allocate_ranked(
            &one,
            dgx,
            Some(&mut |request| {
                asked.push(request.clone());
                let ctx = CallContext { worker: 0, nodes: &table };
                let w = wasm.rank_claim_devices(ctx, &task, slot, request).unwrap();
                let n =
                    native.rank_claim_devices(CallContext { worker: 0, nodes: &table }, &task, slot, request).unwrap();
                assert_eq!(w, n, "the component and the native build agree");
                w
            }),
        )
        .unwrap();
    // Five candidates, with their attributes; the first root's last GPU (best fit) ranked first.
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].candidates.len(), 5);
    let root = |id: &str| {
        let d = asked[0].candidates.iter().find(|d| d.id == id).unwrap();
        d.attribute("resource.kubernetes.io/pcieRoot").cloned()
    };
    let held: Vec<String> = taken.results.iter().map(|r| r.1.to_string()).collect();
    assert!(asked[0].candidates.iter().all(|d| !held.contains(&d.id)), "a held device is no candidate");
    let given = got.results[0].1.to_string();
    let first_root = asked[0].candidates[0].attribute("resource.kubernetes.io/pcieRoot").cloned();
    assert_eq!(root(&given), first_root, "the lone GPU of the broken root: {given}");
    // A component's order wins over the host's (the raw fixture ranks the candidates backwards);
    // one that answers garbage faults, and the host's order stands.
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let mut by = |mode: &str| {
        let raw = rt.load(&crate::fixtures::read(crate::fixtures::RAW_GARBAGE), unhurried("raw").with_config(mode));
        let set = PolicySet::builder().devices(Arc::new(raw.unwrap())).build();
        let mut last = None;
        let got = allocator
            .allocate_ranked(
                &one,
                dgx,
                Some(&mut |request| {
                    last = request.candidates.last().map(|d| d.id.clone());
                    set.rank_claim_devices(&table, &task, "dgx-a100-0", request)
                }),
            )
            .unwrap();
        (got.results[0].1.to_string(), last.unwrap())
    };
    let (given, last) = by("backwards");
    assert_eq!(given, last, "the component's first choice");
    for garbage in ["rank-out-of-range", "rank-twice"] {
        let (given_now, _) = by(garbage);
        assert_eq!(given_now, given_by_host(&asked[0]), "{garbage}: the host's order");
    }
    // A component without the export is not asked and leaves the host's order.
    let legacy = rt.load(&crate::fixtures::read(crate::fixtures::LEGACY_MIRROR), unhurried("legacy")).unwrap();
    let ctx = CallContext { worker: 0, nodes: &table };
    assert_eq!(legacy.rank_claim_devices(ctx, &task, slot, &asked[0]).unwrap(), None);
    assert_eq!(legacy.metrics().instances_discarded(), 0);
}
