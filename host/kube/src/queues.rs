//! `Queue` objects as the core's queue tree. A queue that does not convert (a bad quantity) is left
//! out with a warning; a tree the core refuses (a cycle, an unknown parent) keeps the previous one,
//! so one bad object never takes every queue down. A `default` root queue exists unless an object
//! of that name defines it: pods without a queue annotation go there.

use std::collections::BTreeMap;

use ahash::AHashMap;
use kube::ResourceExt;
use wasmsched_api::{GPU_MILLI, Resources};
use wasmsched_core::{Admission, Flavor, QueueSpec, QueueTree, add_flavored};

use crate::convert::{ConvertError, resources};
use crate::crd::{Queue, Quota, ResourceFlavor, ResourceList};

/// The queue pods go to when they name none.
pub const DEFAULT_QUEUE: &str = "default";

/// A `Queue` object as the core's spec. Like the capability, borrowing and lending limits bound
/// only what they name; per-flavor quotas become the core's qualified resources.
pub fn spec(q: &Queue) -> Result<QueueSpec, ConvertError> {
    let name = q.metadata.name.clone().ok_or(ConvertError::Missing("metadata.name"))?;
    let plain = quota("spec", &q.spec.quota)?;
    let mut spec = QueueSpec {
        name,
        parent: q.spec.parent.clone(),
        weight: q.spec.weight.max(1),
        guarantee: plain.guarantee,
        capability: plain.capability,
        borrowing_limit: plain.borrowing_limit,
        lending_limit: plain.lending_limit,
        reclaimable: q.spec.reclaimable,
        reclaim_min_runtime_seconds: q.spec.reclaim_min_runtime_seconds,
        reclaim_max_runtime_seconds: q.spec.reclaim_max_runtime_seconds,
        admission: q
            .spec
            .admission
            .as_ref()
            .map(|a| Admission {
                max_jobs: a.max_jobs,
                max_gpus_per_job: a.max_gpus_per_job,
                priority_range: a.priority_range.map(|r| (r.min, r.max)),
            })
            .unwrap_or_default(),
        flavors: Vec::new(),
    };
    for (i, f) in q.spec.flavors.iter().enumerate() {
        let of = quota(&format!("spec.flavors[{i}]"), &f.quota)?;
        spec.flavors.push(f.name.clone());
        add_flavored(&mut spec.guarantee, &f.name, &of.guarantee);
        for (bound, amount) in [
            (&mut spec.capability, of.capability),
            (&mut spec.borrowing_limit, of.borrowing_limit),
            (&mut spec.lending_limit, of.lending_limit),
        ] {
            let Some(amount) = amount else { continue };
            let unbounded = || limits("", &ResourceList::new()).expect("an empty list converts");
            add_flavored(bound.get_or_insert_with(unbounded), &f.name, &amount);
        }
    }
    Ok(spec)
}

/// A [`Quota`] converted (errors name `at`'s fields).
struct Converted {
    guarantee: Resources,
    capability: Option<Resources>,
    borrowing_limit: Option<Resources>,
    lending_limit: Option<Resources>,
}

fn quota(at: &str, q: &Quota) -> Result<Converted, ConvertError> {
    let bound =
        |list: &Option<ResourceList>, what: &str| list.as_ref().map(|l| limits(&format!("{at}.{what}"), l)).transpose();
    Ok(Converted {
        guarantee: amounts(&format!("{at}.guarantee"), &q.guarantee)?,
        capability: bound(&q.capability, "capability")?,
        borrowing_limit: bound(&q.borrowing_limit, "borrowingLimit")?,
        lending_limit: bound(&q.lending_limit, "lendingLimit")?,
    })
}

fn amounts(field: &str, list: &ResourceList) -> Result<Resources, ConvertError> {
    let (mut r, gpus) = resources(field, list)?;
    r.gpu_milli = gpus.saturating_mul(u64::from(GPU_MILLI));
    Ok(r)
}

/// A bound: what it does not name is unbounded (a capability of 16 GPUs says nothing of CPU).
fn limits(field: &str, list: &ResourceList) -> Result<Resources, ConvertError> {
    const UNBOUNDED: u64 = u64::MAX / 4;
    let mut r = amounts(field, list)?;
    let named = |k: &str| list.contains_key(k);
    if !named("cpu") {
        r.cpu_milli = UNBOUNDED;
    }
    if !named("memory") {
        r.memory_bytes = UNBOUNDED;
    }
    if !named(crate::convert::GPU_RESOURCE) {
        r.gpu_milli = UNBOUNDED;
    }
    Ok(r)
}

/// Objects of one kind kept by name (queues, flavors), whole: what the scheduler derives from them
/// is rebuilt when their specs change.
pub struct ByName<K> {
    objects: BTreeMap<String, K>,
    /// The cluster does not serve the kind (its CRD is not installed), and the log said so.
    absent: bool,
}

impl<K> Default for ByName<K> {
    fn default() -> Self {
        ByName { objects: BTreeMap::new(), absent: false }
    }
}

/// A kind [`ByName`] keeps: a name and a spec (status writes are not changes).
pub trait Spec: kube::Resource<DynamicType = ()> {
    /// The part whose change matters.
    type Spec: PartialEq;
    /// It.
    fn spec(&self) -> &Self::Spec;
}

impl Spec for Queue {
    type Spec = crate::crd::QueueSpec;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
}

impl Spec for ResourceFlavor {
    type Spec = crate::crd::ResourceFlavorSpec;
    fn spec(&self) -> &Self::Spec {
        &self.spec
    }
}

impl<K: Spec> ByName<K> {
    /// Records an added or changed object; whether its spec changed (status writes do not).
    pub fn apply(&mut self, k: K) -> bool {
        let Some(name) = k.meta().name.clone() else { return false };
        let changed = self.objects.get(&name).is_none_or(|old| old.spec() != k.spec());
        self.objects.insert(name, k);
        changed
    }

    /// Names of the objects.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.objects.keys().map(String::as_str)
    }

    /// Forgets a deleted object.
    pub fn delete(&mut self, name: &str) {
        self.objects.remove(name);
    }

    /// Keeps only the listed objects (after a re-list).
    pub fn retain(&mut self, listed: &ahash::AHashSet<String>) {
        self.objects.retain(|n, _| listed.contains(n));
    }

    /// Feeds one watch event, `relist` holding the names an ongoing re-list has seen; whether what
    /// is kept changed (a re-list counts once, at its end, and then sets `synced`). A kind the
    /// cluster does not serve counts as listed (there is nothing to wait for, so the first
    /// decisions are not held back), is said once, and is watched until it is installed.
    pub fn on_event(
        &mut self,
        event: kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>,
        relist: &mut Option<ahash::AHashSet<String>>,
        synced: &mut bool,
    ) -> bool {
        use kube::runtime::watcher::Event;
        match event {
            Ok(Event::Init) => {
                *relist = Some(ahash::AHashSet::new());
                false
            }
            Ok(Event::InitApply(k)) => {
                if let Some(listed) = relist.as_mut() {
                    listed.insert(k.name_any());
                }
                self.apply(k);
                false
            }
            Ok(Event::InitDone) => {
                if let Some(listed) = relist.take() {
                    self.retain(&listed);
                }
                if std::mem::take(&mut self.absent) {
                    tracing::info!(kind = %K::kind(&()), "now installed in this cluster");
                }
                *synced = true;
                true
            }
            Ok(Event::Apply(k)) => self.apply(k),
            Ok(Event::Delete(k)) => {
                self.delete(&k.name_any());
                true
            }
            Err(e) if crate::crd::not_installed(&e) => {
                if !std::mem::replace(&mut self.absent, true) {
                    tracing::info!(kind = %K::kind(&()), "not installed in this cluster: none until it is (watched)");
                }
                *synced = true;
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = %K::kind(&()), "watch failed; retrying");
                false
            }
        }
    }
}

/// The `Queue` objects seen, by name.
pub type Queues = ByName<Queue>;

impl Queues {
    /// The tree of every queue that converts, plus the implicit `default` root, with the flavors
    /// (in name order); the errors of those left out, by queue name.
    pub fn tree(&self, flavors: &Flavors) -> (Result<QueueTree, wasmsched_core::QueueError>, AHashMap<String, String>) {
        let mut errors = AHashMap::new();
        let mut specs = Vec::with_capacity(self.objects.len() + 1);
        let known = |f: &String| flavors.objects.contains_key(f);
        for (name, q) in &self.objects {
            match spec(q) {
                // Left out like a bad quantity, not refusing every queue's change with it.
                Ok(s) if !s.flavors.iter().all(known) => {
                    let unknown = s.flavors.iter().find(|f| !known(f)).expect("one is unknown");
                    errors.insert(name.clone(), format!("unknown ResourceFlavor {unknown}"));
                }
                Ok(s) => specs.push(s),
                Err(e) => {
                    errors.insert(name.clone(), e.to_string());
                }
            }
        }
        if !specs.iter().any(|s| s.name == DEFAULT_QUEUE) {
            specs.push(QueueSpec { name: DEFAULT_QUEUE.into(), weight: 1, reclaimable: true, ..Default::default() });
        }
        (QueueTree::with_flavors(flavors.flavors(), parents_first(specs)), errors)
    }
}

/// `specs` with every parent before its children (the core's tree is built in that order; objects
/// come by name). Queues whose parent never appears (unknown, or a cycle) come last, in name order,
/// for the tree to refuse with the reason.
/// `specs` with every parent before its children (the order a queue tree is built in); queues
/// whose parent is missing last.
pub fn parents_first(mut specs: Vec<QueueSpec>) -> Vec<QueueSpec> {
    let mut out: Vec<QueueSpec> = Vec::with_capacity(specs.len());
    let mut placed: ahash::AHashSet<String> = ahash::AHashSet::new();
    loop {
        let before = specs.len();
        let (ready, rest): (Vec<_>, Vec<_>) =
            specs.into_iter().partition(|s| s.parent.as_ref().is_none_or(|p| placed.contains(p)));
        placed.extend(ready.iter().map(|s| s.name.clone()));
        out.extend(ready);
        specs = rest;
        if specs.is_empty() || specs.len() == before {
            out.extend(specs);
            return out;
        }
    }
}

/// The `ResourceFlavor` objects seen, by name.
pub type Flavors = ByName<ResourceFlavor>;

impl Flavors {
    /// The flavors as the core's, in name order (the first whose labels a node carries is its).
    pub fn flavors(&self) -> Vec<Flavor> {
        self.objects
            .iter()
            .map(|(name, f)| Flavor {
                name: name.clone(),
                node_labels: f.spec.node_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                tolerations: f.spec.tolerations.iter().map(crate::convert::toleration).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn queue(value: serde_json::Value) -> Queue {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_kind_the_cluster_does_not_serve_counts_as_listed_until_it_is_installed() {
        use kube::runtime::watcher::{Error, Event};
        let failed = |code: u16| {
            let status =
                kube::core::Status::failure("404 page not found", "Failed to parse error data").with_code(code);
            Err(Error::InitialListFailed(kube::Error::Api(status.boxed())))
        };
        let mut qs = Queues::default();
        let (mut relist, mut synced) = (None, false);
        // Not installed: nothing to wait for, so the first decisions are not held back.
        assert!(!qs.on_event(failed(404), &mut relist, &mut synced));
        assert!(synced);
        assert!(!qs.on_event(failed(404), &mut relist, &mut synced), "retries change nothing");
        // Not allowed (or any other failure) is not absence: the list is still awaited.
        let (mut relist2, mut synced2) = (None, false);
        assert!(!Queues::default().on_event(failed(403), &mut relist2, &mut synced2));
        assert!(!synced2);
        // Installed: the watch lists what is there and the tree changes.
        let team = queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "team"}, "spec": {"weight": 2}}));
        assert!(!qs.on_event(Ok(Event::Init), &mut relist, &mut synced));
        assert!(!qs.on_event(Ok(Event::InitApply(team)), &mut relist, &mut synced));
        assert!(qs.on_event(Ok(Event::InitDone), &mut relist, &mut synced));
        assert_eq!(qs.names().collect::<Vec<_>>(), ["team"]);
    }

    #[test]
    fn queues_convert_with_an_implicit_default_and_bad_ones_are_left_out() {
        let mut qs = Queues::default();
        qs.apply(queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "research"},
            "spec": {"weight": 3, "guarantee": {"nvidia.com/gpu": "8", "cpu": "32"},
                     "capability": {"nvidia.com/gpu": "16"}, "borrowingLimit": {"nvidia.com/gpu": "4"},
                     "lendingLimit": {"nvidia.com/gpu": "2"}, "reclaimable": false,
                     "reclaimMinRuntimeSeconds": 3600, "reclaimMaxRuntimeSeconds": 86400,
                     "admission": {"maxJobs": 2, "maxGPUsPerJob": 16, "priorityRange": {"min": 100, "max": 1000}}}})));
        qs.apply(queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "broken"}, "spec": {"guarantee": {"cpu": "lots"}}})));
        let (tree, errors) = qs.tree(&Flavors::default());
        let tree = tree.unwrap();
        assert_eq!(tree.len(), 2, "research and the implicit default");
        let r = tree.get(tree.index_of("research").unwrap()).unwrap();
        assert_eq!((r.weight, r.guarantee.gpu_milli, r.guarantee.cpu_milli), (3, 8000, 32_000));
        let cap = r.capability.as_ref().unwrap();
        assert_eq!(cap.gpu_milli, 16_000);
        assert!(cap.cpu_milli > 1 << 60, "what a capability does not name is unbounded");
        let i = tree.index_of("research").unwrap();
        assert_eq!(tree.limit(i).unwrap().gpu_milli, 12_000, "guarantee 8 + borrowing 4 is tighter than 16");
        assert!(tree.limit(i).unwrap().cpu_milli > 1 << 60, "the borrowing limit names no CPU");
        // 6 of the 8 guaranteed GPUs stay with research; its CPU guarantee is lent in full.
        let reserved = tree.reserved_against(
            tree.index_of(DEFAULT_QUEUE).unwrap(),
            &tree.unused_reserves(&[Resources::default(), Resources::default()]),
        );
        assert_eq!((reserved.gpu_milli, reserved.cpu_milli), (6000, 0));
        assert!(!r.reclaimable);
        assert_eq!((r.reclaim_min_runtime_seconds, r.reclaim_max_runtime_seconds), (Some(3600), Some(86400)));
        let a = &r.admission;
        assert_eq!((a.max_jobs, a.max_gpus_per_job, a.priority_range), (Some(2), Some(16), Some((100, 1000))));
        assert!(tree.is_leaf(tree.index_of(DEFAULT_QUEUE).unwrap()));
        assert!(errors["broken"].contains("lots"), "{errors:?}");
        // Objects come by name: a child sorting before its parent is still built after it.
        qs.apply(queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "a-team"}, "spec": {"parent": "zeta"}})));
        qs.apply(queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "zeta"}, "spec": {"parent": "research"}})));
        let tree = qs.tree(&Flavors::default()).0.unwrap();
        let (team, zeta) = (tree.index_of("a-team").unwrap(), tree.index_of("zeta").unwrap());
        assert_eq!(tree.parent(team), Some(zeta));
        // A child naming a parent that does not exist: the tree is refused as a whole.
        qs.apply(queue(json!({"apiVersion": "scheduling.wasmsched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "orphan"}, "spec": {"parent": "nowhere"}})));
        assert!(qs.tree(&Flavors::default()).0.is_err());
    }
}
