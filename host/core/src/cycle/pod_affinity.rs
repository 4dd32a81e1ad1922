//! Required inter-pod (anti-)affinity, resolved into node affinity against where pods run.
//!
//! The policy contract judges a task against one node at a time; which pods run in a node's
//! topology domain is cluster state the core holds. So before a task is placed, each of its terms
//! becomes a requirement on the term's topology label — anti-affinity: `NotIn` the domains holding
//! a pod it selects; affinity: `In` those domains — and each running pod's anti-affinity term that
//! selects the task keeps it out of that pod's domain (Kubernetes' symmetry). The requirements are
//! ANDed into every required node-affinity term, which filters (the built-in `resource-fit`)
//! check like any other. Running pods are the core's placed members and the pods of others the
//! driver reports per node ([`SchedulerCore::observe_pods`]).
//!
//! A gang's members are resolved again as the gang is placed, against its members placed before
//! them in the same attempt (so "one member per node" holds within a gang too). Limits: a gang
//! placed by preemption is resolved against running pods only; preemption does not count on
//! victims leaving a domain.

use std::collections::{BTreeMap, BTreeSet};

use wasmsched_api::{NodeSelectorTerm, PodAffinityTerm, PreferredTerm, SelectorOperator, SelectorRequirement, Task};

use super::SchedulerCore;
use crate::node_table::NodeTable;

/// A pod of another scheduler as affinity sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningPod {
    /// Its namespace.
    pub namespace: String,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// Its required anti-affinity terms (they keep pods they select out of its domain).
    pub anti_affinity: Vec<PodAffinityTerm>,
}

/// One running pod: where, and what affinity reads of it.
#[derive(Clone, Copy)]
pub(super) struct Running<'a> {
    pub node: &'a str,
    pub namespace: &'a str,
    pub labels: &'a [(String, String)],
    pub anti_affinity: &'a [PodAffinityTerm],
}

impl<'a> Running<'a> {
    /// `task`, placed on `node`.
    pub fn task(node: &'a str, task: &'a Task) -> Self {
        Running {
            node,
            namespace: &task.namespace,
            labels: &task.labels,
            anti_affinity: &task.pod_terms().anti_affinity,
        }
    }
}

impl SchedulerCore {
    /// Tell the core the pods of others running on `node` (for inter-pod affinity). Replaces what
    /// was said before; an empty list forgets the node.
    pub fn observe_pods(&mut self, node: &str, pods: Vec<RunningPod>) {
        // A new pod there may be the one parked work with required pod affinity waits for.
        self.wake_affinity_waiters();
        let anti: Vec<RunningPod> = pods.iter().filter(|p| !p.anti_affinity.is_empty()).cloned().collect();
        if anti.is_empty() {
            self.affinity.foreign_anti.remove(node);
        } else {
            self.affinity.foreign_anti.insert(node.to_string(), anti);
        }
        if pods.is_empty() {
            self.affinity.foreign_pods.remove(node);
        } else {
            self.affinity.foreign_pods.insert(node.to_string(), pods);
        }
    }

    /// `task` with its pod (anti-)affinity, and running pods' anti-affinity towards it, as
    /// required node affinity, and a summary for explanations; `Ok(None)` when nothing applies.
    /// `Err` when an affinity term can be met nowhere.
    pub(super) fn resolve_pod_affinity(&self, task: &Task) -> Result<Option<(Task, String)>, String> {
        let own_terms = !task.pod_terms().is_empty();
        if !own_terms && self.affinity.anti_holders.is_empty() && self.affinity.foreign_anti.is_empty() {
            return Ok(None);
        }
        // Its own terms look at every running pod; the others' terms only at pods that have some.
        resolve(&self.nodes, &self.running_pods(!own_terms), task)
    }

    /// The running pods (placed members and others' pods), or only those with anti-affinity.
    pub(super) fn running_pods(&self, anti_only: bool) -> Vec<Running<'_>> {
        let mut out = Vec::new();
        let entries: Box<dyn Iterator<Item = &super::Entry>> = if anti_only {
            Box::new(self.affinity.anti_holders.iter().filter_map(|w| self.entries.get(w)))
        } else {
            Box::new(self.entries.values())
        };
        for e in entries {
            for (t, m) in e.spec.members.iter().zip(&e.members) {
                if let Some(m) = m {
                    out.push(Running::task(&m.node, t));
                }
            }
        }
        for (node, pods) in if anti_only { &self.affinity.foreign_anti } else { &self.affinity.foreign_pods } {
            out.extend(pods.iter().map(|p| Running {
                node,
                namespace: &p.namespace,
                labels: &p.labels,
                anti_affinity: &p.anti_affinity,
            }));
        }
        out
    }
}

/// [`SchedulerCore::resolve_pod_affinity`] against `running`, the node labels in `nodes`.
pub(super) fn resolve(
    nodes: &NodeTable,
    running: &[Running<'_>],
    task: &Task,
) -> Result<Option<(Task, String)>, String> {
    let value = |node: &str, key: &str| {
        let n = nodes.get(nodes.slot_of(node)?)?;
        n.label(key).map(str::to_string)
    };
    let domains = |term: &PodAffinityTerm, owner: &str| {
        let mut selected = 0;
        let mut values = BTreeSet::new();
        for p in running.iter().filter(|p| term.selects(owner, p.namespace, p.labels)) {
            selected += 1;
            values.extend(value(p.node, &term.topology_key));
        }
        (selected, values)
    };
    let mut required: Vec<SelectorRequirement> = Vec::new();
    let mut requirement = |key: &str, operator, values: BTreeSet<String>| {
        required.push(SelectorRequirement { key: key.to_string(), operator, values: values.into_iter().collect() });
    };
    for term in &task.pod_terms().anti_affinity {
        let (_, values) = domains(term, &task.namespace);
        if !values.is_empty() {
            requirement(&term.topology_key, SelectorOperator::NotIn, values);
        }
    }
    for term in &task.pod_terms().affinity {
        let (selected, values) = domains(term, &task.namespace);
        if values.is_empty() {
            // Kubernetes: while no pod it selects runs anywhere, a pod its own term selects may
            // go anywhere (the first of a group).
            if selected == 0 && term.selects(&task.namespace, &task.namespace, &task.labels) {
                continue;
            }
            return Err(format!(
                "required pod affinity: no running pod it selects is on a node labelled {}",
                term.topology_key
            ));
        }
        requirement(&term.topology_key, SelectorOperator::In, values);
    }
    // Others' terms selecting it, by topology key (sorted: running pods come in no set order).
    let mut kept_out: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for p in running {
        for term in p.anti_affinity.iter().filter(|t| t.selects(p.namespace, &task.namespace, &task.labels)) {
            if let Some(v) = value(p.node, &term.topology_key) {
                kept_out.entry(&term.topology_key).or_default().insert(v);
            }
        }
    }
    for (key, values) in kept_out {
        requirement(key, SelectorOperator::NotIn, values);
    }
    // Preferred terms become preferred node-affinity terms with their weight: a node whose domain
    // holds a selected pod (affinity), or none (anti-affinity). An anti-affinity term selecting no
    // running pod favours every node alike: nothing to add.
    let mut preferred = Vec::new();
    let pods = [
        (SelectorOperator::In, &task.pod_terms().preferred),
        (SelectorOperator::NotIn, &task.pod_terms().anti_preferred),
    ];
    for (operator, terms) in pods {
        for (weight, term) in terms {
            let (_, values) = domains(term, &task.namespace);
            if values.is_empty() {
                continue;
            }
            let expression =
                SelectorRequirement { key: term.topology_key.clone(), operator, values: values.into_iter().collect() };
            let preference = NodeSelectorTerm { match_expressions: vec![expression], match_fields: Vec::new() };
            preferred.push(PreferredTerm { weight: *weight, preference });
        }
    }
    if required.is_empty() && preferred.is_empty() {
        return Ok(None);
    }
    let describe = |rs: &mut dyn Iterator<Item = &SelectorRequirement>| {
        rs.map(|r| {
            let op = if r.operator == SelectorOperator::In { "in" } else { "not in" };
            format!("{} {op} [{}]", r.key, r.values.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
    };
    let mut summary = Vec::new();
    if !required.is_empty() {
        summary.push(format!("required pod (anti-)affinity: {}", describe(&mut required.iter())));
    }
    if !preferred.is_empty() {
        let mut exprs = preferred.iter().flat_map(|p| &p.preference.match_expressions);
        summary.push(format!("preferred pod (anti-)affinity: {}", describe(&mut exprs)));
    }
    let mut resolved = task.clone();
    resolved.node_affinity.preferred.extend(preferred);
    if !required.is_empty() {
        let terms = &mut resolved.node_affinity.required;
        if terms.is_empty() {
            terms.push(NodeSelectorTerm { match_expressions: required, match_fields: Vec::new() });
        } else {
            for t in terms.iter_mut() {
                t.match_expressions.extend(required.iter().cloned());
            }
        }
    }
    Ok(Some((resolved, summary.join("; "))))
}
