//! DRA in a replay, as the Kubernetes path does it: each DeviceClass's devices on a node are a
//! countable resource the core places against (so queues, gangs and preemption count them), and
//! after each cycle the claims of every replica placed are allocated on its node by the same
//! allocator kube-scheduler's semantics are implemented in — CEL selectors, constraints, topology.
//! A workload whose claims cannot be served where the cycle put it (the count admitted it, a
//! constraint did not) is taken back and tried again elsewhere.

use std::collections::{BTreeMap, BTreeSet};

use ahash::AHashMap;
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wasmsched_api::{NODE_NAME_FIELD, NodeSelectorTerm, Resources, SelectorOperator, SelectorRequirement, Task};
use wasmsched_core::NodeTable;
use wasmsched_dra::{Allocation, Allocator, Inventory, Objects};

use super::Job;

/// The devices of a replay and what holds them.
pub(super) struct Devices {
    allocator: Allocator,
    /// The replay's nodes as node selectors see them (name and labels).
    nodes: AHashMap<String, KubeNode>,
    /// Each placed replica's allocations, by task.
    held: AHashMap<String, Vec<Allocation>>,
    /// Per job, the nodes it was taken back from since devices were last freed.
    avoid: BTreeMap<usize, BTreeSet<String>>,
    /// Jobs that kept off nodes when devices were freed: they may go anywhere again.
    forgiven: Vec<usize>,
}

impl Devices {
    /// The devices `objects` publish for the nodes of `table` (pools that cannot be used are left
    /// out: [`Inventory::from_slices`] says why, for the caller to report).
    pub(super) fn new(objects: &Objects, table: &NodeTable) -> Devices {
        let (mut inventory, _) = Inventory::from_slices(&objects.slices);
        inventory.apply_taint_rules(&objects.taint_rules);
        // Claims the objects show allocated already hold their devices for the whole replay.
        inventory.hold_allocated(&objects.claims);
        let mut nodes = AHashMap::new();
        for slot in table.slots() {
            let Some(n) = table.get(slot) else { continue };
            let given = objects.nodes.iter().find(|k| k.metadata.name.as_deref() == Some(n.name.as_str()));
            let mut labels: BTreeMap<String, String> =
                given.and_then(|k| k.metadata.labels.clone()).unwrap_or_default();
            labels.extend(n.labels.iter().cloned());
            let node = KubeNode {
                metadata: ObjectMeta { name: Some(n.name.clone()), labels: Some(labels), ..Default::default() },
                ..Default::default()
            };
            nodes.insert(n.name.clone(), node);
        }
        Devices {
            allocator: Allocator::new(inventory, objects.classes.iter().cloned()),
            nodes,
            held: AHashMap::new(),
            avoid: BTreeMap::new(),
            forgiven: Vec::new(),
        }
    }

    /// What `node` offers of each DeviceClass, as extended resources (held devices included: the
    /// core counts what its placements hold; devices held from the start are left out).
    pub(super) fn capacity(&mut self, node: &str) -> Resources {
        let Some(n) = self.nodes.get(node) else { return Resources::default() };
        let mut extended = Vec::new();
        for (class, ids) in self.allocator.class_devices(n) {
            let free = ids.iter().filter(|id| !self.allocator.inventory().is_in_use(id)).count() as u64;
            if free > 0 {
                extended.push((wasmsched_dra::class_resource(&class), free));
            }
        }
        extended.sort();
        Resources { extended: extended.into(), ..Resources::default() }
    }

    /// Devices some DeviceClass selects on `node` (each once), in milli-GPUs: the replay's
    /// allocation figures count DRA devices as GPUs.
    pub(super) fn device_milli(&mut self, node: &str) -> u64 {
        let Some(n) = self.nodes.get(node) else { return 0 };
        let ids: BTreeSet<_> = self.allocator.class_devices(n).into_iter().flat_map(|(_, ids)| ids).collect();
        ids.len() as u64 * u64::from(wasmsched_api::GPU_MILLI)
    }

    /// The nodes whose devices could ever serve `job`'s claims (all devices free), or why none can.
    pub(super) fn feasible(&mut self, job: &Job) -> Result<Vec<String>, String> {
        let mut prepared = Vec::new();
        for (i, spec) in job.claims.iter().enumerate() {
            let p = self.allocator.prepare(spec).map_err(|e| format!("claim {i}: {e}"))?;
            prepared.push(p);
        }
        let mut names: Vec<&String> = self.nodes.keys().collect();
        names.sort();
        let mut fit = Vec::new();
        let mut why: BTreeMap<String, usize> = BTreeMap::new();
        for name in names {
            let node = &self.nodes[name];
            // Each claim with the earlier ones' devices taken, as for one replica.
            let mut taken = Vec::new();
            let mut ok = true;
            for p in &prepared {
                match self.allocator.compatible(p, node) {
                    Ok(a) => {
                        for (_, id, admin) in &a.results {
                            if !admin && !self.allocator.inventory().is_in_use(id) {
                                self.allocator.hold_device(id.clone());
                                taken.push(id.clone());
                            }
                        }
                    }
                    Err(e) => {
                        *why.entry(e.to_string()).or_default() += 1;
                        ok = false;
                        break;
                    }
                }
            }
            for id in &taken {
                self.allocator.release_device(id);
            }
            if ok {
                fit.push(name.clone());
            }
        }
        if fit.is_empty() {
            let reasons: Vec<String> = why.iter().map(|(r, n)| format!("{n} node(s): {r}")).collect();
            return Err(format!("0/{} nodes can serve its ResourceClaims: {}", self.nodes.len(), reasons.join("; ")));
        }
        Ok(fit)
    }

    /// Allocates every claim of a replica of `job` on `node` and holds the devices; or why not
    /// (nothing is held then).
    /// `rank` is the policy's device-selection stage, asked for its order of the candidates.
    pub(super) fn reserve(
        &mut self,
        task: &str,
        job: &Job,
        node: &str,
        mut rank: Option<&mut wasmsched_dra::allocator::Rank<'_>>,
    ) -> Result<(), String> {
        let Some(n) = self.nodes.get(node) else { return Err(format!("node {node} is unknown")) };
        let mut made: Vec<Allocation> = Vec::new();
        for (i, spec) in job.claims.iter().enumerate() {
            match self.allocator.allocate_ranked(spec, n, rank.as_deref_mut()) {
                Ok(a) => {
                    self.allocator.hold(&a, true);
                    made.push(a);
                }
                Err(e) => {
                    for a in &made {
                        self.allocator.hold(a, false);
                    }
                    return Err(format!("claim {i} of {task} on {node}: {e}"));
                }
            }
        }
        self.held.insert(task.to_string(), made);
        Ok(())
    }

    /// A replica stopped: its devices are free again, and every job may try the nodes it was taken
    /// back from.
    pub(super) fn release(&mut self, task: &str) {
        if self.release_reserved(task) {
            let avoided = std::mem::take(&mut self.avoid);
            self.forgiven.extend(avoided.into_keys());
        }
    }

    /// The jobs that kept off nodes until devices were freed, and were since.
    pub(super) fn take_forgiven(&mut self) -> Vec<usize> {
        let mut jobs = std::mem::take(&mut self.forgiven);
        jobs.sort_unstable();
        jobs.dedup();
        jobs
    }

    /// A reservation of this cycle taken back before it ran: nothing anyone waited for was freed.
    /// Whether it held anything.
    pub(super) fn release_reserved(&mut self, task: &str) -> bool {
        let Some(made) = self.held.remove(task) else { return false };
        for a in &made {
            self.allocator.hold(a, false);
        }
        true
    }

    /// The devices `task` holds (for reports and tests).
    pub(super) fn held_by(&self, task: &str) -> Option<&[Allocation]> {
        self.held.get(task).map(Vec::as_slice)
    }

    /// `job` was taken back from `node`: its replicas keep off it until devices are freed.
    pub(super) fn avoid(&mut self, job: usize, node: &str) -> Vec<String> {
        let nodes = self.avoid.entry(job).or_default();
        nodes.insert(node.to_string());
        nodes.iter().cloned().collect()
    }
}

/// Restricts `task` to `nodes` (when that is not every node) by a required node-affinity term on
/// the node's name, added to each term it has (terms are ORed, so each must carry it).
pub(super) fn restrict(task: &mut Task, operator: SelectorOperator, nodes: Vec<String>) {
    let requirement = SelectorRequirement { key: NODE_NAME_FIELD.into(), operator, values: nodes };
    let terms = &mut task.node_affinity.required;
    if terms.is_empty() {
        terms.push(NodeSelectorTerm { match_fields: vec![requirement], ..Default::default() });
    } else {
        for term in terms.iter_mut() {
            term.match_fields.push(requirement.clone());
        }
    }
}
