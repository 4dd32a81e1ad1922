//! `PodDisruptionBudget`s as the scheduler sees them when it picks victims: a pod some budget
//! covers with no disruption left (`status.disruptionsAllowed` < 1) would only be refused by the
//! Eviction API, so its workload is not offered as a victim until the budget allows again.
//! Preemption looks elsewhere instead of asking, waiting, retrying and giving up. (kube-scheduler
//! prefers such victims last; refusing them outright is the stricter reading, since the eviction
//! would fail anyway.) A budget with one disruption left still lets one victim go; a plan that
//! takes two pods of it gets the second refused and retried, as before.

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

/// One budget: which pods it covers and whether it has a disruption left.
#[derive(Clone, Debug, PartialEq)]
struct Budget {
    selector: Option<LabelSelector>,
    exhausted: bool,
}

/// The budgets seen, by `namespace/name`.
#[derive(Default, Debug)]
pub struct Budgets {
    budgets: BTreeMap<String, (String, Budget)>,
}

impl Budgets {
    /// Records an added or changed budget; whether what it protects may have changed.
    pub fn apply(&mut self, pdb: &PodDisruptionBudget) -> bool {
        let namespace = pdb.namespace().unwrap_or_default();
        let budget = Budget {
            selector: pdb.spec.as_ref().and_then(|s| s.selector.clone()),
            // No status yet: the disruption controller has not counted, so nothing is allowed.
            exhausted: pdb.status.as_ref().is_none_or(|s| s.disruptions_allowed < 1),
        };
        let key = format!("{namespace}/{}", pdb.name_any());
        self.budgets.insert(key, (namespace, budget.clone())).is_none_or(|(_, old)| old != budget)
    }

    /// Forgets a deleted budget.
    pub fn delete(&mut self, pdb: &PodDisruptionBudget) -> bool {
        self.budgets.remove(&format!("{}/{}", pdb.namespace().unwrap_or_default(), pdb.name_any())).is_some()
    }

    /// Keeps only the listed budgets (`namespace/name`) after a re-list.
    pub fn retain(&mut self, listed: &ahash::AHashSet<String>) {
        self.budgets.retain(|k, _| listed.contains(k));
    }

    /// Whether a pod of `namespace` with `labels` is covered by a budget with no disruption left.
    pub fn protects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.budgets.values().any(|(ns, b)| ns == namespace && b.exhausted && selects(b.selector.as_ref(), labels))
    }

    /// Whether there are no budgets at all (nothing to check).
    pub fn is_empty(&self) -> bool {
        self.budgets.is_empty()
    }

    /// Namespaces with a budget that has no disruption left: only their pods can be protected.
    pub fn exhausted_namespaces(&self) -> ahash::AHashSet<&str> {
        self.budgets.values().filter(|(_, b)| b.exhausted).map(|(ns, _)| ns.as_str()).collect()
    }
}

/// A `policy/v1` selector: `{}` selects every pod of the namespace, none selects nothing.
fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(s) = selector else { return false };
    let by_labels = s.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && s.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                // An operator the API server would have refused: select nothing rather than guess.
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pdb(name: &str, selector: serde_json::Value, allowed: Option<i32>) -> PodDisruptionBudget {
        let mut v = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "ml"}, "spec": {"minAvailable": 1}});
        if !selector.is_null() {
            v["spec"]["selector"] = selector;
        }
        if let Some(a) = allowed {
            v["status"] = json!({"disruptionsAllowed": a, "currentHealthy": 1, "desiredHealthy": 1,
                                 "expectedPods": 1});
        }
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn exhausted_budgets_protect_the_pods_they_select() {
        let mut b = Budgets::default();
        assert!(b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(0))));
        assert!(!b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(0))), "unchanged");
        let train = labels(&[("app", "train"), ("tier", "gpu")]);
        assert!(b.protects("ml", &train));
        assert!(!b.protects("other", &train), "budgets are namespaced");
        assert!(!b.protects("ml", &labels(&[("app", "serve")])));
        // A disruption left: the victim may go.
        assert!(b.exhausted_namespaces().contains("ml"));
        assert!(b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(1))));
        assert!(!b.protects("ml", &train));
        assert!(b.exhausted_namespaces().is_empty());
        // Not counted yet by the disruption controller: nothing allowed.
        b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), None));
        assert!(b.protects("ml", &train));
        b.delete(&pdb("train", json!(null), None));
        assert!(b.is_empty() && !b.protects("ml", &train));
    }

    #[test]
    fn selectors_follow_the_policy_v1_rules() {
        let mut b = Budgets::default();
        b.apply(&pdb("none", json!(null), Some(0)));
        assert!(!b.protects("ml", &labels(&[("a", "b")])), "no selector selects nothing");
        b.apply(&pdb("all", json!({}), Some(0)));
        assert!(b.protects("ml", &labels(&[])), "an empty selector selects every pod");
        let mut b = Budgets::default();
        b.apply(&pdb(
            "expr",
            json!({"matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu", "tpu"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "team", "operator": "NotIn", "values": ["infra"]},
                {"key": "app", "operator": "Exists"}]}),
            Some(0),
        ));
        assert!(b.protects("ml", &labels(&[("tier", "gpu"), ("app", "x")])));
        assert!(!b.protects("ml", &labels(&[("tier", "cpu"), ("app", "x")])));
        assert!(!b.protects("ml", &labels(&[("tier", "gpu"), ("app", "x"), ("canary", "1")])));
        assert!(!b.protects("ml", &labels(&[("tier", "gpu"), ("app", "x"), ("team", "infra")])));
        assert!(!b.protects("ml", &labels(&[("tier", "gpu")])));
    }
}
