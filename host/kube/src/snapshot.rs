//! The cluster as it is now, as the events that describe it (`wasmsched scenario from-cluster`):
//! each node's capacity, each queue's configuration, and each live pod's arrival — with its
//! placement for a pod already bound — stamped when they happened. A recorded stream and a live
//! snapshot then become a scenario through one conversion: the snapshot is the stream a scheduler
//! would have published, cut at this instant.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceSlice,
};
use kube::Api;
use kube::api::ListParams;
use wasmsched_api::Task;
use wasmsched_core::Workload;
use wasmsched_events::decisions;
use wasmsched_events::schema::Payload;
use wasmsched_events::{Event, Timestamp};

use crate::convert;
use crate::crd::{PodGroup, Queue};

/// A snapshot: its events, when it was taken, and what could not be read.
pub struct Snapshot {
    /// In time order.
    pub events: Vec<Event>,
    /// When it was taken: the scenario's window opens here.
    pub taken: Timestamp,
    /// Objects left out and why, one line each.
    pub notes: Vec<String>,
    /// The cluster's DRA objects, when it serves DRA (`resource.k8s.io/v1`).
    pub dra: Option<DraSnapshot>,
}

/// What a scenario needs of DRA: the devices, the claims that hold some now, and what each
/// pending pod of ours asks for.
#[derive(Debug, Default)]
pub struct DraSnapshot {
    /// ResourceSlices: the devices.
    pub slices: Vec<ResourceSlice>,
    /// DeviceClasses.
    pub classes: Vec<DeviceClass>,
    /// Claims allocated now: they hold their devices.
    pub allocated: Vec<ResourceClaim>,
    /// Per pending pod of ours with claims (its task id), the spec of each, in the pod's order.
    pub pending: BTreeMap<String, Vec<ResourceClaimSpec>>,
}

/// Why a snapshot could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Listing `what` failed.
    #[error("listing {what}: {source}")]
    List {
        /// The kind listed.
        what: &'static str,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
}

/// Whether an API error says the kind is not served (its CRD is not installed).
fn not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Option<Vec<K>>, SnapshotError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(Some(list.items)),
        Err(e) if not_served(&e) => Ok(None),
        Err(source) => Err(SnapshotError::List { what, source }),
    }
}

/// When `pod` was bound (see [`crate::workloads::scheduled_at`]).
fn scheduled_at(pod: &Pod) -> Option<Timestamp> {
    crate::workloads::scheduled_at(pod).map(|t| convert::event_time(&t))
}

/// Take the snapshot: every node, every `Queue`, and every pod that holds or waits for a node —
/// bound pods of any scheduler (they hold what they use) and pending pods of `scheduler_name`.
pub async fn take(
    client: kube::Client,
    scheduler_name: &str,
    accelerators: &crate::accelerators::AcceleratorTable,
) -> Result<Snapshot, SnapshotError> {
    let taken = Timestamp::now();
    let mut notes = Vec::new();
    let mut payloads: Vec<(Timestamp, Payload)> = Vec::new();
    // Nodes and queues are described at the start, as a scheduler does when it starts.
    let start = Timestamp(0);
    let kinds = accelerators.api_kinds();
    let nodes = list(Api::<KubeNode>::all(client.clone()), "nodes").await?.unwrap_or_default();
    for object in &nodes {
        let name = object.metadata.name.clone().unwrap_or_default();
        match convert::node(object, accelerators) {
            Ok(node) => {
                let topology = object
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(wasmsched_topology::annotation::TOPOLOGY_ANNOTATION));
                payloads.push((start, decisions::node_capacity(&node, topology, false, &kinds)));
            }
            Err(e) => notes.push(format!("node {name} left out: {e}")),
        }
    }
    match list(Api::<Queue>::all(client.clone()), "queues").await? {
        Some(queues) => {
            let mut specs = Vec::new();
            for q in &queues {
                match crate::queues::spec(q) {
                    Ok(spec) => specs.push(spec),
                    Err(e) => notes.push(format!("queue {} left out: {e}", q.metadata.name.as_deref().unwrap_or(""))),
                }
            }
            for spec in crate::queues::parents_first(specs) {
                payloads.push((start, decisions::queue_configured(&spec, false)));
            }
        }
        None => notes.push("the Queue CRD is not installed: pods go to queue `default`".into()),
    }
    let min_members: BTreeMap<(String, String), u32> = list(Api::<PodGroup>::all(client.clone()), "podgroups")
        .await?
        .unwrap_or_default()
        .iter()
        .map(|g| {
            let key = (g.metadata.namespace.clone().unwrap_or_default(), g.metadata.name.clone().unwrap_or_default());
            (key, g.spec.min_member)
        })
        .collect();
    let mut dra = dra_objects(&client).await?;
    let pods = list(Api::<Pod>::all(client), "pods").await?.unwrap_or_default();
    // The live pods that hold or want a node, by workload: a gang's members together.
    let mut workloads: BTreeMap<(String, String), Vec<(&Pod, Task)>> = BTreeMap::new();
    let (mut others_pending, mut unreadable) = (0usize, 0usize);
    for pod in &pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if matches!(phase, "Succeeded" | "Failed") || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let spec = pod.spec.as_ref();
        let bound = spec.and_then(|s| s.node_name.as_ref()).is_some();
        let ours = spec.and_then(|s| s.scheduler_name.as_deref()) == Some(scheduler_name);
        if !bound && !ours {
            others_pending += 1;
            continue;
        }
        let task = if bound { convert::bound_task(pod, accelerators) } else { convert::task(pod, accelerators) };
        let Ok(task) = task else {
            unreadable += 1;
            continue;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let key = match convert::group_of(pod) {
            Some(group) => (ns, group),
            None => (ns, task.id.clone()),
        };
        workloads.entry(key).or_default().push((pod, task));
    }
    if others_pending > 0 {
        notes.push(format!("{others_pending} pending pods of other schedulers left out"));
    }
    if unreadable > 0 {
        notes.push(format!("{unreadable} pods the scheduler cannot read left out (as it would leave them)"));
    }
    for ((ns, name), members) in &workloads {
        let tasks: Vec<Task> = members.iter().map(|(_, t)| t.clone()).collect();
        let (queue, priority, grouped) = (tasks[0].queue.clone(), tasks[0].priority, tasks[0].group.is_some());
        let min = min_members.get(&(ns.clone(), name.clone())).map_or(tasks.len(), |&m| (m as usize).max(1));
        let workload = if tasks.len() > 1 || grouped {
            let min = min.min(tasks.len());
            Workload::gang(name, &queue, priority, tasks, min)
        } else {
            Workload::single(tasks.into_iter().next().expect("a workload has a member"))
        };
        for ((pod, _), task) in members.iter().zip(&workload.members) {
            if let Some(dra) = dra.as_mut().filter(|_| pod.spec.as_ref().is_some_and(|s| s.node_name.is_none())) {
                dra.pending_claims(pod, &task.id, &mut notes);
            }
            let created = pod.metadata.creation_timestamp.as_ref().map_or(taken, |t| convert::event_time(&t.0));
            let payload = match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                Some(node) => {
                    let since = scheduled_at(pod).unwrap_or(created);
                    decisions::submitted_running(task, &workload, decisions::Timings::default(), &kinds, node, since)
                }
                None => decisions::submitted(task, &workload, decisions::Timings::default(), &kinds),
            };
            payloads.push((created, payload));
        }
    }
    payloads.sort_by_key(|(t, _)| *t);
    let events = payloads
        .into_iter()
        .enumerate()
        .map(|(i, (time, payload))| Event::new(format!("snapshot-{i}"), "wasmsched/snapshot".into(), time, payload))
        .collect();
    let dra = dra.map(|d| d.snapshot);
    Ok(Snapshot { events, taken, notes, dra })
}

/// The DRA objects being read: the snapshot's part, and the claims and templates pods name.
struct DraReading {
    snapshot: DraSnapshot,
    claims: BTreeMap<(String, String), ResourceClaim>,
    templates: BTreeMap<(String, String), ResourceClaimTemplate>,
}

/// The cluster's DRA objects; `None` when it does not serve DRA.
async fn dra_objects(client: &kube::Client) -> Result<Option<DraReading>, SnapshotError> {
    let Some(slices) = list(Api::<ResourceSlice>::all(client.clone()), "resourceslices").await? else {
        return Ok(None);
    };
    let classes = list(Api::<DeviceClass>::all(client.clone()), "deviceclasses").await?.unwrap_or_default();
    let key = |m: &kube::api::ObjectMeta| (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default());
    let claims: BTreeMap<_, _> = list(Api::<ResourceClaim>::all(client.clone()), "resourceclaims")
        .await?
        .unwrap_or_default()
        .into_iter()
        .map(|c| (key(&c.metadata), c))
        .collect();
    let templates = list(Api::<ResourceClaimTemplate>::all(client.clone()), "resourceclaimtemplates")
        .await?
        .unwrap_or_default()
        .into_iter()
        .map(|t| (key(&t.metadata), t))
        .collect();
    let allocated = claims.values().filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some())).cloned();
    let snapshot = DraSnapshot {
        slices: slices.into_iter().map(without_owners).collect(),
        classes: classes.into_iter().map(without_owners).collect(),
        allocated: allocated.map(without_owners).collect(),
        pending: BTreeMap::new(),
    };
    Ok(Some(DraReading { snapshot, claims, templates }))
}

/// `object` without the server's bookkeeping of field owners, which a scenario has no use for.
fn without_owners<K: kube::Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

impl DraReading {
    /// The specs of the claims pending `pod` (task `id`) asks for: its claim's, or its template's
    /// while the claim does not exist yet. One it shares with others, already allocated, or
    /// that cannot be found is left out of its job and said.
    fn pending_claims(&mut self, pod: &Pod, id: &str, notes: &mut Vec<String>) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let mut specs = Vec::new();
        for claim in crate::dra::pod_claims(pod) {
            let found = match (&claim.claim, &claim.template) {
                (Some(name), template) => match self.claims.get(&(ns.clone(), name.clone())) {
                    Some(c) if c.status.as_ref().is_some_and(|s| s.allocation.is_some()) => Err(format!(
                        "claim {name} is allocated already (it holds its devices): its job asks for no more"
                    )),
                    Some(c) => {
                        if template.is_none() {
                            notes.push(format!(
                                "pod {id}: claim {name} is named, not made from a template: its job asks for devices of \
                                 its own"
                            ));
                        }
                        Ok(c.spec.clone())
                    }
                    None => Err(format!("claim {name} not found: left out of its job")),
                },
                (None, Some(t)) => self
                    .templates
                    .get(&(ns.clone(), t.clone()))
                    .and_then(|t| t.spec.as_ref())
                    .map(|s| s.spec.clone())
                    .ok_or_else(|| format!("template {t} of claim {} not found: left out of its job", claim.name)),
                (None, None) => Err(format!("claim {} names neither a claim nor a template: left out", claim.name)),
            };
            match found {
                // The API requires a spec; the types leave it optional.
                Ok(spec) => specs.push(spec.unwrap_or_default()),
                Err(why) => notes.push(format!("pod {id}: {why}")),
            }
        }
        if !specs.is_empty() {
            self.snapshot.pending.insert(id.to_string(), specs);
        }
    }
}
