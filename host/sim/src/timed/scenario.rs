//! The documented scenario format (`docs/scenario.md`): nodes, a queue hierarchy with quotas, and
//! jobs — lone pods, gangs and elastic jobs — with arrival, duration, priority and checkpointing.
//! JSON or YAML (by file extension); unknown fields are errors, so a typo never silently changes an
//! experiment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaimSpec;
use serde::{Deserialize, Deserializer, Serialize};
use wasmsched_api::fragmentation::Spec;
use wasmsched_api::{
    GpuRequest, MAX_PREFERRED_WEIGHT, PodAffinity, PodAffinityTerm, Resources, SelectorOperator, SelectorRequirement,
    Task,
};
use wasmsched_core::{
    Flavor, NodeTable, PreemptionPolicy, QueueError, QueueSpec, QueueTree, TopologyConstraint, Workload, add_flavored,
};
use wasmsched_topology::NodeTopology;

use super::fabric::Fabric;
use crate::trace::{TraceError, TracePod, gpu_node};

/// A job of the time-driven replay: one pod, a gang (`replicas` > 1) or an elastic job
/// (`min_replicas` < `replicas`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique name.
    pub name: String,
    /// Leaf queue it waits in.
    #[serde(default = "default_queue")]
    pub queue: String,
    /// Arrival time (s; a fraction is rounded to the nearest second, the replay's tick).
    #[serde(deserialize_with = "seconds::whole")]
    pub arrival: u64,
    /// Run time once started (s; fractions rounded, at least 1 s); `None` runs until the end of
    /// the replay.
    #[serde(default, deserialize_with = "seconds::some_whole")]
    pub duration: Option<u64>,
    /// Higher runs first within its queue, and may preempt lower.
    #[serde(default)]
    pub priority: i32,
    /// CPU request of each replica (milli-cores).
    #[serde(default)]
    pub cpu_milli: u64,
    /// Memory request of each replica (MiB).
    #[serde(default)]
    pub memory_mib: u64,
    /// GPUs of each replica (whole GPUs, or 1 shared).
    #[serde(default)]
    pub gpus: u32,
    /// Share of each GPU (milli-GPU, 1..=1000).
    #[serde(default)]
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Pods of the job; more than one makes it a gang.
    #[serde(default = "one")]
    pub replicas: u32,
    /// Fewest replicas that may run (the job is elastic above it); default: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<u32>,
    /// Others may evict it.
    #[serde(default = "yes")]
    pub preemptible: bool,
    /// It may evict others (lower priority in its queue, elastic surplus, reclaim).
    #[serde(default = "yes")]
    pub preempts: bool,
    /// It saves a checkpoint when preempted, taking this long (s); the progress made is kept. Without
    /// it an evicted job starts over.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "seconds::some_whole")]
    pub checkpoint_seconds: Option<u64>,
    /// Grace period it is given to checkpoint (s); default the core's (30 s).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "seconds::some_whole")]
    pub grace_seconds: Option<u64>,
    /// How long an evicted replica takes to stop (s): its GPUs stay in use meanwhile and its
    /// preemptor waits, as on Kubernetes, where an eviction is a graceful deletion. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "seconds::some_whole")]
    pub termination_seconds: Option<u64>,
    /// A gang not placed within this long is given up (s); default the core's (600 s).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "seconds::some_whole")]
    pub timeout: Option<u64>,
    /// Labels of each replica: what other jobs' `pod_affinity` terms select.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Inter-pod affinity and anti-affinity of each replica, as in Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_affinity: Option<PodAffinityConfig>,
    /// DRA: the specs of each replica's ResourceClaims (`resource.k8s.io/v1`, as in a
    /// ResourceClaimTemplate's `spec.spec`): every replica gets claims of its own, allocated from
    /// the devices of the scenario's `dra` objects on the node it is placed on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ResourceClaimSpec>,
    /// Nodes its first replicas already run on when it arrives, one per replica: it is taken over
    /// there, as a scheduler takes over the pods it finds running, and its `duration` counts from
    /// its arrival. What `scenario from-events` and `from-cluster` write for work running when
    /// their window opens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running_on: Vec<String>,
    /// Virtual second its pods are deleted if it has not started by then (the user gave up
    /// waiting): it leaves the queue, what its gang held goes back. A job running then runs on.
    /// What `scenario from-events` writes for work withdrawn while it waited.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "seconds::some_whole")]
    pub withdraw_at: Option<u64>,
    /// Where its replicas go together: one domain of a topology level (node labels: an NVLink
    /// clique, a rack, a block). A gang's, or an elastic job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<GangTopology>,
    /// Its GPUs are of this accelerator kind (absent: NVIDIA's), whole devices only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
}

/// An accelerator kind besides NVIDIA's, as a node offers and a job asks for it: the kind's name
/// and the device plugin's resource it is counted as (`{kind: amd, resource: amd.com/gpu}`), as
/// on Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accelerator {
    /// The kind's name (`amd`, `gaudi`, …; `nvidia` is the default and is not written).
    pub kind: String,
    /// The extended resource its devices count as.
    pub resource: String,
}

impl Accelerator {
    fn problem(&self) -> Option<String> {
        (self.kind.is_empty() || self.kind == wasmsched_api::accelerators::NVIDIA || self.resource.is_empty())
            .then(|| format!("accelerator {self:?}: a kind other than nvidia, and its resource"))
    }
}

/// A job's topology request: levels named by node labels. Its replicas go to one domain of the
/// first `preferred` level that has one with room for them, else of the next (innermost first),
/// then of `required`; without `required`, finally anywhere. Kueue's `preferred` and `required`
/// levels, and the Workload API's topology constraint, read as this.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangTopology {
    /// Levels to try, innermost first (e.g. `[nvidia.com/gpu.clique, example.com/block]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<String>,
    /// The level its replicas never leave: all in one domain of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<String>,
    /// Without `required`: how long (s) it waits for a domain of its first `preferred` level
    /// before it falls back (0: at once, as Kueue does).
    #[serde(default, skip_serializing_if = "is_zero", deserialize_with = "seconds::whole")]
    pub wait_seconds: u64,
    /// Kueue's slices: its replicas in runs of `size` (in order), each in one domain of `level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slices: Option<GangSlices>,
}

/// Runs of `size` consecutive replicas, each inside one domain of `level`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangSlices {
    /// Replicas per run (at least 1).
    pub size: u32,
    /// The level (a node label).
    pub level: String,
}

impl From<GangSlices> for wasmsched_core::Slices {
    fn from(s: GangSlices) -> Self {
        wasmsched_core::Slices { size: s.size as usize, level: s.level }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl GangTopology {
    /// The core's constraint: the levels to try in order, strict when one is required.
    pub fn constraint(&self) -> TopologyConstraint {
        let mut tiers = self.preferred.clone();
        if let Some(required) = &self.required
            && !tiers.contains(required)
        {
            tiers.push(required.clone());
        }
        TopologyConstraint {
            tiers,
            strict: self.required.is_some(),
            wait_seconds: self.wait_seconds,
            slices: self.slices.clone().map(|s| s.into()),
        }
    }

    /// What is wrong with it, if anything.
    fn problem(&self) -> Option<String> {
        let levels: Vec<&String> = self.preferred.iter().chain(&self.required).collect();
        if levels.is_empty() && self.slices.is_none() {
            return Some("topology names no level (`preferred`, `required` or `slices`)".into());
        }
        if let Some(s) = &self.slices
            && (s.size == 0 || s.level.trim().is_empty())
        {
            return Some("topology: `slices` needs a `size` of at least 1 and a `level`".into());
        }
        if levels.iter().any(|l| l.trim().is_empty()) {
            return Some("topology names an empty level".into());
        }
        if self.wait_seconds > 0 && self.required.is_some() {
            return Some("topology: `wait_seconds` is for preferred levels; a required level is never left".into());
        }
        let distinct: BTreeSet<&String> = self.preferred.iter().collect();
        if distinct.len() < self.preferred.len() {
            return Some("topology names a preferred level twice".into());
        }
        if let Some(required) = &self.required
            && self.preferred.iter().position(|p| p == required).is_some_and(|i| i + 1 < self.preferred.len())
        {
            return Some(format!("topology: preferred levels after the required one {required:?} could never be used"));
        }
        None
    }
}

/// A job's inter-pod affinity (Kubernetes' `podAffinity` and `podAntiAffinity`, in the scenario's
/// snake case). Every replica of the job carries it; the replicas of a gang see each other.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodAffinityConfig {
    /// Each term's domain must hold a pod it selects (the first of a group goes anywhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<PodTerm>,
    /// No term's domain may hold a pod it selects (symmetric: running pods' terms count too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_required: Vec<PodTerm>,
    /// Nodes whose domain holds a selected pod score the term's `weight`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<PodTerm>,
    /// Nodes whose domain holds no selected pod score the term's `weight`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_preferred: Vec<PodTerm>,
}

/// One pod (anti-)affinity term: the pods it selects (all of `match_labels` and
/// `match_expressions`; neither selects every pod) and the node label whose values are its
/// domains (`kubernetes.io/hostname`: one node; every scenario node has it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodTerm {
    /// Labels a selected pod has, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements on a selected pod's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelRequirement>,
    /// Node label naming the domain.
    pub topology_key: String,
    /// Preferred terms only: 1..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// A requirement on a pod label: `operator` is `In`, `NotIn`, `Exists` or `DoesNotExist`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRequirement {
    /// Label key.
    pub key: String,
    /// Comparison.
    pub operator: String,
    /// `In`/`NotIn`: one or more values; otherwise none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The label every scenario node carries with its name, so that a pod affinity term can have
/// single nodes as its domains as in Kubernetes.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

impl PodTerm {
    fn term(&self) -> Result<PodAffinityTerm, String> {
        let mut selector: Vec<SelectorRequirement> =
            self.match_labels.iter().map(|(k, v)| SelectorRequirement::equals(k, v)).collect();
        for r in &self.match_expressions {
            let operator = SelectorOperator::of_label_selector(&r.operator)
                .ok_or_else(|| format!("unknown operator {:?} (In, NotIn, Exists, DoesNotExist)", r.operator))?;
            selector.push(SelectorRequirement { key: r.key.clone(), operator, values: r.values.clone() });
        }
        Ok(PodAffinityTerm { selector: Some(selector), namespaces: None, topology_key: self.topology_key.clone() })
    }

    fn weighted(&self) -> Result<(u32, PodAffinityTerm), String> {
        match self.weight {
            Some(w) if (1..=MAX_PREFERRED_WEIGHT).contains(&w) => Ok((w, self.term()?)),
            Some(w) => Err(format!("weight {w} is not in 1..={MAX_PREFERRED_WEIGHT}")),
            None => Err("a preferred term needs a weight".into()),
        }
    }
}

impl PodAffinityConfig {
    /// The core's form, validated.
    pub fn resolve(&self) -> Result<PodAffinity, String> {
        let required = |terms: &[PodTerm]| {
            terms
                .iter()
                .map(|t| match t.weight {
                    Some(_) => Err("a required term has no weight".to_string()),
                    None => t.term(),
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let preferred = |terms: &[PodTerm]| terms.iter().map(PodTerm::weighted).collect::<Result<Vec<_>, _>>();
        let affinity = PodAffinity {
            affinity: required(&self.required)?,
            anti_affinity: required(&self.anti_required)?,
            preferred: preferred(&self.preferred)?,
            anti_preferred: preferred(&self.anti_preferred)?,
        };
        affinity.validate()?;
        Ok(affinity)
    }
}

fn default_queue() -> String {
    "default".into()
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

impl Default for Job {
    fn default() -> Self {
        Job {
            name: String::new(),
            queue: default_queue(),
            arrival: 0,
            duration: None,
            priority: 0,
            cpu_milli: 0,
            memory_mib: 0,
            gpus: 0,
            gpu_milli: 0,
            gpu_models: Vec::new(),
            replicas: 1,
            min_replicas: None,
            preemptible: true,
            preempts: true,
            checkpoint_seconds: None,
            grace_seconds: None,
            termination_seconds: None,
            timeout: None,
            labels: BTreeMap::new(),
            pod_affinity: None,
            claims: Vec::new(),
            running_on: Vec::new(),
            withdraw_at: None,
            topology: None,
            accelerator: None,
        }
    }
}

impl Job {
    /// An openb pod as a job: queue = its QoS class, arrival = creation time, duration = deletion
    /// minus creation. `compress` divides arrival times (> 1 raises the load; durations unchanged).
    pub fn from_trace(pod: &TracePod, compress: f64) -> Job {
        let arrival = pod.creation_time.unwrap_or(0);
        Job {
            name: pod.name.clone(),
            queue: if pod.qos.is_empty() { default_queue() } else { pod.qos.clone() },
            arrival: (arrival as f64 / compress) as u64,
            duration: pod.deletion_time.map(|d| d.saturating_sub(arrival)),
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            gpus: pod.num_gpu,
            gpu_milli: if pod.num_gpu == 0 { 0 } else { pod.gpu_milli },
            gpu_models: pod.gpu_spec.clone(),
            ..Job::default()
        }
    }

    /// One replica's task.
    pub(crate) fn task(&self, id: String) -> Task {
        Task {
            id,
            namespace: "sim".into(),
            queue: self.queue.clone(),
            priority: self.priority,
            request: Resources {
                cpu_milli: self.cpu_milli,
                memory_bytes: self.memory_mib.saturating_mul(1 << 20),
                // Its claims' devices, counted by class like extended resources, and another
                // kind's devices as that kind's resource.
                extended: self.extended().into(),
                ..Default::default()
            },
            gpu: if self.gpus == 0 {
                GpuRequest::default()
            } else {
                GpuRequest {
                    count: self.gpus,
                    milli_per_gpu: self.gpu_milli,
                    models: self.gpu_models.clone(),
                    kind: self.accelerator.as_ref().map(|a| a.kind.as_str().into()).unwrap_or_default(),
                    ..Default::default()
                }
            },
            labels: self.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            // Validated when the scenario was read.
            pod_affinity: self
                .pod_affinity
                .as_ref()
                .and_then(|a| a.resolve().ok())
                .filter(|a| !a.is_empty())
                .map(Box::new),
            ..Default::default()
        }
    }

    /// The extended resources one replica asks for: its claims' classes and its accelerator's.
    fn extended(&self) -> Vec<(wasmsched_api::ResourceName, u64)> {
        let mut r = class_counts(&self.claims);
        if let Some(a) = self.accelerator.as_ref().filter(|_| self.gpus > 0) {
            r.push((a.resource.as_str().into(), u64::from(self.gpus)));
            r.sort();
        }
        r
    }

    /// Task ids of its replicas: the job's name for a lone pod, `name-i` for a gang's members.
    pub fn task_ids(&self) -> Vec<String> {
        if self.replicas <= 1 {
            vec![self.name.clone()]
        } else {
            (0..self.replicas).map(|i| format!("{}-{i}", self.name)).collect()
        }
    }

    /// The job as the core's workload.
    pub fn workload(&self) -> Workload {
        let group = (self.replicas > 1).then(|| self.name.clone());
        let members: Vec<Task> =
            self.task_ids().into_iter().map(|id| Task { group: group.clone(), ..self.task(id) }).collect();
        let min = self.min_replicas.unwrap_or(self.replicas).max(1) as usize;
        let mut w = Workload::gang(&self.name, &self.queue, self.priority, members, min);
        w.timeout_seconds = self.timeout;
        w.preemption = if self.preempts { PreemptionPolicy::LowerPriority } else { PreemptionPolicy::Never };
        w.preemptible = self.preemptible;
        w.checkpointable = self.checkpoint_seconds.is_some();
        w.grace_seconds = self.grace_seconds;
        w.topology = self.topology.as_ref().map(GangTopology::constraint);
        w
    }

    /// The job's shape, as FGD's target workload counts it: NVIDIA GPUs only (FGD measures shared
    /// GPUs; another kind's job is CPU work to it).
    pub(crate) fn spec(&self) -> Spec {
        let gpu = self.gpus > 0 && self.accelerator.is_none();
        Spec {
            cpu_milli: self.cpu_milli,
            milli: if gpu { self.gpu_milli } else { 0 },
            count: if gpu { self.gpus } else { 0 },
            models: if gpu { self.gpu_models.join("|") } else { String::new() },
        }
    }

    /// GPU milli-units of one replica; a DRA device its claims count is a whole GPU (the
    /// replay's allocation figures count DRA devices as GPUs).
    pub(crate) fn replica_gpu_milli(&self) -> u64 {
        let devices: u64 = class_counts(&self.claims).iter().map(|(_, n)| n).sum();
        u64::from(self.gpus) * u64::from(self.gpu_milli) + devices * u64::from(wasmsched_api::GPU_MILLI)
    }
}

/// An amount of resources in a queue's guarantee or capability, in the units users think in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amount {
    /// Milli-cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_milli: Option<u64>,
    /// MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// GPUs (fractions allowed: 0.5 is 500 milli-GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<f64>,
    /// Extended resources by name, e.g. another accelerator kind's devices (`amd.com/gpu: 16`);
    /// in a capability, those not named are unbounded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
}

impl Amount {
    /// As resources; dimensions left out are `unset` (0 for a guarantee, unbounded for a
    /// capability).
    fn resources(&self, unset: u64) -> Result<Resources, String> {
        let gpu_milli = match self.gpus {
            None => unset,
            Some(g) if (0.0..=1e9).contains(&g) => (g * 1000.0).round() as u64,
            Some(g) => return Err(format!("gpus must be a non-negative number, not {g}")),
        };
        Ok(Resources {
            cpu_milli: self.cpu_milli.unwrap_or(unset),
            memory_bytes: self.memory_mib.map_or(unset, |m| m.saturating_mul(1 << 20)),
            gpu_milli,
            extended: self.resources.iter().map(|(n, v)| (n.as_str().into(), *v)).collect(),
        })
    }
}

/// A queue of a scenario: written as just its name (weight 1, no guarantee or cap, reclaimable),
/// or in full.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueConfig {
    /// Unique name.
    pub name: String,
    /// Parent queue (defined earlier in the list); `None` for a top-level queue.
    pub parent: Option<String>,
    /// Weight among its siblings.
    pub weight: u32,
    /// Always obtainable, never reclaimed.
    pub guarantee: Amount,
    /// Most it may hold; `None` for unbounded.
    pub capability: Option<Amount>,
    /// How far above its guarantee it may borrow; `None` for unbounded.
    pub borrowing_limit: Option<Amount>,
    /// How much of its unused guarantee others may use; `None` for all of it.
    pub lending_limit: Option<Amount>,
    /// Others may reclaim what it borrows above its deserved share.
    pub reclaimable: bool,
    /// How long (s) its runs are safe from reclaim; `None`: the replay's `--reclaim-min-runtime`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim_min_runtime: Option<u64>,
    /// Runs older than this (s) are never reclaimed for a share above the reclaiming queue's
    /// guarantee; 0: no limit; `None`: the replay's `--reclaim-max-runtime`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim_max_runtime: Option<u64>,
    /// Admission limits; a job they refuse never waits (its outcome says why).
    pub admission: AdmissionConfig,
    /// Quota per resource flavor, in the order its jobs try the flavors; empty: its parent's
    /// flavors (a top-level queue's: all of them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flavors: Vec<FlavorQuota>,
}

/// A queue's quota on the nodes of one flavor; what it leaves out is unbounded (a guarantee: 0).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlavorQuota {
    /// The flavor (declared in the scenario's `flavors`).
    pub name: String,
    /// Always obtainable on the flavor's nodes.
    #[serde(default)]
    pub guarantee: Amount,
    /// Most it may hold on them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Amount>,
    /// How far above its guarantee it may borrow on them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Amount>,
    /// How much of its unused guarantee on them others may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Amount>,
}

/// A resource flavor of a scenario: the nodes carrying all of `node_labels` (the first flavor that
/// matches a node wins; `gpu-model` is every node's label with its GPU model).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlavorConfig {
    /// Unique name, without `/`.
    pub name: String,
    /// Labels its nodes carry.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
}

/// A queue's admission limits in a scenario: `{max_jobs, max_gpus_per_job, priority_range: [min, max]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Most jobs pending and running in the queue at once.
    #[serde(default)]
    pub max_jobs: Option<u32>,
    /// Most GPUs one job may request, all replicas counted.
    #[serde(default)]
    pub max_gpus_per_job: Option<u32>,
    /// Inclusive priority range.
    #[serde(default)]
    pub priority_range: Option<[i32; 2]>,
}

impl QueueConfig {
    /// A queue with only a name.
    pub fn named(name: &str) -> Self {
        QueueConfig {
            name: name.into(),
            parent: None,
            weight: 1,
            guarantee: Amount::default(),
            capability: None,
            borrowing_limit: None,
            lending_limit: None,
            reclaimable: true,
            reclaim_min_runtime: None,
            reclaim_max_runtime: None,
            admission: AdmissionConfig::default(),
            flavors: Vec::new(),
        }
    }

    fn spec(&self) -> Result<QueueSpec, String> {
        let bad = |e: String| format!("queue {:?}: {e}", self.name);
        let mut spec = self.plain_spec().map_err(bad)?;
        for f in &self.flavors {
            let bad = |e: String| format!("queue {:?}: flavor {:?}: {e}", self.name, f.name);
            if spec.flavors.contains(&f.name) {
                return Err(bad("listed twice".into()));
            }
            spec.flavors.push(f.name.clone());
            add_flavored(&mut spec.guarantee, &f.name, &f.guarantee.resources(0).map_err(bad)?);
            for (bound, amount) in [
                (&mut spec.capability, &f.capability),
                (&mut spec.borrowing_limit, &f.borrowing_limit),
                (&mut spec.lending_limit, &f.lending_limit),
            ] {
                let Some(amount) = amount else { continue };
                let unbounded = || Amount::default().resources(u64::MAX / 4).expect("no quantities to refuse");
                add_flavored(
                    bound.get_or_insert_with(unbounded),
                    &f.name,
                    &amount.resources(u64::MAX / 4).map_err(bad)?,
                );
            }
        }
        Ok(spec)
    }

    fn plain_spec(&self) -> Result<QueueSpec, String> {
        let bad = |e: String| e;
        Ok(QueueSpec {
            name: self.name.clone(),
            parent: self.parent.clone(),
            weight: self.weight,
            guarantee: self.guarantee.resources(0).map_err(bad)?,
            capability: self.capability.as_ref().map(|c| c.resources(u64::MAX / 4)).transpose().map_err(bad)?,
            borrowing_limit: self
                .borrowing_limit
                .as_ref()
                .map(|c| c.resources(u64::MAX / 4))
                .transpose()
                .map_err(bad)?,
            lending_limit: self.lending_limit.as_ref().map(|c| c.resources(u64::MAX / 4)).transpose().map_err(bad)?,
            reclaimable: self.reclaimable,
            reclaim_min_runtime_seconds: self.reclaim_min_runtime,
            reclaim_max_runtime_seconds: self.reclaim_max_runtime,
            admission: wasmsched_core::Admission {
                max_jobs: self.admission.max_jobs,
                max_gpus_per_job: self.admission.max_gpus_per_job,
                priority_range: self.admission.priority_range.map(|[a, b]| (a, b)),
            },
            flavors: Vec::new(),
        })
    }
}

impl<'de> Deserialize<'de> for QueueConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            name: String,
            #[serde(default)]
            parent: Option<String>,
            #[serde(default = "one")]
            weight: u32,
            #[serde(default)]
            guarantee: Amount,
            #[serde(default)]
            capability: Option<Amount>,
            #[serde(default)]
            borrowing_limit: Option<Amount>,
            #[serde(default)]
            lending_limit: Option<Amount>,
            #[serde(default = "yes")]
            reclaimable: bool,
            #[serde(default, deserialize_with = "seconds::some_whole")]
            reclaim_min_runtime: Option<u64>,
            #[serde(default, deserialize_with = "seconds::some_whole")]
            reclaim_max_runtime: Option<u64>,
            #[serde(default)]
            admission: AdmissionConfig,
            #[serde(default)]
            flavors: Vec<FlavorQuota>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = QueueConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a queue name or a queue object {name, parent, weight, guarantee, capability, borrowing_limit, lending_limit, reclaimable, reclaim_min_runtime, reclaim_max_runtime, admission, flavors}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<QueueConfig, E> {
                Ok(QueueConfig::named(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<QueueConfig, A::Error> {
                let f = Full::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(QueueConfig {
                    name: f.name,
                    parent: f.parent,
                    weight: f.weight,
                    guarantee: f.guarantee,
                    capability: f.capability,
                    borrowing_limit: f.borrowing_limit,
                    lending_limit: f.lending_limit,
                    reclaimable: f.reclaimable,
                    reclaim_min_runtime: f.reclaim_min_runtime,
                    reclaim_max_runtime: f.reclaim_max_runtime,
                    admission: f.admission,
                    flavors: f.flavors,
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The queue tree of `configs`; work goes to leaf queues.
pub fn queue_tree(configs: &[QueueConfig]) -> Result<QueueTree, String> {
    queue_tree_with(&[], configs)
}

/// [`queue_tree`] with resource flavors (whose quotas the queues may name).
pub fn queue_tree_with(flavors: &[FlavorConfig], configs: &[QueueConfig]) -> Result<QueueTree, String> {
    let specs = configs.iter().map(QueueConfig::spec).collect::<Result<Vec<_>, _>>()?;
    let flavors = flavors
        .iter()
        .map(|f| Flavor {
            name: f.name.clone(),
            node_labels: f.node_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            tolerations: Vec::new(),
        })
        .collect();
    QueueTree::with_flavors(flavors, specs).map_err(|e: QueueError| e.to_string())
}

/// One flat queue per distinct queue name of `jobs` (how openb traces replay: queue = QoS class).
pub fn flat_queues(jobs: &[Job]) -> Vec<QueueConfig> {
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    names.into_iter().map(QueueConfig::named).collect()
}

/// What `claims` ask of each DeviceClass, summed, as the core counts it.
fn class_counts(claims: &[ResourceClaimSpec]) -> Vec<(wasmsched_api::ResourceName, u64)> {
    let mut total: BTreeMap<wasmsched_api::ResourceName, u64> = BTreeMap::new();
    for (resource, n) in claims.iter().flat_map(wasmsched_dra::class_counts) {
        *total.entry(resource).or_default() += n;
    }
    total.into_iter().collect()
}

/// DRA in a scenario: the objects a cluster's DRA drivers and administrators publish.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraConfig {
    /// Files of ResourceSlices and DeviceClasses (and, optionally, Nodes for their labels), as
    /// `kubectl get -o yaml` or multi-document YAML gives them; paths relative to the scenario.
    pub objects: Vec<String>,
}

/// A node of a scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioNode {
    /// Unique name.
    pub name: String,
    /// CPU (milli-cores).
    pub cpu_milli: u64,
    /// Memory (MiB).
    pub memory_mib: u64,
    /// GPUs.
    #[serde(default)]
    pub gpus: u32,
    /// GPU model.
    #[serde(default)]
    pub model: String,
    /// `nvidia-smi topo -m` output of the node, a path relative to the scenario file; its GPU count
    /// must equal `gpus`. Read by [`Scenario::load`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// Node labels (besides `gpu-model`, which every node has), e.g. for flavors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its GPUs are of this accelerator kind (absent: NVIDIA's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
}

/// A scenario: the cluster, the queues jobs may name, and the jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The cluster.
    pub nodes: Vec<ScenarioNode>,
    /// Resource flavors: kinds of node with quotas of their own (first match wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flavors: Vec<FlavorConfig>,
    /// The queues, parents before children; jobs name leaf queues.
    pub queues: Vec<QueueConfig>,
    /// The jobs.
    pub jobs: Vec<Job>,
    /// DRA devices of the nodes (read by [`Scenario::load`]), for jobs with `claims`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraConfig>,
    /// Topology levels beyond the node, innermost first (node labels, e.g.
    /// `[nvidia.com/gpu.clique, example.com/block]`): the domains whose free capacity the core
    /// keeps, which policies read (`domain-packing`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<String>,
    /// The interconnect: which domains a gang should not span, and what spanning costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

/// Whether `path` names a YAML file (else JSON).
fn is_yaml(file: &str) -> bool {
    file.ends_with(".yaml") || file.ends_with(".yml")
}

/// `text` as YAML (when `file` says so) or JSON; errors name the file, line and column.
fn read<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> Result<T, TraceError> {
    let bad = |line: usize, column: usize, message: String| TraceError::Malformed {
        file: file.into(),
        line,
        column,
        message,
    };
    if is_yaml(file) {
        serde_yaml_ng::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            bad(line, column, e.to_string())
        })
    } else {
        serde_json::from_str(text).map_err(|e| bad(e.line(), e.column(), e.to_string()))
    }
}

/// A scenario with its jobs still unread, for [`Scenario::parse_lenient`]: a malformed job is then
/// one job to skip, not a malformed file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    nodes: Vec<ScenarioNode>,
    #[serde(default)]
    flavors: Vec<FlavorConfig>,
    queues: Vec<QueueConfig>,
    jobs: Vec<serde_json::Value>,
    #[serde(default)]
    dra: Option<DraConfig>,
    #[serde(default)]
    levels: Vec<String>,
    #[serde(default)]
    fabric: Option<Fabric>,
}

/// A scenario read from a file by [`Scenario::load_lenient`].
#[derive(Debug)]
pub struct Loaded {
    /// The scenario (without the jobs left out).
    pub scenario: Scenario,
    /// The topologies its nodes name, by node.
    pub topologies: BTreeMap<String, NodeTopology>,
    /// Jobs left out, each as `job N (name): reason`.
    pub skipped: Vec<String>,
    /// The DRA objects its `dra` names.
    pub dra: Option<wasmsched_dra::Objects>,
}

/// What is wrong with job `j` among the jobs and pod names seen so far (which it joins when fine).
/// The latest time a scenario may name (s, about 31,700 years): sums of times stay far from
/// overflowing, and no real replay comes near it.
pub const MAX_SECONDS: u64 = 1_000_000_000_000;

fn job_problem(j: &Job, tree: &QueueTree, jobs: &mut BTreeSet<String>, tasks: &mut BTreeSet<String>) -> Option<String> {
    if jobs.contains(&j.name) {
        return Some(format!("job {:?} appears twice", j.name));
    }
    match tree.index_of(&j.queue) {
        None => return Some(format!("job {:?} names unknown queue {:?}", j.name, j.queue)),
        Some(q) if !tree.is_leaf(q) => {
            return Some(format!("job {:?}: queue {:?} has child queues; jobs go to leaf queues", j.name, j.queue));
        }
        Some(_) => {}
    }
    let times = [
        ("arrival", Some(j.arrival)),
        ("duration", j.duration),
        ("checkpoint_seconds", j.checkpoint_seconds),
        ("grace_seconds", j.grace_seconds),
        ("termination_seconds", j.termination_seconds),
        ("timeout", j.timeout),
        ("withdraw_at", j.withdraw_at),
    ];
    if let Some((what, t)) = times.iter().find_map(|(w, t)| t.filter(|&t| t > MAX_SECONDS).map(|t| (w, t))) {
        return Some(format!("job {:?}: {what} {t} s is beyond {MAX_SECONDS} s", j.name));
    }
    let shared_ok = j.gpus == 1 && (1..=1000).contains(&j.gpu_milli);
    let whole_ok = j.gpus > 1 && j.gpus <= 64 && j.gpu_milli == 1000;
    if j.gpus > 0 && !(shared_ok || whole_ok) {
        return Some(format!("job {:?}: {} GPUs × {} milli is not a valid GPU request", j.name, j.gpus, j.gpu_milli));
    }
    if j.replicas == 0 || j.replicas > 10_000 {
        return Some(format!("job {:?}: replicas must be 1..=10000, not {}", j.name, j.replicas));
    }
    if let Some(min) = j.min_replicas
        && (min == 0 || min > j.replicas)
    {
        return Some(format!("job {:?}: min_replicas {min} must be 1..={}", j.name, j.replicas));
    }
    if let Some(Err(e)) = j.pod_affinity.as_ref().map(PodAffinityConfig::resolve) {
        return Some(format!("job {:?}: pod_affinity: {e}", j.name));
    }
    if j.running_on.len() > j.replicas as usize {
        return Some(format!(
            "job {:?}: running_on names {} nodes for {} replicas",
            j.name,
            j.running_on.len(),
            j.replicas
        ));
    }
    if let Some(problem) = j.topology.as_ref().and_then(GangTopology::problem) {
        return Some(format!("job {:?}: {problem}", j.name));
    }
    if let Some(a) = &j.accelerator {
        if let Some(problem) = a.problem() {
            return Some(format!("job {:?}: {problem}", j.name));
        }
        if j.gpu_milli != 1000 {
            return Some(format!("job {:?}: shares are of NVIDIA GPUs; {} devices are whole", j.name, a.kind));
        }
    }
    match j.withdraw_at {
        Some(at) if at < j.arrival => {
            return Some(format!("job {:?}: withdraw_at {at} s is before its arrival at {} s", j.name, j.arrival));
        }
        Some(_) if !j.running_on.is_empty() => {
            return Some(format!("job {:?}: a job running when it arrives (running_on) cannot be withdrawn", j.name));
        }
        _ => {}
    }
    let ids = j.task_ids();
    if let Some(id) = ids.iter().find(|id| tasks.contains(*id)) {
        return Some(format!("job {:?}: pod name {id:?} is taken by another job", j.name));
    }
    jobs.insert(j.name.clone());
    tasks.extend(ids);
    None
}

impl Scenario {
    /// Parse and validate a scenario (YAML when `file` ends in `.yaml`/`.yml`, else JSON); errors
    /// name the file and the line and column, or the offending item.
    pub fn parse(file: &str, text: &str) -> Result<Scenario, TraceError> {
        Self::parse_lenient(file, text, false).map(|(s, _)| s)
    }

    /// [`Scenario::parse`], but with `lenient` a job that does not read or does not validate
    /// (unknown queue, impossible GPU request, duplicate name, …) is left out and reported, as
    /// `job N (name): reason`. Nodes and queues are never skipped: without them nothing means
    /// anything.
    pub fn parse_lenient(file: &str, text: &str, lenient: bool) -> Result<(Scenario, Vec<String>), TraceError> {
        let bad = |line: usize, column: usize, message: String| TraceError::Malformed {
            file: file.into(),
            line,
            column,
            message,
        };
        if !lenient {
            let s: Scenario = read(file, text)?;
            s.validate().map_err(|message| bad(0, 0, message))?;
            return Ok((s, Vec::new()));
        }
        let raw: RawScenario = read(file, text)?;
        let mut scenario = Scenario {
            nodes: raw.nodes,
            flavors: raw.flavors,
            queues: raw.queues,
            jobs: Vec::new(),
            dra: raw.dra,
            levels: raw.levels,
            fabric: raw.fabric,
        };
        scenario.validate().map_err(|message| bad(0, 0, message))?;
        let tree = scenario.queue_tree().map_err(|message| bad(0, 0, message))?;
        let (mut names, mut tasks) = (BTreeSet::new(), BTreeSet::new());
        let mut skipped = Vec::new();
        for (i, value) in raw.jobs.into_iter().enumerate() {
            let label = value.get("name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
            let job = serde_json::from_value::<Job>(value)
                .map_err(|e| e.to_string())
                .and_then(|j| job_problem(&j, &tree, &mut names, &mut tasks).map_or(Ok(j), Err));
            match job {
                Ok(j) => scenario.jobs.push(j),
                Err(reason) => skipped.push(format!("job {} ({label}): {reason}", i + 1)),
            }
        }
        Ok((scenario, skipped))
    }

    fn validate(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for n in &self.nodes {
            if !names.insert(n.name.as_str()) {
                return Err(format!("node {:?} appears twice", n.name));
            }
            if n.gpus > 64 || (n.gpus > 0 && n.model.is_empty()) {
                return Err(format!("node {:?}: {} GPUs of model {:?}", n.name, n.gpus, n.model));
            }
            if let Some(problem) = n.accelerator.as_ref().and_then(Accelerator::problem) {
                return Err(format!("node {:?}: {problem}", n.name));
            }
        }
        let distinct: BTreeSet<&String> = self.levels.iter().collect();
        if distinct.len() != self.levels.len() || self.levels.iter().any(|l| l.trim().is_empty()) {
            return Err(format!("levels {:?}: each must be a node label, named once", self.levels));
        }
        if let Some(problem) = self.fabric.as_ref().and_then(Fabric::problem) {
            return Err(problem);
        }
        let tree = self.queue_tree()?;
        let (mut jobs, mut tasks) = (BTreeSet::new(), BTreeSet::new());
        for j in &self.jobs {
            if let Some(problem) = job_problem(j, &tree, &mut jobs, &mut tasks) {
                return Err(problem);
            }
        }
        Ok(())
    }

    /// Reads and validates the scenario at `path`, and the topology files its nodes name
    /// (relative to the scenario's directory).
    pub fn load(path: &Path) -> Result<(Scenario, BTreeMap<String, NodeTopology>), TraceError> {
        Self::load_lenient(path, false).map(|l| (l.scenario, l.topologies))
    }

    /// [`Scenario::load`], skipping (and returning) malformed jobs when `lenient`
    /// ([`Scenario::parse_lenient`]).
    pub fn load_lenient(path: &Path, lenient: bool) -> Result<Loaded, TraceError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TraceError::Io { file: file.clone(), cause: e })?;
        let (scenario, skipped) = Scenario::parse_lenient(&file, &text, lenient)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut topologies = BTreeMap::new();
        for n in &scenario.nodes {
            let Some(rel) = &n.topology else { continue };
            let bad = |message: String| TraceError::Malformed { file: file.clone(), line: 0, column: 0, message };
            let topo_path = dir.join(rel);
            let text = std::fs::read_to_string(&topo_path)
                .map_err(|e| bad(format!("node {:?}: topology {}: {e}", n.name, topo_path.display())))?;
            let topology = wasmsched_topology::smi::parse(&text)
                .map_err(|e| bad(format!("node {:?}: topology {}: {e}", n.name, topo_path.display())))?;
            if topology.len() != n.gpus as usize {
                return Err(bad(format!(
                    "node {:?} has {} GPUs, its topology {} has {}",
                    n.name,
                    n.gpus,
                    topo_path.display(),
                    topology.len()
                )));
            }
            topologies.insert(n.name.clone(), topology);
        }
        let dra = match &scenario.dra {
            None => None,
            Some(config) => {
                let mut objects = wasmsched_dra::Objects::default();
                for rel in &config.objects {
                    objects.read(&dir.join(rel)).map_err(|e| TraceError::Malformed {
                        file: file.clone(),
                        line: 0,
                        column: 0,
                        message: format!("dra: {e}"),
                    })?;
                }
                Some(objects)
            }
        };
        if dra.is_none()
            && let Some(j) = scenario.jobs.iter().find(|j| !j.claims.is_empty())
        {
            let message = format!("job {:?} has claims, and the scenario names no `dra` objects", j.name);
            return Err(TraceError::Malformed { file, line: 0, column: 0, message });
        }
        Ok(Loaded { scenario, topologies, skipped, dra })
    }

    /// The scenario's nodes as the core's nodes, with the given topologies attached (and their
    /// NUMA nodes on the GPUs).
    pub fn node_table_with(&self, topologies: &BTreeMap<String, NodeTopology>) -> NodeTable {
        let mut t = self.node_table();
        for (name, topology) in topologies {
            if let Some(slot) = t.slot_of(name) {
                t.update(slot, |node| {
                    node.gpus.update(|gpus| {
                        for gpu in gpus.iter_mut() {
                            gpu.numa_node = topology.gpus().get(gpu.index as usize).and_then(|g| g.numa);
                        }
                    });
                });
            }
            t.topologies_mut().insert(name, topology.clone());
        }
        t
    }

    /// The scenario's nodes as the core's nodes.
    pub fn node_table(&self) -> NodeTable {
        let mut t = NodeTable::new();
        t.set_levels(self.levels.clone());
        t.set_accelerator_kinds(self.accelerator_kinds());
        for n in &self.nodes {
            let mut node = gpu_node(&n.name, n.cpu_milli, n.memory_mib.saturating_mul(1 << 20), n.gpus, &n.model);
            if let Some(a) = &n.accelerator {
                // Another kind: its devices carry it and count as its resource, not as gpu-milli.
                node.allocatable.gpu_milli = 0;
                node.allocatable.extended = vec![(a.resource.as_str().into(), u64::from(n.gpus))].into();
                node.gpus.update(|gpus| gpus.iter_mut().for_each(|g| g.kind = a.kind.as_str().into()));
            }
            node.labels.extend(
                n.labels
                    .iter()
                    .filter(|(k, _)| *k != "gpu-model" && *k != HOSTNAME_LABEL)
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            node.labels.push((HOSTNAME_LABEL.into(), n.name.clone()));
            node.labels.sort();
            t.upsert(node);
        }
        t
    }

    /// The accelerator kinds its nodes and jobs name, with their resources.
    pub fn accelerator_kinds(&self) -> Vec<wasmsched_api::accelerators::Kind> {
        let named = self.nodes.iter().filter_map(|n| n.accelerator.as_ref());
        let all: BTreeSet<&Accelerator> =
            named.chain(self.jobs.iter().filter_map(|j| j.accelerator.as_ref())).collect();
        let mut kinds: Vec<wasmsched_api::accelerators::Kind> = Vec::new();
        for a in all {
            match kinds.iter_mut().find(|k| k.name == a.kind) {
                Some(k) => k.resources.push(a.resource.clone()),
                None => kinds.push(wasmsched_api::accelerators::Kind {
                    name: a.kind.clone(),
                    resources: vec![a.resource.clone()],
                }),
            }
        }
        kinds
    }

    /// The scenario's queues, with its flavors.
    pub fn queue_tree(&self) -> Result<QueueTree, String> {
        queue_tree_with(&self.flavors, &self.queues)
    }
}

/// Times in a scenario: whole seconds, or a number with a fraction (a trace's `1.5`), rounded to
/// the nearest second — the replay's clock ticks in seconds. A non-zero duration stays at least
/// one tick.
mod seconds {
    use serde::Deserializer;
    use serde::de::{Error, Visitor};

    struct Seconds {
        /// A positive value never rounds to 0 (a duration).
        at_least_one: bool,
    }

    impl Visitor<'_> for Seconds {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a time in seconds (a number from 0 on, e.g. 30 or 1.5)")
        }

        fn visit_u64<E: Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} s: a time is never negative")))
        }

        fn visit_f64<E: Error>(self, v: f64) -> Result<u64, E> {
            if !v.is_finite() || v < 0.0 || v >= u64::MAX as f64 {
                return Err(E::custom(format!("{v} s: a time is a number from 0 on")));
            }
            let whole = v.round() as u64;
            Ok(if whole == 0 && v > 0.0 && self.at_least_one { 1 } else { whole })
        }
    }

    struct Maybe(Seconds);

    impl<'de> Visitor<'de> for Maybe {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            self.0.expecting(f)
        }

        fn visit_none<E: Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
            d.deserialize_any(self.0).map(Some)
        }
    }

    pub(super) fn whole<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(Seconds { at_least_one: false })
    }

    pub(super) fn some_whole<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_option(Maybe(Seconds { at_least_one: true }))
    }
}
