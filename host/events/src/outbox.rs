//! The outbox: events waiting to be delivered, in emission order, in bounded memory with an
//! optional spill to disk.
//!
//! The scheduler pushes; one drainer (the sink's thread) takes items, delivers them and acks them.
//! Items taken but not acked are still held: on a failed delivery the drainer puts them back at
//! the front, so order survives retries. Memory holds at most `max_events` items. Beyond that,
//! events go to spill segments on disk when a spill directory is configured (and keep going there
//! until the disk backlog is drained, so order holds), else they are dropped and counted. Spill
//! segments are deleted only once every record in them has been acked, and are read back on
//! start-up, so a restart of the scheduler while the server is away loses nothing that reached disk.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::record::Record;
use crate::time::Timestamp;

/// Limits of the outbox.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// Events held in memory (taken-but-unacked ones included).
    pub max_events: usize,
    /// Directory for spill segments; none disables spilling (overflow is dropped and counted).
    pub spill_dir: Option<PathBuf>,
    /// Bytes of spill on disk at most; beyond it events are dropped and counted.
    pub max_spill_bytes: u64,
    /// Size at which a spill segment is sealed and a new one started.
    pub segment_bytes: u64,
    /// When the outbox is full, `emit` waits for the drainer instead of dropping: for a source
    /// that can wait (the simulator's virtual clock), never for a scheduler serving a cluster.
    /// It stops waiting — and drops, counted and reported — only when the drainer has delivered
    /// nothing for [`WAIT_FOR_DRAINER`] (a destination that is gone).
    pub wait_when_full: bool,
}

/// How long a waiting `emit` gives a drainer that delivers nothing before it drops after all.
pub const WAIT_FOR_DRAINER: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            max_events: 100_000,
            spill_dir: None,
            max_spill_bytes: 1 << 30,
            segment_bytes: 16 << 20,
            wait_when_full: false,
        }
    }
}

/// An event ready for the wire.
#[derive(Clone, Debug)]
pub(crate) struct Encoded {
    pub subject: String,
    pub id: String,
    pub json: Bytes,
}

/// An emitted event before its envelope is built: the scheduler's thread only numbers and stamps
/// it; the drainer builds and serialises the envelope.
#[derive(Debug)]
pub(crate) struct Pending {
    pub seq: u64,
    pub time: Timestamp,
    pub payload: Record,
}

/// Builds the envelope and its wire form (id, source and subject depend on the sink).
pub(crate) type Encoder = dyn Fn(Pending) -> Encoded + Send + Sync;

#[derive(Debug)]
enum Body {
    Pending(Pending),
    Encoded(Encoded),
}

/// One held event.
#[derive(Debug)]
pub(crate) struct Item {
    body: Body,
    /// The spill segment it was read from.
    segment: Option<u64>,
}

impl Item {
    /// The wire form, moved out of a delivered item (which keeps only its spill segment, all an
    /// ack needs): keeping it for a re-send then costs no copy.
    pub fn take_encoded(&mut self, encode: &Encoder) -> Encoded {
        self.encoded(encode);
        let empty = Encoded { subject: String::new(), id: String::new(), json: Bytes::new() };
        match std::mem::replace(&mut self.body, Body::Encoded(empty)) {
            Body::Encoded(e) => e,
            Body::Pending(_) => unreachable!("encoded above"),
        }
    }

    /// The wire form, encoding on first use.
    pub fn encoded(&mut self, encode: &Encoder) -> &Encoded {
        if matches!(self.body, Body::Pending(_)) {
            let placeholder = Body::Encoded(Encoded { subject: String::new(), id: String::new(), json: Bytes::new() });
            if let Body::Pending(p) = std::mem::replace(&mut self.body, placeholder) {
                self.body = Body::Encoded(encode(p));
            }
        }
        match &self.body {
            Body::Encoded(e) => e,
            Body::Pending(_) => unreachable!("encoded above"),
        }
    }
}

/// Where a pushed event went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Memory,
    Spilled,
    Dropped,
}

struct Segment {
    id: u64,
    written: u64,
    read: u64,
    acked: u64,
    bytes: u64,
    sealed: bool,
}

/// Segment ids start high so that a shutdown can place a segment before all others.
const FIRST_SEGMENT: u64 = 1 << 32;

struct Spill {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    writer: Option<BufWriter<File>>,
    /// Byte offset of the reader in the front unread segment.
    reader: Option<(u64, BufReader<File>)>,
    bytes: u64,
    next_id: u64,
}

impl Spill {
    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:020}.seg"))
    }

    /// Open `dir`, recovering segments a previous process left behind. A segment whose events
    /// are for another destination (its first subject outside `subject_root`) would be refused
    /// there (JetStream: no stream for those subjects) and block this run's own events behind it:
    /// it is moved to `dir/aside/<its subject root>/`, with a warning that says how to publish it.
    fn open(dir: &Path, subject_root: &str) -> io::Result<(Spill, u64)> {
        fs::create_dir_all(dir)?;
        set_aside_foreign_segments(dir, subject_root)?;
        let mut ids: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
            .collect();
        ids.sort_unstable();
        let mut spill = Spill {
            dir: dir.into(),
            segments: VecDeque::new(),
            writer: None,
            reader: None,
            bytes: 0,
            next_id: FIRST_SEGMENT,
        };
        let mut recovered = 0;
        for id in ids {
            let path = spill.path(id);
            let data = fs::read(&path)?;
            // A torn last line (crash mid-write) is not a record.
            let complete = data.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            if complete < data.len() {
                tracing::warn!(segment = %path.display(), bytes = data.len() - complete, "dropping a torn record at the end of a spill segment");
                OpenOptions::new().write(true).open(&path)?.set_len(complete as u64)?;
            }
            let written = data[..complete].iter().filter(|&&b| b == b'\n').count() as u64;
            if written == 0 {
                fs::remove_file(&path)?;
                continue;
            }
            recovered += written;
            spill.bytes += complete as u64;
            spill.segments.push_back(Segment { id, written, read: 0, acked: 0, bytes: complete as u64, sealed: true });
            spill.next_id = id + 1;
        }
        Ok((spill, recovered))
    }

    fn backlog(&self) -> u64 {
        self.segments.iter().map(|s| s.written - s.read).sum()
    }

    fn append(&mut self, rec: &Encoded, segment_bytes: u64) -> io::Result<()> {
        let need_new = match self.segments.back() {
            Some(s) => s.sealed || s.bytes >= segment_bytes,
            None => true,
        };
        if need_new {
            self.seal_writer()?;
            let id = self.next_id;
            self.next_id += 1;
            let file = OpenOptions::new().create(true).append(true).open(self.path(id))?;
            self.writer = Some(BufWriter::with_capacity(64 << 10, file));
            self.segments.push_back(Segment { id, written: 0, read: 0, acked: 0, bytes: 0, sealed: false });
        }
        let w = self.writer.as_mut().expect("an open segment has a writer");
        let len = write_record(w, rec)?;
        let seg = self.segments.back_mut().expect("pushed above");
        seg.written += 1;
        seg.bytes += len;
        self.bytes += len;
        Ok(())
    }

    fn seal_writer(&mut self) -> io::Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.flush()?;
            w.get_ref().sync_data()?;
        }
        if let Some(s) = self.segments.back_mut() {
            s.sealed = true;
        }
        Ok(())
    }

    /// Read up to `max` records, oldest first.
    fn read(&mut self, max: usize, out: &mut VecDeque<Item>) -> io::Result<usize> {
        if let Some(w) = self.writer.as_mut() {
            w.flush()?;
        }
        let mut n = 0;
        while n < max {
            let Some(seg) = self.segments.iter().find(|s| s.read < s.written) else { break };
            let id = seg.id;
            if self.reader.as_ref().is_none_or(|(rid, _)| *rid != id) {
                let mut f = File::open(self.path(id))?;
                f.seek(SeekFrom::Start(0))?;
                let mut r = BufReader::with_capacity(64 << 10, f);
                let mut skipped = 0;
                let mut line = Vec::new();
                while skipped < seg.read {
                    line.clear();
                    r.read_until(b'\n', &mut line)?;
                    skipped += 1;
                }
                self.reader = Some((id, r));
            }
            let (_, r) = self.reader.as_mut().expect("opened above");
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("spill segment {id} is shorter than recorded"),
                ));
            }
            let seg = self.segments.iter_mut().find(|s| s.id == id).expect("found above");
            seg.read += 1;
            match parse_record(&line) {
                Some(rec) => {
                    out.push_back(Item { body: Body::Encoded(rec), segment: Some(id) });
                    n += 1;
                }
                None => {
                    // Unreadable record (disk corruption): count it as delivered so the segment can go.
                    tracing::error!(segment = id, "skipping a corrupt spill record");
                    seg.acked += 1;
                }
            }
        }
        if self.backlog() == 0 {
            // Caught up with the writer: the next overflow starts a new segment.
            self.seal_writer()?;
        }
        self.collect()?;
        Ok(n)
    }

    fn ack(&mut self, id: u64) -> io::Result<()> {
        if let Some(s) = self.segments.iter_mut().find(|s| s.id == id) {
            s.acked += 1;
        }
        self.collect()
    }

    /// Delete sealed segments whose every record was acked.
    fn collect(&mut self) -> io::Result<()> {
        while let Some(s) = self.segments.front() {
            if !(s.sealed && s.acked >= s.written) {
                break;
            }
            let s = self.segments.pop_front().expect("front exists");
            if self.reader.as_ref().is_some_and(|(rid, _)| *rid == s.id) {
                self.reader = None;
            }
            self.bytes -= s.bytes;
            match fs::remove_file(self.path(s.id)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The subject root (`<prefix>.<cluster>`, or empty for a JSONL sink) of a spill record's subject
/// `<root>.<kind>.<namespace>` (kinds and namespace tokens have no dots).
fn root_of(subject: &str) -> &str {
    let mut dots = subject.rmatch_indices('.').map(|(i, _)| i);
    match (dots.next(), dots.next()) {
        (Some(_), Some(before_kind)) => &subject[..before_kind],
        _ => "",
    }
}

/// Move the segments in `dir` whose first record is for another subject root to
/// `dir/aside/<root>/`, where a run for that destination can publish them (`--spill-dir`).
fn set_aside_foreign_segments(dir: &Path, subject_root: &str) -> io::Result<()> {
    let mut foreign: std::collections::BTreeMap<String, (u64, Vec<PathBuf>)> = Default::default();
    for entry in fs::read_dir(dir)?.filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "seg") {
            continue;
        }
        let mut first = Vec::new();
        BufReader::new(File::open(&path)?).read_until(b'\n', &mut first)?;
        let Some(rec) = parse_record(&first) else { continue };
        let root = root_of(&rec.subject);
        if root != subject_root {
            let records = fs::read(&path)?.iter().filter(|&&b| b == b'\n').count() as u64;
            let e = foreign.entry(if root.is_empty() { "jsonl".into() } else { root.to_owned() }).or_default();
            e.0 += records;
            e.1.push(path);
        }
    }
    for (root, (records, paths)) in foreign {
        let aside = dir.join("aside").join(&root);
        fs::create_dir_all(&aside)?;
        for path in paths {
            let name = path.file_name().expect("a segment file has a name");
            fs::rename(&path, aside.join(name))?;
        }
        tracing::warn!(
            events = records,
            destination = %root,
            moved_to = %aside.display(),
            "the spill directory held events for another destination; they were moved aside, not \
             published here (publish them with a run for that destination and --spill-dir {})",
            aside.display()
        );
    }
    Ok(())
}

/// One spill record: `subject TAB id TAB json LF` (none of the three contains a tab or newline).
/// Returns the bytes written.
fn write_record(w: &mut impl Write, rec: &Encoded) -> io::Result<u64> {
    for part in [rec.subject.as_bytes(), b"\t", rec.id.as_bytes(), b"\t", &rec.json, b"\n"] {
        w.write_all(part)?;
    }
    Ok((rec.subject.len() + rec.id.len() + rec.json.len() + 3) as u64)
}

/// The inverse of [`write_record`]; `None` for a corrupt line.
fn parse_record(line: &[u8]) -> Option<Encoded> {
    let line = line.strip_suffix(b"\n")?;
    let mut parts = line.splitn(3, |&b| b == b'\t');
    let subject = std::str::from_utf8(parts.next()?).ok()?.to_owned();
    let id = std::str::from_utf8(parts.next()?).ok()?.to_owned();
    let json = parts.next()?;
    // The subject may be empty: a JSONL sink has none.
    if id.is_empty() || json.first() != Some(&b'{') {
        return None;
    }
    Some(Encoded { subject, id, json: Bytes::copy_from_slice(json) })
}

/// The queue itself; the sink wraps it in a mutex.
pub(crate) struct Outbox {
    config: OutboxConfig,
    mem: VecDeque<Item>,
    /// Items handed to the drainer and not yet acked.
    taken: usize,
    spill: Option<Spill>,
    encode: std::sync::Arc<Encoder>,
}

impl Outbox {
    /// Returns the outbox and how many spilled events were recovered from a previous run.
    /// Spilled events of another destination (subjects outside `subject_root`: another cluster,
    /// or a JSONL sink's) are moved aside, never published here (see [`Spill::open`]).
    pub fn new(config: OutboxConfig, subject_root: &str, encode: std::sync::Arc<Encoder>) -> io::Result<(Outbox, u64)> {
        let (spill, recovered) = match &config.spill_dir {
            Some(dir) => {
                let (s, n) = Spill::open(dir, subject_root)?;
                (Some(s), n)
            }
            None => (None, 0),
        };
        Ok((Outbox { config, mem: VecDeque::new(), taken: 0, spill, encode }, recovered))
    }

    /// The configured bound on events held in memory.
    pub fn max_events(&self) -> usize {
        self.config.max_events
    }

    /// Items handed to the drainer and not yet acked.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Events held: in memory, taken by the drainer, or on disk.
    pub fn held(&self) -> u64 {
        (self.mem.len() + self.taken) as u64 + self.spill.as_ref().map_or(0, |s| s.backlog())
    }

    fn spilling(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.backlog() > 0)
    }

    /// Whether `n` more events would be accepted.
    pub fn has_room(&self, n: usize) -> bool {
        if !self.spilling() && self.mem.len() + self.taken + n <= self.config.max_events {
            return true;
        }
        self.spill.as_ref().is_some_and(|s| s.bytes < self.config.max_spill_bytes)
    }

    /// Hold `event`: in memory if there is room and nothing is waiting on disk, else on disk, else
    /// nowhere (the caller counts the drop).
    #[inline]
    pub fn push(&mut self, event: Pending) -> Pushed {
        if !self.spilling() && self.mem.len() + self.taken < self.config.max_events {
            self.mem.push_back(Item { body: Body::Pending(event), segment: None });
            return Pushed::Memory;
        }
        let (max_spill, seg_bytes) = (self.config.max_spill_bytes, self.config.segment_bytes);
        match self.spill.as_mut() {
            Some(spill) if spill.bytes < max_spill => match spill.append(&(self.encode)(event), seg_bytes) {
                Ok(()) => Pushed::Spilled,
                Err(e) => {
                    tracing::error!(error = %e, dir = %spill.dir.display(), "cannot write the event spill");
                    Pushed::Dropped
                }
            },
            _ => Pushed::Dropped,
        }
    }

    /// Hand up to `max` items to the drainer, oldest first, refilling memory from disk.
    pub fn take(&mut self, max: usize) -> Vec<Item> {
        if self.mem.len() < max {
            let room = self.config.max_events.saturating_sub(self.mem.len() + self.taken);
            if let Some(spill) = self.spill.as_mut()
                && room > 0
                && let Err(e) = spill.read(room.min(max.max(1024)), &mut self.mem)
            {
                tracing::error!(error = %e, "cannot read the event spill");
            }
        }
        let n = max.min(self.mem.len());
        self.taken += n;
        self.mem.drain(..n).collect()
    }

    /// Put events the destination lost back at the front, in their order (they were acked, so
    /// they are not among the taken ones).
    pub fn resend(&mut self, events: Vec<Encoded>) {
        for e in events.into_iter().rev() {
            self.mem.push_front(Item { body: Body::Encoded(e), segment: None });
        }
    }

    /// Put undelivered items back at the front, in their order.
    pub fn requeue(&mut self, items: Vec<Item>) {
        self.taken -= items.len();
        for item in items.into_iter().rev() {
            self.mem.push_front(item);
        }
    }

    /// Items delivered.
    pub fn ack(&mut self, items: impl IntoIterator<Item = Item>) {
        for item in items {
            self.taken -= 1;
            if let (Some(id), Some(spill)) = (item.segment, self.spill.as_mut())
                && let Err(e) = spill.ack(id)
            {
                tracing::error!(error = %e, "cannot delete a delivered spill segment");
            }
        }
    }

    /// Move everything still in memory to disk, ahead of what is already there (at shutdown while
    /// the server is away). Returns the number of events that could not be kept.
    pub fn spill_all(&mut self) -> usize {
        let Some(spill) = self.spill.as_mut() else {
            // Nowhere to keep them: they are gone, and no longer held.
            let lost = self.mem.len() + self.taken;
            self.mem.clear();
            return lost;
        };
        // What the open segment's writer still buffers must reach the file now: the process may
        // end without dropping the outbox (an abort after a panic).
        if let Err(e) = spill.seal_writer() {
            tracing::error!(error = %e, "cannot finish the spill segment being written at shutdown");
        }
        // In memory: first the events that never reached disk (older than anything on disk), then
        // records read back from disk, which stay in their segments and are read again by the next
        // process. So the former go to a new segment placed before every existing one.
        let fresh: Vec<Item> = self.mem.drain(..).filter(|i| i.segment.is_none()).collect();
        if fresh.is_empty() {
            return self.taken;
        }
        let fresh_len = fresh.len();
        let id = spill.segments.front().map_or(spill.next_id, |s| s.id - 1);
        let write = || -> io::Result<u64> {
            let mut w = BufWriter::new(OpenOptions::new().create_new(true).write(true).open(spill.path(id))?);
            let mut bytes = 0;
            for mut item in fresh {
                bytes += write_record(&mut w, item.encoded(&*self.encode))?;
            }
            w.flush()?;
            w.get_ref().sync_data()?;
            Ok(bytes)
        };
        match write() {
            Ok(bytes) => {
                // Known to this outbox too, so that `held` still counts what is on disk.
                spill.bytes += bytes;
                spill.segments.push_front(Segment {
                    id,
                    written: fresh_len as u64,
                    read: 0,
                    acked: 0,
                    bytes,
                    sealed: true,
                });
                self.taken
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot spill the outbox at shutdown");
                fresh_len + self.taken
            }
        }
    }

    pub fn encoder(&self) -> std::sync::Arc<Encoder> {
        self.encode.clone()
    }
}
