//! `wasmsched events …` and the event options every scheduling command shares.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
pub use wasmsched_events::cli::{Nats, Sink, finish};

/// [`wasmsched_events::cli::delivered`] as a command's result: lost events fail the command.
pub fn delivered(stats: Option<&wasmsched_events::Stats>) -> anyhow::Result<()> {
    Ok(wasmsched_events::cli::delivered(stats)?)
}
/// A command's events when it may serve a dashboard: the `--events`/`--nats` sink, which the
/// page's decision stream reads too, or else, while serving, a sink only the page reads (never
/// reported: it has nothing to lose).
pub struct Shown {
    /// The sink the user asked for.
    pub user: Option<EventSink>,
    board: Option<EventSink>,
}

impl Shown {
    /// `user`'s events, also streamed to `board` when there is one.
    pub fn new(
        user: Option<EventSink>,
        board: Option<&wasmsched_dashboard::Publisher>,
        component: &str,
    ) -> anyhow::Result<Shown> {
        let Some(board) = board else { return Ok(Shown { user, board: None }) };
        let tap: std::sync::Arc<dyn wasmsched_events::Tap> = std::sync::Arc::new(board.clone());
        if let Some(sink) = &user {
            sink.tap(tap);
            return Ok(Shown { user, board: None });
        }
        let origin = Origin { source: format!("wasmsched/local/{component}"), id_prefix: Origin::unique_prefix() };
        let sink =
            EventSink::tap_only(origin, OutboxConfig::default(), tap).context("starting the dashboard's events")?;
        Ok(Shown { user: None, board: Some(sink) })
    }

    /// Where to emit now: the user's sink, or the page's while one follows (none otherwise, so
    /// nothing is built for nobody).
    pub fn target(&self) -> Option<&EventSink> {
        self.user.as_ref().or(self.board.as_ref().filter(|s| s.wanted()))
    }
}

use wasmsched_events::schema::{Kind, Payload, TaskScheduled};
use wasmsched_events::{EventSink, Filter, JsonlReader, Origin, OutboxConfig, Stats, TailOptions, json_schema, tail};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print events from a JSONL file or the NATS stream, filtered.
    Tail(TailArgs),
    /// Why a task is pending (or where it went): its latest state from the events, with the
    /// reasons of its last failed attempt per stage.
    Why(WhyArgs),
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
pub struct WhyArgs {
    /// The task, as events name it (`namespace/name` on Kubernetes).
    task: String,
    /// Read this JSONL file instead of NATS.
    #[arg(long, value_name = "FILE", conflicts_with = "nats")]
    file: Option<PathBuf>,
    #[command(flatten)]
    nats: Nats,
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
        Command::Why(args) => run_why(args),
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

fn run_why(args: WhyArgs) -> anyhow::Result<()> {
    let mut why = wasmsched_events::Why::new(&args.task);
    // The whole stream: the task's own events, and its gang's time-outs (about the group).
    let filter = Filter::default();
    if let Some(path) = &args.file {
        let mut reader = JsonlReader::open(path)?;
        loop {
            match reader.next_event() {
                Ok(Some(e)) => why.observe(&e),
                Ok(None) => break,
                Err(e @ wasmsched_events::Error::BadLine(_)) => eprintln!("warning: {e}"),
                Err(e) => return Err(e.into()),
            }
        }
    } else {
        let config = args.nats.config()?.context("give --file FILE or --nats URL")?;
        let options = TailOptions { from_start: true, follow: false };
        tail(&config, &filter, &options, |e| {
            why.observe(&e);
            true
        })?;
    }
    // Not found is an error (exit status 1), as for any lookup a script may depend on.
    if matches!(why.state(), wasmsched_events::TaskState::Unknown) {
        let place = args.file.as_ref().map_or_else(|| "the stream".to_string(), |f| f.display().to_string());
        anyhow::bail!("no events about task {} in {place}", args.task);
    }
    println!("{why}");
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
