//! Resource flavors (Kueue's `ResourceFlavor`): named kinds of node — "A100 nodes", "V100 nodes" —
//! with quotas of their own.
//!
//! A flavor is a set of node labels (and the tolerations its nodes need). A node belongs to the
//! first flavor, in declaration order, whose labels it carries. Quota for a flavor is an ordinary
//! resource with a qualified name, `<flavor>/cpu`, `<flavor>/memory`, `<flavor>/gpu` (milli-GPUs)
//! or `<flavor>/<extended>`, in a queue's guarantee, capability, borrowing and lending limits; a
//! task placed on a flavor's node takes the qualified copies of its demand as well as the plain
//! ones. So every quota rule (limits, reserves, reclaim, fair share) applies per flavor unchanged,
//! and a queue's plain quota still bounds its total across flavors.
//!
//! Placement tries a workload's flavors in order (its queue's list, else its nearest ancestor's,
//! else every flavor), each only on that flavor's nodes and only when the queue's quota for it
//! admits the workload; nodes of no flavor come last. The first flavor that places it wins.

use wasmsched_api::{Node, Resources, Toleration};

/// A kind of node, with quota of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flavor {
    /// Unique name; no `/` (it prefixes resource names).
    pub name: String,
    /// Labels a node must carry, all of them, to be of this flavor. Empty: every node (so a later
    /// flavor, and the unflavored nodes, get none).
    pub node_labels: Vec<(String, String)>,
    /// Added to every task placed with this flavor (its nodes are usually tainted).
    pub tolerations: Vec<Toleration>,
}

impl Flavor {
    /// Whether `node` carries every label of this flavor.
    pub fn matches(&self, node: &Node) -> bool {
        self.node_labels.iter().all(|(k, v)| node.label(k) == Some(v.as_str()))
    }
}

/// The name quota of `resource` (`cpu`, `memory`, `gpu` or an extended resource) on the nodes of
/// `flavor` is kept under.
pub fn flavored_resource(flavor: &str, resource: &str) -> String {
    format!("{flavor}/{resource}")
}

/// `into` plus the qualified copies of `amount` for `flavor` (CPU in milli-cores, memory in
/// bytes, GPUs in milli-GPUs, extended resources as they are): how a frontend writes a queue's
/// per-flavor quota, and what a task placed on a flavor's node takes from its queue.
pub fn add_flavored(into: &mut Resources, flavor: &str, amount: &Resources) {
    let base = [("cpu", amount.cpu_milli), ("memory", amount.memory_bytes), ("gpu", amount.gpu_milli)];
    let extended = amount.extended.iter().map(|(n, v)| (n.as_str(), *v));
    for (resource, v) in base.into_iter().chain(extended) {
        let name = flavored_resource(flavor, resource);
        match into.extended.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(i) => into.extended[i].1 = into.extended[i].1.saturating_add(v),
            Err(i) => into.extended.insert(i, (name.into(), v)),
        }
    }
}

/// What `r` holds of `flavor`'s qualified resources, as plain amounts (the inverse of
/// [`add_flavored`]): a queue's allocation on one flavor's nodes, for status.
pub fn flavored_amount(r: &Resources, flavor: &str) -> Resources {
    let prefix = format!("{flavor}/");
    let mut out = Resources::default();
    for (name, v) in &r.extended {
        let Some(resource) = name.strip_prefix(&prefix) else { continue };
        match resource {
            "cpu" => out.cpu_milli = *v,
            "memory" => out.memory_bytes = *v,
            "gpu" => out.gpu_milli = *v,
            other => out.extended.push((other.into(), *v)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavored_copies_keep_extended_resources_sorted_and_add_up() {
        let mut r = Resources { cpu_milli: 1, extended: vec![("pods".into(), 3)].into(), ..Default::default() };
        let amount = Resources {
            cpu_milli: 2_000,
            memory_bytes: 8,
            gpu_milli: 1_000,
            extended: vec![("example.com/nic".into(), 1)].into(),
        };
        add_flavored(&mut r, "a100", &amount);
        add_flavored(&mut r, "a100", &amount);
        let names: Vec<&str> = r.extended.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a100/cpu", "a100/example.com/nic", "a100/gpu", "a100/memory", "pods"]);
        assert_eq!((r.extended("a100/gpu"), r.extended("a100/cpu"), r.cpu_milli), (2_000, 4_000, 1));
        let doubled = Resources {
            cpu_milli: 4_000,
            memory_bytes: 16,
            gpu_milli: 2_000,
            extended: vec![("example.com/nic".into(), 2)].into(),
        };
        assert_eq!(flavored_amount(&r, "a100"), doubled);
        assert_eq!(flavored_amount(&r, "a10"), Resources::default(), "a prefix of a flavor's name is another flavor");
    }

    #[test]
    fn a_node_is_of_a_flavor_when_it_carries_all_its_labels() {
        let f = Flavor {
            name: "a100".into(),
            node_labels: vec![("gpu".into(), "a100".into()), ("zone".into(), "a".into())],
            ..Default::default()
        };
        let node = |labels: &[(&str, &str)]| Node {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        assert!(f.matches(&node(&[("zone", "a"), ("gpu", "a100"), ("x", "y")])));
        assert!(!f.matches(&node(&[("gpu", "a100")])));
        assert!(!f.matches(&node(&[("gpu", "v100"), ("zone", "a")])));
        assert!(Flavor::default().matches(&node(&[])), "no labels: every node");
    }
}
