//! `domain-packing`: FGD's idea one level up. A gang that must (or would rather) run inside one
//! NVLink clique or rack needs a domain with enough free GPUs; a one-GPU or CPU-only job placed in
//! an untouched domain takes that domain away from every gang that needed all of it. So this score
//! sends work into domains already broken, the fullest first, and into an untouched domain last.
//!
//! Per level (the host's levels, innermost first; `domains` in the WIT), the candidate's domain
//! scores:
//! - 100 when the node is in no domain of the level, or the domain has no GPUs: nothing to break;
//! - 0 when nothing at all is allocated in the domain: placing here breaks a whole one;
//! - otherwise `10 + 90 × used / capacity`, with `used` the domain's allocated GPU share plus
//!   what the task asks (at most the capacity): best fit among broken domains, each above any
//!   whole one.
//!
//! The node's score is the mean over levels weighted 2:1 from each level to the next one out, so
//! the clique decides and the rack and block break ties. With no levels configured every node
//! scores 0 (the score stays out of the ranking). Within one domain every node scores alike: pair
//! it with a node-level score (`fgd`, `most-allocated`) in the set.
//!
//! Configuration (JSON): `{"levels": N}` counts only the `N` innermost levels (default: all).

use serde::Deserialize;
use wasmsched_sdk::domains::{Domain, Lookup};
use wasmsched_sdk::prelude::*;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Innermost levels that count; None: all.
    levels: Option<u32>,
}

/// The domain-fragmentation score.
#[derive(Debug, Default)]
pub struct DomainPacking {
    config: Config,
    /// Domain answers of the batch being scored: [`Score::normalize`] ends every batch and
    /// clears it, as the host's sums move between calls.
    lookup: Lookup,
}

impl Plugin for DomainPacking {
    const NAME: &'static str = "domain-packing";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        if config.levels == Some(0) {
            return Err("invalid domain-packing configuration: levels must be at least 1".into());
        }
        Ok(DomainPacking { config, lookup: Lookup::new() })
    }
}

/// One level's score for a task asking `demand` milli-GPUs, in a domain (or none).
fn level_score(domain: Option<&Domain>, demand: u64) -> u64 {
    let Some(d) = domain.filter(|d| d.gpu_milli > 0) else { return u64::from(MAX_SCORE) };
    if d.is_whole() {
        return 0;
    }
    let used = (d.gpu_milli - d.free_gpu_milli.min(d.gpu_milli)).saturating_add(demand).min(d.gpu_milli);
    10 + 90 * used / d.gpu_milli
}

impl Score for DomainPacking {
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        let mut levels = self.lookup.levels().len() as u32;
        if let Some(n) = self.config.levels {
            levels = levels.min(n);
        }
        let demand = task.gpu.total_milli();
        let (mut sum, mut weights) = (0u64, 0u64);
        for level in 0..levels {
            let weight = 1u64 << (levels - 1 - level).min(32);
            sum += weight * level_score(self.lookup.of(node, level), demand);
            weights += weight;
        }
        sum.checked_div(weights).map_or(0, |s| s as u32)
    }

    fn normalize(&mut self, _task: &Task, _scores: &mut [u32]) {
        self.lookup = Lookup::new();
    }
}

wasmsched_sdk::export_plugin!(DomainPacking: score);

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(nodes: u32, idle: u32, gpus: u64, free: u64) -> Domain {
        Domain { name: "d".into(), nodes, idle_nodes: idle, gpu_milli: gpus * 1000, free_gpu_milli: free * 1000 }
    }

    #[test]
    fn whole_domains_score_last_and_the_fullest_broken_one_first() {
        let whole = domain(18, 18, 72, 72);
        let barely = domain(18, 17, 72, 71);
        let nearly_full = domain(18, 1, 72, 4);
        assert_eq!(level_score(Some(&whole), 1000), 0);
        assert!(level_score(Some(&barely), 1000) > 0);
        assert!(level_score(Some(&nearly_full), 1000) > level_score(Some(&barely), 1000));
        // A CPU-only job in a domain with no GPU allocated but a busy CPU: broken, not whole.
        assert_eq!(level_score(Some(&domain(18, 17, 72, 72)), 0), 10);
        // No domain, or a domain without GPUs: nothing to break.
        assert_eq!(level_score(None, 1000), 100);
        assert_eq!(level_score(Some(&domain(4, 4, 0, 0)), 0), 100);
        // Asking more than is free never scores past 100.
        assert_eq!(level_score(Some(&domain(2, 1, 8, 1)), 4000), 100);
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(DomainPacking::new(r#"{"levels": 0}"#).is_err());
        assert!(DomainPacking::new(r#"{"level": 1}"#).is_err());
        assert!(DomainPacking::new(r#"{"levels": 2}"#).is_ok());
    }
}
