//! NATS beyond the event stream, for blocking callers: objects in a JetStream object store bucket
//! (the policy registry's components and specs) and request/reply (policy control).
//!
//! This crate is the one that talks to NATS, so everything else asks it. All of these calls run
//! on one I/O runtime per process ([`io`]), started on first use, rather than a runtime per
//! call or per object. The event publisher alone keeps a runtime per NATS session: dropping it is
//! how a failed session drops whatever the client had buffered (see `nats.rs`).

use std::sync::OnceLock;
use std::time::Duration;

use async_nats::jetstream::{self, object_store::ObjectStore};
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::runtime::Runtime;

use crate::{Error, NatsConfig};

/// The process's NATS I/O runtime: one worker thread; blocking callers wait on it with
/// `block_on` from their own thread.
pub(crate) fn io() -> Result<&'static Runtime, Error> {
    static IO: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = IO.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("wasmsched-nats")
        .enable_all()
        .build()
        .map_err(|e| Error::Io { what: "start the NATS I/O runtime".into(), source: e })?;
    // Two threads racing here: the loser's runtime is dropped, the winner's kept.
    Ok(IO.get_or_init(|| rt))
}

/// Run `fut` on the I/O runtime, giving up after `timeout` with [`Error::Timeout`] naming `what`.
pub(crate) fn block_on<T>(
    what: impl FnOnce() -> String,
    timeout: Duration,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    io()?.block_on(async { tokio::time::timeout(timeout, fut).await.map_err(|_| Error::Timeout(what()))? })
}

/// An object read from a [`Bucket`].
pub struct Object {
    /// The object store's id of this upload: each `put` of a name gets a new one.
    pub upload: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A JetStream object store bucket, opened lazily: a bucket or server that is not there yet is an
/// error of the call, not of construction.
pub struct Bucket {
    config: NatsConfig,
    name: String,
    store: Option<ObjectStore>,
}

impl Bucket {
    /// The bucket `name` on `config`'s server.
    pub fn new(config: NatsConfig, name: impl Into<String>) -> Bucket {
        Bucket { config, name: name.into(), store: None }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn open(&mut self, create: bool) -> Result<ObjectStore, Error> {
        if let Some(s) = &self.store {
            return Ok(s.clone());
        }
        let js = jetstream::new(self.config.connect().await?);
        let store = match js.get_object_store(&self.name).await {
            Ok(store) => store,
            Err(_) if create => js
                .create_object_store(jetstream::object_store::Config {
                    bucket: self.name.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| Error::JetStream(format!("creating bucket {}: {e}", self.name)))?,
            Err(e) => return Err(Error::JetStream(format!("bucket {} at {}: {e}", self.name, self.config.url))),
        };
        self.store = Some(store.clone());
        Ok(store)
    }

    /// The object `key`, refused when it is larger than `max_bytes`; the whole call (connecting
    /// included) takes at most `timeout`. After a failure the bucket is opened afresh next time
    /// (it may have been deleted and re-created).
    pub fn get(&mut self, key: &str, max_bytes: usize, timeout: Duration) -> Result<Vec<u8>, Error> {
        Ok(self.get_changed(key, max_bytes, timeout, None)?.map(|o| o.bytes).unwrap_or_default())
    }

    /// The object `key` unless its upload is `known` (then `None`: only its description was read),
    /// otherwise as [`Bucket::get`]. Lets a poller that holds a large object (a policy component
    /// with an interpreter inside is ~20 MB) ask every few seconds without reading it each time.
    pub fn get_changed(
        &mut self,
        key: &str,
        max_bytes: usize,
        timeout: Duration,
        known: Option<&str>,
    ) -> Result<Option<Object>, Error> {
        let what = || format!("object {key} in bucket {}", self.name);
        let (described, bucket) = (what(), self.name.clone());
        let result = block_on(|| format!("{described}: no answer within {timeout:?}"), timeout, async {
            let store = self.open(false).await?;
            let err = |e: &dyn std::fmt::Display| Error::JetStream(format!("object {key} in bucket {bucket}: {e}"));
            let info = store.info(key).await.map_err(|e| err(&e))?;
            if known == Some(info.nuid.as_str()) {
                return Ok(None);
            }
            if info.size > max_bytes {
                return Err(err(&format!("{} bytes is more than the {max_bytes} allowed", info.size)));
            }
            let mut object = store.get(key).await.map_err(|e| err(&e))?;
            let mut bytes = Vec::with_capacity(info.size);
            object.read_to_end(&mut bytes).await.map_err(|e| err(&e))?;
            // Read by name, so a put between the two calls may have replaced it: the upload read
            // is the one the object says it is.
            let upload = object.info().nuid.clone();
            Ok(Some(Object { upload, bytes }))
        });
        if result.is_err() {
            self.store = None;
        }
        result
    }

    /// Store `bytes` as `key`, creating the bucket when it is missing; returns the object's size.
    pub fn put(&mut self, key: &str, bytes: &[u8], timeout: Duration) -> Result<usize, Error> {
        let bucket = self.name.clone();
        block_on(|| format!("storing {key} in bucket {bucket}: no answer within {timeout:?}"), timeout, async {
            let store = self.open(true).await?;
            let mut reader = bytes;
            let info = store
                .put(key, &mut reader)
                .await
                .map_err(|e| Error::JetStream(format!("storing {key} in bucket {bucket}: {e}")))?;
            Ok(info.size)
        })
    }

    /// Delete the bucket and everything in it.
    pub fn delete(self, timeout: Duration) -> Result<(), Error> {
        let Bucket { config, name, .. } = self;
        block_on(|| format!("deleting bucket {name}: no answer within {timeout:?}"), timeout, async {
            let js = jetstream::new(config.connect().await?);
            js.delete_object_store(&name)
                .await
                .map_err(|e| Error::JetStream(format!("deleting bucket {name}: {e}")))?;
            Ok(())
        })
    }
}

/// Send `body` to `subject` and wait up to `timeout` for the reply (connecting included).
pub fn request(config: &NatsConfig, subject: &str, body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, Error> {
    block_on(|| format!("no reply on {subject} within {timeout:?}"), timeout, async {
        let client = config.connect().await?;
        let reply = client
            .request(subject.to_string(), body.into())
            .await
            .map_err(|e| Error::Connect { url: config.url.clone(), message: e.to_string() })?;
        Ok(reply.payload.to_vec())
    })
}

/// Answers requests on one subject until dropped.
pub struct Responder {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Responder {
    /// Subscribe to `subject` and answer each request with `answer(body)`; returns once the
    /// subscription is in place (or after `timeout`). `answer` runs on the I/O runtime's thread,
    /// so it must be quick.
    pub fn start(
        config: &NatsConfig,
        subject: &str,
        timeout: Duration,
        answer: impl Fn(&[u8]) -> Vec<u8> + Send + 'static,
    ) -> Result<Responder, Error> {
        let (client, mut sub) = block_on(|| format!("subscribing to {subject}: no answer"), timeout, async {
            let client = config.connect().await?;
            let err = |e: &dyn std::fmt::Display| Error::Connect { url: config.url.clone(), message: e.to_string() };
            let sub = client.subscribe(subject.to_string()).await.map_err(|e| err(&e))?;
            client.flush().await.map_err(|e| err(&e))?;
            Ok((client, sub))
        })?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        io()?.spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    msg = sub.next() => {
                        let Some(msg) = msg else { return };
                        let Some(reply_to) = msg.reply else { continue };
                        if let Err(e) = client.publish(reply_to, answer(&msg.payload).into()).await {
                            tracing::warn!(error = %e, "cannot answer a request");
                        }
                    }
                }
            }
        });
        Ok(Responder { stop: Some(stop) })
    }
}

impl Drop for Responder {
    /// Stops answering: the task ends and its subscription with it.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
