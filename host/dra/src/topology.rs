//! DRA devices in the topology model: a node's devices, with the attributes drivers publish about
//! where they sit, become a [`NodeTopology`], so that a request for several GPUs gets the set the
//! exact GPU-set selection ([`wasmsched_topology::select`]) ranks best — the fastest slowest link,
//! then the shortest paths, the narrowest NUMA span and the best fit — instead of the first free
//! devices in slice order.
//!
//! What is read (names without a domain are the driver's own, as slices give them):
//! - the order: `index` (NVIDIA's driver), else the order of publication;
//! - NVLink: devices sharing a `cliqueID`/`nvlinkClique` attribute, or every device of a node that
//!   carries NVIDIA's `nvidia.com/gpu.clique` label, are NVLink peers (through NVSwitch);
//! - PCIe: devices with the same `resource.kubernetes.io/pcieRoot` (the standard attribute) are
//!   under one root complex (`PHB`);
//! - NUMA: `resource.kubernetes.io/numaNode` or the driver's `numaNode`/`numa` (an integer); two
//!   devices on one NUMA node without a shared root are `NODE`, on different ones `SYS`.
//!
//! A node whose devices publish none of these has no topology: the allocator keeps slice order,
//! as kube-scheduler does.

use wasmsched_topology::{Gpu, Link, LinkCosts, MAX_GPUS, NodeTopology, NumaPolicy, Prepared};

use crate::inventory::{Attribute, Device};

/// The node label NVIDIA's GPU feature discovery sets on nodes of one multi-node NVLink domain.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// Where one device sits, as far as its attributes say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// NVLink domain (clique) of the device.
    pub clique: Option<String>,
    /// PCIe root complex.
    pub pcie_root: Option<String>,
    /// NUMA node.
    pub numa: Option<u32>,
    /// Index on its node, for the order.
    pub index: Option<i64>,
}

impl Placement {
    /// What `device`'s attributes say; `node_clique` is the node's clique label, if any.
    pub fn of(device: &Device, node_clique: Option<&str>) -> Placement {
        let driver = &device.id.driver;
        let own = |names: &[&str]| names.iter().find_map(|n| device.attributes.get(&format!("{driver}/{n}")));
        let text = |a: Option<&Attribute>| match a {
            Some(Attribute::String(s)) => Some(s.clone()),
            Some(Attribute::Int(i)) => Some(i.to_string()),
            _ => None,
        };
        let int = |a: Option<&Attribute>| match a {
            Some(Attribute::Int(i)) => Some(*i),
            _ => None,
        };
        let numa = int(device.attributes.get("resource.kubernetes.io/numaNode").or_else(|| own(&["numaNode", "numa"])))
            .and_then(|n| u32::try_from(n).ok());
        Placement {
            clique: text(own(&["cliqueID", "cliqueId", "nvlinkClique"])).or_else(|| node_clique.map(str::to_string)),
            pcie_root: text(device.attributes.get(PCIE_ROOT)),
            numa,
            index: int(own(&["index"])),
        }
    }

    /// Whether it says anything about where the device sits.
    fn known(&self) -> bool {
        self.clique.is_some() || self.pcie_root.is_some() || self.numa.is_some()
    }

    /// The best path between two devices that their attributes prove.
    fn link(&self, other: &Placement) -> Link {
        let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
        if same(&self.clique, &other.clique) {
            // A clique is a fabric: every member reaches every other at full width.
            Link::NvLink { links: 18, switched: true }
        } else if same(&self.pcie_root, &other.pcie_root) {
            Link::Phb
        } else if self.numa.is_some() && self.numa == other.numa {
            Link::Node
        } else {
            Link::Sys
        }
    }
}

/// One node's devices as a topology: positions in it are the devices' order on the node.
#[derive(Debug)]
pub struct DeviceTopology {
    /// The inventory index of the device at each position.
    members: Vec<usize>,
    /// Position of each member, by inventory index.
    position: ahash::AHashMap<usize, u32>,
    prepared: Prepared,
}

impl DeviceTopology {
    /// The topology of `devices` (inventory index, device) local to one node, or `None` when their
    /// attributes say nothing of where they sit, or there are more than [`MAX_GPUS`].
    pub fn new<'d>(devices: impl IntoIterator<Item = (usize, &'d Device)>, node_clique: Option<&str>) -> Option<Self> {
        let mut placed: Vec<(usize, Placement)> =
            devices.into_iter().map(|(i, d)| (i, Placement::of(d, node_clique))).collect();
        if placed.len() < 2 || placed.len() > MAX_GPUS || !placed.iter().any(|(_, p)| p.known()) {
            return None;
        }
        // By index where every device has one, else as published.
        if placed.iter().all(|(_, p)| p.index.is_some()) {
            placed.sort_by_key(|(i, p)| (p.index, *i));
        }
        let gpus =
            (0..placed.len()).map(|at| Gpu { index: at as u32, numa: placed[at].1.numa, ..Gpu::default() }).collect();
        let topology = NodeTopology::new(gpus, |a, b| placed[a].1.link(&placed[b].1), Vec::new()).ok()?;
        let members: Vec<usize> = placed.iter().map(|(i, _)| *i).collect();
        let position = members.iter().enumerate().map(|(at, &i)| (i, at as u32)).collect();
        Some(DeviceTopology { members, position, prepared: Prepared::new(&topology, &LinkCosts::default()) })
    }

    /// `candidates` (inventory indexes, in the allocator's order) with the best `count` of them
    /// for topology moved to the front, in position order; the rest keep their order. Unchanged
    /// when a candidate is not part of this topology or no set can be chosen.
    pub fn order(&self, candidates: &mut Vec<usize>, count: usize) {
        if count == 0 || count >= candidates.len() {
            return;
        }
        let mut free = 0u64;
        for i in candidates.iter() {
            match self.position.get(i) {
                Some(&at) => free |= 1 << at,
                None => return,
            }
        }
        let Ok(choice) = self.prepared.select(free, count as u32, NumaPolicy::BestEffort) else { return };
        let best: Vec<usize> = choice.gpus.iter().map(|&at| self.members[at as usize]).collect();
        candidates.retain(|i| !best.contains(i));
        candidates.splice(0..0, best);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::inventory::{DeviceId, Reach};

    fn device(name: &str, attributes: &[(&str, Attribute)]) -> Device {
        Device {
            id: DeviceId { driver: "gpu.nvidia.com".into(), pool: "n".into(), device: name.into() },
            attributes: attributes.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            capacity: BTreeMap::new(),
            domains: crate::inventory::domains_of(attributes.iter().map(|(k, _)| *k)),
            reach: Reach::Node("n".into()),
            allow_multiple_allocations: false,
            taints: Vec::new(),
        }
    }

    fn root(r: &str, numa: i64) -> Vec<(&'static str, Attribute)> {
        vec![(PCIE_ROOT, Attribute::String(r.into())), ("gpu.nvidia.com/numaNode", Attribute::Int(numa))]
    }

    #[test]
    fn two_gpus_come_from_one_pcie_root_and_one_gpu_from_the_fuller_root() {
        // Roots: a = {0, 1} (NUMA 0), b = {2, 3} (NUMA 0), c = {4, 5} (NUMA 1).
        let devices: Vec<Device> = ["a", "a", "b", "b", "c", "c"]
            .iter()
            .enumerate()
            .map(|(i, r)| device(&format!("gpu-{i}"), &root(r, i64::from(i >= 4))))
            .collect();
        let topology = DeviceTopology::new(devices.iter().enumerate(), None).expect("attributes give a topology");
        // 1 (root a) and 2 (root b) and 4, 5 (root c) are free: two GPUs must be root c's.
        let mut free = vec![1, 2, 4, 5];
        topology.order(&mut free, 2);
        assert_eq!(&free[..2], &[4, 5]);
        // Of 0, 1 (root a whole) and 2 (root b alone), one GPU takes the lone one and keeps a whole.
        let mut free = vec![0, 1, 2];
        topology.order(&mut free, 1);
        assert_eq!(free[0], 2);
    }

    #[test]
    fn a_clique_is_nvlink_and_devices_without_placement_have_no_topology() {
        let plain: Vec<Device> = (0..4).map(|i| device(&format!("gpu-{i}"), &[])).collect();
        assert!(DeviceTopology::new(plain.iter().enumerate(), None).is_none());
        let a = Placement::of(&plain[0], Some("c1"));
        assert!(a.link(&Placement::of(&plain[1], Some("c1"))).is_nvlink());
        assert_eq!(Placement::of(&plain[0], None).link(&Placement::of(&plain[1], None)), Link::Sys);
    }
}
