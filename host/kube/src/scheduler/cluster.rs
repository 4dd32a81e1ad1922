//! The cluster as the watches show it: every pod's usage on every node (the [`Cache`]), our own
//! pods, and the scheduling objects besides them (groups, owners, queues, flavors, priority
//! classes, disruption budgets, DRA objects).
//!
//! Applying a watch event here is a function with no I/O: it updates the view and returns what
//! changed ([`Changed`]) — which nodes the core must see again, whether a decision may differ,
//! and what happened to pods (one of ours left, was bound, went terminating). What that means for
//! the core, the runs and the pods' reported reasons is the scheduler's to carry out
//! (`changes.rs`), so this part is tested by feeding it events.

use ahash::{AHashMap, AHashSet};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::watcher::{self, Event};

use super::ours::OurPods;
use crate::cache::{Cache, PodPhase, pod_id};
use crate::crd::{PodGroup, Queue, ResourceFlavor, not_installed};
use crate::disruption::Budgets;
use crate::priorities::PriorityClasses;
use crate::queues::{Flavors, Queues};
use crate::workloads::{GroupInfo, PodFacts};

/// What the watches show, and what the scheduler keeps beside it about the same pods.
pub(super) struct ClusterView {
    /// Pods with this `spec.schedulerName` are ours.
    scheduler_name: String,
    /// Every pod's usage on every node, plus binds in flight.
    pub cache: Cache,
    /// Our pods (pending and bound), by `namespace/name`.
    pub ours: OurPods,
    pub objects: Objects,
    /// Re-lists in progress.
    pub relist: Relist,
    /// Which watches have listed once.
    pub synced: Synced,
    /// Victims evicted and not gone yet: the core holds their room (as terminating) until their
    /// pod is deleted, so the node's background leaves them out.
    pub evicting: AHashSet<String>,
}

/// A re-list in progress: what it has listed so far.
#[derive(Default)]
pub(super) struct Relist {
    nodes: Option<AHashSet<String>>,
    pods: Option<AHashSet<String>>,
    queues: Option<AHashSet<String>>,
    flavors: Option<AHashSet<String>>,
    priority_classes: Option<AHashSet<String>>,
    budgets: Option<AHashSet<String>>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Synced {
    pub nodes: bool,
    pub pods: bool,
    pub queues: bool,
    pub flavors: bool,
    pub priority_classes: bool,
    pub budgets: bool,
}

/// The cluster's scheduling objects besides nodes and pods, as the watches last showed them.
#[derive(Default)]
pub(super) struct Objects {
    /// Our `PodGroup`s.
    pub groups: AHashMap<String, GroupInfo>,
    /// Our `PodGroup` is not served (its CRD is not installed; said once).
    pub groups_unserved: bool,
    /// `PodGroup`s of the upstream Workload API, the coscheduling plugin and Volcano.
    pub pod_groups: crate::groups::podgroups::PodGroups,
    /// The owners pods are grouped by.
    pub owners: crate::groups::owners::Owners,
    pub queues: Queues,
    pub flavors: Flavors,
    pub priority_classes: PriorityClasses,
    pub budgets: Budgets,
    /// Workloads withdrawn as victims: a disruption budget protects one of their pods.
    pub withdrawn: AHashSet<String>,
    /// Why the last queue change was refused.
    pub queue_error: Option<String>,
    /// ResourceSlices, DeviceClasses and ResourceClaims.
    pub dra: crate::dra::Dra,
    /// A DRA watch failed (said once).
    pub dra_unserved: bool,
    /// DeviceTaintRules are not served (said once).
    pub taint_rules_unserved: bool,
    /// What each pod of ours submitted with claims asks of DRA, for its placement's allocation.
    pub dra_pods: AHashMap<String, crate::dra::DraPod>,
    /// Claims whose devices the core counts through a task's requests: that task, and the
    /// class resources they are counted under.
    pub dra_counted: AHashMap<String, (String, Vec<String>)>,
    /// DRA devices by class per node as the core last saw them: (resource, devices, held).
    pub dra_capacity: AHashMap<String, Vec<(wasmsched_api::ResourceName, u64, u64)>>,
}

/// What one watch event changed.
#[derive(Default, Debug)]
pub(super) struct Changed {
    /// Something changed that may change a decision.
    pub dirty: bool,
    /// Nodes the core must see again (their usage by others, or the nodes themselves, changed).
    pub stale_nodes: Vec<String>,
    /// A group object or owner changed: gangs' min-member is checked again.
    pub regroup: bool,
    /// Queues or flavors changed: the queue tree is built again.
    pub queues: bool,
    /// What happened to pods, in order.
    pub pods: Vec<PodChange>,
}

impl Changed {
    fn stale(&mut self, node: String) {
        self.stale_nodes.push(node);
        self.dirty = true;
    }

    /// Nothing the scheduler must act on.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        !self.dirty && self.stale_nodes.is_empty() && !self.regroup && !self.queues && self.pods.is_empty()
    }
}

/// What happened to one pod, for the scheduler to carry out on the core, the runs and the reports.
#[derive(Debug)]
pub(super) enum PodChange {
    /// One of ours waits for a node but does not convert: why is said on the pod.
    Unreadable { id: String, uid: String, error: String },
    /// One of ours is terminating (on `node`): it left our pods and holds its room as anyone's.
    Terminating { id: String, node: Option<String> },
    /// A bound pod's labels changed: `labels` as its task reads them.
    Relabelled { id: String, labels: Option<Vec<(String, String)>>, node: Option<String> },
    /// A pod is bound on `after` (it was on `before`); `ours`: one of ours, now in our pods.
    Bound { id: String, ours: bool, before: Option<String>, after: Option<String> },
    /// A pod no longer holds its node: `pod` is its last state, when known.
    Ended { id: String, pod: Option<Box<Pod>> },
    /// One of ours, or a victim being evicted, left the view.
    Gone(Box<Gone>),
    /// The pods were listed again: runs of pods not among `listed` are over.
    Relisted { listed: AHashSet<String> },
}

/// A pod that left the view.
#[derive(Debug)]
pub(super) struct Gone {
    pub id: String,
    /// What it was as one of ours.
    pub facts: Option<PodFacts>,
    /// It was being evicted.
    pub evicted: bool,
}

impl ClusterView {
    pub fn new(scheduler_name: &str, cache: Cache, objects: Objects) -> ClusterView {
        ClusterView {
            scheduler_name: scheduler_name.into(),
            cache,
            ours: OurPods::default(),
            objects,
            relist: Relist::default(),
            synced: Synced::default(),
            evicting: AHashSet::new(),
        }
    }

    pub fn node_event(&mut self, event: watcher::Result<Event<KubeNode>>) -> Changed {
        let mut changed = Changed::default();
        match event {
            Ok(Event::Init) => self.relist.nodes = Some(AHashSet::new()),
            Ok(Event::InitApply(node)) => {
                if let Some(listed) = self.relist.nodes.as_mut() {
                    listed.insert(node.name_any());
                }
                self.apply_node(&node, &mut changed);
            }
            Ok(Event::InitDone) => {
                let listed = self.relist.nodes.take();
                if let Some(listed) = &listed {
                    changed
                        .stale_nodes
                        .extend(self.cache.node_names().filter(|n| !listed.contains(*n)).map(String::from));
                }
                self.cache.retain_listed(listed.as_ref(), None);
                self.synced.nodes = true;
                tracing::info!(nodes = self.cache.nodes().len(), "nodes listed");
            }
            Ok(Event::Apply(node)) => self.apply_node(&node, &mut changed),
            Ok(Event::Delete(node)) => {
                self.cache.delete_node(&node.name_any());
                self.objects.dra.delete_node(&node.name_any());
                changed.stale(node.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
        changed
    }

    fn apply_node(&mut self, node: &KubeNode, changed: &mut Changed) {
        self.objects.dra.apply_node(node);
        let name = node.name_any();
        let before = self.cache.nodes().slot_of(&name).and_then(|s| self.cache.nodes().get(s)).cloned();
        if let Err(e) = self.cache.apply_node(node) {
            tracing::warn!(node = %name, error = %e, "ignoring a node that does not convert");
            return;
        }
        let after = self.cache.nodes().slot_of(&name).and_then(|s| self.cache.nodes().get(s));
        if before.as_ref() != after {
            changed.stale(name);
        }
    }

    pub fn pod_event(&mut self, event: watcher::Result<Event<Pod>>) -> Changed {
        let mut changed = Changed::default();
        match event {
            Ok(Event::Init) => self.relist.pods = Some(AHashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Ok(id)) = (self.relist.pods.as_mut(), pod_id(&pod)) {
                    listed.insert(id);
                }
                self.apply_pod(pod, &mut changed);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.pods.take() {
                    let gone: Vec<String> = self.ours.keys().filter(|id| !listed.contains(*id)).cloned().collect();
                    for id in gone {
                        changed.pods.push(PodChange::Gone(Box::new(self.forget_pod(&id))));
                    }
                    let before: Vec<String> = self
                        .cache
                        .node_names()
                        .filter(|n| self.cache.holders_on(n).any(|(id, _, _)| !listed.contains(id)))
                        .map(String::from)
                        .collect();
                    self.cache.retain_listed(None, Some(&listed));
                    for node in before {
                        changed.stale(node);
                    }
                    changed.pods.push(PodChange::Relisted { listed });
                }
                self.synced.pods = true;
                tracing::info!(bound = self.cache.holders(), ours = self.ours.len(), "pods listed");
            }
            Ok(Event::Apply(pod)) => self.apply_pod(pod, &mut changed),
            Ok(Event::Delete(pod)) => {
                if let Ok(id) = pod_id(&pod) {
                    if let Some(node) = self.cache.node_of(&id).map(String::from) {
                        changed.stale(node);
                    }
                    self.cache.delete_pod(&pod);
                    let gone = self.forget_pod(&id);
                    changed.pods.push(PodChange::Ended { id, pod: Some(Box::new(pod)) });
                    changed.pods.push(PodChange::Gone(Box::new(gone)));
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
        changed
    }

    /// Pod `id` leaves our pods and what was kept for its claims and its eviction.
    fn forget_pod(&mut self, id: &str) -> Gone {
        if self.objects.dra_pods.remove(id).is_some() {
            self.objects.dra_counted.retain(|_, (task, _)| task != id);
        }
        Gone { id: id.to_string(), facts: self.ours.remove(id), evicted: self.evicting.remove(id) }
    }

    fn apply_pod(&mut self, pod: Pod, changed: &mut Changed) {
        let Ok(id) = pod_id(&pod) else { return };
        let before = self.cache.node_of(&id).map(String::from);
        let ours = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some(self.scheduler_name.as_str());
        let phase = match self.cache.apply_pod(&pod, &self.scheduler_name) {
            Ok(phase) => phase,
            Err(e) => {
                // A pod we cannot understand is left alone, never guessed at; if it is ours and
                // waits for a node, its owner is told why on the pod itself.
                tracing::warn!(pod = %id, error = %e, "ignoring a pod that does not convert");
                let pending = pod.spec.as_ref().is_some_and(|s| s.node_name.is_none());
                if ours && pending {
                    // An earlier, readable version of it must not be placed either.
                    if self.ours.contains_key(&id) {
                        changed.pods.push(PodChange::Gone(Box::new(self.forget_pod(&id))));
                    }
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    changed.pods.push(PodChange::Unreadable { id, uid, error: e.to_string() });
                }
                return;
            }
        };
        let after = self.cache.node_of(&id).map(String::from);
        if ours && pod.metadata.deletion_timestamp.is_some() && matches!(phase, PodPhase::Bound | PodPhase::Relabelled)
        {
            // Terminating: it holds its room until it is gone, like anyone's pod, and is never
            // taken over or chosen as a victim again (a victim of ours is the core's already).
            self.ours.remove(&id);
            changed.pods.push(PodChange::Terminating { id, node: after });
            return;
        }
        if matches!(phase, PodPhase::Relabelled) {
            let labels = crate::convert::bound_task(&pod, self.cache.accelerators()).ok().map(|t| t.labels);
            changed.pods.push(PodChange::Relabelled { id: id.clone(), labels, node: after.clone() });
        }
        match phase {
            PodPhase::Pending(task) => {
                let facts = PodFacts::new(&pod, *task);
                let differs = self
                    .ours
                    .get(&id)
                    .is_none_or(|f| f.task != facts.task || f.uid != facts.uid || f.claims != facts.claims);
                self.ours.insert(id, facts);
                changed.dirty |= differs;
            }
            PodPhase::Bound | PodPhase::Relabelled => {
                let ours = ours
                    && match crate::convert::bound_task(&pod, self.cache.accelerators()) {
                        Ok(task) => {
                            self.ours.insert(id.clone(), PodFacts::new(&pod, task));
                            true
                        }
                        Err(_) => false,
                    };
                changed.pods.push(PodChange::Bound { id, ours, before, after });
            }
            PodPhase::Other => {
                if self.cache.holds(&id) {
                    return;
                }
                let gone = (self.ours.contains_key(&id) || self.evicting.contains(&id)).then(|| self.forget_pod(&id));
                changed.pods.push(PodChange::Ended { id, pod: Some(Box::new(pod)) });
                changed.pods.extend(gone.map(|g| PodChange::Gone(Box::new(g))));
                if let Some(node) = before {
                    changed.stale(node);
                }
            }
        }
    }

    pub fn group_event(&mut self, event: watcher::Result<Event<PodGroup>>) -> Changed {
        let (Ok(Event::Apply(g) | Event::InitApply(g)) | Ok(Event::Delete(g))) = &event else {
            match event {
                Err(e) if not_installed(&e) => {
                    if !std::mem::replace(&mut self.objects.groups_unserved, true) {
                        tracing::info!(
                            "PodGroup (scheduling.wasmsched.io) not installed in this cluster: pods naming one wait for it (watched)"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pod group watch failed; retrying"),
                Ok(Event::InitDone) if std::mem::take(&mut self.objects.groups_unserved) => {
                    tracing::info!("PodGroup (scheduling.wasmsched.io) now installed in this cluster");
                }
                Ok(_) => {}
            }
            return Changed::default();
        };
        let key = format!("{}/{}", g.namespace().unwrap_or_default(), g.name_any());
        let differs = if matches!(event, Ok(Event::Delete(_))) {
            self.objects.groups.remove(&key).is_some()
        } else {
            let info = GroupInfo::new(g);
            self.objects.groups.insert(key, info.clone()) != Some(info) // a status write changes nothing
        };
        Changed { dirty: differs, regroup: differs, ..Changed::default() }
    }

    /// An owner of kind `kind` (the owner table's index) changed.
    pub fn owner_event(&mut self, kind: usize, event: watcher::Result<Event<DynamicObject>>) -> Changed {
        let owners = &mut self.objects.owners;
        let differs = match event {
            Ok(Event::Init) => {
                owners.relist_started(kind);
                false
            }
            Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) => owners.apply(kind, &o),
            Ok(Event::InitDone) => {
                owners.relist_done(kind);
                true
            }
            Ok(Event::Delete(o)) => owners.delete(&o),
            Err(e) => {
                let spec = owners.table().kinds().nth(kind).map(|k| format!("{} ({})", k.kind, k.api_version));
                if owners.watch_failed(kind) {
                    let kind = spec.as_deref().unwrap_or("?");
                    if not_installed(&e) {
                        tracing::info!(%kind, "owner kind not installed in this cluster: its pods are scheduled alone until it is");
                    } else {
                        tracing::warn!(%kind, error = %e,
                            "cannot watch this owner kind (not allowed?): its pods are scheduled alone until it can");
                    }
                } else {
                    tracing::debug!(kind = spec.as_deref().unwrap_or("?"), error = %e, "owner watch failed; retrying");
                }
                false
            }
        };
        Changed { dirty: differs, regroup: differs, ..Changed::default() }
    }

    /// A `PodGroup` of another API (`objects.pod_groups`' watch `i`) changed.
    pub fn pod_group_event(&mut self, i: usize, event: watcher::Result<Event<DynamicObject>>) -> Changed {
        let groups = &mut self.objects.pod_groups;
        let differs = match event {
            Ok(Event::Init) => {
                groups.relist_started(i);
                false
            }
            Ok(Event::InitApply(g)) | Ok(Event::Apply(g)) => groups.apply(i, &g),
            Ok(Event::InitDone) => {
                groups.relist_done(i);
                true
            }
            Ok(Event::Delete(g)) => groups.delete(i, &g),
            Err(e) => {
                let api = groups.apis()[i].api_resource().api_version;
                if groups.watch_failed(i) {
                    if not_installed(&e) {
                        tracing::info!(%api, "PodGroups of this API not installed in this cluster; pods naming one wait for it");
                    } else {
                        tracing::warn!(%api, error = %e, "cannot watch PodGroups of this API (not allowed?); pods naming one wait for it");
                    }
                } else {
                    tracing::debug!(%api, error = %e, "PodGroup watch failed; retrying");
                }
                false
            }
        };
        Changed { dirty: differs, regroup: differs, ..Changed::default() }
    }

    pub fn queue_event(&mut self, event: watcher::Result<Event<Queue>>) -> Changed {
        let queues = self.objects.queues.on_event(event, &mut self.relist.queues, &mut self.synced.queues);
        Changed { queues, ..Changed::default() }
    }

    /// Flavors change what queues' per-flavor quotas mean: the tree is rebuilt (a pod keeps the
    /// flavor it was placed with until it leaves).
    pub fn flavor_event(&mut self, event: watcher::Result<Event<ResourceFlavor>>) -> Changed {
        let queues = self.objects.flavors.on_event(event, &mut self.relist.flavors, &mut self.synced.flavors);
        Changed { queues, ..Changed::default() }
    }

    /// Classes only give workloads submitted from now on their priority (a class's value is
    /// immutable): nothing already submitted changes.
    pub fn priority_class_event(&mut self, event: watcher::Result<Event<PriorityClass>>) -> Changed {
        match event {
            Ok(Event::Init) => self.relist.priority_classes = Some(AHashSet::new()),
            Ok(Event::InitApply(pc)) => {
                if let Some(listed) = self.relist.priority_classes.as_mut() {
                    listed.insert(pc.name_any());
                }
                self.objects.priority_classes.apply(&pc);
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.priority_classes.take() {
                    self.objects.priority_classes.retain(&listed);
                }
                self.synced.priority_classes = true;
            }
            Ok(Event::Apply(pc)) => {
                self.objects.priority_classes.apply(&pc);
            }
            Ok(Event::Delete(pc)) => self.objects.priority_classes.delete(&pc.name_any()),
            Err(e) => tracing::warn!(error = %e, "priority class watch failed; retrying"),
        }
        Changed::default()
    }

    /// A budget that changes may protect or release victims: the next cycle looks again.
    pub fn budget_event(&mut self, event: watcher::Result<Event<PodDisruptionBudget>>) -> Changed {
        let key = |b: &PodDisruptionBudget| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any());
        let dirty = match event {
            Ok(Event::Init) => {
                self.relist.budgets = Some(AHashSet::new());
                false
            }
            Ok(Event::InitApply(b)) => {
                if let Some(listed) = self.relist.budgets.as_mut() {
                    listed.insert(key(&b));
                }
                self.objects.budgets.apply(&b)
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = self.relist.budgets.take() {
                    self.objects.budgets.retain(&listed);
                }
                self.synced.budgets = true;
                true
            }
            Ok(Event::Apply(b)) => self.objects.budgets.apply(&b),
            Ok(Event::Delete(b)) => self.objects.budgets.delete(&b),
            Err(e) => {
                tracing::warn!(error = %e, "disruption budget watch failed; retrying");
                false
            }
        };
        Changed { dirty, ..Changed::default() }
    }

    /// A DRA object changed. A cluster that does not serve `resource.k8s.io/v1` (older than 1.34,
    /// or DRA turned off) is said once; the watch keeps trying quietly and pods with claims wait.
    pub fn dra_event<K>(
        &mut self,
        event: watcher::Result<Event<K>>,
        apply: fn(&mut crate::dra::Dra, Event<K>),
    ) -> Changed {
        match event {
            Ok(event) => {
                apply(&mut self.objects.dra, event);
                return Changed { dirty: true, ..Changed::default() };
            }
            Err(e) if !self.objects.dra_unserved => {
                self.objects.dra_unserved = true;
                tracing::warn!(error = %e, "cannot watch DRA objects (resource.k8s.io/v1); pods with ResourceClaims wait until it can");
            }
            Err(e) => tracing::debug!(error = %e, "DRA watch failed; retrying"),
        }
        Changed::default()
    }

    /// A DeviceTaintRule changed. A cluster that does not serve them (`resource.k8s.io/v1beta2`
    /// off, as by default in 1.36) is said once; slices' own taints still count.
    pub fn taint_rule_event(
        &mut self,
        event: watcher::Result<Event<k8s_openapi::api::resource::v1beta2::DeviceTaintRule>>,
    ) -> Changed {
        match event {
            Ok(event) => {
                self.objects.dra.taint_rule_event(event);
                return Changed { dirty: true, ..Changed::default() };
            }
            Err(e) if !self.objects.taint_rules_unserved => {
                self.objects.taint_rules_unserved = true;
                tracing::info!(error = %e, "DeviceTaintRules (resource.k8s.io/v1beta2) not watched; device taints come from ResourceSlices only");
            }
            Err(e) => tracing::debug!(error = %e, "DeviceTaintRule watch failed; retrying"),
        }
        Changed::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view() -> ClusterView {
        ClusterView::new("wasmsched", Cache::new(), Objects::default())
    }

    fn node(name: &str, gpus: u32) -> KubeNode {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()}}
        }))
        .unwrap()
    }

    /// A pod asking for `gpus` (a quantity as written), of `scheduler`, on `node` when bound.
    fn pod(name: &str, scheduler: &str, gpus: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "labels": {"app": "a"}},
            "spec": {"schedulerName": scheduler, "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .unwrap()
    }

    fn ours(name: &str, node: Option<&str>) -> Pod {
        pod(name, "wasmsched", "1", node)
    }

    fn listed<K>(objects: Vec<K>) -> Vec<watcher::Result<Event<K>>> {
        let mut events = vec![Ok(Event::Init)];
        events.extend(objects.into_iter().map(|o| Ok(Event::InitApply(o))));
        events.push(Ok(Event::InitDone));
        events
    }

    fn gone_ids(changed: &Changed) -> Vec<(&str, bool, bool)> {
        changed
            .pods
            .iter()
            .filter_map(|c| match c {
                PodChange::Gone(g) => Some((g.id.as_str(), g.facts.is_some(), g.evicted)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_node_list_makes_every_node_stale_and_a_relist_drops_the_unlisted_ones() {
        let mut v = view();
        let mut stale = Vec::new();
        for event in listed(vec![node("n1", 8), node("n2", 8)]) {
            stale.extend(v.node_event(event).stale_nodes);
        }
        assert_eq!(stale, ["n1", "n2"]);
        assert!(v.synced.nodes);

        // The same node again (a heartbeat) changes nothing; a new capacity does.
        assert!(v.node_event(Ok(Event::Apply(node("n1", 8)))).is_empty());
        assert_eq!(v.node_event(Ok(Event::Apply(node("n1", 4)))).stale_nodes, ["n1"]);

        // A re-list without n2: the core must see n2 again (gone), and the view drops it.
        let mut stale = Vec::new();
        for event in listed(vec![node("n1", 4)]) {
            stale.extend(v.node_event(event).stale_nodes);
        }
        assert_eq!(stale, ["n2"]);
        assert_eq!(v.cache.node_names().collect::<Vec<_>>(), ["n1"]);
    }

    #[test]
    fn a_pending_pod_of_ours_is_dirty_only_when_what_it_asks_changes() {
        let mut v = view();
        let changed = v.pod_event(Ok(Event::Apply(ours("p", None))));
        assert!(changed.dirty && changed.pods.is_empty());
        assert!(v.ours.contains_key("ml/p"));

        // A status update of the same pod: nothing the core sees.
        let mut again = ours("p", None);
        again.status.as_mut().unwrap().conditions = Some(vec![]);
        assert!(v.pod_event(Ok(Event::Apply(again))).is_empty());

        // Recreated under the same name (a new UID): the core must see it again.
        let mut recreated = ours("p", None);
        recreated.metadata.uid = Some("uid-other".into());
        assert!(v.pod_event(Ok(Event::Apply(recreated))).dirty);

        // Another scheduler's pending pod is none of ours: no decision changes.
        let theirs = v.pod_event(Ok(Event::Apply(pod("q", "default-scheduler", "1", None))));
        assert!(!theirs.dirty && theirs.stale_nodes.is_empty() && gone_ids(&theirs).is_empty());
        assert!(!v.ours.contains_key("ml/q"));
    }

    #[test]
    fn a_bound_pod_of_ours_is_held_then_ends_and_leaves_when_deleted() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        v.pod_event(Ok(Event::Apply(ours("p", None))));
        let changed = v.pod_event(Ok(Event::Apply(ours("p", Some("n1")))));
        match &changed.pods[..] {
            [PodChange::Bound { id, ours: true, before: None, after: Some(after) }] => {
                assert_eq!((id.as_str(), after.as_str()), ("ml/p", "n1"))
            }
            other => panic!("expected one bind of ours, got {other:?}"),
        }
        assert_eq!(v.cache.node_of("ml/p"), Some("n1"));
        assert!(v.ours["ml/p"].bound);

        let changed = v.pod_event(Ok(Event::Delete(ours("p", Some("n1")))));
        assert_eq!(changed.stale_nodes, ["n1"]);
        assert!(matches!(&changed.pods[0], PodChange::Ended { id, pod: Some(_) } if id == "ml/p"));
        assert_eq!(gone_ids(&changed), [("ml/p", true, false)]);
        assert!(!v.cache.holds("ml/p") && !v.ours.contains_key("ml/p"));
    }

    #[test]
    fn others_pods_hold_room_and_finishing_frees_it_without_touching_ours() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        let changed = v.pod_event(Ok(Event::Apply(pod("x", "default-scheduler", "2", Some("n1")))));
        assert!(matches!(&changed.pods[..], [PodChange::Bound { ours: false, after: Some(n), .. }] if n == "n1"));
        assert!(v.cache.holds("ml/x"));

        let mut done = pod("x", "default-scheduler", "2", Some("n1"));
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let changed = v.pod_event(Ok(Event::Apply(done)));
        assert_eq!(changed.stale_nodes, ["n1"]);
        assert!(matches!(&changed.pods[..], [PodChange::Ended { .. }]), "no Gone: it was never ours");
        assert!(!v.cache.holds("ml/x"));
    }

    #[test]
    fn a_terminating_pod_of_ours_leaves_our_pods_but_keeps_its_room() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        v.pod_event(Ok(Event::Apply(ours("p", Some("n1")))));
        let mut terminating = ours("p", Some("n1"));
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let changed = v.pod_event(Ok(Event::Apply(terminating)));
        assert!(matches!(&changed.pods[..], [PodChange::Terminating { node: Some(n), .. }] if n == "n1"));
        assert!(!v.ours.contains_key("ml/p"));
        assert_eq!(v.cache.node_of("ml/p"), Some("n1"), "it holds its GPUs until it is gone");
    }

    #[test]
    fn a_relabelled_pod_reports_its_new_labels() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        v.pod_event(Ok(Event::Apply(pod("x", "default-scheduler", "1", Some("n1")))));
        let mut relabelled = pod("x", "default-scheduler", "1", Some("n1"));
        relabelled.metadata.labels = Some([("app".to_string(), "b".to_string())].into());
        let changed = v.pod_event(Ok(Event::Apply(relabelled)));
        match &changed.pods[..] {
            [PodChange::Relabelled { labels: Some(labels), node: Some(n), .. }, PodChange::Bound { .. }] => {
                assert_eq!((labels.as_slice(), n.as_str()), (&[("app".to_string(), "b".to_string())][..], "n1"))
            }
            other => panic!("expected a relabel then the bind, got {other:?}"),
        }
    }

    #[test]
    fn an_unreadable_pending_pod_of_ours_is_withdrawn_and_reported() {
        let mut v = view();
        v.pod_event(Ok(Event::Apply(ours("p", None))));
        let changed = v.pod_event(Ok(Event::Apply(pod("p", "wasmsched", "lots", None))));
        assert_eq!(gone_ids(&changed), [("ml/p", true, false)], "its earlier readable version must not be placed");
        assert!(
            matches!(changed.pods.last(), Some(PodChange::Unreadable { id, uid, .. }) if id == "ml/p" && uid == "uid-p")
        );
        assert!(!v.ours.contains_key("ml/p"));

        // Someone else's unreadable pod is not ours to report on.
        let theirs = v.pod_event(Ok(Event::Apply(pod("q", "default-scheduler", "lots", None))));
        assert!(!theirs.pods.iter().any(|c| matches!(c, PodChange::Unreadable { .. })));
    }

    #[test]
    fn a_pod_relist_lets_go_of_pods_it_no_longer_shows() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        let mut changes = Vec::new();
        for event in listed(vec![ours("kept", None), ours("dropped", None), pod("x", "other", "1", Some("n1"))]) {
            changes.push(v.pod_event(event));
        }
        assert!(v.synced.pods && v.ours.len() == 2 && v.cache.holds("ml/x"));

        // The watch lost track (410 Gone): the new list has neither `dropped` nor `x`.
        let mut last = Changed::default();
        for event in listed(vec![ours("kept", None)]) {
            last = v.pod_event(event);
        }
        assert_eq!(gone_ids(&last), [("ml/dropped", true, false)]);
        assert_eq!(last.stale_nodes, ["n1"], "x's room is free");
        match last.pods.last() {
            Some(PodChange::Relisted { listed }) => assert!(listed.contains("ml/kept") && listed.len() == 1),
            other => panic!("expected the relist last, got {other:?}"),
        }
        assert!(!v.cache.holds("ml/x") && v.ours.contains_key("ml/kept"));
    }

    #[test]
    fn a_victim_being_evicted_that_finishes_is_gone_even_when_no_longer_ours() {
        let mut v = view();
        v.node_event(Ok(Event::Apply(node("n1", 8))));
        v.pod_event(Ok(Event::Apply(pod("x", "default-scheduler", "1", Some("n1")))));
        v.evicting.insert("ml/x".into());
        let mut failed = pod("x", "default-scheduler", "1", Some("n1"));
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let changed = v.pod_event(Ok(Event::Apply(failed)));
        assert_eq!(gone_ids(&changed), [("ml/x", false, true)]);
        assert!(v.evicting.is_empty());
    }

    #[test]
    fn a_pod_group_status_write_changes_nothing_and_a_spec_change_regroups() {
        let mut v = view();
        let group = |min: i32, phase: &str| -> PodGroup {
            serde_json::from_value(json!({
                "apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": "g", "namespace": "ml"},
                "spec": {"minMember": min},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let first = v.group_event(Ok(Event::Apply(group(4, "Pending"))));
        assert!(first.dirty && first.regroup);
        assert!(v.group_event(Ok(Event::Apply(group(4, "Running")))).is_empty());
        assert!(v.group_event(Ok(Event::Apply(group(8, "Running")))).regroup);
        assert!(v.group_event(Ok(Event::Delete(group(8, "Running")))).regroup);
        assert!(v.group_event(Ok(Event::Delete(group(8, "Running")))).is_empty(), "already gone");
    }

    #[test]
    fn queues_and_flavors_ask_for_the_tree_again_and_budgets_for_a_new_look() {
        let mut v = view();
        let queue: Queue = serde_json::from_value(json!({
            "apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "team-a"}, "spec": {}
        }))
        .unwrap();
        let rebuilt: Vec<bool> = listed(vec![queue]).into_iter().map(|e| v.queue_event(e).queues).collect();
        assert!(rebuilt.iter().any(|r| *r) && v.synced.queues);

        let mut dirty = false;
        for event in listed(Vec::<PodDisruptionBudget>::new()) {
            dirty |= v.budget_event(event).dirty;
        }
        assert!(dirty && v.synced.budgets, "a budget list done is a new look at victims");
    }
}
