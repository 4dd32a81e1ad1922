//! The cluster as the scheduler sees it: nodes with what the pods bound to them hold, built from
//! the Node and Pod watch streams, plus the pods this scheduler has *assumed* onto a node while
//! their bind is in flight (kube-scheduler's assume/forget), so two decisions never count the same
//! free GPU twice.
//!
//! It keeps converted, compact records instead of whole objects: at 150,000 pods that is the
//! difference between tens of megabytes and gigabytes.

use std::sync::Arc;

use ahash::{AHashMap, AHashSet};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use wasmsched_api::{DeviceShare, Node, Task};
use wasmsched_core::{NodeTable, Slot, apply_node_facts, bind_fact as account};
use wasmsched_topology::annotation::{self, DEGRADED_ANNOTATION, TOPOLOGY_ANNOTATION, UNHEALTHY_ANNOTATION};

use crate::accelerators::AcceleratorTable;
use crate::convert::{self, ConvertError, GPU_IDS_ANNOTATION};

/// A pod that holds resources on a node.
#[derive(Clone, Debug)]
struct Holder {
    node: String,
    task: Task,
    devices: Vec<DeviceShare>,
    /// Bound by this scheduler, not yet seen bound in the watch stream.
    assumed: bool,
}

/// What a node object said, converted; compared on every update so status-only updates (heartbeats,
/// conditions) do not rebuild the node.
#[derive(Clone, Debug, PartialEq)]
struct NodeView {
    node: Node,
    facts: [Option<String>; 3],
}

/// Nodes and the pods that hold resources on them.
#[derive(Default)]
pub struct Cache {
    /// How nodes' and pods' accelerators read.
    accelerators: Arc<AcceleratorTable>,
    nodes: NodeTable,
    views: AHashMap<String, NodeView>,
    holders: AHashMap<String, Holder>,
    by_node: AHashMap<String, AHashSet<String>>,
    /// Holders per pod group `(namespace, group)`: every gang decision asks, and scanning all
    /// holders (150,000 pods at scale) each time would put that scan on the decision path.
    by_group: AHashMap<(String, String), usize>,
}

/// A pod's part in scheduling, read from one watch event.
#[derive(Debug)]
pub enum PodPhase {
    /// Waiting for this scheduler.
    Pending(Box<Task>),
    /// Holds resources on a node.
    Bound,
    /// Holds resources on the same node as before, with other labels.
    Relabelled,
    /// Neither ours to schedule nor holding anything (finished, another scheduler's, terminating
    /// before binding).
    Other,
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

impl Cache {
    /// An empty cache, with the built-in accelerator table.
    pub fn new() -> Cache {
        Cache::with_accelerators(Arc::default())
    }

    /// An empty cache reading accelerators with `table`.
    pub fn with_accelerators(table: Arc<AcceleratorTable>) -> Cache {
        let mut nodes = NodeTable::new();
        nodes.set_accelerator_kinds(table.api_kinds());
        Cache { accelerators: table, nodes, ..Cache::default() }
    }

    /// How accelerators read.
    pub fn accelerators(&self) -> &Arc<AcceleratorTable> {
        &self.accelerators
    }

    /// The nodes, with what bound and assumed pods hold.
    pub fn nodes(&self) -> &NodeTable {
        &self.nodes
    }

    /// Pods holding resources (bound or assumed).
    pub fn holders(&self) -> usize {
        self.holders.len()
    }

    /// Whether `id` (`namespace/name`) holds resources.
    pub fn holds(&self, id: &str) -> bool {
        self.holders.contains_key(id)
    }

    /// The node `id` is bound or assumed on.
    pub fn node_of(&self, id: &str) -> Option<&str> {
        self.holders.get(id).map(|h| h.node.as_str())
    }

    /// The node `id` holds resources on, and its devices.
    pub fn holding(&self, id: &str) -> Option<(&str, &[DeviceShare])> {
        self.holders.get(id).map(|h| (h.node.as_str(), h.devices.as_slice()))
    }

    /// The pods holding resources on `node`: id, task, devices.
    pub fn holders_on<'a>(&'a self, node: &str) -> impl Iterator<Item = (&'a str, &'a Task, &'a [DeviceShare])> + 'a {
        self.by_node.get(node).into_iter().flatten().filter_map(|id| {
            let h = self.holders.get(id)?;
            Some((id.as_str(), &h.task, h.devices.as_slice()))
        })
    }

    /// Members of the group `namespace/name` holding resources (bound or assumed).
    pub fn count_group(&self, namespace: &str, name: &str) -> usize {
        self.by_group.get(&(namespace.to_string(), name.to_string())).copied().unwrap_or(0)
    }

    /// Applies a Node from the watch stream.
    pub fn apply_node(&mut self, object: &KubeNode) -> Result<(), ConvertError> {
        let node = convert::node(object, &self.accelerators)?;
        let annotations = object.metadata.annotations.as_ref();
        let get = |k: &str| annotations.and_then(|a| a.get(k)).cloned();
        let view =
            NodeView { node, facts: [get(TOPOLOGY_ANNOTATION), get(UNHEALTHY_ANNOTATION), get(DEGRADED_ANNOTATION)] };
        let name = view.node.name.clone();
        if self.views.get(&name) == Some(&view) {
            return Ok(());
        }
        let mut node = view.node.clone();
        for id in self.by_node.get(&name).into_iter().flatten() {
            let Some(h) = self.holders.get_mut(id) else { continue };
            if h.devices.is_empty() && h.task.gpu.count > 0 {
                // Seen bound before its node: choose its devices now that they are known.
                h.devices = wasmsched_api::default_devices(&h.task.gpu, &node).unwrap_or_default();
            }
            account(&mut node, &h.task, &h.devices);
        }
        self.nodes.upsert(node);
        let pairs = view.facts.iter().zip([TOPOLOGY_ANNOTATION, UNHEALTHY_ANNOTATION, DEGRADED_ANNOTATION]);
        let present = pairs.filter_map(|(v, k)| v.as_deref().map(|v| (k, v)));
        match annotation::read_node(present) {
            Ok(mut facts) => {
                if facts.topology.is_none() {
                    facts.topology = self.accelerators.fixed_topology(&view.node.gpus);
                }
                apply_node_facts(&mut self.nodes, &name, facts);
            }
            // A bad annotation costs the topology, never the node.
            Err(e) => tracing::warn!(node = %name, error = %e, "ignoring the node's GPU annotations"),
        }
        self.views.insert(name, view);
        Ok(())
    }

    /// Removes a node; pods bound to it stay recorded so they count again if it returns.
    pub fn delete_node(&mut self, name: &str) {
        self.views.remove(name);
        self.nodes.remove(name);
    }

    /// Names of the nodes known.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.views.keys().map(String::as_str)
    }

    /// Applies a Pod from the watch stream and says what it means for scheduling.
    pub fn apply_pod(&mut self, pod: &Pod, scheduler_name: &str) -> Result<PodPhase, ConvertError> {
        let id = pod_id(pod)?;
        let spec = pod.spec.as_ref().ok_or(ConvertError::Missing("spec"))?;
        let bound_to = spec.node_name.as_deref().filter(|n| !n.is_empty());
        if is_terminal(pod) {
            self.forget(&id);
            return Ok(PodPhase::Other);
        }
        if let Some(node) = bound_to {
            if let Some(h) = self.holders.get_mut(&id) {
                if h.node == node {
                    h.assumed = false;
                    // Labels are the one thing of a running pod that may change (inter-pod
                    // affinity matches them); checked without allocating, as status updates are
                    // the common event.
                    let labels = pod.metadata.labels.iter().flatten();
                    if labels.clone().map(|(k, v)| (k.as_str(), v.as_str())).eq(h
                        .task
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str())))
                    {
                        return Ok(PodPhase::Bound);
                    }
                    h.task.labels = labels.map(|(k, v)| (k.clone(), v.clone())).collect();
                    return Ok(PodPhase::Relabelled);
                }
                // Bound elsewhere than assumed (another scheduler won a race): move it.
                self.forget(&id);
            }
            let task = convert::bound_task(pod, &self.accelerators)?;
            let annotation = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION));
            let devices = match annotation {
                Some(ids) => convert::parse_gpu_ids(ids)?,
                None => self.guess_devices(node, &task),
            };
            self.hold(id, node.to_string(), task, devices, false);
            return Ok(PodPhase::Bound);
        }
        if pod.metadata.deletion_timestamp.is_some() || spec.scheduler_name.as_deref() != Some(scheduler_name) {
            self.forget_unless_assumed(&id);
            return Ok(PodPhase::Other);
        }
        if self.holds(&id) {
            // Assumed, bind in flight: the watch has not caught up yet.
            return Ok(PodPhase::Bound);
        }
        Ok(PodPhase::Pending(Box::new(convert::task(pod, &self.accelerators)?)))
    }

    /// A pod deleted from the API server.
    pub fn delete_pod(&mut self, pod: &Pod) {
        if let Ok(id) = pod_id(pod) {
            self.forget(&id);
        }
    }

    /// Devices for a pod bound without our annotation (bound by another scheduler; the device
    /// plugin chose): count it on the first devices with room, so the totals are right even if the
    /// exact devices are not.
    fn guess_devices(&self, node: &str, task: &Task) -> Vec<DeviceShare> {
        let Some(n) = self.nodes.slot_of(node).and_then(|s| self.nodes.get(s)) else {
            return Vec::new();
        };
        wasmsched_api::default_devices(&task.gpu, n).unwrap_or_default()
    }

    fn hold(&mut self, id: String, node: String, task: Task, devices: Vec<DeviceShare>, assumed: bool) {
        if let Some(slot) = self.nodes.slot_of(&node) {
            self.nodes.update_usage(slot, |n| account(n, &task, &devices));
        }
        self.insert_holder(id, Holder { node, task, devices, assumed });
    }

    /// Indexes a holder by node and group. Callers release an earlier holder of `id` first.
    fn insert_holder(&mut self, id: String, holder: Holder) {
        self.by_node.entry(holder.node.clone()).or_default().insert(id.clone());
        if let Some(group) = &holder.task.group {
            *self.by_group.entry((holder.task.namespace.clone(), group.clone())).or_default() += 1;
        }
        self.holders.insert(id, holder);
    }

    /// Assume `task` on `slot` with `devices` (a single pod's placement), before its bind returns.
    pub fn assume(&mut self, slot: Slot, task: &Task, devices: &[DeviceShare]) {
        let Some(node) = self.nodes.get(slot).map(|n| n.name.clone()) else { return };
        self.hold(task.id.clone(), node, task.clone(), devices.to_vec(), true);
    }

    /// Releases whatever `id` holds (bind failed, pod finished or deleted).
    pub fn forget(&mut self, id: &str) {
        let Some(h) = self.holders.remove(id) else { return };
        if let Some(ids) = self.by_node.get_mut(&h.node) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_node.remove(&h.node);
            }
        }
        if let Some(group) = &h.task.group {
            let key = (h.task.namespace.clone(), group.clone());
            if let Some(n) = self.by_group.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.by_group.remove(&key);
                }
            }
        }
        if let Some(slot) = self.nodes.slot_of(&h.node) {
            self.nodes.update_usage(slot, |n| wasmsched_core::release(n, &h.task, &h.devices));
        }
    }

    /// Releases `id` only if it is still an assumption (its bind failed): if the watch meanwhile
    /// showed it bound — elsewhere, by another scheduler — that record is the truth and stays.
    pub fn forget_assumed(&mut self, id: &str) {
        if self.holders.get(id).is_some_and(|h| h.assumed) {
            self.forget(id);
        }
    }

    fn forget_unless_assumed(&mut self, id: &str) {
        if self.holders.get(id).is_some_and(|h| !h.assumed) {
            self.forget(id);
        }
    }

    /// After a re-list: drops nodes and bound pods the list no longer has (deleted while the watch
    /// was broken). Assumed pods stay: their binds are still in flight.
    pub fn retain_listed(&mut self, nodes: Option<&AHashSet<String>>, pods: Option<&AHashSet<String>>) {
        if let Some(listed) = nodes {
            let gone: Vec<String> = self.views.keys().filter(|n| !listed.contains(*n)).cloned().collect();
            for n in gone {
                self.delete_node(&n);
            }
        }
        if let Some(listed) = pods {
            let gone: Vec<String> = self
                .holders
                .iter()
                .filter(|(id, h)| !h.assumed && !listed.contains(*id))
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                self.forget(&id);
            }
        }
    }
}

/// `namespace/name` of a pod.
pub fn pod_id(pod: &Pod) -> Result<String, ConvertError> {
    let name = pod.metadata.name.as_deref().ok_or(ConvertError::Missing("metadata.name"))?;
    Ok(format!("{}/{name}", pod.metadata.namespace.as_deref().unwrap_or("default")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
    use serde_json::json;

    fn pod(name: &str, group: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": name,
                         "labels": {crate::convert::GROUP_LABEL: group}},
            "spec": {"schedulerName": "wasmsched", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .unwrap()
    }

    #[test]
    fn group_members_are_counted_as_they_are_assumed_bound_and_released() {
        let mut cache = Cache::new();
        let node: KubeNode = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}
        }))
        .unwrap();
        cache.apply_node(&node).unwrap();
        let slot = cache.nodes().slot_of("n1").unwrap();
        let task = |p: &Pod| crate::convert::task(p, &Default::default()).unwrap();

        // Two members assumed by this scheduler, one of another group, one bound by the watch.
        cache.assume(slot, &task(&pod("a", "train", None)), &[]);
        cache.assume(slot, &task(&pod("b", "train", None)), &[]);
        cache.assume(slot, &task(&pod("x", "other", None)), &[]);
        cache.apply_pod(&pod("c", "train", Some("n1")), "wasmsched").unwrap();
        assert_eq!(cache.count_group("ml", "train"), 3);
        assert_eq!(cache.count_group("ml", "other"), 1);
        assert_eq!(cache.count_group("default", "train"), 0, "groups are namespaced");

        // A failed bind, a finished member, a re-list without the bound one.
        cache.forget_assumed("ml/a");
        let mut done = pod("b", "train", Some("n1"));
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        cache.apply_pod(&done, "wasmsched").unwrap();
        assert_eq!(cache.count_group("ml", "train"), 1);
        cache.retain_listed(None, Some(&AHashSet::new()));
        assert_eq!(cache.count_group("ml", "train"), 0);
        assert_eq!(cache.count_group("ml", "other"), 1, "assumed pods survive a re-list");
    }

    /// Every known node's usage is exactly what the pods held on it take, the indexes agree with
    /// the holders, and holders of unknown nodes wait for them.
    fn check(cache: &Cache) {
        let mut groups: AHashMap<(String, String), usize> = AHashMap::new();
        for (id, h) in &cache.holders {
            assert!(cache.by_node.get(&h.node).is_some_and(|ids| ids.contains(id)), "{id} indexed on {}", h.node);
            if let Some(g) = &h.task.group {
                *groups.entry((h.task.namespace.clone(), g.clone())).or_default() += 1;
            }
        }
        assert_eq!(groups, cache.by_group, "group counts");
        let indexed: usize = cache.by_node.values().map(|ids| ids.len()).sum();
        assert_eq!(indexed, cache.holders.len(), "node index");
        for slot in cache.nodes.slots() {
            let n = cache.nodes.get(slot).unwrap();
            let (mut cpu, mut taken) = (0u64, vec![0u64; n.gpus.len()]);
            for (_, task, devices) in cache.holders_on(&n.name) {
                cpu += task.request.cpu_milli;
                for d in devices {
                    taken[d.gpu as usize] += u64::from(d.milli);
                }
            }
            assert_eq!(n.allocated.cpu_milli, cpu, "cpu of {}", n.name);
            for (g, t) in n.gpus.iter().zip(&taken) {
                assert_eq!(u64::from(g.free_milli) + t, 1000, "device {} of {}", g.index, n.name);
            }
            assert_eq!(n.allocated.gpu_milli, taken.iter().sum::<u64>(), "GPUs of {}", n.name);
        }
    }

    #[test]
    fn churn_of_watch_events_keeps_every_node_s_usage_exact() {
        let node = |name: &str| -> KubeNode {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"}}
            }))
            .unwrap()
        };
        let nodes = ["n0", "n1", "n2"];
        for seed in 1..=40u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut below = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let mut cache = Cache::new();
            for n in nodes {
                cache.apply_node(&node(n)).unwrap();
            }
            for _ in 0..400 {
                let id = format!("p{}", below(12));
                let on = nodes[below(3) as usize];
                let mut p = pod(&id, ["train", "serve"][below(2) as usize], None);
                let gpus = below(3);
                if gpus > 0 {
                    let limits = json!({"cpu": "1", "nvidia.com/gpu": gpus.to_string()});
                    p.spec.as_mut().unwrap().containers[0].resources =
                        Some(serde_json::from_value(json!({"requests": limits, "limits": limits})).unwrap());
                }
                match below(9) {
                    // Bound (by anyone), with the devices recorded when it has room for them.
                    0..=2 => {
                        p.spec.as_mut().unwrap().node_name = Some(on.into());
                        if below(2) == 0 {
                            p.spec.as_mut().unwrap().scheduler_name = Some("default-scheduler".into());
                        }
                        if gpus > 0 && cache.holding(&format!("ml/{id}")).is_none() {
                            let free: Vec<u32> = cache
                                .nodes()
                                .slot_of(on)
                                .and_then(|s| cache.nodes().get(s))
                                .map(|n| n.gpus.iter().filter(|g| g.free_milli == 1000).map(|g| g.index).collect())
                                .unwrap_or_default();
                            if free.len() < gpus as usize {
                                continue;
                            }
                            let ids: Vec<String> = free[..gpus as usize].iter().map(u32::to_string).collect();
                            p.metadata.annotations =
                                Some([(GPU_IDS_ANNOTATION.to_string(), ids.join(","))].into_iter().collect());
                        } else if gpus > 0 {
                            continue; // Moving a GPU pod between nodes could over-commit the new one.
                        }
                        let _ = cache.apply_pod(&p, "wasmsched");
                    }
                    // Pending, ours: assumed on a node with room, as a placement would.
                    3 if cache.holding(&format!("ml/{id}")).is_none() => {
                        let task = crate::convert::task(&p, &Default::default()).unwrap();
                        let Some(slot) = cache.nodes().slot_of(on) else { continue };
                        let Some(devices) =
                            cache.nodes().get(slot).and_then(|n| wasmsched_api::default_devices(&task.gpu, n).ok())
                        else {
                            continue;
                        };
                        cache.apply_pod(&p, "wasmsched").unwrap();
                        cache.assume(slot, &task, &devices);
                    }
                    4 => cache.forget_assumed(&format!("ml/{id}")),
                    5 => {
                        p.status.as_mut().unwrap().phase = Some(["Succeeded", "Failed"][below(2) as usize].into());
                        let _ = cache.apply_pod(&p, "wasmsched");
                    }
                    6 => cache.delete_pod(&p),
                    7 => {
                        // A node leaves or comes back (its pods count again on its return).
                        if below(2) == 0 {
                            cache.delete_node(on);
                        } else {
                            cache.apply_node(&node(on)).unwrap();
                        }
                    }
                    _ => {
                        // A re-list that misses some pods and nodes.
                        let pods: AHashSet<String> = cache.holders.keys().filter(|_| below(4) != 0).cloned().collect();
                        let listed: AHashSet<String> =
                            nodes.iter().filter(|_| below(5) != 0).map(|n| n.to_string()).collect();
                        cache.retain_listed(Some(&listed), Some(&pods));
                    }
                }
                check(&cache);
            }
        }
    }
}
