//! The topology of one node: its GPUs, their NUMA nodes and CPUs, and the link between every pair.

use serde::{Deserialize, Serialize};

use crate::{CpuSet, Error, Link, LinkCosts};

/// The most GPUs one node may have: GPU sets are `u64` bit masks.
pub const MAX_GPUS: usize = 64;

/// One GPU as the topology sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// The device index (`nvidia-smi` / NVML order).
    pub index: u32,
    /// NUMA node the device is attached to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// CPUs close to the device.
    #[serde(default, skip_serializing_if = "CpuSet::is_empty")]
    pub cpus: CpuSet,
    /// PCI bus id, `DDDD:BB:DD.F`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// Device UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A network interface and the PCIe path from each GPU to it (GPUDirect RDMA locality).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// Device name, e.g. `mlx5_0`.
    pub name: String,
    /// Path from GPU `i` to this NIC, indexed like [`NodeTopology::gpus`].
    pub gpu_links: Vec<Link>,
}

/// A node's GPUs and the link between every pair. Immutable once built; validated on construction.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTopology {
    gpus: Vec<Gpu>,
    /// Row-major `n × n`; the diagonal holds a placeholder that is never read.
    links: Vec<Link>,
    nics: Vec<Nic>,
    numa_inferred: bool,
    /// Whose direct device links the [`Link::NvLink`] pairs are.
    peer_links: PeerLinks,
}

/// Whose direct accelerator-to-accelerator links a topology's [`Link::NvLink`] pairs are. They
/// cost the same to device selection (one bond each for the other vendors'); the name is what
/// labels and events say, so an AMD node never reads as NVLink or an xGMI mesh as an NVSwitch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerLinks {
    /// NVIDIA's NVLink (and NVSwitch).
    #[default]
    NvLink,
    /// AMD's xGMI (Infinity Fabric).
    Xgmi,
    /// AWS's NeuronLink between Trainium and Inferentia devices.
    NeuronLink,
    /// Huawei's HCCS between Ascend NPUs.
    Hccs,
}

impl PeerLinks {
    /// The name in labels (`gpu-interconnect`) and the topology annotation.
    pub fn name(self) -> &'static str {
        match self {
            PeerLinks::NvLink => "nvlink",
            PeerLinks::Xgmi => "xgmi",
            PeerLinks::NeuronLink => "neuronlink",
            PeerLinks::Hccs => "hccs",
        }
    }

    /// The links named `name`.
    pub fn from_name(name: &str) -> Option<PeerLinks> {
        [PeerLinks::NvLink, PeerLinks::Xgmi, PeerLinks::NeuronLink, PeerLinks::Hccs]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

impl NodeTopology {
    /// Builds a topology from its GPUs (indexed `0..n` in order) and a link for every ordered pair.
    /// Fails if indexes are not `0..n`, a link is asymmetric, or there are more than [`MAX_GPUS`].
    pub fn new(
        gpus: Vec<Gpu>,
        mut link: impl FnMut(usize, usize) -> Link,
        nics: Vec<Nic>,
    ) -> Result<NodeTopology, Error> {
        let n = gpus.len();
        if n > MAX_GPUS {
            return Err(Error::Invalid(format!("{n} GPUs on one node; at most {MAX_GPUS} are supported")));
        }
        if let Some((i, g)) = gpus.iter().enumerate().find(|(i, g)| g.index as usize != *i) {
            return Err(Error::Invalid(format!(
                "GPU at position {i} has index {}; indexes must be 0..{n} in order",
                g.index
            )));
        }
        let mut links = vec![Link::Sys; n * n];
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    links[i * n + j] = link(i, j);
                }
            }
        }
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = (links[i * n + j], links[j * n + i]);
                if a != b {
                    return Err(Error::Invalid(format!(
                        "asymmetric topology: GPU{i}→GPU{j} is {} but GPU{j}→GPU{i} is {}",
                        a.code(),
                        b.code()
                    )));
                }
            }
        }
        if let Some(nic) = nics.iter().find(|nic| nic.gpu_links.len() != n) {
            return Err(Error::Invalid(format!(
                "NIC {} lists {} GPU paths for {n} GPUs",
                nic.name,
                nic.gpu_links.len()
            )));
        }
        let mut topology = NodeTopology { gpus, links, nics, numa_inferred: false, peer_links: PeerLinks::NvLink };
        topology.mark_nvswitch();
        Ok(topology)
    }

    /// Records that NUMA ids were inferred from CPU affinity rather than reported.
    pub(crate) fn set_numa_inferred(&mut self) {
        self.numa_inferred = true;
    }

    /// Records whose links the direct device links are.
    pub(crate) fn set_peer_links(&mut self, links: PeerLinks) {
        self.peer_links = links;
    }

    /// Whose links the direct device links are.
    pub fn peer_links(&self) -> PeerLinks {
        self.peer_links
    }

    /// NVSwitch systems print the same `NV#` for every pair; a point-to-point NVLink design cannot
    /// give 8 or more GPUs a full mesh at equal width, so such a mesh is taken as switched. (NVML
    /// discovery sets this from the remote device type instead.)
    fn mark_nvswitch(&mut self) {
        let n = self.gpus.len();
        if n < 8 {
            return;
        }
        let first = self.links[1];
        let uniform = first.is_nvlink() && (0..n).all(|i| (0..n).all(|j| i == j || self.links[i * n + j] == first));
        if uniform {
            self.set_switched(true);
        }
    }

    /// Marks every NVLink as going through (or not through) an NVSwitch.
    pub fn set_switched(&mut self, on: bool) {
        for link in &mut self.links {
            if let Link::NvLink { switched, .. } = link {
                *switched = on;
            }
        }
    }

    /// The GPUs, by index.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// True for a node without GPUs.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The link between two distinct GPUs, None for `a == b` or an index out of range.
    pub fn link(&self, a: usize, b: usize) -> Option<Link> {
        let n = self.gpus.len();
        (a != b && a < n && b < n).then(|| self.links[a * n + b])
    }

    /// The NICs and their paths to each GPU.
    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    /// True when NUMA ids were inferred from CPU affinity (old nvidia-smi without a NUMA column).
    pub fn numa_inferred(&self) -> bool {
        self.numa_inferred
    }

    /// The NUMA nodes that have GPUs, ascending.
    pub fn numa_nodes(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.gpus.iter().filter_map(|g| g.numa).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The fabric, for labels: `nvswitch`, `nvlink` (some NVLink pairs), `xgmi`, `neuronlink` or
    /// `hccs` (some direct pairs of those), or `pcie`.
    pub fn interconnect(&self) -> &'static str {
        let mut any_nvlink = false;
        for link in &self.links {
            if let Link::NvLink { switched, .. } = link {
                if *switched {
                    return "nvswitch";
                }
                any_nvlink = true;
            }
        }
        if any_nvlink { self.peer_links.name() } else { "pcie" }
    }

    /// The matrix in `nvidia-smi topo -m` style, for humans.
    pub fn render(&self, costs: &LinkCosts) -> String {
        let n = self.len();
        let mut out = String::from("      ");
        for j in 0..n {
            out.push_str(&format!("{:>6}", format!("GPU{j}")));
        }
        out.push_str("  NUMA  CPUs\n");
        for i in 0..n {
            out.push_str(&format!("{:<6}", format!("GPU{i}")));
            for j in 0..n {
                let cell = self.link(i, j).map_or("X".to_string(), Link::code);
                out.push_str(&format!("{cell:>6}"));
            }
            let numa = self.gpus[i].numa.map_or("-".to_string(), |id| id.to_string());
            out.push_str(&format!("  {numa:>4}  {}\n", self.gpus[i].cpus));
        }
        out.push_str(&format!(
            "interconnect: {}{}\n",
            self.interconnect(),
            if self.numa_inferred { " (NUMA ids inferred from CPU affinity)" } else { "" }
        ));
        let mut classes: Vec<Link> = self.links_present();
        classes.sort_by(|a, b| costs.cost(*b).bandwidth_gbps.total_cmp(&costs.cost(*a).bandwidth_gbps));
        for class in classes {
            let cost = costs.cost(class);
            out.push_str(&format!(
                "  {:<18} {:>6.1} GB/s {:>5.1} µs\n",
                class.to_string(),
                cost.bandwidth_gbps,
                cost.latency_us
            ));
        }
        out
    }

    /// The distinct link classes between GPUs of this node.
    pub fn links_present(&self) -> Vec<Link> {
        let n = self.len();
        let mut seen = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                let link = self.links[i * n + j];
                if !seen.contains(&link) {
                    seen.push(link);
                }
            }
        }
        seen
    }
}
