//! What the node agent writes on a Node object and the scheduler reads back: one JSON annotation
//! with the complete topology (every GPU, every pair), and capability labels for node selectors.
//!
//! Keys live under `wasmsched.io/`: the `kubernetes.io` and `k8s.io` prefixes are
//! reserved for Kubernetes itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Gpu, Link, Nic, NodeTopology, PeerLinks};

/// Annotation holding the JSON topology.
pub const TOPOLOGY_ANNOTATION: &str = "wasmsched.io/gpu-topology";
/// Label prefix of the capability labels.
pub const LABEL_PREFIX: &str = "wasmsched.io/";
/// Version of the annotation format.
pub const FORMAT_VERSION: u32 = 1;
/// Annotation listing unhealthy GPU indexes (`3,5` or ranges `0-3`): the scheduler stops using them.
pub const UNHEALTHY_ANNOTATION: &str = "wasmsched.io/unhealthy-gpus";
/// Annotation listing degraded GPU indexes: usable, worth draining.
pub const DEGRADED_ANNOTATION: &str = "wasmsched.io/degraded-gpus";
/// Annotation an operator sets on a Node to take GPUs out of service by hand (`3` or `0-1,5`):
/// the node agent reports them unhealthy — to the kubelet and in [`UNHEALTHY_ANNOTATION`] — until
/// it is removed. For a GPU suspected bad that NVML does not flag, or one waiting for repair.
pub const OUT_OF_SERVICE_ANNOTATION: &str = "wasmsched.io/gpu-out-of-service";

/// The GPU indexes of a GPU-list annotation's value (`3,5`, ranges `0-3`); the error names `key`.
pub fn gpu_list(key: &str, value: &str) -> Result<Vec<u32>, Error> {
    crate::CpuSet::parse(value)
        .map(|set| set.iter().collect())
        .map_err(|e| Error::Invalid(format!("annotation {key}: {}", e.replace("CPU", "GPU"))))
}

/// Pod annotation written at bind: the GPUs the pod got, `index` or `index:milli`, comma-separated.
/// The node agent's device plugin reads it to give the pod's containers exactly those devices.
pub const GPU_IDS_ANNOTATION: &str = "wasmsched.io/gpu-ids";

/// The [`GPU_IDS_ANNOTATION`] value for `devices`: a whole GPU as its index, a share as
/// `index:milli`.
pub fn gpu_ids(devices: &[wasmsched_api::DeviceShare]) -> String {
    let parts: Vec<String> = devices
        .iter()
        .map(|d| if d.milli >= wasmsched_api::GPU_MILLI { d.gpu.to_string() } else { format!("{}:{}", d.gpu, d.milli) })
        .collect();
    parts.join(",")
}

/// Parses [`gpu_ids`] back; the error says which part is wrong.
pub fn parse_gpu_ids(s: &str) -> Result<Vec<wasmsched_api::DeviceShare>, Error> {
    let bad = |what: &str, part: &str| Error::Invalid(format!("{GPU_IDS_ANNOTATION}: bad {what} in {part:?}"));
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (gpu, milli) = p.split_once(':').unwrap_or((p, "1000"));
            let gpu = gpu.parse().map_err(|_| bad("GPU index", p))?;
            let milli = milli
                .parse()
                .ok()
                .filter(|m| (1..=wasmsched_api::GPU_MILLI).contains(m))
                .ok_or_else(|| bad("share", p))?;
            Ok(wasmsched_api::DeviceShare { gpu, milli })
        })
        .collect()
}

/// What the scheduler reads back from a node's annotations (the agent's side of the contract is
/// [`to_annotation`], [`labels`] and the two health annotations).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// The topology, when the agent wrote one.
    pub topology: Option<NodeTopology>,
    /// GPUs not to use.
    pub unhealthy: Vec<u32>,
    /// GPUs usable but degraded.
    pub degraded: Vec<u32>,
}

/// Reads a node's annotations (any others are ignored). A malformed value is an error naming the
/// annotation; the caller keeps the node's previous facts.
pub fn read_node<'a>(annotations: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<NodeFacts, Error> {
    let mut facts = NodeFacts::default();
    for (key, value) in annotations {
        let gpus = |value: &str| gpu_list(key, value);
        match key {
            TOPOLOGY_ANNOTATION => facts.topology = Some(from_annotation(value)?),
            UNHEALTHY_ANNOTATION => facts.unhealthy = gpus(value)?,
            DEGRADED_ANNOTATION => facts.degraded = gpus(value)?,
            _ => {}
        }
    }
    Ok(facts)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    version: u32,
    gpus: Vec<Gpu>,
    /// Every unordered pair `a < b`, once.
    links: Vec<PairLink>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    nics: Vec<Nic>,
    /// NUMA ids were inferred from CPU affinity, not reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    numa_inferred: bool,
    /// Whose links the `NV#` pairs are (`xgmi`, `neuronlink`, `hccs`), absent for NVIDIA's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer_links: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PairLink {
    a: u32,
    b: u32,
    /// The `nvidia-smi` code: `NV18`, `PIX`, `SYS`, …
    link: String,
    /// NVLink through an NVSwitch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    nvswitch: bool,
}

/// The annotation value for a topology.
pub fn to_annotation(topology: &NodeTopology) -> String {
    let n = topology.len();
    let mut links = Vec::with_capacity(n * n.saturating_sub(1) / 2);
    for a in 0..n {
        for b in a + 1..n {
            if let Some(link) = topology.link(a, b) {
                links.push(PairLink {
                    a: a as u32,
                    b: b as u32,
                    link: link.code(),
                    nvswitch: matches!(link, Link::NvLink { switched: true, .. }),
                });
            }
        }
    }
    let doc = Document {
        version: FORMAT_VERSION,
        gpus: topology.gpus().to_vec(),
        links,
        nics: topology.nics().to_vec(),
        numa_inferred: topology.numa_inferred(),
        peer_links: Some(topology.peer_links()).filter(|p| *p != PeerLinks::NvLink).map(|p| p.name().to_string()),
    };
    serde_json::to_string(&doc).expect("topology serialises")
}

/// Reads an annotation value back. Every pair must be given exactly once.
pub fn from_annotation(json: &str) -> Result<NodeTopology, Error> {
    let doc: Document =
        serde_json::from_str(json).map_err(|e| Error::Invalid(format!("annotation {TOPOLOGY_ANNOTATION}: {e}")))?;
    if doc.version != FORMAT_VERSION {
        return Err(Error::Invalid(format!(
            "annotation {TOPOLOGY_ANNOTATION} has format version {}, this build reads {FORMAT_VERSION}",
            doc.version
        )));
    }
    let n = doc.gpus.len();
    if n > crate::MAX_GPUS {
        return Err(Error::Invalid(format!("{n} GPUs on one node; at most {} are supported", crate::MAX_GPUS)));
    }
    let mut matrix: Vec<Option<Link>> = vec![None; n * n];
    for pair in &doc.links {
        let (a, b) = (pair.a as usize, pair.b as usize);
        if a >= b || b >= n {
            return Err(Error::Invalid(format!(
                "annotation link {}–{} is not a pair a < b of the {n} GPUs",
                pair.a, pair.b
            )));
        }
        let link = match Link::from_code(&pair.link) {
            Some(Link::NvLink { links, .. }) => Link::NvLink { links, switched: pair.nvswitch },
            Some(other) if !pair.nvswitch => other,
            _ => {
                return Err(Error::Invalid(format!(
                    "annotation link {a}–{b}: `{}`{} is not a link class",
                    pair.link,
                    if pair.nvswitch { " through NVSwitch" } else { "" }
                )));
            }
        };
        if matrix[a * n + b].replace(link).is_some() {
            return Err(Error::Invalid(format!("annotation lists link {a}–{b} twice")));
        }
        matrix[b * n + a] = Some(link);
    }
    for a in 0..n {
        for b in a + 1..n {
            if matrix[a * n + b].is_none() {
                return Err(Error::Invalid(format!("annotation lacks the link {a}–{b}")));
            }
        }
    }
    let mut topology = NodeTopology::new(doc.gpus, |a, b| matrix[a * n + b].unwrap_or(Link::Sys), doc.nics)?;
    // The annotation says whether the links are switched; `new` would guess it for a full mesh of
    // eight (right for NVIDIA, wrong for AMD's point-to-point xGMI mesh).
    topology.set_switched(doc.links.iter().any(|p| p.nvswitch));
    if doc.numa_inferred {
        topology.set_numa_inferred();
    }
    if let Some(name) = &doc.peer_links {
        let links = PeerLinks::from_name(name).ok_or_else(|| {
            Error::Invalid(format!(
                "annotation {TOPOLOGY_ANNOTATION}: peer links `{name}` are none of nvlink, xgmi, neuronlink, hccs"
            ))
        })?;
        topology.set_peer_links(links);
    }
    Ok(topology)
}

/// Capability labels: interconnect, NUMA layout, and whether `k` GPUs fit in one NUMA node for
/// `k` = 2, 4, 8, 16 up to the GPU count. They describe the hardware, not what is free (free
/// capacity changes every second and lives in the scheduler's cluster state).
pub fn labels(topology: &NodeTopology) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |key: &str, value: String| {
        labels.insert(format!("{LABEL_PREFIX}{key}"), value);
    };
    let n = topology.len();
    put("gpu-count", n.to_string());
    put("gpu-interconnect", topology.interconnect().to_string());
    let max_bond = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .filter_map(|(a, b)| match topology.link(a, b) {
            Some(Link::NvLink { links, .. }) => Some(links),
            _ => None,
        })
        .max();
    if let Some(bond) = max_bond.filter(|_| topology.peer_links() == PeerLinks::NvLink) {
        put("nvlink-bond", bond.to_string());
    }
    let numa = topology.numa_nodes();
    if !numa.is_empty() && topology.gpus().iter().all(|g| g.numa.is_some()) {
        let per: Vec<usize> =
            numa.iter().map(|id| topology.gpus().iter().filter(|g| g.numa == Some(*id)).count()).collect();
        put("numa-nodes", numa.len().to_string());
        // The smallest group: what a single-NUMA job can count on anywhere on this node.
        put("gpus-per-numa", per.iter().min().copied().unwrap_or(0).to_string());
        let largest = per.iter().max().copied().unwrap_or(0);
        for k in [2usize, 4, 8, 16].into_iter().filter(|&k| k <= n) {
            put(&format!("single-numa-{k}gpu"), (largest >= k).to_string());
        }
    }
    labels
}
