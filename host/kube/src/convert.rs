//! Kubernetes objects to the scheduling model: a `Node` to [`wasmsched_api::Node`], a `Pod` to a
//! [`Task`], quantities to integers. Only what placement needs is kept, which is what keeps the
//! cache small at 150,000 pods.

use std::collections::BTreeMap;

use crate::accelerators::AcceleratorTable;
use crate::groups::GroupSource;
use k8s_openapi::api::core::v1::{Container, Node as KubeNode, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use wasmsched_api::{
    DeviceShare, GPU_MILLI, GpuRequest, Node, NodeAffinity, NodeSelectorTerm, PodAffinity, PodAffinityTerm,
    PreferredTerm, Qos, Resources, SelectorOperator, SelectorRequirement, Taint, TaintEffect, Task, Toleration,
    TolerationOperator,
};

/// The whole-GPU extended resource of the NVIDIA device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The number of pods a node takes, as an extended resource every task requests one of.
pub const PODS_RESOURCE: &str = "pods";
/// Pod annotation: a share of one GPU in milli-GPUs (1–999) instead of whole devices.
pub const GPU_MILLI_ANNOTATION: &str = "wasmsched.io/gpu-milli";
/// The same share as an extended resource in a container's limits (`wasmsched.io/gpu-milli:
/// 500`): the form the kubelet admits, served by the node agent's device plugin (one device per
/// milli-GPU). A pod may give either or both (then equal).
pub const GPU_SHARE_RESOURCE: &str = "wasmsched.io/gpu-milli";
/// Pod annotation: allowed GPU models, comma-separated (e.g. `H100,A100`).
pub const GPU_MODELS_ANNOTATION: &str = "wasmsched.io/gpu-models";
/// Pod annotation: the queue (`default` when absent).
pub const QUEUE_ANNOTATION: &str = "scheduling.wasmsched.io/queue";
/// Volcano's queue annotation, honoured so Volcano jobs work unchanged.
pub const VOLCANO_QUEUE_ANNOTATION: &str = "scheduling.volcano.sh/queue-name";
/// Kueue's queue label (its LocalQueue's name), honoured as the queue's name so workloads labelled
/// for Kueue land in the wasmsched queue of that name.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Pod label naming its wasmsched [`crate::crd::PodGroup`].
pub const GROUP_LABEL: &str = "scheduling.wasmsched.io/pod-group";
/// The upstream coscheduling plugin's pod-group label.
pub const COSCHEDULING_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Volcano's pod-group annotation.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// Pod annotation written at bind: the GPUs the pod got (the node agent's device plugin reads it).
pub use wasmsched_topology::annotation::GPU_IDS_ANNOTATION;
/// Pod annotation written at bind when all its GPUs sit on one NUMA node: that node's id, for CPU
/// and memory pinning next to them.
pub const NUMA_NODE_ANNOTATION: &str = "wasmsched.io/numa-node";
/// Pod annotation written at bind: when the bind was sent, to the millisecond. It is the start of
/// the pod's run in `task-scheduled` and `task-ended`, so a replica that takes the run over after a
/// fail-over names the very start the previous leader published (`PodScheduled`'s transition has
/// whole seconds and the server's clock).
pub const SCHEDULED_AT_ANNOTATION: &str = "wasmsched.io/scheduled-at";

/// Why an object could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A quantity that does not parse.
    #[error("{field}: invalid quantity {value:?}")]
    Quantity {
        /// Where.
        field: String,
        /// What was found.
        value: String,
    },
    /// A malformed annotation.
    #[error("annotation {name}: {reason}")]
    Annotation {
        /// Annotation name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A field the object must have.
    #[error("missing {0}")]
    Missing(&'static str),
    /// Node affinity the scheduler cannot read (what the API server's validation refuses).
    #[error("spec.affinity.nodeAffinity: {0}")]
    Affinity(String),
    /// Pod (anti-)affinity the scheduler cannot read, or cannot honour and will not silently break.
    #[error("{0}")]
    PodAffinity(String),
    /// Accelerators the scheduler cannot give in one request (two kinds, a share of another kind).
    #[error("{0}")]
    Accelerators(String),
}

/// A quantity in thousandths of its unit, rounded up (as Kubernetes rounds requests): `"500m"` →
/// 500, `"2"` → 2000, `"1Gi"` → 1073741824000. `None` when it does not parse or overflows.
pub fn milli_units(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.starts_with('-') || number.is_empty() {
        return None;
    }
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    // value = digits × 10^(exp10 − frac digits) × 2^exp2, times 1000 for milli.
    let (mut exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => (s[1..].parse().ok()?, 0),
        _ => return None,
    };
    exp10 += 3 - frac.len() as i32;
    let scaled = digits.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        scaled.checked_mul(10u128.checked_pow(exp10 as u32)?)
    } else {
        let div = 10u128.checked_pow((-exp10) as u32)?;
        Some(scaled.div_ceil(div))
    }
}

fn whole(field: &str, q: &Quantity) -> Result<u64, ConvertError> {
    milli_units(&q.0)
        .map(|m| m.div_ceil(1000))
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| ConvertError::Quantity { field: field.into(), value: q.0.clone() })
}

fn milli(field: &str, q: &Quantity) -> Result<u64, ConvertError> {
    milli_units(&q.0)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| ConvertError::Quantity { field: field.into(), value: q.0.clone() })
}

/// Resources and whole GPUs of a resource list.
pub(crate) fn resources(field: &str, list: &BTreeMap<String, Quantity>) -> Result<(Resources, u64), ConvertError> {
    let mut r = Resources::default();
    let mut gpus = 0;
    for (name, q) in list {
        match name.as_str() {
            "cpu" => r.cpu_milli = milli(field, q)?,
            "memory" => r.memory_bytes = whole(field, q)?,
            GPU_RESOURCE => gpus = whole(field, q)?,
            "ephemeral-storage" => {}
            n if n.starts_with("hugepages-") => {}
            n => r.extended.push((n.into(), whole(field, q)?)),
        }
    }
    r.extended.sort();
    Ok((r, gpus))
}

/// A Kubernetes toleration as the core's.
pub(crate) fn toleration(t: &k8s_openapi::api::core::v1::Toleration) -> Toleration {
    Toleration {
        key: t.key.clone().unwrap_or_default(),
        operator: match t.operator.as_deref() {
            Some("Exists") => TolerationOperator::Exists,
            _ => TolerationOperator::Equal,
        },
        value: t.value.clone().unwrap_or_default(),
        effect: match t.effect.as_deref() {
            Some("NoSchedule") => Some(TaintEffect::NoSchedule),
            Some("PreferNoSchedule") => Some(TaintEffect::PreferNoSchedule),
            Some("NoExecute") => Some(TaintEffect::NoExecute),
            _ => None,
        },
    }
}

/// The most accelerators a node may report: more is a broken device plugin or a hostile object, not
/// hardware, and would make every placement walk a huge device list.
pub const MAX_NODE_GPUS: u64 = 256;

/// A node as placement sees it, with nothing allocated (the cache adds the pods bound to it): its
/// accelerators as devices of their kinds (`accelerators`), NVIDIA's first.
pub fn node(object: &KubeNode, accelerators: &AcceleratorTable) -> Result<Node, ConvertError> {
    let name = object.metadata.name.clone().ok_or(ConvertError::Missing("metadata.name"))?;
    let mut labels: Vec<(String, String)> =
        object.metadata.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.sort();
    let spec = object.spec.as_ref();
    let taints = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let effect = match t.effect.as_str() {
                "NoSchedule" => TaintEffect::NoSchedule,
                "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
                "NoExecute" => TaintEffect::NoExecute,
                _ => return None,
            };
            Some(Taint { key: t.key.clone(), value: t.value.clone().unwrap_or_default(), effect })
        })
        .collect();
    let empty = BTreeMap::new();
    let allocatable = object.status.as_ref().and_then(|s| s.allocatable.as_ref()).unwrap_or(&empty);
    let (mut allocatable, gpus) = resources("status.allocatable", allocatable)?;
    let others = accelerators.count(&allocatable.extended);
    let total = others.per_kind.iter().fold(gpus, |sum, (_, n)| sum.saturating_add(*n));
    if total > MAX_NODE_GPUS {
        return Err(ConvertError::Quantity {
            field: format!("status.allocatable (at most {MAX_NODE_GPUS} accelerators per node)"),
            value: total.to_string(),
        });
    }
    allocatable.gpu_milli = gpus * u64::from(GPU_MILLI);
    let gpus = accelerators.devices(&labels, gpus, &others).into();
    Ok(Node {
        name,
        labels,
        taints,
        allocatable,
        allocated: Resources::default(),
        gpus,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
    })
}

/// Pod identity, for the queue and for binding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pod group a pod names and where the name came from, first found of: our label, the
/// upstream Workload API's `spec.schedulingGroup.podGroupName`, the coscheduling label, Volcano's
/// annotation (an empty value names none). See [`crate::groups`].
pub fn group_ref(pod: &Pod) -> Option<(GroupSource, String)> {
    let label = |k: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(k)).filter(|g| !g.is_empty());
    let annotation = |k: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(k)).filter(|g| !g.is_empty());
    let upstream = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_group.as_ref())
        .and_then(|g| g.pod_group_name.as_ref())
        .filter(|g| !g.is_empty());
    let (source, name) = label(GROUP_LABEL)
        .map(|g| (GroupSource::Wasmsched, g))
        .or_else(|| upstream.map(|g| (GroupSource::Upstream, g)))
        .or_else(|| label(COSCHEDULING_GROUP_LABEL).map(|g| (GroupSource::Coscheduling, g)))
        .or_else(|| annotation(VOLCANO_GROUP_ANNOTATION).map(|g| (GroupSource::Volcano, g)))?;
    Some((source, name.clone()))
}

/// The name of the pod group a pod names ([`group_ref`]).
pub fn group_of(pod: &Pod) -> Option<String> {
    group_ref(pod).map(|(_, name)| name)
}

fn requests(c: &Container) -> Option<&BTreeMap<String, Quantity>> {
    c.resources.as_ref().and_then(|r| r.requests.as_ref().or(r.limits.as_ref()))
}

/// What a pod requests, as Kubernetes computes it: the sum of its containers (and sidecars), or the
/// largest init container if that is more, plus the pod overhead; and the whole GPUs asked for.
fn pod_request(pod: &Pod) -> Result<(Resources, u64), ConvertError> {
    let spec = pod.spec.as_ref().ok_or(ConvertError::Missing("spec"))?;
    let mut sum = (Resources::default(), 0u64);
    let add = |acc: &mut (Resources, u64), (r, g): (Resources, u64)| {
        acc.0 = acc.0.checked_add(&r).unwrap_or_else(|| acc.0.clone());
        acc.1 += g;
    };
    for c in &spec.containers {
        add(&mut sum, resources("resources.requests", requests(c).unwrap_or(&BTreeMap::new()))?);
    }
    let mut init_max = (Resources::default(), 0u64);
    for c in spec.init_containers.iter().flatten() {
        let r = resources("resources.requests", requests(c).unwrap_or(&BTreeMap::new()))?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sum, r); // a sidecar runs beside the containers
        } else {
            init_max.0.cpu_milli = init_max.0.cpu_milli.max(r.0.cpu_milli);
            init_max.0.memory_bytes = init_max.0.memory_bytes.max(r.0.memory_bytes);
            init_max.1 = init_max.1.max(r.1);
            for (name, v) in r.0.extended {
                match init_max.0.extended.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, max)) => *max = (*max).max(v),
                    None => init_max.0.extended.push((name, v)),
                }
            }
        }
    }
    let mut r = sum.0;
    r.cpu_milli = r.cpu_milli.max(init_max.0.cpu_milli);
    r.memory_bytes = r.memory_bytes.max(init_max.0.memory_bytes);
    for (name, v) in init_max.0.extended {
        match r.extended.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total = (*total).max(v),
            None => r.extended.push((name, v)),
        }
    }
    if let Some(overhead) = &spec.overhead {
        let (o, _) = resources("spec.overhead", overhead)?;
        r = r.checked_add(&o).unwrap_or(r);
    }
    r.extended.retain(|(n, _)| n != PODS_RESOURCE);
    r.extended.push((PODS_RESOURCE.into(), 1));
    r.extended.sort();
    Ok((r, sum.1.max(init_max.1)))
}

fn qos(pod: &Pod) -> Qos {
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    let (mut any, mut guaranteed) = (false, true);
    for c in containers {
        let res = c.resources.as_ref();
        let req = res.and_then(|r| r.requests.as_ref());
        let lim = res.and_then(|r| r.limits.as_ref());
        any |= req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty());
        let full = |l: Option<&BTreeMap<String, Quantity>>| {
            l.is_some_and(|l| l.contains_key("cpu") && l.contains_key("memory"))
        };
        // Requests default to limits; Guaranteed needs limits for cpu and memory equal to requests.
        guaranteed &= full(lim)
            && req.is_none_or(|r| {
                ["cpu", "memory"].iter().all(|k| r.get(*k).is_none_or(|v| lim.and_then(|l| l.get(*k)) == Some(v)))
            });
    }
    match (any, guaranteed) {
        (false, _) => Qos::BestEffort,
        (true, true) => Qos::Guaranteed,
        (true, false) => Qos::Burstable,
    }
}

/// A pod as a task to schedule. `id` is `namespace/name`, unique among live pods. Constraints
/// the scheduler cannot honour or read (malformed node affinity, pod affinity needing namespace
/// labels) are errors.
pub fn task(pod: &Pod, accelerators: &AcceleratorTable) -> Result<Task, ConvertError> {
    task_of(pod, accelerators, true)
}

/// A pod already bound to a node (by anyone), as the task whose usage it holds: its placement
/// constraints are history, so they cannot make it unreadable — a pod another scheduler placed
/// with a required anti-affinity still takes its GPUs.
pub fn bound_task(pod: &Pod, accelerators: &AcceleratorTable) -> Result<Task, ConvertError> {
    task_of(pod, accelerators, false)
}

/// A pod kube-scheduler asks about as its extender: kube-scheduler evaluates inter-pod affinity
/// (and validates node affinity) itself, so neither makes the pod unreadable here.
pub fn extender_task(pod: &Pod, accelerators: &AcceleratorTable) -> Result<Task, ConvertError> {
    // Straight to the filters, not through the core's admission: sorted here as plugins expect.
    let mut task = task_of(pod, accelerators, false)?;
    task.node_affinity.sort_values();
    Ok(task)
}

fn task_of(pod: &Pod, accelerators: &AcceleratorTable, strict: bool) -> Result<Task, ConvertError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.as_deref().ok_or(ConvertError::Missing("metadata.name"))?;
    let spec = pod.spec.as_ref().ok_or(ConvertError::Missing("spec"))?;
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    let (mut request, whole_gpus) = pod_request(pod)?;
    // The share asked for as the device plugin's resource is the share, not an opaque resource.
    let share_resource =
        request.extended.iter().position(|(n, _)| n == GPU_SHARE_RESOURCE).map(|i| request.extended.remove(i).1);
    let share_annotation = match (annotation(GPU_MILLI_ANNOTATION), share_resource) {
        (Some(a), Some(r)) if a.trim().parse::<u64>().ok() != Some(r) => {
            return Err(ConvertError::Annotation {
                name: GPU_MILLI_ANNOTATION,
                reason: format!("{a:?} differs from the {GPU_SHARE_RESOURCE} the containers ask for ({r})"),
            });
        }
        (Some(a), _) => Some(a.to_string()),
        (None, r) => r.map(|r| r.to_string()),
    };
    let gpu = match share_annotation.as_deref() {
        Some(m) => {
            let milli: u32 = m.trim().parse().ok().filter(|m| (1..GPU_MILLI).contains(m)).ok_or_else(|| {
                ConvertError::Annotation {
                    name: GPU_MILLI_ANNOTATION,
                    reason: format!("{m:?} is not 1–{}", GPU_MILLI - 1),
                }
            })?;
            if whole_gpus > 0 {
                return Err(ConvertError::Annotation {
                    name: GPU_MILLI_ANNOTATION,
                    reason: format!("a GPU share cannot be combined with {GPU_RESOURCE}: {whole_gpus}"),
                });
            }
            GpuRequest { count: 1, milli_per_gpu: milli, ..Default::default() }
        }
        None => GpuRequest {
            count: u32::try_from(whole_gpus)
                .map_err(|_| ConvertError::Quantity { field: GPU_RESOURCE.into(), value: whole_gpus.to_string() })?,
            milli_per_gpu: if whole_gpus > 0 { GPU_MILLI } else { 0 },
            ..Default::default()
        },
    };
    let gpu = match accelerators.count(&request.extended).per_kind.as_slice() {
        [] => gpu,
        [(kind, count)] if gpu.count == 0 => {
            let kind = &accelerators.kinds()[*kind];
            GpuRequest {
                count: u32::try_from(*count).map_err(|_| ConvertError::Quantity {
                    field: kind.resources[0].clone(),
                    value: count.to_string(),
                })?,
                milli_per_gpu: GPU_MILLI,
                kind: kind.name.as_str().into(),
                ..Default::default()
            }
        }
        [(kind, _), ..] => {
            let kind = &accelerators.kinds()[*kind].name;
            return Err(ConvertError::Accelerators(if share_annotation.is_some() {
                format!("a GPU share ({GPU_MILLI_ANNOTATION}) is of an NVIDIA GPU, and the pod asks for {kind} devices")
            } else {
                format!("the pod asks for {kind} devices and another kind of accelerator: a pod gets one kind")
            }));
        }
    };
    let gpu = GpuRequest {
        models: annotation(GPU_MODELS_ANNOTATION)
            .map(|m| m.split(',').map(str::trim).filter(|m| !m.is_empty()).map(String::from).collect())
            .unwrap_or_default(),
        ..gpu
    };
    let mut request = request;
    // `gpu-milli` is NVIDIA's alone: another kind counts as its own resource (already in
    // `extended`), so a queue's `nvidia.com/gpu` quota is NVIDIA's.
    request.gpu_milli = gpu.counted_milli();
    let mut node_selector: Vec<(String, String)> =
        spec.node_selector.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    node_selector.sort();
    let tolerations = spec.tolerations.iter().flatten().map(toleration).collect();
    let node_affinity = match node_affinity(spec) {
        Ok(a) => a,
        Err(e) if strict => return Err(e),
        Err(_) => NodeAffinity::default(),
    };
    let pod_affinity = pod_affinity(spec, strict)?;
    let mut labels: Vec<(String, String)> =
        pod.metadata.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.sort();
    Ok(Task {
        id: format!("{namespace}/{name}"),
        group: group_of(pod),
        queue: queue_of(pod).to_string(),
        priority: spec.priority.unwrap_or(0),
        qos: qos(pod),
        request,
        gpu,
        node_selector,
        node_affinity,
        tolerations,
        namespace,
        labels,
        pod_affinity: (!pod_affinity.is_empty()).then(|| Box::new(pod_affinity)),
    })
}

/// The pod's node affinity (the `IgnoredDuringExecution` kinds, the only ones Kubernetes has).
fn node_affinity(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<NodeAffinity, ConvertError> {
    use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm as KubeTerm};
    fn requirement(r: &NodeSelectorRequirement) -> Result<SelectorRequirement, ConvertError> {
        let operator = match r.operator.as_str() {
            "Gt" => SelectorOperator::Gt,
            "Lt" => SelectorOperator::Lt,
            other => SelectorOperator::of_label_selector(other)
                .ok_or_else(|| ConvertError::Affinity(format!("{}: unknown operator {other:?}", r.key)))?,
        };
        Ok(SelectorRequirement { key: r.key.clone(), operator, values: r.values.clone().unwrap_or_default() })
    }
    fn term(t: &KubeTerm) -> Result<NodeSelectorTerm, ConvertError> {
        Ok(NodeSelectorTerm {
            match_expressions: t.match_expressions.iter().flatten().map(requirement).collect::<Result<_, _>>()?,
            match_fields: t.match_fields.iter().flatten().map(requirement).collect::<Result<_, _>>()?,
        })
    }
    let affinity = spec.affinity.as_ref();
    let Some(kube) = affinity.and_then(|a| a.node_affinity.as_ref()) else {
        return Ok(NodeAffinity::default());
    };
    let required = match &kube.required_during_scheduling_ignored_during_execution {
        Some(selector) if selector.node_selector_terms.is_empty() => {
            return Err(ConvertError::Affinity("required node selector has no terms".into()));
        }
        Some(selector) => selector.node_selector_terms.iter().map(term).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let preferred = kube
        .preferred_during_scheduling_ignored_during_execution
        .iter()
        .flatten()
        .map(|p| {
            let weight = u32::try_from(p.weight)
                .map_err(|_| ConvertError::Affinity(format!("preferred term weight {} is negative", p.weight)))?;
            Ok(PreferredTerm { weight, preference: term(&p.preference)? })
        })
        .collect::<Result<_, ConvertError>>()?;
    let affinity = NodeAffinity { required, preferred };
    affinity.validate().map_err(ConvertError::Affinity)?;
    Ok(affinity)
}

/// The pod's inter-pod affinity and anti-affinity; a preferred term that does not read is dropped
/// (it is only a preference). For required terms, `strict`: what the scheduler cannot honour — a non-empty
/// `namespaceSelector` (it does not watch namespaces), `matchLabelKeys`/`mismatchLabelKeys` — or
/// read is an error, refused rather than silently broken; otherwise (a pod already bound, whose
/// terms only keep others away) such a term reads as every namespace, and one that does not read
/// is dropped.
fn pod_affinity(spec: &k8s_openapi::api::core::v1::PodSpec, strict: bool) -> Result<PodAffinity, ConvertError> {
    use k8s_openapi::api::core::v1::PodAffinityTerm as KubeTerm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    fn selector(s: &LabelSelector) -> Result<Vec<SelectorRequirement>, String> {
        let mut out: Vec<SelectorRequirement> =
            s.match_labels.iter().flatten().map(|(k, v)| SelectorRequirement::equals(k, v)).collect();
        for r in s.match_expressions.iter().flatten() {
            let operator = SelectorOperator::of_label_selector(&r.operator)
                .ok_or_else(|| format!("{}: unknown label selector operator {:?}", r.key, r.operator))?;
            out.push(SelectorRequirement {
                key: r.key.clone(),
                operator,
                values: r.values.clone().unwrap_or_default(),
            });
        }
        Ok(out)
    }
    fn term(t: &KubeTerm, strict: bool) -> Result<PodAffinityTerm, String> {
        let keys = t.match_label_keys.iter().chain(&t.mismatch_label_keys).flatten().next();
        if strict && let Some(k) = keys {
            return Err(format!("matchLabelKeys/mismatchLabelKeys ({k}) are not supported"));
        }
        let all_namespaces = match &t.namespace_selector {
            None => false,
            Some(s)
                if s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
                    && s.match_expressions.as_ref().is_none_or(Vec::is_empty) =>
            {
                true
            }
            Some(_) if strict => {
                return Err("a namespaceSelector other than {} (every namespace) is not supported".into());
            }
            Some(_) => true,
        };
        let listed = t.namespaces.clone().filter(|n| !n.is_empty());
        Ok(PodAffinityTerm {
            selector: t.label_selector.as_ref().map(selector).transpose()?,
            namespaces: if all_namespaces { Some(Vec::new()) } else { listed },
            topology_key: t.topology_key.clone(),
        })
    }
    let affinity = spec.affinity.as_ref();
    let required = |terms: Option<&Vec<KubeTerm>>, kind: &str| -> Result<Vec<PodAffinityTerm>, ConvertError> {
        let mut out = Vec::new();
        for t in terms.into_iter().flatten() {
            match term(t, strict) {
                Ok(t) => out.push(t),
                Err(e) if strict => {
                    return Err(ConvertError::PodAffinity(format!(
                        "spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution: {e}"
                    )));
                }
                Err(_) => {}
            }
        }
        Ok(out)
    };
    // A preference that does not read is only a preference: dropped, never an error.
    let preferred = |terms: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
        let read = |w: &k8s_openapi::api::core::v1::WeightedPodAffinityTerm| {
            let weight = u32::try_from(w.weight).ok().filter(|w| (1..=100).contains(w))?;
            let term = term(&w.pod_affinity_term, false).ok().filter(|t| t.validate().is_ok())?;
            Some((weight, term))
        };
        terms.into_iter().flatten().filter_map(read).collect()
    };
    let a = affinity.and_then(|a| a.pod_affinity.as_ref());
    let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
    let out = PodAffinity {
        affinity: required(
            a.and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()),
            "podAffinity",
        )?,
        anti_affinity: required(
            anti.and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref()),
            "podAntiAffinity",
        )?,
        preferred: preferred(a.and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref())),
        anti_preferred: preferred(anti.and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref())),
    };
    match out.validate() {
        Ok(()) => Ok(out),
        Err(e) if strict => Err(ConvertError::PodAffinity(format!("spec.affinity: {e}"))),
        Err(_) => Ok(PodAffinity::default()),
    }
}

/// The annotation value for `devices` (the format lives with the agent's side of the contract).
pub use wasmsched_topology::annotation::gpu_ids;

/// Parses [`gpu_ids`] back (a bound pod's devices, when the cache is rebuilt after a restart).
pub fn parse_gpu_ids(s: &str) -> Result<Vec<DeviceShare>, ConvertError> {
    wasmsched_topology::annotation::parse_gpu_ids(s)
        .map_err(|e| ConvertError::Annotation { name: GPU_IDS_ANNOTATION, reason: e.to_string() })
}

/// A pod's queue, first found of: our annotation, Volcano's annotation, Kueue's label, else
/// `default` (a pod group's own queue, when it names one, goes before all of them).
pub fn queue_of(pod: &Pod) -> &str {
    named_queue(pod).unwrap_or("default")
}

/// The queue a pod names itself, if any (see [`queue_of`]); an empty value names none.
pub fn named_queue(pod: &Pod) -> Option<&str> {
    let annotation = |k: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(k)).filter(|q| !q.is_empty());
    let label = |k: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(k)).filter(|q| !q.is_empty());
    annotation(QUEUE_ANNOTATION)
        .or_else(|| annotation(VOLCANO_QUEUE_ANNOTATION))
        .or_else(|| label(KUEUE_QUEUE_LABEL))
        .map(String::as_str)
}

/// An API server's time (a creation, a transition) as an event's: milliseconds since the epoch
/// (0 for a time before it).
pub fn event_time(t: &k8s_openapi::jiff::Timestamp) -> wasmsched_events::Timestamp {
    wasmsched_events::Timestamp(u64::try_from(t.as_millisecond()).unwrap_or_default())
}

/// The NUMA node all of `devices` sit on, when the node's topology says so and it is one.
pub fn numa_of(node: &wasmsched_api::Node, devices: &[wasmsched_api::DeviceShare]) -> Option<u32> {
    let mut numa = devices.iter().map(|d| node.gpus.iter().find(|g| g.index == d.gpu).and_then(|g| g.numa_node));
    let first = numa.next()??;
    numa.all(|n| n == Some(first)).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(pod: &Pod) -> Result<Task, ConvertError> {
        super::task(pod, &AcceleratorTable::default())
    }

    fn bound_task(pod: &Pod) -> Result<Task, ConvertError> {
        super::bound_task(pod, &AcceleratorTable::default())
    }

    #[test]
    fn a_node_reporting_absurd_gpus_or_gpu_memory_is_refused_or_read_as_unknown() {
        let node = |gpus: &str, memory_mib: &str| -> KubeNode {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": memory_mib}},
                "status": {"allocatable": {"cpu": "8", GPU_RESOURCE: gpus}}
            }))
            .unwrap()
        };
        let ok = super::node(&node("8", "81559"), &AcceleratorTable::default()).unwrap();
        assert_eq!((ok.gpus.len(), ok.gpus[0].memory_bytes), (8, 81559 << 20));
        let e =
            super::node(&node("9223372036854775807", "81559"), &AcceleratorTable::default()).unwrap_err().to_string();
        assert!(e.contains("at most 256 accelerators per node") && e.contains("9223372036854775807"), "{e}");
        // GPU memory that overflows in bytes is unknown, not wrapped around.
        let huge = super::node(&node("2", "18446744073709551615"), &AcceleratorTable::default()).unwrap();
        assert_eq!(huge.gpus[0].memory_bytes, 0);
    }

    #[test]
    fn the_queue_comes_from_our_annotation_then_volcanos_then_kueues_label() {
        let pod = |annotations: serde_json::Value, labels: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ml", "annotations": annotations, "labels": labels},
                "spec": {"containers": [{"name": "c"}]}
            }))
            .unwrap()
        };
        let ours = serde_json::json!({QUEUE_ANNOTATION: "a", VOLCANO_QUEUE_ANNOTATION: "b"});
        let kueue = serde_json::json!({KUEUE_QUEUE_LABEL: "c"});
        assert_eq!(queue_of(&pod(ours, kueue.clone())), "a");
        assert_eq!(queue_of(&pod(serde_json::json!({VOLCANO_QUEUE_ANNOTATION: "b"}), kueue.clone())), "b");
        assert_eq!(queue_of(&pod(serde_json::json!({}), kueue.clone())), "c");
        assert_eq!(task(&pod(serde_json::json!({}), kueue)).unwrap().queue, "c");
        assert_eq!(queue_of(&pod(serde_json::json!({QUEUE_ANNOTATION: ""}), serde_json::json!({}))), "default");
        let empty_ours = serde_json::json!({QUEUE_ANNOTATION: ""});
        assert_eq!(queue_of(&pod(empty_ours, serde_json::json!({KUEUE_QUEUE_LABEL: "c"}))), "c");
    }

    #[test]
    fn a_share_asked_for_as_the_device_plugins_resource_is_the_share() {
        let pod = |annotations: serde_json::Value, limits: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}
            }))
            .unwrap()
        };
        let by_resource = task(&pod(serde_json::json!({}), serde_json::json!({GPU_SHARE_RESOURCE: "500"}))).unwrap();
        assert_eq!((by_resource.gpu.count, by_resource.gpu.milli_per_gpu), (1, 500));
        assert!(
            !by_resource.request.extended.iter().any(|(n, _)| *n == GPU_SHARE_RESOURCE),
            "not an opaque resource as well: {:?}",
            by_resource.request.extended
        );
        let both =
            pod(serde_json::json!({GPU_MILLI_ANNOTATION: "500"}), serde_json::json!({GPU_SHARE_RESOURCE: "500"}));
        assert_eq!(task(&both).unwrap().gpu.milli_per_gpu, 500);
        let differ =
            pod(serde_json::json!({GPU_MILLI_ANNOTATION: "250"}), serde_json::json!({GPU_SHARE_RESOURCE: "500"}));
        assert!(task(&differ).unwrap_err().to_string().contains("differs from the wasmsched.io/gpu-milli"));
        let whole = pod(serde_json::json!({}), serde_json::json!({GPU_SHARE_RESOURCE: "1000"}));
        assert!(task(&whole).is_err(), "a share is 1–999 milli");
    }

    fn with_affinity(affinity: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "labels": {"app": "train", "tier": "gpu"}},
            "spec": {"containers": [{"name": "c"}], "affinity": affinity}
        }))
        .unwrap()
    }

    #[test]
    fn pod_affinity_terms_convert_and_what_cannot_be_honoured_is_refused() {
        let pod = with_affinity(serde_json::json!({
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]},
                                                         {"key": "gpu", "operator": "Exists"}]},
                 "namespaces": ["data", "ml"], "topologyKey": "zone"}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "kubernetes.io/hostname",
                 "namespaceSelector": {}},
                {"topologyKey": "rack"}]}
        }));
        let t = task(&pod).unwrap();
        assert_eq!(t.labels, [("app".to_string(), "train".to_string()), ("tier".to_string(), "gpu".to_string())]);
        let a = &t.pod_terms().affinity[0];
        assert_eq!(
            (a.namespaces.as_deref(), a.topology_key.as_str()),
            (Some(&["data".into(), "ml".into()][..]), "zone")
        );
        assert_eq!(a.selector.as_ref().unwrap()[1].operator, SelectorOperator::Exists);
        let anti = &t.pod_terms().anti_affinity;
        assert_eq!(anti[0].namespaces, Some(vec![]), "an empty namespace selector: every namespace");
        assert!(anti[0].selects("ml", "other", &t.labels));
        assert_eq!(anti[1].selector, None, "no label selector selects nothing");
        // What the scheduler cannot honour is refused for a pod to place, read leniently once bound.
        let keys = with_affinity(
            serde_json::json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone", "matchLabelKeys": ["pod-template-hash"]}]}}),
        );
        assert!(task(&keys).unwrap_err().to_string().contains("matchLabelKeys/mismatchLabelKeys (pod-template-hash)"));
        assert_eq!(bound_task(&keys).unwrap().pod_terms().anti_affinity.len(), 1);
        let bad = with_affinity(serde_json::json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, "topologyKey": "zone"}]}}));
        assert!(task(&bad).unwrap_err().to_string().contains("unknown label selector operator \"Gt\""));
        assert!(bound_task(&bad).unwrap().pod_affinity.is_none());
        // Preferred terms carry their weight; one that does not read is dropped, not an error.
        let prefs = with_affinity(
            serde_json::json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 80, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "zone"}},
            {"weight": 0, "podAffinityTerm": {"labelSelector": {}, "topologyKey": "zone"}},
            {"weight": 10, "podAffinityTerm": {"labelSelector": {}, "topologyKey": ""}}]}}),
        );
        let p = task(&prefs).unwrap().pod_terms().clone();
        assert_eq!((p.anti_preferred.len(), p.anti_preferred[0].0), (1, 80));
        let no_key =
            with_affinity(serde_json::json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {}, "topologyKey": ""}]}}));
        assert!(task(&no_key).unwrap_err().to_string().contains("empty topologyKey"));
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        let cases = [
            ("500m", 500),
            ("2", 2000),
            ("0.5", 500),
            ("1.5", 1500),
            ("1Gi", 1_073_741_824_000),
            ("128974848", 128_974_848_000),
            ("129e6", 129_000_000_000),
            ("123Mi", 128_974_848_000),
            ("1k", 1_000_000),
            ("100n", 1), // rounded up, as requests are
            ("+3", 3000),
        ];
        for (q, want) in cases {
            assert_eq!(milli_units(q), Some(want), "{q}");
        }
        for bad in ["", "-1", "1Qi", "abc", "1.2.3", "m", "1e", "99999999999999999999999999999999Ei"] {
            assert_eq!(milli_units(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn gpu_ids_round_trip_and_reject_garbage() {
        let d = vec![DeviceShare { gpu: 0, milli: 1000 }, DeviceShare { gpu: 3, milli: 250 }];
        assert_eq!(gpu_ids(&d), "0,3:250");
        assert_eq!(parse_gpu_ids("0,3:250").unwrap(), d);
        assert!(parse_gpu_ids("x").is_err());
        assert!(parse_gpu_ids("1:0").is_err());
        assert!(parse_gpu_ids("1:1001").is_err());
    }
}
