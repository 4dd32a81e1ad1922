//! Accelerator kinds on Kubernetes: which device-plugin resources are accelerators, of which kind,
//! and what their node labels say about them (product, memory) — a table, not a constant, so an
//! `amd.com/gpu` or `huawei.com/Ascend910` pod is placed on devices, with their model and topology,
//! instead of counted as an opaque extended resource.
//!
//! The table is data, like the owner-kind table: the built-in entries (`accelerator_kinds.yaml`:
//! NVIDIA, AMD, Intel Gaudi, Huawei Ascend, AWS Neuron) can be extended or replaced by name. NVIDIA
//! is the default kind: its resource is counted in `gpu-milli` as before; every other kind's
//! resource stays an extended resource of its own name as well (per-kind quotas, and filters
//! that know nothing of kinds, read it), and its devices carry the kind
//! ([`wasmsched_api::accelerators`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use wasmsched_api::accelerators::{Kind, NVIDIA};
use wasmsched_api::{GPU_MILLI, GpuDevice};
use wasmsched_topology::{Gpu, Link, NodeTopology};

/// The built-in table.
const BUILTIN: &str = include_str!("accelerator_kinds.yaml");

/// One kind of accelerator and how to read it off a node.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcceleratorKind {
    /// Unique name (`nvidia`, `amd`, …): the kind devices and requests carry, and the name
    /// metrics, events and the dashboard show.
    pub name: String,
    /// The extended resources its device plugin advertises; several name the same devices
    /// (a node's count is the largest of them).
    pub resources: Vec<String>,
    /// Node labels giving the product (model), first present wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub product_labels: Vec<String>,
    /// Node labels giving each device's memory, first present wins: a plain number is MiB
    /// (NVIDIA's `16384`), a number with a suffix a quantity (`192G` is GiB, `80Gi`, `512M`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_labels: Vec<String>,
    /// How the devices' topology is learned.
    #[serde(default, skip_serializing_if = "TopologySource::is_none")]
    pub topology: TopologySource,
    /// With `topology: fixed`: the layouts by product, the first rule whose `product` the node's
    /// product contains (case-insensitively; no `product`: any) applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layouts: Vec<FixedLayout>,
    /// Devices may be shared (milli-GPU requests): only where a device plugin serves shares.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shares: bool,
    /// Leaves a built-in kind out (its resource is an opaque extended resource again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

/// Where a kind's topology comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TopologySource {
    /// Unknown: devices are told apart by count only.
    #[default]
    None,
    /// The node agent's topology annotation (read from the vendor's tool on the node).
    Agent,
    /// A layout fixed by the product (the kind's `layouts`).
    Fixed,
}

impl TopologySource {
    fn is_none(&self) -> bool {
        *self == TopologySource::None
    }
}

/// A fixed intra-node layout: devices in groups of `group_size` consecutive indexes, every pair
/// in a group directly linked (Ascend's HCCS meshes, Gaudi's all-to-all RoCE), pairs across groups
/// over PCIe through the host.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixedLayout {
    /// Applies when the node's product contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Devices per fully linked group.
    pub group_size: u32,
}

/// Why a table cannot be used: the scheduler refuses to start with one.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Not YAML of the table's shape.
    #[error("accelerator kinds: {0}")]
    Parse(String),
    /// An entry that is incomplete or clashes with another.
    #[error("accelerator kind {kind:?}: {reason}")]
    Entry {
        /// Its name.
        kind: String,
        /// What is wrong.
        reason: String,
    },
}

/// The built-in entries.
pub fn builtin() -> Vec<AcceleratorKind> {
    parse(BUILTIN).expect("the built-in accelerator table parses")
}

/// Entries from YAML (a list of [`AcceleratorKind`]).
pub fn parse(yaml: &str) -> Result<Vec<AcceleratorKind>, TableError> {
    serde_yaml_ng::from_str(yaml).map_err(|e| TableError::Parse(e.to_string()))
}

/// `base` with `extra` applied: an entry of the same name replaces the base's (or, with
/// `disabled`, removes it); others are added.
pub fn merged(mut base: Vec<AcceleratorKind>, extra: Vec<AcceleratorKind>) -> Vec<AcceleratorKind> {
    for e in extra {
        base.retain(|b| b.name != e.name);
        if !e.disabled {
            base.push(e);
        }
    }
    base
}

/// The kinds in use, checked: unique names, each resource in one kind only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceleratorTable {
    kinds: Vec<AcceleratorKind>,
    /// Resource name → index into `kinds`.
    by_resource: BTreeMap<String, usize>,
}

impl Default for AcceleratorTable {
    fn default() -> Self {
        AcceleratorTable::new(builtin()).expect("the built-in accelerator table is valid")
    }
}

/// The accelerators a resource list asks for or offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Per kind (index into the table), the devices: the largest count among its resources.
    pub per_kind: Vec<(usize, u64)>,
}

impl AcceleratorTable {
    /// Checks `kinds` and indexes them.
    pub fn new(kinds: Vec<AcceleratorKind>) -> Result<AcceleratorTable, TableError> {
        let mut by_resource = BTreeMap::new();
        for (i, k) in kinds.iter().enumerate() {
            let bad = |reason: &str| TableError::Entry { kind: k.name.clone(), reason: reason.into() };
            if k.name.is_empty() || k.name.contains(['/', ',', ' ']) {
                return Err(bad("a name is one word without `/`, `,` or spaces"));
            }
            if kinds[..i].iter().any(|o| o.name == k.name) {
                return Err(bad("named twice"));
            }
            if k.resources.is_empty() {
                return Err(bad("no resources"));
            }
            if k.name == NVIDIA && k.resources != [crate::convert::GPU_RESOURCE] {
                return Err(bad("NVIDIA's resource is nvidia.com/gpu alone (it is counted in gpu-milli everywhere)"));
            }
            if k.shares && k.name != NVIDIA {
                return Err(bad("shares are served for NVIDIA GPUs only (the node agent's device plugin)"));
            }
            if k.layouts.iter().any(|r| r.group_size == 0) {
                return Err(bad("a fixed layout's groupSize is at least 1"));
            }
            if (k.topology == TopologySource::Fixed) == k.layouts.is_empty() {
                return Err(bad("layouts go with `topology: fixed`, and only with it"));
            }
            for r in &k.resources {
                if let Some(&other) = by_resource.get(r) {
                    let other: &AcceleratorKind = &kinds[other];
                    return Err(bad(&format!("resource {r} is also {}'s", other.name)));
                }
                by_resource.insert(r.clone(), i);
            }
        }
        if !kinds.iter().any(|k| k.name == NVIDIA) {
            return Err(TableError::Entry {
                kind: NVIDIA.into(),
                reason: "the default kind cannot be left out".into(),
            });
        }
        Ok(AcceleratorTable { kinds, by_resource })
    }

    /// The kinds, in table order.
    pub fn kinds(&self) -> &[AcceleratorKind] {
        &self.kinds
    }

    /// The kind serving `resource`, if it is an accelerator's.
    pub fn kind_of(&self, resource: &str) -> Option<&AcceleratorKind> {
        self.by_resource.get(resource).map(|&i| &self.kinds[i])
    }

    /// Whether `resource` is the default kind's (NVIDIA's), counted in `gpu-milli`.
    pub fn is_default(&self, resource: &str) -> bool {
        self.kind_of(resource).is_some_and(|k| k.name == NVIDIA)
    }

    /// The kinds besides NVIDIA's, as plugins see them.
    pub fn api_kinds(&self) -> Vec<Kind> {
        self.kinds
            .iter()
            .filter(|k| k.name != NVIDIA)
            .map(|k| Kind { name: k.name.clone(), resources: k.resources.clone() })
            .collect()
    }

    /// The accelerators of other kinds than NVIDIA's in `extended` (a node's allocatable, a pod's
    /// request), with their device counts.
    pub fn count(&self, extended: &[(wasmsched_api::ResourceName, u64)]) -> Counted {
        let mut per_kind: Vec<(usize, u64)> = Vec::new();
        for (name, n) in extended {
            let Some(&i) = self.by_resource.get(name.as_str()) else { continue };
            if self.kinds[i].name == NVIDIA || *n == 0 {
                continue;
            }
            match per_kind.iter_mut().find(|(k, _)| *k == i) {
                Some((_, max)) => *max = (*max).max(*n),
                None => per_kind.push((i, *n)),
            }
        }
        per_kind.sort();
        Counted { per_kind }
    }

    /// The devices of a node with `labels` offering `nvidia` NVIDIA GPUs and `others` of other
    /// kinds: NVIDIA's first (indexes from 0), then each kind in table order.
    pub fn devices(&self, labels: &[(String, String)], nvidia: u64, others: &Counted) -> Vec<GpuDevice> {
        let label = |keys: &[String]| {
            keys.iter().find_map(|k| labels.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str()))
        };
        let mut devices = Vec::new();
        let nvidia_kind = self.kinds.iter().find(|k| k.name == NVIDIA);
        let groups = nvidia_kind
            .map(|k| (k, nvidia))
            .into_iter()
            .chain(others.per_kind.iter().map(|&(i, n)| (&self.kinds[i], n)));
        for (kind, count) in groups {
            let model = label(&kind.product_labels).unwrap_or_default().to_string();
            let memory_bytes = label(&kind.memory_labels).and_then(memory_bytes).unwrap_or(0);
            let stored = wasmsched_api::accelerators::stored_name(&kind.name);
            for _ in 0..count {
                devices.push(GpuDevice {
                    index: devices.len() as u32,
                    model: model.clone(),
                    memory_bytes,
                    free_milli: GPU_MILLI,
                    free_memory_bytes: memory_bytes,
                    kind: stored.into(),
                    ..Default::default()
                });
            }
        }
        devices
    }

    /// The fixed topology of a node whose devices are all of one kind with a fixed layout; None
    /// otherwise (mixed nodes, kinds learned from the agent or not at all).
    pub fn fixed_topology(&self, devices: &[GpuDevice]) -> Option<NodeTopology> {
        let first = devices.first()?;
        if first.kind.is_empty() || devices.iter().any(|d| d.kind != first.kind) {
            return None;
        }
        let kind = self.kinds.iter().find(|k| k.name == first.kind.as_str())?;
        if kind.topology != TopologySource::Fixed {
            return None;
        }
        let product = first.model.to_ascii_lowercase();
        let rule = kind
            .layouts
            .iter()
            .find(|r| r.product.as_ref().is_none_or(|p| product.contains(&p.to_ascii_lowercase())))?;
        let group = rule.group_size as usize;
        let gpus = (0..devices.len() as u32)
            .map(|index| Gpu {
                index,
                model: Some(first.model.clone()).filter(|m| !m.is_empty()),
                ..Default::default()
            })
            .collect();
        let link = |a: usize, b: usize| {
            if a / group == b / group { Link::NvLink { links: 1, switched: false } } else { Link::Phb }
        };
        let mut topology = NodeTopology::new(gpus, link, Vec::new()).ok()?;
        // Direct links between each pair of a group, no switch.
        topology.set_switched(false);
        Some(topology)
    }
}

/// A memory label's value in bytes: a plain number is MiB, else a quantity where a bare `G`,
/// `M` or `T` suffix means the binary unit (the AMD labeller's `192G` is 192 GiB).
fn memory_bytes(value: &str) -> Option<u64> {
    let v = value.trim();
    if let Ok(mib) = v.parse::<u64>() {
        return mib.checked_mul(1 << 20);
    }
    let binary = match v.char_indices().last()? {
        (at, 'G' | 'M' | 'T' | 'K') => format!("{}{}i", &v[..at], &v[at..]),
        _ => v.to_string(),
    };
    crate::convert::milli_units(&binary).map(|m| m / 1000).and_then(|b| u64::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_built_in_table_knows_every_vendor_s_resources() {
        let t = AcceleratorTable::default();
        for (resource, kind) in [
            ("nvidia.com/gpu", "nvidia"),
            ("amd.com/gpu", "amd"),
            ("habana.ai/gaudi", "gaudi"),
            ("huawei.com/Ascend910", "ascend910"),
            ("huawei.com/Ascend310P", "ascend310p"),
            ("aws.amazon.com/neuron", "neuron"),
            ("aws.amazon.com/neurondevice", "neuron"),
            ("aws.amazon.com/neuroncore", "neuroncore"),
        ] {
            assert_eq!(t.kind_of(resource).map(|k| k.name.as_str()), Some(kind), "{resource}");
        }
        assert!(t.kind_of("rdma/hca").is_none());
        assert!(t.is_default("nvidia.com/gpu") && !t.is_default("amd.com/gpu"));
        assert!(t.api_kinds().iter().all(|k| k.name != "nvidia"));
    }

    #[test]
    fn amd_devices_take_the_labeller_s_product_and_memory() {
        let t = AcceleratorTable::default();
        let node = labels(&[("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"), ("amd.com/gpu.vram", "192G")]);
        let counted = t.count(&[("amd.com/gpu".into(), 8), ("rdma/hca".into(), 4)]);
        let devices = t.devices(&node, 0, &counted);
        assert_eq!(devices.len(), 8);
        assert!(devices.iter().enumerate().all(|(i, d)| d.index == i as u32 && d.kind == "amd"));
        assert_eq!((devices[0].model.as_str(), devices[0].memory_bytes), ("AMD_Instinct_MI300X_OAM", 192 << 30));
        let legacy = labels(&[("beta.amd.com/gpu.product-name", "MI250"), ("beta.amd.com/gpu.vram", "64G")]);
        assert_eq!(t.devices(&legacy, 0, &counted)[0].model, "MI250", "the older labeller's prefix");
    }

    #[test]
    fn a_node_with_two_kinds_lists_nvidia_first_then_table_order() {
        let t = AcceleratorTable::default();
        let node = labels(&[("nvidia.com/gpu.product", "H100"), ("nvidia.com/gpu.memory", "81559")]);
        let counted = t.count(&[("aws.amazon.com/neuron".into(), 2), ("amd.com/gpu".into(), 1)]);
        let kinds: Vec<&str> = t.devices(&node, 2, &counted).iter().map(|d| d.kind.as_str()).collect();
        assert_eq!(kinds, ["", "", "amd", "neuron", "neuron"]);
        let aliases = t.count(&[("aws.amazon.com/neuron".into(), 16), ("aws.amazon.com/neurondevice".into(), 16)]);
        assert_eq!(aliases.per_kind, vec![(5, 16)], "two names of the same devices count once");
    }

    #[test]
    fn fixed_layouts_follow_the_product() {
        let t = AcceleratorTable::default();
        let ascend = |product: &str| {
            let node = labels(&[("accelerator-type", product)]);
            t.devices(&node, 0, &t.count(&[("huawei.com/Ascend910".into(), 8)]))
        };
        let a2 = t.fixed_topology(&ascend("module-910b-8")).unwrap();
        assert!((1..8).all(|j| a2.link(0, j).unwrap().is_nvlink()), "910B: one HCCS mesh of eight");
        let a1 = t.fixed_topology(&ascend("module")).unwrap();
        assert!(a1.link(0, 3).unwrap().is_nvlink() && !a1.link(3, 4).unwrap().is_nvlink(), "910: two meshes of four");
        let amd = t.devices(&[], 0, &t.count(&[("amd.com/gpu".into(), 8)]));
        assert!(t.fixed_topology(&amd).is_none(), "AMD's comes from the agent");
    }

    #[test]
    fn memory_labels_read_as_mib_or_quantities() {
        assert_eq!(memory_bytes("81559"), Some(81559 << 20));
        assert_eq!(memory_bytes("192G"), Some(192 << 30));
        assert_eq!(memory_bytes("80Gi"), Some(80 << 30));
        assert_eq!(memory_bytes("lots"), None);
    }

    #[test]
    fn a_bad_table_is_refused_with_the_entry_named() {
        let mut kinds = builtin();
        kinds.push(AcceleratorKind { name: "other".into(), resources: vec!["amd.com/gpu".into()], ..kinds[1].clone() });
        let e = AcceleratorTable::new(kinds).unwrap_err().to_string();
        assert!(e.contains("\"other\"") && e.contains("also amd's"), "{e}");
        let shares = parse("- {name: amd, resources: [amd.com/gpu], shares: true}").unwrap();
        assert!(AcceleratorTable::new(merged(builtin(), shares)).is_err());
        let off = parse("- {name: gaudi, resources: [habana.ai/gaudi], disabled: true}").unwrap();
        assert!(AcceleratorTable::new(merged(builtin(), off)).unwrap().kind_of("habana.ai/gaudi").is_none());
        assert!(parse("- {name: x, resources: [a/b], topology: mesh}").is_err(), "unknown topology source");
    }
}
