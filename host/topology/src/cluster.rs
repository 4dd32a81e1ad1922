//! Locality across nodes: tiers of domains read from node labels (zone → spine → rack by default,
//! like Volcano's HyperNodes), and where a multi-node gang goes.
//!
//! A gang is placed in the **innermost tier that has a domain with enough eligible nodes**; among
//! such domains the **best fit** (fewest eligible nodes) wins, keeping large domains whole for
//! large gangs; inside it, sub-domains are filled largest first, so a gang that must spill over
//! spills into the nearest sibling. Eligibility counts **free** GPUs, not installed ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Cost;
use crate::comm::{Collective, ring_ms};

/// One tier of locality.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Name used in reports (`rack`).
    pub name: String,
    /// Node label whose value names the domain (`wasmsched.io/rack`).
    pub label: String,
    /// Network between two nodes in one domain of this tier but no deeper common domain.
    pub within: Cost,
}

/// The tiers, outermost first, and the network between nodes sharing none of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiers {
    /// Outermost first.
    pub tiers: Vec<Tier>,
    /// Between nodes in different outermost domains.
    pub across: Cost,
}

impl Default for Tiers {
    /// zone → spine → rack; intra-rack 100 GB/s / 100 µs and cross-rack 50 GB/s / 500 µs are the
    /// sample cluster, the outer tiers halve again.
    fn default() -> Self {
        let tier = |name: &str, label: &str, bandwidth_gbps: f64, latency_us: f64| Tier {
            name: name.into(),
            label: label.into(),
            within: Cost { bandwidth_gbps, latency_us },
        };
        Tiers {
            tiers: vec![
                tier("zone", "topology.kubernetes.io/zone", 25.0, 1000.0),
                tier("spine", "wasmsched.io/spine", 50.0, 500.0),
                tier("rack", "wasmsched.io/rack", 100.0, 100.0),
            ],
            across: Cost { bandwidth_gbps: 12.5, latency_us: 2000.0 },
        }
    }
}

/// A node as locality sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// GPUs free on it now.
    pub free_gpus: u32,
}

/// How a gang wants its nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Locality {
    /// As close together as possible (communication-heavy jobs).
    #[default]
    Pack,
    /// One node per innermost domain in turn (compute-heavy jobs: spreads failure and heat).
    Spread,
}

/// Where a gang goes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeSet {
    /// Chosen nodes.
    pub nodes: Vec<String>,
    /// The tier of the smallest domain holding all of them: a tier name, `node` for one node,
    /// `cluster` when they share no tier.
    pub spans: String,
    /// The slowest network between two chosen nodes.
    pub bottleneck: Cost,
}

impl NodeSet {
    /// Estimated ring all-reduce time of `data_mb` across the nodes (bandwidth term only).
    pub fn allreduce_ms(&self, data_mb: f64) -> f64 {
        ring_ms(Collective::AllReduce, self.nodes.len() as u32, data_mb, self.bottleneck.bandwidth_gbps, 0.0)
    }
}

impl Tiers {
    /// The domain path of a node, outermost first. A tier no node is labelled with is one domain
    /// for all (a single-zone cluster need not label zones); a node missing a label that others
    /// carry is a domain of its own (nothing is known to be near it).
    fn path(&self, c: &Candidate<'_>, used: &[bool]) -> Vec<String> {
        self.tiers
            .iter()
            .zip(used)
            .map(|(t, &used)| match c.labels.get(&t.label) {
                Some(value) => value.clone(),
                None if used => format!("\u{0}{}", c.name),
                None => String::new(),
            })
            .collect()
    }

    /// Network between two nodes given the length of their common path.
    fn network(&self, common: usize) -> Cost {
        if common == 0 { self.across } else { self.tiers[common - 1].within }
    }

    /// Chooses `count` nodes with at least `gpus_per_node` free GPUs each.
    pub fn choose(
        &self,
        candidates: &[Candidate<'_>],
        count: usize,
        gpus_per_node: u32,
        locality: Locality,
    ) -> Result<NodeSet, String> {
        if count == 0 {
            return Err("a gang of zero nodes".into());
        }
        let used: Vec<bool> =
            self.tiers.iter().map(|t| candidates.iter().any(|c| c.labels.contains_key(&t.label))).collect();
        let mut eligible: Vec<(Vec<String>, &Candidate<'_>)> =
            candidates.iter().filter(|c| c.free_gpus >= gpus_per_node).map(|c| (self.path(c, &used), c)).collect();
        if eligible.len() < count {
            return Err(format!("not enough nodes with {gpus_per_node} free GPUs: {} of {count}", eligible.len()));
        }
        // Inside a domain, fullest nodes first (fewest free GPUs), keeping emptier ones whole.
        eligible.sort_by(|a, b| a.1.free_gpus.cmp(&b.1.free_gpus).then(a.1.name.cmp(b.1.name)));
        let chosen: Vec<usize> = match locality {
            Locality::Pack => {
                let depth = self.tiers.len();
                let (level, domain) = (0..=depth)
                    .rev()
                    .find_map(|d| best_fit(&eligible, d, count).map(|dom| (d, dom)))
                    .expect("the whole cluster fits");
                let inside: Vec<usize> =
                    (0..eligible.len()).filter(|&i| eligible[i].0[..level] == domain[..]).collect();
                fill(&eligible, &inside, level, count)
            }
            Locality::Spread => spread(&eligible, self.tiers.len(), count),
        };
        let mut common = self.tiers.len();
        for (x, &a) in chosen.iter().enumerate() {
            for &b in &chosen[x + 1..] {
                let shared = eligible[a].0.iter().zip(&eligible[b].0).take_while(|(p, q)| p == q).count();
                common = common.min(shared);
            }
        }
        let spans = if chosen.len() == 1 {
            "node".to_string()
        } else if common == 0 {
            "cluster".to_string()
        } else {
            self.tiers[common - 1].name.clone()
        };
        let bottleneck = if chosen.len() == 1 {
            Cost { bandwidth_gbps: f64::INFINITY, latency_us: 0.0 }
        } else {
            self.network(common)
        };
        Ok(NodeSet { nodes: chosen.iter().map(|&i| eligible[i].1.name.to_string()).collect(), spans, bottleneck })
    }
}

/// The domain at `depth` (a path prefix) with at least `count` eligible nodes and the fewest of
/// them; ties go to the lowest name.
fn best_fit(eligible: &[(Vec<String>, &Candidate<'_>)], depth: usize, count: usize) -> Option<Vec<String>> {
    let mut sizes: BTreeMap<&[String], usize> = BTreeMap::new();
    for (path, _) in eligible {
        *sizes.entry(&path[..depth]).or_default() += 1;
    }
    sizes
        .into_iter()
        .filter(|(_, size)| *size >= count)
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)))
        .map(|(domain, _)| domain.to_vec())
}

/// Takes `count` of `inside` (indexes into `eligible`, all sharing a path of length `depth`),
/// filling sub-domains largest first and recursing, so the set touches as few sub-domains as it can.
fn fill(eligible: &[(Vec<String>, &Candidate<'_>)], inside: &[usize], depth: usize, count: usize) -> Vec<usize> {
    if depth == eligible.first().map_or(0, |e| e.0.len()) || inside.len() <= count {
        return inside.iter().copied().take(count).collect();
    }
    let mut groups: BTreeMap<&String, Vec<usize>> = BTreeMap::new();
    for &i in inside {
        groups.entry(&eligible[i].0[depth]).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    // Largest first; `BTreeMap` order (by name) breaks ties, as the sort is stable.
    groups.sort_by_key(|g| std::cmp::Reverse(g.len()));
    let mut out = Vec::with_capacity(count);
    for group in groups {
        if out.len() == count {
            break;
        }
        let want = (count - out.len()).min(group.len());
        out.extend(fill(eligible, &group, depth + 1, want));
    }
    out
}

/// One node per innermost domain in turn, largest domains first.
fn spread(eligible: &[(Vec<String>, &Candidate<'_>)], depth: usize, count: usize) -> Vec<usize> {
    let mut groups: BTreeMap<&[String], Vec<usize>> = BTreeMap::new();
    for (i, (path, _)) in eligible.iter().enumerate() {
        groups.entry(&path[..depth]).or_default().push(i);
    }
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.len()));
    let mut out = Vec::with_capacity(count);
    let mut round = 0;
    while out.len() < count {
        for group in &groups {
            if out.len() < count && round < group.len() {
                out.push(group[round]);
            }
        }
        round += 1;
    }
    out
}
