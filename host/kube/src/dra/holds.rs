//! What the DRA state keeps beside the objects it watches: which claims hold each device, where
//! each device is, and which nodes' devices changed since the core and the dashboard last
//! looked. Each is kept by one small type, so [`super::Dra`] only says when they change.

use ahash::{AHashMap, AHashSet};
use k8s_openapi::api::resource::v1::ResourceClaim;
use wasmsched_dra::{Allocation, DeviceId, Inventory, Reach};

/// The devices claims hold, both ways round.
#[derive(Debug, Default)]
pub(super) struct Holds {
    /// The claims holding each held device (admin access holds none; one claim but for a device
    /// several may share).
    by_device: AHashMap<DeviceId, Vec<String>>,
    /// The devices each claim holds.
    by_claim: AHashMap<String, Vec<DeviceId>>,
}

/// How one claim's devices changed ([`Holds::set`]).
pub(super) struct Moved {
    /// Devices no claim holds any longer.
    pub freed: Vec<DeviceId>,
    /// Every device it held before or holds now.
    pub touched: Vec<DeviceId>,
}

impl Holds {
    /// The holds of `claims`' allocations, and of the allocations being written (`pending`) for
    /// claims the watch does not show allocated yet.
    pub fn of(claims: &AHashMap<String, ResourceClaim>, pending: &AHashMap<String, Allocation>) -> Holds {
        let mut by_claim: AHashMap<String, Vec<DeviceId>> = AHashMap::new();
        for (key, claim) in claims {
            let ids = super::allocation(claim).map(held_devices).unwrap_or_default();
            if !ids.is_empty() {
                by_claim.insert(key.clone(), ids);
            }
        }
        for (key, a) in pending {
            if !by_claim.contains_key(key) {
                let ids = pending_devices(a);
                if !ids.is_empty() {
                    by_claim.insert(key.clone(), ids);
                }
            }
        }
        let mut by_device: AHashMap<DeviceId, Vec<String>> = AHashMap::new();
        for (key, ids) in &by_claim {
            for id in ids {
                by_device.entry(id.clone()).or_default().push(key.clone());
            }
        }
        Holds { by_device, by_claim }
    }

    /// Claim `key` holds exactly `now` from here on; what moved, if anything did.
    pub fn set(&mut self, key: &str, now: Vec<DeviceId>) -> Option<Moved> {
        let before = self.by_claim.remove(key).unwrap_or_default();
        let moved = (before != now).then(|| {
            let mut freed = Vec::new();
            for id in &before {
                let keys = self.by_device.entry(id.clone()).or_default();
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.by_device.remove(id);
                    freed.push(id.clone());
                }
            }
            for id in &now {
                let keys = self.by_device.entry(id.clone()).or_default();
                if !keys.iter().any(|k| k == key) {
                    keys.push(key.to_string());
                }
            }
            Moved { freed, touched: before.into_iter().chain(now.iter().cloned()).collect() }
        });
        if !now.is_empty() {
            self.by_claim.insert(key.to_string(), now);
        }
        moved
    }

    /// The claims holding `id`.
    pub fn holders(&self, id: &DeviceId) -> &[String] {
        self.by_device.get(id).map_or(&[], Vec::as_slice)
    }

    /// Devices held.
    pub fn devices(&self) -> usize {
        self.by_device.len()
    }
}

/// The devices an allocation in a claim's status holds (admin access holds none).
pub(super) fn held_devices(a: &k8s_openapi::api::resource::v1::AllocationResult) -> Vec<DeviceId> {
    a.devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.admin_access != Some(true))
        .map(|r| DeviceId {
            driver: r.driver.as_str().into(),
            pool: r.pool.as_str().into(),
            device: r.device.as_str().into(),
        })
        .collect()
}

/// The devices an allocation being written holds.
pub(super) fn pending_devices(a: &Allocation) -> Vec<DeviceId> {
    a.results.iter().filter(|r| !r.2).map(|r| r.1.clone()).collect()
}

/// Where each device of the inventory is.
#[derive(Debug, Default)]
pub(super) struct Homes {
    /// The node each device is local to (`None`: reached by several).
    node_of: AHashMap<DeviceId, Option<String>>,
    /// Each node's local devices, as indexes into the inventory.
    on_node: AHashMap<String, Vec<usize>>,
}

impl Homes {
    pub fn of(inventory: &Inventory) -> Homes {
        let mut homes = Homes::default();
        for (i, d) in inventory.devices().iter().enumerate() {
            let node = match &d.reach {
                Reach::Node(n) => Some(n.clone()),
                _ => None,
            };
            if let Some(n) = &node {
                homes.on_node.entry(n.clone()).or_default().push(i);
            }
            homes.node_of.insert(d.id.clone(), node);
        }
        homes
    }

    /// `Some(Some(node))` for a device local to `node`, `Some(None)` for one several nodes
    /// reach, `None` for no device of a complete pool.
    pub fn node_of(&self, id: &DeviceId) -> Option<Option<&str>> {
        self.node_of.get(id).map(Option::as_deref)
    }

    /// `node`'s local devices, as indexes into the inventory.
    pub fn on_node(&self, node: &str) -> Option<&[usize]> {
        self.on_node.get(node).map(Vec::as_slice)
    }

    /// Nodes with local devices.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.on_node.keys()
    }
}

/// Nodes whose devices, or the holds on them, changed since each reader last took them: the
/// core's class counts and the dashboard's copy. `None`: any node may have.
#[derive(Debug, Default)]
pub(super) struct Changed {
    counted: Option<AHashSet<String>>,
    shown: Option<AHashSet<String>>,
}

impl Changed {
    pub fn node(&mut self, node: &str) {
        for changed in [self.counted.as_mut(), self.shown.as_mut()].into_iter().flatten() {
            changed.insert(node.to_string());
        }
    }

    pub fn any(&mut self) {
        self.counted = None;
        self.shown = None;
    }

    pub fn take_counted(&mut self) -> Option<Vec<String>> {
        self.counted.replace(AHashSet::new()).map(|c| c.into_iter().collect())
    }

    pub fn take_shown(&mut self) -> Option<Vec<String>> {
        self.shown.replace(AHashSet::new()).map(|c| c.into_iter().collect())
    }
}
