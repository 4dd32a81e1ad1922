//! A usage report: each run's holdings times the part of it inside the window, summed per group;
//! queueing delays of the tasks first placed in the window; each queue's use beside what it
//! deserved; and whatever makes the report incomplete.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ahash::AHashMap;
use serde::Serialize;
use wasmsched_events::Timestamp;

use crate::ledger::{End, Held, Labels, Ledger};
use crate::sequence::Gap;
use crate::{Dimension, Dropped, Intake};

/// An `End` whose `started` is this close to a `task-scheduled` time closes that run even when the
/// two differ (a publisher that restarted and took the start from the pod, to the second).
const MATCH_WITHIN_MS: u64 = 1000;

/// What to report.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// Window start (ms since the epoch); default: the first event read.
    pub from: Option<u64>,
    /// Window end; default: the last event read. Runs still going on are billed up to here.
    pub to: Option<u64>,
    /// Group rows by these, in this order; none: one row.
    pub by: Vec<Dimension>,
}

/// Queueing delay (submission to first placement) of the tasks first placed in the window, s.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Delay {
    /// Tasks measured.
    pub tasks: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Longest.
    pub max: f64,
}

/// A queue's use of the pool beside its fair share, over the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Share {
    /// GPUs it held on average.
    pub used_gpus: f64,
    /// Its part of all GPU time used, %.
    pub used_percent: f64,
    /// GPUs it deserved on average (from `queue-share-changed`; over the part of the window where
    /// it was known).
    pub deserved_gpus: Option<f64>,
    /// Its part of all queues' deserved GPUs, %.
    pub deserved_percent: Option<f64>,
}

/// One group's usage. Exact integer totals beside the hours.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Row {
    /// The group: one value per dimension of the query.
    #[serde(flatten)]
    pub key: BTreeMap<String, String>,
    /// GPU-hours held (whole GPUs and shares, as allocated).
    pub gpu_hours: f64,
    /// Of those, runs evicted without a checkpoint: work thrown away.
    pub lost_gpu_hours: f64,
    /// CPU core-hours requested.
    pub cpu_core_hours: f64,
    /// Memory GiB-hours requested.
    pub memory_gib_hours: f64,
    /// Milli-GPU-seconds (exact; `gpu_hours` × 3.6 M).
    pub gpu_milli_seconds: u64,
    /// Lost milli-GPU-seconds.
    pub lost_gpu_milli_seconds: u64,
    /// Milli-core-seconds.
    pub cpu_milli_seconds: u64,
    /// Byte-seconds.
    pub memory_byte_seconds: u128,
    /// Runs with time inside the window.
    pub runs: u64,
    /// Of those, still going on at its end.
    pub running_at_end: u64,
    /// Queueing delay of tasks first placed in the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<Delay>,
    /// With `--by queue` alone: its share of the pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<Share>,
}

/// A hole in the stream that touches the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Missing {
    /// How it was found: `sequence` (numbers missing) or `dropped` (the publisher said so).
    pub found_by: &'static str,
    /// The publisher, for a sequence gap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// Events missing.
    pub events: u64,
    /// The window they fall in (RFC 3339); `from` absent when before the first event read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Until.
    pub to: String,
}

/// A usage report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Window start (RFC 3339).
    pub from: String,
    /// Window end.
    pub to: String,
    /// The dimensions of the rows.
    pub by: Vec<String>,
    /// One per group with usage in the window, by key.
    pub rows: Vec<Row>,
    /// All groups together.
    pub total: Row,
    /// Holes in the stream within the window: usage there is unknown.
    pub missing: Vec<Missing>,
    /// What was read.
    pub intake: Intake,
    /// No holes in the window and no malformed events: the totals are exact.
    pub complete: bool,
}

/// A run as billed: when it began, what it held, how it ended (none: going on).
struct Settled {
    started: u64,
    held: Held,
    end: Option<End>,
}

/// A task's runs of which only the start, or only the end, was read: (started, what).
type Halves = (Vec<(u64, Held)>, Vec<(u64, End)>);

/// Every run, each start paired with its end.
fn settle(ledger: &Ledger) -> Vec<Settled> {
    let mut out = Vec::with_capacity(ledger.runs.len());
    // Runs of which only one side was read, per task, for pairing within MATCH_WITHIN_MS.
    let mut halves: AHashMap<u32, Halves> = AHashMap::new();
    for (&(task, started), run) in &ledger.runs {
        match (run.start, run.end) {
            (Some(_), Some(end)) => out.push(Settled { started, held: end.held, end: Some(end) }),
            (Some(held), None) => halves.entry(task).or_default().0.push((started, held)),
            (None, Some(end)) => halves.entry(task).or_default().1.push((started, end)),
            (None, None) => {}
        }
    }
    for (mut starts, mut ends) in halves.into_values() {
        starts.sort_by_key(|s| s.0);
        ends.sort_by_key(|e| e.0);
        let mut unmatched_ends = Vec::new();
        for (started, end) in ends {
            match starts.iter().position(|(s, _)| s.abs_diff(started) <= MATCH_WITHIN_MS) {
                Some(i) => {
                    let (s, _) = starts.remove(i);
                    out.push(Settled { started: s, held: end.held, end: Some(end) });
                }
                None => unmatched_ends.push((started, end)),
            }
        }
        out.extend(unmatched_ends.into_iter().map(|(started, end)| Settled {
            started,
            held: end.held,
            end: Some(end),
        }));
        out.extend(starts.into_iter().map(|(started, held)| Settled { started, held, end: None }));
    }
    out
}

#[derive(Default)]
struct Sums {
    gpu: u128,
    lost: u128,
    cpu: u128,
    memory: u128,
    runs: u64,
    running: u64,
    delays: Vec<u64>,
}

impl Sums {
    fn row(&self, key: BTreeMap<String, String>) -> Row {
        const HOUR_MS: f64 = 3_600_000.0;
        let per_second = |v: u128| v / 1000;
        Row {
            key,
            gpu_hours: self.gpu as f64 / 1000.0 / HOUR_MS,
            lost_gpu_hours: self.lost as f64 / 1000.0 / HOUR_MS,
            cpu_core_hours: self.cpu as f64 / 1000.0 / HOUR_MS,
            memory_gib_hours: self.memory as f64 / f64::from(1u32 << 30) / HOUR_MS,
            gpu_milli_seconds: per_second(self.gpu) as u64,
            lost_gpu_milli_seconds: per_second(self.lost) as u64,
            cpu_milli_seconds: per_second(self.cpu) as u64,
            memory_byte_seconds: per_second(self.memory),
            runs: self.runs,
            running_at_end: self.running,
            delay: delay(&self.delays),
            share: None,
        }
    }

    fn add(&mut self, other: &Sums) {
        self.gpu += other.gpu;
        self.lost += other.lost;
        self.cpu += other.cpu;
        self.memory += other.memory;
        self.runs += other.runs;
        self.running += other.running;
        self.delays.extend_from_slice(&other.delays);
    }
}

fn delay(delays_ms: &[u64]) -> Option<Delay> {
    if delays_ms.is_empty() {
        return None;
    }
    let mut d = delays_ms.to_vec();
    d.sort_unstable();
    let at = |p: f64| {
        let rank = ((p / 100.0) * d.len() as f64).ceil() as usize;
        d[rank.clamp(1, d.len()) - 1] as f64 / 1000.0
    };
    Some(Delay { tasks: d.len() as u64, p50: at(50.0), p90: at(90.0), p99: at(99.0), max: at(100.0) })
}

impl Ledger {
    /// The report of `query`.
    pub fn report(&self, query: &Query) -> Report {
        let (first, last) = self.span.unwrap_or((0, 0));
        let from = query.from.unwrap_or(first);
        let to = query.to.unwrap_or(last).max(from);
        let key_of = |l: &Labels| -> Vec<u32> {
            query
                .by
                .iter()
                .map(|d| match d {
                    Dimension::Queue => l.queue,
                    Dimension::Namespace => l.namespace,
                    Dimension::Model => l.model,
                    Dimension::Kind => l.kind,
                    Dimension::Pool => l.pool,
                })
                .collect()
        };
        let mut groups: BTreeMap<Vec<u32>, Sums> = BTreeMap::new();
        for run in settle(self) {
            let end = run.end.map_or(to, |e| e.at);
            if end < from || run.started > to || end < run.started {
                continue;
            }
            let (a, b) = (run.started.max(from), end.min(to));
            let ms = u128::from(b.saturating_sub(a));
            let h = run.held;
            let sums = groups.entry(key_of(&h.labels)).or_default();
            sums.gpu += u128::from(h.gpu_milli) * ms;
            sums.cpu += u128::from(h.cpu_milli) * ms;
            sums.memory += u128::from(h.memory_bytes) * ms;
            if run.end.is_some_and(|e| e.lost) {
                sums.lost += u128::from(h.gpu_milli) * ms;
            }
            sums.runs += 1;
            sums.running += u64::from(run.end.is_none_or(|e| e.at > to));
        }
        for record in self.tasks.iter().flatten() {
            if (from..to.max(from + 1)).contains(&record.first_start)
                && let Some(submitted) = record.submitted.filter(|&s| s <= record.first_start)
            {
                groups.entry(key_of(&record.labels)).or_default().delays.push(record.first_start - submitted);
            }
        }
        let names: Vec<String> = query.by.iter().map(|d| d.name().to_string()).collect();
        let mut total = Sums::default();
        let mut rows = Vec::with_capacity(groups.len());
        for (key, sums) in &groups {
            total.add(sums);
            let key = names.iter().cloned().zip(key.iter().map(|&id| self.names.get(id).to_string())).collect();
            rows.push(sums.row(key));
        }
        // By name: the interned order is the reading order, which must not show.
        rows.sort_by(|a, b| names.iter().map(|n| &a.key[n]).cmp(names.iter().map(|n| &b.key[n])));
        if query.by == [Dimension::Queue] {
            self.shares(&mut rows, from, to);
        }
        let missing = self.missing(from, to);
        let intake = self.intake.clone();
        Report {
            from: Timestamp(from).to_string(),
            to: Timestamp(to).to_string(),
            by: names,
            rows,
            total: total.row(BTreeMap::new()),
            complete: missing.is_empty() && intake.malformed == 0,
            missing,
            intake,
        }
    }

    /// Each queue row's use beside its deserved share.
    fn shares(&self, rows: &mut [Row], from: u64, to: u64) {
        let window = to.saturating_sub(from);
        if window == 0 {
            return;
        }
        let used_total: u64 = rows.iter().map(|r| r.gpu_milli_seconds).sum();
        let deserved: Vec<Option<f64>> = rows
            .iter()
            .map(|r| {
                let q = self.names.names.iter().position(|n| **n == *r.key.get("queue").map_or("", String::as_str))?;
                mean_deserved(self.deserved.get(&(q as u32))?, from, to)
            })
            .collect();
        let deserved_total: f64 = deserved.iter().flatten().sum();
        for (row, deserved) in rows.iter_mut().zip(deserved) {
            row.share = Some(Share {
                used_gpus: row.gpu_milli_seconds as f64 / (window as f64),
                used_percent: if used_total > 0 {
                    100.0 * row.gpu_milli_seconds as f64 / used_total as f64
                } else {
                    0.0
                },
                deserved_gpus: deserved,
                deserved_percent: deserved.filter(|_| deserved_total > 0.0).map(|d| 100.0 * d / deserved_total),
            });
        }
    }

    /// Holes touching `[from, to]`.
    fn missing(&self, from: u64, to: u64) -> Vec<Missing> {
        let touches = |a: Option<u64>, b: u64| a.unwrap_or(0) <= to && b >= from;
        let gaps = self.gaps();
        let reported = self.reported_gaps(&gaps);
        let mut out: Vec<Missing> = gaps
            .into_iter()
            .filter(|g: &Gap| !reported.contains(&(g.publisher.clone(), g.from_seq)))
            .filter(|g: &Gap| touches(g.after, g.before))
            .map(|g| Missing {
                found_by: "sequence",
                events: g.to_seq - g.from_seq + 1,
                from: g.after.map(|t| Timestamp(t).to_string()),
                to: Timestamp(g.before).to_string(),
                publisher: Some(g.publisher),
            })
            .collect();
        out.extend(self.dropped.iter().filter(|d: &&Dropped| touches(Some(d.first), d.last)).map(|d| Missing {
            found_by: "dropped",
            publisher: None,
            events: d.count,
            from: Some(Timestamp(d.first).to_string()),
            to: Timestamp(d.last).to_string(),
        }));
        out
    }
}

impl Ledger {
    /// The numbering gaps (publisher, first missing number) that drop reports account for: a
    /// publisher numbers the events it drops, so each report follows the gaps of the events it
    /// counts. The gaps between a report and the publisher's previous one are its, when they add
    /// up to its count; then the hole is listed once, as the report.
    fn reported_gaps(&self, gaps: &[Gap]) -> std::collections::BTreeSet<(String, u64)> {
        let mut by_publisher: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
        for d in &self.dropped {
            if let Some((publisher, seq)) = &d.reported_as {
                by_publisher.entry(publisher).or_default().push((*seq, d.count));
            }
        }
        let mut out = std::collections::BTreeSet::new();
        for (publisher, mut reports) in by_publisher {
            reports.sort_unstable();
            let mut after = 0;
            for (seq, count) in reports {
                let mine: Vec<&Gap> =
                    gaps.iter().filter(|g| g.publisher == publisher && g.from_seq > after && g.to_seq < seq).collect();
                if mine.iter().map(|g| g.to_seq - g.from_seq + 1).sum::<u64>() == count {
                    out.extend(mine.iter().map(|g| (g.publisher.clone(), g.from_seq)));
                }
                after = seq;
            }
        }
        out
    }
}

/// Mean GPUs (milli / 1000) deserved over the part of `[from, to)` where a value was known.
fn mean_deserved(steps: &[(u64, u64)], from: u64, to: u64) -> Option<f64> {
    let mut steps = steps.to_vec();
    steps.sort_by_key(|s| s.0);
    let (mut weighted, mut covered) = (0f64, 0u64);
    for (i, &(at, milli)) in steps.iter().enumerate() {
        let until = steps.get(i + 1).map_or(to, |s| s.0);
        let (a, b) = (at.max(from), until.min(to));
        if b > a {
            weighted += milli as f64 * (b - a) as f64;
            covered += b - a;
        }
    }
    (covered > 0).then(|| weighted / covered as f64 / 1000.0)
}

impl Report {
    /// A table for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "usage from {} to {}", self.from, self.to);
        let mut header: Vec<String> = self.by.clone();
        header.extend(
            ["GPU-h", "lost GPU-h", "CPU core-h", "mem GiB-h", "runs", "delay p50 s", "p90 s", "p99 s"]
                .map(String::from),
        );
        let with_share = self.rows.iter().any(|r| r.share.is_some());
        if with_share {
            header.extend(["used GPUs", "deserved GPUs"].map(String::from));
        }
        let mut table = vec![header];
        let total_key: BTreeMap<String, String> = self
            .by
            .iter()
            .enumerate()
            .map(|(i, d)| (d.clone(), if i == 0 { "total".into() } else { String::new() }))
            .collect();
        for row in self.rows.iter().chain(std::iter::once(&Row { key: total_key, ..self.total.clone() })) {
            let mut cells: Vec<String> = self.by.iter().map(|d| row.key.get(d).cloned().unwrap_or_default()).collect();
            cells.extend([
                format!("{:.3}", row.gpu_hours),
                format!("{:.3}", row.lost_gpu_hours),
                format!("{:.3}", row.cpu_core_hours),
                format!("{:.3}", row.memory_gib_hours),
                row.runs.to_string(),
            ]);
            match &row.delay {
                Some(d) => cells.extend([d.p50, d.p90, d.p99].map(|v| format!("{v:.0}"))),
                None => cells.extend(["-", "-", "-"].map(String::from)),
            }
            if with_share {
                match &row.share {
                    Some(s) => cells.extend([
                        format!("{:.2}", s.used_gpus),
                        s.deserved_gpus.map_or_else(|| "-".into(), |d| format!("{d:.2}")),
                    ]),
                    None => cells.extend(["", ""].map(String::from)),
                }
            }
            table.push(cells);
        }
        let widths: Vec<usize> =
            (0..table[0].len()).map(|c| table.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        for row in &table {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(c, v)| {
                    if c < self.by.len() {
                        format!("{v:<w$}", w = widths[c])
                    } else {
                        format!("{v:>w$}", w = widths[c])
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
        for m in &self.missing {
            let from = m.from.as_deref().unwrap_or("the start");
            let _ = writeln!(out, "missing: {} events between {from} and {} ({})", m.events, m.to, m.found_by);
        }
        if self.intake.malformed > 0 {
            let _ = writeln!(out, "malformed: {} events not billed", self.intake.malformed);
        }
        for (kind, n) in &self.intake.unknown_types {
            let _ = writeln!(out, "skipped: {n} events of unknown type {kind}");
        }
        out
    }

    /// CSV: one line per row (the total last), exact integer columns included.
    pub fn csv(&self) -> String {
        let mut out = String::new();
        let mut header: Vec<String> = self.by.clone();
        header.extend(
            [
                "gpu_hours",
                "lost_gpu_hours",
                "cpu_core_hours",
                "memory_gib_hours",
                "gpu_milli_seconds",
                "lost_gpu_milli_seconds",
                "cpu_milli_seconds",
                "memory_byte_seconds",
                "runs",
                "running_at_end",
                "delay_tasks",
                "delay_p50_s",
                "delay_p90_s",
                "delay_p99_s",
                "delay_max_s",
                "used_gpus",
                "deserved_gpus",
            ]
            .map(String::from),
        );
        let _ = writeln!(out, "{}", header.join(","));
        let total =
            Row { key: self.by.iter().map(|d| (d.clone(), "total".to_string())).collect(), ..self.total.clone() };
        for row in self.rows.iter().chain(std::iter::once(&total)) {
            let mut cells: Vec<String> =
                self.by.iter().map(|d| csv_field(row.key.get(d).map_or("", String::as_str))).collect();
            cells.extend([
                row.gpu_hours.to_string(),
                row.lost_gpu_hours.to_string(),
                row.cpu_core_hours.to_string(),
                row.memory_gib_hours.to_string(),
                row.gpu_milli_seconds.to_string(),
                row.lost_gpu_milli_seconds.to_string(),
                row.cpu_milli_seconds.to_string(),
                row.memory_byte_seconds.to_string(),
                row.runs.to_string(),
                row.running_at_end.to_string(),
            ]);
            match &row.delay {
                Some(d) => cells.extend([d.tasks as f64, d.p50, d.p90, d.p99, d.max].map(|v| v.to_string())),
                None => cells.extend(["0", "", "", "", ""].map(String::from)),
            }
            let share = row.share.as_ref();
            cells.push(share.map_or_else(String::new, |s| s.used_gpus.to_string()));
            cells.push(share.and_then(|s| s.deserved_gpus).map_or_else(String::new, |d| d.to_string()));
            let _ = writeln!(out, "{}", cells.join(","));
        }
        out
    }
}

/// A CSV field, quoted when it must be.
fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) { format!("\"{}\"", v.replace('"', "\"\"")) } else { v.to_string() }
}
