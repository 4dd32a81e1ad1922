//! This scheduler's pods as the core's workloads. A pod alone is a workload of one; the pods of a
//! pod group form one gang, submitted once min-member of them exist and joined by members created
//! later. What a workload may do to others (preempt) and what others may do to it (checkpoint
//! first) comes from the pod: `preemptionPolicy: Never`, and the checkpoint annotations below.

use k8s_openapi::api::core::v1::Pod;
use wasmsched_api::Task;
use wasmsched_core::{PreemptionPolicy, TopologyConstraint, Workload};

use crate::crd::PodGroup;
use crate::groups::GroupSource;
use crate::groups::owners::OwnerRef;
use crate::priorities::PriorityClasses;

/// Pod annotation: the pod saves a checkpoint when asked, given this many seconds (`true` for the
/// scheduler's default grace period). Such a pod is asked before it is evicted.
pub const CHECKPOINT_ANNOTATION: &str = "scheduling.wasmsched.io/checkpoint";
/// Pod annotation the scheduler writes on a victim that may checkpoint: who needs the room and the
/// deadline (RFC 3339) after which it is evicted anyway.
pub const PREEMPTION_REQUESTED_ANNOTATION: &str = "scheduling.wasmsched.io/preemption-requested";
/// Pod annotation the victim (or its operator) sets to `true` once its checkpoint is saved: it is
/// evicted at once instead of at the deadline.
pub const CHECKPOINTED_ANNOTATION: &str = "scheduling.wasmsched.io/checkpointed";

/// Pod annotations of Kueue's topology-aware scheduling (on a PodSet's template, so on each pod):
/// all of the gang in one domain of this level (a node label) …
pub const KUEUE_REQUIRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-required-topology";
/// … or preferably so, falling back one level up at a time, then anywhere.
pub const KUEUE_PREFERRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-preferred-topology";
/// Kueue's slices: runs of [`KUEUE_SLICE_SIZE`] pods (in name order), each in one domain of this
/// level.
pub const KUEUE_SLICE_TOPOLOGY: &str = "kueue.x-k8s.io/podset-slice-required-topology";
/// Pods per slice.
pub const KUEUE_SLICE_SIZE: &str = "kueue.x-k8s.io/podset-slice-size";

/// The topology levels a cluster is described by, outermost first, when the operator names none
/// (`--topology-levels`): zone, the spine and rack labels of docs/topology.md, and the NVLink
/// domain NVIDIA's DRA driver labels nodes with.
pub const DEFAULT_TOPOLOGY_LEVELS: [&str; 4] =
    ["topology.kubernetes.io/zone", "wasmsched.io/spine", "wasmsched.io/rack", "nvidia.com/gpu.clique"];

/// Pod annotation: a gang that only prefers a level waits this long (s) for one domain of it
/// before it falls back (default `--topology-wait`).
pub const TOPOLOGY_WAIT_ANNOTATION: &str = "scheduling.wasmsched.io/topology-wait-seconds";

/// How the cluster is described for gangs' topology requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTopology {
    /// The levels (node labels), outermost first: where a gang preferring one level falls back to.
    pub levels: Vec<String>,
    /// How long (s) a gang that only prefers a level waits for one domain of it before it falls
    /// back, unless its pods say otherwise (0: at once, as Kueue does).
    pub wait_seconds: u64,
}

impl Default for ClusterTopology {
    fn default() -> Self {
        ClusterTopology { levels: DEFAULT_TOPOLOGY_LEVELS.iter().map(|l| l.to_string()).collect(), wait_seconds: 0 }
    }
}

/// A pod's topology request: a level (node label) and whether its gang must stay in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyRequest {
    /// The level (none: only slices are asked for).
    pub level: Option<String>,
    /// Required (never left), else preferred.
    pub required: bool,
    /// Preferred: its own wait for one domain of the level (s), if it sets one.
    pub wait_seconds: Option<u64>,
    /// Kueue's slices, if asked for (level and size both given, the size a positive number).
    pub slices: Option<wasmsched_core::Slices>,
}

impl TopologyRequest {
    /// The request Kueue's annotations on `pod` make, if any (required wins over preferred).
    fn of(pod: &Pod) -> Option<TopologyRequest> {
        let annotations = pod.metadata.annotations.as_ref()?;
        let level = |k: &str| annotations.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let wait_seconds = level(TOPOLOGY_WAIT_ANNOTATION).and_then(|w| w.parse().ok());
        let size = level(KUEUE_SLICE_SIZE).and_then(|s| s.parse::<usize>().ok()).filter(|&s| s > 0);
        let slices = level(KUEUE_SLICE_TOPOLOGY).zip(size).map(|(level, size)| wasmsched_core::Slices { size, level });
        let (level, required) = match (level(KUEUE_REQUIRED_TOPOLOGY), level(KUEUE_PREFERRED_TOPOLOGY)) {
            (Some(level), _) => (Some(level), true),
            (None, Some(level)) => (Some(level), false),
            (None, None) if slices.is_some() => (None, false),
            (None, None) => return None,
        };
        let wait_seconds = if required { None } else { wait_seconds };
        Some(TopologyRequest { level, required, wait_seconds, slices })
    }

    /// The core's constraint in the `cluster`: required, one domain of the level; preferred, the
    /// level (waiting for one its wait, else the cluster's), then each level above it, then
    /// anywhere. A level the cluster does not list has nothing above it.
    pub fn constraint(&self, cluster: &ClusterTopology) -> TopologyConstraint {
        let Some(level) = &self.level else {
            return TopologyConstraint { slices: self.slices.clone(), ..TopologyConstraint::default() };
        };
        if self.required {
            return TopologyConstraint {
                slices: self.slices.clone(),
                ..TopologyConstraint::single(level.clone(), true)
            };
        }
        let levels = &cluster.levels;
        let tiers = match levels.iter().position(|l| l == level) {
            Some(i) => levels[..=i].iter().rev().cloned().collect(),
            None => vec![level.clone()],
        };
        TopologyConstraint {
            tiers,
            strict: false,
            wait_seconds: self.wait_seconds.unwrap_or(cluster.wait_seconds),
            slices: self.slices.clone(),
        }
    }
}

/// What the scheduler keeps of one of its pods.
#[derive(Clone, Debug)]
pub struct PodFacts {
    /// The pod as a task.
    pub task: Task,
    /// Its UID: binds and events name this incarnation only.
    pub uid: String,
    /// `preemptionPolicy: Never`.
    pub never_preempts: bool,
    /// The API server resolved `spec.priority` (its Priority admission plugin is on).
    pub priority_resolved: bool,
    /// `spec.priorityClassName`: resolved here only when the API server did not.
    pub priority_class: Option<String>,
    /// `Some(grace)` when it checkpoints on request (`None` inside: the default grace period).
    pub checkpoint: Option<Option<u64>>,
    /// It reported its checkpoint saved.
    pub checkpointed: bool,
    /// Bound to a node (by us or before a restart).
    pub bound: bool,
    /// When the pod was created: pods are submitted in this order (FIFO within a priority).
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// When it was scheduled: its `PodScheduled=True` transition (the binding sets it), else its
    /// start. What a run taken over after a restart is billed from.
    pub scheduled: Option<k8s_openapi::jiff::Timestamp>,
    /// Its labels, for the disruption budgets that select it.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its DRA claims (`spec.resourceClaims`, resolved as far as the pod's status says).
    pub claims: Vec<crate::dra::ClaimRef>,
    /// Its containers' requests, when one asks for an extended resource (DRA may serve those).
    pub containers: Vec<crate::dra::extended::ContainerRequests>,
    /// The pod group it names itself, and how ([`crate::groups`]).
    pub group: Option<(GroupSource, String)>,
    /// Its controller: without a group of its own, its owners may make it a gang member.
    pub owner: Option<OwnerRef>,
    /// Kueue's topology request on it, if any.
    pub topology: Option<TopologyRequest>,
    /// The `ComputeDomain` it runs in, if it asks for one ([`crate::compute_domains`]).
    pub compute_domain: Option<crate::compute_domains::DomainRequest>,
    /// Its rank among its gang, where its controller numbers pods: (JobSet's job index, the Job's
    /// completion index). Members are placed in this order, so slices group consecutive ranks.
    pub rank: (Option<u64>, Option<u64>),
}

/// The annotations (or labels) that number a gang's pods: JobSet's child-Job index, then the
/// Indexed Job's completion index.
const RANK_KEYS: [&str; 2] = ["jobset.sigs.k8s.io/job-index", "batch.kubernetes.io/job-completion-index"];

/// A pod's [`PodFacts::rank`] from its annotations, else its labels.
fn rank(pod: &Pod) -> (Option<u64>, Option<u64>) {
    let value = |key: &str| {
        let from = |m: Option<&std::collections::BTreeMap<String, String>>| {
            m.and_then(|m| m.get(key)).and_then(|v| v.parse().ok())
        };
        from(pod.metadata.annotations.as_ref()).or_else(|| from(pod.metadata.labels.as_ref()))
    };
    (value(RANK_KEYS[0]), value(RANK_KEYS[1]))
}

impl PodFacts {
    /// The facts of `pod`, already converted to `task`.
    pub fn new(pod: &Pod, task: Task) -> PodFacts {
        let annotations = pod.metadata.annotations.as_ref();
        let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(|v| v.trim().to_string());
        let checkpoint = annotation(CHECKPOINT_ANNOTATION).and_then(|v| match v.as_str() {
            "true" => Some(None),
            v => v.parse::<u64>().ok().map(Some),
        });
        let spec = pod.spec.as_ref();
        PodFacts {
            task,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            never_preempts: spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never"),
            priority_resolved: spec.is_some_and(|s| s.priority.is_some()),
            priority_class: spec.and_then(|s| s.priority_class_name.clone()).filter(|n| !n.is_empty()),
            checkpoint,
            checkpointed: annotation(CHECKPOINTED_ANNOTATION).as_deref() == Some("true"),
            bound: spec.and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty()),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            scheduled: scheduled_at(pod),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            claims: crate::dra::pod_claims(pod),
            containers: crate::dra::extended::containers(pod),
            group: crate::convert::group_ref(pod),
            owner: OwnerRef::controller_of(&pod.metadata),
            topology: TopologyRequest::of(pod),
            compute_domain: crate::compute_domains::DomainRequest::of(pod),
            rank: rank(pod),
        }
    }

    /// Its task with the priority the API server would have given it: `spec.priority` when set,
    /// else its class's value, else the global default's.
    pub fn task_with_priority(&self, classes: &PriorityClasses) -> Task {
        let mut task = self.task.clone();
        if !self.priority_resolved {
            task.priority = match &self.priority_class {
                Some(name) => classes.value(name).unwrap_or_else(|| classes.default_value()),
                None => classes.default_value(),
            };
        }
        task
    }

    /// Whether it never preempts: its own policy, or (unresolved) its class's.
    fn never_preempts(&self, classes: &PriorityClasses) -> bool {
        self.never_preempts
            || (!self.priority_resolved && self.priority_class.as_deref().is_some_and(|c| classes.never_preempts(c)))
    }
}

/// The key of a pod's group: `namespace/group`.
pub fn group_key(task: &Task) -> Option<String> {
    task.group.as_ref().map(|g| format!("{}/{g}", task.namespace))
}

/// Group settings from a `PodGroup` object.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupInfo {
    /// Members that must be placed together.
    pub min_member: usize,
    /// Keep members inside one value of this node label.
    pub topology_key: Option<String>,
    /// Its queue, when set (else the first member's).
    pub queue: Option<String>,
    /// Its priority, when set (else its class's, else the highest of its members').
    pub priority: Option<i32>,
    /// `priorityClassName`.
    pub priority_class: Option<String>,
    /// How long it may wait before it is given up for a while.
    pub timeout_seconds: Option<u64>,
}

impl GroupInfo {
    /// A gang no object describes (its owner's, or what still runs of a group whose object is
    /// gone): `min_member` of it, in `queue` if given, nothing else set.
    pub fn of_min(min_member: usize, queue: Option<String>) -> GroupInfo {
        GroupInfo { min_member, topology_key: None, queue, priority: None, priority_class: None, timeout_seconds: None }
    }

    /// The settings of `group`.
    pub fn new(group: &PodGroup) -> GroupInfo {
        GroupInfo {
            min_member: group.spec.min_member.max(1) as usize,
            topology_key: group.spec.topology_key.clone(),
            queue: group.spec.queue.clone(),
            priority: group.spec.priority,
            priority_class: group.spec.priority_class_name.clone().filter(|n| !n.is_empty()),
            timeout_seconds: group.spec.schedule_timeout_seconds.map(u64::from),
        }
    }
}

fn options(w: &mut Workload, members: &[&PodFacts], classes: &PriorityClasses) {
    w.preemption = if members.iter().any(|m| m.never_preempts(classes)) {
        PreemptionPolicy::Never
    } else {
        PreemptionPolicy::LowerPriority
    };
    // A group checkpoints only if every member does, with the longest grace any asks for.
    w.checkpointable = !members.is_empty() && members.iter().all(|m| m.checkpoint.is_some());
    w.grace_seconds = members.iter().filter_map(|m| m.checkpoint.flatten()).max();
}

/// A lone pod as a workload named by its `namespace/name`.
pub fn single(pod: &PodFacts, classes: &PriorityClasses) -> Workload {
    let mut w = Workload::single(pod.task_with_priority(classes));
    if pod.compute_domain.is_some() {
        w.topology = Some(TopologyConstraint::single(crate::compute_domains::CLIQUE_LABEL, true));
    }
    options(&mut w, &[pod], classes);
    w
}

/// `w` in `queue`, its members too: the queue its owner names (a group's queue goes before the
/// pods' own).
pub fn set_queue(w: &mut Workload, queue: &str) {
    w.queue = queue.to_string();
    for task in &mut w.members {
        task.queue = queue.to_string();
    }
}

/// The pods of group `key` as one gang, members in rank order, then name order (so placement is
/// reproducible and slices hold consecutive ranks). Its
/// topology: one NVLink domain when a member asks for a `ComputeDomain` (IMEX spans no more), else
/// its group's (the Workload API's constraint), else Kueue's annotations on its first member, in
/// the `cluster`.
pub fn gang(
    key: &str,
    info: &GroupInfo,
    members: &[&PodFacts],
    classes: &PriorityClasses,
    cluster: &ClusterTopology,
) -> Workload {
    let mut sorted: Vec<&PodFacts> = members.to_vec();
    // Numbered pods in rank order (an Indexed Job's `train-10-…` after `train-9-…`), then by name.
    sorted.sort_by(|a, b| {
        let key = |p: &PodFacts| (p.rank.0.is_none(), p.rank.0, p.rank.1.is_none(), p.rank.1);
        key(a).cmp(&key(b)).then_with(|| a.task.id.cmp(&b.task.id))
    });
    let queue = info.queue.clone().or_else(|| sorted.first().map(|m| m.task.queue.clone())).unwrap_or_default();
    let tasks: Vec<Task> = sorted.iter().map(|m| m.task_with_priority(classes)).collect();
    let class = info.priority_class.as_deref().and_then(|name| {
        let value = classes.value(name);
        if value.is_none() {
            tracing::warn!(group = key, class = name, "priority class not found; using the members' priority");
        }
        value
    });
    let priority = info.priority.or(class).unwrap_or_else(|| tasks.iter().map(|t| t.priority).max().unwrap_or(0));
    let mut w = Workload::gang(key, &queue, priority, tasks, info.min_member.min(sorted.len()).max(1));
    w.topology = match &info.topology_key {
        _ if sorted.iter().any(|m| m.compute_domain.is_some()) => {
            Some(TopologyConstraint::single(crate::compute_domains::CLIQUE_LABEL, true))
        }
        Some(key) => Some(TopologyConstraint::single(key.clone(), true)),
        None => sorted.iter().find_map(|m| m.topology.as_ref()).map(|t| t.constraint(cluster)),
    };
    w.timeout_seconds = info.timeout_seconds;
    options(&mut w, &sorted, classes);
    w
}

/// When `pod` was scheduled: as wasmsched wrote it at bind (to the millisecond), else its
/// `PodScheduled=True` transition, else its start.
pub(crate) fn scheduled_at(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let annotations = pod.metadata.annotations.as_ref();
    if let Some(at) = annotations.and_then(|a| a.get(crate::convert::SCHEDULED_AT_ANNOTATION))
        && let Ok(at) = at.parse::<k8s_openapi::jiff::Timestamp>()
    {
        return Some(at);
    }
    let status = pod.status.as_ref()?;
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref());
    condition.or(status.start_time.as_ref()).map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(name: &str, annotations: serde_json::Value, never: bool) -> PodFacts {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"), "annotations": annotations,
                         "labels": {crate::convert::GROUP_LABEL: "g"}},
            "spec": {"schedulerName": "wasmsched", "priority": 5,
                     "preemptionPolicy": if never { "Never" } else { "PreemptLowerPriority" },
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}}]}
        }))
        .unwrap();
        let task = crate::convert::task(&pod, &Default::default()).unwrap();
        PodFacts::new(&pod, task)
    }

    #[test]
    fn a_pod_was_scheduled_when_the_bind_says_to_the_millisecond_else_when_its_condition_says() {
        let pod = |annotations: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
                "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                           "lastTransitionTime": "2026-11-29T10:06:06Z"}]}
            }))
            .unwrap()
        };
        let bound = pod(json!({crate::convert::SCHEDULED_AT_ANNOTATION: "2026-11-29T10:06:05.987Z"}));
        assert_eq!(scheduled_at(&bound).unwrap().to_string(), "2026-11-29T10:06:05.987Z");
        // Bound before the annotation existed, or by another binder: the server's second.
        assert_eq!(scheduled_at(&pod(json!({}))).unwrap().to_string(), "2026-11-29T10:06:06Z");
        let garbled = pod(json!({crate::convert::SCHEDULED_AT_ANNOTATION: "yesterday"}));
        assert_eq!(scheduled_at(&garbled).unwrap().to_string(), "2026-11-29T10:06:06Z");
    }

    #[test]
    fn an_indexed_job_s_members_go_in_completion_index_order_and_a_job_set_s_by_job_first() {
        let info = GroupInfo::of_min(1, None);
        let none = PriorityClasses::default();
        let order = |pods: &[PodFacts]| -> Vec<String> {
            let refs: Vec<&PodFacts> = pods.iter().collect();
            gang("ml/g", &info, &refs, &none, &ClusterTopology::default())
                .members
                .iter()
                .map(|t| t.id.clone())
                .collect()
        };
        let indexed: Vec<PodFacts> = [10, 2, 1]
            .iter()
            .map(|i| {
                facts(
                    &format!("train-{i}-x"),
                    json!({"batch.kubernetes.io/job-completion-index": i.to_string()}),
                    false,
                )
            })
            .collect();
        assert_eq!(order(&indexed), ["ml/train-1-x", "ml/train-2-x", "ml/train-10-x"], "not name order (10 < 2)");
        let set: Vec<PodFacts> = [(1, 0), (0, 1), (0, 0)]
            .iter()
            .map(|(job, i)| {
                let name = format!("w-{job}-{i}");
                facts(
                    &name,
                    json!({"jobset.sigs.k8s.io/job-index": job.to_string(),
                    "batch.kubernetes.io/job-completion-index": i.to_string()}),
                    false,
                )
            })
            .collect();
        assert_eq!(order(&set), ["ml/w-0-0", "ml/w-0-1", "ml/w-1-0"]);
        // Unnumbered pods after numbered ones, by name.
        let mixed = vec![
            facts("b", json!({}), false),
            facts("z", json!({"batch.kubernetes.io/job-completion-index": "0"}), false),
            facts("a", json!({}), false),
        ];
        assert_eq!(order(&mixed), ["ml/z", "ml/a", "ml/b"]);
    }

    #[test]
    fn pods_become_workloads_with_their_group_queue_priority_and_checkpoint_settings() {
        let a = facts("b-1", json!({CHECKPOINT_ANNOTATION: "120"}), false);
        let b = facts("a-0", json!({CHECKPOINT_ANNOTATION: "true", CHECKPOINTED_ANNOTATION: "true"}), false);
        assert_eq!((a.checkpoint, b.checkpoint, b.checkpointed, a.bound), (Some(Some(120)), Some(None), true, false));
        let info = GroupInfo {
            min_member: 4,
            topology_key: Some("rack".into()),
            queue: Some("research".into()),
            priority: None,
            priority_class: None,
            timeout_seconds: Some(60),
        };
        let none = PriorityClasses::default();
        let w = gang("ml/g", &info, &[&a, &b], &none, &ClusterTopology::default());
        assert_eq!(w.members.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["ml/a-0", "ml/b-1"]);
        assert_eq!((w.queue.as_str(), w.priority, w.min_member), ("research", 5, 2));
        assert!(w.checkpointable);
        assert_eq!(w.grace_seconds, Some(120));
        assert_eq!(w.timeout_seconds, Some(60));
        assert!(w.topology.is_some());
        assert_eq!(w.preemption, PreemptionPolicy::LowerPriority);
        // One member that never preempts, one that cannot checkpoint: so is the group.
        let c = facts("c", json!({}), true);
        let w = gang("ml/g", &info, &[&a, &c], &none, &ClusterTopology::default());
        assert_eq!(w.preemption, PreemptionPolicy::Never);
        assert!(!w.checkpointable);
        let s = single(&c, &none);
        assert_eq!((s.name.as_str(), s.queue.as_str()), ("ml/c", "default"));
    }

    #[test]
    fn kueue_s_topology_annotations_become_the_gang_s_levels() {
        let levels = ClusterTopology { wait_seconds: 600, ..ClusterTopology::default() };
        let info = GroupInfo::of_min(2, None);
        let none = PriorityClasses::default();
        let topology = |annotations: serde_json::Value| {
            let (a, b) = (facts("a", annotations.clone(), false), facts("b", annotations, false));
            gang("ml/g", &info, &[&a, &b], &none, &levels).topology
        };
        // Preferred: the clique, then each level above it, then anywhere.
        let preferred = topology(json!({KUEUE_PREFERRED_TOPOLOGY: "nvidia.com/gpu.clique"})).unwrap();
        assert_eq!(
            preferred.tiers,
            ["nvidia.com/gpu.clique", "wasmsched.io/rack", "wasmsched.io/spine", "topology.kubernetes.io/zone"]
        );
        assert!(!preferred.strict);
        assert_eq!(preferred.wait_seconds, 600, "the cluster's wait for one clique");
        let own = topology(json!({KUEUE_PREFERRED_TOPOLOGY: "nvidia.com/gpu.clique", TOPOLOGY_WAIT_ANNOTATION: "60"}));
        assert_eq!(own.unwrap().wait_seconds, 60, "the pods' own wait");
        // Kueue's slices, with a podset level or alone; a slice level without a size is no slice.
        let sliced = topology(json!({KUEUE_REQUIRED_TOPOLOGY: "wasmsched.io/rack",
            KUEUE_SLICE_TOPOLOGY: "nvidia.com/gpu.clique", KUEUE_SLICE_SIZE: "4"}))
        .unwrap();
        let slices = Some(wasmsched_core::Slices { size: 4, level: "nvidia.com/gpu.clique".into() });
        assert_eq!(
            (sliced.tiers.as_slice(), sliced.strict, &sliced.slices),
            (&["wasmsched.io/rack".to_string()][..], true, &slices)
        );
        let alone = topology(json!({KUEUE_SLICE_TOPOLOGY: "nvidia.com/gpu.clique", KUEUE_SLICE_SIZE: "4"})).unwrap();
        assert_eq!((alone.tiers.len(), alone.strict, &alone.slices), (0, false, &slices));
        assert_eq!(topology(json!({KUEUE_SLICE_TOPOLOGY: "nvidia.com/gpu.clique", KUEUE_SLICE_SIZE: "0"})), None);
        // A ComputeDomain needs one NVLink domain, whatever else is asked.
        let imex = topology(json!({KUEUE_PREFERRED_TOPOLOGY: "wasmsched.io/rack",
            crate::compute_domains::COMPUTE_DOMAIN_ANNOTATION: "train"}));
        assert_eq!(imex, Some(TopologyConstraint::single(crate::compute_domains::CLIQUE_LABEL, true)));
        // Required wins over preferred: one rack, never left.
        let required = topology(json!({KUEUE_REQUIRED_TOPOLOGY: "wasmsched.io/rack", KUEUE_PREFERRED_TOPOLOGY: "x"}));
        assert_eq!(required, Some(TopologyConstraint::single("wasmsched.io/rack", true)));
        // A level the cluster does not list: that level alone, then anywhere.
        let unknown = topology(json!({KUEUE_PREFERRED_TOPOLOGY: "example.com/pod"})).unwrap();
        assert_eq!((unknown.tiers, unknown.strict), (vec!["example.com/pod".to_string()], false));
        assert_eq!(topology(json!({KUEUE_PREFERRED_TOPOLOGY: " "})), None, "an empty level is no request");
        // The group's own constraint (the Workload API's) goes first.
        let a = facts("a", json!({KUEUE_PREFERRED_TOPOLOGY: "nvidia.com/gpu.clique"}), false);
        let keyed = GroupInfo { topology_key: Some("rack".into()), ..info.clone() };
        assert_eq!(
            gang("ml/g", &keyed, &[&a], &none, &levels).topology,
            Some(TopologyConstraint::single("rack", true))
        );
    }

    #[test]
    fn priority_classes_give_groups_and_unresolved_pods_their_priority() {
        let mut classes = PriorityClasses::default();
        for (name, value, extra) in [
            ("train-high", 1000, json!({})),
            ("background", -5, json!({"globalDefault": true, "preemptionPolicy": "Never"})),
        ] {
            let mut v = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            classes.apply(&serde_json::from_value(v).unwrap());
        }
        let resolved = facts("r", json!({}), false); // spec.priority 5, set by the API server
        let mut info = GroupInfo { priority_class: Some("train-high".into()), ..GroupInfo::of_min(1, None) };
        assert_eq!(
            gang("ml/g", &info, &[&resolved], &classes, &ClusterTopology::default()).priority,
            1000,
            "the group's class"
        );
        info.priority = Some(7);
        assert_eq!(
            gang("ml/g", &info, &[&resolved], &classes, &ClusterTopology::default()).priority,
            7,
            "an explicit priority wins"
        );
        info.priority = None;
        info.priority_class = Some("no-such-class".into());
        assert_eq!(
            gang("ml/g", &info, &[&resolved], &classes, &ClusterTopology::default()).priority,
            5,
            "the members' priority"
        );

        // A pod the API server did not resolve (admission off): its class, else the global default.
        let unresolved = |class: Option<&str>| {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": "u", "namespace": "ml"},
                "spec": {"schedulerName": "wasmsched", "priorityClassName": class,
                         "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
            }))
            .unwrap();
            PodFacts::new(&pod, crate::convert::task(&pod, &Default::default()).unwrap())
        };
        assert_eq!(single(&unresolved(Some("train-high")), &classes).priority, 1000);
        let w = single(&unresolved(None), &classes);
        assert_eq!((w.priority, w.preemption), (-5, PreemptionPolicy::LowerPriority));
        let w = single(&unresolved(Some("background")), &classes);
        assert_eq!((w.priority, w.preemption), (-5, PreemptionPolicy::Never), "the class's preemption policy");
        assert_eq!(single(&resolved, &classes).priority, 5, "the API server's value stands");
    }
}
