//! A NATS JetStream object store bucket as a policy source, and pushing artifacts to it.
//!
//! The bucket holds plugin components (pushed with `wasmsched policy push FILE.wasm --name NAME`)
//! and the spec object (`policy.yaml` by default) whose `object:NAME` sources refer to them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, object_store::ObjectStore};
use tokio::io::AsyncReadExt;
use wasmsched_events::NatsConfig;

use crate::error::SourceError;
use crate::source::{Fetched, Source, fingerprint};
use crate::spec::{ArtifactRef, PolicySetSpec};

/// Largest object read (a plugin component or a spec).
pub const MAX_OBJECT_BYTES: usize = 64 << 20;
/// How long one poll may wait on the server before it is reported as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects lazily: a bucket or server that is not there yet is a poll error, not a start-up
/// failure, and the live set keeps running.
pub struct ObjectStoreSource {
    nats: NatsConfig,
    bucket: String,
    spec_key: String,
    rt: tokio::runtime::Runtime,
    store: Option<ObjectStore>,
    last: Option<String>,
}

fn fetch_err(what: impl Into<String>, e: impl std::fmt::Display) -> SourceError {
    SourceError::Fetch { what: what.into(), message: e.to_string() }
}

impl ObjectStoreSource {
    /// Watch `spec_key` in `bucket`.
    pub fn new(nats: NatsConfig, bucket: &str, spec_key: &str) -> Result<ObjectStoreSource, SourceError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fetch_err("starting the object store client", e))?;
        Ok(ObjectStoreSource { nats, bucket: bucket.into(), spec_key: spec_key.into(), rt, store: None, last: None })
    }

    fn store(&mut self) -> Result<ObjectStore, SourceError> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let (nats, bucket) = (self.nats.clone(), self.bucket.clone());
        let store = self.rt.block_on(async move {
            tokio::time::timeout(REQUEST_TIMEOUT, open_bucket(&nats, &bucket, false))
                .await
                .map_err(|_| fetch_err(format!("bucket {bucket} at {}", nats.url), "timed out"))?
        })?;
        self.store = Some(store.clone());
        Ok(store)
    }

    async fn read(store: &ObjectStore, bucket: &str, key: &str) -> Result<(Vec<u8>, String), SourceError> {
        let what = || format!("object {key} in bucket {bucket}");
        let info = store.info(key).await.map_err(|e| fetch_err(what(), e))?;
        if info.size > MAX_OBJECT_BYTES {
            return Err(fetch_err(what(), format!("{} bytes is more than the {MAX_OBJECT_BYTES} allowed", info.size)));
        }
        let mut object = store.get(key).await.map_err(|e| fetch_err(what(), e))?;
        let mut bytes = Vec::with_capacity(info.size);
        object.read_to_end(&mut bytes).await.map_err(|e| fetch_err(what(), e))?;
        Ok((bytes, info.nuid))
    }

    /// Read the spec and its artifacts now.
    pub fn fetch(&mut self) -> Result<Fetched, SourceError> {
        let store = self.store()?;
        let (bucket, key, origin) = (self.bucket.clone(), self.spec_key.clone(), self.describe());
        let result = self.rt.block_on(async move {
            tokio::time::timeout(REQUEST_TIMEOUT * 4, async {
                let (text, _) = Self::read(&store, &bucket, &key).await?;
                let text = String::from_utf8(text).map_err(|_| fetch_err(format!("object {key}"), "not UTF-8 text"))?;
                let spec = PolicySetSpec::parse(&origin, &text)?;
                let mut artifacts = BTreeMap::new();
                for (name, p) in &spec.plugins {
                    match ArtifactRef::parse(&p.source) {
                        Ok(ArtifactRef::Object(object)) => {
                            let (bytes, _) = Self::read(&store, &bucket, &object).await?;
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
            })
            .await
            .map_err(|_| fetch_err(format!("bucket {bucket}"), "timed out"))?
        });
        if result.is_err() {
            // The bucket may have been deleted and re-created: reopen it next time.
            self.store = None;
        }
        result
    }
}

impl Source for ObjectStoreSource {
    fn describe(&self) -> String {
        format!("object:{}/{}", self.bucket, self.spec_key)
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

/// Open `bucket`, creating it when `create` is set.
async fn open_bucket(nats: &NatsConfig, bucket: &str, create: bool) -> Result<ObjectStore, SourceError> {
    let client = nats.connect().await.map_err(|e| fetch_err(format!("connecting to {}", nats.url), e))?;
    let js = jetstream::new(client);
    match js.get_object_store(bucket).await {
        Ok(store) => Ok(store),
        Err(_) if create => js
            .create_object_store(jetstream::object_store::Config { bucket: bucket.into(), ..Default::default() })
            .await
            .map_err(|e| fetch_err(format!("creating bucket {bucket}"), e)),
        Err(e) => Err(fetch_err(format!("bucket {bucket} at {}", nats.url), e)),
    }
}

/// Store `bytes` as `name` in `bucket` (created if missing); returns the object's size.
pub fn push(nats: &NatsConfig, bucket: &str, name: &str, bytes: &[u8]) -> Result<usize, SourceError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fetch_err("starting the object store client", e))?;
    rt.block_on(async {
        let store = open_bucket(nats, bucket, true).await?;
        let mut reader = bytes;
        let info = store
            .put(name, &mut reader)
            .await
            .map_err(|e| fetch_err(format!("storing {name} in bucket {bucket}"), e))?;
        Ok(info.size)
    })
}
