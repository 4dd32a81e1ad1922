//! Discovery through NVML (nvml-wrapper). Every call that a device or driver may not support is
//! optional: a missing value is recorded as absent, never a failure of the whole discovery.

use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::error::NvmlError;
use wasmsched_topology::CpuSet;

use crate::inventory::{Device, Inventory, Mig, NvLinkPort, PathLevel, Telemetry};
use crate::{Error, mig};

/// An open NVML session.
pub struct Session {
    nvml: Nvml,
}

/// NVLink ports a device may have (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

impl Session {
    /// Loads `libnvidia-ml.so.1` and initialises NVML. Without a driver this is
    /// [`Error::Unavailable`], with the reason.
    pub fn open() -> Result<Session, Error> {
        Nvml::init().map(|nvml| Session { nvml }).map_err(unavailable)
    }

    /// Like [`Session::open`] with an explicit library path (tests, unusual installs).
    pub fn open_library(path: &Path) -> Result<Session, Error> {
        Nvml::builder().lib_path(path.as_os_str()).init().map(|nvml| Session { nvml }).map_err(unavailable)
    }

    /// The underlying handle, for the health watcher.
    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Everything the scheduler needs about the node's GPUs.
    pub fn inventory(&self) -> Result<Inventory, Error> {
        let count = self.nvml.device_count().map_err(|e| call("device count", e))?;
        let mut devices = Vec::with_capacity(count as usize);
        let mut handles = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self.nvml.device_by_index(index).map_err(|e| call(&format!("device {index}"), e))?;
            let pci = device.pci_info().map_err(|e| call(&format!("PCI info of device {index}"), e))?;
            let pci = normalise_bus_id(&pci.bus_id);
            let nvlinks = (0..MAX_NVLINKS)
                .filter_map(|link| {
                    let port = device.link_wrapper_for(link);
                    match port.is_active() {
                        Ok(true) => port
                            .remote_pci_info()
                            .ok()
                            .map(|remote| NvLinkPort { link, remote_pci: normalise_bus_id(&remote.bus_id) }),
                        _ => None,
                    }
                })
                .collect();
            let mig = device.mig_mode().ok().map(|mode| Mig {
                enabled: mode.current == 1,
                pending: mode.pending == 1,
                instances: if mode.current == 1 { mig::instances(&self.nvml, &device) } else { Vec::new() },
            });
            devices.push(Device {
                index,
                uuid: device.uuid().map_err(|e| call(&format!("UUID of device {index}"), e))?,
                name: device.name().unwrap_or_default(),
                memory_bytes: device.memory_info().map(|m| m.total).unwrap_or(0),
                numa: numa_node(&device).or_else(|| sysfs_numa(&pci)),
                cpus: cpu_affinity(&device).or_else(|| sysfs_cpus(&pci)).unwrap_or_default(),
                pci,
                mig,
                nvlinks,
            });
            handles.push(device);
        }
        let mut paths = Vec::with_capacity(handles.len() * handles.len().saturating_sub(1) / 2);
        for a in 0..handles.len() {
            for b in a + 1..handles.len() {
                let other = self.nvml.device_by_index(b as u32).map_err(|e| call("device", e))?;
                let level = handles[a]
                    .topology_common_ancestor(other)
                    .map_err(|e| call(&format!("path between devices {a} and {b}"), e))?;
                paths.push(match level {
                    TopologyLevel::Internal => PathLevel::Internal,
                    TopologyLevel::Single => PathLevel::Single,
                    TopologyLevel::Multiple => PathLevel::Multiple,
                    TopologyLevel::HostBridge => PathLevel::HostBridge,
                    TopologyLevel::Node => PathLevel::Node,
                    TopologyLevel::System => PathLevel::System,
                });
            }
        }
        Ok(Inventory {
            driver: self.nvml.sys_driver_version().unwrap_or_default(),
            cuda: self.nvml.sys_cuda_driver_version().ok(),
            devices,
            paths,
        })
    }

    /// Current utilisation, temperature and power of every device.
    pub fn telemetry(&self) -> Result<Vec<Telemetry>, Error> {
        let count = self.nvml.device_count().map_err(|e| call("device count", e))?;
        (0..count)
            .map(|index| {
                let d = self.nvml.device_by_index(index).map_err(|e| call(&format!("device {index}"), e))?;
                let util = d.utilization_rates().ok();
                Ok(Telemetry {
                    index,
                    gpu_util_percent: util.as_ref().map(|u| u.gpu),
                    memory_util_percent: util.as_ref().map(|u| u.memory),
                    temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
                    power_mw: d.power_usage().ok(),
                    memory_used_bytes: d.memory_info().ok().map(|m| m.used),
                })
            })
            .collect()
    }
}

fn unavailable(e: NvmlError) -> Error {
    let reason = match &e {
        NvmlError::LibloadingError(inner) => {
            format!(
                "the NVML library (libnvidia-ml.so.1) could not be loaded: {inner}; is the NVIDIA driver installed?"
            )
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    };
    Error::Unavailable(reason)
}

fn call(what: &str, e: NvmlError) -> Error {
    Error::Call { what: what.to_string(), reason: e.to_string() }
}

/// NVML prints `00000000:3B:00.0`; sysfs and nvidia-smi use `0000:3b:00.0`.
pub fn normalise_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => format!("{}:{rest}", &domain[domain.len() - 4..]),
        _ => lower,
    }
}

/// The NUMA node NVML names for the device's memory, as `nvidia-smi topo -m` prints it under
/// "NUMA Affinity". It is known where sysfs says -1: a virtual machine's passed-through GPU has no
/// proximity in sysfs, yet NVML and nvidia-smi place it on the guest's one node. None when NVML
/// names several nodes (a GPU equidistant to two sockets) or none.
fn numa_node(device: &nvml_wrapper::Device<'_>) -> Option<u32> {
    const WORDS: usize = 16; // 1,024 NUMA nodes
    let words = device.memory_affinity(WORDS, nvml_wrapper_sys::bindings::NVML_AFFINITY_SCOPE_NODE).ok()?;
    single_bit(&words)
}

/// The position of the one set bit of a little-endian word mask, None for zero or several bits.
fn single_bit(words: &[std::ffi::c_ulong]) -> Option<u32> {
    let bits = std::ffi::c_ulong::BITS;
    let mut found = None;
    for (w, &word) in words.iter().enumerate() {
        match (word.count_ones(), found) {
            (0, _) => {}
            (1, None) => found = Some(w as u32 * bits + word.trailing_zeros()),
            _ => return None,
        }
    }
    found
}

fn sysfs_numa(pci: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{pci}/numa_node")).ok()?;
    text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

fn sysfs_cpus(pci: &str) -> Option<CpuSet> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{pci}/local_cpulist")).ok()?;
    CpuSet::parse(&text).ok()
}

/// NVML's ideal CPU mask, as a CPU list.
fn cpu_affinity(device: &nvml_wrapper::Device<'_>) -> Option<CpuSet> {
    const WORDS: usize = 64; // 4,096 CPUs
    let words = device.cpu_affinity(WORDS).ok()?;
    let bits = std::mem::size_of::<std::ffi::c_ulong>() * 8;
    // `c_ulong` is 64 bits on Linux, 32 elsewhere: widen portably.
    #[allow(clippy::useless_conversion)]
    let set: CpuSet = words
        .iter()
        .enumerate()
        .flat_map(|(w, &word)| {
            (0..bits).filter(move |b| u64::from(word) >> b & 1 == 1).map(move |b| (w * bits + b) as u32)
        })
        .collect();
    (!set.is_empty()).then_some(set)
}

#[cfg(test)]
mod tests {
    use super::single_bit;

    #[test]
    fn a_numa_mask_names_a_node_only_when_it_has_one_bit() {
        assert_eq!(single_bit(&[0b1, 0]), Some(0));
        assert_eq!(single_bit(&[0, 0b100]), Some(std::ffi::c_ulong::BITS + 2));
        assert_eq!(single_bit(&[0b11]), None, "equidistant to two nodes");
        assert_eq!(single_bit(&[0b1, 0b1]), None);
        assert_eq!(single_bit(&[0, 0]), None);
    }
}
