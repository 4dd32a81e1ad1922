//! `wasmsched scenario`: a team's own cluster as a replay scenario — from the event stream it
//! recorded — so candidate policies are compared on its real work before a rollout
//! (`docs/hot-reload.md`).

use std::io::BufRead as _;
use std::path::PathBuf;

use anyhow::Context;
use wasmsched_events::{Event, Kind, Timestamp};

use crate::history::{self, Window};

/// What `scenario` builds a scenario from.
#[derive(clap::Subcommand)]
pub enum Command {
    /// A recorded event stream (JSONL files, or the NATS JetStream stream): the nodes and queues
    /// as last described before the window, each job with its arrival, request and the run time
    /// it needed. What the stream does not say is listed as assumed.
    FromEvents(FromEventsArgs),
}

/// Arguments of `scenario from-events`.
#[derive(clap::Args)]
pub struct FromEventsArgs {
    /// A JSONL event file (repeatable: rotated files, several schedulers; an event in two of them
    /// counts once).
    #[arg(long, value_name = "FILE")]
    file: Vec<PathBuf>,
    #[command(flatten)]
    nats: crate::events_cmd::Nats,
    /// Window start, RFC 3339 (default: the first event): jobs arrive from here; runs going on
    /// at it arrive at 0.
    #[arg(long, value_parser = Timestamp::parse)]
    from: Option<Timestamp>,
    /// Window end, RFC 3339 (default: the last event).
    #[arg(long, value_parser = Timestamp::parse)]
    to: Option<Timestamp>,
    /// Write the scenario here (YAML when the name ends in `.yaml`/`.yml`, else JSON); default:
    /// JSON on standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Skip lines of the files that are not events (each is reported) instead of stopping.
    #[arg(long)]
    lenient: bool,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    let Command::FromEvents(args) = cmd;
    if let (Some(from), Some(to)) = (args.from, args.to) {
        anyhow::ensure!(from <= to, "--from {from} is after --to {to}");
    }
    let Read { events, unknown, malformed } = read_events(&args)?;
    anyhow::ensure!(!events.is_empty(), "no events to build a scenario from");
    let h = history::scenario(events, Window { from: args.from, to: args.to });
    let s = &h.scenario;
    let path = args.out.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let body = if path.ends_with(".yaml") || path.ends_with(".yml") {
        serde_yaml_ng::to_string(&history::compact(s)?)?
    } else {
        serde_json::to_string_pretty(&history::compact(s)?)? + "\n"
    };
    match &args.out {
        Some(path) => std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{body}"),
    }
    eprintln!(
        "{} nodes, {} queues, {} jobs from {} events ({} of other kinds not used)",
        s.nodes.len(),
        s.queues.len(),
        s.jobs.len(),
        h.events,
        h.ignored
    );
    if malformed > 0 {
        eprintln!("skipped: {malformed} lines that are not events (WASMSCHED_LOG=warn names them)");
    }
    if unknown > 0 {
        eprintln!("skipped: {unknown} events of types this version does not know");
    }
    for a in &h.assumptions {
        eprintln!("assumed: {a}");
    }
    Ok(())
}

/// The events read, and how many lines were of types this version does not know.
struct Read {
    events: Vec<Event>,
    unknown: usize,
    /// With `--lenient`: lines that were not events.
    malformed: usize,
}

/// Every event of the files (an id seen twice counts once), or of the NATS stream. A line of an
/// event type this version does not know is counted and skipped (a newer scheduler's stream);
/// a line that is not an event stops the command, or with `--lenient` is reported and skipped.
fn read_events(args: &FromEventsArgs) -> anyhow::Result<Read> {
    let mut events = Vec::new();
    if let Some(config) = args.nats.config()? {
        anyhow::ensure!(args.file.is_empty(), "give --file or --nats, not both");
        let filter = wasmsched_events::Filter::default();
        let options = wasmsched_events::TailOptions { from_start: true, follow: false };
        wasmsched_events::tail(&config, &filter, &options, |e| {
            events.push(e);
            true
        })?;
        return Ok(Read { events, unknown: 0, malformed: 0 });
    }
    anyhow::ensure!(!args.file.is_empty(), "give --file FILE (repeatable) or --nats URL");
    let known: std::collections::HashSet<&str> = Kind::ALL.iter().map(|k| k.event_type()).collect();
    let (mut seen, mut unknown, mut malformed) = (std::collections::HashSet::new(), 0, 0);
    for path in &args.file {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |e: &dyn std::fmt::Display| format!("{}:{}: not an event: {e}", path.display(), n + 1);
            let parsed = serde_json::from_str::<serde_json::Value>(&line).map_err(|e| bad(&e)).and_then(|v| {
                match v.get("type").and_then(serde_json::Value::as_str) {
                    Some(t) if !known.contains(t) => Ok(None),
                    _ => serde_json::from_value::<Event>(v).map(Some).map_err(|e| bad(&e)),
                }
            });
            match parsed {
                Ok(Some(e)) => {
                    if seen.insert(e.id.clone()) {
                        events.push(e);
                    }
                }
                Ok(None) => unknown += 1,
                Err(why) if args.lenient => {
                    malformed += 1;
                    tracing::warn!("skipped: {why}");
                }
                Err(why) => anyhow::bail!("{why} (--lenient skips such lines)"),
            }
        }
    }
    Ok(Read { events, unknown, malformed })
}
