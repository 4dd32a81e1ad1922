//! The event options every command that publishes events shares (`wasmsched simulate`, `replay`,
//! `bench`, the node agent), as clap arguments. Behind the `cli` feature.

use std::path::PathBuf;
use std::time::Duration;

use crate::{EventSink, NatsAuth, NatsConfig, Origin, OutboxConfig, Stats};

/// What the shared event options can fail with.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// `--nats-config` could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `--nats-config` is not valid NATS settings.
    #[error("{path}: invalid NATS settings: {source}")]
    Settings {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The settings are inconsistent, or the sink could not be opened.
    #[error("events: {0}")]
    Events(#[from] crate::Error),
    /// Events were lost: how many, and where the undelivered rest is.
    #[error("events lost: {0}")]
    Lost(String),
}

/// Where a scheduling command publishes its decisions. Without `--events` or `--nats`, none.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Sink {
    /// Append every decision as a JSON line to this file (the embedded default: no server).
    #[arg(long, value_name = "FILE", conflicts_with = "nats")]
    pub events: Option<PathBuf>,
    /// NATS settings (publish to JetStream when `--nats` or `--nats-config` is given).
    #[command(flatten)]
    pub nats: Nats,
    /// Events held in memory while the destination is away; beyond it they spill or are dropped.
    #[arg(long, default_value_t = 100_000)]
    pub outbox_events: usize,
    /// Spill the outbox to this directory when memory is full (and at exit), instead of dropping.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// At exit, how long to wait for undelivered events, reconnecting to a server that is away
    /// at the shortest back-off; what is still undelivered then is spilled (`--spill-dir`) or
    /// dropped, and dropped events make the command fail.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub events_grace: f64,
}

/// How to reach NATS (for publishing and for `events tail`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Nats {
    /// NATS server URL(s), comma-separated (JetStream).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// NATS settings as JSON (see docs/events.md); the flags below override it.
    #[arg(long, value_name = "FILE")]
    pub nats_config: Option<PathBuf>,
    /// Cluster name in subjects (`wasmsched.<cluster>.<kind>.<namespace>`) and the stream name.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Authenticate with a token.
    #[arg(long, value_name = "TOKEN", env = "WASMSCHED_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// Authenticate with a `.creds` file.
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// Authenticate with an NKey seed file.
    #[arg(long, value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
}

impl Nats {
    /// The NATS configuration, if NATS was asked for.
    pub fn config(&self) -> Result<Option<NatsConfig>, OptionsError> {
        let mut config = match &self.nats_config {
            Some(path) => {
                let path_text = || path.display().to_string();
                let text =
                    std::fs::read_to_string(path).map_err(|source| OptionsError::Read { path: path_text(), source })?;
                serde_json::from_str::<NatsConfig>(&text)
                    .map_err(|source| OptionsError::Settings { path: path_text(), source })?
            }
            None if self.nats.is_some() => NatsConfig::default(),
            None => return Ok(None),
        };
        if let Some(url) = &self.nats {
            config.url = url.clone();
        }
        if let Some(c) = &self.cluster {
            config.cluster = c.clone();
        }
        let flags = [self.nats_token.is_some(), self.nats_creds.is_some(), self.nats_nkey.is_some()];
        if flags.iter().any(|f| *f) {
            config.auth = NatsAuth {
                token: self.nats_token.clone(),
                creds_file: self.nats_creds.clone(),
                nkey_seed_file: self.nats_nkey.clone(),
                ..Default::default()
            };
        }
        config.validate()?;
        Ok(Some(config))
    }
}

impl Sink {
    /// Open the configured sink; `component` names the emitter in `source`.
    pub fn open(&self, component: &str) -> Result<Option<EventSink>, OptionsError> {
        self.open_with(component, false)
    }

    /// [`Sink::open`] for a simulator: its clock is virtual, so a full outbox makes it wait for
    /// the file to be written instead of dropping events (a busy machine never costs a replay's
    /// record). A JetStream sink keeps its spill directory for that.
    pub fn open_for_simulation(&self, component: &str) -> Result<Option<EventSink>, OptionsError> {
        self.open_with(component, true)
    }

    fn open_with(&self, component: &str, simulated: bool) -> Result<Option<EventSink>, OptionsError> {
        let outbox =
            OutboxConfig { max_events: self.outbox_events, spill_dir: self.spill_dir.clone(), ..Default::default() };
        if let Some(config) = self.nats.config()? {
            let origin = Origin {
                source: format!("wasmsched/{}/{component}", config.cluster),
                id_prefix: Origin::unique_prefix(),
            };
            return Ok(Some(EventSink::nats(config, origin, outbox)?));
        }
        let Some(path) = &self.events else { return Ok(None) };
        let cluster = self.nats.cluster.clone().unwrap_or_else(|| "local".into());
        let origin = Origin { source: format!("wasmsched/{cluster}/{component}"), id_prefix: Origin::unique_prefix() };
        let outbox = OutboxConfig { wait_when_full: simulated, ..outbox };
        Ok(Some(EventSink::jsonl(path, origin, outbox)?))
    }
}

impl Sink {
    /// The shutdown grace (`--events-grace`).
    pub fn grace(&self) -> Duration {
        Duration::try_from_secs_f64(self.events_grace).unwrap_or(Duration::ZERO)
    }
}

/// Flush and close `sink` at the end of a command: wait up to `grace` for delivery (a server that
/// is away is retried at the shortest back-off meanwhile), then spill or drop what is left
/// ([`EventSink::shutdown`]). Call [`delivered`] on the result once the command's report is out.
pub fn finish(sink: Option<EventSink>, grace: Duration) -> Option<Stats> {
    let stats = sink?.shutdown(grace);
    if stats.pending > 0 || stats.dropped > 0 || stats.lost_by_server > 0 {
        tracing::warn!(
            pending = stats.pending,
            dropped = stats.dropped,
            lost_by_server = stats.lost_by_server,
            error = stats.last_error.as_deref().unwrap_or(""),
            "not every event was delivered"
        );
    }
    Some(stats)
}

/// How long a panic's last moments give the event sinks to deliver, and then again to spill.
const PANIC_GRACE: Duration = Duration::from_secs(2);

/// Make any panic end the process the same way in every build: the message as usual, then the
/// events the process still holds kept as at a shutdown ([`crate::keep_events_at_panic`]), then
/// an abort (a non-zero exit, and a restart under Kubernetes). Release builds do not unwind
/// (`panic = "abort"`), and a debug build that did would go on with the task that panicked gone.
/// Call first thing in `main`.
pub fn end_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        crate::keep_events_at_panic(PANIC_GRACE);
        std::process::abort();
    }));
}

/// An error when events were lost (dropped, or lost by the server after it acknowledged them),
/// saying how many and where the undelivered rest is: a command that lost events must not exit 0.
pub fn delivered(stats: Option<&Stats>) -> Result<(), OptionsError> {
    let Some(s) = stats else { return Ok(()) };
    if s.lost() == 0 {
        if s.pending > 0 {
            let dir = s.spill_dir.as_ref().map_or_else(|| "?".into(), |d| d.display().to_string());
            tracing::warn!(
                events = s.pending,
                spill_dir = %dir,
                "events not yet delivered are kept in the spill directory; the next run with --spill-dir {dir} publishes them"
            );
        }
        return Ok(());
    }
    let kept = match (&s.spill_dir, s.pending) {
        (_, 0) => String::new(),
        (Some(dir), n) => format!("; {n} undelivered are kept in {} for the next run with --spill-dir", dir.display()),
        (None, n) => format!("; {n} still undelivered"),
    };
    let why = s.last_error.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default();
    let by_server = match s.lost_by_server {
        0 => String::new(),
        n => format!(", {n} lost by the server after it acknowledged them"),
    };
    Err(OptionsError::Lost(format!("{} of {} dropped{by_server}{kept}{why}", s.dropped, s.emitted)))
}

/// An error and its causes on one line, each cause once, for a command's last words: many errors
/// already end with their cause's text (`cannot read F: No such file…`), and printing the chain
/// as it is would repeat it.
pub fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    /// An error that says its cause and also chains it, as `thiserror` types often do.
    #[derive(Debug)]
    struct Read(std::io::Error);

    impl std::fmt::Display for Read {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot read f.wasm: {}", self.0)
        }
    }

    impl std::error::Error for Read {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Adds context, chaining the error below.
    #[derive(Debug)]
    struct Context(&'static str, Box<dyn std::error::Error + 'static>);

    impl std::fmt::Display for Context {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Context {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.1)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = Context("plugin", Box::new(Read(io)));
        assert_eq!(super::error_line(&e), "plugin: cannot read f.wasm: No such file or directory (os error 2)");
        let plain = Context("outer", Box::new(std::io::Error::other("inner")));
        assert_eq!(super::error_line(&plain), "outer: inner");
    }
}
