//! Link classes between two GPUs of one node, and what each costs.
//!
//! The classes are those `nvidia-smi topo -m` prints (and NVML's `nvmlGpuTopologyLevel_t`
//! reports), ordered from best to worst. NVLink keeps its bond count: `NV2` is twice `NV1`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How two GPUs of one node reach each other, best path only.
///
/// Serialised as its `nvidia-smi` code (`NV12`, `PIX`); the NVSwitch flag is carried separately
/// where it matters (the node annotation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    /// A bonded set of `links` NVLinks (`NV#`), direct or through NVSwitch.
    NvLink {
        /// Number of bonded links (the `#` of `NV#`).
        links: u8,
        /// The links go through an NVSwitch fabric (every GPU reaches every other at full width).
        switched: bool,
    },
    /// At most one PCIe bridge (`PIX`): both GPUs under one PCIe switch.
    Pix,
    /// Several PCIe bridges, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge, typically the CPU (`PHB`).
    Phb,
    /// Across PCIe host bridges within one NUMA node (`NODE`).
    Node,
    /// Across the SMP interconnect between NUMA nodes, QPI/UPI (`SYS`, printed `SOC` by old drivers).
    Sys,
}

impl Link {
    /// The class as `nvidia-smi topo -m` prints it.
    pub fn code(self) -> String {
        match self {
            Link::NvLink { links, .. } => format!("NV{links}"),
            Link::Pix => "PIX".into(),
            Link::Pxb => "PXB".into(),
            Link::Phb => "PHB".into(),
            Link::Node => "NODE".into(),
            Link::Sys => "SYS".into(),
        }
    }

    /// Parses one matrix cell (`NV12`, `PIX`, `SOC`, …). `X` (self) is not a link and is refused.
    pub fn from_code(cell: &str) -> Option<Link> {
        let cell = cell.trim();
        if let Some(count) = cell.strip_prefix("NV") {
            let links: u8 = count.parse().ok().filter(|&n| n > 0)?;
            return Some(Link::NvLink { links, switched: false });
        }
        Some(match cell {
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" => Link::Phb,
            "NODE" => Link::Node,
            "SYS" | "SOC" => Link::Sys,
            _ => return None,
        })
    }

    /// True for NVLink and NVSwitch.
    pub fn is_nvlink(self) -> bool {
        matches!(self, Link::NvLink { .. })
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::NvLink { links, switched: true } => write!(f, "NV{links} (NVSwitch)"),
            other => f.write_str(&other.code()),
        }
    }
}

impl Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.code())
    }
}

impl<'de> Deserialize<'de> for Link {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = String::deserialize(deserializer)?;
        Link::from_code(&code).ok_or_else(|| serde::de::Error::custom(format!("`{code}` is not a link class")))
    }
}

/// Bandwidth and latency of one link class.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Achievable bandwidth in GB/s (bytes, not bits).
    pub bandwidth_gbps: f64,
    /// One-way latency in microseconds.
    pub latency_us: f64,
}

/// What each link class costs; configurable, with commonly published defaults
/// (`docs/topology.md` lists them with their sources).
///
/// NVLink bandwidth scales with the bond count: `NV12` at 50 GB/s per link is 600 GB/s
/// (A100), `NV18` is H100's 900 GB/s, `NV1`/`NV2` are DGX-1's 50/100 GB/s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkCosts {
    /// Bandwidth of one NVLink in GB/s (bidirectional, as NVIDIA quotes it).
    pub nvlink_per_link_gbps: f64,
    /// Latency of a direct NVLink hop.
    pub nvlink_latency_us: f64,
    /// Latency through an NVSwitch (one more hop than a direct link).
    pub nvswitch_latency_us: f64,
    /// `PIX`.
    pub pix: Cost,
    /// `PXB`.
    pub pxb: Cost,
    /// `PHB`.
    pub phb: Cost,
    /// `NODE`.
    pub node: Cost,
    /// `SYS`.
    pub sys: Cost,
    /// Between two nodes (an InfiniBand class), used by cluster locality estimates.
    pub network: Cost,
}

impl Default for LinkCosts {
    fn default() -> Self {
        // Common cost tables give one PCIe class (32 GB/s, 5 µs) and SYS (25 GB/s, 10 µs); PXB, PHB and NODE
        // sit between them in the order nvidia-smi's legend defines, so that a longer PCIe path is
        // never preferred over a shorter one.
        LinkCosts {
            nvlink_per_link_gbps: 50.0,
            nvlink_latency_us: 1.0,
            nvswitch_latency_us: 2.0,
            pix: Cost { bandwidth_gbps: 32.0, latency_us: 5.0 },
            pxb: Cost { bandwidth_gbps: 32.0, latency_us: 6.0 },
            phb: Cost { bandwidth_gbps: 30.0, latency_us: 7.0 },
            node: Cost { bandwidth_gbps: 28.0, latency_us: 8.0 },
            sys: Cost { bandwidth_gbps: 25.0, latency_us: 10.0 },
            network: Cost { bandwidth_gbps: 12.5, latency_us: 50.0 },
        }
    }
}

impl LinkCosts {
    /// The cost of one link.
    pub fn cost(&self, link: Link) -> Cost {
        match link {
            Link::NvLink { links, switched } => Cost {
                bandwidth_gbps: self.nvlink_per_link_gbps * f64::from(links),
                latency_us: if switched { self.nvswitch_latency_us } else { self.nvlink_latency_us },
            },
            Link::Pix => self.pix,
            Link::Pxb => self.pxb,
            Link::Phb => self.phb,
            Link::Node => self.node,
            Link::Sys => self.sys,
        }
    }

    /// Latency normalised to a direct NVLink hop (a common distance table: NVLink 1, NVSwitch 2,
    /// PCIe 5, SYS 10, cross-node 50).
    pub fn distance(&self, link: Link) -> f64 {
        self.cost(link).latency_us / self.nvlink_latency_us
    }

    /// Checks that every value is finite and positive.
    pub fn validate(&self) -> Result<(), String> {
        let mut all = vec![
            ("nvlink_per_link_gbps", self.nvlink_per_link_gbps),
            ("nvlink_latency_us", self.nvlink_latency_us),
            ("nvswitch_latency_us", self.nvswitch_latency_us),
        ];
        for (name, cost) in [
            ("pix", self.pix),
            ("pxb", self.pxb),
            ("phb", self.phb),
            ("node", self.node),
            ("sys", self.sys),
            ("network", self.network),
        ] {
            all.push((name, cost.bandwidth_gbps));
            all.push((name, cost.latency_us));
        }
        match all.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            Some((name, v)) => Err(format!("link cost `{name}` must be a positive number, got {v}")),
            None => Ok(()),
        }
    }
}
