//! What usage reads from an event: a run began, a run ended, a queue's deserved share moved, events
//! were dropped upstream — parsed straight from a JSONL line, borrowing its text, without building
//! the whole [`Event`](wasmsched_events::Event): reading is what a usage report spends its time on.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use wasmsched_events::Timestamp;
use wasmsched_events::schema::{EndReason, GpuShare, Payload, Quantity};

/// The event types usage reads.
const SCHEDULED: &str = "io.wasmsched.task.scheduled.v1";
const ENDED: &str = "io.wasmsched.task.ended.v1";
const SHARE: &str = "io.wasmsched.queue.share-changed.v1";
const DROPPED: &str = "io.wasmsched.events.dropped.v1";

/// A task as a run names it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskName<'a> {
    pub namespace: &'a str,
    pub id: &'a str,
    pub queue: &'a str,
}

/// What a run holds, and where.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Holding<'a> {
    pub gpu_milli: u64,
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub model: Option<&'a str>,
    /// None for NVIDIA's kind (and CPU-only runs: `model` says which).
    pub kind: Option<&'a str>,
    pub pool: Option<&'a str>,
}

/// One thing usage learns from an event.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fact<'a> {
    /// A run began at `at` (a `task-scheduled` event).
    Start { task: TaskName<'a>, at: u64, holding: Holding<'a>, submitted: Option<u64> },
    /// The run that began at `started` is over at `at` (a `task-ended` event).
    End { task: TaskName<'a>, started: u64, at: u64, holding: Holding<'a>, lost: bool },
    /// `queue` deserves `gpu_milli` from `at` on.
    Deserved { queue: &'a str, at: u64, gpu_milli: u64 },
    /// The publisher dropped `count` events between `first` and `last`.
    Dropped { first: u64, last: u64, count: u64 },
    /// An event usage has no use for (another known type).
    Other,
    /// An event of a type this version does not know (a newer version, another producer).
    Unknown(&'a str),
}

/// An event's envelope.
pub(crate) struct Envelope<'a> {
    pub id: Cow<'a, str>,
    pub time: Timestamp,
    pub kind: Cow<'a, str>,
}

/// The envelope with its data unparsed: the slow path, to say what is wrong with a line.
#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    time: Timestamp,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

/// Text borrowed from the line where it has no escapes.
#[derive(Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The envelope's fields.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Id,
    Time,
    Type,
    Data,
    #[serde(other)]
    Other,
}

/// One pass over a line: the data is parsed as its type says when `type` comes first (as the
/// sinks write it), else kept raw and parsed after. The data of a type usage does not read is not
/// parsed at all: the pass stops there, with the envelope in `skipped`.
struct LineSeed<'s, 'de> {
    skipped: &'s mut Option<Envelope<'de>>,
}

/// The error that stops a pass at an event whose data usage does not read.
const SKIP: &str = "usage: data not read";

impl<'de> serde::de::DeserializeSeed<'de> for LineSeed<'_, 'de> {
    type Value = Parsed<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Parsed<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for LineSeed<'_, 'de> {
    type Value = Parsed<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an event")
    }

    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Parsed<'de>, M::Error> {
        use serde::de::Error as _;
        let (mut id, mut time, mut kind, mut data, mut raw) = (None, None, None, None, None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Id => id = Some(map.next_value::<Text<'de>>()?.0),
                Key::Time => time = Some(map.next_value::<Timestamp>()?),
                Key::Type => kind = Some(map.next_value::<Text<'de>>()?.0),
                Key::Data if kind.as_deref().is_some_and(|k| !billed(k)) && id.is_some() && time.is_some() => {
                    *self.skipped = id.zip(time).zip(kind).map(|((id, time), kind)| Envelope { id, time, kind });
                    return Err(M::Error::custom(SKIP));
                }
                Key::Data => match kind.as_deref() {
                    Some(k) => data = Some(map.next_value_seed(DataSeed(k))?),
                    None => raw = Some(map.next_value::<&'de RawValue>()?),
                },
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let (Some(id), Some(time), Some(kind)) = (id, time, kind) else {
            return Err(M::Error::custom("an event needs `id`, `time` and `type`"));
        };
        let data = match data {
            Some(d) => d,
            None => {
                let raw = raw.map_or("null", RawValue::get);
                let mut de = serde_json::Deserializer::from_str(raw);
                serde::de::DeserializeSeed::deserialize(DataSeed(&kind), &mut de).map_err(M::Error::custom)?
            }
        };
        Ok(Parsed { envelope: Envelope { id, time, kind }, data })
    }
}

/// Whether usage reads the data of events of type `kind`.
fn billed(kind: &str) -> bool {
    matches!(kind, SCHEDULED | ENDED | SHARE | DROPPED)
}

/// Parses `data` as the type `.0` says.
struct DataSeed<'k>(&'k str);

impl<'de> serde::de::DeserializeSeed<'de> for DataSeed<'_> {
    type Value = Data<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Data<'de>, D::Error> {
        Ok(match self.0 {
            SCHEDULED => Data::Scheduled(ScheduledData::deserialize(d)?),
            ENDED => Data::Ended(EndedData::deserialize(d)?),
            SHARE => Data::Share(ShareData::deserialize(d)?),
            DROPPED => Data::Dropped(DroppedData::deserialize(d)?),
            kind => {
                serde::de::IgnoredAny::deserialize(d)?;
                if known_type(kind) { Data::Other } else { Data::Unknown }
            }
        })
    }
}

#[derive(Deserialize)]
struct TaskData<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    queue: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ScheduledData<'a> {
    #[serde(borrow)]
    task: TaskData<'a>,
    #[serde(default)]
    gpus: Vec<GpuShare>,
    #[serde(default)]
    allocated: Quantity,
    #[serde(borrow, default)]
    gpu_model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    gpu_kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    node_pool: Option<Cow<'a, str>>,
    #[serde(default)]
    submitted: Option<Timestamp>,
}

#[derive(Deserialize)]
struct EndedData<'a> {
    #[serde(borrow)]
    task: TaskData<'a>,
    started: Timestamp,
    #[serde(default)]
    gpus: Vec<GpuShare>,
    #[serde(default)]
    allocated: Quantity,
    #[serde(borrow, default)]
    gpu_model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    gpu_kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    node_pool: Option<Cow<'a, str>>,
    reason: EndReason,
    #[serde(default)]
    work_kept: bool,
}

#[derive(Deserialize)]
struct ShareData<'a> {
    #[serde(borrow)]
    queue: Cow<'a, str>,
    deserved: Quantity,
}

#[derive(Deserialize)]
struct DroppedData {
    count: u64,
    first: Timestamp,
    last: Timestamp,
}

/// Whether a run that ended for `reason` threw its work away.
pub(crate) fn lost(reason: EndReason, work_kept: bool) -> bool {
    matches!(reason, EndReason::Preempted | EndReason::Evicted) && !work_kept
}

/// GPUs held: the shares' sum (what was allocated), which `allocated.gpu_milli` repeats.
fn gpu_milli(gpus: &[GpuShare]) -> u64 {
    gpus.iter().map(|g| u64::from(g.milli)).sum()
}

/// A parsed line, borrowing its text (owning it where the JSON escaped it); facts borrow from here.
pub(crate) struct Parsed<'a> {
    pub envelope: Envelope<'a>,
    data: Data<'a>,
}

enum Data<'a> {
    Scheduled(ScheduledData<'a>),
    Ended(EndedData<'a>),
    Share(ShareData<'a>),
    Dropped(DroppedData),
    Other,
    Unknown,
}

/// A line that is not an event, or an event whose data does not have its type's shape.
#[derive(Debug)]
pub(crate) struct Malformed {
    /// The event's id and time, when the envelope could be read.
    pub event: Option<(String, u64)>,
    /// What is wrong.
    pub message: String,
}

impl<'a> Parsed<'a> {
    /// Parse one JSONL line.
    pub(crate) fn line(line: &'a [u8]) -> Result<Parsed<'a>, Malformed> {
        let mut skipped = None;
        let parsed = match std::str::from_utf8(line) {
            Ok(text) => {
                let mut de = serde_json::Deserializer::from_str(text);
                serde::de::DeserializeSeed::deserialize(LineSeed { skipped: &mut skipped }, &mut de)
                    .and_then(|p| de.end().map(|()| p))
            }
            Err(_) => {
                let mut de = serde_json::Deserializer::from_slice(line);
                serde::de::DeserializeSeed::deserialize(LineSeed { skipped: &mut skipped }, &mut de)
                    .and_then(|p| de.end().map(|()| p))
            }
        };
        match (parsed, skipped) {
            (Ok(parsed), _) => Ok(parsed),
            // Not read past its type: another kind of event, or one this version does not know
            // (the rest of the line is not checked).
            (Err(_), Some(envelope)) => {
                let data = if known_type(&envelope.kind) { Data::Other } else { Data::Unknown };
                Ok(Parsed { envelope, data })
            }
            (Err(e), None) => Err(Self::what_is_wrong(line, e)),
        }
    }

    /// Why `line` did not parse: the envelope alone, then its data, so that an event whose data is
    /// broken is named by its id and time.
    #[cold]
    fn what_is_wrong(line: &[u8], error: serde_json::Error) -> Malformed {
        let Ok(envelope) = serde_json::from_slice::<RawEnvelope<'_>>(line) else {
            return Malformed { event: None, message: error.to_string() };
        };
        let raw = envelope.data.map_or("null", RawValue::get);
        let mut de = serde_json::Deserializer::from_str(raw);
        let message = match serde::de::DeserializeSeed::deserialize(DataSeed(&envelope.kind), &mut de) {
            Err(e) => format!("{}: {e}", envelope.kind),
            Ok(_) => error.to_string(),
        };
        Malformed { event: Some((envelope.id.into_owned(), envelope.time.millis())), message }
    }

    /// The fact the event states.
    pub(crate) fn fact(&self) -> Fact<'_> {
        let at = self.envelope.time.millis();
        match &self.data {
            Data::Scheduled(d) => Fact::Start {
                task: task_name(&d.task),
                at,
                holding: holding(
                    &d.gpus,
                    &d.allocated,
                    (d.gpu_model.as_deref(), d.gpu_kind.as_deref()),
                    d.node_pool.as_deref(),
                ),
                submitted: d.submitted.map(Timestamp::millis),
            },
            Data::Ended(d) => Fact::End {
                task: task_name(&d.task),
                started: d.started.millis(),
                at,
                holding: holding(
                    &d.gpus,
                    &d.allocated,
                    (d.gpu_model.as_deref(), d.gpu_kind.as_deref()),
                    d.node_pool.as_deref(),
                ),
                lost: lost(d.reason, d.work_kept),
            },
            Data::Share(d) => Fact::Deserved { queue: &d.queue, at, gpu_milli: d.deserved.gpu_milli },
            Data::Dropped(d) => Fact::Dropped { first: d.first.millis(), last: d.last.millis(), count: d.count },
            Data::Other => Fact::Other,
            Data::Unknown => Fact::Unknown(&self.envelope.kind),
        }
    }
}

fn task_name<'a>(t: &'a TaskData<'_>) -> TaskName<'a> {
    TaskName { namespace: &t.namespace, id: &t.id, queue: &t.queue }
}

fn holding<'a>(
    gpus: &[GpuShare],
    q: &Quantity,
    (model, kind): (Option<&'a str>, Option<&'a str>),
    pool: Option<&'a str>,
) -> Holding<'a> {
    Holding { gpu_milli: gpu_milli(gpus), cpu_milli: q.cpu_milli, memory_bytes: q.memory_bytes, model, kind, pool }
}

/// Whether `kind` is a type of this version of the schema.
fn known_type(kind: &str) -> bool {
    wasmsched_events::Kind::ALL.iter().any(|k| k.event_type() == kind)
}

/// The fact of a typed event (the scheduler's own, for its meter).
pub(crate) fn of_payload(time: Timestamp, payload: &Payload) -> Fact<'_> {
    let at = time.millis();
    fn name(t: &wasmsched_events::schema::TaskRef) -> TaskName<'_> {
        TaskName { namespace: &t.namespace, id: &t.id, queue: &t.queue }
    }
    match payload {
        Payload::TaskScheduled(d) => Fact::Start {
            task: name(&d.task),
            at,
            holding: holding(
                &d.gpus,
                &d.allocated,
                (d.gpu_model.as_deref(), d.gpu_kind.as_deref()),
                d.node_pool.as_deref(),
            ),
            submitted: d.submitted.map(Timestamp::millis),
        },
        Payload::TaskEnded(d) => Fact::End {
            task: name(&d.task),
            started: d.started.millis(),
            at,
            holding: holding(
                &d.gpus,
                &d.allocated,
                (d.gpu_model.as_deref(), d.gpu_kind.as_deref()),
                d.node_pool.as_deref(),
            ),
            lost: lost(d.reason, d.work_kept),
        },
        Payload::QueueShareChanged(d) => Fact::Deserved { queue: &d.queue, at, gpu_milli: d.deserved.gpu_milli },
        Payload::EventsDropped(d) => Fact::Dropped { first: d.first.millis(), last: d.last.millis(), count: d.count },
        _ => Fact::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULED_DATA: &str = r#"{"task":{"id":"p","namespace":"ns","queue":"q"},"node":"n","gpus":[{"gpu":1,"milli":500}],"allocated":{"cpu_milli":2000,"memory_bytes":1024,"gpu_milli":500},"gpu_model":"A\u0031","submitted":"2026-11-26T00:00:00Z"}"#;

    fn line(kind: &str, data: &str, type_first: bool) -> String {
        let head = r#"{"specversion":"1.0","id":"pub-7","source":"s","time":"2026-11-26T00:00:01.5Z","subject":"p""#;
        if type_first {
            format!(r#"{head},"type":"{kind}","data":{data}}}"#)
        } else {
            format!(r#"{head},"data":{data},"type":"{kind}"}}"#)
        }
    }

    #[test]
    fn a_placement_parses_whichever_comes_first_its_type_or_its_data() {
        for type_first in [true, false] {
            let text = line(SCHEDULED, SCHEDULED_DATA, type_first);
            let parsed = Parsed::line(text.as_bytes()).unwrap();
            assert_eq!((parsed.envelope.id.as_ref(), parsed.envelope.time.millis()), ("pub-7", 1_795_651_201_500));
            let Fact::Start { task, at, holding, submitted } = parsed.fact() else { panic!("not a start") };
            assert_eq!((task.namespace, task.id, task.queue, at), ("ns", "p", "q", 1_795_651_201_500));
            // An escaped string is unescaped (`\u0031` is `1`).
            assert_eq!((holding.gpu_milli, holding.cpu_milli, holding.model), (500, 2000, Some("A1")));
            assert_eq!(submitted, Some(1_795_651_200_000));
        }
    }

    #[test]
    fn events_usage_does_not_bill_keep_their_id_and_time_and_their_data_is_not_read() {
        // Another known type: its data is not parsed (here it would not be a placement's).
        let text = line("io.wasmsched.task.unschedulable.v1", r#"{"not":"read"#, true);
        let parsed = Parsed::line(text.as_bytes()).unwrap();
        assert!(matches!(parsed.fact(), Fact::Other));
        assert_eq!(parsed.envelope.id.as_ref(), "pub-7");
        let text = line("io.wasmsched.task.scheduled.v9", "{}", true);
        assert!(matches!(
            Parsed::line(text.as_bytes()).unwrap().fact(),
            Fact::Unknown("io.wasmsched.task.scheduled.v9")
        ));
        // A billed type with broken data is malformed, named by its id.
        let text = line(ENDED, r#"{"task":{"id":"p","namespace":"ns","queue":"q"}}"#, true);
        let Err(m) = Parsed::line(text.as_bytes()) else { panic!("an end without `started` must not parse") };
        assert_eq!(m.event, Some(("pub-7".to_string(), 1_795_651_201_500)));
        assert!(m.message.contains("missing field `started`"), "{}", m.message);
        assert!(Parsed::line(b"\xff\xfe not text").is_err());
    }
}
