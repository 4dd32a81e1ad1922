//! Dynamic Resource Allocation (`resource.k8s.io/v1`) for this scheduler's pods: the cluster's
//! ResourceSlices, DeviceClasses and ResourceClaims as the watches show them, which nodes can serve
//! a pod's claims, and the allocations the scheduler writes on the claims before it binds.
//!
//! The order is kube-scheduler's: before a pod is tried, its claims must exist (a claim from a
//! template is created by the resource-claim controller and named in the pod's
//! `status.resourceClaimStatuses`); the nodes where its claims can all be allocated become a
//! required node-affinity term on its task, so every policy — Wasm or native — places it among
//! them; the placement is then allocated against the devices held right now (an earlier
//! placement of the same cycle may have taken them), written on each claim (`status.allocation`
//! and `status.reservedFor`, with the claim's `resourceVersion`) and only then is the pod bound.
//! Devices allocated by any claim, whoever allocated it, are in use; allocations written here
//! count as held until the watch shows them.

pub mod extended;
mod holds;

use std::collections::{BTreeMap, BTreeSet};

use ahash::{AHashMap, AHashSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceClaimSpec, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use wasmsched_api::{
    MAX_PREFERRED_WEIGHT, NODE_NAME_FIELD, NodeSelectorTerm, PreferredTerm, SelectorOperator, SelectorRequirement, Task,
};
use wasmsched_dra::{Allocation, Allocator, DeviceId, Inventory, node_selector};

/// The finalizer kube-scheduler puts on a claim it allocates: the claim is not deleted while
/// allocated (the resource-claim controller removes it once the claim is deallocated).
pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// The most pods one claim may be reserved for (`status.reservedFor`'s limit).
pub const RESERVED_FOR_MAX: usize = 256;

/// One entry of a pod's `spec.resourceClaims`, resolved to the claim it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// The name the pod's containers use.
    pub name: String,
    /// The ResourceClaim's name; `None` while the claim for a template does not exist yet.
    pub claim: Option<String>,
    /// The template the claim is made from, if any.
    pub template: Option<String>,
}

/// The claims `pod` uses: by name, or the claim made from a template as the pod's status names it.
pub fn pod_claims(pod: &Pod) -> Vec<ClaimRef> {
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_deref()).unwrap_or_default();
    let spec = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default();
    spec.iter()
        .map(|c| match (&c.resource_claim_name, &c.resource_claim_template_name) {
            (Some(name), _) => ClaimRef { name: c.name.clone(), claim: Some(name.clone()), template: None },
            (None, template) => ClaimRef {
                name: c.name.clone(),
                claim: statuses.iter().find(|s| s.name == c.name).and_then(|s| s.resource_claim_name.clone()),
                template: template.clone(),
            },
        })
        .collect()
}

/// What is written on one claim before a pod is bound.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimWrite {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Devices allocated for it now; `None`: it was allocated already, the pod is only added to
    /// `status.reservedFor`.
    pub allocation: Option<AllocationResult>,
    /// Its allocation is being written for another pod of ours (a shared claim, a gang's
    /// members): the write waits a moment for it to land instead of failing at once.
    pub after_ours: bool,
    /// The claim does not exist yet: it is created first (the claim for a pod's extended
    /// resources), and deleted again if the pod is not bound. `name` is its placeholder until
    /// then, the name the API server gave it after.
    pub create: Option<MadeClaim>,
    /// The claim as the watch last showed it: the first write is tried on it (kube-scheduler
    /// writes on its informer's copy too); a conflict reads it from the API server.
    pub seen: Option<ResourceClaim>,
}

impl ClaimWrite {
    /// What the devices allocated now hold of each DeviceClass beyond what the cycle counted for
    /// the claim ahead ([`wasmsched_dra::beyond_count`]); nothing for a claim allocated before.
    pub fn beyond_count(&self) -> Vec<(wasmsched_api::ResourceName, u64)> {
        let Some(allocation) = &self.allocation else { return Vec::new() };
        let claim = self.create.as_ref().map(|m| &m.claim).or(self.seen.as_ref());
        let Some(spec) = claim.and_then(|c| c.spec.as_ref()) else { return Vec::new() };
        wasmsched_dra::beyond_count(spec, allocation)
    }
}

/// What a pod of ours asks of DRA: its claims (with the one made for its extended resources once
/// it exists) and the claim still to be made for them.
#[derive(Clone, Debug, PartialEq)]
pub struct DraPod {
    /// Its claims.
    pub claims: Vec<ClaimRef>,
    /// The claim to make for its extended resources served by DRA.
    pub made: Option<MadeClaim>,
}

/// The claim made for a pod's extended resources served by DRA, before it exists.
#[derive(Clone, Debug, PartialEq)]
pub struct MadeClaim {
    /// The claim to create: `generateName`, the pod as controller, the annotation, the requests
    /// (`metadata.name` is a placeholder no real claim can have).
    pub claim: ResourceClaim,
    /// Which container uses which request, for the pod's `status.extendedResourceClaimStatus`.
    pub mappings: Vec<k8s_openapi::api::core::v1::ContainerExtendedResourceRequest>,
}

impl MadeClaim {
    /// The claim for `served` (resource → DeviceClass) of pod `name` (`uid`) in `namespace`.
    pub fn new(
        namespace: &str,
        name: &str,
        uid: &str,
        containers: &[extended::ContainerRequests],
        served: &BTreeMap<String, String>,
    ) -> MadeClaim {
        use k8s_openapi::api::resource::v1::DeviceClaim;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let (requests, mappings) = extended::requests_and_mappings(containers, served);
        let generate = format!("{name}-extended-resources-");
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                // Ends in '-': no claim the API server made can be named so.
                name: Some(generate.clone()),
                generate_name: Some(generate),
                namespace: Some(namespace.into()),
                annotations: Some([(extended::CLAIM_ANNOTATION.to_string(), "true".to_string())].into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim { requests: Some(requests), ..Default::default() }),
            }),
            status: None,
        };
        MadeClaim { claim, mappings }
    }
}

/// Objects of one kind by `namespace/name` (or `name`), with a re-list in progress.
struct Store<K> {
    objects: AHashMap<String, K>,
    relist: Option<AHashMap<String, K>>,
    synced: bool,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store { objects: AHashMap::new(), relist: None, synced: false }
    }
}

fn key_of(meta: &ObjectMeta) -> String {
    match &meta.namespace {
        Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
        None => meta.name.clone().unwrap_or_default(),
    }
}

impl<K: kube::Resource + Clone> Store<K> {
    /// Applies a watch event; the objects (before and after) it changed, or `None` for a
    /// re-list's end (anything may have changed).
    #[allow(clippy::type_complexity)]
    fn on_event(&mut self, event: Event<K>) -> Option<Vec<(Option<K>, Option<K>)>> {
        match event {
            Event::Init => {
                self.relist = Some(AHashMap::new());
                Some(Vec::new())
            }
            Event::InitApply(o) => {
                if let Some(listed) = self.relist.as_mut() {
                    listed.insert(key_of(o.meta()), o);
                }
                Some(Vec::new())
            }
            Event::InitDone => {
                if let Some(listed) = self.relist.take() {
                    self.objects = listed;
                }
                self.synced = true;
                None
            }
            Event::Apply(o) => {
                let before = self.objects.insert(key_of(o.meta()), o.clone());
                Some(vec![(before, Some(o))])
            }
            Event::Delete(o) => Some(vec![(self.objects.remove(&key_of(o.meta())), None)]),
        }
    }
}

/// The DRA objects, the allocator over them, and allocations written but not yet seen.
#[derive(Default)]
pub struct Dra {
    slices: Store<ResourceSlice>,
    classes: Store<DeviceClass>,
    claims: Store<ResourceClaim>,
    /// DeviceTaintRules (`resource.k8s.io/v1beta2`, where served): taints beside the slices'.
    taint_rules: Store<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>,
    /// Nodes as node selectors see them (name and labels).
    nodes: AHashMap<String, Node>,
    /// Allocations this scheduler wrote (or is writing), by claim, until the watch shows them.
    pending: AHashMap<String, Allocation>,
    /// Rebuilt when slices, classes or nodes change.
    allocator: Option<Allocator>,
    /// The held devices must be counted again from every claim (the allocator was rebuilt, the
    /// claims re-listed, a reservation undone); a single claim's change is counted on its own.
    holds_stale: bool,
    /// Something changed that may let a pod that waits on its claims be placed.
    woke: Woken,
    /// Why the last pools were refused (logged when it changes).
    refused: BTreeSet<String>,
    /// Answers of [`Dra::feasible_nodes`] by the shape of the question, while holds stay.
    shapes: AHashMap<u64, Result<Feasible, String>>,
    /// The devices claims hold.
    holds: holds::Holds,
    /// Where each device is.
    homes: holds::Homes,
    /// Nodes whose devices or holds changed since the core ([`Dra::take_changed_nodes`]) and
    /// the dashboard ([`Dra::take_shown_changes`]) last looked.
    changed: holds::Changed,
}

/// A device local to one node, as the dashboard shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDevice {
    /// Driver, pool, device.
    pub id: DeviceId,
    /// `productName`, where its slice gives one.
    pub model: Option<String>,
    /// `type` (`gpu`, `mig`), where its slice gives one.
    pub kind: Option<String>,
    /// `profile` of a MIG partition, where its slice gives one.
    pub profile: Option<String>,
    /// The claims holding it (`namespace/name`).
    pub held_by: Vec<String>,
}

/// What changed for pods that wait on their claims (see [`Dra::take_woken`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// A claim was created: pods that waited for it may go on.
    pub claims: bool,
    /// Devices were added or freed, or classes or node labels changed: where claims can go may
    /// have grown, so pods submitted with the nodes they allowed before are submitted again.
    pub devices: bool,
}

/// Where a pod's claims can go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feasible {
    /// The nodes.
    pub nodes: Vec<String>,
    /// Of those, the nodes that give each `firstAvailable` request its first choice (empty when
    /// all or none do: no preference then).
    pub preferred: Vec<String>,
    /// They can be allocated there now (else only once devices are freed).
    pub now: bool,
    /// When not now: why no node can serve the claims with the devices free now (a taint, a
    /// selector, too few free), for the pod's reason beside the core's.
    pub not_now: Option<String>,
}

pub use wasmsched_dra::class_resource;

/// `0/N nodes can serve its ResourceClaims: …`, the five commonest reasons first (a node with no
/// device of the class is the commonest and says the least; a taint or a selector is further down).
fn summary(why: &BTreeMap<String, usize>, nodes: usize) -> String {
    const SHOWN: usize = 5;
    let mut by_count: Vec<(usize, &String)> = why.iter().map(|(r, n)| (*n, r)).collect();
    by_count.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let parts: Vec<String> = by_count.iter().take(SHOWN).map(|(n, r)| format!("{n} node(s): {r}")).collect();
    let more =
        if by_count.len() > SHOWN { format!("; {} other reasons", by_count.len() - SHOWN) } else { String::new() };
    format!("0/{nodes} nodes can serve its ResourceClaims: {}{more}", parts.join("; "))
}

/// Allocates each prepared claim on `node` in turn, each holding its devices while the next looks
/// (`only_free: false`: as if no device were held), then releases them all.
fn together(
    allocator: &mut Allocator,
    prepared: &[wasmsched_dra::PreparedClaim<'_>],
    node: &Node,
    only_free: bool,
) -> Result<Vec<Allocation>, wasmsched_dra::Unsatisfied> {
    let mut made = Vec::new();
    // Only what this call held is released: as if none were held, an allocation may name
    // devices other claims hold, and those stay held.
    let mut held_here = Vec::new();
    let mut result = Ok(());
    for p in prepared {
        let attempt = if only_free { allocator.fits_now(p, node) } else { allocator.compatible(p, node) };
        match attempt {
            Ok(a) => {
                for (_, id, admin) in &a.results {
                    if !admin && !allocator.inventory().is_in_use(id) {
                        allocator.hold_device(id.clone());
                        held_here.push(id.clone());
                    }
                }
                made.push(a);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for id in &held_here {
        allocator.release_device(id);
    }
    result.map(|()| made)
}

impl Dra {
    /// Whether all three kinds have been listed: until then no pod with claims is tried.
    pub fn synced(&self) -> bool {
        self.slices.synced && self.classes.synced && self.claims.synced
    }

    /// The DeviceClass serving each of `resources` that one serves (KEP-5004): the class whose
    /// `extendedResourceName` it is, or the class its implicit name
    /// (`deviceclass.resource.kubernetes.io/<class>`) names.
    pub fn classes_for<'r>(&self, resources: impl Iterator<Item = &'r str>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for resource in resources {
            let explicit = self
                .classes
                .objects
                .values()
                .find(|c| c.spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()) == Some(resource));
            let class = match explicit {
                Some(c) => c.name_any(),
                None => match resource.strip_prefix("deviceclass.resource.kubernetes.io/") {
                    Some(name) if self.classes.objects.contains_key(name) => name.to_string(),
                    _ => continue,
                },
            };
            out.insert(resource.to_string(), class);
        }
        out
    }

    /// The claim already made for the extended resources of pod `uid` in `namespace` (by this
    /// scheduler before a restart, or by kube-scheduler): the one with the annotation whose
    /// controller is the pod.
    pub fn made_claim_of(&self, namespace: &str, uid: &str) -> Option<String> {
        self.claims.objects.values().find_map(|c| {
            let meta = &c.metadata;
            let annotated =
                meta.annotations.as_ref().and_then(|a| a.get(extended::CLAIM_ANNOTATION)).is_some_and(|v| v == "true");
            let owned = meta.owner_references.iter().flatten().any(|o| o.controller == Some(true) && o.uid == uid);
            (annotated && owned && meta.namespace.as_deref() == Some(namespace)).then(|| c.name_any())
        })
    }

    /// A claim was created for a pod (its `placeholder` key until now): what is held for it,
    /// until the watch shows it, is held under its real name.
    pub fn created(&mut self, namespace: &str, placeholder: &str, name: &str) {
        let placeholder = format!("{namespace}/{placeholder}");
        if let Some(a) = self.pending.remove(&placeholder) {
            let key = format!("{namespace}/{name}");
            if self.claims.objects.get(&key).is_none_or(|c| allocation(c).is_none()) {
                self.pending.insert(key.clone(), a);
            }
            self.rehold(&placeholder);
            self.rehold(&key);
        }
    }

    /// `(usable, held, refused)`: devices in complete pools, devices claims hold, and pools or
    /// devices of the slices left out (each logged once with why).
    pub fn counts(&mut self) -> (usize, usize, usize) {
        let usable = self.allocator().inventory().devices().len();
        (usable, self.holds.devices(), self.refused.len())
    }

    /// What changed since the last call that may let a waiting pod be placed.
    pub fn take_woken(&mut self) -> Woken {
        std::mem::take(&mut self.woke)
    }

    /// A ResourceSlice changed: the devices are assembled again on next use.
    pub fn slice_event(&mut self, event: Event<ResourceSlice>) {
        if self.slices.on_event(event).is_none_or(|c| !c.is_empty()) {
            self.allocator = None;
            self.woke.devices = true;
        }
    }

    /// A DeviceClass changed: the selectors are compiled again on next use.
    pub fn class_event(&mut self, event: Event<DeviceClass>) {
        if self.classes.on_event(event).is_none_or(|c| !c.is_empty()) {
            self.allocator = None;
            self.woke.devices = true;
        }
    }

    /// A DeviceTaintRule changed: the devices are assembled again, with its taints, on next use.
    pub fn taint_rule_event(&mut self, event: Event<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>) {
        if self.taint_rules.on_event(event).is_none_or(|c| !c.is_empty()) {
            self.allocator = None;
            self.woke.devices = true;
        }
    }

    /// A ResourceClaim changed: its devices are held or freed, a pod waiting for it may go on.
    pub fn claim_event(&mut self, event: Event<ResourceClaim>) {
        let changes = self.claims.on_event(event);
        let Some(changes) = changes else {
            // A re-list: what was pending and is now shown is no longer pending.
            let claims = &self.claims.objects;
            self.pending.retain(|k, _| claims.get(k).is_some_and(|c| allocation(c).is_none()));
            self.holds_stale = true;
            self.woke.devices = true;
            return;
        };
        for (before, after) in changes {
            let held_before = before.as_ref().is_some_and(|c| allocation(c).is_some());
            let held_after = after.as_ref().is_some_and(|c| allocation(c).is_some());
            // Freed devices, or a claim a pod waits for now exists.
            self.woke.devices |= held_before && !held_after;
            self.woke.claims |= before.is_none();
            let Some(key) = after.as_ref().or(before.as_ref()).map(|c| key_of(&c.metadata)) else { continue };
            if held_after || after.is_none() {
                self.pending.remove(&key);
            }
            self.rehold(&key);
        }
    }

    /// Holds exactly the devices claim `key` has now — its allocation as the watch shows it, else
    /// the one being written — one claim at a time, so a claim written costs its own devices, not
    /// a count of every claim's.
    fn rehold(&mut self, key: &str) {
        let now: Vec<DeviceId> = match self.claims.objects.get(key).and_then(allocation) {
            Some(a) => holds::held_devices(a),
            None => self.pending.get(key).map(holds::pending_devices).unwrap_or_default(),
        };
        let Some(moved) = self.holds.set(key, now.clone()) else { return };
        if let Some(a) = self.allocator.as_mut() {
            for id in &moved.freed {
                a.release_device(id);
            }
            for id in now {
                a.hold_device(id);
            }
        }
        for id in &moved.touched {
            match self.homes.node_of(id) {
                Some(Some(node)) => self.changed.node(node),
                Some(None) => self.changed.any(),
                // Not a device of a complete pool: no node counts it.
                None => {}
            }
        }
        self.shapes.clear();
    }

    /// A node's labels, for the node selectors of pools and allocations.
    pub fn apply_node(&mut self, node: &Node) {
        let name = node.name_any();
        let labels = node.metadata.labels.clone();
        if self.nodes.get(&name).is_some_and(|n| n.metadata.labels == labels) {
            return;
        }
        let bare = Node {
            metadata: ObjectMeta { name: Some(name.clone()), labels, ..Default::default() },
            ..Default::default()
        };
        self.nodes.insert(name, bare);
        self.shapes.clear();
        self.changed.any();
        self.woke.devices = true;
    }

    /// A node left.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.shapes.clear();
    }

    /// The nodes whose devices, or the holds on them, changed since the last call (`None`: any
    /// may have): the ones whose [`Dra::devices_on`] the dashboard must read again.
    pub fn take_shown_changes(&mut self) -> Option<Vec<String>> {
        self.allocator();
        self.changed.take_shown()
    }

    /// Nodes with local devices.
    pub fn device_node_names(&mut self) -> Vec<String> {
        self.allocator();
        self.homes.nodes().cloned().collect()
    }

    /// `node`'s local devices, with the claims that hold each (for the dashboard).
    pub fn devices_on(&mut self, node: &str) -> Vec<NodeDevice> {
        self.allocator();
        let (Some(allocator), Some(indexes)) = (&self.allocator, self.homes.on_node(node)) else {
            return Vec::new();
        };
        let devices = allocator.inventory().devices();
        indexes
            .iter()
            .filter_map(|&i| devices.get(i))
            .map(|d| NodeDevice {
                model: d.string_attribute("productName").map(str::to_owned),
                kind: d.string_attribute("type").map(str::to_owned),
                profile: d.string_attribute("profile").map(str::to_owned),
                held_by: self.holds.holders(&d.id).to_vec(),
                id: d.id.clone(),
            })
            .collect()
    }

    /// The allocator with the devices held right now.
    fn allocator(&mut self) -> &mut Allocator {
        let allocator = self.allocator.get_or_insert_with(|| {
            let (mut inventory, refusals) = Inventory::from_slices(self.slices.objects.values());
            inventory.apply_taint_rules(self.taint_rules.objects.values());
            let now: BTreeSet<String> = refusals.iter().map(|r| format!("{}: {}", r.what, r.reason)).collect();
            for r in now.difference(&self.refused) {
                tracing::warn!(refusal = %r, "DRA: leaving out devices that cannot be used");
            }
            self.refused = now;
            self.holds_stale = true;
            self.changed.any();
            self.homes = holds::Homes::of(&inventory);
            Allocator::new(inventory, self.classes.objects.values().cloned())
        });
        if std::mem::take(&mut self.holds_stale) {
            self.shapes.clear();
            allocator.hold_only(self.claims.objects.values(), self.pending.values());
            self.holds = holds::Holds::of(&self.claims.objects, &self.pending);
            self.changed.any();
        }
        allocator
    }

    /// The claims of a pod in `namespace`: each with its object, or why it cannot be used yet.
    fn resolve(
        &self,
        namespace: &str,
        claims: &[ClaimRef],
        made: Option<&ResourceClaim>,
    ) -> Result<Vec<(String, ResourceClaim)>, String> {
        let mut out = Vec::new();
        if let Some(claim) = made {
            out.push((key_of(&claim.metadata), claim.clone()));
        }
        for c in claims {
            let Some(name) = &c.claim else {
                let template = c.template.as_deref().unwrap_or("?");
                return Err(format!(
                    "waiting for the ResourceClaim of {:?} (from template {namespace}/{template}) to be created",
                    c.name
                ));
            };
            let key = format!("{namespace}/{name}");
            let Some(claim) = self.claims.objects.get(&key) else {
                return Err(format!("waiting for ResourceClaim {key} to exist"));
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return Err(format!("ResourceClaim {key} is being deleted"));
            }
            if claim.status.as_ref().and_then(|s| s.reserved_for.as_ref()).is_some_and(|r| r.len() >= RESERVED_FOR_MAX)
            {
                return Err(format!("ResourceClaim {key} is reserved for {RESERVED_FOR_MAX} pods already"));
            }
            out.push((key, claim.clone()));
        }
        Ok(out)
    }

    /// The node selector of `claim`'s allocation, if it has one (written, or being written here).
    fn allocated(&self, key: &str, claim: &ResourceClaim) -> Option<Option<k8s_openapi::api::core::v1::NodeSelector>> {
        match allocation(claim) {
            Some(a) => Some(a.node_selector.clone()),
            None => self.pending.get(key).map(|a| a.node_selector.as_deref().cloned()),
        }
    }

    /// Where a pod's claims can go among `candidates`: the nodes where they can all be allocated
    /// now (`now: true`); when there are none, the nodes whose devices could serve them were
    /// some freed (`now: false`: preemption may free them, and the class counts the core sees
    /// say how many are held). Claims allocated already go where their allocation allows. `Err`:
    /// no node could ever serve them, or a claim is missing or malformed, with why.
    pub fn feasible_nodes<'n>(
        &mut self,
        namespace: &str,
        claims: &[ClaimRef],
        made: Option<&ResourceClaim>,
        candidates: impl Iterator<Item = &'n str>,
    ) -> Result<Feasible, String> {
        let resolved = self.resolve(namespace, claims, made)?;
        let candidates: Vec<&str> = candidates.collect();
        let fixed: Vec<_> = resolved.iter().filter_map(|(k, c)| Some((k.clone(), self.allocated(k, c)?))).collect();
        let open: Vec<&ResourceClaim> =
            resolved.iter().filter(|(k, c)| self.allocated(k, c).is_none()).map(|(_, c)| c).collect();
        let empty = ResourceClaimSpec::default();
        let allocator = self.allocator();
        let mut prepared = Vec::new();
        for c in &open {
            match allocator.prepare(c.spec.as_ref().unwrap_or(&empty)) {
                Ok(p) => prepared.push(p),
                Err(e) => return Err(format!("ResourceClaim {}: {e}", key_of(&c.metadata))),
            }
        }
        // Pods of one shape (claims from one template, say) get one answer while the devices and
        // their holds stay as they are: a backlog of them costs one scan of the nodes, not one each.
        let shape = {
            use std::hash::{BuildHasher, Hash, Hasher};
            let specs: Vec<_> = open.iter().map(|c| &c.spec).collect();
            let mut h = self.shapes.hasher().build_hasher();
            serde_json::to_string(&(specs, &fixed)).unwrap_or_default().hash(&mut h);
            candidates.hash(&mut h);
            h.finish()
        };
        if let Some(answer) = self.shapes.get(&shape) {
            return answer.clone();
        }
        let nodes: Vec<Node> = candidates.iter().filter_map(|n| self.nodes.get(*n).cloned()).collect();
        let Some(allocator) = self.allocator.as_mut() else { return Err("no DRA devices".into()) };
        // The first alternative of each `firstAvailable` request: nodes that can give every one
        // its first choice are preferred, as kube-scheduler scores them.
        let first_choices: BTreeSet<String> = open
            .iter()
            .copied()
            .flat_map(|c| c.spec.iter().flat_map(|s| &s.devices).flat_map(|d| d.requests.iter().flatten()))
            .filter_map(|r| Some(format!("{}/{}", r.name, r.first_available.as_ref()?.first()?.name)))
            .collect();
        let mut reasons = Vec::new();
        for only_free in [true, false] {
            let mut why: BTreeMap<String, usize> = BTreeMap::new();
            let mut feasible = Vec::new();
            let mut preferred = Vec::new();
            for node in &nodes {
                if let Some((key, _)) =
                    fixed.iter().find(|(_, sel)| sel.as_ref().is_some_and(|s| !node_selector::matches(s, node)))
                {
                    *why.entry(format!("ResourceClaim {key} is allocated to other nodes")).or_default() += 1;
                    continue;
                }
                match together(allocator, &prepared, node, only_free) {
                    Ok(made) => {
                        let chosen = made.iter().flat_map(|a| &a.results).map(|(request, _, _)| request);
                        if chosen.filter(|r| r.contains('/')).all(|r| first_choices.contains(r)) {
                            preferred.push(node.name_any());
                        }
                        feasible.push(node.name_any());
                    }
                    Err(e) => *why.entry(e.to_string()).or_default() += 1,
                }
            }
            if !feasible.is_empty() {
                if preferred.len() == feasible.len() {
                    preferred.clear();
                }
                let not_now = reasons.first().map(|why| summary(why, nodes.len()));
                let answer = Ok(Feasible { nodes: feasible, preferred, now: only_free, not_now });
                self.shapes.insert(shape, answer.clone());
                return answer;
            }
            reasons.push(why);
        }
        // Why not now says more (how many devices are free) than why never, unless it is never.
        let why = reasons.pop().unwrap_or_default();
        let answer = Err(summary(&why, nodes.len()));
        self.shapes.insert(shape, answer.clone());
        answer
    }

    /// What a running pod's allocated claims hold of each DeviceClass: `(claim, [(resource name,
    /// devices)])`, for the core to count as the pod's own when it takes the pod over.
    pub fn held(&self, namespace: &str, claims: &[ClaimRef]) -> Vec<(String, Vec<(wasmsched_api::ResourceName, u64)>)> {
        let Ok(resolved) = self.resolve(namespace, claims, None) else { return Vec::new() };
        resolved
            .iter()
            .filter_map(|(key, claim)| {
                let held = wasmsched_dra::held_by_class(claim.spec.as_ref()?, allocation(claim)?);
                (!held.is_empty()).then(|| (key.clone(), held))
            })
            .collect()
    }

    /// What a pod's claims not allocated yet ask of each DeviceClass, as the core counts it:
    /// `(claim, [(resource name, devices)])`: exact counts, and for `firstAvailable` alternatives
    /// of one class the smallest of their counts. `All`, and alternatives across classes, are
    /// checked when the claim is allocated, not counted. Admin access holds nothing.
    pub fn requests(
        &self,
        namespace: &str,
        claims: &[ClaimRef],
        made: Option<&ResourceClaim>,
    ) -> Vec<(String, Vec<(wasmsched_api::ResourceName, u64)>)> {
        let Ok(resolved) = self.resolve(namespace, claims, made) else { return Vec::new() };
        let mut out = Vec::new();
        for (key, claim) in &resolved {
            if self.allocated(key, claim).is_some() {
                continue;
            }
            let wants = claim.spec.as_ref().map(wasmsched_dra::class_counts).unwrap_or_default();
            if !wants.is_empty() {
                out.push((key.clone(), wants));
            }
        }
        out
    }

    /// Per DeviceClass with devices usable from `node`: `(resource name, devices, held)`, where
    /// held leaves out the devices of a claim `counted_by_core(claim, resource)` says the core
    /// counts under that resource (through the requests of the tasks it placed). A device of two
    /// classes is held in the other class's count too: the core counted it under one.
    pub fn capacity(
        &mut self,
        node: &str,
        counted_by_core: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<(wasmsched_api::ResourceName, u64, u64)> {
        let Some(node) = self.nodes.get(node).cloned() else { return Vec::new() };
        self.allocator();
        let holds = &self.holds;
        let Some(allocator) = self.allocator.as_mut() else { return Vec::new() };
        allocator
            .class_devices(&node)
            .into_iter()
            .map(|(class, ids)| {
                let resource = class_resource(&class);
                let held =
                    ids.iter().filter(|id| holds.holders(id).iter().any(|c| !counted_by_core(c, &resource))).count();
                (resource, ids.len() as u64, held as u64)
            })
            .collect()
    }

    /// The nodes whose devices, or the holds on them, changed since the last call (`None`: any
    /// may have): what [`Dra::capacity`] says of them may have changed.
    pub fn take_changed_nodes(&mut self) -> Option<Vec<String>> {
        self.allocator();
        self.changed.take_counted()
    }

    /// The writes that give a pod its claims on `node`, with their devices held from now on; or
    /// why `node` cannot serve them now (nothing is held then).
    pub fn reserve(
        &mut self,
        namespace: &str,
        claims: &[ClaimRef],
        to_make: Option<&MadeClaim>,
        node: &str,
        mut rank: Option<&mut wasmsched_dra::allocator::Rank<'_>>,
    ) -> Result<Vec<ClaimWrite>, String> {
        let resolved = self.resolve(namespace, claims, to_make.map(|m| &m.claim))?;
        let Some(node_obj) = self.nodes.get(node).cloned() else {
            return Err(format!("node {node} is gone"));
        };
        let mut writes = Vec::new();
        let mut made: Vec<(String, Allocation)> = Vec::new();
        let mut failure = None;
        for (key, claim) in &resolved {
            let name = claim.name_any();
            if let Some(selector) = self.allocated(key, claim) {
                if selector.as_ref().is_some_and(|s| !node_selector::matches(s, &node_obj)) {
                    failure = Some(format!("ResourceClaim {key} is allocated to other nodes than {node}"));
                    break;
                }
                let after_ours = allocation(claim).is_none();
                writes.push(ClaimWrite {
                    namespace: namespace.into(),
                    name,
                    allocation: None,
                    after_ours,
                    create: None,
                    seen: Some(claim.clone()).filter(|_| !after_ours),
                });
                continue;
            }
            let allocator = self.allocator();
            match allocator.allocate_ranked(
                claim.spec.as_ref().unwrap_or(&ResourceClaimSpec::default()),
                &node_obj,
                rank.as_deref_mut(),
            ) {
                Ok(a) => {
                    allocator.hold(&a, true);
                    let create = to_make.filter(|m| key_of(&m.claim.metadata) == *key).cloned();
                    let seen = create.is_none().then(|| claim.clone());
                    writes.push(ClaimWrite {
                        namespace: namespace.into(),
                        name,
                        allocation: Some(a.to_status()),
                        after_ours: false,
                        create,
                        seen,
                    });
                    made.push((key.clone(), a));
                }
                Err(e) => {
                    failure = Some(format!("ResourceClaim {key} on {node}: {e}"));
                    break;
                }
            }
        }
        if let Some(reason) = failure {
            // Counted again from the claims: a device several claims may share stays held.
            self.holds_stale = true;
            return Err(reason);
        }
        for (key, a) in made {
            self.pending.insert(key.clone(), a);
            self.rehold(&key);
        }
        Ok(writes)
    }

    /// Writes that did not happen (the claim write or the bind failed): their devices are free
    /// again, and pods waiting on devices are tried again.
    pub fn release(&mut self, writes: &[ClaimWrite]) {
        if self.forget(writes) {
            self.woke.devices = true;
        }
    }

    /// Reservations of this cycle taken back before any was written (another member of the same
    /// workload could not be served): nothing was freed that anyone waited for. Whether any
    /// allocation was forgotten.
    pub fn forget(&mut self, writes: &[ClaimWrite]) -> bool {
        let mut freed = false;
        for w in writes.iter().filter(|w| w.allocation.is_some()) {
            let mut keys = vec![format!("{}/{}", w.namespace, w.name)];
            // A claim to be made is held under its placeholder (it may have been named since).
            if let Some(placeholder) = w.create.as_ref().and_then(|m| m.claim.metadata.name.as_ref()) {
                keys.push(format!("{}/{placeholder}", w.namespace));
            }
            for key in keys {
                if self.pending.remove(&key).is_some() {
                    freed = true;
                    self.rehold(&key);
                }
            }
        }
        freed
    }
}

/// `status.allocation` of a claim.
fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

/// `task` restricted to where its claims can go, among `all` the cluster's nodes: a requirement
/// on the node's name in every required node-affinity term (a new term when it has none) —
/// none when every node will do, `NotIn` the others when they are fewer (every filter call reads
/// the list: a short one keeps a large cluster's filters cheap) — and the nodes that give
/// `firstAvailable` requests their first choice as a preferred term of the heaviest weight.
pub fn restrict_to<'a>(task: &mut Task, feasible: Feasible, all: impl Iterator<Item = &'a str>) {
    let feasible_set: AHashSet<&str> = feasible.nodes.iter().map(String::as_str).collect();
    let others: Vec<String> = all.filter(|n| !feasible_set.contains(n)).map(String::from).collect();
    if !feasible.preferred.is_empty() {
        let requirement = names(SelectorOperator::In, feasible.preferred);
        let preference = NodeSelectorTerm { match_expressions: Vec::new(), match_fields: vec![requirement] };
        task.node_affinity.preferred.push(PreferredTerm { weight: MAX_PREFERRED_WEIGHT, preference });
    }
    match others.len() {
        0 => {}
        n if n < feasible.nodes.len() => require(task, names(SelectorOperator::NotIn, others)),
        _ => require(task, names(SelectorOperator::In, feasible.nodes)),
    }
}

/// `task` kept off `nodes`.
pub fn avoid(task: &mut Task, nodes: Vec<String>) {
    require(task, names(SelectorOperator::NotIn, nodes));
}

/// A requirement on the node's name.
fn names(operator: SelectorOperator, mut values: Vec<String>) -> SelectorRequirement {
    values.sort();
    SelectorRequirement { key: NODE_NAME_FIELD.to_string(), operator, values }
}

/// `requirement` ANDed into every required node-affinity term of `task` (a new term when it has none).
fn require(task: &mut Task, requirement: SelectorRequirement) {
    let terms = &mut task.node_affinity.required;
    if terms.is_empty() {
        terms.push(NodeSelectorTerm { match_expressions: Vec::new(), match_fields: vec![requirement] });
    } else {
        for t in terms.iter_mut() {
            t.match_fields.push(requirement.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }

    /// One node of four devices, three of them held by another claim.
    fn cluster() -> Dra {
        let mut dra = Dra::default();
        dra.apply_node(&object(json!({"metadata": {"name": "n1"}})));
        let devices: Vec<_> = (0..4).map(|i| json!({"name": format!("d{i}")})).collect();
        dra.slice_event(Event::Apply(object(json!({"metadata": {"name": "s"}, "spec": {
            "driver": "x.example.com", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices}}))));
        dra.class_event(Event::Apply(object(json!({"metadata": {"name": "x"}, "spec": {}}))));
        let results: Vec<_> = (0..3)
            .map(|i| json!({"request": "r", "driver": "x.example.com", "pool": "n1", "device": format!("d{i}")}))
            .collect();
        dra.claim_event(Event::Apply(object(json!({"metadata": {"name": "held", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x", "count": 3}}]}},
            "status": {"allocation": {"devices": {"results": results}}}}))));
        for (name, n) in [("big", 4), ("small", 2)] {
            dra.claim_event(Event::Apply(object(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "x", "count": n}}]}}}))));
        }
        dra
    }

    fn claim(name: &str) -> Vec<ClaimRef> {
        vec![ClaimRef { name: "c".into(), claim: Some(name.into()), template: None }]
    }

    #[test]
    fn looking_where_a_claim_could_go_if_devices_were_freed_frees_none() {
        let mut dra = cluster();
        let big = dra.feasible_nodes("ns", &claim("big"), None, ["n1"].into_iter()).unwrap();
        assert_eq!((big.nodes.as_slice(), big.now), (["n1".to_string()].as_slice(), false), "only were devices freed");
        // The other claim's three devices are still held: two are not free now, anywhere.
        let small = dra.feasible_nodes("ns", &claim("small"), None, ["n1"].into_iter()).unwrap();
        assert!(!small.now, "{small:?}");
        let refused = dra.reserve("ns", &claim("small"), None, "n1", None).unwrap_err();
        assert!(refused.contains("1 free"), "{refused}");
        // Nor does a refused reservation free what others hold.
        assert!(dra.reserve("ns", &claim("small"), None, "n1", None).is_err());
    }
}
