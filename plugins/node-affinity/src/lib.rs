//! `node-affinity`: scores nodes by the task's *preferred* node-affinity terms, as kube-scheduler's
//! NodeAffinity score does. A node's raw score is the sum of the weights of the terms it matches;
//! the batch is then scaled so the best node scores 100 (all 0 when no node matches any term, or the
//! task prefers nothing). Required terms are a filter's business (`resource-fit` checks them).
//!
//! Configuration: none (empty or `{}`).

use wasmsched_sdk::prelude::*;

/// The preferred-node-affinity score.
#[derive(Debug, Default)]
pub struct NodeAffinityScore;

impl Plugin for NodeAffinityScore {
    const NAME: &'static str = "node-affinity";

    fn new(config: &str) -> Result<Self, String> {
        match config.trim() {
            "" | "{}" => Ok(NodeAffinityScore),
            other => Err(format!("node-affinity takes no configuration, got {other:?}")),
        }
    }
}

impl Score for NodeAffinityScore {
    fn score(&mut self, task: &Task, node: &Node) -> u32 {
        // Weights are 1..=100 per term; saturate rather than wrap on absurd term counts.
        u32::try_from(task.node_affinity.preference(node)).unwrap_or(u32::MAX)
    }

    fn normalize(&mut self, _task: &Task, scores: &mut [u32]) {
        let max = scores.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return;
        }
        for s in scores {
            // s <= max, so the result is within 0..=MAX_SCORE.
            *s = (u64::from(*s) * u64::from(MAX_SCORE) / u64::from(max)) as u32;
        }
    }
}

wasmsched_sdk::export_plugin!(NodeAffinityScore: score);

#[cfg(test)]
mod tests {
    use super::*;

    fn node(zone: &str) -> Node {
        Node { name: zone.into(), labels: vec![("zone".into(), zone.into())], ..Default::default() }
    }

    fn prefer(zone: &str, weight: u32) -> PreferredTerm {
        PreferredTerm {
            weight,
            preference: NodeSelectorTerm {
                match_expressions: vec![SelectorRequirement {
                    key: "zone".into(),
                    operator: SelectorOperator::In,
                    values: vec![zone.into()],
                }],
                match_fields: vec![],
            },
        }
    }

    #[test]
    fn the_best_match_scores_100_and_the_rest_in_proportion() {
        let mut s = NodeAffinityScore;
        let mut task = Task::default();
        task.node_affinity.preferred = vec![prefer("a", 80), prefer("b", 20)];
        let nodes = [node("a"), node("b"), node("c")];
        let scores = wasmsched_sdk::batch::score_batch(&mut s, &task, nodes.iter());
        assert_eq!(scores, vec![100, 25, 0]);
        let scores = wasmsched_sdk::batch::score_batch(&mut s, &Task::default(), nodes.iter());
        assert_eq!(scores, vec![0, 0, 0], "no preference scores every node alike");
    }

    #[test]
    fn configuration_is_refused() {
        assert!(NodeAffinityScore::new("{}").is_ok());
        assert!(NodeAffinityScore::new("{\"weight\": 3}").unwrap_err().contains("no configuration"));
    }
}
