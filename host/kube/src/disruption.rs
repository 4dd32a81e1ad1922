//! `PodDisruptionBudget`s as the scheduler sees them when it picks victims. The Eviction API
//! refuses an eviction that would take a budget below its minimum, so preemption must not plan on
//! more of a budget's pods than `status.disruptionsAllowed`: per budget, workloads are offered as
//! victims lowest priority first while the pods they would take fit the allowance, and the rest are
//! withdrawn until the budget allows again (its status changes as pods go and come back). A budget
//! with no status yet allows nothing. Preemption then looks elsewhere instead of asking, being
//! refused, retrying and giving up. (kube-scheduler prefers budget-violating victims last; refusing
//! them is the stricter reading, since their eviction would fail anyway.)

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

/// One budget: which pods it covers and how many of them may go now.
#[derive(Clone, Debug, PartialEq)]
struct Budget {
    selector: Option<LabelSelector>,
    allowed: u32,
}

/// One running pod that preemption could take: its workload, namespace, labels and priority.
pub struct Candidate<'a> {
    /// The workload it belongs to (victims are whole workloads).
    pub workload: &'a str,
    /// Its namespace (budgets are namespaced).
    pub namespace: &'a str,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its workload's priority: lower ones are offered first.
    pub priority: i32,
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
            allowed: pdb
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .map_or(0, |n| u32::try_from(n).unwrap_or(0)),
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
    pub fn is_empty(&self) -> bool {
        self.budgets.is_empty()
    }

    /// Namespaces some budget lives in: only their pods need checking.
    pub fn namespaces(&self) -> ahash::AHashSet<&str> {
        self.budgets.values().map(|(ns, _)| ns.as_str()).collect()
    }

    /// The workloads not to offer as victims now: for each budget, its candidates' workloads in
    /// order of priority (then name) are offered while the pods they hold under it fit the
    /// budget's allowance; a workload withheld by any budget is withheld.
    pub fn withheld<'a>(&self, candidates: impl IntoIterator<Item = Candidate<'a>>) -> ahash::AHashSet<String> {
        // Per budget: (priority, workload) → pods of that workload it covers.
        let mut covered: Vec<BTreeMap<(i32, &'a str), u32>> = vec![BTreeMap::new(); self.budgets.len()];
        for c in candidates {
            for (i, (ns, b)) in self.budgets.values().enumerate() {
                if ns == c.namespace && selects(b.selector.as_ref(), c.labels) {
                    *covered[i].entry((c.priority, c.workload)).or_default() += 1;
                }
            }
        }
        let mut withheld = ahash::AHashSet::new();
        for ((_, b), workloads) in self.budgets.values().zip(covered) {
            let mut left = b.allowed;
            for ((_, workload), pods) in workloads {
                match left.checked_sub(pods) {
                    Some(rest) => left = rest,
                    None => {
                        // Too many of its pods for what is left: withheld, and so is everything after
                        // it, so a later, smaller workload does not jump the priority order.
                        left = 0;
                        withheld.insert(workload.to_string());
                    }
                }
            }
        }
        withheld
    }
}

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

    fn pod<'a>(workload: &'a str, labels: &'a BTreeMap<String, String>, priority: i32) -> Candidate<'a> {
        Candidate { workload, namespace: "ml", labels, priority }
    }

    fn withheld(b: &Budgets, pods: Vec<Candidate<'_>>) -> Vec<String> {
        let mut w: Vec<String> = b.withheld(pods).into_iter().collect();
        w.sort();
        w
    }

    #[test]
    fn a_budget_offers_only_as_many_pods_as_it_allows_lowest_priority_first() {
        let mut b = Budgets::default();
        let train = labels(&[("app", "train"), ("tier", "gpu")]);
        let serve = labels(&[("app", "serve")]);
        assert!(b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(1))));
        assert!(!b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(1))), "unchanged");
        // One disruption left: the lowest-priority pod may go, not a second one.
        let pods = || vec![pod("b", &train, 5), pod("a", &train, 0), pod("s", &serve, 0)];
        assert_eq!(withheld(&b, pods()), ["b"]);
        // A gang with two covered pods does not fit an allowance of one; nor does anything after it.
        let gang = vec![pod("g", &train, 0), pod("g", &train, 0), pod("h", &train, 3)];
        assert_eq!(withheld(&b, gang), ["g", "h"]);
        // Budgets are namespaced.
        let other = Candidate { workload: "x", namespace: "other", labels: &train, priority: 0 };
        assert!(withheld(&b, vec![other]).is_empty());
        assert!(b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(0))));
        assert_eq!(withheld(&b, pods()), ["a", "b"]);
        assert!(b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), Some(2))));
        assert!(withheld(&b, pods()).is_empty());
        b.apply(&pdb("train", json!({"matchLabels": {"app": "train"}}), None));
        assert_eq!(withheld(&b, pods()), ["a", "b"], "no status yet: nothing may go");
        assert!(b.namespaces().contains("ml"));
        b.delete(&pdb("train", json!(null), None));
        assert!(b.is_empty() && withheld(&b, pods()).is_empty());
    }

    #[test]
    fn selectors_follow_the_policy_v1_rules() {
        let mut b = Budgets::default();
        let protects = |b: &Budgets, l: &BTreeMap<String, String>| !b.withheld(vec![pod("w", l, 0)]).is_empty();
        b.apply(&pdb("none", json!(null), Some(0)));
        assert!(!protects(&b, &labels(&[("a", "b")])), "no selector selects nothing");
        b.apply(&pdb("all", json!({}), Some(0)));
        assert!(protects(&b, &labels(&[])), "an empty selector selects every pod");
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
        assert!(protects(&b, &labels(&[("tier", "gpu"), ("app", "x")])));
        assert!(!protects(&b, &labels(&[("tier", "cpu"), ("app", "x")])));
        assert!(!protects(&b, &labels(&[("tier", "gpu"), ("app", "x"), ("canary", "1")])));
        assert!(!protects(&b, &labels(&[("tier", "gpu"), ("app", "x"), ("team", "infra")])));
        assert!(!protects(&b, &labels(&[("tier", "gpu")])));
    }
}
