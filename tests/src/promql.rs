//! What the chart's dashboards and alert rules read, to check against what a real process
//! exports: every PromQL expression of `charts/wasmsched/files/alerts.yaml` and
//! `charts/wasmsched/dashboards/*.json`, parsed by `promtool` and taken apart into the series and
//! labels it names; and a `/metrics` scrape taken apart into series and their labels.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

/// The chart's directory.
pub fn chart() -> PathBuf {
    crate::root().join("charts/wasmsched")
}

/// Labels Prometheus adds to every series it scrapes (the ServiceMonitor's and PodMonitor's
/// target labels, `node` from the PodMonitor's relabeling), which queries group by.
pub const TARGET_LABELS: [&str; 8] =
    ["namespace", "job", "instance", "pod", "service", "endpoint", "container", "node"];

/// `promtool`, or a panic that says how to get it.
pub fn promtool() -> Command {
    let found = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "promtool is not on PATH: scripts/test installs it (Debian: apt-get install prometheus)");
    Command::new("promtool")
}

/// Runs `command`, panicking with its output unless it succeeds; its output.
pub fn run_ok(mut command: Command) -> String {
    let out = command.output().expect("runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

/// `GET /metrics` over HTTP/1.0, as Prometheus scrapes it: the body.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: scheduler\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Each exported series name with the label names its samples carry.
pub fn exposition(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if line[name_end..].starts_with('{') {
            let mut rest = &line[name_end + 1..];
            while let Some(eq) = rest.find("=\"") {
                labels.insert(rest[..eq].trim_start_matches(',').to_string());
                // Skip the quoted value (escapes included).
                let value = &rest[eq + 2..];
                let mut end = 0;
                let mut escaped = false;
                for (i, c) in value.char_indices() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => {
                            end = i;
                            break;
                        }
                        _ => escaped = false,
                    }
                }
                rest = &value[end + 1..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
    }
    out
}

/// One PromQL expression of a dashboard or rule: where it is, the series it names with the labels
/// it matches on, and the labels it groups by.
#[derive(Debug)]
pub struct Use {
    /// Where it is.
    pub at: String,
    /// The series it names, with the labels it matches on.
    pub series: Vec<(String, BTreeSet<String>)>,
    /// The labels it groups by.
    pub grouped_by: BTreeSet<String>,
}

impl Use {
    /// Whether it reads the node agents' series (checked against an agent's scrape) rather than
    /// the scheduler's.
    pub fn reads_agents(&self) -> bool {
        self.series.iter().any(|(name, _)| name.starts_with("wasmsched_agent_"))
    }

    /// Whether `exported` (from [`exposition`]) has every series and label it uses.
    pub fn check(&self, exported: &BTreeMap<String, BTreeSet<String>>) -> Result<(), String> {
        let mut known: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
        for (name, matched) in &self.series {
            let Some(labels) = exported.get(name) else {
                return Err(format!("{}: {name} is not exported", self.at));
            };
            if let Some(l) = matched.iter().find(|l| !labels.contains(*l) && !known.contains(l.as_str())) {
                return Err(format!("{}: {name} has no label {l} (it has {labels:?})", self.at));
            }
            known.extend(labels.iter().map(String::as_str));
        }
        match self.grouped_by.iter().find(|l| !known.contains(l.as_str())) {
            Some(l) => Err(format!("{}: groups by {l}, which none of its series has", self.at)),
            None => Ok(()),
        }
    }
}

/// `(alert, expr)` of every rule of the chart.
pub fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(chart().join("files/alerts.yaml")).unwrap();
    let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut out = Vec::new();
    for group in file["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            out.push((rule["alert"].as_str().unwrap().to_string(), rule["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// The dashboards, by file name.
pub fn dashboards() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(chart().join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let d = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(path.file_name().unwrap().to_string_lossy().into_owned(), d);
        }
    }
    out
}

/// Every panel of `d`, rows' panels included.
pub fn panels(d: &Value) -> impl Iterator<Item = &Value> {
    d["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten()))
}

/// Grafana's variables made concrete, so the expression parses as plain PromQL.
fn concrete(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m").replace("$__range", "6h").replace("$__interval", "1m")
}

/// Every expression of the alert rules and the dashboards (panels and annotations; variables'
/// queries excepted), checked to parse by `promtool` and taken apart.
pub fn used_series() -> Vec<Use> {
    let mut exprs: Vec<(String, String)> =
        alert_rules().into_iter().map(|(name, expr)| (format!("alert {name}"), expr)).collect();
    for (file, d) in dashboards() {
        for panel in panels(&d) {
            for t in panel["targets"].as_array().into_iter().flatten() {
                let at = format!("{file} panel {} ({}) {}", panel["id"], panel["title"], t["refId"]);
                exprs.push((at, concrete(t["expr"].as_str().unwrap())));
            }
        }
        for a in d["annotations"]["list"].as_array().into_iter().flatten() {
            if let Some(e) = a["expr"].as_str() {
                exprs.push((format!("{file} annotation {}", a["name"]), concrete(e)));
            }
        }
    }
    // promtool parses each one (as a recording rule: the parser Prometheus itself uses).
    let rules = exprs
        .iter()
        .enumerate()
        .map(|(i, (_, e))| json!({"record": format!("wasmsched:check_{i}"), "expr": e}))
        .collect::<Vec<_>>();
    let file = tempfile_path("dashboard-exprs.yaml");
    std::fs::write(&file, serde_json::to_string(&json!({"groups": [{"name": "dashboards", "rules": rules}]})).unwrap())
        .unwrap();
    run_ok({
        let mut c = promtool();
        c.args(["check", "rules"]).arg(&file);
        c
    });
    let _ = std::fs::remove_file(&file);
    exprs.into_iter().map(|(at, e)| take_apart(at, &e)).collect()
}

fn tempfile_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("wasmsched-{}-{name}", std::process::id()))
}

/// PromQL's words that are not series names.
const KEYWORDS: [&str; 27] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "inf",
    "nan",
    "atan2",
    "limitk",
];

/// The series an expression names (with the labels it matches on) and the labels it groups by
/// (`by`, `without`, `on`, `ignoring`, `group_left/right`), read token by token: strings, ranges
/// and numbers skipped, names followed by `(` being functions.
pub fn take_apart(at: String, expr: &str) -> Use {
    let chars: Vec<char> = expr.chars().collect();
    let mut series: Vec<(String, BTreeSet<String>)> = Vec::new();
    let mut grouped_by = BTreeSet::new();
    let mut i = 0;
    let ident = |i: usize| -> usize {
        let mut j = i;
        while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || chars[j] == ':') {
            j += 1;
        }
        j
    };
    let skip_space = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    // Reads a `{...}` matcher list from `j` (at `{`): the label names; returns the index after it.
    let matchers = |mut j: usize, labels: &mut BTreeSet<String>| -> usize {
        j += 1;
        while j < chars.len() && chars[j] != '}' {
            let c = chars[j];
            if c == '"' || c == '\'' || c == '`' {
                j += 1;
                while j < chars.len() && chars[j] != c {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                j += 1;
            } else if c.is_ascii_alphabetic() || c == '_' {
                let end = ident(j);
                labels.insert(chars[j..end].iter().collect());
                j = end;
            } else {
                j += 1;
            }
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (5m, 1e3, 0.99).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let end = ident(i);
            let word: String = chars[i..end].iter().collect();
            let next = skip_space(end);
            if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str())
                && chars.get(next) == Some(&'(')
            {
                let close = (next..chars.len()).find(|&k| chars[k] == ')').unwrap_or(chars.len());
                let list: String = chars[next + 1..close].iter().collect();
                grouped_by.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(String::from));
                i = close + 1;
            } else if chars.get(next) == Some(&'(') || KEYWORDS.contains(&word.to_lowercase().as_str()) {
                i = end;
            } else {
                let mut labels = BTreeSet::new();
                i = if chars.get(next) == Some(&'{') { matchers(next, &mut labels) } else { end };
                series.push((word, labels));
            }
        } else if c == '{' {
            // A selector without a name (`{__name__=...}`): its labels are checked as grouping.
            let mut labels = BTreeSet::new();
            i = matchers(i, &mut labels);
            grouped_by.extend(labels);
        } else {
            i += 1;
        }
    }
    assert!(!series.is_empty() || at.contains("annotation"), "{at}: names no series: {expr}");
    Use { at, series, grouped_by }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_reader_finds_series_labels_and_grouping() {
        let u = take_apart(
            "t".into(),
            r#"histogram_quantile(0.99, sum by (le, queue) (rate(wasmsched_queueing_delay_seconds_bucket{namespace="a", queue=~"x|y"}[5m]))) > 3 and on (job) absent(wasmsched_leader)"#,
        );
        let names: Vec<&str> = u.series.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["wasmsched_queueing_delay_seconds_bucket", "wasmsched_leader"]);
        assert_eq!(u.series[0].1, ["namespace", "queue"].into_iter().map(String::from).collect());
        assert_eq!(u.grouped_by, ["job", "le", "queue"].into_iter().map(String::from).collect());
        // A label the series lacks, a series not exported, a grouping label nothing has: each refused.
        let exported: BTreeMap<String, BTreeSet<String>> = [
            (
                "wasmsched_queueing_delay_seconds_bucket".to_string(),
                ["le", "queue"].into_iter().map(String::from).collect(),
            ),
            ("wasmsched_leader".to_string(), BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        assert!(u.check(&exported).is_ok(), "{:?}", u.check(&exported));
        let typo = take_apart("t".into(), r#"sum(wasmsched_leader{qeueu="x"})"#);
        assert!(typo.check(&exported).unwrap_err().contains("no label qeueu"));
        let absent = take_apart("t".into(), "rate(wasmsched_binds_total[5m])");
        assert!(absent.check(&exported).unwrap_err().contains("not exported"));
        let grouping = take_apart("t".into(), "max by (model) (wasmsched_leader)");
        assert!(grouping.check(&exported).unwrap_err().contains("groups by model"));
        // Strings and durations are not series.
        let quiet = take_apart("t".into(), r#"label_replace(wasmsched_leader, "dst", "$1", "src", "(.*)") offset 5m"#);
        assert_eq!(quiet.series.len(), 1);
    }
}
