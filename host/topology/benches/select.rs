//! GPU-set selection and the node topology score.
//!
//! - `select/<node>/k=<k>`: the exact best set of `k` GPUs on a node with every GPU free (the
//!   worst case for ties: every set of an NVSwitch node is equal on bandwidth and distance), and
//!   on a fragmented node (`frag`: every other GPU busy, then two more free).
//! - `score_5000_nodes/k=4`: the topology score of a 4-GPU task over 5,000 nodes with random
//!   availability (a mix of the fixtures), i.e. the added cost of the score inside one cycle.
//!
//! Issue target: ≤ 10 µs per selection on 8-GPU nodes. Results in BENCHMARKS.md.
// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use wasmsched_topology::{LinkCosts, NodeTopology, NumaPolicy, Prepared, smi};

fn fixture(name: &str) -> NodeTopology {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    smi::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn select(c: &mut Criterion) {
    let costs = LinkCosts::default();
    let nodes = [
        ("h100-nv18", "h100-sxm-8gpu-nv18.txt"),
        ("dgx1-cube-mesh", "dgx1v-8gpu-nv1-nv2-cube-mesh.txt"),
        ("pcie-node-sys", "pcie-8gpu-node-sys.txt"),
        ("dgx2-16gpu", "dgx2-16gpu-nv6-mlx5.txt"),
    ];
    let mut group = c.benchmark_group("select");
    for (label, file) in nodes {
        let p = Prepared::new(&fixture(file), &costs);
        let n = p.len() as u32;
        for k in 1..=n {
            group.bench_with_input(BenchmarkId::new(format!("{label}/all-free"), k), &k, |b, &k| {
                b.iter(|| p.select(black_box(p.all()), k, NumaPolicy::BestEffort).unwrap())
            });
        }
        // Every other GPU busy, plus two more free: fragmented, as a busy node is.
        let frag = 0x5555_5555_5555_5555 & p.all() | 0b1010;
        for k in 1..=frag.count_ones() {
            group.bench_with_input(BenchmarkId::new(format!("{label}/frag"), k), &k, |b, &k| {
                b.iter(|| p.select(black_box(frag), k, NumaPolicy::BestEffort).unwrap())
            });
        }
    }
    group.finish();
}

fn score_5000(c: &mut Criterion) {
    let costs = LinkCosts::default();
    let kinds: Vec<Prepared> = [
        "h100-sxm-8gpu-nv18.txt",
        "dgx1v-8gpu-nv1-nv2-cube-mesh.txt",
        "pcie-8gpu-node-sys.txt",
        "pcie-6gpu-pix-pairs.txt",
    ]
    .iter()
    .map(|f| Prepared::new(&fixture(f), &costs))
    .collect();
    // xorshift: reproducible availability without a dependency.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let nodes: Vec<(&Prepared, u64)> = (0..5000)
        .map(|i| {
            let p = &kinds[i % kinds.len()];
            (p, next() & p.all())
        })
        .collect();
    c.bench_function("score_5000_nodes/k=4", |b| {
        b.iter(|| {
            nodes.iter().filter_map(|(p, free)| p.score(black_box(*free), 4, NumaPolicy::BestEffort, 900_000)).count()
        })
    });
}

criterion_group!(benches, select, score_5000);
criterion_main!(benches);
