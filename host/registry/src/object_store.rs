//! A NATS JetStream object store bucket as a policy source, and pushing artifacts to it.
//!
//! The bucket holds plugin components (pushed with `wasmsched policy push FILE.wasm --name NAME`)
//! and the spec object (`policy.yaml` by default) whose `object:NAME` sources refer to them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmsched_events::NatsConfig;
use wasmsched_events::nats_io::Bucket;

use crate::error::SourceError;
use crate::source::{Fetched, Source, fingerprint};
use crate::spec::{ArtifactRef, PolicySetSpec};

/// Largest object read (a plugin component or a spec).
pub const MAX_OBJECT_BYTES: usize = 64 << 20;
/// How long one object may take before the poll is reported as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one whole poll (the spec and every artifact) may take.
const POLL_TIMEOUT: Duration = Duration::from_secs(20);

/// Connects lazily: a bucket or server that is not there yet is a poll error, not a start-up
/// failure, and the live set keeps running.
pub struct ObjectStoreSource {
    bucket: Bucket,
    url: String,
    spec_key: String,
    last: Option<String>,
    /// Components read, by object name: (its upload id, content). A poll reads again only the
    /// objects uploaded since — the spec each time (small), a 20 MB component once per push.
    held: BTreeMap<String, (String, Arc<[u8]>)>,
    /// Bytes read from the bucket so far.
    read_bytes: u64,
}

fn fetch_err(what: impl Into<String>, e: impl std::fmt::Display) -> SourceError {
    SourceError::Fetch { what: what.into(), message: e.to_string() }
}

impl ObjectStoreSource {
    /// Watch `spec_key` in `bucket`.
    pub fn new(nats: NatsConfig, bucket: &str, spec_key: &str) -> Result<ObjectStoreSource, SourceError> {
        let url = nats.url.clone();
        let bucket = Bucket::new(nats, bucket);
        Ok(ObjectStoreSource {
            bucket,
            url,
            spec_key: spec_key.into(),
            last: None,
            held: BTreeMap::new(),
            read_bytes: 0,
        })
    }

    /// Bytes read from the bucket so far (what polling costs the server and the network).
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes
    }

    /// `key`, within what is left of the poll's time.
    fn read(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, SourceError> {
        let left = deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
        let bytes = self
            .bucket
            .get(key, MAX_OBJECT_BYTES, left)
            .map_err(|e| fetch_err(format!("bucket {} at {}", self.bucket.name(), self.url), e))?;
        self.read_bytes += bytes.len() as u64;
        Ok(bytes)
    }

    /// Component `key`: the one held when it was not uploaded again since, else read now.
    fn component(&mut self, key: &str, deadline: Instant) -> Result<Arc<[u8]>, SourceError> {
        let left = deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
        let known = self.held.get(key).map(|(upload, _)| upload.as_str());
        let read = self
            .bucket
            .get_changed(key, MAX_OBJECT_BYTES, left, known)
            .map_err(|e| fetch_err(format!("bucket {} at {}", self.bucket.name(), self.url), e))?;
        if let Some(object) = read {
            self.read_bytes += object.bytes.len() as u64;
            self.held.insert(key.to_string(), (object.upload, Arc::from(object.bytes)));
        }
        Ok(self.held[key].1.clone())
    }

    /// Read the spec and its artifacts now.
    pub fn fetch(&mut self) -> Result<Fetched, SourceError> {
        let deadline = Instant::now() + POLL_TIMEOUT;
        let (key, origin) = (self.spec_key.clone(), self.describe());
        let text = self.read(&key, deadline)?;
        let text = String::from_utf8(text).map_err(|_| fetch_err(format!("object {key}"), "not UTF-8 text"))?;
        let spec = PolicySetSpec::parse(&origin, &text)?;
        let mut artifacts = BTreeMap::new();
        for (name, p) in &spec.plugins {
            match ArtifactRef::parse(&p.source) {
                Ok(ArtifactRef::Object(object)) => {
                    let bytes = self.component(&object, deadline)?;
                    artifacts.insert(name.clone(), bytes);
                }
                Ok(ArtifactRef::File(file)) => {
                    return Err(fetch_err(
                        format!("plugin {name}"),
                        format!("file:{file} needs a file source, this is an object store"),
                    ));
                }
                _ => {}
            }
        }
        // Components the spec no longer names are let go.
        let named: Vec<String> = spec
            .plugins
            .values()
            .filter_map(|p| match ArtifactRef::parse(&p.source) {
                Ok(ArtifactRef::Object(object)) => Some(object),
                _ => None,
            })
            .collect();
        self.held.retain(|key, _| named.contains(key));
        let fingerprint = fingerprint(&text, &artifacts);
        Ok(Fetched { spec, origin, artifacts, fingerprint })
    }
}

impl Source for ObjectStoreSource {
    fn describe(&self) -> String {
        format!("object:{}/{}", self.bucket.name(), self.spec_key)
    }

    fn poll(&mut self) -> Result<Option<Fetched>, SourceError> {
        let fetched = self.fetch()?;
        if self.last.as_deref() == Some(fetched.fingerprint.as_str()) {
            return Ok(None);
        }
        self.last = Some(fetched.fingerprint.clone());
        Ok(Some(fetched))
    }
}

/// Store `bytes` as `name` in `bucket` (created if missing); returns the object's size.
pub fn push(nats: &NatsConfig, bucket: &str, name: &str, bytes: &[u8]) -> Result<usize, SourceError> {
    Bucket::new(nats.clone(), bucket)
        .put(name, bytes, POLL_TIMEOUT)
        .map_err(|e| fetch_err(format!("storing {name} in bucket {bucket} at {}", nats.url), e))
}
