//! Gang placement: a group's members are placed together or not at all.
//!
//! Members are placed one by one with the policy set and bound on the table as they go, so each
//! member sees the capacity its predecessors took (no over-commit of a node by a group, unlike
//! aggregate checks). If fewer than `min_member` fit, every member placed so far is released: the
//! table ends exactly as it started (allocations; its generation moves on).
//!
//! With a topology constraint (tiers of domains named by node labels, innermost first: rack, then
//! spine, then zone) the group goes to the **innermost tier where some domain can hold it**, trying
//! that tier's domains tightest fit first (best fit: the least free GPU share, so big domains stay
//! whole for big gangs); when no domain of a tier can, it spills to the next tier out — the nearest
//! larger domain. Strict groups never leave the outermost tier's domains; loose ones finally try the
//! whole cluster.

use std::collections::BTreeMap;

use wasmsched_api::Task;

use crate::node_accounting::{bind, release};
use crate::node_table::{NodeTable, Slot};
use crate::placement::{Diagnosis, Placement, place_among, place_sampled_among};
use crate::policy_set::PolicySet;

/// Keep a group inside the smallest topology domain that can hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyConstraint {
    /// Node labels naming the domains of each tier, innermost first (e.g. rack, spine, zone). A
    /// domain of tier `t` is the nodes sharing the values of labels `t..`, so equal rack names in
    /// two spines are different racks.
    pub tiers: Vec<String>,
    /// Never span the outermost tier's domains; otherwise fall back to the whole cluster.
    pub strict: bool,
    /// Not strict: how long (s, from submission) the group waits for a domain of its first tier
    /// before it falls back, while one could hold it once the work there ends. Falling back at
    /// once (0, Kueue's rule) splits a gang the moment every domain is busy, though one frees up
    /// soon and the split gang then runs at network speed for its whole run.
    pub wait_seconds: u64,
    /// Kueue's slices: the group in runs of consecutive members, each run inside one domain.
    pub slices: Option<Slices>,
}

/// The group in consecutive runs of `size` members (the last may be shorter), each run inside one
/// domain of `level` — Kueue's `podset-slice-size` and `podset-slice-required-topology`: a job
/// whose ranks talk most within groups (tensor parallelism inside a rack, data parallelism
/// across) needs each group close, not the whole job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slices {
    /// Members per run.
    pub size: usize,
    /// The level (node label) each run stays in one domain of.
    pub level: String,
}

impl TopologyConstraint {
    /// One tier.
    pub fn single(label: impl Into<String>, strict: bool) -> Self {
        TopologyConstraint { tiers: vec![label.into()], strict, wait_seconds: 0, slices: None }
    }

    /// What placement holds the group to at `now`, submitted at `since` and asking
    /// `gpu_milli` in all: while it waits for a domain of its first tier, that tier strictly;
    /// `None` when it is not waiting (no wait, strict already, waited long enough, or no domain
    /// of that tier is large enough to ever hold it).
    pub fn waiting(&self, nodes: &NodeTable, since: u64, now: u64, gpu_milli: u64) -> Option<TopologyConstraint> {
        if self.strict
            || self.wait_seconds == 0
            || self.tiers.is_empty()
            || now >= since.saturating_add(self.wait_seconds)
        {
            return None;
        }
        let first = &self.tiers[..1.min(self.tiers.len())];
        let large_enough = domains(nodes, first).iter().any(|(_, slots)| {
            let capacity: u64 = slots
                .iter()
                .filter_map(|s| nodes.get(*s))
                .map(|n| u64::from(n.gpus.summary().usable) * u64::from(wasmsched_api::GPU_MILLI))
                .sum();
            capacity >= gpu_milli
        });
        large_enough.then(|| TopologyConstraint {
            tiers: first.to_vec(),
            strict: true,
            wait_seconds: 0,
            slices: self.slices.clone(),
        })
    }

    /// Where a group placed under this constraint went, and why there when it is not the first
    /// choice: what a preferred level's fallback records (events, explanations).
    pub fn describe(&self, placed: &GangPlacement) -> String {
        let levels = |tiers: &[String]| tiers.join(" or ");
        let slices = self.slices.as_ref().map(|s| format!(", in slices of {} each in one {} domain", s.size, s.level));
        let slices = slices.unwrap_or_default();
        if self.tiers.is_empty() {
            return format!("anywhere{slices}");
        }
        let place = match (placed.level, &placed.domain) {
            (Some(0), Some(domain)) => format!("in {} {domain}", self.tiers[0]),
            (Some(level), Some(domain)) if level < self.tiers.len() => {
                format!("in {} {domain}: no {} domain had room", self.tiers[level], levels(&self.tiers[..level]))
            }
            _ => format!("across domains: no {} domain had room", levels(&self.tiers)),
        };
        format!("{place}{slices}")
    }
}

/// A group to place.
#[derive(Clone, Copy, Debug)]
pub struct GroupSpec<'a> {
    /// Name, for errors.
    pub name: &'a str,
    /// Members in placement order.
    pub members: &'a [Task],
    /// The fewest members that may run; below that, none does.
    pub min_member: usize,
    /// Optional domain constraint.
    pub topology: Option<&'a TopologyConstraint>,
    /// `None`: every candidate node is filtered and scored for every member (exact). `Some(k)`:
    /// kube-scheduler-style sampling — each member stops filtering once `k` feasible nodes are
    /// known, starting where the previous member stopped ([`crate::place_sampled_among`]).
    pub nodes_to_find: Option<usize>,
    /// Only these nodes (ascending slots), e.g. one resource flavor's; `None`: every node.
    pub within: Option<&'a [Slot]>,
    /// Asked before each member is placed, with the members placed before it in this attempt:
    /// the task to place instead (e.g. its pod anti-affinity resolved against them), or `None`.
    pub adjust: Option<Adjust<'a>>,
}

/// `(nodes, member index, [(member index, slot)] placed so far)` → the task to place instead.
pub type AdjustFn<'a> = dyn Fn(&NodeTable, usize, &[(usize, Slot)]) -> Option<Task> + 'a;

/// See [`GroupSpec::adjust`].
#[derive(Clone, Copy)]
pub struct Adjust<'a>(pub &'a AdjustFn<'a>);

impl std::fmt::Debug for Adjust<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Adjust(..)")
    }
}

/// A placed group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangPlacement {
    /// `(member index, placement)` of every placed member, in placement order.
    pub placed: Vec<(usize, Placement)>,
    /// The domain used (its label values, innermost first, joined by `/`), when constrained and
    /// satisfied inside one.
    pub domain: Option<String>,
    /// The tier of that domain (an index into [`TopologyConstraint::tiers`]); `None` when it went
    /// anywhere (or had no constraint).
    pub level: Option<usize>,
}

/// A group that could not be placed. Nothing of it stays bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GangError {
    /// Fewer than min-member members fit.
    #[error("group {group}: only {placed} of the {min_member} required members fit: {diagnosis}")]
    Unschedulable {
        /// Group name.
        group: String,
        /// Most members that fit in any attempt.
        placed: usize,
        /// Required.
        min_member: usize,
        /// Why the first member that did not fit was refused.
        diagnosis: Diagnosis,
    },
    /// The group itself is malformed.
    #[error("group {group}: min-member {min_member} must be between 1 and its {members} members")]
    Invalid {
        /// Group name.
        group: String,
        /// Given min-member.
        min_member: usize,
        /// Members.
        members: usize,
    },
}

/// Place `group` on `nodes` with `set`; see the module docs.
pub fn place_group(
    set: &PolicySet,
    nodes: &mut NodeTable,
    group: &GroupSpec<'_>,
    worker: usize,
) -> Result<GangPlacement, GangError> {
    let n = group.members.len();
    if group.min_member == 0 || group.min_member > n {
        return Err(GangError::Invalid { group: group.name.into(), min_member: group.min_member, members: n });
    }
    let mut best = (0, Diagnosis::default());
    // `spans`: the inner domains the group must span here (it fits in none of them), which it is
    // spread over evenly if it can be.
    let mut attempt = |nodes: &mut NodeTable, candidates: &[Slot], at: Option<(usize, String)>, spans: &[String]| {
        let (level, domain) = at.map_or((None, None), |(l, d)| (Some(l), Some(d)));
        if let Some(placed) = balanced(set, nodes, group, worker, candidates, spans) {
            return Some(GangPlacement { placed, domain, level });
        }
        match attempt(set, nodes, group, worker, candidates) {
            Ok(placed) => Some(GangPlacement { placed, domain, level }),
            Err((count, diagnosis)) => {
                if count >= best.0 {
                    best = (count, diagnosis);
                }
                None
            }
        }
    };
    if let Some(topo) = group.topology {
        for tier in 0..topo.tiers.len() {
            for (domain, mut slots) in domains(nodes, &topo.tiers[tier..]) {
                if let Some(within) = group.within {
                    slots.retain(|s| within.binary_search(s).is_ok());
                    if slots.is_empty() {
                        continue;
                    }
                }
                let spans = if tier > 0 { &topo.tiers[tier - 1..] } else { &[] };
                if let Some(p) = attempt(nodes, &slots, Some((tier, domain)), spans) {
                    return Ok(p);
                }
            }
        }
        if !topo.strict {
            let all = group.within.unwrap_or(nodes.occupied()).to_vec();
            let outermost = &topo.tiers[topo.tiers.len().saturating_sub(1)..];
            if let Some(p) = attempt(nodes, &all, None, outermost) {
                return Ok(p);
            }
        }
    } else {
        let all = group.within.unwrap_or(nodes.occupied()).to_vec();
        if let Some(p) = attempt(nodes, &all, None, &[]) {
            return Ok(p);
        }
    }
    Err(GangError::Unschedulable {
        group: group.name.into(),
        placed: best.0,
        min_member: group.min_member,
        diagnosis: best.1,
    })
}

/// Domains named by the values of `labels` (innermost first), tightest first (least free GPU
/// share, then least free CPU), ties by name. A node without the innermost label belongs to no
/// domain; an outer label it lacks counts as empty — a cluster describes the levels it has, and a
/// scheduler's list of levels (`zone > spine > rack > clique`) names more than most clusters use.
pub(crate) fn domains(nodes: &NodeTable, labels: &[String]) -> Vec<(String, Vec<Slot>)> {
    let mut by_value: BTreeMap<String, (u64, u64, Vec<Slot>)> = BTreeMap::new();
    for slot in nodes.slots() {
        let Some(node) = nodes.get(slot) else { continue };
        let Some(name) = wasmsched_api::domains::domain_name(node, labels) else { continue };
        let e = by_value.entry(name).or_default();
        e.0 = e.0.saturating_add(node.free_gpu_milli());
        e.1 = e.1.saturating_add(node.free_cpu_milli());
        e.2.push(slot);
    }
    let mut out: Vec<_> = by_value.into_iter().collect();
    out.sort_by(|a, b| (a.1.0, a.1.1).cmp(&(b.1.0, b.1.1)).then_with(|| a.0.cmp(&b.0)));
    out.into_iter().map(|(name, (_, _, slots))| (name, slots)).collect()
}

/// One attempt on `candidates`: place and bind members in order; roll back below min-member.
fn attempt(
    set: &PolicySet,
    nodes: &mut NodeTable,
    group: &GroupSpec<'_>,
    worker: usize,
    candidates: &[Slot],
) -> Result<Vec<(usize, Placement)>, (usize, Diagnosis)> {
    if let Some(slices) = group.topology.and_then(|t| t.slices.as_ref()) {
        return attempt_in_slices(set, nodes, group, worker, candidates, slices);
    }
    let mut placed: Vec<(usize, Placement)> = Vec::new();
    let mut first_failure: Option<Diagnosis> = None;
    let mut start = 0;
    for (i, task) in group.members.iter().enumerate() {
        // Stop as soon as min-member is out of reach.
        if placed.len() + (group.members.len() - i) < group.min_member {
            break;
        }
        let adjusted = group.adjust.and_then(|Adjust(f)| {
            let so_far: Vec<(usize, Slot)> = placed.iter().map(|(j, p)| (*j, p.node)).collect();
            f(nodes, i, &so_far)
        });
        let task = adjusted.as_ref().unwrap_or(task);
        let result = match group.nodes_to_find {
            None => place_among(set, nodes, task, worker, candidates),
            Some(find) => {
                let s = place_sampled_among(set, nodes, task, worker, candidates, start, find);
                start = (start + s.examined) % candidates.len().max(1);
                s.result
            }
        };
        match result {
            Ok(p) => match nodes.update_usage(p.node, |node| bind(node, task, &p.devices)) {
                Some(Ok(())) => placed.push((i, p)),
                _ => {
                    first_failure.get_or_insert_with(Diagnosis::default);
                }
            },
            Err(e) => {
                first_failure.get_or_insert(e.diagnosis);
            }
        }
    }
    settle(nodes, group, placed, first_failure)
}

/// A group that must span domains of `spans` (labels, innermost first) among `candidates`, spread
/// over as few of them as can hold it and evenly over those (Kueue's balanced placement): a split
/// collective then has no small remainder on a far domain, and each domain keeps an even share
/// of room for the next group. Only for groups whose members ask alike (counted by whole members
/// per node); `None` when it does not apply or the even split does not fit, and the caller places
/// the group in policy order instead. Nothing stays bound on `None`.
fn balanced(
    set: &PolicySet,
    nodes: &mut NodeTable,
    group: &GroupSpec<'_>,
    worker: usize,
    candidates: &[Slot],
    spans: &[String],
) -> Option<Vec<(usize, Placement)>> {
    let first = group.members.first()?;
    let per_member = first.gpu.total_milli();
    if spans.is_empty() || per_member == 0 || group.topology.is_some_and(|t| t.slices.is_some()) {
        return None;
    }
    if group.adjust.is_some() || group.members.iter().any(|m| m.gpu != first.gpu) {
        return None;
    }
    let mut allowed = candidates.to_vec();
    allowed.sort_unstable();
    // Each inner domain among the candidates, with how many members its nodes could take.
    let mut inner: Vec<(usize, String, Vec<Slot>)> = domains(nodes, spans)
        .into_iter()
        .filter_map(|(name, mut slots)| {
            slots.retain(|s| allowed.binary_search(s).is_ok());
            let fits = |s: &Slot| {
                let g = nodes.get(*s)?.gpus.summary();
                Some(if first.gpu.milli_per_gpu >= wasmsched_api::GPU_MILLI {
                    (g.whole_free / first.gpu.count.max(1)) as usize
                } else {
                    (g.free_milli / per_member) as usize
                })
            };
            let room: usize = slots.iter().filter_map(fits).sum();
            (room > 0).then_some((room, name, slots))
        })
        .collect();
    inner.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let n = group.members.len();
    let mut total = 0;
    let k = inner.iter().position(|(room, _, _)| {
        total += room;
        total >= n
    })? + 1;
    if k < 2 {
        return None;
    }
    // Even shares, the larger ones first; what a domain cannot take goes to the next with room.
    let mut share: Vec<usize> = (0..k).map(|i| n / k + usize::from(i < n % k)).collect();
    let mut over = 0;
    for (i, s) in share.iter_mut().enumerate() {
        let room = inner[i].0;
        if *s > room {
            over += *s - room;
            *s = room;
        }
    }
    for (i, s) in share.iter_mut().enumerate() {
        let more = (inner[i].0 - *s).min(over);
        *s += more;
        over -= more;
    }
    let mut placed: Vec<(usize, Placement)> = Vec::new();
    let mut next = 0;
    'domains: for (i, &count) in share.iter().enumerate() {
        for _ in 0..count {
            let task = &group.members[next];
            let bound = place_among(set, nodes, task, worker, &inner[i].2)
                .ok()
                .filter(|p| matches!(nodes.update_usage(p.node, |node| bind(node, task, &p.devices)), Some(Ok(()))));
            match bound {
                Some(p) => placed.push((next, p)),
                None => break 'domains,
            }
            next += 1;
        }
    }
    if next == n {
        return Some(placed);
    }
    unbind_all(nodes, group.members, placed);
    None
}

/// An attempt's end: its placements when they reach min-member, else all of them taken back and
/// how far it got.
fn settle(
    nodes: &mut NodeTable,
    group: &GroupSpec<'_>,
    placed: Vec<(usize, Placement)>,
    first_failure: Option<Diagnosis>,
) -> Result<Vec<(usize, Placement)>, (usize, Diagnosis)> {
    if placed.len() >= group.min_member {
        return Ok(placed);
    }
    let count = placed.len();
    unbind_all(nodes, group.members, placed);
    Err((count, first_failure.unwrap_or_default()))
}

/// Takes back `placed` (of `members`), the latest first.
fn unbind_all(nodes: &mut NodeTable, members: &[Task], placed: Vec<(usize, Placement)>) {
    for (i, p) in placed.into_iter().rev() {
        nodes.update_usage(p.node, |node| release(node, &members[i], &p.devices));
    }
}

/// [`attempt`] slice by slice: each slice's members all inside one domain of the slice level among
/// `candidates` (the tightest that holds them), or none of them. Every candidate node is scored
/// (no sampling) and pod affinity is not re-resolved between members.
fn attempt_in_slices(
    set: &PolicySet,
    nodes: &mut NodeTable,
    group: &GroupSpec<'_>,
    worker: usize,
    candidates: &[Slot],
    slices: &Slices,
) -> Result<Vec<(usize, Placement)>, (usize, Diagnosis)> {
    let mut allowed = candidates.to_vec();
    allowed.sort_unstable();
    let n = group.members.len();
    let mut placed: Vec<(usize, Placement)> = Vec::new();
    let mut first_failure: Option<Diagnosis> = None;
    let mut start = 0;
    while start < n && placed.len() + (n - start) >= group.min_member {
        let end = start.saturating_add(slices.size.max(1)).min(n);
        for (_, mut slots) in domains(nodes, std::slice::from_ref(&slices.level)) {
            slots.retain(|s| allowed.binary_search(s).is_ok());
            if slots.is_empty() {
                continue;
            }
            let mut run: Vec<(usize, Placement)> = Vec::new();
            for (i, task) in group.members.iter().enumerate().take(end).skip(start) {
                let bound = match place_among(set, nodes, task, worker, &slots) {
                    Ok(p) => match nodes.update_usage(p.node, |node| bind(node, task, &p.devices)) {
                        Some(Ok(())) => Some(p),
                        _ => None,
                    },
                    Err(e) => {
                        first_failure.get_or_insert(e.diagnosis);
                        None
                    }
                };
                match bound {
                    Some(p) => run.push((i, p)),
                    None => break,
                }
            }
            if run.len() == end - start {
                placed.append(&mut run);
                break;
            }
            unbind_all(nodes, group.members, run);
        }
        start = end;
    }
    settle(nodes, group, placed, first_failure)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wasmsched_api::{GpuDevice, GpuRequest, Node, Resources};

    use super::*;
    use crate::native::NativePlugin;

    fn set() -> PolicySet {
        PolicySet::builder()
            .filter(Arc::new(NativePlugin::<wasmsched_plugin_resource_fit::ResourceFit>::new("", 1).unwrap()))
            .score(
                Arc::new(
                    NativePlugin::<wasmsched_plugin_allocation_score::AllocationScore>::new(
                        r#"{"strategy":"most"}"#,
                        1,
                    )
                    .unwrap(),
                ),
                1,
            )
            .build()
    }

    fn cluster(nodes: &[(&str, u32, &str)]) -> NodeTable {
        let mut t = NodeTable::new();
        for (name, gpus, rack) in nodes {
            t.upsert(Node {
                name: (*name).into(),
                labels: vec![("rack".into(), (*rack).into())],
                allocatable: Resources {
                    cpu_milli: 96_000,
                    memory_bytes: 1 << 40,
                    gpu_milli: u64::from(*gpus) * 1000,
                    extended: Default::default(),
                },
                gpus: (0..*gpus).map(|i| GpuDevice { index: i, free_milli: 1000, ..Default::default() }).collect(),
                ..Default::default()
            });
        }
        t
    }

    /// 8-GPU nodes `(name, rack, spine)`.
    fn spined(nodes: &[(&str, &str, &str)]) -> NodeTable {
        let mut t = NodeTable::new();
        for (name, rack, spine) in nodes {
            t.upsert(Node {
                name: (*name).into(),
                labels: vec![("rack".into(), (*rack).into()), ("spine".into(), (*spine).into())],
                allocatable: Resources {
                    cpu_milli: 96_000,
                    memory_bytes: 1 << 40,
                    gpu_milli: 8000,
                    extended: Default::default(),
                },
                gpus: (0..8).map(|i| GpuDevice { index: i, free_milli: 1000, ..Default::default() }).collect(),
                ..Default::default()
            });
        }
        t
    }

    fn gang(n: usize, gpus: u32) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                id: format!("m{i}"),
                gpu: GpuRequest { count: gpus, milli_per_gpu: 1000, ..Default::default() },
                ..Default::default()
            })
            .collect()
    }

    fn free(t: &NodeTable) -> u64 {
        t.slots().map(|s| t.get(s).unwrap().free_gpu_milli()).sum()
    }

    fn spec<'a>(members: &'a [Task], min: usize, topo: Option<&'a TopologyConstraint>) -> GroupSpec<'a> {
        GroupSpec {
            name: "g",
            members,
            min_member: min,
            topology: topo,
            nodes_to_find: None,
            within: None,
            adjust: None,
        }
    }

    #[test]
    fn g1_g2_all_or_nothing() {
        let members = gang(4, 8);
        let mut small = cluster(&[("a", 8, "x"), ("b", 8, "x"), ("c", 8, "x")]);
        let e = place_group(&set(), &mut small, &spec(&members, 4, None), 0).unwrap_err();
        assert!(matches!(e, GangError::Unschedulable { placed: 3, min_member: 4, .. }), "{e}");
        assert_eq!(free(&small), 24_000, "rolled back: nothing stays bound");
        let mut big = cluster(&[("a", 8, "x"), ("b", 8, "x"), ("c", 8, "x"), ("d", 8, "x")]);
        let p = place_group(&set(), &mut big, &spec(&members, 4, None), 0).unwrap();
        assert_eq!(p.placed.len(), 4);
        assert_eq!(free(&big), 0);
    }

    #[test]
    fn g3_fragmented_capacity_is_not_enough() {
        let members = gang(4, 8);
        let nodes: Vec<(String, u32, &str)> = (0..8).map(|i| (format!("n{i}"), 4, "x")).collect();
        let refs: Vec<(&str, u32, &str)> = nodes.iter().map(|(n, g, r)| (n.as_str(), *g, *r)).collect();
        let mut t = cluster(&refs);
        let e = place_group(&set(), &mut t, &spec(&members, 4, None), 0).unwrap_err();
        assert!(e.to_string().contains("insufficient free GPUs"), "{e}");
        assert_eq!(free(&t), 32_000);
    }

    #[test]
    fn g4_per_node_accounting() {
        let mut t = cluster(&[("big", 16, "x")]);
        let two = gang(2, 8);
        assert_eq!(place_group(&set(), &mut t, &spec(&two, 2, None), 0).unwrap().placed.len(), 2);
        let mut t = cluster(&[("big", 16, "x")]);
        let three = gang(3, 8);
        assert!(place_group(&set(), &mut t, &spec(&three, 3, None), 0).is_err());
        assert_eq!(free(&t), 16_000);
    }

    #[test]
    fn g6_topology_domains() {
        let layout = [("x1", 8, "X"), ("x2", 8, "X"), ("y1", 8, "Y"), ("y2", 8, "Y")];
        let strict = TopologyConstraint::single("rack", true);
        let loose = TopologyConstraint::single("rack", false);
        let two = gang(2, 8);
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &spec(&two, 2, Some(&strict)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("X"), "equal domains: by name");
        let racks: Vec<&str> = p.placed.iter().map(|(_, pl)| t.get(pl.node).unwrap().label("rack").unwrap()).collect();
        assert_eq!(racks, vec!["X", "X"]);
        let three = gang(3, 8);
        let mut t = cluster(&layout);
        assert!(place_group(&set(), &mut t, &spec(&three, 3, Some(&strict)), 0).is_err());
        assert_eq!(free(&t), 32_000);
        let p = place_group(&set(), &mut t, &spec(&three, 3, Some(&loose)), 0).unwrap();
        assert_eq!((p.placed.len(), p.domain), (3, None));
        // Levels the nodes do not carry above the innermost (no spine, no zone) count as empty: the
        // racks are still domains.
        let levels = TopologyConstraint {
            tiers: vec!["rack".into(), "spine".into(), "zone".into()],
            strict: true,
            ..Default::default()
        };
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &spec(&two, 2, Some(&levels)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("X"));
    }

    #[test]
    fn innermost_tier_that_fits_then_the_nearest_larger_domain() {
        // Spine S1 holds racks A (2 nodes) and B (4); spine S2 holds rack C (3).
        let t = spined(&[
            ("a1", "A", "S1"),
            ("a2", "A", "S1"),
            ("b1", "B", "S1"),
            ("b2", "B", "S1"),
            ("b3", "B", "S1"),
            ("b4", "B", "S1"),
            ("c1", "C", "S2"),
            ("c2", "C", "S2"),
            ("c3", "C", "S2"),
        ]);
        let tiers =
            TopologyConstraint { tiers: vec!["rack".into(), "spine".into()], strict: true, ..Default::default() };
        let racks = |t: &NodeTable, p: &GangPlacement| -> Vec<String> {
            p.placed.iter().map(|(_, pl)| t.get(pl.node).unwrap().label("rack").unwrap().to_string()).collect()
        };
        // Two nodes: the tightest rack that fits, A, not the big rack B.
        let mut two_t = t.clone();
        let p = place_group(&set(), &mut two_t, &spec(&gang(2, 8), 2, Some(&tiers)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("A/S1"));
        assert_eq!(racks(&two_t, &p), ["A", "A"]);
        assert_eq!(tiers.describe(&p), "in rack A/S1");
        // Five nodes: no rack holds them; spine S1 does (A and B), rack C under S2 is not used.
        let mut five_t = t.clone();
        let p = place_group(&set(), &mut five_t, &spec(&gang(5, 8), 5, Some(&tiers)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("S1"));
        assert!(racks(&five_t, &p).iter().all(|r| r != "C"));
        // The fallback is recorded with its reason.
        assert_eq!(tiers.describe(&p), "in spine S1: no rack domain had room");
        // Seven nodes: no spine holds them; strict refuses, loose takes the cluster.
        let mut seven_t = t.clone();
        assert!(place_group(&set(), &mut seven_t, &spec(&gang(7, 8), 7, Some(&tiers)), 0).is_err());
        let loose = TopologyConstraint { strict: false, ..tiers.clone() };
        let p = place_group(&set(), &mut seven_t, &spec(&gang(7, 8), 7, Some(&loose)), 0).unwrap();
        assert_eq!(loose.describe(&p), "across domains: no rack or spine domain had room");
        assert_eq!((p.placed.len(), p.domain), (7, None));
    }

    #[test]
    fn tightest_domain_first() {
        let mut t = cluster(&[("x1", 8, "X"), ("x2", 8, "X"), ("y1", 8, "Y")]);
        let one = gang(1, 8);
        let strict = TopologyConstraint::single("rack", true);
        let p = place_group(&set(), &mut t, &spec(&one, 1, Some(&strict)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("Y"));
    }

    #[test]
    fn g9_min_member_allows_partial() {
        let members = gang(4, 8);
        let mut t = cluster(&[("a", 8, "x"), ("b", 8, "x")]);
        let p = place_group(&set(), &mut t, &spec(&members, 2, None), 0).unwrap();
        assert_eq!(p.placed.len(), 2);
        let mut t = cluster(&[("a", 8, "x")]);
        assert!(place_group(&set(), &mut t, &spec(&members, 2, None), 0).is_err());
        assert_eq!(free(&t), 8_000);
        let e = place_group(&set(), &mut t, &spec(&members, 5, None), 0).unwrap_err();
        assert!(matches!(e, GangError::Invalid { .. }));
    }

    #[test]
    fn sampled_gangs_are_still_all_or_nothing() {
        // 300 nodes of 8 GPUs; sampling looks at ~100 feasible nodes per member.
        let names: Vec<String> = (0..300).map(|i| format!("n{i:03}")).collect();
        let layout: Vec<(&str, u32, &str)> = names.iter().map(|n| (n.as_str(), 8, "x")).collect();
        let members = gang(250, 8);
        fn sampled(m: &[Task], min: usize) -> GroupSpec<'_> {
            GroupSpec { nodes_to_find: Some(100), ..spec(m, min, None) }
        }
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &sampled(&members, 250), 0).unwrap();
        assert_eq!(p.placed.len(), 250);
        let mut used: Vec<u32> = p.placed.iter().map(|(_, pl)| pl.node).collect();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used.len(), 250, "one 8-GPU member per node");
        // 60 more do not fit in the 50 nodes left: the whole group is rolled back.
        let more = gang(60, 8);
        let e = place_group(&set(), &mut t, &sampled(&more, 60), 0).unwrap_err();
        assert!(matches!(e, GangError::Unschedulable { placed: 50, min_member: 60, .. }), "{e}");
        assert_eq!(free(&t), 50 * 8_000);
    }

    #[test]
    fn slices_keep_each_run_of_members_in_one_domain_and_a_run_that_cannot_be_kept_fails_the_group() {
        let rack_of = |t: &NodeTable, p: &GangPlacement| -> Vec<String> {
            let mut by_member: Vec<(usize, String)> = p
                .placed
                .iter()
                .map(|(i, pl)| (*i, t.get(pl.node).unwrap().label("rack").unwrap().to_string()))
                .collect();
            by_member.sort();
            by_member.into_iter().map(|(_, r)| r).collect()
        };
        let slices = TopologyConstraint {
            slices: Some(Slices { size: 2, level: "rack".into() }),
            ..TopologyConstraint::default()
        };
        // Racks x (one 16-GPU node), y (two 8-GPU nodes), z (three 8-GPU nodes): four 8-GPU
        // members in slices of two. A packer fills x first, then needs two more; each slice lands
        // in one rack.
        let layout = [("x1", 16, "x"), ("y1", 8, "y"), ("y2", 8, "y"), ("z1", 8, "z"), ("z2", 8, "z"), ("z3", 8, "z")];
        let four = gang(4, 8);
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &spec(&four, 4, Some(&slices)), 0).unwrap();
        let racks = rack_of(&t, &p);
        assert_eq!(racks[0], racks[1], "members 0 and 1 share a rack: {racks:?}");
        assert_eq!(racks[2], racks[3], "members 2 and 3 share a rack: {racks:?}");
        assert_eq!(slices.describe(&p), "anywhere, in slices of 2 each in one rack domain");

        // One free 8-GPU node per rack: every member fits somewhere, but no rack holds a slice.
        let mut t = cluster(&[("a", 8, "x"), ("b", 8, "y"), ("c", 8, "z"), ("d", 8, "w")]);
        let e = place_group(&set(), &mut t, &spec(&four, 4, Some(&slices)), 0).unwrap_err();
        assert!(matches!(e, GangError::Unschedulable { placed: 0, .. }), "{e}");
        assert_eq!(free(&t), 32_000, "nothing stays bound");
        assert!(place_group(&set(), &mut t, &spec(&four, 4, None), 0).is_ok(), "without slices it fits");

        // Slices inside a required outer level: each slice in one rack, all in one spine.
        let mut t = spined(&[
            ("p", "r1", "s1"),
            ("q", "r1", "s1"),
            ("r", "r2", "s2"),
            ("s", "r2", "s2"),
            ("u", "r3", "s1"),
            ("v", "r3", "s1"),
        ]);
        let in_spine =
            TopologyConstraint { slices: slices.slices.clone(), ..TopologyConstraint::single("spine", true) };
        let p = place_group(&set(), &mut t, &spec(&four, 4, Some(&in_spine)), 0).unwrap();
        assert_eq!(p.domain.as_deref(), Some("s1"), "the only spine with four nodes");
        assert_eq!(in_spine.describe(&p), "in spine s1, in slices of 2 each in one rack domain");
    }

    #[test]
    fn a_group_that_must_span_domains_is_spread_evenly_over_the_fewest_that_hold_it() {
        // Racks x and y with four free 8-GPU nodes each, z with one: six members fit in no rack.
        let mut layout: Vec<(String, u32, &str)> = Vec::new();
        for (rack, n) in [("x", 4), ("y", 4), ("z", 1)] {
            for i in 0..n {
                layout.push((format!("{rack}{i}"), 8, rack));
            }
        }
        let layout: Vec<(&str, u32, &str)> = layout.iter().map(|(n, g, r)| (n.as_str(), *g, *r)).collect();
        let six = gang(6, 8);
        let per_rack = |t: &NodeTable, p: &GangPlacement| {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for (_, pl) in &p.placed {
                *counts.entry(t.get(pl.node).unwrap().label("rack").unwrap().to_string()).or_default() += 1;
            }
            counts.into_iter().collect::<Vec<_>>()
        };
        let preferred = TopologyConstraint::single("rack", false);
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &spec(&six, 6, Some(&preferred)), 0).unwrap();
        assert_eq!(per_rack(&t, &p), [("x".to_string(), 3), ("y".to_string(), 3)], "three and three, z untouched");
        // Without a topology the policy's order decides alone (a packer fills x first).
        let mut t = cluster(&layout);
        let p = place_group(&set(), &mut t, &spec(&six, 6, None), 0).unwrap();
        assert_ne!(per_rack(&t, &p), [("x".to_string(), 3), ("y".to_string(), 3)]);
        // Shares a domain cannot take go to the next: with only two nodes in y, 4 + 2.
        let smaller: Vec<(&str, u32, &str)> =
            layout.iter().copied().filter(|(n, _, _)| !["y2", "y3"].contains(n)).collect();
        let mut t = cluster(&smaller);
        let p = place_group(&set(), &mut t, &spec(&six, 6, Some(&preferred)), 0).unwrap();
        assert_eq!(per_rack(&t, &p), [("x".to_string(), 4), ("y".to_string(), 2)]);
    }
}
