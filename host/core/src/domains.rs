//! Free capacity per topology domain at every level, kept as placements change.
//!
//! A cluster's levels (NVLink clique, rack, block, zone — node labels, innermost first) split its
//! nodes into domains; a domain of level `l` is the nodes sharing the values of labels `l..`, as
//! gang placement reads them ([`crate::gang`]), so equal rack names in two blocks are two racks.
//! Scores that keep whole domains free for big gangs ask about a candidate's domain on every
//! call; summing it from its nodes would walk the cluster per call, so the [`crate::NodeTable`]
//! keeps the sums here, adjusting one node's share on each change — and hands plugins a snapshot
//! of them ([`wasmsched_api::domains::DomainView`]).

use ahash::AHashMap;
use wasmsched_api::Node;
use wasmsched_api::domains::{Domain, DomainView, domain_name};

/// The domains of every level, with their capacity, and each node's membership.
#[derive(Clone, Debug, Default)]
pub struct Domains {
    /// Node labels, innermost first.
    levels: Vec<String>,
    /// Domains by id.
    domains: Vec<Domain>,
    /// `(level, name)` → id.
    ids: AHashMap<(u32, String), u32>,
    /// Each known node's domains (one per level it has) and what it adds to them.
    members: AHashMap<String, Member>,
}

#[derive(Clone, Debug)]
struct Member {
    /// `(level, domain id)`.
    domains: Vec<(u32, u32)>,
    share: Share,
}

/// What one node adds to each of its domains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Share {
    idle: bool,
    gpu_milli: u64,
    free_gpu_milli: u64,
}

impl Share {
    fn of(node: &Node) -> Share {
        let gpus = node.gpus.summary();
        let gpu_milli = u64::from(gpus.usable) * u64::from(wasmsched_api::GPU_MILLI);
        Share {
            idle: node.allocated.cpu_milli == 0
                && node.allocated.memory_bytes == 0
                && node.allocated.gpu_milli == 0
                && gpus.free_milli == gpu_milli,
            gpu_milli,
            free_gpu_milli: gpus.free_milli,
        }
    }
}

impl Domains {
    /// No levels: every question answers "no domain", and changes cost nothing.
    pub fn new(levels: Vec<String>) -> Domains {
        Domains { levels, ..Domains::default() }
    }

    /// The levels' labels, innermost first.
    pub fn levels(&self) -> &[String] {
        &self.levels
    }

    /// Whether any level is configured.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// `node` joined or changed (its labels too): its share moves to the domains its labels name.
    pub(crate) fn set(&mut self, node: &Node) {
        if self.levels.is_empty() {
            return;
        }
        self.remove(&node.name);
        let mut domains = Vec::new();
        for level in 0..self.levels.len() {
            let Some(name) = domain_name(node, &self.levels[level..]) else { continue };
            let key = (level as u32, name);
            let id = match self.ids.get(&key) {
                Some(&id) => id,
                None => {
                    let id = self.domains.len() as u32;
                    self.domains.push(Domain { name: key.1.clone(), ..Domain::default() });
                    self.ids.insert(key, id);
                    id
                }
            };
            domains.push((level as u32, id));
        }
        let member = Member { domains, share: Share::of(node) };
        apply(&mut self.domains, &member.domains, member.share, true);
        self.members.insert(node.name.clone(), member);
    }

    /// `node`'s usage changed (labels unchanged).
    pub(crate) fn usage(&mut self, node: &Node) {
        if self.levels.is_empty() {
            return;
        }
        let share = Share::of(node);
        let Some(member) = self.members.get_mut(&node.name) else { return };
        if member.share == share {
            return;
        }
        apply(&mut self.domains, &member.domains, member.share, false);
        apply(&mut self.domains, &member.domains, share, true);
        member.share = share;
    }

    /// Node `name` left.
    pub(crate) fn remove(&mut self, name: &str) {
        if let Some(member) = self.members.remove(name) {
            apply(&mut self.domains, &member.domains, member.share, false);
        }
    }

    /// The domain of `level` node `node` is in.
    pub fn of(&self, node: &str, level: usize) -> Option<&Domain> {
        let member = self.members.get(node)?;
        let &(_, id) = member.domains.iter().find(|(l, _)| *l as usize == level)?;
        self.domains.get(id as usize)
    }

    /// Every domain of `level` with at least one node, by name.
    pub fn at_level(&self, level: usize) -> Vec<&Domain> {
        let mut out: Vec<&Domain> = self
            .ids
            .iter()
            .filter(|((l, _), _)| *l as usize == level)
            .map(|(_, &id)| &self.domains[id as usize])
            .filter(|d| d.nodes > 0)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// Adds (or takes away) `share` to each of `members`' domains.
fn apply(domains: &mut [Domain], members: &[(u32, u32)], share: Share, add: bool) {
    for &(_, id) in members {
        let d = &mut domains[id as usize];
        if add {
            d.nodes += 1;
            d.idle_nodes += u32::from(share.idle);
            d.gpu_milli += share.gpu_milli;
            d.free_gpu_milli += share.free_gpu_milli;
        } else {
            d.nodes -= 1;
            d.idle_nodes -= u32::from(share.idle);
            d.gpu_milli -= share.gpu_milli;
            d.free_gpu_milli -= share.free_gpu_milli;
        }
    }
}

impl DomainView for Domains {
    fn levels(&self) -> Vec<String> {
        self.levels.clone()
    }

    fn domain(&self, level: u32, name: &str) -> Option<Domain> {
        // The key is owned; a lookup per distinct domain per call is cheap next to the call.
        let &id = self.ids.get(&(level, name.to_string()))?;
        Some(&self.domains[id as usize]).filter(|d| d.nodes > 0).cloned()
    }
}

#[cfg(test)]
mod tests {
    use wasmsched_api::{GpuDevice, Resources};

    use super::*;
    use crate::NodeTable;
    use crate::node_accounting::{bind, release};

    fn node(name: &str, clique: &str, block: &str) -> Node {
        Node {
            name: name.into(),
            labels: vec![("clique".into(), clique.into()), ("block".into(), block.into())],
            allocatable: Resources { cpu_milli: 8000, memory_bytes: 1 << 34, gpu_milli: 4000, ..Resources::default() },
            gpus: (0..4)
                .map(|i| GpuDevice {
                    index: i,
                    model: "GB200".into(),
                    memory_bytes: 1 << 30,
                    free_milli: 1000,
                    free_memory_bytes: 1 << 30,
                    ..GpuDevice::default()
                })
                .collect::<Vec<_>>()
                .into(),
            ..Node::default()
        }
    }

    #[test]
    fn sums_follow_nodes_and_their_usage_at_every_level() {
        let mut t = NodeTable::new();
        t.set_levels(vec!["clique".into(), "block".into()]);
        for (n, c, b) in [("a", "c0", "b0"), ("b", "c0", "b0"), ("c", "c1", "b0"), ("d", "c0", "b1")] {
            t.upsert(node(n, c, b));
        }
        let d = t.domains();
        let c0 = d.of("a", 0).unwrap();
        assert_eq!((c0.name.as_str(), c0.nodes, c0.idle_nodes, c0.gpu_milli), ("c0/b0", 2, 2, 8000));
        assert!(c0.is_whole());
        // The same clique name in another block is another clique.
        assert_eq!(d.of("d", 0).unwrap().name, "c0/b1");
        assert_eq!(d.of("d", 0).unwrap().nodes, 1);
        assert_eq!((d.of("c", 1).unwrap().name.as_str(), d.of("c", 1).unwrap().nodes), ("b0", 3));

        // A bind moves the node's share: its clique and block lose free GPUs and an idle node.
        let task = wasmsched_api::Task {
            gpu: wasmsched_api::GpuRequest { count: 2, milli_per_gpu: 1000, ..Default::default() },
            request: Resources { gpu_milli: 2000, ..Resources::default() },
            ..Default::default()
        };
        let devices =
            [wasmsched_api::DeviceShare { gpu: 0, milli: 1000 }, wasmsched_api::DeviceShare { gpu: 1, milli: 1000 }];
        let slot = t.slot_of("b").unwrap();
        t.update_usage(slot, |n| bind(n, &task, &devices)).unwrap().unwrap();
        let c0 = t.domains().of("a", 0).unwrap().clone();
        assert_eq!((c0.idle_nodes, c0.free_gpu_milli), (1, 6000), "{c0:?}");
        assert!(!c0.is_whole());
        assert_eq!(t.domains().of("c", 1).unwrap().free_gpu_milli, 10_000);
        // A snapshot keeps the sums it was taken with.
        let before = t.snapshot();
        t.update_usage(slot, |n| release(n, &task, &devices));
        assert!(t.domains().of("a", 0).unwrap().is_whole());
        assert_eq!(before.domains().of("a", 0).unwrap().free_gpu_milli, 6000);

        // Relabelled, a node moves; removed, it leaves.
        t.upsert(node("b", "c1", "b0"));
        assert_eq!((t.domains().of("a", 0).unwrap().nodes, t.domains().of("c", 0).unwrap().nodes), (1, 2));
        t.remove("c");
        assert_eq!(t.domains().of("b", 0).unwrap().nodes, 1);
        assert!(t.domains().of("c", 0).is_none());
        let names: Vec<&str> = t.domains().at_level(0).iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["c0/b0", "c0/b1", "c1/b0"]);
        // Levels set later are computed from the nodes already there.
        let mut late = NodeTable::new();
        late.upsert(node("x", "c9", "b9"));
        assert!(late.domains().of("x", 0).is_none());
        late.set_levels(vec!["block".into()]);
        assert_eq!(late.domains().of("x", 0).unwrap().name, "b9");
    }
}
