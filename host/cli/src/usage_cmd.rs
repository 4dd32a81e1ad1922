//! `wasmsched usage`: who used what — GPU-, CPU- and memory-hours per queue, namespace, GPU model
//! and node pool over a window — computed from the event stream alone (`docs/usage.md`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use wasmsched_events::Timestamp;
use wasmsched_usage::{Dimension, Ledger, Query, journal};

/// Arguments of `usage`.
#[derive(clap::Args)]
pub struct Args {
    /// Read this JSONL event file (repeatable: rotated files, or files from several schedulers;
    /// an event in two of them counts once).
    #[arg(long, value_name = "FILE", conflicts_with = "durable")]
    file: Vec<PathBuf>,
    #[command(flatten)]
    nats: crate::events_cmd::Nats,
    /// With `--nats`: the durable consumer to read with (created on first use from the stream's
    /// first event). Its position on the server moves only past events kept in `--journal`.
    #[arg(long, value_name = "NAME", requires = "journal")]
    durable: Option<String>,
    /// With `--nats`: the local journal (JSONL) the consumer's events are appended to before they
    /// are acknowledged; the report is computed from all of it. Keep it: it is the billing record
    /// once the stream's retention has let events go.
    #[arg(long, value_name = "FILE", requires = "durable")]
    journal: Option<PathBuf>,
    /// Group rows by these (comma-separated): queue, namespace, model, kind (accelerator vendor),
    /// pool.
    #[arg(long, value_delimiter = ',', default_value = "queue")]
    by: Vec<Dimension>,
    /// Window start, RFC 3339 (default: the first event).
    #[arg(long, value_parser = parse_time)]
    from: Option<Timestamp>,
    /// Window end, RFC 3339 (default: the last event); runs still going on are counted up to it.
    #[arg(long, value_parser = parse_time)]
    to: Option<Timestamp>,
    /// Print JSON.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV (one row per group, then the total).
    #[arg(long)]
    csv: bool,
    /// Exit 0 even when the report is incomplete (events missing in the window, or malformed).
    #[arg(long)]
    allow_gaps: bool,
}

fn parse_time(s: &str) -> Result<Timestamp, String> {
    Timestamp::parse(s)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let (Some(from), Some(to)) = (args.from, args.to) {
        anyhow::ensure!(from <= to, "--from {from} is after --to {to}");
    }
    let mut ledger = Ledger::new();
    match (&args.durable, &args.journal) {
        (Some(durable), Some(journal_path)) => {
            let config = args.nats.config()?.context("--durable reads NATS: give --nats URL")?;
            let appended = journal::pull(&config, durable, journal_path)
                .with_context(|| format!("reading consumer {durable} into {}", journal_path.display()))?;
            tracing::info!(appended, journal = %journal_path.display(), "events kept");
            journal::read_file(journal_path, &mut ledger)?;
        }
        _ => {
            anyhow::ensure!(!args.file.is_empty(), "give --file FILE, or --nats URL --durable NAME --journal FILE");
            for path in &args.file {
                journal::read_file(path, &mut ledger)?;
            }
        }
    }
    let query = Query { from: args.from.map(Timestamp::millis), to: args.to.map(Timestamp::millis), by: args.by };
    let report = ledger.report(&query);
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else if args.csv {
        report.csv()
    } else {
        report.text()
    };
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error of the report.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if !report.complete && !args.allow_gaps {
        let missing: u64 = report.missing.iter().map(|m| m.events).sum();
        anyhow::bail!(
            "the report is incomplete: {missing} events missing in the window and {} malformed (see above); \
             --allow-gaps to accept it",
            report.intake.malformed
        );
    }
    Ok(())
}
