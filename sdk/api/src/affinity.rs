//! Node affinity with Kubernetes' meaning, shared by filters (required terms), scores (preferred
//! terms) and the host (validation), so every side reads a term the same way.

use crate::model::Node;

/// The only field a [`NodeSelectorTerm::match_fields`] requirement may name.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// Heaviest weight of a preferred term (Kubernetes' range is 1..=100).
pub const MAX_PREFERRED_WEIGHT: u32 = 100;

/// How a requirement compares a node's label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// The label is one of the values.
    #[default]
    In,
    /// The label is absent or none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the one value.
    Gt,
    /// The label is an integer less than the one value.
    Lt,
}

/// One requirement on a node label, or on the node's name in [`NodeSelectorTerm::match_fields`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SelectorRequirement {
    /// Label key (or [`NODE_NAME_FIELD`]).
    pub key: String,
    /// Comparison.
    pub operator: SelectorOperator,
    /// `In`/`NotIn`: one or more values, sorted ascending without duplicates when the host
    /// hands a task to a plugin (they are sets; the host sorts them, see
    /// [`NodeAffinity::sort_values`]), so a long list is searched by bisection; `Gt`/`Lt`: one
    /// integer; otherwise empty.
    pub values: Vec<String>,
}

/// `In`/`NotIn` lists up to this long are scanned; longer ones (pod anti-affinity resolved to
/// every node holding a pod of the set: hundreds of names) are bisected — checked against a
/// 1,000-node cluster it was most of the Wasm filter's time (BENCHMARKS.md, cluster-bench).
const SCANNED_VALUES: usize = 16;

impl SelectorOperator {
    /// A label selector's operator by its Kubernetes name: `In`, `NotIn`, `Exists` or
    /// `DoesNotExist` (`Gt` and `Lt` belong to node selectors only).
    pub fn of_label_selector(name: &str) -> Option<SelectorOperator> {
        match name {
            "In" => Some(SelectorOperator::In),
            "NotIn" => Some(SelectorOperator::NotIn),
            "Exists" => Some(SelectorOperator::Exists),
            "DoesNotExist" => Some(SelectorOperator::DoesNotExist),
            _ => None,
        }
    }
}

impl SelectorRequirement {
    /// The label `key` has `value` (a `matchLabels` entry).
    pub fn equals(key: &str, value: &str) -> SelectorRequirement {
        SelectorRequirement { key: key.into(), operator: SelectorOperator::In, values: vec![value.into()] }
    }

    /// Whether a node whose value for the key is `value` (`None`: absent) satisfies this.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.has_value(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.has_value(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
            // Kubernetes: the label and the one value both parse as i64, else no match.
            SelectorOperator::Gt | SelectorOperator::Lt => {
                let (Some(v), [bound]) = (value, self.values.as_slice()) else { return false };
                let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else { return false };
                if self.operator == SelectorOperator::Gt { v > bound } else { v < bound }
            }
        }
    }

    /// Whether `v` is one of the values (sorted when long: see [`SelectorRequirement::values`]).
    #[inline]
    fn has_value(&self, v: &str) -> bool {
        if self.values.len() <= SCANNED_VALUES {
            return self.values.iter().any(|w| w == v);
        }
        debug_assert!(self.values.is_sorted(), "{}: a long value list reached a plugin unsorted", self.key);
        self.values.binary_search_by(|w| w.as_str().cmp(v)).is_ok()
    }

    /// Sorts an `In`/`NotIn` list and drops repeated values (the same set).
    pub fn sort_values(&mut self) {
        if matches!(self.operator, SelectorOperator::In | SelectorOperator::NotIn) {
            self.values.sort_unstable();
            self.values.dedup();
        }
    }

    fn check(&self, field: bool) -> Result<(), String> {
        if self.key.is_empty() {
            return Err("a requirement has an empty key".into());
        }
        if field && self.key != NODE_NAME_FIELD {
            return Err(format!("match field {} is not supported (only {NODE_NAME_FIELD})", self.key));
        }
        let n = self.values.len();
        match self.operator {
            SelectorOperator::In | SelectorOperator::NotIn if n == 0 => {
                Err(format!("{} {:?} needs at least one value", self.key, self.operator))
            }
            SelectorOperator::In | SelectorOperator::NotIn => Ok(()),
            _ if field => Err(format!("match field {} supports In and NotIn only", self.key)),
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if n != 0 => {
                Err(format!("{} {:?} takes no values", self.key, self.operator))
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist => Ok(()),
            SelectorOperator::Gt | SelectorOperator::Lt => match self.values.as_slice() {
                [v] if v.parse::<i64>().is_ok() => Ok(()),
                _ => Err(format!("{} {:?} needs exactly one integer value", self.key, self.operator)),
            },
        }
    }
}

/// A conjunction of requirements. With none at all it matches no node, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeSelectorTerm {
    /// Requirements on labels.
    pub match_expressions: Vec<SelectorRequirement>,
    /// Requirements on fields: only [`NODE_NAME_FIELD`].
    pub match_fields: Vec<SelectorRequirement>,
}

impl NodeSelectorTerm {
    /// Whether `node` satisfies every requirement.
    pub fn matches(&self, node: &Node) -> bool {
        if self.match_expressions.is_empty() && self.match_fields.is_empty() {
            return false;
        }
        self.match_expressions.iter().all(|r| r.matches(node.label(&r.key)))
            && self.match_fields.iter().all(|r| r.matches(Some(&node.name)))
    }

    fn check(&self) -> Result<(), String> {
        self.match_expressions.iter().try_for_each(|r| r.check(false))?;
        self.match_fields.iter().try_for_each(|r| r.check(true))
    }
}

/// A preferred term and its weight.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PreferredTerm {
    /// 1..=[`MAX_PREFERRED_WEIGHT`].
    pub weight: u32,
    /// The term.
    pub preference: NodeSelectorTerm,
}

/// Node affinity of a task (Kubernetes' `IgnoredDuringExecution` kinds: checked at placement only,
/// never used to move running work).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeAffinity {
    /// The node must match at least one of these; empty means no requirement.
    pub required: Vec<NodeSelectorTerm>,
    /// Nodes matching these are preferred, by the sum of their weights.
    pub preferred: Vec<PreferredTerm>,
}

impl NodeAffinity {
    /// Whether `node` satisfies the required terms (true when there are none).
    #[inline]
    pub fn allows(&self, node: &Node) -> bool {
        self.required.is_empty() || self.required.iter().any(|t| t.matches(node))
    }

    /// Sum of the weights of the preferred terms `node` matches.
    pub fn preference(&self, node: &Node) -> u64 {
        self.preferred.iter().filter(|p| p.preference.matches(node)).map(|p| u64::from(p.weight)).sum()
    }

    /// Whether there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self.required.is_empty() && self.preferred.is_empty()
    }

    /// Sorts every `In`/`NotIn` list, as plugins receive them (the host does this once per task).
    pub fn sort_values(&mut self) {
        let terms = self.required.iter_mut().chain(self.preferred.iter_mut().map(|p| &mut p.preference));
        for term in terms {
            term.match_expressions
                .iter_mut()
                .chain(term.match_fields.iter_mut())
                .for_each(SelectorRequirement::sort_values);
        }
    }

    /// Malformed requirements (the ones the Kubernetes API server refuses): empty keys, `In`
    /// without values, `Gt` with a non-integer, fields other than the node name, weights outside
    /// 1..=100.
    pub fn validate(&self) -> Result<(), String> {
        self.required
            .iter()
            .try_for_each(NodeSelectorTerm::check)
            .map_err(|e| format!("required node affinity: {e}"))?;
        for p in &self.preferred {
            if !(1..=MAX_PREFERRED_WEIGHT).contains(&p.weight) {
                return Err(format!("preferred node affinity: weight {} is outside 1..=100", p.weight));
            }
            p.preference.check().map_err(|e| format!("preferred node affinity: {e}"))?;
        }
        Ok(())
    }
}

/// A required inter-pod (anti-)affinity term (Kubernetes' `PodAffinityTerm`): the pods it is
/// about, and the node label whose values are its topology domains.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodAffinityTerm {
    /// Requirements on pod labels, all of them; `None` matches no pod (an empty list: every pod).
    pub selector: Option<Vec<SelectorRequirement>>,
    /// Namespaces of the pods it is about; `None`: the owner's own, empty: every namespace.
    pub namespaces: Option<Vec<String>>,
    /// Node label naming the domain (`kubernetes.io/hostname`: one node).
    pub topology_key: String,
}

impl PodAffinityTerm {
    /// Whether a pod in `namespace` with `labels` is one this term (of a pod in `owner`) is about.
    pub fn selects(&self, owner: &str, namespace: &str, labels: &[(String, String)]) -> bool {
        let in_namespace = match &self.namespaces {
            None => namespace == owner,
            Some(list) => list.is_empty() || list.iter().any(|n| n == namespace),
        };
        let label = |key: &str| labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        in_namespace && self.selector.as_ref().is_some_and(|s| s.iter().all(|r| r.matches(label(&r.key))))
    }

    /// Malformed: an empty topology key, a selector with `Gt`/`Lt`, `In` without values.
    pub fn validate(&self) -> Result<(), String> {
        if self.topology_key.is_empty() {
            return Err("a term has an empty topologyKey".into());
        }
        for r in self.selector.iter().flatten() {
            if matches!(r.operator, SelectorOperator::Gt | SelectorOperator::Lt) {
                return Err(format!("label selector {} {:?} is not a label selector operator", r.key, r.operator));
            }
            r.check(false)?;
        }
        Ok(())
    }
}

/// Inter-pod affinity and anti-affinity of a task. Not part of the policy contract: the host
/// resolves it, against the pods where they run, into node affinity — required terms for filters
/// (a node is allowed when its domain holds a selected pod, or none, respectively), preferred ones
/// for the `node-affinity` score.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodAffinity {
    /// Each term's domain must hold a pod it selects (or, while none runs anywhere, the task
    /// must be one it selects: the first of a group goes anywhere).
    pub affinity: Vec<PodAffinityTerm>,
    /// No term's domain may hold a pod it selects; symmetric: a running pod's term keeps the
    /// pods it selects out of its domain too.
    pub anti_affinity: Vec<PodAffinityTerm>,
    /// Preferred: nodes whose domain holds a pod the term selects score its weight (1..=100).
    pub preferred: Vec<(u32, PodAffinityTerm)>,
    /// Preferred: nodes whose domain holds no pod the term selects score its weight (1..=100).
    pub anti_preferred: Vec<(u32, PodAffinityTerm)>,
}

impl PodAffinity {
    /// No terms at all.
    pub const NONE: PodAffinity = PodAffinity {
        affinity: Vec::new(),
        anti_affinity: Vec::new(),
        preferred: Vec::new(),
        anti_preferred: Vec::new(),
    };

    /// Whether there is nothing to resolve.
    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.preferred.is_empty()
            && self.anti_preferred.is_empty()
    }

    /// Malformed terms (the ones the Kubernetes API server refuses): an empty topology key, a
    /// selector with `Gt`/`Lt`, `In` without values.
    pub fn validate(&self) -> Result<(), String> {
        self.affinity
            .iter()
            .try_for_each(PodAffinityTerm::validate)
            .map_err(|e| format!("required pod affinity: {e}"))?;
        self.anti_affinity
            .iter()
            .try_for_each(PodAffinityTerm::validate)
            .map_err(|e| format!("required pod anti-affinity: {e}"))?;
        for (kind, terms) in [("pod affinity", &self.preferred), ("pod anti-affinity", &self.anti_preferred)] {
            for (weight, term) in terms {
                if !(1..=MAX_PREFERRED_WEIGHT).contains(weight) {
                    return Err(format!("preferred {kind}: weight {weight} is outside 1..=100"));
                }
                term.validate().map_err(|e| format!("preferred {kind}: {e}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_term_selects_by_labels_in_its_namespaces() {
        let labels: Vec<(String, String)> = vec![("app".into(), "db".into()), ("tier".into(), "1".into())];
        let term = |selector: Option<Vec<SelectorRequirement>>, namespaces: Option<Vec<String>>| PodAffinityTerm {
            selector,
            namespaces,
            topology_key: "kubernetes.io/hostname".into(),
        };
        let db = Some(vec![req("app", SelectorOperator::In, &["db", "cache"])]);
        assert!(term(db.clone(), None).selects("ml", "ml", &labels));
        assert!(!term(db.clone(), None).selects("ml", "web", &labels), "the owner's namespace by default");
        assert!(term(db.clone(), Some(vec![])).selects("ml", "web", &labels), "empty: every namespace");
        assert!(term(db.clone(), Some(vec!["web".into()])).selects("ml", "web", &labels));
        assert!(!term(None, Some(vec![])).selects("ml", "ml", &labels), "no selector selects nothing");
        assert!(term(Some(vec![]), None).selects("ml", "ml", &labels), "an empty selector selects all");
        let not_db =
            Some(vec![req("app", SelectorOperator::NotIn, &["db"]), req("tier", SelectorOperator::Exists, &[])]);
        assert!(!term(not_db, None).selects("ml", "ml", &labels));
        let bad = PodAffinity {
            anti_affinity: vec![term(Some(vec![req("tier", SelectorOperator::Gt, &["0"])]), None)],
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("not a label selector operator"));
        let bad = PodAffinity {
            affinity: vec![PodAffinityTerm { topology_key: String::new(), ..term(db, None) }],
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err(), "required pod affinity: a term has an empty topologyKey");
    }

    #[test]
    fn a_long_sorted_list_answers_as_a_scan_would() {
        use SelectorOperator::*;
        // Hostnames as the pod-affinity resolution sends them: every other node of 1,000.
        let held: Vec<String> = (0..1000).step_by(2).map(|i| format!("bench-node-{i}")).collect();
        for operator in [In, NotIn] {
            let mut r = SelectorRequirement { key: "kubernetes.io/hostname".into(), operator, values: held.clone() };
            r.values.reverse();
            r.values.push(held[7].clone());
            r.sort_values();
            assert_eq!(r.values.len(), held.len(), "sorted and without the repeated value");
            assert!(r.values.len() > SCANNED_VALUES);
            for i in 0..1000 {
                let name = format!("bench-node-{i}");
                let scanned = held.contains(&name) == (operator == In);
                assert_eq!(r.matches(Some(&name)), scanned, "{operator:?} {name}");
            }
            assert_eq!(r.matches(None), operator == NotIn);
        }
        let mut gt = req("gpus", Gt, &["8"]);
        gt.sort_values();
        assert_eq!(gt.values, ["8"]);
    }

    #[test]
    fn sorting_an_affinity_sorts_every_in_and_not_in_list_required_and_preferred() {
        use SelectorOperator::*;
        let mut a = NodeAffinity {
            required: vec![NodeSelectorTerm {
                match_expressions: vec![req("zone", In, &["b", "a", "b"])],
                match_fields: vec![req(NODE_NAME_FIELD, NotIn, &["n2", "n1"])],
            }],
            preferred: vec![PreferredTerm {
                weight: 1,
                preference: NodeSelectorTerm {
                    match_expressions: vec![req("rack", NotIn, &["r9", "r1"])],
                    match_fields: vec![],
                },
            }],
        };
        a.sort_values();
        assert_eq!(a.required[0].match_expressions[0].values, ["a", "b"]);
        assert_eq!(a.required[0].match_fields[0].values, ["n1", "n2"]);
        assert_eq!(a.preferred[0].preference.match_expressions[0].values, ["r1", "r9"]);
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> SelectorRequirement {
        SelectorRequirement { key: key.into(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Node::default()
        }
    }

    fn term(exprs: Vec<SelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm { match_expressions: exprs, match_fields: vec![] }
    }

    #[test]
    fn operators_follow_kubernetes() {
        use SelectorOperator::*;
        assert!(req("z", In, &["a", "b"]).matches(Some("b")));
        assert!(!req("z", In, &["a", "b"]).matches(Some("c")));
        assert!(!req("z", In, &["a"]).matches(None));
        assert!(req("z", NotIn, &["a"]).matches(None), "NotIn matches nodes without the label");
        assert!(!req("z", NotIn, &["a"]).matches(Some("a")));
        assert!(req("z", Exists, &[]).matches(Some("")));
        assert!(!req("z", Exists, &[]).matches(None));
        assert!(req("z", DoesNotExist, &[]).matches(None));
        assert!(req("gen", Gt, &["3"]).matches(Some("4")));
        assert!(!req("gen", Gt, &["3"]).matches(Some("3")));
        assert!(req("gen", Lt, &["3"]).matches(Some("-1")));
        assert!(!req("gen", Gt, &["3"]).matches(Some("four")), "a non-integer label never compares");
        assert!(!req("gen", Gt, &["3"]).matches(None));
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        use SelectorOperator::*;
        let a100 = node("n1", &[("gpu", "a100"), ("zone", "z1")]);
        let v100 = node("n2", &[("gpu", "v100"), ("zone", "z2")]);
        let affinity = NodeAffinity {
            required: vec![
                term(vec![req("gpu", In, &["a100"]), req("zone", In, &["z2"])]),
                term(vec![req("gpu", In, &["v100"])]),
            ],
            preferred: vec![],
        };
        assert!(!affinity.allows(&a100), "the first term needs both requirements");
        assert!(affinity.allows(&v100));
        assert!(NodeAffinity::default().allows(&a100), "no required term allows every node");
        let empty_term = NodeAffinity { required: vec![NodeSelectorTerm::default()], preferred: vec![] };
        assert!(!empty_term.allows(&a100), "an empty term matches nothing");
        let by_name = NodeAffinity {
            required: vec![NodeSelectorTerm {
                match_expressions: vec![],
                match_fields: vec![req(NODE_NAME_FIELD, NotIn, &["n1"])],
            }],
            preferred: vec![],
        };
        assert!(!by_name.allows(&a100) && by_name.allows(&v100));
    }

    #[test]
    fn preference_sums_matching_weights() {
        use SelectorOperator::*;
        let affinity = NodeAffinity {
            required: vec![],
            preferred: vec![
                PreferredTerm { weight: 30, preference: term(vec![req("zone", In, &["z1"])]) },
                PreferredTerm { weight: 5, preference: term(vec![req("gpu", Exists, &[])]) },
            ],
        };
        assert_eq!(affinity.preference(&node("n", &[("zone", "z1"), ("gpu", "a")])), 35);
        assert_eq!(affinity.preference(&node("n", &[("zone", "z2")])), 0);
    }

    #[test]
    fn malformed_requirements_are_refused() {
        use SelectorOperator::*;
        let bad = |r: SelectorRequirement| NodeAffinity { required: vec![term(vec![r])], preferred: vec![] }.validate();
        assert!(bad(req("z", In, &["a"])).is_ok());
        assert!(bad(req("", In, &["a"])).unwrap_err().contains("empty key"));
        assert!(bad(req("z", In, &[])).unwrap_err().contains("at least one value"));
        assert!(bad(req("z", Exists, &["a"])).unwrap_err().contains("takes no values"));
        assert!(bad(req("z", Gt, &["x"])).unwrap_err().contains("one integer"));
        assert!(bad(req("z", Lt, &["1", "2"])).unwrap_err().contains("one integer"));
        let field = |r| NodeAffinity {
            required: vec![NodeSelectorTerm { match_expressions: vec![], match_fields: vec![r] }],
            preferred: vec![],
        };
        assert!(field(req("metadata.uid", In, &["u"])).validate().unwrap_err().contains("not supported"));
        assert!(field(req(NODE_NAME_FIELD, Exists, &[])).validate().unwrap_err().contains("In and NotIn only"));
        let weight = NodeAffinity {
            required: vec![],
            preferred: vec![PreferredTerm { weight: 0, preference: term(vec![req("z", In, &["a"])]) }],
        };
        assert!(weight.validate().unwrap_err().contains("weight 0"));
    }
}
