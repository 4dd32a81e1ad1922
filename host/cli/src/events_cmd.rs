//! `wasmsched events …` and the event options every scheduling command shares.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use wasmsched_events::schema::{Kind, Payload, TaskScheduled};
use wasmsched_events::{
    EventSink, Filter, JsonlReader, NatsAuth, NatsConfig, Origin, OutboxConfig, Stats, TailOptions, json_schema, tail,
};

/// Where a scheduling command publishes its decisions. Without `--events` or `--nats`, none.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Sink {
    /// Append every decision as a JSON line to this file (the embedded default: no server).
    #[arg(long, value_name = "FILE", conflicts_with = "nats")]
    pub events: Option<PathBuf>,
    #[command(flatten)]
    pub nats: Nats,
    /// Events held in memory while the destination is away; beyond it they spill or are dropped.
    #[arg(long, default_value_t = 100_000)]
    pub outbox_events: usize,
    /// Spill the outbox to this directory when memory is full (and at exit), instead of dropping.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
}

/// How to reach NATS (for publishing and for `events tail`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Nats {
    /// NATS server URL(s), comma-separated: publish to JetStream.
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
    pub fn config(&self) -> anyhow::Result<Option<NatsConfig>> {
        let mut config = match &self.nats_config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
                serde_json::from_str::<NatsConfig>(&text)
                    .with_context(|| format!("{}: invalid NATS settings", path.display()))?
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
    pub fn open(&self, component: &str) -> anyhow::Result<Option<EventSink>> {
        let outbox =
            OutboxConfig { max_events: self.outbox_events, spill_dir: self.spill_dir.clone(), ..Default::default() };
        if let Some(config) = self.nats.config()? {
            let origin = Origin {
                source: format!("wasmsched/{}/{component}", config.cluster),
                id_prefix: Origin::unique_prefix(),
            };
            return Ok(Some(EventSink::nats(config, origin, outbox).context("events")?));
        }
        let Some(path) = &self.events else { return Ok(None) };
        let cluster = self.nats.cluster.clone().unwrap_or_else(|| "local".into());
        let origin = Origin { source: format!("wasmsched/{cluster}/{component}"), id_prefix: Origin::unique_prefix() };
        Ok(Some(EventSink::jsonl(path, origin, outbox).context("events")?))
    }
}

/// Flush and close `sink` at the end of a command, reporting what was not delivered.
pub fn finish(sink: Option<EventSink>) -> Option<Stats> {
    let sink = sink?;
    // Wait for delivery while the destination is reachable (up to 30 s); an unreachable one gets
    // 2 s, then what is left is spilled (with --spill-dir) or counted as dropped.
    let started = Instant::now();
    while !sink.flush(Duration::from_millis(250)) {
        let waited = started.elapsed();
        if waited > Duration::from_secs(30) || (!sink.stats().connected && waited > Duration::from_secs(2)) {
            break;
        }
    }
    let stats = sink.close(Duration::ZERO);
    if stats.pending > 0 || stats.dropped > 0 {
        tracing::warn!(
            pending = stats.pending,
            dropped = stats.dropped,
            error = stats.last_error.as_deref().unwrap_or(""),
            "not every event was delivered"
        );
    }
    Some(stats)
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print events from a JSONL file or the NATS stream, filtered.
    Tail(TailArgs),
    /// Print the JSON Schema of events.
    Schema,
    /// Measure sustained publishing (events/s) to a JSONL file or NATS.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct TailArgs {
    /// Read this JSONL file instead of NATS.
    #[arg(long, value_name = "FILE", conflicts_with = "nats")]
    file: Option<PathBuf>,
    #[command(flatten)]
    nats: Nats,
    /// Only these kinds (repeat or comma-separate), e.g. `task-unschedulable`.
    #[arg(long, value_delimiter = ',')]
    kind: Vec<Kind>,
    /// Only this namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// Only events about this task.
    #[arg(long)]
    task: Option<String>,
    /// NATS: start at the stream's first event (default: only new events).
    #[arg(long)]
    all: bool,
    /// Keep waiting for new events (a file is polled for appended lines).
    #[arg(long, short)]
    follow: bool,
    /// Stop after this many events.
    #[arg(long)]
    limit: Option<u64>,
    /// `json` (one event per line) or `text` (one summary per line).
    #[arg(long, default_value = "json", value_parser = ["json", "text"])]
    format: String,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Publish to this JSONL file (default: a temporary one) unless `--nats` is given.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    #[command(flatten)]
    nats: Nats,
    /// Events to publish.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&json_schema())?);
            Ok(())
        }
        Command::Tail(args) => run_tail(args),
        Command::Bench(args) => run_bench(args),
    }
}

fn run_tail(args: TailArgs) -> anyhow::Result<()> {
    let filter = Filter { kinds: args.kind.clone(), namespace: args.namespace.clone(), task: args.task.clone() };
    let limit = args.limit.unwrap_or(u64::MAX);
    if limit == 0 {
        return Ok(());
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut shown = 0u64;
    let mut print = |e: &wasmsched_events::Event| -> bool {
        let line = if args.format == "text" { e.summary() } else { serde_json::to_string(e).unwrap_or_default() };
        // A closed pipe (`| head`) ends the command quietly.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            return false;
        }
        shown += 1;
        shown < limit
    };
    if let Some(path) = &args.file {
        let mut reader = JsonlReader::open(path)?;
        loop {
            match reader.next_event() {
                Ok(Some(e)) => {
                    if filter.matches(&e) && !print(&e) {
                        return Ok(());
                    }
                }
                Ok(None) if args.follow => std::thread::sleep(Duration::from_millis(200)),
                Ok(None) => return Ok(()),
                // A malformed line is reported and skipped: one bad line must not hide the rest.
                Err(e @ wasmsched_events::Error::BadLine(_)) => eprintln!("warning: {e}"),
                Err(e) => return Err(e.into()),
            }
        }
    }
    let config = args.nats.config()?.context("give --file FILE or --nats URL")?;
    let options = TailOptions { from_start: args.all, follow: args.follow };
    tail(&config, &filter, &options, |e| print(&e))?;
    Ok(())
}

#[derive(serde::Serialize)]
struct BenchReport {
    destination: String,
    events: usize,
    emit_seconds: f64,
    emit_ns_per_event: f64,
    total_seconds: f64,
    events_per_second: f64,
    stats: Stats,
}

fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.events > 0, "--events must be positive");
    let outbox = OutboxConfig { max_events: args.events + 16, ..Default::default() };
    let origin = Origin { source: "wasmsched/bench/events".into(), id_prefix: Origin::unique_prefix() };
    let tmp = std::env::temp_dir().join(format!("wasmsched-events-bench-{}.jsonl", std::process::id()));
    let (sink, destination, remove) = match args.nats.config()? {
        Some(config) => {
            let d = format!("nats {} stream {}", config.url, config.stream_name());
            (EventSink::nats(config, origin, outbox)?, d, None)
        }
        None => {
            let path = args.file.clone().unwrap_or_else(|| tmp.clone());
            let remove = args.file.is_none().then(|| path.clone());
            (EventSink::jsonl(&path, origin, outbox)?, format!("jsonl {}", path.display()), remove)
        }
    };
    let payload = |i: usize| {
        Payload::TaskScheduled(TaskScheduled {
            task: wasmsched_events::schema::TaskRef {
                id: format!("pod-{i}"),
                namespace: format!("ns-{}", i % 8),
                queue: "default".into(),
                group: None,
                priority: 0,
            },
            node: format!("node-{:05}", i % 5000),
            ..Default::default()
        })
    };
    let started = Instant::now();
    for i in 0..args.events {
        sink.emit(payload(i));
    }
    let emit_seconds = started.elapsed().as_secs_f64();
    let flushed = sink.flush(Duration::from_secs(600));
    let total_seconds = started.elapsed().as_secs_f64();
    let stats = sink.close(Duration::from_secs(5));
    if let Some(p) = remove {
        let _ = std::fs::remove_file(p);
    }
    anyhow::ensure!(flushed, "not every event was delivered within 10 minutes: {stats:?}");
    let report = BenchReport {
        destination,
        events: args.events,
        emit_seconds,
        emit_ns_per_event: emit_seconds * 1e9 / args.events as f64,
        total_seconds,
        events_per_second: args.events as f64 / total_seconds,
        stats,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} events to {}: {:.0} events/s sustained ({:.2} s); emit {:.0} ns/event on the caller",
            report.events, report.destination, report.events_per_second, report.total_seconds, report.emit_ns_per_event
        );
    }
    Ok(())
}
