//! Shared by the test binaries; each uses part of it.
#![allow(dead_code)]

pub mod fake_api;

use fake_api::FakeApi;

/// The grants of the Helm chart's roles in `template` (under `templates/`, its template expressions
/// replaced by a placeholder) whose name (`released…`) passes `role`: (API group, resource, verb).
pub fn chart_grants(template: &str, role: &dyn Fn(&str) -> bool) -> Vec<(String, String, String)> {
    let plain = chart_plain(template);
    chart_rules(&plain, &|kind, name| matches!(kind, "ClusterRole" | "Role") && role(name))
        .into_iter()
        .map(|(_, g, r, v)| (g, r, v))
        .collect()
}

/// `template` (under `templates/`) as plain YAML: template expressions on a line of their own
/// dropped, the rest replaced by a placeholder.
fn chart_plain(template: &str) -> String {
    let path = format!("{}/../../charts/wasmsched/templates/{template}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let mut plain = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("{{") && t.ends_with("}}") {
            continue;
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
    plain
}

/// The FlowSchemas of the chart (`flowcontrol.yaml`): (priority level, API group, resource, verb)
/// for each resource rule, in matching precedence order (lowest first).
pub fn chart_flow_schemas() -> Vec<(String, String, String, String)> {
    let plain = chart_plain("flowcontrol.yaml");
    let mut docs: Vec<(i64, serde_yaml_ng::Value)> = plain
        .split("\n---\n")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(d).ok())
        .filter(|v| v["kind"] == "FlowSchema")
        .map(|v| (v["spec"]["matchingPrecedence"].as_i64().unwrap_or(1000), v))
        .collect();
    docs.sort_by_key(|(p, _)| *p);
    let mut out = Vec::new();
    for (_, v) in docs {
        let level = v["spec"]["priorityLevelConfiguration"]["name"].as_str().unwrap_or_default().to_string();
        for rule in v["spec"]["rules"].as_sequence().into_iter().flatten() {
            for r in rule["resourceRules"].as_sequence().into_iter().flatten() {
                out.extend(expand(r, &level));
            }
        }
    }
    out
}

/// Rules `(kind, API group, resource, verb)` of the documents in `plain` whose kind and name pass.
fn chart_rules(plain: &str, keep: &dyn Fn(&str, &str) -> bool) -> Vec<(String, String, String, String)> {
    let mut grants = Vec::new();
    for doc in plain.split("\n---\n") {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).unwrap();
        let kind = v["kind"].as_str().unwrap_or_default();
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        if !keep(kind, name) {
            continue;
        }
        for rule in v["rules"].as_sequence().into_iter().flatten() {
            grants.extend(expand(rule, kind));
        }
    }
    grants
}

/// A rule's `apiGroups` × `resources` × `verbs`, each as `(tag, group, resource, verb)`.
fn expand(rule: &serde_yaml_ng::Value, tag: &str) -> Vec<(String, String, String, String)> {
    let list = |k: &str| -> Vec<String> {
        rule[k].as_sequence().into_iter().flatten().filter_map(|x| x.as_str().map(String::from)).collect()
    };
    let mut out = Vec::new();
    for g in list("apiGroups") {
        for r in list("resources") {
            for verb in list("verbs") {
                out.push((tag.to_string(), g.clone(), r.clone(), verb));
            }
        }
    }
    out
}

/// Every request sent to `api` is one the chart's roles in `template` that pass `role` allow.
pub fn assert_rbac_allows(api: &FakeApi, template: &str, role: &dyn Fn(&str) -> bool) {
    let grants = chart_grants(template, role);
    assert!(grants.len() >= 4, "the chart's rules parse: {grants:?}");
    let mut calls = api.state().requests.clone();
    calls.sort();
    calls.dedup();
    for (verb, group, resource) in &calls {
        if resource == fake_api::DISCOVERY {
            continue; // system:discovery's, every authenticated client's
        }
        assert!(
            grants.iter().any(|(g, r, v)| g == group && r == resource && v == verb),
            "the chart's RBAC ({template}) does not allow {verb} {resource} (group {group:?}); every call: {calls:?}"
        );
    }
}
