//! The policy set specification: what operators write (YAML), validated before anything is fetched.
//!
//! ```yaml
//! name: packing
//! plugins:
//!   fit:  { source: "builtin:resource-fit" }
//!   pack: { source: "file:most.wasm", digest: "sha256:…", config: { strategy: most }, failure: fail-open }
//! stages:
//!   filter: [fit]
//!   score: [{ plugin: pack, weight: 1 }]
//! ```
//!
//! A plugin is declared once and may serve several stages (one instance pool). Every artifact that
//! does not ship inside the scheduler binary is pinned by its sha256 digest.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmsched_core::FailurePolicy;

use crate::BuiltIns;
use crate::error::{PrepareError, SpecError};

/// A policy set as written: plugins, the stages they serve, and the gates a new version passes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySetSpec {
    /// Name (lowercase letters, digits, `-`), shown in events and status.
    pub name: String,
    /// Plugins by local name.
    pub plugins: BTreeMap<String, PluginSpec>,
    /// Which plugins serve which stage.
    pub stages: Stages,
    /// The smoke test every new version passes before it may go live.
    #[serde(default, skip_serializing_if = "is_default")]
    pub smoke: SmokeSpec,
    /// Run beside the live set before going live; none swaps right after the smoke test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSpec>,
    /// When the live set is rolled back after it went live.
    #[serde(default, skip_serializing_if = "is_default")]
    pub rollback: RollbackSpec,
}

/// Settings left at their defaults are left out when a set is written (`policy builtin`): what a
/// person would write.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// One plugin of a set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// Where the component comes from: `builtin:NAME`, `file:PATH` (relative to the spec's
    /// directory) or `object:NAME` (the NATS object store bucket of the source).
    pub source: String,
    /// `sha256:<64 hex digits>` of the component; required unless the source is `builtin:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Configuration handed to the plugin's `init`: a string is passed as is, anything else as
    /// JSON. Absent: a built-in's default configuration, or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_yaml_ng::Value>,
    /// What callers do when it faults.
    #[serde(default, skip_serializing_if = "is_default")]
    pub failure: Failure,
    /// Wall-clock budget of one call, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Linear-memory cap, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Fuel per call (deterministic runtimes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// As a filter, may its verdicts be reused for equal tasks on unchanged nodes (the contract
    /// says they may)? `false` asks it about every node every time.
    #[serde(default = "reuse_by_default", skip_serializing_if = "is_reused")]
    pub reuse_verdicts: bool,
}

fn reuse_by_default() -> bool {
    true
}

fn is_reused(reuse: &bool) -> bool {
    *reuse
}

impl PluginSpec {
    /// The plugin at `source` (`builtin:NAME`, `file:PATH`, `object:NAME`) with every setting at
    /// its default.
    pub fn new(source: impl Into<String>) -> PluginSpec {
        PluginSpec {
            source: source.into(),
            digest: None,
            config: None,
            failure: Failure::default(),
            deadline_ms: None,
            memory_mib: None,
            fuel: None,
            reuse_verdicts: reuse_by_default(),
        }
    }
}

/// [`FailurePolicy`] as written in YAML.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Failure {
    /// The task is unschedulable this cycle.
    #[default]
    FailClosed,
    /// The plugin's verdict is skipped.
    FailOpen,
}

impl From<Failure> for FailurePolicy {
    fn from(f: Failure) -> Self {
        match f {
            Failure::FailClosed => FailurePolicy::FailClosed,
            Failure::FailOpen => FailurePolicy::FailOpen,
        }
    }
}

/// The stages of a set. Filters run in order; scores are weighted; one plugin may choose devices.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stages {
    /// Filter plugins, in the order they run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<String>,
    /// Score plugins with weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub score: Vec<Weighted>,
    /// Device-selection plugin; none uses the host's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_devices: Option<String>,
    /// Victim-selection plugin; none: work that does not fit waits, nothing is preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt: Option<String>,
    /// Fair-share plugin (deserved shares and the order queues are served in); none: queues are
    /// served in tree order and nothing is reclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<String>,
}

/// A score plugin and its weight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weighted {
    /// Local plugin name.
    pub plugin: String,
    /// Weight, 1..=100.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// The smoke test: place a sample of recent tasks on a snapshot of the live cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SmokeSpec {
    /// Tasks to place (from the most recent decisions; synthetic ones when there are none yet).
    pub tasks: usize,
    /// Longest acceptable decision, milliseconds.
    pub max_decision_ms: f64,
}

impl Default for SmokeSpec {
    fn default() -> Self {
        SmokeSpec { tasks: 16, max_decision_ms: 100.0 }
    }
}

/// A shadow run: the candidate decides beside the live set, on the same state, without binding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowSpec {
    /// End after this many compared decisions…
    pub decisions: u64,
    /// …or after this many seconds, whichever comes first (if at least one decision was compared).
    pub seconds: f64,
    /// Compare one decision in this many (1 = all); shadow decisions cost hot-path time.
    pub sample_every: u64,
    /// Lowest share of identical placements that passes, 0..=1.
    pub min_identical: f64,
    /// Highest share of shadow decisions with plugin faults that passes, 0..=1.
    pub max_fault_rate: f64,
    /// Go live as soon as the shadow run passes; `false` waits for `policy promote`.
    pub auto_promote: bool,
}

impl Default for ShadowSpec {
    fn default() -> Self {
        ShadowSpec {
            decisions: 1_000,
            seconds: 60.0,
            sample_every: 1,
            min_identical: 0.0,
            max_fault_rate: 0.0,
            auto_promote: true,
        }
    }
}

/// Thresholds that roll a live set back during its probation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RollbackSpec {
    /// Decisions per evaluation window.
    pub window: u64,
    /// Decisions after going live during which the set is watched; after it, the set is the
    /// last good one.
    pub probation: u64,
    /// Highest share of decisions with plugin faults (traps, deadlines, bad output), 0..=1.
    pub max_fault_rate: f64,
    /// Highest p99 decision latency, milliseconds (none: not checked).
    pub max_p99_ms: Option<f64>,
    /// Highest p99 latency as a multiple of the previous set's (none: not checked).
    pub max_p99_ratio: Option<f64>,
    /// Highest rise of the unschedulable share over the previous set's, 0..=1 (none: not checked).
    pub max_unschedulable_increase: Option<f64>,
}

impl Default for RollbackSpec {
    fn default() -> Self {
        RollbackSpec {
            window: 500,
            probation: 5_000,
            max_fault_rate: 0.01,
            max_p99_ms: None,
            max_p99_ratio: Some(5.0),
            max_unschedulable_increase: Some(0.2),
        }
    }
}

/// Where a plugin's component comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArtifactRef {
    /// Compiled into the binary ([`crate::BuiltIns`]; whether the name exists is checked when
    /// the set is prepared, against the binary's table).
    BuiltIn(String),
    /// A file, relative to the spec's directory.
    File(String),
    /// An object of the source's NATS object store bucket.
    Object(String),
}

impl ArtifactRef {
    /// Parse `builtin:NAME`, `file:PATH` or `object:NAME`.
    pub fn parse(s: &str) -> Result<ArtifactRef, String> {
        let (scheme, rest) = s.split_once(':').ok_or_else(|| format!("source {s:?} has no scheme"))?;
        if rest.is_empty() {
            return Err(format!("source {s:?} names nothing"));
        }
        match scheme {
            "builtin" => Ok(ArtifactRef::BuiltIn(rest.into())),
            "file" => Ok(ArtifactRef::File(rest.into())),
            "object" => Ok(ArtifactRef::Object(rest.into())),
            other => Err(format!("source {s:?}: unknown scheme {other:?} (use builtin:, file: or object:)")),
        }
    }
}

/// Digest text for `bytes`: `sha256:<hex>`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in Sha256::digest(bytes) {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Positive and not NaN.
fn positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
}

impl PolicySetSpec {
    /// Parse and validate YAML (or JSON). `origin` names the text in errors.
    pub fn parse(origin: &str, text: &str) -> Result<PolicySetSpec, SpecError> {
        let spec: PolicySetSpec = serde_yaml_ng::from_str(text)
            .map_err(|e| SpecError { origin: origin.to_string(), message: e.to_string() })?;
        spec.validate().map_err(|message| SpecError { origin: origin.to_string(), message })?;
        Ok(spec)
    }

    /// Every rule the YAML schema cannot express; the first broken one is the error.
    pub fn validate(&self) -> Result<(), String> {
        if !is_name(&self.name) {
            return Err(format!("name {:?}: use 1-63 lowercase letters, digits and '-'", self.name));
        }
        if self.plugins.is_empty() {
            return Err("plugins: a policy set needs at least one plugin".into());
        }
        for (name, p) in &self.plugins {
            let at = |m: String| format!("plugins.{name}: {m}");
            if !is_name(name) {
                return Err(at("use lowercase letters, digits and '-' in plugin names".into()));
            }
            let source = ArtifactRef::parse(&p.source).map_err(at)?;
            match &p.digest {
                Some(d) if !is_digest(d) => {
                    return Err(at(format!("digest {d:?} is not sha256:<64 lowercase hex digits>")));
                }
                None if !matches!(source, ArtifactRef::BuiltIn(_)) => {
                    return Err(at(format!(
                        "digest missing: every artifact outside the binary is pinned (`wasmsched policy digest` prints it) for {}",
                        p.source
                    )));
                }
                _ => {}
            }
            if let Some(ms) = p.deadline_ms
                && !(1..=10_000).contains(&ms)
            {
                return Err(at(format!("deadline_ms {ms} is outside 1..=10000")));
            }
            if let Some(mib) = p.memory_mib
                && !(1..=4_096).contains(&mib)
            {
                return Err(at(format!("memory_mib {mib} is outside 1..=4096")));
            }
            if p.fuel == Some(0) {
                return Err(at("fuel 0 would fail every call".into()));
            }
            if let Some(c) = &p.config
                && !matches!(c, serde_yaml_ng::Value::String(_))
            {
                serde_json::to_string(c).map_err(|e| at(format!("config cannot be written as JSON: {e}")))?;
            }
        }
        let known = |stage: &str, name: &str| {
            if self.plugins.contains_key(name) {
                Ok(())
            } else {
                Err(format!("stages.{stage}: no plugin {name:?} (declared: {})", self.plugin_names().join(", ")))
            }
        };
        let s = &self.stages;
        if s.filter.is_empty() && s.score.is_empty() && s.select_devices.is_none() {
            return Err("stages: no stage has a plugin".into());
        }
        for f in &s.filter {
            known("filter", f)?;
        }
        for w in &s.score {
            known("score", &w.plugin)?;
            if !(1..=100).contains(&w.weight) {
                return Err(format!("stages.score: weight {} of {} is outside 1..=100", w.weight, w.plugin));
            }
        }
        if let Some(d) = &s.select_devices {
            known("select_devices", d)?;
        }
        if let Some(p) = &s.preempt {
            known("preempt", p)?;
        }
        if let Some(f) = &s.fair_share {
            known("fair_share", f)?;
        }
        for name in self.plugins.keys() {
            let used = s.filter.contains(name)
                || s.score.iter().any(|w| &w.plugin == name)
                || s.select_devices.as_ref() == Some(name)
                || s.preempt.as_ref() == Some(name)
                || s.fair_share.as_ref() == Some(name);
            if !used {
                return Err(format!("plugins.{name}: declared but used by no stage"));
            }
        }
        if self.smoke.tasks == 0 {
            return Err("smoke.tasks: test at least one task".into());
        }
        if !positive(self.smoke.max_decision_ms) {
            return Err("smoke.max_decision_ms must be positive".into());
        }
        if let Some(sh) = &self.shadow {
            if sh.decisions == 0 || !positive(sh.seconds) || sh.sample_every == 0 {
                return Err("shadow: decisions, seconds and sample_every must be positive".into());
            }
            for (what, v) in [("min_identical", sh.min_identical), ("max_fault_rate", sh.max_fault_rate)] {
                if !(0.0..=1.0).contains(&v) {
                    return Err(format!("shadow.{what} {v} is outside 0..=1"));
                }
            }
        }
        let r = &self.rollback;
        if r.window == 0 || r.probation < r.window {
            return Err("rollback: window must be positive and probation at least one window".into());
        }
        if !(0.0..=1.0).contains(&r.max_fault_rate) {
            return Err(format!("rollback.max_fault_rate {} is outside 0..=1", r.max_fault_rate));
        }
        if let Some(v) = r.max_unschedulable_increase
            && !(0.0..=1.0).contains(&v)
        {
            return Err(format!("rollback.max_unschedulable_increase {v} is outside 0..=1"));
        }
        for (what, v) in [("max_p99_ms", r.max_p99_ms), ("max_p99_ratio", r.max_p99_ratio)] {
            if let Some(v) = v
                && !positive(v)
            {
                return Err(format!("rollback.{what} must be positive"));
            }
        }
        Ok(())
    }

    fn plugin_names(&self) -> Vec<&str> {
        self.plugins.keys().map(String::as_str).collect()
    }

    /// The configuration text of plugin `name` (`None` for an unknown name). A built-in's default
    /// configuration counts once [`PolicySetSpec::resolve_builtins`] has filled it in.
    pub fn config_text(&self, name: &str) -> Option<String> {
        let p = self.plugins.get(name)?;
        Some(match &p.config {
            Some(serde_yaml_ng::Value::String(s)) => s.clone(),
            Some(v) => serde_json::to_string(v).unwrap_or_default(),
            None => String::new(),
        })
    }

    /// Check every `builtin:` source against `builtins` and write each one's default
    /// configuration where the set gives none, so the set says exactly what runs (and two
    /// built-ins of one component with different defaults never look alike).
    pub fn resolve_builtins(&mut self, builtins: &BuiltIns) -> Result<(), PrepareError> {
        for (name, p) in &mut self.plugins {
            let Ok(ArtifactRef::BuiltIn(b)) = ArtifactRef::parse(&p.source) else { continue };
            let builtin = builtins.get(&b).map_err(|message| PrepareError::Load { plugin: name.clone(), message })?;
            if p.config.is_none() && !builtin.default_config.is_empty() {
                p.config = Some(serde_yaml_ng::Value::String(builtin.default_config.into()));
            }
        }
        Ok(())
    }
}

impl PluginSpec {
    /// The per-call deadline, if set.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline_ms.map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name: packing
plugins:
  fit: { source: "builtin:resource-fit" }
  pack:
    source: "builtin:most-allocated"
    config: { strategy: most }
    failure: fail-open
    deadline_ms: 5
stages:
  filter: [fit]
  score: [{ plugin: pack, weight: 2 }]
"#;

    #[test]
    fn parses_a_set_and_writes_configs_as_json() {
        let spec = PolicySetSpec::parse("good.yaml", GOOD).unwrap();
        assert_eq!(spec.stages.score[0].weight, 2);
        assert_eq!(spec.config_text("pack").unwrap(), r#"{"strategy":"most"}"#);
        assert_eq!(spec.config_text("fit").unwrap(), "");
        assert_eq!(spec.plugins["pack"].failure, Failure::FailOpen);
        assert!(spec.plugins["fit"].reuse_verdicts, "verdicts are reused unless a filter opts out");
        let opted_out = GOOD
            .replace("source: \"builtin:resource-fit\" }", "source: \"builtin:resource-fit\", reuse_verdicts: false }");
        assert!(!PolicySetSpec::parse("o.yaml", &opted_out).unwrap().plugins["fit"].reuse_verdicts);
        assert_eq!(spec.rollback, RollbackSpec::default());
        assert_eq!((spec.stages.preempt.as_deref(), spec.stages.fair_share.as_deref()), (None, None));
        let queued =
            GOOD.replace("  filter: [fit]", "  filter: [fit]\n  preempt: victims\n  fair_share: share").replace(
                "stages:",
                "  victims: { source: \"builtin:priority-preempt\" }\n  share: { source: \"builtin:drf\" }\nstages:",
            );
        let spec = PolicySetSpec::parse("queued.yaml", &queued).unwrap();
        assert_eq!(
            (spec.stages.preempt.as_deref(), spec.stages.fair_share.as_deref()),
            (Some("victims"), Some("share"))
        );
    }

    #[test]
    fn built_ins_are_checked_and_their_defaults_written_against_the_binarys_table() {
        let table =
            BuiltIns::none().with("resource-fit", b"", "").with("most-allocated", b"", r#"{"strategy":"most"}"#);
        let mut spec =
            PolicySetSpec::parse("good.yaml", &GOOD.replace("    config: { strategy: most }\n", "")).unwrap();
        assert_eq!(spec.config_text("pack").unwrap(), "", "no default before resolving");
        spec.resolve_builtins(&table).unwrap();
        assert_eq!(spec.config_text("pack").unwrap(), r#"{"strategy":"most"}"#);
        assert_eq!(spec.config_text("fit").unwrap(), "");

        let mut unknown =
            PolicySetSpec::parse("g.yaml", &GOOD.replace("builtin:most-allocated", "builtin:nope")).unwrap();
        let err = unknown.resolve_builtins(&table).unwrap_err().to_string();
        assert_eq!(err, "plugin pack: no built-in plugin \"nope\" (built-ins: most-allocated, resource-fit)");
    }

    #[test]
    fn every_broken_rule_is_named() {
        let cases = [
            (GOOD.replace("name: packing", "name: Packing"), "name \"Packing\""),
            (GOOD.replace("[fit]", "[fitt]"), "stages.filter: no plugin \"fitt\""),
            (GOOD.replace("weight: 2", "weight: 0"), "weight 0"),
            (GOOD.replace("builtin:most-allocated", "file:x.wasm"), "digest missing"),
            (GOOD.replace("builtin:most-allocated", "ftp:x"), "unknown scheme \"ftp\""),
            (GOOD.replace("deadline_ms: 5", "deadline_ms: 0"), "deadline_ms 0"),
            (GOOD.replace("deadline_ms: 5", "deadlin_ms: 5"), "unknown field `deadlin_ms`"),
            (
                GOOD.replace("  score: [{ plugin: pack, weight: 2 }]\n", ""),
                "plugins.pack: declared but used by no stage",
            ),
            (format!("{GOOD}rollback: {{ window: 10, probation: 5 }}\n"), "probation at least one window"),
            (format!("{GOOD}shadow: {{ min_identical: 1.5 }}\n"), "shadow.min_identical 1.5"),
            (
                GOOD.replace("  filter: [fit]", "  filter: [fit]\n  preempt: victims"),
                "stages.preempt: no plugin \"victims\"",
            ),
            (
                GOOD.replace("  filter: [fit]", "  filter: [fit]\n  fair_share: share"),
                "stages.fair_share: no plugin \"share\"",
            ),
            ("name: [".to_string(), "good.yaml"),
        ];
        for (text, want) in cases {
            let err = PolicySetSpec::parse("good.yaml", &text).unwrap_err().to_string();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let bad_digest = GOOD.replace("builtin:most-allocated\"", "file:x.wasm\"\n    digest: sha256:abc");
        let err = PolicySetSpec::parse("d.yaml", &bad_digest).unwrap_err().to_string();
        assert!(err.contains("is not sha256:<64"), "{err}");
    }

    #[test]
    fn digests_are_sha256_hex() {
        let d = digest_of(b"abc");
        assert_eq!(d, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(is_digest(&d));
        assert!(!is_digest(&d.to_uppercase()));
    }
}
