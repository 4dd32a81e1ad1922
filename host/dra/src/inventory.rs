//! The devices a cluster offers, from its ResourceSlices, assembled into pools the way
//! kube-scheduler assembles them: per driver and pool name, only the newest generation, and only
//! when all of that generation's slices are there.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelector};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;

use crate::node_selector;
use crate::quantity::Quantity;

/// A device's identity in allocation results: driver, pool and device name. Shared text: every
/// allocation copies the ids of its devices, and as three `String`s that was a tenth of an
/// allocation's time (`wasmsched bench --dra`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    /// The DRA driver (`gpu.nvidia.com`).
    pub driver: Arc<str>,
    /// The pool, unique per driver (usually the node's name for node-local devices).
    pub pool: Arc<str>,
    /// The device, unique within its pool (`gpu-0`).
    pub device: Arc<str>,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A typed attribute value, as a slice publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attribute {
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `string`.
    String(String),
    /// `version` (semantic version 2.0).
    Version(semver::Version),
}

/// Where a device can be used from.
#[derive(Clone, Debug, PartialEq)]
pub enum Reach {
    /// Only on this node.
    Node(String),
    /// On every node the selector matches (network-attached devices).
    Selector(NodeSelector),
    /// On every node.
    AllNodes,
}

/// One device of a complete pool.
#[derive(Clone, Debug)]
pub struct Device {
    /// Driver, pool, name.
    pub id: DeviceId,
    /// Attributes by fully qualified name (`gpu.nvidia.com/index`; names a slice gives without a
    /// domain belong to its driver's).
    pub attributes: BTreeMap<String, Attribute>,
    /// Capacities by fully qualified name (`gpu.nvidia.com/memory`).
    pub capacity: BTreeMap<String, Quantity>,
    /// The domains of its attribute and capacity names (`gpu.nvidia.com`): a selector reading a
    /// domain's map asks whether the device has it, once per device, and a walk over every name
    /// was most of that question's cost.
    pub domains: BTreeSet<String>,
    /// Where it can be used from.
    pub reach: Reach,
    /// The device may be allocated to several claims at once.
    pub allow_multiple_allocations: bool,
    /// Its driver's taints that keep it from claims which do not tolerate them (`NoSchedule`,
    /// `NoExecute`; a taint with effect `None` only informs).
    pub taints: Vec<k8s_openapi::api::resource::v1::DeviceTaint>,
}

impl Device {
    /// Its string attribute `name` of its driver's domain (`productName`: the slice's
    /// `gpu.nvidia.com/productName`), if it has one.
    pub fn string_attribute(&self, name: &str) -> Option<&str> {
        match self.attributes.get(&format!("{}/{name}", self.id.driver)) {
            Some(Attribute::String(s)) => Some(s),
            _ => None,
        }
    }

    /// Whether a pod on `node` can use it.
    pub fn reachable_from(&self, node: &Node) -> bool {
        match &self.reach {
            Reach::Node(name) => node.metadata.name.as_deref() == Some(name.as_str()),
            Reach::Selector(selector) => node_selector::matches(selector, node),
            Reach::AllNodes => true,
        }
    }
}

/// Why a slice, or a pool, or a device, is not offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `driver/pool` (and the slice or device where it is one of them).
    pub what: String,
    /// Why.
    pub reason: String,
}

/// The devices of every complete pool, and which of them claims already hold.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    devices: Vec<Device>,
    /// Each device's place in `devices`: a hold names a device by its id.
    index: ahash::AHashMap<DeviceId, usize>,
    /// Whether a claim holds the device at that place. The allocator asks this of every
    /// candidate device of every claim: an index, where a set of ids hashed three strings per
    /// device (`wasmsched bench --dra`).
    held: Vec<bool>,
    /// Held devices that are in no complete pool (a claim allocated from a pool since gone or not
    /// complete): still held when asked by id.
    held_elsewhere: ahash::AHashSet<DeviceId>,
}

impl Inventory {
    /// Assemble the pools of `slices`; what cannot be used is returned with the reason.
    pub fn from_slices<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>) -> (Inventory, Vec<Refusal>) {
        let mut refusals = Vec::new();
        let mut pools: BTreeMap<(String, String), Vec<&ResourceSlice>> = BTreeMap::new();
        // The same slice given twice (overlapping files) is one slice.
        let mut seen = HashSet::new();
        for slice in slices {
            if let Some(name) = &slice.metadata.name
                && !seen.insert(name.clone())
            {
                continue;
            }
            let spec = &slice.spec;
            pools.entry((spec.driver.clone(), spec.pool.name.clone())).or_default().push(slice);
        }
        let mut inventory = Inventory::default();
        for ((driver, pool), slices) in pools {
            let key = format!("{driver}/{pool}");
            let newest = slices.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
            let current: Vec<&ResourceSlice> =
                slices.into_iter().filter(|s| s.spec.pool.generation == newest).collect();
            let counts: BTreeSet<i64> = current.iter().map(|s| s.spec.pool.resource_slice_count).collect();
            let why_not = if counts.len() > 1 {
                Some(format!("its generation-{newest} slices disagree on the slice count ({counts:?})"))
            } else if let Some(&expected) = counts.first()
                && expected != current.len() as i64
            {
                Some(if (current.len() as i64) < expected {
                    format!(
                        "incomplete: {} of the {expected} slices of generation {newest} are published",
                        current.len()
                    )
                } else {
                    format!("{} slices of generation {newest}, more than its count of {expected}", current.len())
                })
            } else {
                None
            };
            if let Some(reason) = why_not {
                refusals.push(Refusal { what: key, reason });
                continue;
            }
            let mut devices = Vec::new();
            let mut names = HashSet::new();
            let mut invalid = None;
            for slice in &current {
                for device in slice.spec.devices.iter().flatten() {
                    if !names.insert(device.name.clone()) {
                        invalid = Some(format!("device name {:?} appears twice", device.name));
                        break;
                    }
                    match convert(&driver, &pool, slice, device) {
                        Ok(d) => devices.push(d),
                        Err(reason) => refusals.push(Refusal { what: format!("{key}/{}", device.name), reason }),
                    }
                }
            }
            if let Some(reason) = invalid {
                refusals.push(Refusal { what: key, reason });
                continue;
            }
            inventory.devices.extend(devices);
        }
        inventory.index = inventory.devices.iter().enumerate().map(|(i, d)| (d.id.clone(), i)).collect();
        inventory.held = vec![false; inventory.devices.len()];
        (inventory, refusals)
    }

    /// Taints `rules` (`DeviceTaintRule`s, `resource.k8s.io/v1beta2`) put on devices, beside the
    /// ones their slices publish: each rule taints the devices its selector names (by driver, pool
    /// and device name; none named: every device). Effect `None` only informs, as on slices.
    pub fn apply_taint_rules<'a>(&mut self, rules: impl IntoIterator<Item = &'a DeviceTaintRule>) {
        for rule in rules {
            let taint = &rule.spec.taint;
            if taint.effect == "None" {
                continue;
            }
            let selector = rule.spec.device_selector.as_ref();
            let names = |wanted: Option<&String>, actual: &str| wanted.is_none_or(|w| w == actual);
            let as_v1 = k8s_openapi::api::resource::v1::DeviceTaint {
                effect: taint.effect.clone(),
                key: taint.key.clone(),
                time_added: taint.time_added.clone(),
                value: taint.value.clone(),
            };
            for device in &mut self.devices {
                let id = &device.id;
                if names(selector.and_then(|s| s.driver.as_ref()), &id.driver)
                    && names(selector.and_then(|s| s.pool.as_ref()), &id.pool)
                    && names(selector.and_then(|s| s.device.as_ref()), &id.device)
                {
                    device.taints.push(as_v1.clone());
                }
            }
        }
    }

    /// Count the devices `claims` already have allocated (whoever allocated them) as in use.
    /// Admin access does not hold a device.
    pub fn hold_allocated<'a>(&mut self, claims: impl IntoIterator<Item = &'a ResourceClaim>) {
        for claim in claims {
            let results = claim.status.iter().flat_map(|s| &s.allocation).flat_map(|a| &a.devices);
            for r in results.flat_map(|d| d.results.iter().flatten()) {
                if r.admin_access != Some(true) {
                    self.hold(DeviceId {
                        driver: r.driver.as_str().into(),
                        pool: r.pool.as_str().into(),
                        device: r.device.as_str().into(),
                    });
                }
            }
        }
    }

    /// Forget which devices are held (before they are counted again from the claims).
    pub fn release_all(&mut self) {
        self.held.fill(false);
        self.held_elsewhere.clear();
    }

    /// Mark one device as held (an allocation just made).
    pub fn hold(&mut self, id: DeviceId) {
        match self.index.get(&id) {
            Some(&i) => self.held[i] = true,
            None => {
                self.held_elsewhere.insert(id);
            }
        }
    }

    /// Release a device (its claim was deallocated).
    pub fn release(&mut self, id: &DeviceId) {
        match self.index.get(id) {
            Some(&i) => self.held[i] = false,
            None => {
                self.held_elsewhere.remove(id);
            }
        }
    }

    /// Whether a claim holds the device.
    pub fn is_in_use(&self, id: &DeviceId) -> bool {
        match self.index.get(id) {
            Some(&i) => self.held[i],
            None => self.held_elsewhere.contains(id),
        }
    }

    /// Hold or release the device at `index` in [`Inventory::devices`].
    pub fn set_held_at(&mut self, index: usize, held: bool) {
        self.held[index] = held;
    }

    /// Whether a claim holds the device at `index` in [`Inventory::devices`].
    pub fn is_held_at(&self, index: usize) -> bool {
        self.held[index]
    }

    /// Every usable device, pools in (driver, pool) order, devices in slice order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

fn convert(
    driver: &str,
    pool: &str,
    slice: &ResourceSlice,
    device: &k8s_openapi::api::resource::v1::Device,
) -> Result<Device, String> {
    let qualify = |name: &str| if name.contains('/') { name.to_string() } else { format!("{driver}/{name}") };
    let mut attributes = BTreeMap::new();
    for (name, value) in device.attributes.iter().flatten() {
        let typed = match (value.bool, value.int, &value.string, &value.version) {
            (Some(b), None, None, None) => Attribute::Bool(b),
            (None, Some(i), None, None) => Attribute::Int(i),
            (None, None, Some(s), None) => Attribute::String(s.clone()),
            (None, None, None, Some(v)) => Attribute::Version(
                semver::Version::parse(v)
                    .map_err(|e| format!("attribute {name}: {v:?} is not a semantic version: {e}"))?,
            ),
            _ => return Err(format!("attribute {name}: exactly one of bool, int, string and version must be set")),
        };
        attributes.insert(qualify(name), typed);
    }
    let mut capacity = BTreeMap::new();
    for (name, c) in device.capacity.iter().flatten() {
        let q = Quantity::parse(&c.value.0).map_err(|e| format!("capacity {name}: {e}"))?;
        capacity.insert(qualify(name), q);
    }
    let spec = &slice.spec;
    let reach = if spec.per_device_node_selection == Some(true) {
        reach_of(device.node_name.as_ref(), device.node_selector.as_ref(), device.all_nodes)
            .ok_or("the slice selects nodes per device, and this device names none")?
    } else {
        reach_of(spec.node_name.as_ref(), spec.node_selector.as_ref(), spec.all_nodes)
            .ok_or("the slice names no node, node selector or allNodes")?
    };
    let domains = domains_of(attributes.keys().chain(capacity.keys()).map(String::as_str));
    Ok(Device {
        id: DeviceId { driver: driver.into(), pool: pool.into(), device: device.name.as_str().into() },
        attributes,
        capacity,
        domains,
        reach,
        allow_multiple_allocations: device.allow_multiple_allocations == Some(true),
        taints: device.taints.iter().flatten().filter(|t| t.effect != "None").cloned().collect(),
    })
}

/// The domains of qualified names (`gpu.nvidia.com` of `gpu.nvidia.com/memory`).
pub(crate) fn domains_of<'a>(names: impl Iterator<Item = &'a str>) -> BTreeSet<String> {
    names.filter_map(|k| k.rsplit_once('/')).map(|(domain, _)| domain.to_string()).collect()
}

fn reach_of(node: Option<&String>, selector: Option<&NodeSelector>, all: Option<bool>) -> Option<Reach> {
    match (node, selector, all) {
        (Some(n), _, _) => Some(Reach::Node(n.clone())),
        (None, Some(s), _) => Some(Reach::Selector(s.clone())),
        (None, None, Some(true)) => Some(Reach::AllNodes),
        _ => None,
    }
}
