//! Seeded generators of clusters and tasks, shared by the simulator, tests and benchmarks (so that
//! property tests and fuzz targets can reuse them, as wasmtime keeps its generators apart).

use wasmsched_api::{
    GPU_MILLI, GpuDevice, GpuHealth, GpuRequest, Node, NodeAffinity, NodeSelectorTerm, PreferredTerm, Resources,
    SelectorOperator, SelectorRequirement, Taint, TaintEffect, Task, Toleration, TolerationOperator,
};
use wasmsched_core::NodeTable;

/// A small deterministic PRNG (SplitMix64): same seed, same cluster, on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p` percent.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Numbers that break naive arithmetic: zero, negative, just past 32 and 64 bits, a float.
const HOSTILE_NUMBERS: [&str; 9] =
    ["0", "-1", "1", "65", "4294967296", "9223372036854775807", "18446744073709551615", "1e300", "NaN"];

/// `text` with one random mutation of the kind real inputs suffer: a number made zero, negative
/// or huge; a line dropped, doubled or moved; the text cut short. For tests that feed parsers
/// and what follows them damaged versions of real files.
pub fn mutate_text(text: &str, rng: &mut Rng) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return text.to_string();
    }
    let line = |rng: &mut Rng| rng.below(lines.len() as u64) as usize;
    let joined = |v: Vec<&str>| v.join("\n");
    match rng.below(6) {
        0 | 1 => {
            let spots = number_spans(text);
            if spots.is_empty() {
                return text.to_string();
            }
            let (a, b) = *rng.pick(&spots);
            format!("{}{}{}", &text[..a], rng.pick(&HOSTILE_NUMBERS), &text[b..])
        }
        2 => {
            let drop = line(rng);
            joined(lines.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, l)| *l).collect())
        }
        3 => {
            let twice = line(rng);
            let mut out = lines.clone();
            out.insert(twice, lines[twice]);
            joined(out)
        }
        4 => {
            let (a, b) = (line(rng), line(rng));
            let mut out = lines.clone();
            out.swap(a, b);
            joined(out)
        }
        _ => {
            let mut cut = rng.below(text.len() as u64) as usize;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text[..cut].to_string()
        }
    }
}

/// Byte spans of the unsigned decimal numbers in `text`, quantities' digits included (`4Gi`), not
/// parts of names (`n1`, `gpu0`).
fn number_spans(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-'));
        if !starts {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        out.push((start, i));
    }
    out
}

const MODELS: [&str; 5] = ["V100M16", "V100M32", "P100", "T4", "A10"];

/// A random GPU node: 0, 1, 2, 4 or 8 GPUs, partly allocated, sometimes tainted, labelled with a
/// zone and its model.
pub fn node(rng: &mut Rng, name: String) -> Node {
    let gpu_count = *rng.pick(&[0u32, 1, 2, 4, 8, 8]);
    let model = rng.pick(&MODELS).to_string();
    let gpus: Vec<GpuDevice> = (0..gpu_count)
        .map(|index| {
            let free_milli = *rng.pick(&[GPU_MILLI, GPU_MILLI, GPU_MILLI, 0, 500, 250, 900]);
            GpuDevice {
                index,
                model: model.clone(),
                memory_bytes: 32 << 30,
                free_milli,
                free_memory_bytes: (32u64 << 30) * u64::from(free_milli) / u64::from(GPU_MILLI),
                health: if rng.percent(3) { GpuHealth::Unhealthy } else { GpuHealth::Healthy },
                numa_node: Some(index / 4),
                kind: Default::default(),
            }
        })
        .collect();
    let cpu = *rng.pick(&[32_000u64, 64_000, 96_000, 128_000]);
    let mem = *rng.pick(&[128u64 << 30, 256 << 30, 512 << 30]);
    let allocated_gpu: u64 = gpus.iter().map(|g| u64::from(GPU_MILLI - g.free_milli)).sum();
    let mut taints = Vec::new();
    if rng.percent(10) {
        taints.push(Taint { key: "gpu".into(), value: "reserved".into(), effect: TaintEffect::NoSchedule });
    }
    if rng.percent(5) {
        taints.push(Taint { key: "maintenance".into(), value: String::new(), effect: TaintEffect::PreferNoSchedule });
    }
    let mut labels = vec![("gpu-model".to_string(), model), ("zone".to_string(), format!("zone-{}", rng.below(3)))];
    labels.sort();
    Node {
        name,
        labels,
        taints,
        allocatable: Resources {
            cpu_milli: cpu,
            memory_bytes: mem,
            gpu_milli: u64::from(gpu_count * GPU_MILLI),
            extended: vec![("rdma/hca".into(), rng.below(3))].into(),
        },
        allocated: Resources {
            cpu_milli: rng.below(cpu + 1),
            memory_bytes: rng.below(mem + 1),
            gpu_milli: allocated_gpu,
            extended: Default::default(),
        },
        gpus: gpus.into(),
        unschedulable: rng.percent(2),
    }
}

/// Random node affinity over the labels [`node`] gives (`zone`, `gpu-model`) and node names: one
/// or two required terms (sometimes none) and up to three preferred ones, with every operator.
/// Separate from [`task`] so that existing seeded task streams stay as they were.
pub fn node_affinity(rng: &mut Rng) -> NodeAffinity {
    fn requirement(rng: &mut Rng) -> SelectorRequirement {
        let zone = |rng: &mut Rng| format!("zone-{}", rng.below(3));
        let (key, operator, values) = match rng.below(6) {
            0 => ("zone".to_string(), SelectorOperator::In, vec![zone(rng), zone(rng)]),
            1 => ("zone".to_string(), SelectorOperator::NotIn, vec![zone(rng)]),
            2 => ("gpu-model".to_string(), SelectorOperator::In, vec![rng.pick(&MODELS).to_string()]),
            3 => ("gpu-model".to_string(), SelectorOperator::Exists, vec![]),
            4 => ("rack".to_string(), SelectorOperator::DoesNotExist, vec![]),
            _ => ("rack".to_string(), SelectorOperator::Gt, vec![rng.below(10).to_string()]),
        };
        SelectorRequirement { key, operator, values }
    }
    fn term(rng: &mut Rng) -> NodeSelectorTerm {
        let match_expressions = (0..1 + rng.below(2)).map(|_| requirement(rng)).collect();
        let match_fields = if rng.percent(10) {
            vec![SelectorRequirement {
                key: wasmsched_api::NODE_NAME_FIELD.into(),
                operator: SelectorOperator::NotIn,
                values: vec![format!("node-{:05}", rng.below(50))],
            }]
        } else {
            vec![]
        };
        NodeSelectorTerm { match_expressions, match_fields }
    }
    let required = (0..rng.below(3)).map(|_| term(rng)).collect();
    let preferred =
        (0..rng.below(4)).map(|_| PreferredTerm { weight: 1 + rng.below(100) as u32, preference: term(rng) }).collect();
    NodeAffinity { required, preferred }
}

/// A table of `n` random nodes.
pub fn cluster(rng: &mut Rng, n: usize) -> NodeTable {
    let mut t = NodeTable::new();
    for i in 0..n {
        t.upsert(node(rng, format!("node-{i:05}")));
    }
    t
}

/// A random task: CPU-only, a GPU share, or 1–8 whole GPUs, sometimes with a model list, a
/// selector, a toleration or an extended resource.
pub fn task(rng: &mut Rng, id: String) -> Task {
    let gpu = match rng.below(4) {
        0 => GpuRequest::default(),
        1 => GpuRequest { count: 1, milli_per_gpu: *rng.pick(&[100u32, 250, 500, 800]), ..Default::default() },
        _ => GpuRequest { count: *rng.pick(&[1u32, 2, 4, 8]), milli_per_gpu: GPU_MILLI, ..Default::default() },
    };
    let mut gpu = gpu;
    if gpu.count > 0 && rng.percent(30) {
        gpu.models = vec![rng.pick(&MODELS).to_string()];
    }
    if gpu.count > 0 && rng.percent(20) {
        gpu.memory_bytes_per_gpu = 16 << 30;
    }
    let mut t = Task {
        id,
        namespace: "default".into(),
        queue: "default".into(),
        request: Resources {
            cpu_milli: *rng.pick(&[500u64, 4000, 16_000, 64_000]),
            memory_bytes: *rng.pick(&[1u64 << 30, 16 << 30, 128 << 30]),
            ..Default::default()
        },
        gpu,
        ..Default::default()
    };
    if rng.percent(15) {
        t.node_selector = vec![("zone".into(), format!("zone-{}", rng.below(3)))];
    }
    if rng.percent(30) {
        t.tolerations =
            vec![Toleration { key: "gpu".into(), operator: TolerationOperator::Exists, ..Default::default() }];
    }
    if rng.percent(10) {
        t.request.extended = vec![("rdma/hca".into(), 1)].into();
    }
    t
}
