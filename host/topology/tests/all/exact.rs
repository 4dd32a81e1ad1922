//! Selection is exact: the branch and bound returns what a brute force over every subset returns.
//! The brute force here is written independently of the library (its own key, from the topology
//! and the link costs), on every availability mask of the 8-GPU fixtures and on random masks of
//! 16-GPU and random topologies.

use proptest::prelude::*;
use wasmsched_topology::{Link, LinkCosts, NodeTopology, NumaPolicy, Prepared, smi};

const POLICIES: [NumaPolicy; 4] =
    [NumaPolicy::None, NumaPolicy::BestEffort, NumaPolicy::Restricted, NumaPolicy::SingleNumaNode];

/// The key of the module docs, built from scratch: smaller is better.
fn key(
    t: &NodeTopology,
    costs: &LinkCosts,
    free: u64,
    set: &[usize],
    policy: NumaPolicy,
) -> (i64, i64, u32, u32, i64, Vec<usize>) {
    let mbps = |a: usize, b: usize| (costs.cost(t.link(a, b).unwrap()).bandwidth_gbps * 1000.0).round() as i64;
    let dist = |a: usize, b: usize| (costs.distance(t.link(a, b).unwrap()) * 1000.0).round() as i64;
    let mut bottleneck = i64::MAX;
    let mut distance = 0;
    for (x, &a) in set.iter().enumerate() {
        for &b in &set[x + 1..] {
            bottleneck = bottleneck.min(mbps(a, b));
            distance += dist(a, b);
        }
    }
    let numa = |g: usize| t.gpus()[g].numa;
    let mut touched: Vec<Option<u32>> = set.iter().map(|&g| numa(g)).collect();
    touched.sort();
    touched.dedup();
    let rest: Vec<usize> = (0..t.len()).filter(|g| free >> g & 1 == 1 && !set.contains(g)).collect();
    let leftover = rest.iter().filter(|&&g| touched.contains(&numa(g))).count() as u32;
    let cut = set.iter().flat_map(|&a| rest.iter().map(move |&b| (a, b))).map(|(a, b)| mbps(a, b)).sum();
    let (span, leftover) = if policy == NumaPolicy::None { (0, 0) } else { (touched.len() as u32, leftover) };
    (-bottleneck, distance, span, leftover, cut, set.to_vec())
}

fn brute_force(t: &NodeTopology, costs: &LinkCosts, free: u64, k: usize, policy: NumaPolicy) -> Option<Vec<usize>> {
    let gpus: Vec<usize> = (0..t.len()).filter(|g| free >> g & 1 == 1).collect();
    let numa_known = t.gpus().iter().all(|g| g.numa.is_some());
    // kubelet's preferred width: fewest NUMA nodes whose GPUs (busy or not) could hold k.
    let mut sizes: Vec<usize> =
        t.numa_nodes().iter().map(|id| t.gpus().iter().filter(|g| g.numa == Some(*id)).count()).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let min_span = sizes
        .iter()
        .scan(0, |acc, s| {
            *acc += s;
            Some(*acc)
        })
        .position(|total| total >= k)
        .map_or(sizes.len(), |p| p + 1);
    let max_span = match policy {
        NumaPolicy::None | NumaPolicy::BestEffort => usize::MAX,
        _ if !numa_known => return None,
        NumaPolicy::Restricted => min_span,
        NumaPolicy::SingleNumaNode => 1,
    };
    let mut best: Option<(i64, i64, u32, u32, i64, Vec<usize>)> = None;
    for bits in 0u64..1 << gpus.len() {
        if bits.count_ones() as usize != k {
            continue;
        }
        let set: Vec<usize> = (0..gpus.len()).filter(|i| bits >> i & 1 == 1).map(|i| gpus[i]).collect();
        let mut spans: Vec<Option<u32>> = set.iter().map(|&g| t.gpus()[g].numa).collect();
        spans.sort();
        spans.dedup();
        if spans.len() > max_span {
            continue;
        }
        let candidate = key(t, costs, free, &set, policy);
        if best.as_ref().is_none_or(|b| candidate < *b) {
            best = Some(candidate);
        }
    }
    best.map(|b| b.5)
}

fn check(t: &NodeTopology, free: u64, k: usize, policy: NumaPolicy) -> Result<(), TestCaseError> {
    let costs = LinkCosts::default();
    let fast = Prepared::new(t, &costs)
        .select(free, k as u32, policy)
        .ok()
        .map(|c| c.gpus.iter().map(|&g| g as usize).collect::<Vec<_>>());
    let slow = brute_force(t, &costs, free, k, policy);
    prop_assert_eq!(fast, slow, "free {:#b} k {} policy {:?}", free, k, policy);
    Ok(())
}

fn fixture(name: &str) -> NodeTopology {
    smi::parse(&std::fs::read_to_string(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap())
        .unwrap()
}

#[test]
fn every_mask_of_every_small_fixture() {
    for name in [
        "h100-sxm-8gpu-nv18.txt",
        "dgx1v-8gpu-nv1-nv2-cube-mesh.txt",
        "pcie-8gpu-node-sys.txt",
        "pcie-6gpu-pix-pairs.txt",
        "a100-pcie-4gpu-nvlink-bridge-pairs.txt",
        "k80-4gpu-soc-old.txt",
    ] {
        let t = fixture(name);
        for free in 0..1u64 << t.len() {
            for k in 1..=t.len() {
                for policy in POLICIES {
                    check(&t, free, k, policy).unwrap_or_else(|e| panic!("{name}: {e}"));
                }
            }
        }
    }
}

/// A random symmetric topology: link classes drawn per pair, NUMA per GPU.
fn random_topology(n: usize, cells: &[u8], numa: &[u8]) -> NodeTopology {
    let classes = [
        Link::NvLink { links: 1, switched: false },
        Link::NvLink { links: 2, switched: false },
        Link::NvLink { links: 12, switched: false },
        Link::Pix,
        Link::Pxb,
        Link::Phb,
        Link::Node,
        Link::Sys,
    ];
    let gpus = (0..n)
        .map(|i| wasmsched_topology::Gpu { index: i as u32, numa: Some(u32::from(numa[i] % 3)), ..Default::default() })
        .collect();
    NodeTopology::new(gpus, |a, b| classes[cells[a.min(b) * n + a.max(b)] as usize % classes.len()], Vec::new())
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn sixteen_gpu_node_random_masks(free in 0u64..1 << 16, k in 1usize..=16, p in 0usize..4) {
        let t = fixture("dgx2-16gpu-nv6-mlx5.txt");
        check(&t, free, k, POLICIES[p])?;
    }

    #[test]
    fn random_topologies_random_masks(
        n in 2usize..=12,
        cells in proptest::collection::vec(0u8..8, 144),
        numa in proptest::collection::vec(0u8..3, 12),
        free in any::<u64>(),
        k in 1usize..=12,
        p in 0usize..4,
    ) {
        let t = random_topology(n, &cells, &numa);
        check(&t, free & ((1 << n) - 1), k.min(n), POLICIES[p])?;
    }

    #[test]
    fn random_sixteen_gpu_topologies(
        cells in proptest::collection::vec(0u8..8, 256),
        numa in proptest::collection::vec(0u8..3, 16),
        free in 0u64..1 << 16,
        k in 1usize..=8,
    ) {
        let t = random_topology(16, &cells, &numa);
        check(&t, free, k, NumaPolicy::BestEffort)?;
    }
}
