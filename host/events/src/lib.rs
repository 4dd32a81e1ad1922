//! Scheduling events: every decision wasmsched makes, published so that operators can audit,
//! alert, bill and replay, and other systems can react.
//!
//! - [`schema`]: the versioned CloudEvents-style envelope ([`Event`]) and its payloads; the JSON
//!   Schema is generated from these types ([`json_schema`]).
//! - [`EventSink`]: the scheduler's handle. [`EventSink::emit`] never blocks on I/O: events wait
//!   in a bounded outbox (with optional disk spill) and a drainer thread delivers them, to a JSONL
//!   file ([`EventSink::jsonl`], the embedded default) or to NATS JetStream ([`EventSink::nats`],
//!   loss-free and ordered across server restarts, de-duplicated by event id).
//! - [`tail`] and [`JsonlReader`] with a [`Filter`]: the consumer side of `wasmsched events tail`;
//!   [`Why`] folds one task's events into the answer of `wasmsched events why`.
//!
//! What is kept and what is dropped is documented in `docs/events.md`.

#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "decisions")]
pub mod decisions;
mod filter;
mod jsonl;
mod nats;
pub mod nats_io;
mod observer;
mod outbox;
mod record;
pub mod schema;
mod sink;
mod time;
mod why;

pub use filter::{Dedup, Filter};
pub use jsonl::{BadLine, JsonlReader};
pub use nats::{
    DURABLE_ACK_WAIT, NatsAuth, NatsConfig, Storage, StreamSettings, TailOptions, TlsSettings, pull_durable, tail,
};
pub use observer::Observer;
pub use outbox::OutboxConfig;
pub use schema::{Event, Kind, Payload, json_schema};
pub use sink::{EventSink, Origin, Stats, Tap, keep_events_at_panic};
pub use time::Timestamp;
pub use why::{TaskState, Why};

/// Errors of sinks and readers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or thread operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A JSONL line is not an event.
    #[error(transparent)]
    BadLine(#[from] BadLine),
    /// The server refused the credentials.
    #[error("NATS at {url} rejected the credentials: {message}")]
    Auth {
        /// Server URL(s).
        url: String,
        /// The server's or client's message.
        message: String,
    },
    /// TLS failed: the server's certificate is not trusted, or the TLS files are unusable.
    #[error("TLS with NATS at {url} failed: {message}")]
    Tls {
        /// Server URL(s).
        url: String,
        /// Why.
        message: String,
    },
    /// The server could not be reached.
    #[error("cannot reach NATS at {url}: {message}")]
    Connect {
        /// Server URL(s).
        url: String,
        /// Why.
        message: String,
    },
    /// A JetStream operation failed.
    #[error("JetStream: {0}")]
    JetStream(String),
    /// The events configuration is invalid.
    #[error("invalid events configuration: {0}")]
    Config(String),
    /// No answer in time (what was asked, and how long was waited).
    #[error("{0}")]
    Timeout(String),
}
