//! `policy status`, `policy promote` and `policy rollback` over NATS request/reply.
//!
//! The scheduler answers on `<prefix>-control.<cluster>.policy` — outside the events stream's
//! `<prefix>.<cluster>.>` subjects, so requests are never stored as events. Requests and replies
//! are JSON: `{"op":"status"}` → `{"ok":true,"result":…}` or `{"ok":false,"error":"…"}`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmsched_events::NatsConfig;
use wasmsched_events::nats_io::{self, Responder};

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

/// How long subscribing may take at start.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers control requests until dropped.
pub struct ControlServer {
    _responder: Responder,
}

impl ControlServer {
    /// Connect and subscribe; returns once the subscription is in place.
    pub fn start(nats: &NatsConfig, registry: Arc<Registry>) -> Result<ControlServer, SourceError> {
        let answer = move |body: &[u8]| serde_json::to_vec(&answer(&registry, body)).unwrap_or_default();
        let responder = Responder::start(nats, &subject(nats), START_TIMEOUT, answer)
            .map_err(|e| SourceError::Fetch { what: format!("control on {}", nats.url), message: e.to_string() })?;
        Ok(ControlServer { _responder: responder })
    }
}

/// Send `op` to the scheduler of `nats`' cluster and wait up to `timeout` for its reply.
pub fn request(nats: &NatsConfig, op: Op, timeout: Duration) -> Result<Reply, SourceError> {
    let err = |e: &dyn std::fmt::Display| SourceError::Fetch {
        what: format!("policy {op:?} via {}", nats.url),
        message: e.to_string(),
    };
    let body = serde_json::to_vec(&Request { op }).unwrap_or_default();
    let reply = nats_io::request(nats, &subject(nats), body, timeout).map_err(|e| match e {
        wasmsched_events::Error::Timeout(_) => {
            err(&"no scheduler answered (is one running with this --nats and cluster?)")
        }
        e => err(&e),
    })?;
    serde_json::from_slice(&reply).map_err(|e| err(&format!("malformed reply: {e}")))
}
