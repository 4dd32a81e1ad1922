//! Conversions between the generated WIT types and the plain API types. Total: every WIT value
//! maps to an API value, so the guest never panics on host input.

use super::bindings::wasmsched::policy::types as wit;
use super::{fair_share, placement, placement_counted, preempt};
use wasmsched_api as api;

pub(super) fn resources(r: wit::Resources) -> api::Resources {
    api::Resources {
        cpu_milli: r.cpu_milli,
        memory_bytes: r.memory_bytes,
        gpu_milli: r.gpu_milli,
        extended: r.extended.into_iter().map(|(n, v)| (api::ResourceName::new(&n), v)).collect(),
    }
}

pub(super) fn resources_out(r: api::Resources) -> wit::Resources {
    wit::Resources {
        cpu_milli: r.cpu_milli,
        memory_bytes: r.memory_bytes,
        gpu_milli: r.gpu_milli,
        extended: r.extended.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
    }
}

fn taint_effect(e: wit::TaintEffect) -> api::TaintEffect {
    match e {
        wit::TaintEffect::NoSchedule => api::TaintEffect::NoSchedule,
        wit::TaintEffect::PreferNoSchedule => api::TaintEffect::PreferNoSchedule,
        wit::TaintEffect::NoExecute => api::TaintEffect::NoExecute,
    }
}

/// A node, its devices' kinds asked of the host (once per node change, not per call).
pub(super) fn node(n: wit::Node) -> api::Node {
    let mut kinds = super::device_kinds(&n.name);
    if kinds.len() != n.gpus.len() {
        kinds.clear();
    }
    let mut kinds = kinds.into_iter();
    api::Node {
        name: n.name,
        labels: n.labels,
        taints: n
            .taints
            .into_iter()
            .map(|t| api::Taint { key: t.key, value: t.value, effect: taint_effect(t.effect) })
            .collect(),
        allocatable: resources(n.allocatable),
        allocated: resources(n.allocated),
        gpus: n
            .gpus
            .into_iter()
            .map(|g| api::GpuDevice {
                index: g.index,
                model: g.model,
                memory_bytes: g.memory_bytes,
                free_milli: g.free_milli,
                free_memory_bytes: g.free_memory_bytes,
                health: match g.health {
                    wit::GpuHealth::Healthy => api::GpuHealth::Healthy,
                    wit::GpuHealth::Degraded => api::GpuHealth::Degraded,
                    wit::GpuHealth::Unhealthy => api::GpuHealth::Unhealthy,
                },
                numa_node: g.numa_node,
                kind: kinds.next().map(api::accelerators::KindName::from).unwrap_or_default(),
            })
            .collect(),
        unschedulable: n.unschedulable,
    }
}

/// The accelerator kind a request is for (the host's kinds asked only when it names an extended
/// resource).
fn kind_of(request: &api::Resources) -> api::accelerators::KindName {
    if request.extended.is_empty() {
        return Default::default();
    }
    api::accelerators::kind_of_request(super::kinds(), request)
}

pub(super) fn task(t: wit::Task) -> api::Task {
    let request = resources(t.request);
    let kind = kind_of(&request);
    api::Task {
        id: t.id,
        namespace: t.namespace,
        group: t.group,
        queue: t.queue,
        priority: t.priority,
        qos: qos(t.qos),
        request,
        gpu: api::GpuRequest {
            count: t.gpu.count,
            milli_per_gpu: t.gpu.milli_per_gpu,
            memory_bytes_per_gpu: t.gpu.memory_bytes_per_gpu,
            models: t.gpu.models,
            kind,
        },
        node_selector: t.node_selector,
        node_affinity: node_affinity(t.node_affinity),
        tolerations: t
            .tolerations
            .into_iter()
            .map(|t| api::Toleration {
                key: t.key,
                operator: match t.operator {
                    wit::TolerationOperator::Equal => api::TolerationOperator::Equal,
                    wit::TolerationOperator::Exists => api::TolerationOperator::Exists,
                },
                value: t.value,
                effect: t.effect.map(taint_effect),
            })
            .collect(),
        // Host-only: the host resolved pod affinity into the node affinity above.
        labels: Vec::new(),
        pod_affinity: None,
    }
}

fn qos(q: wit::Qos) -> api::Qos {
    match q {
        wit::Qos::Guaranteed => api::Qos::Guaranteed,
        wit::Qos::Burstable => api::Qos::Burstable,
        wit::Qos::BestEffort => api::Qos::BestEffort,
    }
}

/// `placement`'s task: a brief one is a full one with every list empty.
pub(super) fn stage_task(t: placement::StageTask) -> api::Task {
    match t {
        placement::StageTask::Full(t) => task(t),
        placement::StageTask::Brief(t) => brief_task(t),
    }
}

/// `placement-counted`'s task: a counted one is a brief one with its extended resources.
pub(super) fn counted_stage_task(t: placement_counted::CountedStageTask) -> api::Task {
    match t {
        placement_counted::CountedStageTask::Full(t) => task(t),
        placement_counted::CountedStageTask::Brief(t) => brief_task(t),
        placement_counted::CountedStageTask::Counted(t) => {
            let mut out = brief_task(t.brief);
            out.request.extended = t.extended.into_iter().map(|(n, v)| (api::ResourceName::new(&n), v)).collect();
            out.gpu.kind = kind_of(&out.request);
            out
        }
    }
}

fn brief_task(t: placement::BriefTask) -> api::Task {
    api::Task {
        id: t.id,
        namespace: t.namespace,
        group: t.group,
        queue: t.queue,
        priority: t.priority,
        qos: qos(t.qos),
        request: api::Resources {
            cpu_milli: t.cpu_milli,
            memory_bytes: t.memory_bytes,
            gpu_milli: t.gpu_milli,
            extended: Default::default(),
        },
        gpu: api::GpuRequest {
            count: t.gpu_count,
            milli_per_gpu: t.milli_per_gpu,
            memory_bytes_per_gpu: t.memory_bytes_per_gpu,
            // A brief task names no extended resource, so it is of NVIDIA's kind.
            ..Default::default()
        },
        ..api::Task::default()
    }
}

fn node_affinity(a: wit::NodeAffinity) -> api::NodeAffinity {
    fn requirement(r: wit::SelectorRequirement) -> api::SelectorRequirement {
        api::SelectorRequirement {
            key: r.key,
            operator: match r.operator {
                wit::SelectorOperator::In => api::SelectorOperator::In,
                wit::SelectorOperator::NotIn => api::SelectorOperator::NotIn,
                wit::SelectorOperator::Exists => api::SelectorOperator::Exists,
                wit::SelectorOperator::DoesNotExist => api::SelectorOperator::DoesNotExist,
                wit::SelectorOperator::Gt => api::SelectorOperator::Gt,
                wit::SelectorOperator::Lt => api::SelectorOperator::Lt,
            },
            values: r.values,
        }
    }
    fn term(t: wit::NodeSelectorTerm) -> api::NodeSelectorTerm {
        api::NodeSelectorTerm {
            match_expressions: t.match_expressions.into_iter().map(requirement).collect(),
            match_fields: t.match_fields.into_iter().map(requirement).collect(),
        }
    }
    api::NodeAffinity {
        required: a.required.into_iter().map(term).collect(),
        preferred: a
            .preferred
            .into_iter()
            .map(|p| api::PreferredTerm { weight: p.weight, preference: term(p.preference) })
            .collect(),
    }
}

pub(super) fn rejection(r: api::Rejection) -> wit::Rejection {
    wit::Rejection { reason: r.reason, unresolvable: r.unresolvable }
}

pub(super) fn stage(s: api::Stage) -> wit::Stage {
    match s {
        api::Stage::Filter => wit::Stage::Filter,
        api::Stage::Score => wit::Stage::Score,
        api::Stage::Preempt => wit::Stage::Preempt,
        api::Stage::FairShare => wit::Stage::FairShare,
        api::Stage::SelectDevices => wit::Stage::SelectDevices,
    }
}

pub(super) fn candidate(c: preempt::Candidate) -> api::PreemptCandidate {
    api::PreemptCandidate {
        node: c.node,
        victims: c
            .victims
            .into_iter()
            .map(|v| api::Victim {
                task: task(v.task),
                running_seconds: v.running_seconds,
                group_running: v.group_running,
                group_min_member: v.group_min_member,
                checkpointable: v.checkpointable,
            })
            .collect(),
    }
}

pub(super) fn queue(q: fair_share::QueueState) -> api::QueueState {
    api::QueueState {
        name: q.name,
        parent: q.parent,
        weight: q.weight,
        guarantee: resources(q.guarantee),
        capability: q.capability.map(resources),
        allocated: resources(q.allocated),
        request: resources(q.request),
        decayed_usage: q.decayed_usage,
        reclaimable: q.reclaimable,
    }
}
