//! Topology beyond the node as plugins see it (`domains` in the WIT): the cluster's levels — zone,
//! block, rack, NVLink clique, each named by a node label — and each domain's capacity, kept by the
//! host as placements change.
//!
//! A score that must not break up whole domains (a small job placed where big gangs would lose
//! their one-clique home) needs the state of nodes other than the candidate. The guest's mirror
//! holds every node, but summing a domain per candidate would cost a walk over the cluster per
//! call; the host keeps the sums and answers per node. Plugins call the SDK's
//! `wasmsched_sdk::domains` functions; this module holds the shared types and, natively, the hook
//! through which the host answers on the calling thread.

/// One domain of one level: the nodes sharing the values of that level's label and of every level
/// outside it (so rack `r1` in two blocks is two racks), named by [`domain_name`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Domain {
    /// The label values, innermost first, joined by `/` (e.g. `nvl72.3/block-1`).
    pub name: String,
    /// Its nodes.
    pub nodes: u32,
    /// Of them, nodes with nothing allocated.
    pub idle_nodes: u32,
    /// GPU share of its usable devices, in milli-GPUs.
    pub gpu_milli: u64,
    /// Of it, unallocated.
    pub free_gpu_milli: u64,
}

impl Domain {
    /// Nothing of it is allocated.
    pub fn is_whole(&self) -> bool {
        self.idle_nodes == self.nodes
    }
}

/// What the host answers. Implemented by the scheduler core; the Wasm runtime forwards the
/// component's `domains` imports to it.
pub trait DomainView: Send + Sync {
    /// The levels' node labels, innermost first; empty when none are configured.
    fn levels(&self) -> Vec<String>;
    /// The domain of `level` (an index into [`DomainView::levels`]) named `name` ([`domain_name`]
    /// of the level's labels); None when no node is in it.
    fn domain(&self, level: u32, name: &str) -> Option<Domain>;
}

/// The name of the domain of the innermost of `labels` that `node` is in: the values of `labels`,
/// innermost first, joined by `/` (an outer label the node lacks counts as empty — a cluster
/// describes the levels it has — and trailing empties are dropped). None when it lacks the
/// innermost label. The host and plugins name domains with this one function, so they agree.
pub fn domain_name(node: &crate::Node, labels: &[String]) -> Option<String> {
    let mut name = String::new();
    domain_name_into(node, labels, &mut name).then_some(name)
}

/// [`domain_name`] written into `name` (cleared first), so a caller naming many nodes' domains
/// reuses one buffer; false when the node lacks the innermost label.
pub fn domain_name_into(node: &crate::Node, labels: &[String], name: &mut String) -> bool {
    domain_name_by(|key| node.label(key), labels, name)
}

/// [`domain_name_into`] for a node known only by a label lookup (the dashboard's rows).
pub fn domain_name_by<'a>(label: impl Fn(&str) -> Option<&'a str>, labels: &[String], name: &mut String) -> bool {
    name.clear();
    let Some((innermost, outer)) = labels.split_first() else { return false };
    let Some(value) = label(innermost) else { return false };
    name.push_str(value);
    let mut empties = 0;
    for l in outer {
        match label(l) {
            Some(value) if !value.is_empty() => {
                for _ in 0..=empties {
                    name.push('/');
                }
                empties = 0;
                name.push_str(value);
            }
            _ => empties += 1,
        }
    }
    true
}

call_view!(DomainView);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_join_the_levels_outward_and_skip_what_a_node_lacks() {
        let node = |labels: &[(&str, &str)]| crate::Node {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..crate::Node::default()
        };
        let levels: Vec<String> = ["rack", "block", "zone"].map(String::from).to_vec();
        let full = node(&[("rack", "r1"), ("block", "b0"), ("zone", "z")]);
        assert_eq!(domain_name(&full, &levels).as_deref(), Some("r1/b0/z"));
        assert_eq!(domain_name(&full, &levels[1..]).as_deref(), Some("b0/z"));
        // A middle level it lacks stays an empty value; trailing ones are dropped.
        assert_eq!(domain_name(&node(&[("rack", "r1"), ("zone", "z")]), &levels).as_deref(), Some("r1//z"));
        assert_eq!(domain_name(&node(&[("rack", "r1")]), &levels).as_deref(), Some("r1"));
        assert_eq!(domain_name(&node(&[("block", "b0")]), &levels), None);
        assert_eq!(domain_name(&full, &[]), None);
    }
}
