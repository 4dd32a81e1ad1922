//! Kubernetes node selectors (`NodeSelector`), as the API server and kube-scheduler evaluate them:
//! terms are ORed, the requirements of a term ANDed, and an empty term matches no node.

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// Whether `selector` selects `node`.
pub fn matches(selector: &NodeSelector, node: &Node) -> bool {
    selector.node_selector_terms.iter().any(|term| term_matches(term, node))
}

/// A selector that picks exactly the node named `name` (what an allocation of node-local devices
/// records).
pub fn for_node(name: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![name.to_string()]),
            }]),
            ..Default::default()
        }],
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    expressions.iter().all(|r| requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = if r.key == "metadata.name" { node.metadata.name.as_deref() } else { None };
            requirement_matches(r, value)
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x),
        "Lt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        n
    }

    fn selector(json: serde_json::Value) -> NodeSelector {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn terms_are_ored_requirements_anded_and_an_empty_term_matches_nothing() {
        let rack = selector(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]},
                                  {"key": "gpus", "operator": "Gt", "values": ["4"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
        ]}));
        assert!(matches(&rack, &node("a", &[("rack", "r1"), ("gpus", "8")])));
        assert!(!matches(&rack, &node("b", &[("rack", "r1"), ("gpus", "4")])), "Gt is strict");
        assert!(!matches(&rack, &node("c", &[("rack", "r3"), ("gpus", "8")])));
        assert!(matches(&rack, &node("special", &[])), "the second term");
        assert!(!matches(&selector(serde_json::json!({"nodeSelectorTerms": [{}]})), &node("a", &[])));
        assert!(matches(&for_node("a"), &node("a", &[])));
        assert!(!matches(&for_node("a"), &node("b", &[])));
        let absent = selector(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "tainted", "operator": "DoesNotExist"},
                                  {"key": "zone", "operator": "NotIn", "values": ["z9"]}]}]}));
        assert!(matches(&absent, &node("a", &[])));
        assert!(!matches(&absent, &node("a", &[("zone", "z9")])));
    }
}
