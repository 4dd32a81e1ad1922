//! The interconnect between nodes, as far as the replay models it: a gang whose replicas span more
//! than one domain of the fabric's level (an NVLink clique: GB200 NVL72 racks are one NVLink
//! domain of 18 nodes) communicates at network speed instead of NVLink speed, so it runs longer.
//!
//! A scenario's `fabric` names the level and the slowdown; the replay then runs a spanning gang
//! `spanning_slowdown` times its duration (decided each time the job starts, from where its
//! minimum of replicas runs), and reports how gangs and small jobs used the domains: the share
//! of gangs that started inside one domain, their queueing delay, and the GPUs stranded in
//! domains that only small jobs (one replica) broke — free, but out of reach of a gang that needs
//! a whole domain.

use ahash::AHashMap;
use serde::{Deserialize, Serialize};
use wasmsched_core::NodeTable;

use super::scenario::Job;

/// A scenario's fabric: the level whose domains a gang should not span, and what spanning costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    /// The node label naming the domains (e.g. `nvidia.com/gpu.clique`).
    pub level: String,
    /// How many times its duration a gang spanning domains runs (1 to 10; default 1: no cost,
    /// only the report).
    #[serde(default = "no_slowdown")]
    pub spanning_slowdown: f64,
}

fn no_slowdown() -> f64 {
    1.0
}

impl Fabric {
    /// What is wrong with it, if anything.
    pub(super) fn problem(&self) -> Option<String> {
        if self.level.trim().is_empty() {
            return Some("fabric: `level` is empty".into());
        }
        if !(1.0..=10.0).contains(&self.spanning_slowdown) {
            return Some(format!("fabric: spanning_slowdown {} is not between 1 and 10", self.spanning_slowdown));
        }
        None
    }
}

/// How gangs and small jobs used the fabric's domains in a replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FabricStats {
    /// The level.
    pub level: String,
    /// Jobs of more than one replica that started.
    pub gangs_started: usize,
    /// Of them, those whose replicas were all in one domain when they first started.
    pub gangs_in_one_domain: usize,
    /// Of them, those that first started across domains while the rest of the cluster was below
    /// 90 % allocated: the gangs a domain-keeping policy should have kept whole.
    pub gangs_split_below_90_percent: usize,
    /// Of them, those that first started across domains although one domain had room for the
    /// whole gang then: what keeping gangs in one domain must never do (0 by construction when
    /// the gangs ask for their domain; a blind placement's measure).
    pub gangs_split_with_a_domain_free: usize,
    /// Mean queueing delay of the gangs that started (s).
    pub gang_delay_mean_seconds: f64,
    /// Time-weighted mean of the free GPUs in domains that hold only single-replica work (and
    /// some): stranded for a gang that needs a whole domain.
    pub stranded_gpus_mean: f64,
}

/// The fabric while a replay runs.
pub(super) struct FabricModel {
    level: String,
    slowdown_milli: u64,
    /// Node name → domain index.
    domain_of: AHashMap<String, usize>,
    domains: usize,
    /// Per job: the domains its replicas spanned when it first started.
    first_span: Vec<Option<usize>>,
    /// GPU milli-units of the nodes.
    capacity_milli: u64,
    /// GPU milli-units of each node in a domain.
    node_capacity: AHashMap<String, u64>,
    split_below_90: usize,
    split_with_room: usize,
    /// Σ stranded GPUs × seconds, and the last sample.
    stranded_integral: f64,
    last: Option<(u64, f64)>,
    first_at: Option<u64>,
}

impl FabricModel {
    pub(super) fn new(fabric: &Fabric, nodes: &NodeTable, jobs: usize) -> FabricModel {
        let mut names: AHashMap<String, usize> = AHashMap::new();
        let mut domain_of = AHashMap::new();
        let mut capacity_milli = 0u64;
        let mut node_capacity = AHashMap::new();
        for node in nodes.slots().filter_map(|s| nodes.get(s)) {
            capacity_milli = capacity_milli.saturating_add(node.allocatable.gpu_milli);
            let Some(value) = node.label(&fabric.level) else { continue };
            let next = names.len();
            let id = *names.entry(value.to_string()).or_insert(next);
            node_capacity.insert(node.name.clone(), node.allocatable.gpu_milli);
            domain_of.insert(node.name.clone(), id);
        }
        FabricModel {
            level: fabric.level.clone(),
            slowdown_milli: (fabric.spanning_slowdown * 1000.0).round() as u64,
            domain_of,
            domains: names.len(),
            first_span: vec![None; jobs],
            capacity_milli,
            node_capacity,
            split_below_90: 0,
            split_with_room: 0,
            stranded_integral: 0.0,
            last: None,
            first_at: None,
        }
    }

    /// Job `j` starts with its replicas on `nodes`, the rest of the cluster holding
    /// `others_milli` GPU milli-units and `holders` the running replicas' (node, job): the factor
    /// (milli) its run is slowed by.
    pub(super) fn started(
        &mut self,
        j: usize,
        nodes: &[&str],
        others_milli: u64,
        holders: &[(&str, usize)],
        jobs: &[Job],
    ) -> u64 {
        let mut seen: Vec<Option<usize>> = nodes.iter().map(|n| self.domain_of.get(*n).copied()).collect();
        seen.sort_unstable();
        seen.dedup();
        let span = seen.len();
        if self.first_span[j].is_none() {
            self.first_span[j] = Some(span);
            let below_90 = u128::from(others_milli) * 100 < u128::from(self.capacity_milli) * 90;
            self.split_below_90 += usize::from(span > 1 && below_90);
            if span > 1 {
                self.split_with_room += usize::from(self.a_domain_had_room(j, nodes.len(), holders, jobs));
            }
        }
        if span > 1 { self.slowdown_milli } else { 1000 }
    }

    /// Whether one domain could have held `replicas` replicas of job `j` before it took its share:
    /// as many replicas fit on each of its nodes as the node's free GPU share holds (GPUs only:
    /// what the fabric is about; CPU and memory are not counted).
    fn a_domain_had_room(&self, j: usize, replicas: usize, holders: &[(&str, usize)], jobs: &[Job]) -> bool {
        let replica = jobs[j].replica_gpu_milli();
        if replica == 0 {
            return true;
        }
        let mut used: AHashMap<&str, u64> = AHashMap::new();
        for &(node, holder) in holders.iter().filter(|(_, h)| *h != j) {
            *used.entry(node).or_default() += jobs[holder].replica_gpu_milli();
        }
        let mut fits = vec![0usize; self.domains];
        for (node, &capacity) in &self.node_capacity {
            let free = capacity.saturating_sub(used.get(node.as_str()).copied().unwrap_or(0));
            fits[self.domain_of[node]] += (free / replica) as usize;
        }
        fits.iter().any(|&n| n >= replicas)
    }

    /// The cluster as an instant left it: `holders` are the running replicas' (node, job).
    pub(super) fn sample(&mut self, at: u64, nodes: &NodeTable, holders: &[(&str, usize)], jobs: &[Job]) {
        // Per domain: free GPU milli, holds a gang replica, holds a single-replica job.
        let mut state = vec![(0u64, false, false); self.domains];
        for node in nodes.slots().filter_map(|s| nodes.get(s)) {
            if let Some(&d) = self.domain_of.get(&node.name) {
                state[d].0 += node.free_gpu_milli();
            }
        }
        for &(node, j) in holders {
            if let Some(&d) = self.domain_of.get(node) {
                if jobs[j].replicas > 1 {
                    state[d].1 = true;
                } else {
                    state[d].2 = true;
                }
            }
        }
        let stranded: f64 = state.iter().filter(|s| s.2 && !s.1).map(|s| s.0 as f64 / 1000.0).sum();
        if let Some((t, v)) = self.last {
            self.stranded_integral += v * at.saturating_sub(t) as f64;
        }
        self.first_at.get_or_insert(at);
        self.last = Some((at, stranded));
    }

    pub(super) fn stats(&self, jobs: &[Job], out: &[super::JobOutcome], horizon: u64) -> FabricStats {
        let gangs: Vec<usize> = (0..jobs.len()).filter(|&j| jobs[j].replicas > 1 && out[j].start.is_some()).collect();
        let delays: Vec<u64> = gangs.iter().map(|&j| out[j].start.unwrap_or(0) - out[j].arrival).collect();
        let mut integral = self.stranded_integral;
        if let Some((t, v)) = self.last {
            integral += v * horizon.saturating_sub(t) as f64;
        }
        let span = horizon.saturating_sub(self.first_at.unwrap_or(horizon));
        FabricStats {
            level: self.level.clone(),
            gangs_started: gangs.len(),
            gangs_in_one_domain: gangs.iter().filter(|&&j| self.first_span[j] == Some(1)).count(),
            gangs_split_below_90_percent: self.split_below_90,
            gangs_split_with_a_domain_free: self.split_with_room,
            gang_delay_mean_seconds: super::mean(&delays),
            stranded_gpus_mean: if span > 0 { integral / span as f64 } else { 0.0 },
        }
    }
}
