//! What NVML reports about a node, as plain data: serialisable (the agent publishes it and commits
//! it as a fixture), and convertible to a [`NodeTopology`] without a driver, so the conversion is
//! tested on recorded data.

use serde::{Deserialize, Serialize};
use wasmsched_topology::{CpuSet, Gpu, Link, NodeTopology};

use crate::Error;

/// NVML's `nvmlGpuTopologyLevel_t`: the PCIe path between two GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathLevel {
    /// Same board (e.g. K80): reported as `PIX`, as nvidia-smi does.
    Internal,
    /// One PCIe switch (`PIX`).
    Single,
    /// Several switches, no host bridge (`PXB`).
    Multiple,
    /// A host bridge (`PHB`).
    HostBridge,
    /// Same NUMA node, several host bridges (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    System,
}

impl PathLevel {
    /// The matrix class.
    pub fn link(self) -> Link {
        match self {
            PathLevel::Internal | PathLevel::Single => Link::Pix,
            PathLevel::Multiple => Link::Pxb,
            PathLevel::HostBridge => Link::Phb,
            PathLevel::Node => Link::Node,
            PathLevel::System => Link::Sys,
        }
    }
}

/// One active NVLink of a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkPort {
    /// Link number on the device.
    pub link: u32,
    /// PCI bus id of the device at the other end (a GPU, or an NVSwitch).
    pub remote_pci: String,
}

/// MIG state of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mig {
    /// MIG is on now.
    pub enabled: bool,
    /// MIG will be on after the next GPU reset.
    pub pending: bool,
    /// The MIG devices (instances) that exist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
}

/// One MIG device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// `MIG-…` UUID.
    pub uuid: String,
    /// Its memory.
    pub memory_bytes: u64,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Model name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total memory.
    pub memory_bytes: u64,
    /// PCI bus id, `DDDD:BB:DD.F` (lower case).
    pub pci: String,
    /// NUMA node, from sysfs (`numa_node`; -1 there means none).
    pub numa: Option<u32>,
    /// CPUs close to the device.
    pub cpus: CpuSet,
    /// MIG state; None where the device does not support MIG.
    pub mig: Option<Mig>,
    /// Active NVLinks.
    pub nvlinks: Vec<NvLinkPort>,
}

/// Values that change while the node runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// NVML index.
    pub index: u32,
    /// GPU utilisation, percent.
    pub gpu_util_percent: Option<u32>,
    /// Memory-controller utilisation, percent.
    pub memory_util_percent: Option<u32>,
    /// Core temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, milliwatts.
    pub power_mw: Option<u32>,
    /// Memory in use.
    pub memory_used_bytes: Option<u64>,
}

/// A node's GPUs as NVML reports them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Driver version, e.g. `550.54.15`.
    pub driver: String,
    /// CUDA driver API version, e.g. `12040` for 12.4.
    pub cuda: Option<i32>,
    /// Devices by index.
    pub devices: Vec<Device>,
    /// PCIe path of every pair `(a, b)` with `a < b`, row-major.
    pub paths: Vec<PathLevel>,
}

impl Inventory {
    /// The PCIe path between two devices.
    pub fn path(&self, a: usize, b: usize) -> Option<PathLevel> {
        let (a, b) = (a.min(b), a.max(b));
        let n = self.devices.len();
        if a == b || b >= n {
            return None;
        }
        // Index of (a, b) in the upper triangle, row by row.
        let index = a * n - a * (a + 1) / 2 + (b - a - 1);
        self.paths.get(index).copied()
    }

    /// The topology: NVLink where devices have active links to each other (bond = number of links),
    /// NVSwitch where a device's links go to non-GPU devices (every pair of such devices is
    /// connected at the smaller of their link counts, as nvidia-smi reports), PCIe path otherwise.
    pub fn topology(&self) -> Result<NodeTopology, Error> {
        let n = self.devices.len();
        if self.paths.len() != n * n.saturating_sub(1) / 2 {
            return Err(Error::Inventory(format!(
                "{} paths for {n} devices, expected {}",
                self.paths.len(),
                n * n.saturating_sub(1) / 2
            )));
        }
        let bus = |pci: &str| pci.to_ascii_lowercase();
        let gpu_at = |pci: &str| self.devices.iter().position(|d| bus(&d.pci) == bus(pci));
        // direct[a][b] = links from a to GPU b; switched[a] = links from a to non-GPU devices.
        let mut direct = vec![0u32; n * n];
        let mut switched = vec![0u32; n];
        for (a, device) in self.devices.iter().enumerate() {
            for port in &device.nvlinks {
                match gpu_at(&port.remote_pci) {
                    Some(b) if b != a => direct[a * n + b] += 1,
                    Some(_) => {
                        return Err(Error::Inventory(format!("GPU {a} has an NVLink to itself")));
                    }
                    None => switched[a] += 1,
                }
            }
        }
        let gpus = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| Gpu {
                index: i as u32,
                numa: d.numa,
                cpus: d.cpus.clone(),
                pci: Some(d.pci.clone()),
                uuid: Some(d.uuid.clone()),
                model: Some(d.name.clone()),
            })
            .collect();
        let bond = |count: u32| u8::try_from(count).unwrap_or(u8::MAX);
        NodeTopology::new(
            gpus,
            |a, b| {
                let through_switch = switched[a].min(switched[b]);
                let links = direct[a * n + b].max(direct[b * n + a]);
                if through_switch > 0 {
                    Link::NvLink { links: bond(through_switch + links), switched: true }
                } else if links > 0 {
                    Link::NvLink { links: bond(links), switched: false }
                } else {
                    self.path(a, b).map_or(Link::Sys, PathLevel::link)
                }
            },
            Vec::new(),
        )
        .map_err(|e| Error::Inventory(e.to_string()))
    }
}
