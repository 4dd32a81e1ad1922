//! `fair-share`: deserved shares of a queue tree and the order queues are served in.
//!
//! Deserved shares are always computed by hierarchical weighted water-filling (Volcano's
//! `proportion`, made work-conserving); the configured `policy` decides the serving order:
//!
//! - `proportion`: leaves by how much of their deserved share they use (`max` over resources of
//!   allocated / deserved), lowest first;
//! - `drf`: hierarchical Dominant Resource Fairness — at each level, children by weighted dominant
//!   share of their subtree's allocation against the cluster (`max_r alloc_r / cluster_r / weight`),
//!   lowest first, and a subtree's leaves before the next subtree's;
//! - `decayed-usage`: leaves by past usage (decayed by the host with a half-life, Slurm-style)
//!   divided by weight, lowest first.
//!
//! Ties, for every policy: lower unweighted dominant share of the current allocation, then queue
//! name (so with weights A = 2, B = 1 in the digest's D2 scenario B wins the tie: A3/B2).
//! Keys are compared at a resolution of 1e-9 (quantised, so the order is total).
//! Leaves with nothing pending (`request <= allocated` in every resource) are left out of the order.
//!
//! Configuration (JSON): `{"policy": "proportion" | "drf" | "decayed-usage"}`, default `proportion`.

mod order;
mod tree;
mod water;

use serde::Deserialize;
use wasmsched_sdk::prelude::*;

/// How queues are ordered.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// By use of the deserved share.
    #[default]
    Proportion,
    /// Hierarchical Dominant Resource Fairness.
    Drf,
    /// By decayed past usage per weight.
    DecayedUsage,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    policy: Policy,
}

/// The fair-share plugin.
#[derive(Debug, Default)]
pub struct FairSharePolicy {
    policy: Policy,
}

impl Plugin for FairSharePolicy {
    const NAME: &'static str = "fair-share";

    fn new(config: &str) -> Result<Self, String> {
        let config: Config = wasmsched_sdk::config::json(Self::NAME, config)?;
        Ok(FairSharePolicy { policy: config.policy })
    }
}

impl FairShare for FairSharePolicy {
    fn compute(&mut self, queues: &[QueueState], cluster: &Resources) -> Result<ShareDecision, String> {
        let tree = tree::Tree::new(queues)?;
        let columns = water::Columns::read(queues, cluster);
        let deserved = water::deserved(&tree, queues, &columns);
        let order = order::order(self.policy, &tree, queues, &columns, &deserved);
        Ok(ShareDecision { deserved: columns.resources(&deserved), order })
    }
}

wasmsched_sdk::export_plugin!(FairSharePolicy: fair_share);

#[cfg(test)]
mod tests;
