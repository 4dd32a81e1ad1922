//! The NATS JetStream sink, and the consumer `wasmsched events tail` uses.
//!
//! # Delivery
//! Events are published to `<prefix>.<cluster>.<kind>.<namespace>` with `Nats-Msg-Id` = event id,
//! at most `max_in_flight` un-acked at a time (async-nats hangs if too many acks are held). An
//! event leaves the outbox only when JetStream acks it.
//!
//! # Loss-free and ordered across server failures
//! A connection is one *session*, run on its own single-threaded tokio runtime. The client is told
//! never to reconnect by itself (its reconnect callback never resolves after the first connect):
//! when a session fails (disconnect, ack timeout, server error) the runtime is dropped, which
//! discards whatever the client still buffered, and a new session starts after a back-off and
//! re-publishes from the oldest un-acked event. The server saw a prefix of the old session's
//! bytes, so the retry yields duplicates (removed by JetStream's duplicate window) but never
//! reorders: a message buffered in the old client cannot overtake a retry, which is what
//! async-nats' own reconnect would do.

use std::collections::VecDeque;
use std::future::{Future, IntoFuture};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, context::ContextBuilder, message::PublishMessage, stream};
use async_nats::{ConnectErrorKind, ConnectOptions};
use futures_util::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::filter::Filter;
use crate::outbox::{Encoded, Item, OutboxConfig};
use crate::schema::Event;
use crate::sink::{EventSink, Origin, Shared, subject_token};

/// Where and how to publish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated, e.g. `nats://nats.wasmsched:4222`.
    pub url: String,
    /// Cluster name: the second subject token and part of the default stream name.
    pub cluster: String,
    /// First subject token.
    pub subject_prefix: String,
    /// The JetStream stream created or verified at start-up.
    pub stream: StreamSettings,
    /// Authentication.
    pub auth: NatsAuth,
    /// TLS; none uses what the URL scheme (`tls://`) and the server require.
    pub tls: Option<TlsSettings>,
    /// Publishes awaiting their ack at most.
    pub max_in_flight: usize,
    /// How long to wait for one ack before the session is considered broken.
    pub ack_timeout_ms: u64,
    /// TCP/TLS connect timeout.
    pub connect_timeout_ms: u64,
    /// Reconnect back-off: first delay, doubling up to the maximum.
    pub backoff_min_ms: u64,
    /// Reconnect back-off ceiling.
    pub backoff_max_ms: u64,
    /// How long [`EventSink::nats`] waits for the first connection before returning (events are
    /// buffered either way; only rejected credentials make it fail).
    pub startup_wait_ms: u64,
    /// A server error for the same event this many times in a row gives the event up (counted as
    /// `rejected`, logged): a poison event must not stall the stream.
    pub max_rejections: u32,
    /// Acknowledged events kept (their wire form) so that a server that comes back without them
    /// (restarted with an empty store, or a shorter stream) gets them again. Beyond this many,
    /// such losses are counted (`lost_by_server`) and reported, not repaired. 0 keeps none.
    pub resend_window: usize,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            cluster: "default".into(),
            subject_prefix: "wasmsched".into(),
            stream: StreamSettings::default(),
            auth: NatsAuth::default(),
            tls: None,
            max_in_flight: 256,
            ack_timeout_ms: 5_000,
            connect_timeout_ms: 2_000,
            backoff_min_ms: 100,
            backoff_max_ms: 5_000,
            startup_wait_ms: 3_000,
            max_rejections: 3,
            resend_window: 10_000,
        }
    }
}

/// Retention of the events stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamSettings {
    /// Stream name; default `WASMSCHED_<CLUSTER>`.
    pub name: Option<String>,
    /// Age after which events are removed (0 = forever).
    pub max_age_secs: u64,
    /// Total size bound (-1 = unlimited); the oldest events go first.
    pub max_bytes: i64,
    /// Event count bound (-1 = unlimited).
    pub max_msgs: i64,
    /// `file` or `memory`.
    pub storage: Storage,
    /// Replicas in a JetStream cluster.
    pub replicas: usize,
    /// How long JetStream remembers event ids to drop duplicates; outages longer than this may
    /// produce duplicates in the stream (consumers de-duplicate by id).
    pub duplicate_window_secs: u64,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            name: None,
            max_age_secs: 7 * 24 * 3600,
            max_bytes: -1,
            max_msgs: -1,
            storage: Storage::File,
            replicas: 1,
            duplicate_window_secs: 120,
        }
    }
}

/// JetStream storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// Survives server restarts.
    File,
    /// Faster, lost on restart.
    Memory,
}

/// Credentials; at most one method.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsAuth {
    /// A `.creds` file (JWT and NKey seed), re-read at every connection so rotation works.
    pub creds_file: Option<PathBuf>,
    /// A file holding an NKey seed (`SU…`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A token.
    pub token: Option<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password.
    pub password: Option<String>,
}

/// TLS files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// CA bundle to verify the server with (PEM).
    pub ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (PEM), with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM).
    pub key_file: Option<PathBuf>,
    /// Refuse to talk to a server without TLS.
    pub required: bool,
}

impl NatsConfig {
    /// Check the configuration before anything connects.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Config(m));
        if self.url.trim().is_empty() {
            return bad("nats url is empty".into());
        }
        for (what, v) in [("cluster", &self.cluster), ("subject_prefix", &self.subject_prefix)] {
            if v.is_empty() || subject_token(v) != *v {
                return bad(format!(
                    "{what} `{v}` must be a non-empty NATS subject token (no `.`, `*`, `>` or spaces)"
                ));
            }
        }
        let methods = [
            self.auth.creds_file.is_some(),
            self.auth.nkey_seed_file.is_some(),
            self.auth.token.is_some(),
            self.auth.user.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return bad("give at most one of creds_file, nkey_seed_file, token, user/password".into());
        }
        if self.auth.user.is_some() != self.auth.password.is_some() {
            return bad("user and password go together".into());
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return bad("tls cert_file and key_file go together".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight > 4096 {
            return bad(format!("max_in_flight {} must be in 1..=4096", self.max_in_flight));
        }
        if self.ack_timeout_ms == 0 || self.backoff_min_ms == 0 || self.backoff_max_ms < self.backoff_min_ms {
            return bad("ack_timeout_ms and backoff_min_ms must be positive, backoff_max_ms ≥ backoff_min_ms".into());
        }
        let name = self.stream_name();
        if name.is_empty() || name.contains(['.', '*', '>', ' ', '\t']) {
            return bad(format!("stream name `{name}` may not contain `.`, `*`, `>` or whitespace"));
        }
        Ok(())
    }

    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.stream
            .name
            .clone()
            .unwrap_or_else(|| format!("WASMSCHED_{}", self.cluster.to_uppercase().replace('-', "_")))
    }

    /// `<prefix>.<cluster>`: every event subject starts with it.
    pub fn subject_root(&self) -> String {
        format!("{}.{}", self.subject_prefix, self.cluster)
    }

    async fn connect_options(&self) -> Result<ConnectOptions, Error> {
        let a = &self.auth;
        let mut o = if let Some(path) = &a.creds_file {
            ConnectOptions::with_credentials_file(path.clone())
                .await
                .map_err(|e| Error::Config(format!("credentials file {}: {e}", path.display())))?
        } else if let Some(path) = &a.nkey_seed_file {
            let seed = std::fs::read_to_string(path)
                .map_err(|e| Error::Config(format!("nkey seed file {}: {e}", path.display())))?;
            ConnectOptions::with_nkey(seed.trim().to_owned())
        } else if let Some(token) = &a.token {
            ConnectOptions::with_token(token.clone())
        } else if let (Some(u), Some(p)) = (&a.user, &a.password) {
            ConnectOptions::with_user_and_password(u.clone(), p.clone())
        } else {
            ConnectOptions::new()
        };
        if let Some(tls) = &self.tls {
            if let Some(ca) = &tls.ca_file {
                o = o.add_root_certificates(ca.clone());
            }
            if let (Some(c), Some(k)) = (&tls.cert_file, &tls.key_file) {
                o = o.add_client_certificate(c.clone(), k.clone());
            }
            o = o.require_tls(tls.required);
        }
        Ok(o.name("wasmsched-events").connection_timeout(Duration::from_millis(self.connect_timeout_ms)))
    }

    /// Connect once with the configured credentials and TLS (consumers, the policy registry): no
    /// outbox, async-nats' own reconnect.
    pub async fn connect(&self) -> Result<async_nats::Client, Error> {
        let urls: Vec<&str> = self.url.split(',').map(str::trim).collect();
        self.connect_options().await?.connect(urls).await.map_err(|e| self.connect_error(e))
    }

    fn connect_error(&self, e: async_nats::ConnectError) -> Error {
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                Error::Auth { url: self.url.clone(), message: e.to_string() }
            }
            ConnectErrorKind::ServerParse => Error::Config(format!("nats url {}: {e}", self.url)),
            // rustls reports an untrusted or mismatched server certificate as an I/O error.
            ConnectErrorKind::Tls => Error::Tls { url: self.url.clone(), message: e.to_string() },
            ConnectErrorKind::Io if e.to_string().contains("certificate") => {
                Error::Tls { url: self.url.clone(), message: e.to_string() }
            }
            _ => Error::Connect { url: self.url.clone(), message: e.to_string() },
        }
    }

    fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.stream_name(),
            subjects: vec![format!("{}.>", self.subject_root())],
            max_age: Duration::from_secs(self.stream.max_age_secs),
            max_bytes: self.stream.max_bytes,
            max_messages: self.stream.max_msgs,
            storage: match self.stream.storage {
                Storage::File => stream::StorageType::File,
                Storage::Memory => stream::StorageType::Memory,
            },
            num_replicas: self.stream.replicas,
            duplicate_window: Duration::from_secs(self.stream.duplicate_window_secs),
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        }
    }

    /// Create the stream, or check that the existing one captures our subjects and bring its
    /// retention to the configured values.
    async fn ensure_stream(&self, js: &jetstream::Context) -> Result<StreamState, Error> {
        let want = self.stream_config();
        match js.get_stream(&want.name).await {
            Ok(mut s) => {
                let info = s.info().await.map_err(|e| Error::JetStream(format!("stream {} info: {e}", want.name)))?;
                let state = StreamState::of(info);
                let have = info.config.clone();
                let ours = &want.subjects[0];
                if !have.subjects.iter().any(|s| s == ours || s == ">" || covers(s, ours)) {
                    return Err(Error::Config(format!(
                        "stream {} exists with subjects {:?}, which do not capture {ours}",
                        want.name, have.subjects
                    )));
                }
                if have.max_age != want.max_age
                    || have.max_bytes != want.max_bytes
                    || have.max_messages != want.max_messages
                    || have.duplicate_window != want.duplicate_window
                {
                    let updated = stream::Config {
                        max_age: want.max_age,
                        max_bytes: want.max_bytes,
                        max_messages: want.max_messages,
                        duplicate_window: want.duplicate_window,
                        ..have
                    };
                    js.update_stream(updated)
                        .await
                        .map_err(|e| Error::JetStream(format!("update stream {}: {e}", want.name)))?;
                    tracing::info!(stream = %want.name, "updated the events stream's retention");
                }
                Ok(state)
            }
            Err(e) if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j) if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                let mut created = js
                    .create_stream(want.clone())
                    .await
                    .map_err(|e| Error::JetStream(format!("create stream {}: {e}", want.name)))?;
                tracing::info!(stream = %want.name, subjects = ?want.subjects, "created the events stream");
                let info =
                    created.info().await.map_err(|e| Error::JetStream(format!("stream {} info: {e}", want.name)))?;
                Ok(StreamState::of(info))
            }
            Err(e) => Err(Error::JetStream(format!("look up stream {}: {e}", want.name))),
        }
    }
}

/// What identifies the stream's contents: when it was created, and its last sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StreamState {
    created: i128,
    last_sequence: u64,
}

impl StreamState {
    fn of(info: &stream::Info) -> StreamState {
        StreamState { created: info.created.unix_timestamp_nanos(), last_sequence: info.state.last_sequence }
    }
}

/// What the drainer remembers of the stream across sessions, to notice a server that lost
/// events it had acknowledged: the stream was created anew (a restart with an empty store), or
/// its last sequence is below one it acknowledged.
struct Acked {
    /// The stream as of the last session.
    stream: Option<StreamState>,
    /// The highest sequence acknowledged to us in that stream.
    highest: u64,
    /// Acknowledgements received since the stream was (last) created.
    count: u64,
    /// The last acknowledged events (sequence and wire form), oldest first.
    recent: VecDeque<(u64, Encoded)>,
    window: usize,
}

impl Acked {
    fn new(window: usize) -> Acked {
        Acked { stream: None, highest: 0, count: 0, recent: VecDeque::with_capacity(window.min(1 << 16)), window }
    }

    /// An acknowledgement of `item`, which is delivered: its wire form is kept (moved, not copied).
    fn record(&mut self, sequence: u64, item: &mut Item, encode: &crate::outbox::Encoder) {
        self.highest = self.highest.max(sequence);
        self.count += 1;
        if self.window == 0 {
            return;
        }
        if self.recent.len() == self.window {
            self.recent.pop_front();
        }
        self.recent.push_back((sequence, item.take_encoded(encode)));
    }

    /// A session found `now`: if the server lost acknowledged events, re-send what is kept of
    /// them (ahead of everything else) and count the rest as lost.
    fn check(&mut self, now: StreamState, shared: &Shared, stream: &str) {
        let Some(before) = self.stream.replace(now) else { return };
        let recreated = before.created != now.created;
        if !recreated && now.last_sequence >= self.highest {
            return;
        }
        // Recreated: everything acknowledged in the old stream is gone. Else the tail past its last
        // sequence is: what we kept of it goes again; if the window reaches back past that point,
        // nothing else of ours was there (the sequences in between may be other publishers').
        let floor = if recreated { 0 } else { now.last_sequence };
        let covered = self.recent.front().is_some_and(|(seq, _)| *seq <= floor.saturating_add(1));
        let kept = self.recent.iter().position(|(seq, _)| *seq > floor).unwrap_or(self.recent.len());
        let again: Vec<Encoded> = self.recent.drain(kept..).map(|(_, e)| e).collect();
        let gone = if recreated { self.count } else { (self.highest - floor).max(again.len() as u64) };
        let lost = if covered { 0 } else { gone.saturating_sub(again.len() as u64) };
        tracing::error!(
            stream,
            acknowledged_then_lost = gone,
            resent = again.len(),
            lost,
            "the NATS server lost events it had acknowledged (restarted with an empty or older store); re-sending what the outbox kept"
        );
        self.highest = now.last_sequence;
        self.count = if recreated { 0 } else { self.count.saturating_sub(again.len() as u64 + lost) };
        shared.resend(again, lost);
    }
}

/// Whether subject filter `pattern` (with `*` and `>`) captures every subject `ours` captures.
fn covers(pattern: &str, ours: &str) -> bool {
    let (p, o): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), ours.split('.').collect());
    for (i, pt) in p.iter().enumerate() {
        match (*pt, o.get(i)) {
            (">", _) => return true,
            (_, None) => return false,
            ("*", Some(&ot)) if ot != ">" => {}
            (pt, Some(&ot)) if pt == ot => {}
            _ => return false,
        }
    }
    p.len() == o.len()
}

/// How the first session went, for the start-up handshake.
type FirstOutcome = Result<(), Error>;

impl EventSink {
    /// Publish to NATS JetStream. Waits up to `startup_wait_ms` for the first connection: fails on
    /// an invalid configuration, rejected credentials or an untrusted server certificate; an unreachable server is logged and the
    /// events are held in the outbox until it is reachable.
    pub fn nats(config: NatsConfig, origin: Origin, outbox: OutboxConfig) -> Result<EventSink, Error> {
        config.validate()?;
        let (tx, rx) = std::sync::mpsc::channel::<FirstOutcome>();
        let wait = Duration::from_millis(config.startup_wait_ms);
        let url = config.url.clone();
        let sink =
            EventSink::start(origin, outbox, config.subject_root(), "nats", move |shared| drain(shared, config, tx))
                .map_err(|e| Error::Io { what: "start the event publisher".into(), source: e })?;
        match rx.recv_timeout(wait) {
            Ok(Ok(())) => Ok(sink),
            Ok(Err(e @ (Error::Auth { .. } | Error::Tls { .. } | Error::Config(_)))) => Err(e),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "NATS unreachable at start-up; holding events in the outbox");
                Ok(sink)
            }
            Err(_) => {
                tracing::warn!(url = %url, "no NATS connection yet; holding events in the outbox");
                Ok(sink)
            }
        }
    }
}

/// Why a session ended.
enum End {
    Closed,
    Failed(Error),
}

fn drain(shared: Arc<Shared>, config: NatsConfig, first: std::sync::mpsc::Sender<FirstOutcome>) {
    let encode = shared.encoder();
    let mut first = Some(first);
    let mut backoff = Duration::from_millis(config.backoff_min_ms);
    let mut rejections: (String, u32) = (String::new(), 0);
    let mut acked = Acked::new(config.resend_window);
    loop {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the NATS session runtime");
                break;
            }
        };
        let end = rt.block_on(session(&shared, &config, &*encode, &mut first, &mut rejections, &mut acked));
        // Dropping the runtime drops the client's connection task and everything it buffered.
        drop(rt);
        shared.set_connected(false);
        match end {
            End::Closed => break,
            End::Failed(e) => {
                if shared.is_closed() {
                    break;
                }
                if matches!(e, Error::Auth { .. } | Error::Tls { .. } | Error::Config(_)) {
                    tracing::error!(error = %e, "cannot publish events");
                } else {
                    tracing::warn!(error = %e, retry_in = ?backoff, "NATS session ended");
                }
                shared.set_error(Some(e.to_string()));
                if let Some(tx) = first.take() {
                    let _ = tx.send(Err(e));
                }
                // Sleep in short steps so that close is prompt; shutting down, retry at the
                // shortest back-off (a server coming back within the grace gets everything).
                let shortest = Duration::from_millis(config.backoff_min_ms);
                let started = std::time::Instant::now();
                while !shared.is_closed() && started.elapsed() < backoff {
                    if shared.in_a_hurry() && started.elapsed() >= shortest {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                backoff = if shared.in_a_hurry() {
                    shortest
                } else {
                    (backoff * 2).min(Duration::from_millis(config.backoff_max_ms))
                };
            }
        }
        if shared.session_succeeded() {
            backoff = Duration::from_millis(config.backoff_min_ms);
        }
    }
    shared.spill_remaining();
}

type AckFuture =
    Pin<Box<dyn Future<Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>> + Send>>;

async fn session(
    shared: &Shared,
    config: &NatsConfig,
    encode: &crate::outbox::Encoder,
    first: &mut Option<std::sync::mpsc::Sender<FirstOutcome>>,
    rejections: &mut (String, u32),
    acked: &mut Acked,
) -> End {
    let connected_once = Arc::new(AtomicBool::new(false));
    let disconnected = Arc::new(tokio::sync::Notify::new());
    let options = match config.connect_options().await {
        Ok(o) => o,
        Err(e) => return End::Failed(e),
    };
    let gate = connected_once.clone();
    let on_event = disconnected.clone();
    let options = options
        // Never reconnect inside a session (see the module docs); the first connect passes.
        .reconnect_to_server_callback(move |_, _| {
            let reconnecting = gate.load(Ordering::SeqCst);
            async move {
                if reconnecting {
                    std::future::pending::<()>().await;
                }
                None
            }
        })
        .event_callback(move |event| {
            let on_event = on_event.clone();
            async move {
                if matches!(event, async_nats::Event::Disconnected) {
                    on_event.notify_one();
                }
            }
        });
    let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let client = match options.connect(urls).await {
        Ok(c) => c,
        Err(e) => return End::Failed(config.connect_error(e)),
    };
    connected_once.store(true, Ordering::SeqCst);
    let js = ContextBuilder::new()
        .ack_timeout(Duration::from_millis(config.ack_timeout_ms))
        .max_ack_inflight(config.max_in_flight)
        .backpressure_on_inflight(true)
        .build(client.clone());
    match config.ensure_stream(&js).await {
        Ok(state) => acked.check(state, shared, &config.stream_name()),
        Err(e) => return End::Failed(e),
    }
    shared.set_connected(true);
    shared.set_error(None);
    shared.mark_session_succeeded();
    if let Some(tx) = first.take() {
        let _ = tx.send(Ok(()));
    }
    tracing::info!(url = %config.url, stream = %config.stream_name(), "publishing events to NATS");

    let mut inflight: VecDeque<(Item, AckFuture)> = VecDeque::with_capacity(config.max_in_flight);
    // Put back, in order: `head` (older than everything in flight), the in-flight items, `tail`.
    let fail = |head: Option<Item>, inflight: VecDeque<(Item, AckFuture)>, tail: Vec<Item>, e: Error| {
        let mut items: Vec<Item> = head.into_iter().collect();
        items.extend(inflight.into_iter().map(|(i, _)| i));
        items.extend(tail);
        shared.requeue(items);
        End::Failed(e)
    };
    let disconnect = || Error::Connect { url: config.url.clone(), message: "disconnected".into() };
    loop {
        if shared.is_closed() {
            let _ = fail(None, inflight, Vec::new(), disconnect());
            return End::Closed;
        }
        if inflight.len() < config.max_in_flight {
            let mut batch = shared.take(config.max_in_flight - inflight.len()).into_iter();
            while let Some(mut item) = batch.next() {
                let rec = item.encoded(encode).clone();
                let msg = PublishMessage::build().payload(rec.json).message_id(&rec.id);
                match js.send_publish(rec.subject, msg).await {
                    Ok(ack) => inflight.push_back((item, ack.into_future())),
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                        tracing::error!(id = %rec.id, error = %e, "event larger than the server accepts: given up");
                        shared.reject(vec![item]);
                    }
                    Err(e) => {
                        let mut rest = vec![item];
                        rest.extend(batch);
                        return fail(None, inflight, rest, Error::JetStream(format!("publish: {e}")));
                    }
                }
            }
        }
        let Some((_, ack)) = inflight.front_mut() else {
            if !shared.prepare_wait() {
                continue;
            }
            tokio::select! {
                _ = shared.notify.notified() => {
                    // Linger: let a few events gather instead of publishing (and waking) per event.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                _ = disconnected.notified() => return End::Failed(disconnect()),
                _ = tokio::time::sleep(crate::sink::IDLE_LOOK) => continue,
            }
        };
        tokio::select! {
            biased;
            _ = disconnected.notified() => return fail(None, inflight, Vec::new(), disconnect()),
            result = ack => {
                let (mut item, _) = inflight.pop_front().expect("front exists");
                match result {
                    Ok(ack) => {
                        shared.delivered_to_tap(&item.encoded(encode).json);
                        acked.record(ack.sequence, &mut item, encode);
                        // Ack whatever else is already acknowledged in one go: one lock, not one per event.
                        let mut done = vec![item];
                        let mut duplicates = u64::from(ack.duplicate);
                        while let Some((_, next)) = inflight.front_mut() {
                            match next.now_or_never() {
                                Some(Ok(ack)) => {
                                    duplicates += u64::from(ack.duplicate);
                                    let (mut next, _) = inflight.pop_front().expect("front exists");
                                    shared.delivered_to_tap(&next.encoded(encode).json);
                                    acked.record(ack.sequence, &mut next, encode);
                                    done.push(next);
                                }
                                // An error is handled when it is awaited at the front.
                                Some(Err(e)) => {
                                    let (item, _) = inflight.pop_front().expect("front exists");
                                    let failed: AckFuture = Box::pin(std::future::ready(Err(e)));
                                    inflight.push_front((item, failed));
                                    break;
                                }
                                None => break,
                            }
                        }
                        shared.ack(done, duplicates);
                    }
                    Err(e) => {
                        use jetstream::context::PublishErrorKind as K;
                        let transport = matches!(e.kind(), K::TimedOut | K::BrokenPipe | K::StreamNotFound | K::MaxAckPending);
                        let id = item.encoded(encode).id.clone();
                        let error = Error::JetStream(format!("publish {id}: {e}"));
                        if !transport {
                            if rejections.0 == id {
                                rejections.1 += 1;
                            } else {
                                *rejections = (id.clone(), 1);
                            }
                            if rejections.1 >= config.max_rejections {
                                tracing::error!(id = %id, error = %e, "JetStream keeps rejecting an event: given up");
                                shared.reject(vec![item]);
                                return fail(None, inflight, Vec::new(), error);
                            }
                        }
                        return fail(Some(item), inflight, Vec::new(), error);
                    }
                }
            }
        }
    }
}

/// How long a durable consumer waits for the acknowledgement of a batch before delivering it again
/// (to this reader's next run, after a crash between reading and acknowledging).
pub const DURABLE_ACK_WAIT: Duration = Duration::from_secs(5);

/// Read every event waiting for durable consumer `durable` on the stream (created on first use:
/// every event of the stream, from its first), in batches of up to `batch`, and acknowledge each
/// batch only after `on_batch` returned `Ok` — so the consumer's position on the server moves past
/// an event only once the caller has kept it. A batch `on_batch` refused, or that a crash
/// interrupted, is delivered again (after [`DURABLE_ACK_WAIT`]): callers keep events idempotently.
/// Returns once nothing is waiting, with the number of events handed over.
pub fn pull_durable(
    config: &NatsConfig,
    durable: &str,
    batch: usize,
    on_batch: impl FnMut(&[&[u8]]) -> Result<(), String>,
) -> Result<u64, Error> {
    config.validate()?;
    if durable.is_empty() || durable.contains(['.', '*', '>', ' ', '/', '\\']) {
        return Err(Error::Config(format!("`{durable}` is not a valid durable consumer name")));
    }
    crate::nats_io::io()?.block_on(pull_durable_async(config, durable, batch.max(1), on_batch))
}

async fn pull_durable_async(
    config: &NatsConfig,
    durable: &str,
    batch: usize,
    mut on_batch: impl FnMut(&[&[u8]]) -> Result<(), String>,
) -> Result<u64, Error> {
    let client = config.connect().await?;
    let js = jetstream::new(client);
    let name = config.stream_name();
    let js_err = |what: &str, e: &dyn std::fmt::Display| Error::JetStream(format!("{what} {durable} on {name}: {e}"));
    let stream = js.get_stream(&name).await.map_err(|e| Error::JetStream(format!("stream {name}: {e}")))?;
    let mut consumer: jetstream::consumer::Consumer<pull::Config> = stream
        .get_or_create_consumer(
            durable,
            pull::Config {
                durable_name: Some(durable.to_string()),
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ack_policy: jetstream::consumer::AckPolicy::All,
                ack_wait: DURABLE_ACK_WAIT,
                filter_subject: format!("{}.>", config.subject_root()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| js_err("consumer", &e))?;
    let mut handed = 0u64;
    // Unacknowledged events of a reader that crashed come back after the ack wait: wait that long
    // for them, and no longer.
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        let info = consumer.info().await.map_err(|e| js_err("consumer info of", &e))?.clone();
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            return Ok(handed);
        }
        if idle_since.is_some_and(|t| t.elapsed() > DURABLE_ACK_WAIT * 3) {
            return Err(Error::Timeout(format!(
                "{} events of consumer {durable} stay unacknowledged by another reader",
                info.num_ack_pending
            )));
        }
        let mut messages = consumer
            .batch()
            .max_messages(batch)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .map_err(|e| js_err("fetch for", &e))?;
        let mut got = Vec::new();
        while let Some(m) = messages.next().await {
            got.push(m.map_err(|e| js_err("fetch for", &e))?);
        }
        let Some(last) = got.last() else {
            idle_since.get_or_insert_with(std::time::Instant::now);
            continue;
        };
        idle_since = None;
        let payloads: Vec<&[u8]> = got.iter().map(|m| m.payload.as_ref()).collect();
        on_batch(&payloads).map_err(|e| Error::JetStream(format!("keeping events of {durable}: {e}")))?;
        // Acknowledges the whole batch (ack policy `all`), confirmed by the server.
        last.double_ack().await.map_err(|e| js_err("acknowledge for", &e))?;
        handed += got.len() as u64;
    }
}

/// Options of [`tail`].
#[derive(Clone, Debug, Default)]
pub struct TailOptions {
    /// Start at the stream's first event rather than at new ones.
    pub from_start: bool,
    /// Keep waiting for new events; without it, stop once caught up.
    pub follow: bool,
}

/// Read events from the stream that match `filter`, de-duplicated by id, in stream order, calling
/// `on_event` for each until it returns false. Returns the number of events passed on.
pub fn tail(
    config: &NatsConfig,
    filter: &Filter,
    options: &TailOptions,
    on_event: impl FnMut(Event) -> bool,
) -> Result<u64, Error> {
    config.validate()?;
    crate::nats_io::io()?.block_on(tail_async(config, filter, options, on_event))
}

async fn tail_async(
    config: &NatsConfig,
    filter: &Filter,
    options: &TailOptions,
    mut on_event: impl FnMut(Event) -> bool,
) -> Result<u64, Error> {
    let client = config.connect().await?;
    let js = jetstream::new(client);
    let name = config.stream_name();
    let stream = js.get_stream(&name).await.map_err(|e| Error::JetStream(format!("stream {name}: {e}")))?;
    let subjects = filter.subjects(&config.subject_root());
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: subjects,
            deliver_policy: if options.from_start {
                jetstream::consumer::DeliverPolicy::All
            } else {
                jetstream::consumer::DeliverPolicy::New
            },
            ..Default::default()
        })
        .await
        .map_err(|e| Error::JetStream(format!("create consumer on {name}: {e}")))?;
    let mut consumer = consumer;
    let pending = consumer.info().await.map_err(|e| Error::JetStream(format!("consumer info: {e}")))?.num_pending;
    if !options.follow && pending == 0 {
        return Ok(0);
    }
    let mut messages = consumer.messages().await.map_err(|e| Error::JetStream(format!("consume {name}: {e}")))?;
    let mut dedup = crate::filter::Dedup::new(1 << 20);
    let mut passed = 0;
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| Error::JetStream(format!("consume {name}: {e}")))?;
        let left = msg.info().map(|i| i.pending).unwrap_or(1);
        match serde_json::from_slice::<Event>(&msg.payload) {
            Ok(event) => {
                if dedup.first_time(&event.id) && filter.matches(&event) {
                    passed += 1;
                    if !on_event(event) {
                        break;
                    }
                }
            }
            Err(e) => tracing::warn!(subject = %msg.subject, error = %e, "skipping a message that is not an event"),
        }
        if !options.follow && left == 0 {
            break;
        }
    }
    Ok(passed)
}
