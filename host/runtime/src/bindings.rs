//! Host bindings generated from `wit/policy.wit` (world `every-stage`: every export the host
//! can call), and conversions from the API types.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "every-stage",
});

use wasmsched::policy::types as wit;
use wasmsched_api as api;

pub(crate) use exports::wasmsched::policy::{
    fair_share, fair_share_delta, filter, mirror, mirror_usage, placement, placement_counted, plugin, preempt, score,
    select_claim_devices, select_devices,
};

/// A DRA claim request as the contract sends it.
pub(crate) fn claim_request(r: &api::ClaimRequest) -> select_claim_devices::ClaimRequest {
    use select_claim_devices::AttributeValue as W;
    select_claim_devices::ClaimRequest {
        name: r.name.clone(),
        count: r.count,
        candidates: r
            .candidates
            .iter()
            .map(|d| select_claim_devices::ClaimDevice {
                id: d.id.clone(),
                attributes: d
                    .attributes
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            api::AttributeValue::Bool(b) => W::Boolean(*b),
                            api::AttributeValue::Int(i) => W::Integer(*i),
                            api::AttributeValue::String(t) => W::Text(t.clone()),
                            api::AttributeValue::Version(v) => W::Version(v.clone()),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
                capacity: d.capacity.clone(),
            })
            .collect(),
    }
}

pub(crate) fn resources(r: &api::Resources) -> wit::Resources {
    wit::Resources {
        cpu_milli: r.cpu_milli,
        memory_bytes: r.memory_bytes,
        gpu_milli: r.gpu_milli,
        extended: r.extended.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
    }
}

pub(crate) fn resources_in(r: wit::Resources) -> api::Resources {
    api::Resources {
        cpu_milli: r.cpu_milli,
        memory_bytes: r.memory_bytes,
        gpu_milli: r.gpu_milli,
        extended: r.extended.into_iter().map(|(n, v)| (api::ResourceName::new(&n), v)).collect(),
    }
}

fn taint_effect(e: api::TaintEffect) -> wit::TaintEffect {
    match e {
        api::TaintEffect::NoSchedule => wit::TaintEffect::NoSchedule,
        api::TaintEffect::PreferNoSchedule => wit::TaintEffect::PreferNoSchedule,
        api::TaintEffect::NoExecute => wit::TaintEffect::NoExecute,
    }
}

pub(crate) fn node(n: &api::Node) -> wit::Node {
    wit::Node {
        name: n.name.clone(),
        labels: n.labels.clone(),
        taints: n
            .taints
            .iter()
            .map(|t| wit::Taint { key: t.key.clone(), value: t.value.clone(), effect: taint_effect(t.effect) })
            .collect(),
        allocatable: resources(&n.allocatable),
        allocated: resources(&n.allocated),
        gpus: n
            .gpus
            .iter()
            .map(|g| wit::GpuDevice {
                index: g.index,
                model: g.model.clone(),
                memory_bytes: g.memory_bytes,
                free_milli: g.free_milli,
                free_memory_bytes: g.free_memory_bytes,
                health: match g.health {
                    api::GpuHealth::Healthy => wit::GpuHealth::Healthy,
                    api::GpuHealth::Degraded => wit::GpuHealth::Degraded,
                    api::GpuHealth::Unhealthy => wit::GpuHealth::Unhealthy,
                },
                numa_node: g.numa_node,
            })
            .collect(),
        unschedulable: n.unschedulable,
    }
}

/// What `mirror-usage` sends of a node: its allocation and devices' free share and memory.
pub(crate) fn usage(n: &api::Node) -> mirror_usage::NodeUsage {
    mirror_usage::NodeUsage {
        allocated: resources(&n.allocated),
        gpus: n
            .gpus
            .iter()
            .map(|g| mirror_usage::GpuUsage { free_milli: g.free_milli, free_memory_bytes: g.free_memory_bytes })
            .collect(),
    }
}

pub(crate) fn task(t: &api::Task) -> wit::Task {
    wit::Task {
        id: t.id.clone(),
        namespace: t.namespace.clone(),
        group: t.group.clone(),
        queue: t.queue.clone(),
        priority: t.priority,
        qos: qos(t.qos),
        request: resources(&t.request),
        gpu: wit::GpuRequest {
            count: t.gpu.count,
            milli_per_gpu: t.gpu.milli_per_gpu,
            memory_bytes_per_gpu: t.gpu.memory_bytes_per_gpu,
            models: t.gpu.models.clone(),
        },
        node_selector: t.node_selector.clone(),
        node_affinity: node_affinity(&t.node_affinity),
        tolerations: t
            .tolerations
            .iter()
            .map(|x| wit::Toleration {
                key: x.key.clone(),
                operator: match x.operator {
                    api::TolerationOperator::Equal => wit::TolerationOperator::Equal,
                    api::TolerationOperator::Exists => wit::TolerationOperator::Exists,
                },
                value: x.value.clone(),
                effect: x.effect.map(taint_effect),
            })
            .collect(),
    }
}

/// `placement`'s form of `t`: brief when every list the contract sends is empty (the host-only
/// `labels` and `pod_affinity` are never sent).
pub(crate) fn stage_task(t: &api::Task) -> placement::StageTask {
    if t.request.extended.is_empty() && lists_but_extended_empty(t) {
        placement::StageTask::Brief(brief_task(t))
    } else {
        placement::StageTask::Full(task(t))
    }
}

/// `placement-counted`'s form of `t`: brief when every list is empty, counted when only its
/// extended resources are not, else full.
pub(crate) fn counted_stage_task(t: &api::Task) -> placement_counted::CountedStageTask {
    use placement_counted::CountedStageTask as Form;
    if !lists_but_extended_empty(t) {
        return Form::Full(task(t));
    }
    if t.request.extended.is_empty() {
        return Form::Brief(brief_task(t));
    }
    Form::Counted(placement_counted::CountedTask {
        brief: brief_task(t),
        extended: t.request.extended.iter().map(|(n, v)| (n.as_str().to_owned(), *v)).collect(),
    })
}

/// Every list of the task the contract sends, extended resources aside, is empty.
fn lists_but_extended_empty(t: &api::Task) -> bool {
    t.gpu.models.is_empty()
        && t.node_selector.is_empty()
        && t.node_affinity.required.is_empty()
        && t.node_affinity.preferred.is_empty()
        && t.tolerations.is_empty()
}

fn brief_task(t: &api::Task) -> placement::BriefTask {
    placement::BriefTask {
        id: t.id.clone(),
        namespace: t.namespace.clone(),
        group: t.group.clone(),
        queue: t.queue.clone(),
        priority: t.priority,
        qos: qos(t.qos),
        cpu_milli: t.request.cpu_milli,
        memory_bytes: t.request.memory_bytes,
        gpu_milli: t.request.gpu_milli,
        gpu_count: t.gpu.count,
        milli_per_gpu: t.gpu.milli_per_gpu,
        memory_bytes_per_gpu: t.gpu.memory_bytes_per_gpu,
    }
}

fn qos(q: api::Qos) -> wit::Qos {
    match q {
        api::Qos::Guaranteed => wit::Qos::Guaranteed,
        api::Qos::Burstable => wit::Qos::Burstable,
        api::Qos::BestEffort => wit::Qos::BestEffort,
    }
}

fn node_affinity(a: &api::NodeAffinity) -> wit::NodeAffinity {
    fn requirement(r: &api::SelectorRequirement) -> wit::SelectorRequirement {
        wit::SelectorRequirement {
            key: r.key.clone(),
            operator: match r.operator {
                api::SelectorOperator::In => wit::SelectorOperator::In,
                api::SelectorOperator::NotIn => wit::SelectorOperator::NotIn,
                api::SelectorOperator::Exists => wit::SelectorOperator::Exists,
                api::SelectorOperator::DoesNotExist => wit::SelectorOperator::DoesNotExist,
                api::SelectorOperator::Gt => wit::SelectorOperator::Gt,
                api::SelectorOperator::Lt => wit::SelectorOperator::Lt,
            },
            values: r.values.clone(),
        }
    }
    fn term(t: &api::NodeSelectorTerm) -> wit::NodeSelectorTerm {
        wit::NodeSelectorTerm {
            match_expressions: t.match_expressions.iter().map(requirement).collect(),
            match_fields: t.match_fields.iter().map(requirement).collect(),
        }
    }
    wit::NodeAffinity {
        required: a.required.iter().map(term).collect(),
        preferred: a
            .preferred
            .iter()
            .map(|p| wit::PreferredTerm { weight: p.weight, preference: term(&p.preference) })
            .collect(),
    }
}

pub(crate) fn stage_in(s: wit::Stage) -> api::Stage {
    match s {
        wit::Stage::Filter => api::Stage::Filter,
        wit::Stage::Score => api::Stage::Score,
        wit::Stage::Preempt => api::Stage::Preempt,
        wit::Stage::FairShare => api::Stage::FairShare,
        wit::Stage::SelectDevices => api::Stage::SelectDevices,
    }
}

pub(crate) fn rejection_in(r: wit::Rejection) -> api::Rejection {
    api::Rejection { reason: r.reason, unresolvable: r.unresolvable }
}

pub(crate) fn candidate(c: &api::PreemptCandidate) -> preempt::Candidate {
    preempt::Candidate {
        node: c.node,
        victims: c
            .victims
            .iter()
            .map(|v| preempt::Victim {
                task: task(&v.task),
                running_seconds: v.running_seconds,
                group_running: v.group_running,
                group_min_member: v.group_min_member,
                checkpointable: v.checkpointable,
            })
            .collect(),
    }
}

pub(crate) fn queue(q: &api::QueueState) -> fair_share::QueueState {
    fair_share::QueueState {
        name: q.name.clone(),
        parent: q.parent,
        weight: q.weight,
        guarantee: resources(&q.guarantee),
        capability: q.capability.as_ref().map(resources),
        allocated: resources(&q.allocated),
        request: resources(&q.request),
        decayed_usage: q.decayed_usage,
        reclaimable: q.reclaimable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(edit: impl FnOnce(&mut api::Task)) -> api::Task {
        let mut t = api::Task { id: "t".into(), ..Default::default() };
        edit(&mut t);
        t
    }

    #[test]
    fn a_task_goes_counted_when_only_its_extended_resources_are_listed() {
        use placement_counted::CountedStageTask as Counted;
        let extended = |t: &mut api::Task| {
            t.request.extended = vec![("a/x".into(), 2), ("deviceclass.resource.kubernetes.io/gpu".into(), 4)].into();
        };
        // Nothing listed: brief either way.
        assert!(matches!(counted_stage_task(&with(|_| {})), Counted::Brief(_)));
        assert!(matches!(stage_task(&with(|_| {})), placement::StageTask::Brief(_)));
        // Extended resources only: counted, with every name and amount in order; full for
        // `placement`, which has no such form.
        match counted_stage_task(&with(extended)) {
            Counted::Counted(c) => {
                assert_eq!(c.extended, [("a/x".to_string(), 2), ("deviceclass.resource.kubernetes.io/gpu".into(), 4)]);
                assert_eq!(c.brief.id, "t");
            }
            _ => panic!("not counted"),
        }
        assert!(matches!(stage_task(&with(extended)), placement::StageTask::Full(_)));
        // Any other list makes it full, with or without extended resources.
        let others: [fn(&mut api::Task); 5] = [
            |t| t.gpu.models = vec!["H100".into()],
            |t| t.node_selector = vec![("zone".into(), "a".into())],
            |t| t.node_affinity.required = vec![api::NodeSelectorTerm::default()],
            |t| t.node_affinity.preferred = vec![api::PreferredTerm::default()],
            |t| t.tolerations = vec![api::Toleration::default()],
        ];
        for (i, other) in others.iter().enumerate() {
            assert!(matches!(counted_stage_task(&with(other)), Counted::Full(_)), "list {i}");
            let both = with(|t| {
                extended(t);
                other(t);
            });
            assert!(matches!(counted_stage_task(&both), Counted::Full(_)), "list {i} with extended resources");
        }
        // Host-only fields are never sent: they leave it brief.
        assert!(matches!(counted_stage_task(&with(|t| t.labels = vec![("a".into(), "b".into())])), Counted::Brief(_)));
    }
}
