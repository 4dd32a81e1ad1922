//! `nvidia-smi topo -m` parsing on real outputs (and format-faithful reconstructions, see
//! `fixtures/README.md`), the annotation round trip, and bad input.

use wasmsched_topology::annotation::{self, from_annotation, labels, to_annotation};
use wasmsched_topology::{Link, LinkCosts, NodeTopology, smi};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn parse(name: &str) -> NodeTopology {
    smi::parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const NV: fn(u8) -> Link = |links| Link::NvLink { links, switched: false };

#[test]
fn h100_nvswitch_node_with_a_nic() {
    let t = parse("h100-sxm-8gpu-nv18.txt");
    // The header starts with a tab; it must not be counted as a GPU row (a classic parsing bug).
    assert_eq!(t.len(), 8);
    assert_eq!(t.link(0, 7), Some(Link::NvLink { links: 18, switched: true }));
    assert_eq!(t.interconnect(), "nvswitch");
    assert_eq!(t.gpus()[3].numa, Some(0));
    assert_eq!(t.gpus()[4].numa, Some(1));
    assert_eq!(t.gpus()[4].cpus.to_string(), "104-207");
    assert_eq!(t.nics().len(), 1);
    assert_eq!(t.nics()[0].name, "mlx5_0", "the NIC legend names NIC0");
    assert!(t.nics()[0].gpu_links.iter().all(|l| *l == Link::Sys));
    assert!(!t.numa_inferred());
}

#[test]
fn a100_pcie_with_nvlink_bridge_pairs() {
    let t = parse("a100-pcie-4gpu-nvlink-bridge-pairs.txt");
    assert_eq!(t.len(), 4);
    assert_eq!(t.link(0, 1), Some(NV(12)));
    assert_eq!(t.link(2, 3), Some(NV(12)));
    assert_eq!(t.link(1, 2), Some(Link::Sys));
    assert_eq!(t.interconnect(), "nvlink");
    assert_eq!(t.numa_nodes(), vec![0, 1, 2, 3]);
}

#[test]
fn pcie_classes_are_kept_apart() {
    let t = parse("pcie-6gpu-pix-pairs.txt");
    assert_eq!(t.link(0, 1), Some(Link::Pix));
    // NODE is within one NUMA node across host bridges, not cross-node (a classic misreading).
    assert_eq!(t.link(0, 2), Some(Link::Node));
    assert_eq!(t.link(0, 4), Some(Link::Sys));
    assert_eq!(t.interconnect(), "pcie");
    let t = parse("rtx5090-2gpu-phb.txt");
    assert_eq!(t.link(0, 1), Some(Link::Phb));
    let t = parse("pcie-8gpu-node-sys.txt");
    assert_eq!(t.gpus()[7].cpus.to_string(), "64-127,192-255");
}

#[test]
fn dgx1_hybrid_cube_mesh_with_mlx5_columns_and_no_numa_column() {
    let t = parse("dgx1v-8gpu-nv1-nv2-cube-mesh.txt");
    assert_eq!(t.len(), 8);
    assert_eq!(t.link(0, 1), Some(NV(1)));
    assert_eq!(t.link(0, 3), Some(NV(2)));
    assert_eq!(t.link(0, 5), Some(Link::Sys));
    assert_eq!(t.interconnect(), "nvlink", "a cube mesh is not a switch");
    // No NUMA column: sockets are inferred from the CPU affinity.
    assert!(t.numa_inferred());
    assert_eq!(t.gpus()[0].numa, Some(0));
    assert_eq!(t.gpus()[7].numa, Some(1));
    let names: Vec<&str> = t.nics().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]);
    assert_eq!(t.nics()[0].gpu_links[0], Link::Pix);
}

#[test]
fn dgx2_sixteen_gpus_and_old_soc_cells() {
    let t = parse("dgx2-16gpu-nv6-mlx5.txt");
    assert_eq!(t.len(), 16);
    assert_eq!(t.interconnect(), "nvswitch");
    assert_eq!(t.nics().len(), 10);
    assert_eq!(t.gpus()[15].numa, Some(1));
    let t = parse("k80-4gpu-soc-old.txt");
    assert_eq!(t.link(0, 2), Some(Link::Sys), "SOC is the old name of SYS");
    assert_eq!(t.link(0, 1), Some(Link::Pix));
}

#[test]
fn driver_580_underlines_the_header_even_into_a_file() {
    // Captured on an H200 virtual machine (driver 580.159.04) with `nvidia-smi topo -m > file`:
    // the header is wrapped in `ESC[4m … ESC[0m`, the row has an empty cell before `GPU NUMA ID`.
    let text = fixture("h200-1gpu-vm-driver-580.159.04.txt");
    assert!(text.starts_with("\t\u{1b}[4mGPU0\t"), "the capture keeps the escapes");
    let t = smi::parse(&text).unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t.gpus()[0].cpus.to_string(), "0-15");
    assert_eq!(t.gpus()[0].numa, Some(0));
    assert!(!t.numa_inferred());
    assert!(t.nics().is_empty());
    assert_eq!(t.interconnect(), "pcie");
    // Escapes anywhere else (a coloured cell) are dropped the same way.
    let coloured = fixture("h100-sxm-8gpu-nv18.txt").replace("NV18", "\u{1b}[1;32mNV18\u{1b}[0m");
    assert_eq!(smi::parse(&coloured).unwrap(), parse("h100-sxm-8gpu-nv18.txt"));
}

#[test]
fn space_separated_copies_parse_too() {
    // Outputs pasted into tickets often lose their tabs.
    let text = fixture("a100-pcie-4gpu-nvlink-bridge-pairs.txt").replace('\t', "    ");
    let t = smi::parse(&text).unwrap();
    assert_eq!(t.len(), 4);
    assert_eq!(t.gpus()[3].numa, Some(3));
}

#[test]
fn bad_outputs_are_refused_with_the_line() {
    let good = fixture("pcie-6gpu-pix-pairs.txt");
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "no header line"),
        ("No devices were found\n".into(), "no header line"),
        (good.replace("GPU3\tNODE\tNODE\tPIX", "GPU3\tNODE\tNODE\tFOO"), "unknown link `FOO`"),
        (good.replace("GPU5\tSYS\tSYS\tSYS\tSYS\tPIX\t X ", "GPU5\tSYS\tSYS"), "row GPU5 has"),
        (good.replace("GPU2\tNODE\tNODE\t X \tPIX", "GPU2\tNODE\tNODE\tPIX\tPIX"), "diagonal"),
        (good.replace("GPU1\tPIX\t X \tNODE", "GPU1\tPIX\t X \tSYS"), "asymmetric"),
        (good.replace("0-23,48-71\t0", "0-x\t0"), "bad CPU list"),
        (good.lines().take(3).collect::<Vec<_>>().join("\n"), "no row for GPU2"),
        (good.replace("GPU4\tSYS", "GPU9\tSYS"), "not a column"),
        (good.replace("GPU1\tPIX\t X ", "GPU0\tPIX\t X "), "appears twice"),
    ];
    for (text, expected) in cases {
        let err = smi::parse(&text).expect_err(expected).to_string();
        assert!(err.contains(expected), "expected `{expected}`, got `{err}`");
    }
    let err = smi::parse(&good.replace("GPU3\tNODE\tNODE\tPIX", "GPU3\tNODE\tNODE\tFOO")).unwrap_err();
    assert!(err.to_string().starts_with("line 5:"), "{err}");
}

#[test]
fn annotation_round_trips_every_pair_and_refuses_gaps() {
    for name in ["h100-sxm-8gpu-nv18.txt", "dgx1v-8gpu-nv1-nv2-cube-mesh.txt", "dgx2-16gpu-nv6-mlx5.txt"] {
        let t = parse(name);
        let json = to_annotation(&t);
        let back = from_annotation(&json).unwrap();
        assert_eq!(back, t, "{name}");
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
        let n = t.len();
        assert_eq!(doc["links"].as_array().unwrap().len(), n * (n - 1) / 2, "complete, not truncated");
    }
    let json = to_annotation(&parse("h100-sxm-8gpu-nv18.txt"));
    let mut doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    doc["links"].as_array_mut().unwrap().pop();
    let err = from_annotation(&doc.to_string()).unwrap_err().to_string();
    assert!(err.contains("lacks the link 6–7"), "{err}");
    assert!(from_annotation("{").unwrap_err().to_string().contains(annotation::TOPOLOGY_ANNOTATION));
    let future = json.replace("\"version\":1", "\"version\":2");
    assert!(from_annotation(&future).unwrap_err().to_string().contains("format version 2"));
}

#[test]
fn labels_describe_the_hardware() {
    // S16 on a DGX-like node (8 GPUs behind NVSwitch, 4 per NUMA node).
    let l = labels(&parse("h100-sxm-8gpu-nv18.txt"));
    let get = |k: &str| l.get(&format!("wasmsched.io/{k}")).map(String::as_str);
    assert_eq!(get("gpu-interconnect"), Some("nvswitch"));
    assert_eq!(get("numa-nodes"), Some("2"));
    assert_eq!(get("gpus-per-numa"), Some("4"));
    assert_eq!(get("single-numa-4gpu"), Some("true"));
    assert_eq!(get("single-numa-8gpu"), Some("false"));
    assert_eq!(get("nvlink-bond"), Some("18"));
    assert_eq!(get("gpu-count"), Some("8"));
    assert!(l.keys().all(|k| k.starts_with(annotation::LABEL_PREFIX)));
}

#[test]
fn rendering_names_every_class_with_its_cost() {
    let text = parse("dgx1v-8gpu-nv1-nv2-cube-mesh.txt").render(&LinkCosts::default());
    assert!(text.contains("NV2") && text.contains("100.0 GB/s"), "{text}");
    assert!(text.contains("inferred"), "{text}");
}

fn parse_amd(name: &str) -> NodeTopology {
    wasmsched_topology::amd_smi::parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn rocm_smi_mi308x_all_to_all_xgmi_with_numa_nodes() {
    let t = parse_amd("rocm-smi-mi308x-8gpu-xgmi.txt");
    assert_eq!(t.len(), 8);
    assert!((1..8).all(|j| t.link(0, j) == Some(NV(1))), "every pair one xGMI link");
    assert_eq!((t.gpus()[3].numa, t.gpus()[4].numa), (Some(0), Some(1)));
    assert!(!t.numa_inferred());
    assert_eq!(t.interconnect(), "xgmi", "a full xGMI mesh is not an NVSwitch");
}

#[test]
fn rocm_smi_two_xgmi_hives_joined_over_pcie() {
    let t = parse_amd("rocm-smi-8gpu-two-xgmi-hives.txt");
    assert_eq!(t.len(), 8);
    assert_eq!(t.link(0, 3), Some(NV(1)));
    assert_eq!(t.link(4, 7), Some(NV(1)));
    assert_eq!(t.link(3, 4), Some(Link::Sys), "across hives and NUMA nodes");
    // The best pair of four stays in one hive, as it would on an NVLink-paired node.
    let costs = LinkCosts::default();
    let free = 0b1111_0111; // GPU 3 busy: hive A has three free, hive B four
    let four =
        wasmsched_topology::Prepared::new(&t, &costs).select(free, 4, wasmsched_topology::NumaPolicy::None).unwrap();
    assert_eq!(four.mask(), 0b1111_0000, "{four:?}");
}

#[test]
fn amd_smi_tables_name_gpus_by_bus_id() {
    let t = parse_amd("amd-smi-mi300x-8gpu-xgmi.txt");
    assert_eq!(t.len(), 8);
    assert!((0..8).all(|i| (0..8).all(|j| i == j || t.link(i, j) == Some(NV(1)))));
    assert_eq!(t.gpus()[1].pci.as_deref(), Some("0000:22:00.0"));
    let pcie = parse_amd("amd-smi-2gpu-pcie.txt");
    assert_eq!(pcie.len(), 2);
    assert_eq!(pcie.link(0, 1), Some(Link::Phb), "two hops, NUMA unknown");
    assert_eq!(pcie.gpus()[0].numa, None);
    assert_eq!(pcie.interconnect(), "pcie");
    // The annotation the agent writes carries it like an NVIDIA node's, xGMI named as such.
    assert_eq!(from_annotation(&to_annotation(&t)).unwrap(), t);
    assert_eq!(from_annotation(&to_annotation(&t)).unwrap().interconnect(), "xgmi");
}

fn parse_neuron(name: &str) -> NodeTopology {
    wasmsched_topology::neuron_ls::parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn neuron_ls_chain_of_four_inferentia_devices_under_their_processes() {
    let t = parse_neuron("neuron-ls-inf1-4dev-ring-all-procs.txt");
    assert_eq!(t.len(), 4, "process rows are not devices");
    assert_eq!((t.link(0, 1), t.link(1, 2), t.link(2, 3)), (Some(NV(1)), Some(NV(1)), Some(NV(1))));
    assert_eq!(t.link(0, 3), Some(Link::Sys), "the chain does not wrap on inf1");
    assert_eq!(t.gpus()[2].pci.as_deref(), Some("0000:00:1e.0"));
    assert_eq!(t.interconnect(), "neuronlink");
    // Two of devices 0, 1 and 3: the linked pair.
    let costs = LinkCosts::default();
    let two =
        wasmsched_topology::Prepared::new(&t, &costs).select(0b1011, 2, wasmsched_topology::NumaPolicy::None).unwrap();
    assert_eq!(two.mask(), 0b0011, "{two:?}");
}

#[test]
fn neuron_ls_trainium_torus_keeps_a_job_on_neighbours() {
    for name in ["neuron-ls-trn1-16dev-torus-topology.txt", "neuron-ls-trn2n-16dev-torus.txt"] {
        let t = parse_neuron(name);
        assert_eq!(t.len(), 16, "{name}");
        let direct = |i: usize| (0..16).filter(|&j| j != i && t.link(i, j) == Some(NV(1))).count();
        assert!((0..16).all(|i| direct(i) == 4), "{name}: four NeuronLink neighbours each on a torus");
        assert_eq!(t.link(0, 12), Some(NV(1)), "{name}: the wrap-around link");
        assert_eq!(t.link(0, 5), Some(Link::Sys), "{name}: diagonal is two hops");
        // Four devices with every other row busy: a ring of neighbours, never scattered ones.
        let costs = LinkCosts::default();
        let free = 0x0F0F; // rows 0 and 2 free
        let four = wasmsched_topology::Prepared::new(&t, &costs)
            .select(free, 4, wasmsched_topology::NumaPolicy::None)
            .unwrap();
        let chosen: Vec<usize> = (0..16).filter(|&i| four.mask() & (1 << i) != 0).collect();
        for &i in &chosen {
            let neighbours = chosen.iter().filter(|&&j| t.link(i, j) == Some(NV(1))).count();
            assert!(neighbours >= 2, "{name}: {chosen:?} is not a ring");
        }
        assert_eq!(from_annotation(&to_annotation(&t)).unwrap(), t, "{name}: the annotation keeps NeuronLink");
        let labels = wasmsched_topology::annotation::labels(&t);
        assert_eq!(labels["wasmsched.io/gpu-interconnect"], "neuronlink");
        assert!(!labels.contains_key("wasmsched.io/nvlink-bond"));
    }
    assert_eq!(parse_neuron("neuron-ls-trn2n-16dev-torus.txt").gpus()[0].pci.as_deref(), Some("cc:00.0"));
}

#[test]
fn npu_smi_ascend_910b_eight_npus_over_hccs() {
    let t = wasmsched_topology::smi::parse_npu_smi(&fixture("npu-smi-910b3-8npu-hccs.txt")).unwrap();
    assert_eq!(t.len(), 8);
    assert!((0..8).all(|i| (0..8).all(|j| i == j || t.link(i, j) == Some(NV(1)))), "HCCS all-to-all");
    assert_eq!(t.interconnect(), "hccs", "a full HCCS mesh is not an NVSwitch");
    assert_eq!(t.gpus()[2].cpus.to_string(), "96-119");
    assert_eq!(from_annotation(&to_annotation(&t)).unwrap(), t);
    // nvidia-smi's parser refuses it, and the NPU parser refuses nvidia-smi output, each by name.
    let e = wasmsched_topology::smi::parse(&fixture("npu-smi-910b3-8npu-hccs.txt")).unwrap_err().to_string();
    assert!(e.contains("GPU0"), "{e}");
    let e = wasmsched_topology::smi::parse_npu_smi(&fixture("h100-sxm-8gpu-nv18.txt")).unwrap_err().to_string();
    assert!(e.contains("npu-smi info -t topo"), "{e}");
}
