//! Shared by the test binaries; each uses part of it.
#![allow(dead_code)]

pub mod fake_api;

use fake_api::FakeApi;

/// The grants of the Helm chart's roles in `template` (under `templates/`, its template expressions
/// replaced by a placeholder) whose name (`released…`) passes `role`: (API group, resource, verb).
pub fn chart_grants(template: &str, role: &dyn Fn(&str) -> bool) -> Vec<(String, String, String)> {
    let path = format!("{}/../../charts/wasmsched/templates/{template}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let mut plain = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("{{") && t.ends_with("}}") {
            continue; // control flow and includes on a line of their own
        }
        let mut out = String::new();
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            let end = rest[start..].find("}}").map(|e| start + e + 2).unwrap();
            out.push_str(&rest[..start]);
            out.push_str("released");
            rest = &rest[end..];
        }
        out.push_str(rest);
        plain.push_str(&out);
        plain.push('\n');
    }
    let mut grants = Vec::new();
    for doc in plain.split("\n---\n") {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).unwrap();
        let kind = v["kind"].as_str().unwrap_or_default();
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if !matches!(kind, "ClusterRole" | "Role") || !role(name) {
            continue;
        }
        for rule in v["rules"].as_sequence().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k].as_sequence().into_iter().flatten().filter_map(|x| x.as_str().map(String::from)).collect()
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for verb in list("verbs") {
                        grants.push((g.clone(), r.clone(), verb));
                    }
                }
            }
        }
    }
    grants
}

/// Every request sent to `api` is one the chart's roles in `template` that pass `role` allow.
pub fn assert_rbac_allows(api: &FakeApi, template: &str, role: &dyn Fn(&str) -> bool) {
    let grants = chart_grants(template, role);
    assert!(grants.len() >= 4, "the chart's rules parse: {grants:?}");
    let mut calls = api.state().requests.clone();
    calls.sort();
    calls.dedup();
    for (verb, group, resource) in &calls {
        assert!(
            grants.iter().any(|(g, r, v)| g == group && r == resource && v == verb),
            "the chart's RBAC ({template}) does not allow {verb} {resource} (group {group:?}); every call: {calls:?}"
        );
    }
}
