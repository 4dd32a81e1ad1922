//! The allocator: devices for a claim's requests on one node, with kube-scheduler's
//! structured-parameters semantics — `exactly` (a count, or `All`; admin access) and
//! `firstAvailable` (alternatives in order of preference), device-class and request selectors in
//! CEL, and `matchAttribute`/`distinctAttribute` constraints across requests, searched depth first
//! with backtracking.

use std::collections::BTreeMap;

use ahash::AHashMap as HashMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelector};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClaimConfiguration, DeviceClass,
    DeviceConstraint, DeviceRequestAllocationResult, DeviceSelector, DeviceTaint, DeviceToleration, ResourceClaim,
    ResourceClaimSpec,
};

use wasmsched_api::{AttributeValue, ClaimDevice, ClaimRequest};

use crate::inventory::{Attribute, DeviceId, Inventory, Reach};
use crate::node_selector;
use crate::selector::{DeviceValue, Environment, Footprints, Selector, SelectorError, Selectors};
use crate::topology::{CLIQUE_LABEL, DeviceTopology};

/// The most search steps one claim on one node may take: a claim whose constraints no device set
/// meets gives up here with a reason instead of trying every combination.
pub const MAX_STEPS: usize = 100_000;

/// Devices for a claim: one result per device, in request order.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// (request name — `request/subrequest` for a `firstAvailable` choice —, device, admin access).
    pub results: Vec<(String, DeviceId, bool)>,
    /// The nodes a pod using the claim may run on (`None`: any). Shared: a node's own selector is
    /// made once, not per allocation.
    pub node_selector: Option<Arc<NodeSelector>>,
    /// The drivers' configuration of the devices, as kube-scheduler copies it into the allocation
    /// (the kubelet plugin reads it from there, not from the claim's spec): each class's config
    /// (source `FromClass`, naming the requests that chose the class), then the claim's own
    /// (`FromClaim`) that apply to a request or to the alternative it got.
    pub config: Vec<DeviceAllocationConfiguration>,
    /// Each result's device's place in the inventory that allocated it: holding it then needs no
    /// lookup by id (the place is checked against the id, since the inventory may have been
    /// rebuilt from new slices since).
    places: Vec<usize>,
}

impl Allocation {
    /// The claim's `status.allocation`.
    pub fn to_status(&self) -> AllocationResult {
        AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    self.results
                        .iter()
                        .map(|(request, id, admin)| DeviceRequestAllocationResult {
                            request: request.clone(),
                            driver: id.driver.to_string(),
                            pool: id.pool.to_string(),
                            device: id.device.to_string(),
                            admin_access: admin.then_some(true),
                            ..Default::default()
                        })
                        .collect(),
                ),
                config: (!self.config.is_empty()).then(|| self.config.clone()),
            }),
            node_selector: self.node_selector.as_deref().cloned(),
            allocation_timestamp: None,
        }
    }
}

/// How many of the node's devices got how far for one request: what a person needs to see why it
/// could not be met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Funnel {
    /// Devices usable from the node.
    pub on_node: usize,
    /// Of those, devices the class's selectors accept.
    pub of_class: usize,
    /// Of those, devices the request's own selectors accept.
    pub selected: usize,
    /// Of those, devices with a taint the request does not tolerate.
    pub tainted: usize,
    /// Of those, devices no other claim holds (and not tainted).
    pub free: usize,
}

impl fmt::Display for Funnel {
    /// How a person reads it: `8 device(s), 8 of the class, 4 selected, 0 free`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} device(s), {} of the class, {} selected", self.on_node, self.of_class, self.selected)?;
        if self.tainted > 0 {
            write!(f, ", {} with a taint it does not tolerate", self.tainted)?;
        }
        write!(f, ", {} free", self.free)
    }
}

/// Why a claim cannot be allocated on a node.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Unsatisfied {
    /// The claim itself is malformed.
    #[error("request {request}: {reason}")]
    Invalid {
        /// The request.
        request: String,
        /// What is wrong.
        reason: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error("request {request}: device class {class:?} does not exist")]
    NoClass {
        /// The request.
        request: String,
        /// The class.
        class: String,
    },
    /// A selector failed to compile or to run.
    #[error("request {request}: {error}")]
    Selector {
        /// The request.
        request: String,
        /// The failure.
        error: SelectorError,
    },
    /// Not enough devices pass the request's class, selectors and availability.
    #[error("request {request}: needs {wanted} device(s) of class {class}; on this node {funnel}")]
    TooFew {
        /// The request (or its last alternative).
        request: String,
        /// The class.
        class: String,
        /// How many it wants (`all` for allocation mode All).
        wanted: String,
        /// How far the node's devices got.
        funnel: Funnel,
    },
    /// Enough devices, but no set of them meets the claim's constraints.
    #[error("no set of devices meets constraint {0}")]
    Constraint(String),
    /// The search took [`MAX_STEPS`] steps without an answer.
    #[error("no allocation found within {MAX_STEPS} search steps (constraints over many devices)")]
    TooManySteps,
}

/// One way to satisfy a request: the request itself (`exactly`) or one of its alternatives, with
/// its selectors compiled.
#[derive(Debug)]
struct Alternative {
    /// Name in results: `request` or `request/subrequest`.
    name: String,
    /// The request's own name (constraints name it).
    request: String,
    class: String,
    /// The class's selectors and the request's, as indices of the allocator's verdict tables.
    class_selectors: Vec<usize>,
    selectors: Vec<usize>,
    count: Option<usize>,
    admin: bool,
    /// The request's tolerations of device taints.
    tolerations: Vec<DeviceToleration>,
}

/// An alternative with the devices a node offers it.
struct Want<'p> {
    alt: &'p Alternative,
    /// Candidate devices (indices into the inventory) on the node, in order.
    candidates: Vec<usize>,
}

/// A selector's answers on the devices, by place in the inventory: a byte each (`UNASKED`,
/// `REJECTS`, `ACCEPTS`, `FAILED`), the failures' errors aside. Each device once had an
/// `Option<Result<bool, SelectorError>>` of ~170 bytes: 7 MB per selector at 40,000 devices, every
/// page of it touched when a claim first named the selector (`wasmsched bench --dra`).
struct Verdicts {
    selector: Arc<Selector>,
    answers: Vec<u8>,
    failures: HashMap<usize, SelectorError>,
    /// Answers by what devices show the selector ([`Selector::seen`]).
    by_seen: Footprints,
}

const UNASKED: u8 = 0;
const REJECTS: u8 = 1;
const ACCEPTS: u8 = 2;
const FAILED: u8 = 3;

/// A policy's order of a request's candidate devices (indexes, most wanted first); `None`: no
/// preference.
pub type Rank<'r> = dyn FnMut(&ClaimRequest) -> Option<Vec<u32>> + 'r;

/// A claim checked and its selectors compiled once, to be tried on many nodes (what
/// kube-scheduler's PreFilter does before Filter runs per node).
pub struct PreparedClaim<'c> {
    requests: Vec<Vec<Alternative>>,
    rules: Vec<Rule<'c>>,
    config: &'c [DeviceClaimConfiguration],
}

/// A constraint in the form the search checks.
struct Rule<'c> {
    requests: &'c [String],
    attribute: &'c str,
    distinct: bool,
}

impl Rule<'_> {
    /// How a person reads it (only built when it cannot be met).
    fn text(&self) -> String {
        let kind = if self.distinct { "distinctAttribute" } else { "matchAttribute" };
        let scope = if self.requests.is_empty() { "all requests".to_string() } else { self.requests.join(", ") };
        format!("{kind} {} over {scope}", self.attribute)
    }
}

/// The allocator over one cluster's devices and classes.
pub struct Allocator {
    inventory: Inventory,
    /// Node-local devices, by node (looked up once per claim and node), and the others
    /// (selector-reached or everywhere): a claim on a node looks at its own devices only, not the
    /// whole cluster's.
    by_node: HashMap<String, Local>,
    not_local: Vec<usize>,
    /// Each device's CEL value, built the first time a selector is evaluated on it (with
    /// footprints, most devices never need one).
    values: Vec<Option<DeviceValue>>,
    classes: HashMap<String, DeviceClass>,
    env: Environment,
    selectors: Selectors,
    /// Per compiled selector, its verdict on each device: a device's attributes never change, so
    /// each selector runs at most once per device. A claim finds its tables when it is prepared
    /// (`table_of`), so trying it on a node is plain indexing.
    verdicts: Vec<Verdicts>,
    /// A compiled selector's table, by the selector's address (`selectors` keeps each alive).
    table_of: HashMap<usize, usize>,
}

/// What a claim on one node may use.
struct Reachable {
    /// Places in the inventory of the devices usable from the node, in inventory order.
    devices: Vec<usize>,
    /// The node's own devices as a topology, made with its current clique label.
    topology: Option<Arc<DeviceTopology>>,
    /// The node selector naming the node, when it has devices of its own.
    selector: Option<Arc<NodeSelector>>,
}

/// One node's own devices.
struct Local {
    /// Places in the inventory, in inventory order.
    devices: Vec<usize>,
    /// The devices as a topology, with the node's clique label it was built with: made with the
    /// allocator (devices never move, so it lasts as long as the inventory), made again if the
    /// node's label changes.
    clique: Option<String>,
    topology: Option<Arc<DeviceTopology>>,
    /// The node selector of an allocation of its devices (the node by name).
    selector: Arc<NodeSelector>,
}

impl Allocator {
    /// An allocator over `inventory`'s devices and the cluster's `classes`.
    pub fn new(inventory: Inventory, classes: impl IntoIterator<Item = DeviceClass>) -> Allocator {
        let values = vec![None; inventory.devices().len()];
        let mut by_node: HashMap<String, Local> = HashMap::default();
        let mut not_local = Vec::new();
        for (i, d) in inventory.devices().iter().enumerate() {
            match &d.reach {
                Reach::Node(n) => {
                    let local = by_node.entry(n.clone());
                    let selector = || Arc::new(node_selector::for_node(n));
                    let local = local.or_insert_with(|| Local {
                        devices: Vec::new(),
                        clique: None,
                        topology: None,
                        selector: selector(),
                    });
                    local.devices.push(i)
                }
                _ => not_local.push(i),
            }
        }
        let classes = classes.into_iter().filter_map(|c| Some((c.metadata.name.clone()?, c))).collect();
        // Each node's devices as a topology, made now (as the devices are): the first claims
        // on each node would otherwise pay for it. A node labelled with an NVLink clique has
        // its own made again on first use.
        let devices = inventory.devices();
        for local in by_node.values_mut() {
            local.topology = DeviceTopology::new(local.devices.iter().map(|&i| (i, &devices[i])), None).map(Arc::new);
        }
        Allocator {
            inventory,
            by_node,
            not_local,
            values,
            classes,
            env: Environment::default(),
            selectors: Selectors::default(),
            verdicts: Vec::new(),
            table_of: HashMap::default(),
        }
    }

    /// The devices and which are held.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Mark an allocation's devices as held (after it was written), or release them.
    pub fn hold(&mut self, allocation: &Allocation, held: bool) {
        for (k, (_, id, admin)) in allocation.results.iter().enumerate() {
            if *admin {
                continue;
            }
            let devices = self.inventory.devices();
            match allocation.places.get(k).filter(|&&i| devices.get(i).is_some_and(|d| d.id == *id)) {
                Some(&i) => self.inventory.set_held_at(i, held),
                None if held => self.inventory.hold(id.clone()),
                None => self.inventory.release(id),
            }
        }
    }

    /// Hold one device (a tentative allocation being tried).
    pub fn hold_device(&mut self, id: DeviceId) {
        self.inventory.hold(id);
    }

    /// Release one device held with [`Allocator::hold_device`].
    pub fn release_device(&mut self, id: &DeviceId) {
        self.inventory.release(id);
    }

    /// Count as held exactly the devices `claims` have allocated plus `more` (allocations written
    /// and not seen yet): what a watch of the cluster's claims shows now. The verdict tables stay.
    pub fn hold_only<'a>(
        &mut self,
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
        more: impl IntoIterator<Item = &'a Allocation>,
    ) {
        self.inventory.release_all();
        self.inventory.hold_allocated(claims);
        for allocation in more {
            self.hold(allocation, true);
        }
    }

    /// Devices for `claim` usable from `node`, or why there are none. Nothing is held: call
    /// [`Allocator::hold`] once the allocation is written.
    pub fn allocate(&mut self, claim: &ResourceClaimSpec, node: &Node) -> Result<Allocation, Unsatisfied> {
        let prepared = self.prepare(claim)?;
        self.allocate_prepared(&prepared, node)
    }

    /// [`Allocator::allocate`], asking `rank` (a policy's device-selection stage) for its order of
    /// each request's candidates where there is a choice: its picks are tried first, then the
    /// topology's order; constraints hold whatever the order. `rank` answering `None`, or no
    /// `rank` (a policy that does not rank: no request is built), leaves the host's order.
    pub fn allocate_ranked(
        &mut self,
        claim: &ResourceClaimSpec,
        node: &Node,
        rank: Option<&mut Rank<'_>>,
    ) -> Result<Allocation, Unsatisfied> {
        let prepared = self.prepare(claim)?;
        self.allocate_on(&prepared, node, true, true, rank)
    }

    /// Check `claim` and compile its selectors, once for any number of nodes: a malformed
    /// request, a missing class or a selector that does not compile is the same answer on every
    /// node.
    pub fn prepare<'c>(&mut self, claim: &'c ResourceClaimSpec) -> Result<PreparedClaim<'c>, Unsatisfied> {
        let mut requests = Vec::new();
        for request in claim.devices.iter().flat_map(|d| d.requests.iter().flatten()) {
            let shapes = match (&request.exactly, &request.first_available) {
                (Some(e), None) => vec![(
                    request.name.clone(),
                    &e.device_class_name,
                    e.selectors.as_deref().unwrap_or_default(),
                    e.allocation_mode.as_deref(),
                    e.count,
                    e.admin_access == Some(true),
                    e.tolerations.as_deref().unwrap_or_default(),
                )],
                (None, Some(subs)) if !subs.is_empty() => subs
                    .iter()
                    .map(|s| {
                        (
                            format!("{}/{}", request.name, s.name),
                            &s.device_class_name,
                            s.selectors.as_deref().unwrap_or_default(),
                            s.allocation_mode.as_deref(),
                            s.count,
                            false,
                            s.tolerations.as_deref().unwrap_or_default(),
                        )
                    })
                    .collect(),
                _ => {
                    return Err(Unsatisfied::Invalid {
                        request: request.name.clone(),
                        reason: "exactly one of `exactly` and a non-empty `firstAvailable` must be set".into(),
                    });
                }
            };
            let mut alternatives = Vec::new();
            for (name, class, selectors, mode, count, admin, tolerations) in shapes {
                let count = match mode.unwrap_or("ExactCount") {
                    "ExactCount" => match count.unwrap_or(1) {
                        n if n >= 1 => Some(n as usize),
                        n => {
                            return Err(Unsatisfied::Invalid {
                                request: name,
                                reason: format!("count {n} is below 1"),
                            });
                        }
                    },
                    "All" => None,
                    other => {
                        return Err(Unsatisfied::Invalid {
                            request: name,
                            reason: format!("allocation mode {other:?} is neither ExactCount nor All"),
                        });
                    }
                };
                let Some(class_spec) = self.classes.get(class) else {
                    return Err(Unsatisfied::NoClass { request: name, class: class.clone() });
                };
                let class_list = class_spec.spec.as_ref().and_then(|s| s.selectors.as_deref()).unwrap_or_default();
                let class_selectors = compile(&mut self.selectors, class_list, &name)?;
                let class_selectors = class_selectors.into_iter().map(|s| self.table(s)).collect();
                let selectors = compile(&mut self.selectors, selectors, &name)?;
                let selectors = selectors.into_iter().map(|s| self.table(s)).collect();
                alternatives.push(Alternative {
                    name,
                    request: request.name.clone(),
                    class: class.clone(),
                    class_selectors,
                    selectors,
                    count,
                    admin,
                    tolerations: tolerations.to_vec(),
                });
            }
            requests.push(alternatives);
        }
        let rules = rules(claim.devices.as_ref().and_then(|d| d.constraints.as_deref()).unwrap_or_default());
        let config = claim.devices.as_ref().and_then(|d| d.config.as_deref()).unwrap_or_default();
        Ok(PreparedClaim { requests, rules, config })
    }

    /// Devices for a prepared claim usable from `node`, or why there are none.
    pub fn allocate_prepared(&mut self, claim: &PreparedClaim, node: &Node) -> Result<Allocation, Unsatisfied> {
        self.allocate_on(claim, node, true, true, None)
    }

    /// Whether `node` can serve a prepared claim now, with devices that show it (not the set the
    /// topology ranks best: a scan over every node asks only whether, and skips that ranking).
    pub fn fits_now(&mut self, claim: &PreparedClaim, node: &Node) -> Result<Allocation, Unsatisfied> {
        self.allocate_on(claim, node, true, false, None)
    }

    /// Devices `node` could give a prepared claim if none were held: whether the node's devices
    /// can serve it at all (classes, selectors, counts, constraints), as for preemption.
    pub fn compatible(&mut self, claim: &PreparedClaim, node: &Node) -> Result<Allocation, Unsatisfied> {
        self.allocate_on(claim, node, false, false, None)
    }

    /// Per DeviceClass (by name), the devices usable from `node` that its selectors accept; a
    /// selector that fails on a device leaves that device out of the class.
    pub fn class_devices(&mut self, node: &Node) -> Vec<(String, Vec<DeviceId>)> {
        let on_node = self.on_node(node);
        let mut names: Vec<String> = self.classes.keys().cloned().collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let list = self.classes[&name].spec.as_ref().and_then(|s| s.selectors.clone()).unwrap_or_default();
            let Ok(compiled) = compile(&mut self.selectors, &list, &name) else { continue };
            let tables: Vec<usize> = compiled.into_iter().map(|s| self.table(s)).collect();
            let mut ids = Vec::new();
            for &i in &on_node {
                if self.all_match(&tables, i, &name).unwrap_or(false) {
                    ids.push(self.inventory.devices()[i].id.clone());
                }
            }
            if !ids.is_empty() {
                out.push((name, ids));
            }
        }
        out
    }

    /// What a claim on `node` may use, from one lookup of the node.
    fn reachable(&mut self, node: &Node) -> Reachable {
        let devices = self.inventory.devices();
        let mut on_node = Vec::new();
        let (mut topology, mut selector) = (None, None);
        if let Some(local) = node.metadata.name.as_deref().and_then(|n| self.by_node.get_mut(n)) {
            let clique = node.metadata.labels.as_ref().and_then(|l| l.get(CLIQUE_LABEL));
            if local.clique.as_ref() != clique {
                let placed = local.devices.iter().map(|&i| (i, &devices[i]));
                local.topology = DeviceTopology::new(placed, clique.map(String::as_str)).map(Arc::new);
                local.clique = clique.cloned();
            }
            on_node.extend_from_slice(&local.devices);
            topology = local.topology.clone();
            selector = Some(local.selector.clone());
        }
        on_node.extend(self.not_local.iter().filter(|&&i| devices[i].reachable_from(node)));
        // Inventory order (pools by driver and name, devices as published), as kube-scheduler
        // tries them (a node's own devices are listed in that order already).
        if !self.not_local.is_empty() {
            on_node.sort_unstable();
        }
        Reachable { devices: on_node, topology, selector }
    }

    /// The devices usable from `node`, in inventory order.
    fn on_node(&mut self, node: &Node) -> Vec<usize> {
        self.reachable(node).devices
    }

    fn allocate_on(
        &mut self,
        claim: &PreparedClaim,
        node: &Node,
        only_free: bool,
        ranked: bool,
        mut rank: Option<&mut Rank<'_>>,
    ) -> Result<Allocation, Unsatisfied> {
        let Reachable { devices: on_node, topology, selector } = self.reachable(node);
        let mut choices: Vec<Vec<Want>> = Vec::with_capacity(claim.requests.len());
        for alternatives in &claim.requests {
            let mut wants = Vec::new();
            let mut last_failure = None;
            for alt in alternatives {
                let (mut candidates, funnel) = self.candidates(alt, &on_node, only_free)?;
                // Of the free devices, the set the topology ranks best is tried first.
                if ranked
                    && !alt.admin
                    && let Some(n) = alt.count
                    && let Some(topology) = topology.as_deref()
                {
                    topology.order(&mut candidates, n);
                }
                // Then the policy's order, where it has a choice to make.
                if let (Some(rank), Some(n), false) = (rank.as_deref_mut(), alt.count, alt.admin)
                    && candidates.len() > n
                {
                    let devices = self.inventory.devices();
                    let request = ClaimRequest {
                        name: alt.name.clone(),
                        count: n as u32,
                        candidates: candidates.iter().map(|&i| claim_device(&devices[i])).collect(),
                    };
                    if let Some(order) = rank(&request) {
                        let mut first: Vec<usize> =
                            order.iter().filter_map(|&k| candidates.get(k as usize).copied()).collect();
                        first.dedup();
                        candidates.retain(|i| !first.contains(i));
                        first.append(&mut candidates);
                        candidates = first;
                    }
                }
                let enough = match alt.count {
                    Some(n) => candidates.len() >= n,
                    None => !candidates.is_empty() && candidates.len() == funnel.selected,
                };
                if enough {
                    wants.push(Want { alt, candidates });
                } else {
                    last_failure.get_or_insert_with(|| Unsatisfied::TooFew {
                        request: alt.name.clone(),
                        class: alt.class.clone(),
                        wanted: alt.count.map_or_else(|| "all".to_string(), |n| n.to_string()),
                        funnel,
                    });
                }
            }
            if wants.is_empty() {
                return Err(last_failure.expect("every alternative failed"));
            }
            choices.push(wants);
        }
        let mut search =
            Search { allocator: self, choices: &choices, rules: &claim.rules, picked: Vec::new(), steps: 0 };
        match search.run(0)? {
            Some(picked) => {
                let config = self.configuration(&picked, claim.config);
                Ok(Allocation { config, ..self.finish(picked, selector) })
            }
            None => Err(Unsatisfied::Constraint(claim.rules.iter().map(Rule::text).collect::<Vec<_>>().join(", "))),
        }
    }

    /// The configuration the allocation of `picked` carries (see [`Allocation::config`]).
    fn configuration(
        &self,
        picked: &[(&Want, usize)],
        claimed: &[DeviceClaimConfiguration],
    ) -> Vec<DeviceAllocationConfiguration> {
        // The alternative each request got, in request order.
        let mut chosen: Vec<&Alternative> = Vec::new();
        for (want, _) in picked {
            if chosen.last().is_none_or(|a| a.request != want.alt.request) {
                chosen.push(want.alt);
            }
        }
        let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut class_entries: BTreeMap<&str, std::ops::Range<usize>> = BTreeMap::new();
        for alt in &chosen {
            if let Some(range) = class_entries.get(alt.class.as_str()) {
                for entry in &mut out[range.clone()] {
                    entry.requests.get_or_insert_with(Vec::new).push(alt.name.clone());
                }
                continue;
            }
            let start = out.len();
            let class_config =
                self.classes.get(&alt.class).and_then(|c| c.spec.as_ref()).and_then(|s| s.config.as_deref());
            for c in class_config.unwrap_or_default() {
                out.push(DeviceAllocationConfiguration {
                    source: "FromClass".into(),
                    requests: Some(vec![alt.name.clone()]),
                    opaque: c.opaque.clone(),
                });
            }
            class_entries.insert(&alt.class, start..out.len());
        }
        for c in claimed {
            let named = c.requests.as_deref().unwrap_or_default();
            let applies =
                named.is_empty() || chosen.iter().any(|a| named.contains(&a.request) || named.contains(&a.name));
            if applies {
                out.push(DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: c.requests.clone(),
                    opaque: c.opaque.clone(),
                });
            }
        }
        out
    }

    /// The allocation of the devices `picked` on a node whose own devices `local` names.
    fn finish(&self, picked: Vec<(&Want, usize)>, local: Option<Arc<NodeSelector>>) -> Allocation {
        let devices = self.inventory.devices();
        let mut node_selector = None;
        for (_, i) in &picked {
            match &devices[*i].reach {
                // A device of the node's own is reached from it alone (`reachable`).
                Reach::Node(n) => {
                    node_selector = Some(local.clone().unwrap_or_else(|| Arc::new(node_selector::for_node(n))));
                }
                Reach::Selector(s) if node_selector.is_none() => node_selector = Some(Arc::new(s.clone())),
                _ => {}
            }
        }
        Allocation {
            places: picked.iter().map(|&(_, i)| i).collect(),
            results: picked
                .into_iter()
                .map(|(want, i)| (want.alt.name.clone(), devices[i].id.clone(), want.alt.admin))
                .collect(),
            node_selector,
            config: Vec::new(),
        }
    }

    /// The devices on the node an alternative may get, in inventory order, and the funnel.
    fn candidates(
        &mut self,
        alt: &Alternative,
        on_node: &[usize],
        only_free: bool,
    ) -> Result<(Vec<usize>, Funnel), Unsatisfied> {
        let mut funnel = Funnel { on_node: on_node.len(), ..Funnel::default() };
        let mut out = Vec::new();
        for &i in on_node {
            if !self.all_match(&alt.class_selectors, i, &alt.name)? {
                continue;
            }
            funnel.of_class += 1;
            if !self.all_match(&alt.selectors, i, &alt.name)? {
                continue;
            }
            funnel.selected += 1;
            let device = &self.inventory.devices()[i];
            if !device.taints.iter().all(|t| alt.tolerations.iter().any(|tol| tolerates(tol, t))) {
                funnel.tainted += 1;
                continue;
            }
            if !only_free || alt.admin || device.allow_multiple_allocations || !self.inventory.is_held_at(i) {
                funnel.free += 1;
                out.push(i);
            }
        }
        Ok((out, funnel))
    }

    /// The verdict table of `selector`, made on first use.
    fn table(&mut self, selector: Arc<Selector>) -> usize {
        let address = Arc::as_ptr(&selector) as usize;
        if let Some(&t) = self.table_of.get(&address) {
            return t;
        }
        self.verdicts.push(Verdicts {
            selector,
            answers: vec![UNASKED; self.values.len()],
            failures: HashMap::default(),
            by_seen: Footprints::default(),
        });
        self.table_of.insert(address, self.verdicts.len() - 1);
        self.verdicts.len() - 1
    }

    fn all_match(&mut self, tables: &[usize], device: usize, request: &str) -> Result<bool, Unsatisfied> {
        for &t in tables {
            let table = &mut self.verdicts[t];
            if table.answers[device] == UNASKED {
                // Devices that show the selector the same values share its answer; failures are
                // evaluated per device (their message names the device).
                let shown = &self.inventory.devices()[device];
                let verdict = match table.by_seen.verdict(&table.selector, shown) {
                    Some(v) => Ok(v),
                    None => {
                        let value = self.values[device].get_or_insert_with(|| DeviceValue::new(shown));
                        let v = table.selector.matches(&self.env, value);
                        if let Ok(b) = v {
                            table.by_seen.learn(&table.selector, shown, b);
                        }
                        v
                    }
                };
                table.answers[device] = match verdict {
                    Ok(true) => ACCEPTS,
                    Ok(false) => REJECTS,
                    Err(error) => {
                        table.failures.insert(device, error);
                        FAILED
                    }
                };
            }
            match table.answers[device] {
                ACCEPTS => {}
                REJECTS => return Ok(false),
                _ => {
                    let error = table.failures[&device].clone();
                    return Err(Unsatisfied::Selector { request: request.into(), error });
                }
            }
        }
        Ok(true)
    }
}

/// A device as a policy's device-selection stage sees it.
pub fn claim_device(d: &crate::inventory::Device) -> ClaimDevice {
    let attributes = d
        .attributes
        .iter()
        .map(|(k, a)| {
            let v = match a {
                Attribute::Bool(b) => AttributeValue::Bool(*b),
                Attribute::Int(i) => AttributeValue::Int(*i),
                Attribute::String(s) => AttributeValue::String(s.clone()),
                Attribute::Version(v) => AttributeValue::Version(v.to_string()),
            };
            (k.clone(), v)
        })
        .collect();
    let capacity = d.capacity.iter().map(|(k, q)| (k.clone(), q.to_string())).collect();
    ClaimDevice { id: d.id.to_string(), attributes, capacity }
}

/// Whether `toleration` tolerates `taint`, as for pods: `Exists` (any value; no key: any key) or
/// `Equal` (the default) with key and value; no effect tolerates every effect.
fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    let key = toleration.key.as_deref().unwrap_or_default();
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        "Equal" => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

fn compile(
    selectors: &mut Selectors,
    list: &[DeviceSelector],
    request: &str,
) -> Result<Vec<Arc<Selector>>, Unsatisfied> {
    list.iter()
        .filter_map(|s| s.cel.as_ref())
        .map(|c| selectors.get(&c.expression))
        .collect::<Result<_, _>>()
        .map_err(|error| Unsatisfied::Selector { request: request.into(), error })
}

fn rules(constraints: &[DeviceConstraint]) -> Vec<Rule<'_>> {
    constraints
        .iter()
        .filter_map(|c| {
            let (attribute, distinct) = match (&c.match_attribute, &c.distinct_attribute) {
                (Some(a), _) => (a.as_str(), false),
                (None, Some(a)) => (a.as_str(), true),
                _ => return None,
            };
            Some(Rule { requests: c.requests.as_deref().unwrap_or_default(), attribute, distinct })
        })
        .collect()
}

/// Depth-first search over the requests' alternatives and device choices.
struct Search<'a> {
    allocator: &'a Allocator,
    choices: &'a [Vec<Want<'a>>],
    rules: &'a [Rule<'a>],
    /// (what it was picked for, device index) so far.
    picked: Vec<(&'a Want<'a>, usize)>,
    steps: usize,
}

/// A complete pick: each device with the alternative it serves.
type Picked<'a> = Option<Vec<(&'a Want<'a>, usize)>>;

impl<'a> Search<'a> {
    /// Fill request `r` onwards; `Some` with the complete pick, `None` when nothing fits.
    fn run(&mut self, r: usize) -> Result<Picked<'a>, Unsatisfied> {
        if r == self.choices.len() {
            return Ok(Some(self.picked.clone()));
        }
        let choices = self.choices;
        for want in &choices[r] {
            let start = self.picked.len();
            if let Some(done) = self.fill(r, want, 0, start)? {
                return Ok(Some(done));
            }
            self.picked.truncate(start);
        }
        Ok(None)
    }

    /// Pick devices for `want` from its candidates at `from` on, then go on to the next request.
    fn fill(&mut self, r: usize, want: &'a Want<'a>, from: usize, start: usize) -> Result<Picked<'a>, Unsatisfied> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(Unsatisfied::TooManySteps);
        }
        let have = self.picked.len() - start;
        let need = want.alt.count.unwrap_or(want.candidates.len());
        if have == need {
            return self.run(r + 1);
        }
        // Not enough candidates left to reach the count: prune.
        if want.candidates.len() - from < need - have {
            return Ok(None);
        }
        for k in from..want.candidates.len() {
            let device = want.candidates[k];
            if self.picked.iter().any(|(_, d)| *d == device) || !self.fits(want, device) {
                if want.alt.count.is_none() {
                    // `All` takes every candidate: one that does not fit fails the request.
                    return Ok(None);
                }
                continue;
            }
            self.picked.push((want, device));
            if let Some(done) = self.fill(r, want, k + 1, start)? {
                return Ok(Some(done));
            }
            self.picked.pop();
            if want.alt.count.is_none() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Whether `device`, picked for `want`, keeps every constraint that covers it.
    fn fits(&self, want: &Want, device: usize) -> bool {
        let devices = self.allocator.inventory.devices();
        self.rules.iter().all(|rule| {
            let covers = |request: &str, name: &str| {
                rule.requests.is_empty() || rule.requests.iter().any(|q| q == request || q == name)
            };
            if !covers(&want.alt.request, &want.alt.name) {
                return true;
            }
            let Some(value) = devices[device].attributes.get(rule.attribute) else {
                // A constrained device must have the attribute.
                return false;
            };
            self.picked.iter().filter(|(other, _)| covers(&other.alt.request, &other.alt.name)).all(|(_, other)| {
                match devices[*other].attributes.get(rule.attribute) {
                    Some(v) => same(v, value) != rule.distinct,
                    None => false,
                }
            })
        })
    }
}

/// Attribute equality as constraints compare: versions by precedence.
fn same(a: &Attribute, b: &Attribute) -> bool {
    match (a, b) {
        (Attribute::Version(x), Attribute::Version(y)) => x.cmp_precedence(y).is_eq(),
        _ => a == b,
    }
}

/// For each node, the allocation a claim would get there or why it would get none.
pub fn explain<'n>(
    allocator: &mut Allocator,
    claim: &ResourceClaimSpec,
    nodes: &'n [Node],
) -> BTreeMap<&'n str, Result<Allocation, Unsatisfied>> {
    let prepared = allocator.prepare(claim);
    nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .map(|(name, node)| {
            let verdict = match &prepared {
                Ok(p) => allocator.allocate_prepared(p, node),
                Err(e) => Err(e.clone()),
            };
            (name, verdict)
        })
        .collect()
}

impl fmt::Display for Allocation {
    /// `request: driver/pool device, device; request: …`, one group per request and pool.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // ((request, driver, pool), devices)
        type Group<'r> = ((&'r str, &'r str, &'r str), Vec<String>);
        let mut groups: Vec<Group> = Vec::new();
        for (request, id, admin) in &self.results {
            let key = (request.as_str(), &*id.driver, &*id.pool);
            let device = if *admin { format!("{} (admin access)", id.device) } else { id.device.to_string() };
            match groups.last_mut() {
                Some((k, devices)) if *k == key => devices.push(device),
                _ => groups.push((key, vec![device])),
            }
        }
        let parts: Vec<String> = groups
            .iter()
            .map(|((request, driver, pool), devices)| format!("{request}: {driver}/{pool} {}", devices.join(", ")))
            .collect();
        write!(f, "{}", parts.join("; "))
    }
}
