//! `policy status`, `policy promote` and `policy rollback` over NATS request/reply.
//!
//! The scheduler answers on `<prefix>-control.<cluster>.policy` — outside the events stream's
//! `<prefix>.<cluster>.>` subjects, so requests are never stored as events. Requests and replies
//! are JSON: `{"op":"status"}` → `{"ok":true,"result":…}` or `{"ok":false,"error":"…"}`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use wasmsched_events::NatsConfig;

use crate::error::SourceError;
use crate::registry::Registry;

/// A control operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Live, candidate, shadow statistics, history.
    Status,
    /// Make the candidate live now.
    Promote,
    /// Restore the last good version.
    Rollback,
}

#[derive(Serialize, Deserialize)]
struct Request {
    op: Op,
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the operation was done.
    pub ok: bool,
    /// Its result (status object, or the version now live).
    #[serde(default)]
    pub result: serde_json::Value,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The control subject of `nats`' cluster.
pub fn subject(nats: &NatsConfig) -> String {
    format!("{}-control.{}.policy", nats.subject_prefix, nats.cluster)
}

fn answer(registry: &Registry, body: &[u8]) -> Reply {
    let request: Request = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return Reply { ok: false, result: serde_json::Value::Null, error: Some(format!("bad request: {e}")) };
        }
    };
    let done = |r: Result<String, crate::registry::ControlError>| match r {
        Ok(label) => Reply { ok: true, result: serde_json::Value::String(label), error: None },
        Err(e) => Reply { ok: false, result: serde_json::Value::Null, error: Some(e.to_string()) },
    };
    match request.op {
        Op::Status => {
            Reply { ok: true, result: serde_json::to_value(registry.status()).unwrap_or_default(), error: None }
        }
        Op::Promote => done(registry.promote()),
        Op::Rollback => done(registry.rollback()),
    }
}

/// Answers control requests until dropped.
pub struct ControlServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Connect and subscribe; returns once the subscription is in place.
    pub fn start(nats: &NatsConfig, registry: Arc<Registry>) -> Result<ControlServer, SourceError> {
        let err = |e: &dyn std::fmt::Display| SourceError::Fetch {
            what: format!("control on {}", nats.url),
            message: e.to_string(),
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| err(&e))?;
        let (client, mut sub) = rt.block_on(async {
            let client = nats.connect().await.map_err(|e| err(&e))?;
            let sub = client.subscribe(subject(nats)).await.map_err(|e| err(&e))?;
            client.flush().await.map_err(|e| err(&e))?;
            Ok::<_, SourceError>((client, sub))
        })?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("wasmsched-policy-control".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = &mut stopped => return,
                            msg = sub.next() => {
                                let Some(msg) = msg else { return };
                                let Some(reply_to) = msg.reply else { continue };
                                let reply = answer(&registry, &msg.payload);
                                let body = serde_json::to_vec(&reply).unwrap_or_default();
                                if let Err(e) = client.publish(reply_to, body.into()).await {
                                    tracing::warn!(error = %e, "cannot answer a policy control request");
                                }
                            }
                        }
                    }
                })
            })
            .map_err(|e| err(&e))?;
        Ok(ControlServer { stop: Some(stop), handle: Some(handle) })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Send `op` to the scheduler of `nats`' cluster and wait up to `timeout` for its reply.
pub fn request(nats: &NatsConfig, op: Op, timeout: Duration) -> Result<Reply, SourceError> {
    let err = |e: &dyn std::fmt::Display| SourceError::Fetch {
        what: format!("policy {op:?} via {}", nats.url),
        message: e.to_string(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| err(&e))?;
    rt.block_on(async {
        let client = nats.connect().await.map_err(|e| err(&e))?;
        let body = serde_json::to_vec(&Request { op }).unwrap_or_default();
        let msg = tokio::time::timeout(timeout, client.request(subject(nats), body.into()))
            .await
            .map_err(|_| err(&"no scheduler answered (is one running with this --nats and cluster?)"))?
            .map_err(|e| err(&e))?;
        serde_json::from_slice(&msg.payload).map_err(|e| err(&format!("malformed reply: {e}")))
    })
}
