//! Policy sets of the operator's (the hot-reload YAML) in the simulator: what `wasmsched replay`
//! starts with (or the built-in policies) and rolls out at virtual times, and the extra policies of
//! `simulate` and `experiment`. Every set from a file passes
//! the gates a hot reload applies (digests, compilation, the contract, a smoke test on the replayed
//! cluster); a rollout that fails one is reported and never goes live — the replay goes on with the
//! set live before it, as a running scheduler would.

use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;
use wasmsched_core::PolicySet;
use wasmsched_events::schema::{Payload, PolicyRejected, PolicySetRef, PolicySwapped};
use wasmsched_registry::{DirSource, Fetched, Preparer, Sample};
use wasmsched_sim::timed::PolicyTimeline;

/// `SECONDS=PATH`: from virtual second `SECONDS` on, the policy set at `PATH`.
#[derive(Clone, Debug)]
pub struct Rollout {
    at: u64,
    path: PathBuf,
}

impl FromStr for Rollout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (at, path) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected SECONDS=PATH"))?;
        let at = at.trim().parse().map_err(|_| format!("{s:?}: {at:?} is not a whole number of seconds"))?;
        if path.is_empty() {
            return Err(format!("{s:?}: no policy set path after '='"));
        }
        Ok(Rollout { at, path: path.into() })
    }
}

/// `NAME=PATH`: the policy set at `PATH`, called `NAME` in results.
#[derive(Clone, Debug)]
pub struct NamedSet {
    /// What results call it.
    pub name: String,
    /// Its directory or spec file.
    pub path: PathBuf,
}

impl FromStr for NamedSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, path) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
        let name = name.trim();
        if name.is_empty() || name.contains([',', '/']) || path.is_empty() {
            return Err(format!("{s:?}: expected NAME=PATH with a NAME free of ',' and '/'"));
        }
        Ok(NamedSet { name: name.into(), path: path.into() })
    }
}

/// The spec and components of the set at `path`, checked against every gate once (on `sample`),
/// so a grid that prepares it per experiment fails before it starts, naming the gate.
pub fn fetch_checked(preparer: &Preparer, path: &std::path::Path, sample: &Sample) -> anyhow::Result<Fetched> {
    let fetched =
        DirSource::new(path).fetch().map_err(|e| anyhow::anyhow!("policy set {}: fetch gate: {e}", path.display()))?;
    preparer
        .prepare(&fetched, 1, sample)
        .map_err(|e| anyhow::anyhow!("policy set {}: {} gate: {e}", path.display(), e.gate()))?;
    Ok(fetched)
}

/// One set that runs during the replay.
pub struct LiveSet {
    /// The set, stamped with `reference.version`.
    pub set: PolicySet,
    /// Name and version, as events carry them.
    pub reference: PolicySetRef,
    /// Where it came from (`builtin`, or the spec's file).
    pub origin: String,
    /// Virtual second it goes live.
    pub from: u64,
    /// Its `policy.loaded` event (sets from files).
    loaded: Option<Payload>,
}

impl LiveSet {
    /// The SHA-256 digest of plugin `name`'s component, as its `policy.loaded` event names it
    /// (none for built-in sets).
    pub fn digest(&self, name: &str) -> Option<&str> {
        match &self.loaded {
            Some(Payload::PolicyLoaded(l)) => l.plugins.iter().find(|p| p.name == name).map(|p| p.digest.as_str()),
            _ => None,
        }
    }
}

/// A rollout that failed a gate.
#[derive(Clone, Debug, Serialize)]
pub struct RejectedRollout {
    /// Virtual second it was to go live.
    pub at_seconds: u64,
    /// Its spec's file or directory.
    pub origin: String,
    /// The set's name, when its spec could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The gate it failed: `fetch` (unreadable or invalid spec), `digest`, `load`, `stage`, `smoke`.
    pub gate: &'static str,
    /// Why.
    pub reason: String,
}

/// The sets of one replay, in the order they go live.
pub struct ReplayPolicies {
    /// The first from 0, then the rollouts that passed their gates, by time.
    pub live: Vec<LiveSet>,
    /// The rollouts that did not.
    pub rejected: Vec<RejectedRollout>,
}

impl ReplayPolicies {
    /// `initial` from the start (version 1; a set from a file must pass its gates, or the replay
    /// does not start), then each of `rollouts` that passes its gates on `sample`.
    pub fn prepare(
        initial: Initial,
        rollouts: &[Rollout],
        preparer: Option<&Preparer>,
        sample: &Sample,
    ) -> anyhow::Result<ReplayPolicies> {
        let first = match initial {
            Initial::BuiltIn { set, name } => LiveSet {
                reference: PolicySetRef { name, version: set.version() },
                set,
                origin: "builtin".into(),
                from: 0,
                loaded: None,
            },
            Initial::File(path) => {
                let preparer = preparer.ok_or_else(|| anyhow::anyhow!("policy sets run as Wasm components"))?;
                from_file(preparer, &path, 1, 0, sample)
                    .map_err(|r| anyhow::anyhow!("policy set {}: {} gate: {}", path.display(), r.gate, r.reason))?
            }
        };
        let mut policies = ReplayPolicies { live: vec![first], rejected: Vec::new() };
        let mut rollouts = rollouts.to_vec();
        rollouts.sort_by_key(|r| r.at);
        for r in rollouts {
            let preparer = preparer.ok_or_else(|| anyhow::anyhow!("rollouts run as Wasm components"))?;
            let version = policies.live.iter().map(|l| l.reference.version).max().unwrap_or(0) + 1;
            match from_file(preparer, &r.path, version, r.at, sample) {
                Ok(live) => policies.live.push(live),
                Err(rejected) => {
                    tracing::warn!(at = r.at, origin = %rejected.origin, gate = rejected.gate, reason = %rejected.reason,
                        "rollout rejected: the set live before it stays");
                    policies.rejected.push(rejected);
                }
            }
        }
        Ok(policies)
    }

    /// What the replay runs when.
    pub fn timeline(&self) -> PolicyTimeline<'_> {
        let mut t = PolicyTimeline::new(&self.live[0].set);
        for l in &self.live[1..] {
            t = t.then_at(l.from, &l.set);
        }
        t
    }

    /// The set of `version`.
    pub fn by_version(&self, version: u64) -> Option<&LiveSet> {
        self.live.iter().find(|l| l.reference.version == version)
    }

    /// The policy events of the replay with their virtual seconds, in time order: each set from a
    /// file loaded at 0 (prepared before the replay starts), each swap and each rejection at its
    /// time.
    pub fn events(&self) -> Vec<(u64, Payload)> {
        let mut out: Vec<(u64, Payload)> = self.live.iter().filter_map(|l| Some((0, l.loaded.clone()?))).collect();
        for pair in self.live.windows(2) {
            let to = pair[1].reference.clone();
            out.push((
                pair[1].from,
                Payload::PolicySwapped(PolicySwapped { from: Some(pair[0].reference.clone()), to }),
            ));
        }
        for r in &self.rejected {
            out.push((
                r.at_seconds,
                Payload::PolicyRejected(PolicyRejected {
                    policy_set: PolicySetRef { name: r.name.clone().unwrap_or_default(), version: 0 },
                    origin: r.origin.clone(),
                    gate: r.gate.into(),
                    reason: r.reason.clone(),
                }),
            ));
        }
        out.sort_by_key(|(at, _)| *at);
        out
    }
}

/// The set a replay starts with.
pub enum Initial {
    /// Built from the command line's policy names.
    BuiltIn {
        /// The set.
        set: PolicySet,
        /// What reports call it.
        name: String,
    },
    /// A policy set directory or file.
    File(PathBuf),
}

/// The set at `path` through every gate, stamped `version`, live from `from`.
fn from_file(
    preparer: &Preparer,
    path: &std::path::Path,
    version: u64,
    from: u64,
    sample: &Sample,
) -> Result<LiveSet, RejectedRollout> {
    let origin = path.display().to_string();
    let reject = |name: Option<&str>, gate: &'static str, reason: String| RejectedRollout {
        at_seconds: from,
        origin: origin.clone(),
        name: name.map(Into::into),
        gate,
        reason,
    };
    let fetched = DirSource::new(path).fetch().map_err(|e| reject(None, "fetch", e.to_string()))?;
    let prepared = preparer
        .prepare(&fetched, version, sample)
        .map_err(|e| reject(Some(&fetched.spec.name), e.gate(), e.to_string()))?;
    Ok(LiveSet {
        loaded: Some(Payload::PolicyLoaded(prepared.loaded())),
        reference: prepared.reference(),
        set: prepared.set,
        origin,
        from,
    })
}
