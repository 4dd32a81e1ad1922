//! Where policy set versions come from. A source is polled; it returns a version only when its
//! content changed, with every artifact fetched, so preparation never waits on I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::SourceError;
use crate::spec::{ArtifactRef, PolicySetSpec, digest_of};

/// A version as fetched: the specification and the bytes of every artifact outside the binary.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The validated specification.
    pub spec: PolicySetSpec,
    /// Where it came from, for status and events (e.g. `dir:/etc/wasmsched/policy`).
    pub origin: String,
    /// Component bytes by local plugin name (`file:` and `object:` sources).
    pub artifacts: BTreeMap<String, Arc<[u8]>>,
    /// Identifies the content: the same fingerprint is the same version.
    pub fingerprint: String,
}

/// A watched origin of policy set versions (a directory, a NATS object store bucket; Kubernetes
/// objects implement the same trait).
pub trait Source: Send {
    /// Human-readable identity, e.g. `dir:/etc/wasmsched/policy`.
    fn describe(&self) -> String;

    /// The current version if its content differs from the last one returned. A fetch that
    /// fails is retried at the next poll (a ConfigMap caught mid-update, an artifact pushed after
    /// the spec), so the last fingerprint only advances on success.
    fn poll(&mut self) -> Result<Option<Fetched>, SourceError>;
}

/// Fingerprint of a spec text and its artifacts (what [`Fetched::fingerprint`] holds), for
/// sources outside this crate.
pub fn fingerprint(spec_text: &str, artifacts: &BTreeMap<String, Arc<[u8]>>) -> String {
    let mut all = spec_text.as_bytes().to_vec();
    for (name, bytes) in artifacts {
        all.extend_from_slice(name.as_bytes());
        all.extend_from_slice(digest_of(bytes).as_bytes());
    }
    digest_of(&all)
}

/// A spec file, or a directory holding `policy.yaml` (a mounted ConfigMap), with `file:`
/// artifacts relative to it.
///
/// Kubernetes updates a mounted ConfigMap by swapping a symlink, so a poll may see the old spec
/// with new artifacts: the pinned digests catch that, and the next poll sees a consistent set.
#[derive(Debug)]
pub struct DirSource {
    spec_path: PathBuf,
    last: Option<String>,
    /// Size, modification time and inode of the spec and its files at the last fetch: polls
    /// compare these before reading (and hashing) anything.
    stamp: Vec<(PathBuf, Option<Stamp>)>,
}

/// Size, modification time, inode.
type Stamp = (u64, std::time::SystemTime, u64);

fn file_stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?, m.ino()))
}

/// How long a file must have been unchanged before its stamp stands in for its content.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The spec file name looked for in a directory source.
pub const SPEC_FILE: &str = "policy.yaml";

impl DirSource {
    /// Watch `path`: a spec file, or a directory containing [`SPEC_FILE`].
    pub fn new(path: impl Into<PathBuf>) -> DirSource {
        let path = path.into();
        let spec_path = if path.is_dir() { path.join(SPEC_FILE) } else { path };
        DirSource { spec_path, last: None, stamp: Vec::new() }
    }

    /// Read the spec and its artifacts now, whether or not they changed.
    pub fn fetch(&self) -> Result<Fetched, SourceError> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| SourceError::Fetch { what: format!("reading {}", p.display()), message: e.to_string() })
        };
        let text = String::from_utf8(read(&self.spec_path)?).map_err(|_| SourceError::Fetch {
            what: format!("reading {}", self.spec_path.display()),
            message: "not UTF-8 text".into(),
        })?;
        let spec = PolicySetSpec::parse(&self.spec_path.display().to_string(), &text)?;
        let base = self.spec_path.parent().unwrap_or(Path::new("."));
        let mut artifacts = BTreeMap::new();
        for (name, p) in &spec.plugins {
            match ArtifactRef::parse(&p.source) {
                Ok(ArtifactRef::File(file)) => {
                    // Refused before it is read when it is over the runtime's component limit.
                    let path = base.join(file);
                    let bytes = wasmsched_runtime::read_component(&path, wasmsched_runtime::component_limit())
                        .map_err(|e| SourceError::Fetch {
                            what: format!("reading {}", path.display()),
                            message: e.to_string(),
                        })?;
                    artifacts.insert(name.clone(), Arc::from(bytes));
                }
                Ok(ArtifactRef::Object(object)) => {
                    return Err(SourceError::Fetch {
                        what: format!("plugin {name}"),
                        message: format!("object:{object} needs an object store source, this is a file source"),
                    });
                }
                _ => {}
            }
        }
        let fingerprint = fingerprint(&text, &artifacts);
        Ok(Fetched { spec, origin: self.describe(), artifacts, fingerprint })
    }
}

impl Source for DirSource {
    fn describe(&self) -> String {
        format!("file:{}", self.spec_path.display())
    }

    fn poll(&mut self) -> Result<Option<Fetched>, SourceError> {
        if self.last.is_some() && !self.stamp.is_empty() && self.stamp.iter().all(|(p, s)| file_stamp(p) == *s) {
            return Ok(None);
        }
        let fetched = self.fetch()?;
        let base = self.spec_path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut paths = vec![self.spec_path.clone()];
        for p in fetched.spec.plugins.values() {
            if let Ok(ArtifactRef::File(file)) = ArtifactRef::parse(&p.source) {
                paths.push(base.join(file));
            }
        }
        // A file modified while it was read would keep its new stamp with the old content: trust
        // stamps only of files that have not changed for a while, re-read the others.
        let stamp: Vec<_> = paths.into_iter().map(|p| (p.clone(), file_stamp(&p))).collect();
        let settled = stamp
            .iter()
            .all(|(_, s)| s.is_some_and(|(_, modified, _)| modified.elapsed().is_ok_and(|age| age > SETTLE)));
        self.stamp = if settled { stamp } else { Vec::new() };
        if self.last.as_deref() == Some(fetched.fingerprint.as_str()) {
            return Ok(None);
        }
        self.last = Some(fetched.fingerprint.clone());
        Ok(Some(fetched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_source_returns_each_content_once_and_reports_a_vanished_file() {
        let dir = tempfile::tempdir().unwrap();
        let spec = "name: s\nplugins:\n  fit: { source: \"builtin:resource-fit\" }\nstages:\n  filter: [fit]\n";
        std::fs::write(dir.path().join(SPEC_FILE), spec).unwrap();
        let mut source = DirSource::new(dir.path());
        assert_eq!(source.poll().unwrap().unwrap().spec.name, "s");
        assert!(source.poll().unwrap().is_none(), "unchanged content is not a new version");

        std::fs::write(dir.path().join(SPEC_FILE), spec.replace("name: s", "name: t")).unwrap();
        assert_eq!(source.poll().unwrap().unwrap().spec.name, "t");

        std::fs::remove_file(dir.path().join(SPEC_FILE)).unwrap();
        let err = source.poll().unwrap_err().to_string();
        assert!(err.contains("policy.yaml") && err.contains("No such file"), "{err}");
    }

    #[test]
    fn file_artifacts_are_read_relative_to_the_spec() {
        let dir = tempfile::tempdir().unwrap();
        let wasm = wasmsched_plugins::MOST_ALLOCATED.wasm;
        std::fs::write(dir.path().join("most.wasm"), wasm).unwrap();
        let spec = format!(
            "name: s\nplugins:\n  pack: {{ source: \"file:most.wasm\", digest: \"{}\" }}\nstages:\n  score: [{{ plugin: pack }}]\n",
            digest_of(wasm)
        );
        std::fs::write(dir.path().join("set.yaml"), &spec).unwrap();
        let fetched = DirSource::new(dir.path().join("set.yaml")).fetch().unwrap();
        assert_eq!(&*fetched.artifacts["pack"], wasm);

        std::fs::remove_file(dir.path().join("most.wasm")).unwrap();
        let err = DirSource::new(dir.path().join("set.yaml")).fetch().unwrap_err().to_string();
        assert!(err.contains("most.wasm"), "{err}");
    }
}
