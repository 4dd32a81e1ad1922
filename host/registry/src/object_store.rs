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
}

fn fetch_err(what: impl Into<String>, e: impl std::fmt::Display) -> SourceError {
    SourceError::Fetch { what: what.into(), message: e.to_string() }
}

impl ObjectStoreSource {
    /// Watch `spec_key` in `bucket`.
    pub fn new(nats: NatsConfig, bucket: &str, spec_key: &str) -> Result<ObjectStoreSource, SourceError> {
        let url = nats.url.clone();
        Ok(ObjectStoreSource { bucket: Bucket::new(nats, bucket), url, spec_key: spec_key.into(), last: None })
    }

    /// `key`, within what is left of the poll's time.
    fn read(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, SourceError> {
        let left = deadline.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
        self.bucket
            .get(key, MAX_OBJECT_BYTES, left)
            .map_err(|e| fetch_err(format!("bucket {} at {}", self.bucket.name(), self.url), e))
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
                    let bytes = self.read(&object, deadline)?;
                    artifacts.insert(name.clone(), Arc::<[u8]>::from(bytes));
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
