//! [`Ledger`]: every run the events describe, read in any order, each event once.
//!
//! A run is keyed by its task and the instant it began: `task-scheduled` opens it at its own time,
//! `task-ended` closes the run that began at its `started`. The two can arrive in either order, or
//! one without the other (a stream that starts mid-run, a run still going on), and the ledger holds
//! whichever it has; a report decides at the end what each run billed. Nothing is summed while
//! reading, so reading the same events twice, or in another order, cannot change a total.

use std::collections::BTreeMap;

use ahash::AHashMap;
use serde::Serialize;
use wasmsched_events::Event;

use crate::facts::{Fact, Holding, Malformed, Parsed, TaskName, of_payload};
use crate::sequence::{Gap, Seen};

/// Interned names: queues, namespaces, GPU models and pools appear in every event, a few distinct.
#[derive(Default)]
pub(crate) struct Names {
    index: AHashMap<Box<str>, u32>,
    pub(crate) names: Vec<Box<str>>,
}

/// Name 0 is "none" (a CPU-only run's model, a node without a pool).
pub(crate) const NONE: u32 = 0;

impl Names {
    fn new() -> Names {
        let mut n = Names::default();
        n.id("-");
        n
    }

    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.index.insert(name.into(), i);
        i
    }

    pub(crate) fn get(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("-", |n| n)
    }
}

/// What a run is billed under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Labels {
    pub queue: u32,
    pub namespace: u32,
    pub model: u32,
    pub kind: u32,
    pub pool: u32,
}

/// What a run holds, under its labels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub gpu_milli: u64,
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub labels: Labels,
}

/// How a run ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct End {
    pub at: u64,
    pub lost: bool,
    pub held: Held,
}

impl End {
    /// Of two ends of one run (a new leader publishes again the ends it saw while it stood by —
    /// the old leader may have died before it did): the one that says the work was lost (the old
    /// leader knew it preempted the run; the standby saw only the pod deleted), else the earlier.
    fn or(self, other: End) -> End {
        match (self.lost, other.lost) {
            (true, false) => self,
            (false, true) => other,
            _ if other.at < self.at => other,
            _ => self,
        }
    }
}

/// One run: what its start and its end said, as far as they were read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Run {
    pub start: Option<Held>,
    pub end: Option<End>,
}

/// A task across its runs: when it was submitted and first placed (its queueing delay).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskRecord {
    pub submitted: Option<u64>,
    pub first_start: u64,
    pub labels: Labels,
}

/// Events the publisher said it dropped (`events-dropped`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Dropped {
    /// Events dropped.
    pub count: u64,
    /// Time of the first (ms since the epoch).
    pub first: u64,
    /// Time of the last.
    pub last: u64,
    /// The report's own publisher and sequence number: the publisher numbered the dropped events
    /// too, so they are also a hole in its numbering, just before the report — one hole, not two.
    #[serde(skip)]
    pub reported_as: Option<(String, u64)>,
}

/// What was read, and what could not be used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Intake {
    /// Events read, repeats included.
    pub events: u64,
    /// Events read again (same id): ignored.
    pub duplicates: u64,
    /// Lines that are not events, or events whose data has the wrong shape: never billed, and the
    /// report says it is incomplete.
    pub malformed: u64,
    /// The first few malformed lines, with where they were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub malformed_examples: Vec<String>,
    /// Events of types this version does not know, by type: skipped.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown_types: BTreeMap<String, u64>,
}

/// Malformed lines kept as examples.
const EXAMPLES: usize = 5;

/// Every run, task and deserved share the events describe.
pub struct Ledger {
    seen: Seen,
    pub(crate) names: Names,
    /// Tasks by `namespace/id` (a namespace has no `/`).
    task_ids: AHashMap<Box<str>, u32>,
    key: String,
    pub(crate) tasks: Vec<Option<TaskRecord>>,
    pub(crate) runs: AHashMap<(u32, u64), Run>,
    /// Per queue: (from, deserved milli-GPUs).
    pub(crate) deserved: AHashMap<u32, Vec<(u64, u64)>>,
    pub(crate) dropped: Vec<Dropped>,
    pub(crate) intake: Intake,
    /// The earliest and latest event time read.
    pub(crate) span: Option<(u64, u64)>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new()
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger {
            seen: Seen::default(),
            names: Names::new(),
            task_ids: AHashMap::new(),
            key: String::new(),
            tasks: Vec::new(),
            runs: AHashMap::new(),
            deserved: AHashMap::new(),
            dropped: Vec::new(),
            intake: Intake::default(),
            span: None,
        }
    }

    /// Read one JSONL line; `place` says where it came from, for a malformed line's report.
    pub fn read_line(&mut self, line: &[u8], place: impl FnOnce() -> String) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.take(Parsed::line(line), place);
    }

    /// Take the parse of one (non-blank) line.
    pub(crate) fn take(&mut self, parsed: Result<Parsed<'_>, Malformed>, place: impl FnOnce() -> String) {
        self.intake.events += 1;
        match parsed {
            Ok(parsed) => {
                let (id, time) = (&parsed.envelope.id, parsed.envelope.time.millis());
                if self.first_time(id, time) {
                    self.apply_from(id, parsed.fact());
                }
            }
            Err(Malformed { event, message }) => {
                // An event of a known type with broken data still took its number: not a gap too.
                if let Some((id, time)) = event
                    && !self.first_time(&id, time)
                {
                    return;
                }
                self.intake.malformed += 1;
                if self.intake.malformed_examples.len() < EXAMPLES {
                    self.intake.malformed_examples.push(format!("{}: {message}", place()));
                }
            }
        }
    }

    /// Read one event (the scheduler's own, or one a consumer decoded).
    pub fn read_event(&mut self, event: &Event) {
        self.intake.events += 1;
        if self.first_time(&event.id, event.time.millis()) {
            self.apply_from(&event.id, of_payload(event.time, &event.payload));
        }
    }

    fn first_time(&mut self, id: &str, time: u64) -> bool {
        if !self.seen.first_time(id, time) {
            self.intake.duplicates += 1;
            return false;
        }
        self.widen(time);
        true
    }

    fn widen(&mut self, time: u64) {
        self.span = Some(self.span.map_or((time, time), |(a, b)| (a.min(time), b.max(time))));
    }

    /// Events that never arrived, found from the publishers' numbering.
    pub fn gaps(&self) -> Vec<Gap> {
        self.seen.gaps()
    }

    /// What was read.
    pub fn intake(&self) -> &Intake {
        &self.intake
    }

    /// [`Ledger::apply`] of the event `id`'s fact, noting where a drop report sits in its
    /// publisher's numbering.
    fn apply_from(&mut self, id: &str, fact: Fact<'_>) {
        let reports = self.dropped.len();
        self.apply(fact);
        if let Some(d) = self.dropped.get_mut(reports) {
            d.reported_as = id.rsplit_once('-').and_then(|(p, s)| Some((p.to_string(), s.parse().ok()?)));
        }
    }

    fn apply(&mut self, fact: Fact<'_>) {
        match fact {
            Fact::Start { task, at, holding, submitted } => {
                let held = self.held(&task, &holding);
                let t = self.task(&task);
                let record = self.tasks[t as usize].get_or_insert(TaskRecord {
                    submitted,
                    first_start: at,
                    labels: held.labels,
                });
                if at < record.first_start {
                    record.first_start = at;
                    record.labels = held.labels;
                }
                record.submitted = record.submitted.or(submitted);
                self.runs.entry((t, at)).or_default().start = Some(held);
            }
            Fact::End { task, started, at, holding, lost } => {
                let held = self.held(&task, &holding);
                let t = self.task(&task);
                let record = self.tasks[t as usize].get_or_insert(TaskRecord {
                    submitted: None,
                    first_start: started,
                    labels: held.labels,
                });
                if started < record.first_start {
                    record.first_start = started;
                    record.labels = held.labels;
                }
                let end = End { at, lost, held };
                let run = self.runs.entry((t, started)).or_default();
                run.end = Some(match run.end {
                    Some(first) => first.or(end),
                    None => end,
                });
            }
            Fact::Deserved { queue, at, gpu_milli } => {
                let q = self.names.id(queue);
                self.deserved.entry(q).or_default().push((at, gpu_milli));
            }
            Fact::Dropped { first, last, count } => {
                self.dropped.push(Dropped { count, first, last, reported_as: None })
            }
            Fact::Other => {}
            Fact::Unknown(kind) => *self.intake.unknown_types.entry(kind.to_string()).or_default() += 1,
        }
    }

    fn held(&mut self, task: &TaskName<'_>, h: &Holding<'_>) -> Held {
        let labels = Labels {
            queue: self.names.id(task.queue),
            namespace: self.names.id(task.namespace),
            model: h.model.map_or(NONE, |m| self.names.id(m)),
            // A run with a model and no kind is on NVIDIA GPUs; one without either holds none.
            kind: match (h.kind, h.model) {
                (Some(k), _) => self.names.id(k),
                (None, Some(_)) => self.names.id("nvidia"),
                (None, None) => NONE,
            },
            pool: h.pool.map_or(NONE, |p| self.names.id(p)),
        };
        Held { gpu_milli: h.gpu_milli, cpu_milli: h.cpu_milli, memory_bytes: h.memory_bytes, labels }
    }

    fn task(&mut self, task: &TaskName<'_>) -> u32 {
        self.key.clear();
        self.key.push_str(task.namespace);
        self.key.push('/');
        self.key.push_str(task.id);
        if let Some(&t) = self.task_ids.get(self.key.as_str()) {
            return t;
        }
        let t = self.tasks.len() as u32;
        self.tasks.push(None);
        self.task_ids.insert(self.key.as_str().into(), t);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, time: &str, kind: &str, data: &str) -> String {
        format!(
            r#"{{"specversion":"1.0","id":"{id}","source":"s","time":"{time}","subject":"p","type":"io.wasmsched.{kind}.v1","data":{data}}}"#
        )
    }

    const TASK: &str = r#"{"id":"p","namespace":"ns","queue":"q"}"#;
    const HELD: &str =
        r#""node":"n","gpus":[{"gpu":0,"milli":1000}],"allocated":{"cpu_milli":0,"memory_bytes":0,"gpu_milli":1000}"#;

    fn ended(id: &str, time: &str, reason: &str) -> String {
        let data = format!(
            r#"{{"task":{TASK},{HELD},"started":"2026-11-29T00:00:00.000Z","reason":"{reason}","work_kept":false}}"#
        );
        event(id, time, "task.ended", &data)
    }

    #[test]
    fn a_run_ended_twice_after_a_fail_over_counts_once_and_the_lost_work_stands() {
        let scheduled =
            event("a-1", "2026-11-29T00:00:00.000Z", "task.scheduled", &format!(r#"{{"task":{TASK},{HELD}}}"#));
        let lines = [
            scheduled,
            // The old leader preempted it; the new one saw only its pod deleted, 2 ms earlier.
            ended("a-2", "2026-11-29T00:01:00.000Z", "preempted"),
            ended("b-1", "2026-11-29T00:00:59.998Z", "deleted"),
            // Its start, published again by the new leader.
            event("b-2", "2026-11-29T00:00:00.000Z", "task.scheduled", &format!(r#"{{"task":{TASK},{HELD}}}"#)),
        ];
        let mut ledger = Ledger::new();
        for l in &lines {
            ledger.read_line(l.as_bytes(), || "test".into());
        }
        let total = ledger.report(&crate::Query::default()).total;
        assert_eq!((total.runs, total.running_at_end), (1, 0));
        assert_eq!(total.gpu_milli_seconds, 60_000, "one run of 60 s on one GPU");
        assert_eq!(total.lost_gpu_milli_seconds, 60_000, "the preemption stands, not the deletion");
    }
}
