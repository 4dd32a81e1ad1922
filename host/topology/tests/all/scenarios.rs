//! The acceptance scenarios S1–S20 (listed in `docs/topology.md`), with the corrected behaviour
//! where a naive greedy implementation is wrong (S8–S20). Node layouts are written as
//! `nvidia-smi topo -m` text, so every scenario also goes through the parser.

use std::collections::BTreeMap;

use wasmsched_topology::cluster::{Candidate, Locality, Tiers};
use wasmsched_topology::comm::{Collective, ring_ms};
use wasmsched_topology::pinning::{self, NumaNode};
use wasmsched_topology::{CpuSet, Link, LinkCosts, NodeTopology, NumaPolicy, Prepared, Unsatisfiable, smi};

/// Builds `nvidia-smi topo -m` text from a cell function and each GPU's NUMA node.
fn matrix(numa: &[u32], cell: impl Fn(usize, usize) -> &'static str) -> NodeTopology {
    let n = numa.len();
    let mut text = String::from("\t");
    for j in 0..n {
        text.push_str(&format!("GPU{j}\t"));
    }
    text.push_str("CPU Affinity\tNUMA Affinity\tGPU NUMA ID\n");
    for (i, &node) in numa.iter().enumerate() {
        text.push_str(&format!("GPU{i}\t"));
        for j in 0..n {
            text.push_str(if i == j { " X " } else { cell(i, j) });
            text.push('\t');
        }
        let cpus = format!("{}-{}", node * 64, node * 64 + 63);
        text.push_str(&format!("{cpus}\t{node}\t\tN/A\n"));
    }
    smi::parse(&text).unwrap()
}

/// The "PCIe-pair box": NVLink pairs (0,1) (2,3) (4,5) (6,7), PCIe within a NUMA node, SYS across;
/// NUMA0 = 0–3, NUMA1 = 4–7.
fn pcie_pair_box() -> NodeTopology {
    matrix(&[0, 0, 0, 0, 1, 1, 1, 1], |i, j| {
        if i / 2 == j / 2 {
            "NV12"
        } else if i / 4 == j / 4 {
            "PIX"
        } else {
            "SYS"
        }
    })
}

/// "DGX-like": every pair through NVSwitch, NUMA0 = 0–3, NUMA1 = 4–7.
fn dgx_like() -> NodeTopology {
    let t = matrix(&[0, 0, 0, 0, 1, 1, 1, 1], |_, _| "NV12");
    assert_eq!(t.interconnect(), "nvswitch");
    t
}

fn mask(gpus: &[u32]) -> u64 {
    gpus.iter().fold(0, |m, g| m | 1 << g)
}

fn pick(t: &NodeTopology, free: &[u32], k: u32, policy: NumaPolicy) -> Result<Vec<u32>, Unsatisfiable> {
    Prepared::new(t, &LinkCosts::default()).select(mask(free), k, policy).map(|c| c.gpus)
}

#[test]
fn s1_cost_tables_are_the_published_defaults() {
    let costs = LinkCosts::default();
    let nv12 = Link::NvLink { links: 12, switched: false };
    let switch12 = Link::NvLink { links: 12, switched: true };
    let table = [(nv12, 600.0, 1.0), (switch12, 600.0, 2.0), (Link::Pix, 32.0, 5.0), (Link::Sys, 25.0, 10.0)];
    for (link, bandwidth, latency) in table {
        assert_eq!(costs.cost(link).bandwidth_gbps, bandwidth, "{link}");
        assert_eq!(costs.cost(link).latency_us, latency, "{link}");
        assert_eq!(costs.distance(link), latency, "distance is latency / NVLink latency");
    }
    assert_eq!((costs.network.bandwidth_gbps, costs.network.latency_us), (12.5, 50.0));
    // NV18 is H100's 900 GB/s, and a longer PCIe path never costs less than a shorter one.
    assert_eq!(costs.cost(Link::NvLink { links: 18, switched: true }).bandwidth_gbps, 900.0);
    let pcie = [Link::Pix, Link::Pxb, Link::Phb, Link::Node, Link::Sys].map(|l| costs.cost(l));
    assert!(pcie.windows(2).all(|w| w[0].bandwidth_gbps >= w[1].bandwidth_gbps && w[0].latency_us < w[1].latency_us));
    // Configurable, and validated.
    let custom: LinkCosts = serde_json::from_str(r#"{"nvlink_per_link_gbps": 25.0}"#).unwrap();
    assert_eq!(custom.cost(nv12).bandwidth_gbps, 300.0);
    let bad: LinkCosts = serde_json::from_str(r#"{"sys": {"bandwidth_gbps": 0, "latency_us": 1}}"#).unwrap();
    assert!(bad.validate().unwrap_err().contains("sys"));
    assert!(serde_json::from_str::<LinkCosts>(r#"{"nvlnk": 1}"#).is_err(), "typos are refused");
}

#[test]
fn s4_intra_node_allreduce_estimates() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-3;
    assert!(close(ring_ms(Collective::AllReduce, 8, 100.0, 600.0, 0.0), 0.2848));
    let t = pcie_pair_box();
    let p = Prepared::new(&t, &LinkCosts::default());
    let estimate = |gpus: &[u32]| {
        let choice = p.ranked(mask(gpus), gpus.len() as u32, NumaPolicy::None).unwrap().remove(0);
        let bw = f64::from(choice.bottleneck_mbps.unwrap()) / 1000.0;
        ring_ms(Collective::AllReduce, gpus.len() as u32, 100.0, bw, 0.0)
    };
    assert!(close(estimate(&[0, 1]), 0.1628));
    assert!(close(estimate(&[0, 2]), 3.0518));
    assert!(close(estimate(&[0, 4]), 3.9062));
    assert!(close(estimate(&[0, 1, 2, 3]), 4.5776));
    assert!(close(estimate(&[0, 1, 4, 5]), 5.8594));
    assert!(close(estimate(&[0, 1, 2, 3, 4, 5, 6, 7]), 6.8359));
    // Reduce-scatter moves half of an all-reduce (not the whole buffer).
    let rs = ring_ms(Collective::ReduceScatter, 4, 100.0, 32.0, 0.0);
    assert!(close(rs * 2.0, ring_ms(Collective::AllReduce, 4, 100.0, 32.0, 0.0)));
    // The latency term adds α per ring step.
    assert!(close(
        ring_ms(Collective::AllReduce, 4, 100.0, 32.0, 5.0) - ring_ms(Collective::AllReduce, 4, 100.0, 32.0, 0.0),
        0.030
    ));
}

#[test]
fn s8_the_optimum_respects_availability() {
    let t = pcie_pair_box();
    // A naive greedy gives {0,4} (SYS) and {0,2,4,5} (distance 46).
    assert_eq!(pick(&t, &[0, 4, 5], 2, NumaPolicy::BestEffort), Ok(vec![4, 5]));
    let p = Prepared::new(&t, &LinkCosts::default());
    let four = p.select(mask(&[0, 2, 4, 5, 6, 7]), 4, NumaPolicy::BestEffort).unwrap();
    assert_eq!(four.gpus, vec![4, 5, 6, 7]);
    assert_eq!(four.distance_milli, 22_000, "Σ pairwise distance 22");
    // Two NVLink pairs free: {4,5} fills NUMA1 exactly and keeps {1,2,3} together (best fit).
    assert_eq!(pick(&t, &[1, 2, 3, 4, 5], 2, NumaPolicy::BestEffort), Ok(vec![4, 5]));
    // Same availability under `none`: NUMA is ignored, so the bandwidth cut decides: taking {2,3}
    // leaves 1 alone anyway, taking {4,5} cuts nothing more.
    let none = pick(&t, &[1, 2, 3, 4, 5], 2, NumaPolicy::None).unwrap();
    assert!(none == vec![2, 3] || none == vec![4, 5]);
}

#[test]
fn s9_two_gpus_take_a_same_numa_nvlink_pair() {
    let t = pcie_pair_box();
    assert_eq!(pick(&t, &[0, 1, 2, 3, 4, 5, 6, 7], 2, NumaPolicy::BestEffort), Ok(vec![0, 1]));
    // Never a SYS pair while a same-NUMA NVLink pair is free, whatever else is free.
    for free in 0u64..256 {
        let gpus: Vec<u32> = (0..8).filter(|i| free >> i & 1 == 1).collect();
        let has_pair = (0..4).any(|p| free >> (2 * p) & 3 == 3);
        if has_pair {
            let chosen = pick(&t, &gpus, 2, NumaPolicy::BestEffort).unwrap();
            assert_eq!(chosen[0] / 2, chosen[1] / 2, "free {gpus:?} chose {chosen:?}");
        }
    }
    // One GPU: not from a free NVLink pair when a lone GPU will do.
    assert_eq!(pick(&t, &[0, 1, 2], 1, NumaPolicy::BestEffort), Ok(vec![2]));
}

#[test]
fn s10_single_numa_best_fit_keeps_the_whole_numa_node() {
    let t = dgx_like();
    let free = [0, 1, 2, 3, 6, 7];
    let two = pick(&t, &free, 2, NumaPolicy::SingleNumaNode).unwrap();
    assert_eq!(two, vec![6, 7], "first fit takes NUMA0");
    let rest: Vec<u32> = free.iter().copied().filter(|g| !two.contains(g)).collect();
    assert_eq!(pick(&t, &rest, 4, NumaPolicy::SingleNumaNode), Ok(vec![0, 1, 2, 3]));
}

#[test]
fn s11_single_numa_node_is_a_hard_filter() {
    let t = pcie_pair_box();
    let free = [1, 2, 3, 5, 6, 7];
    let err = pick(&t, &free, 4, NumaPolicy::SingleNumaNode).unwrap_err();
    assert_eq!(err, Unsatisfiable::Numa { policy: "single-numa-node", requested: 4, span: 1 });
    let admitted = pick(&t, &free, 4, NumaPolicy::BestEffort).unwrap();
    // Admitted across two NUMA nodes: three plus one has fewer cross-socket pairs than two plus
    // two, and {1,2,3,5} leaves the NVLink pair {6,7} whole.
    assert_eq!(admitted, vec![1, 2, 3, 5]);
    assert_eq!(NumaPolicy::parse("single-numa"), Some(NumaPolicy::SingleNumaNode));
}

#[test]
fn s12_restricted_admits_only_the_narrowest_span() {
    let t = pcie_pair_box();
    let p = Prepared::new(&t, &LinkCosts::default());
    assert_eq!(p.min_span(4), 1);
    assert_eq!(p.min_span(6), 2);
    // 4 GPUs could fit one NUMA node on this machine, so a 2-node span is refused…
    let free = [1, 2, 3, 5, 6, 7];
    assert!(matches!(pick(&t, &free, 4, NumaPolicy::Restricted), Err(Unsatisfiable::Numa { span: 1, .. })));
    // …where `none` takes it; and 6 GPUs need two nodes anyway, so restricted admits them.
    assert!(pick(&t, &free, 4, NumaPolicy::None).is_ok());
    assert_eq!(pick(&t, &[0, 1, 2, 3, 4, 5, 6], 6, NumaPolicy::Restricted).unwrap().len(), 6);
}

#[test]
fn s13_the_node_score_follows_the_bottleneck() {
    let t = pcie_pair_box();
    let p = Prepared::new(&t, &LinkCosts::default());
    let bottleneck = |gpus: &[u32]| p.ranked(mask(gpus), 4, NumaPolicy::None).unwrap()[0].bottleneck_mbps.unwrap();
    assert_eq!(bottleneck(&[0, 1, 2, 3]), 32_000);
    assert_eq!(bottleneck(&[0, 1, 4, 5]), 25_000);
    // Node ranking: an NVSwitch node beats the NVLink-pair node beats a PCIe node for 4 GPUs; a node
    // forced across NUMA scores below the same node with a whole NUMA node free.
    let reference = 900_000;
    let all = 0xff;
    let dgx =
        Prepared::new(&dgx_like(), &LinkCosts::default()).score(all, 4, NumaPolicy::BestEffort, reference).unwrap();
    let pairs = p.score(all, 4, NumaPolicy::BestEffort, reference).unwrap();
    let split = p.score(mask(&[0, 1, 4, 5]), 4, NumaPolicy::BestEffort, reference).unwrap();
    let pcie = matrix(&[0, 0, 0, 0, 1, 1, 1, 1], |i, j| if i / 4 == j / 4 { "NODE" } else { "SYS" });
    let pcie = Prepared::new(&pcie, &LinkCosts::default()).score(all, 4, NumaPolicy::BestEffort, reference).unwrap();
    assert!(dgx > pairs && pairs > split && pairs > pcie, "dgx {dgx} pairs {pairs} split {split} pcie {pcie}");
    assert_eq!(p.score(all, 1, NumaPolicy::BestEffort, reference), Some(100));
    assert_eq!(p.score(mask(&[0]), 2, NumaPolicy::BestEffort, reference), None);
}

#[test]
fn nvlink_bridge_pairs_beat_numa_alignment() {
    // A100 PCIe: each bridged pair spans two NUMA nodes; the pair still wins over SYS.
    let t = smi::parse(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/a100-pcie-4gpu-nvlink-bridge-pairs.txt"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(pick(&t, &[0, 1, 2, 3], 2, NumaPolicy::BestEffort), Ok(vec![0, 1]));
    assert_eq!(pick(&t, &[1, 2, 3], 2, NumaPolicy::BestEffort), Ok(vec![2, 3]));
    assert!(pick(&t, &[0, 1], 2, NumaPolicy::SingleNumaNode).is_err());
}

#[test]
fn bad_requests_get_reasons() {
    let t = pcie_pair_box();
    assert_eq!(pick(&t, &[0, 1], 3, NumaPolicy::None), Err(Unsatisfiable::NotEnoughFree { free: 2, requested: 3 }));
    assert_eq!(pick(&t, &[0, 1], 0, NumaPolicy::None), Err(Unsatisfiable::Zero));
    // GPUs beyond the node are not free GPUs.
    assert_eq!(pick(&t, &[40, 41], 2, NumaPolicy::None), Err(Unsatisfiable::NotEnoughFree { free: 0, requested: 2 }));
    let unknown = smi::parse("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\t X \n").unwrap();
    assert_eq!(
        pick(&unknown, &[0, 1], 2, NumaPolicy::SingleNumaNode),
        Err(Unsatisfiable::NumaUnknown("single-numa-node"))
    );
    assert_eq!(pick(&unknown, &[0, 1], 2, NumaPolicy::BestEffort), Ok(vec![0, 1]));
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn s6_s17_s18_cluster_locality() {
    // A sample cluster: 2 racks × 4 nodes, 8 GPUs each, one ToR switch per rack.
    let tiers = Tiers::default();
    let mut nodes: Vec<(String, BTreeMap<String, String>, u32)> = Vec::new();
    for r in 0..2 {
        for i in 0..4 {
            let rack = format!("rack-{r}");
            let spine = format!("tor-{r}");
            nodes.push((
                format!("node-{r}-{i}"),
                labels(&[
                    ("wasmsched.io/rack", &rack),
                    ("wasmsched.io/spine", &spine),
                    ("topology.kubernetes.io/zone", "z1"),
                ]),
                8,
            ));
        }
    }
    let owned = nodes.clone();
    let cands: Vec<Candidate<'_>> =
        owned.iter().map(|(n, l, f)| Candidate { name: n, labels: l, free_gpus: *f }).collect();
    // Sample cluster: intra-rack 100 GB/s, cross-rack 50 GB/s.
    let mut sample = tiers.clone();
    sample.tiers[0].within.bandwidth_gbps = 50.0;
    sample.tiers[1].within.bandwidth_gbps = 50.0;

    // S6: 32 GPUs = 4 nodes in one rack, ring all-reduce of 100 MB = 1.4648 ms.
    let four = sample.choose(&cands, 4, 8, Locality::Pack).unwrap();
    assert_eq!(four.nodes, ["node-0-0", "node-0-1", "node-0-2", "node-0-3"]);
    assert_eq!(four.spans, "rack");
    assert!((four.allreduce_ms(100.0) - 1.4648).abs() < 1e-3);
    // 40 GPUs: 5 nodes, one rack plus the nearest node, bottleneck 50 → 3.125 ms.
    let five = sample.choose(&cands, 5, 8, Locality::Pack).unwrap();
    assert_eq!(five.nodes.iter().filter(|n| n.starts_with("node-0")).count(), 4);
    assert!((five.allreduce_ms(100.0) - 3.125).abs() < 1e-3);
    // S18: same-rack ≤ cross-rack for the same n (2+2 split = 2.93 ms).
    assert!((ring_ms(Collective::AllReduce, 4, 100.0, 50.0, 0.0) - 2.9297).abs() < 1e-3);
    // 72 GPUs: not enough nodes; one node: "node".
    assert!(sample.choose(&cands, 9, 8, Locality::Pack).unwrap_err().contains("not enough nodes"));
    assert_eq!(sample.choose(&cands, 1, 8, Locality::Pack).unwrap().spans, "node");

    // S17: best fit. Rack B has 8 free nodes, rack A 4: a 4-node gang goes to A.
    let mut cluster = Vec::new();
    for i in 0..4 {
        cluster.push((format!("a-{i}"), labels(&[("wasmsched.io/rack", "A"), ("wasmsched.io/spine", "s1")]), 8));
    }
    for i in 0..8 {
        cluster.push((format!("b-{i}"), labels(&[("wasmsched.io/rack", "B"), ("wasmsched.io/spine", "s1")]), 8));
    }
    // A third rack under another spine, nearer by nothing.
    for i in 0..3 {
        cluster.push((format!("c-{i}"), labels(&[("wasmsched.io/rack", "C"), ("wasmsched.io/spine", "s2")]), 8));
    }
    let cands: Vec<Candidate<'_>> =
        cluster.iter().map(|(n, l, f)| Candidate { name: n, labels: l, free_gpus: *f }).collect();
    let gang = tiers.choose(&cands, 4, 8, Locality::Pack).unwrap();
    assert!(gang.nodes.iter().all(|n| n.starts_with("a-")), "{:?}", gang.nodes);
    // 9 nodes: rack B (8) plus one from rack A under the same spine, not rack C.
    let nine = tiers.choose(&cands, 9, 8, Locality::Pack).unwrap();
    assert_eq!(nine.spans, "spine");
    assert_eq!(nine.nodes.iter().filter(|n| n.starts_with("b-")).count(), 8);
    assert!(nine.nodes.iter().any(|n| n.starts_with("a-")));
    // Free GPUs decide: with two of rack A's nodes busy, the gang goes to B.
    cluster[0].2 = 2;
    cluster[1].2 = 0;
    let cands: Vec<Candidate<'_>> =
        cluster.iter().map(|(n, l, f)| Candidate { name: n, labels: l, free_gpus: *f }).collect();
    let gang = tiers.choose(&cands, 4, 8, Locality::Pack).unwrap();
    assert!(gang.nodes.iter().all(|n| n.starts_with("b-")), "{:?}", gang.nodes);
    // Compute-heavy: spread takes one node per rack in turn.
    let spread = tiers.choose(&cands, 3, 8, Locality::Spread).unwrap();
    let racks: std::collections::BTreeSet<char> = spread.nodes.iter().map(|n| n.chars().next().unwrap()).collect();
    assert_eq!(racks.len(), 3, "{:?}", spread.nodes);
}

#[test]
fn s7_s20_cpu_pinning_uses_the_gpus_numa_node() {
    let t = pcie_pair_box();
    let numa = vec![
        NumaNode { id: 0, cpus: CpuSet::parse("0-63").unwrap(), memory_mb: None, distances: vec![] },
        NumaNode { id: 1, cpus: CpuSet::parse("64-127").unwrap(), memory_mb: None, distances: vec![] },
    ];
    let none = CpuSet::default();
    let plan = pinning::plan(&t, &numa, &[0, 1, 2, 3], 32, &none).unwrap();
    assert_eq!(plan.cpus.to_string(), "0-31");
    let plan = pinning::plan(&t, &numa, &[4, 5], 16, &none).unwrap();
    assert_eq!(
        plan.numactl(&["python", "train.py"]),
        ["numactl", "--physcpubind=64-79", "--membind=1", "--", "python", "train.py"]
    );
    let plan = pinning::plan(&t, &numa, &[0, 4], 96, &none).unwrap();
    assert_eq!((plan.cpus.to_string().as_str(), plan.numa_nodes.as_slice()), ("0-95", [0, 1].as_slice()));
    // Already pinned CPUs are skipped.
    let pinned = CpuSet::parse("64-71").unwrap();
    assert_eq!(pinning::plan(&t, &numa, &[4, 5], 16, &pinned).unwrap().cpus.to_string(), "72-87");
    // An unknown GPU is an error, not CPUs from NUMA 0.
    assert!(pinning::plan(&t, &numa, &[9], 4, &none).unwrap_err().contains("GPU 9 is not on this node"));
    assert!(pinning::plan(&t, &numa, &[0], 200, &none).unwrap_err().contains("200 CPUs requested"));
}

#[test]
fn numa_nodes_come_from_the_topology_when_the_host_is_not_at_hand() {
    let t = smi::parse(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pcie-8gpu-node-sys.txt"))
            .unwrap(),
    )
    .unwrap();
    let numa = pinning::numa_from_topology(&t);
    assert_eq!(
        numa.iter().map(|n| (n.id, n.cpus.to_string())).collect::<Vec<_>>(),
        [(0, "0-63,128-191".to_string()), (1, "64-127,192-255".to_string())]
    );
    let plan = pinning::plan(&t, &numa, &[5, 6], 8, &CpuSet::default()).unwrap();
    assert_eq!(plan.numactl(&["x"]), ["numactl", "--physcpubind=64-71", "--membind=1", "--", "x"]);
}

#[test]
fn numactl_hardware_is_parsed_with_distances() {
    let text = "available: 2 nodes (0-1)\nnode 0 cpus: 0 1 2 3\nnode 0 size: 515581 MB\nnode 0 free: 400000 MB\nnode 1 cpus: 4 5 6 7\nnode 1 size: 516078 MB\nnode 1 free: 410000 MB\nnode distances:\nnode   0   1 \n  0:  10  21 \n  1:  21  10 \n";
    let nodes = pinning::parse_numactl(text).unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[1].cpus.to_string(), "4-7");
    assert_eq!(nodes[0].memory_mb, Some(515_581));
    assert_eq!(nodes[1].distances, [21, 10]);
    assert!(pinning::parse_numactl("garbage").unwrap_err().contains("numactl --hardware"));
    assert!(pinning::parse_numactl("node 0 cpus: 0 x").is_err());
}

#[test]
fn s19_alerts_for_numa_spans_and_slow_collectives() {
    use wasmsched_topology::alerts::{Severity, Thresholds, placement_alerts};
    let t = pcie_pair_box();
    let costs = LinkCosts::default();
    let thresholds = Thresholds::default();
    // {0,1}: one NUMA node over NVLink: no alert.
    assert!(placement_alerts(&t, &costs, &[0, 1], &thresholds).is_empty());
    // {0,1,2,3}: one NUMA node, PCIe bottleneck 4.58 ms + latency: under 5 ms.
    assert!(placement_alerts(&t, &costs, &[0, 1, 2, 3], &thresholds).is_empty());
    // {0,1,4,5}: spans NUMA nodes (warning) and the SYS bottleneck puts all-reduce at 5.9 ms (critical).
    let alerts = placement_alerts(&t, &costs, &[0, 1, 4, 5], &thresholds);
    let kinds: Vec<(Severity, &str)> = alerts.iter().map(|a| (a.severity, a.kind.as_str())).collect();
    assert_eq!(kinds, [(Severity::Warning, "topology-mismatch"), (Severity::Critical, "communication-bottleneck")]);
    assert!(alerts[0].message.contains("span NUMA nodes 0, 1"), "{}", alerts[0].message);
    // One GPU: nothing to judge. A GPU that is not there: a mismatch, not a panic.
    assert!(placement_alerts(&t, &costs, &[3], &thresholds).is_empty());
    assert!(placement_alerts(&t, &costs, &[3, 12], &thresholds)[0].message.contains("GPU 12 is not on this node"));
}

#[test]
fn an_absurd_node_exhausts_the_budget_instead_of_hanging() {
    // 48 GPUs with pseudo-random links (no symmetry): C(48, 24) sets. The search gives up with an
    // error after SEARCH_BUDGET partial sets rather than holding a host call for hours.
    let classes = [Link::Pix, Link::Pxb, Link::Phb, Link::Node, Link::Sys, Link::NvLink { links: 2, switched: false }];
    let n = 48;
    let gpus = (0..n)
        .map(|i| wasmsched_topology::Gpu { index: i as u32, numa: Some((i % 4) as u32), ..Default::default() })
        .collect();
    let class = |a: usize, b: usize| {
        // splitmix64 of the unordered pair: no structure for the search to exploit.
        let mut z = ((a.min(b) as u64) << 32 | a.max(b) as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        classes[((z ^ (z >> 31)) % classes.len() as u64) as usize]
    };
    let t = NodeTopology::new(gpus, class, Vec::new()).unwrap();
    let p = Prepared::new(&t, &LinkCosts::default());
    let started = std::time::Instant::now();
    let result = p.select(p.all(), 24, NumaPolicy::BestEffort);
    assert_eq!(result.unwrap_err(), Unsatisfiable::SearchBudget);
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
}
