//! [`EventSink`]: the scheduler's handle for emitting events, whatever the destination.
//!
//! `emit` numbers and stamps the event and pushes it into the [outbox](crate::outbox) under a short
//! lock; it never waits on I/O. A drainer thread per sink (JSONL file or NATS JetStream) encodes and
//! delivers, so a slow or absent destination costs the scheduler nothing but outbox space.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::outbox::{Encoded, Item, Outbox, OutboxConfig, Pending, Pushed};
use crate::schema::{Event, EventsDropped, Payload, SPEC_VERSION};
use crate::time::Timestamp;

/// What the sink has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Events passed to `emit`.
    pub emitted: u64,
    /// Events written (JSONL) or acknowledged by JetStream.
    pub delivered: u64,
    /// Events dropped because the outbox (memory and spill) was full.
    pub dropped: u64,
    /// Events written to the spill directory.
    pub spilled: u64,
    /// Events recovered from a spill directory at start-up.
    pub recovered: u64,
    /// Of `delivered`, events JetStream reported as duplicates: retries of events it had stored
    /// but whose ack was lost (not stored twice).
    pub duplicates: u64,
    /// Events the server rejected repeatedly and that were given up (counted, logged).
    pub rejected: u64,
    /// Events held now (memory, in flight, spill).
    pub pending: u64,
    /// Whether the destination is reachable now.
    pub connected: bool,
    /// The last delivery or connection error.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct Counters {
    emitted: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    spilled: AtomicU64,
    recovered: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
}

/// Dropped events not yet reported by an `events-dropped` event.
struct DropReport {
    count: u64,
    first: Timestamp,
    last: Timestamp,
}

struct Queue {
    outbox: Outbox,
    unreported: Option<DropReport>,
    /// The drainer is waiting for events: the next `emit` wakes it. Otherwise `emit` does not
    /// signal at all, so a busy drainer costs the scheduler no wake-up system calls.
    sleeping: bool,
}

/// State shared between the handle and the drainer.
pub(crate) struct Shared {
    next_seq: AtomicU64,
    queue: Mutex<Queue>,
    /// Signalled when events arrive or the sink closes (for a blocking drainer).
    ready: Condvar,
    /// Signalled when the outbox becomes empty (for `flush`).
    drained: Condvar,
    /// The same as `ready`, for an async drainer.
    pub(crate) notify: tokio::sync::Notify,
    counters: Counters,
    pub(crate) closed: AtomicBool,
    connected: AtomicBool,
    /// Set when a session got as far as publishing, so the reconnect back-off restarts small.
    session_ok: AtomicBool,
    last_error: Mutex<Option<String>>,
    drop_reason: String,
}

/// Identity of the events a sink emits.
#[derive(Clone, Debug)]
pub struct Origin {
    /// CloudEvents `source`, e.g. `wasmsched/prod-a/scheduler`.
    pub source: String,
    /// Prefix of event ids; ids are `<prefix>-<sequence>`. Must be unique per process run (and
    /// deterministic in the simulator); [`Origin::unique_prefix`] makes one.
    pub id_prefix: String,
}

impl Origin {
    /// A prefix unique to this process run: time and process id, base-36.
    pub fn unique_prefix() -> String {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{}{}", base36(nanos as u64), base36(u64::from(std::process::id())))
    }
}

fn base36(mut n: u64) -> String {
    let mut s = Vec::new();
    loop {
        s.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

/// A handle for emitting events. Cheap to clone; the last clone's [`EventSink::close`] (or drop)
/// stops the drainer.
#[derive(Clone)]
pub struct EventSink {
    shared: Arc<Shared>,
    worker: Arc<Worker>,
}

struct Worker {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Dropped without `close`: stop the drainer; what it still holds is spilled if possible.
        self.shared.close_signal();
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

impl EventSink {
    /// A sink whose drainer runs `drain` on its own thread.
    pub(crate) fn start(
        origin: Origin,
        outbox: OutboxConfig,
        subject_root: String,
        name: &str,
        drain: impl FnOnce(Arc<Shared>) + Send + 'static,
    ) -> std::io::Result<EventSink> {
        let drop_reason = match &outbox.spill_dir {
            Some(dir) => format!(
                "outbox full ({} events in memory, {} bytes of spill in {})",
                outbox.max_events,
                outbox.max_spill_bytes,
                dir.display()
            ),
            None => format!("outbox full ({} events in memory, spill disabled)", outbox.max_events),
        };
        let (outbox, recovered) = Outbox::new(outbox, encoder(subject_root, origin))?;
        if recovered > 0 {
            tracing::info!(events = recovered, "recovered spilled events from a previous run");
        }
        let shared = Arc::new(Shared {
            next_seq: AtomicU64::new(1),
            queue: Mutex::new(Queue { outbox, unreported: None, sleeping: false }),
            ready: Condvar::new(),
            drained: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            counters: Counters { recovered: AtomicU64::new(recovered), ..Default::default() },
            closed: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            session_ok: AtomicBool::new(false),
            last_error: Mutex::new(None),
            drop_reason,
        });
        let for_thread = shared.clone();
        let thread =
            std::thread::Builder::new().name(format!("wasmsched-events-{name}")).spawn(move || drain(for_thread))?;
        Ok(EventSink { shared: shared.clone(), worker: Arc::new(Worker { shared, thread: Mutex::new(Some(thread)) }) })
    }

    /// Emit an event stamped with the current time.
    pub fn emit(&self, payload: Payload) {
        self.emit_at(Timestamp::now(), payload);
    }

    /// Emit an event stamped with `time` (the simulator passes virtual time). Never blocks on
    /// I/O: if the outbox is full the event is dropped and counted, and an `events-dropped` event
    /// reports the gap once there is room.
    #[inline]
    pub fn emit_at(&self, time: Timestamp, payload: Payload) {
        let shared = &self.shared;
        shared.counters.emitted.fetch_add(1, Ordering::Relaxed);
        let mut q = shared.lock();
        if q.unreported.is_some() && q.outbox.has_room(2) {
            let r = q.unreported.take().expect("checked above");
            let report = Payload::EventsDropped(EventsDropped {
                count: r.count,
                first: r.first,
                last: r.last,
                reason: shared.drop_reason.clone(),
            });
            let _ = shared.count(q.outbox.push(shared.pending(time, report)));
        }
        // Numbered under the lock, so ids follow the outbox order.
        let event = shared.pending(time, payload);
        if shared.count(q.outbox.push(event)) == Pushed::Dropped {
            let r = q.unreported.get_or_insert(DropReport { count: 0, first: time, last: time });
            r.count += 1;
            r.last = time;
            if r.count == 1 || r.count.is_power_of_two() {
                tracing::warn!(dropped = r.count, reason = %shared.drop_reason, "dropping events");
            }
        }
        let wake = std::mem::take(&mut q.sleeping);
        drop(q);
        if wake {
            shared.ready.notify_one();
            shared.notify.notify_one();
        }
    }

    /// Counters and connection state.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        Stats {
            emitted: c.emitted.load(Ordering::Relaxed),
            delivered: c.delivered.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            spilled: c.spilled.load(Ordering::Relaxed),
            recovered: c.recovered.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            pending: self.shared.lock().outbox.held(),
            connected: self.shared.connected.load(Ordering::Relaxed),
            last_error: self.shared.last_error.lock().map(|e| e.clone()).unwrap_or_default(),
        }
    }

    /// Wait until every emitted event is delivered or `timeout` passes; true if all were.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        while q.outbox.held() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q = match self.shared.drained.wait_timeout(q, left.min(Duration::from_millis(50))) {
                Ok((q, _)) => q,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// Flush for up to `timeout`, then stop the drainer; events still undelivered are spilled to
    /// disk when a spill directory is configured (and published by the next process), else counted
    /// as dropped. Returns the final counters.
    pub fn close(self, timeout: Duration) -> Stats {
        self.flush(timeout);
        self.shared.close_signal();
        if let Some(t) = self.worker.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
        self.stats()
    }
}

impl Shared {
    #[inline]
    fn pending(&self, time: Timestamp, payload: Payload) -> Pending {
        Pending { seq: self.next_seq.fetch_add(1, Ordering::Relaxed), time, payload }
    }

    fn count(&self, pushed: Pushed) -> Pushed {
        match pushed {
            Pushed::Memory => {}
            Pushed::Spilled => {
                self.counters.spilled.fetch_add(1, Ordering::Relaxed);
            }
            Pushed::Dropped => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        pushed
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves the queue consistent (every mutation is a single
        // push or drain), so a poisoned lock is used as is.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close_signal(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _guard = self.lock();
        self.ready.notify_all();
        self.notify.notify_one();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Take up to `max` items without waiting.
    pub(crate) fn take(&self, max: usize) -> Vec<Item> {
        self.lock().outbox.take(max)
    }

    /// Take up to `max` items, waiting up to `wait` for some; empty on timeout or close.
    pub(crate) fn take_blocking(&self, max: usize, wait: Duration) -> Vec<Item> {
        let mut q = self.lock();
        let deadline = Instant::now() + wait;
        loop {
            let items = q.outbox.take(max);
            if !items.is_empty() || self.is_closed() {
                return items;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return items;
            }
            q.sleeping = true;
            q = match self.ready.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Before an async drainer waits on `notify`: true if there is nothing to take, in which case
    /// the next `emit` will notify.
    pub(crate) fn prepare_wait(&self) -> bool {
        let mut q = self.lock();
        let idle = q.outbox.held() == q.outbox.taken() as u64;
        if idle {
            q.sleeping = true;
        }
        idle
    }

    pub(crate) fn ack(&self, items: Vec<Item>, duplicates: u64) {
        let n = items.len() as u64;
        let mut q = self.lock();
        q.outbox.ack(items);
        let empty = q.outbox.held() == 0;
        drop(q);
        self.counters.delivered.fetch_add(n, Ordering::Relaxed);
        self.counters.duplicates.fetch_add(duplicates, Ordering::Relaxed);
        if empty {
            self.drained.notify_all();
        }
    }

    /// Give up on items the server keeps rejecting.
    pub(crate) fn reject(&self, items: Vec<Item>) {
        let n = items.len() as u64;
        let mut q = self.lock();
        q.outbox.ack(items);
        let empty = q.outbox.held() == 0;
        drop(q);
        self.counters.rejected.fetch_add(n, Ordering::Relaxed);
        if empty {
            self.drained.notify_all();
        }
    }

    pub(crate) fn requeue(&self, items: Vec<Item>) {
        self.lock().outbox.requeue(items);
    }

    /// At shutdown: keep what is left on disk if possible, count the rest as dropped.
    pub(crate) fn spill_remaining(&self) {
        let mut q = self.lock();
        let held = q.outbox.held();
        let lost = q.outbox.spill_all() as u64;
        drop(q);
        if lost > 0 {
            tracing::error!(events = lost, "events undelivered at shutdown and not spilled: dropped");
            self.counters.dropped.fetch_add(lost, Ordering::Relaxed);
        } else if held > 0 {
            tracing::warn!(events = held, "events undelivered at shutdown kept in the spill directory");
        }
        self.drained.notify_all();
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    pub(crate) fn mark_session_succeeded(&self) {
        self.session_ok.store(true, Ordering::Relaxed);
    }

    /// Whether a session succeeded since the last call.
    pub(crate) fn session_succeeded(&self) -> bool {
        self.session_ok.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn set_error(&self, error: Option<String>) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = error;
        }
    }

    pub(crate) fn encoder(&self) -> Arc<crate::outbox::Encoder> {
        self.lock().outbox.encoder()
    }
}

/// Replace characters that NATS forbids in a subject token; an empty token becomes `_`.
pub(crate) fn subject_token(s: &str) -> String {
    if s.is_empty() {
        return "_".into();
    }
    s.chars()
        .map(|c| if c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control() { '_' } else { c })
        .collect()
}

/// Builds envelopes with ids `<id_prefix>-<seq>` and subjects `<root>.<kind>.<namespace or _>`.
pub(crate) fn encoder(root: String, origin: Origin) -> Arc<crate::outbox::Encoder> {
    Arc::new(move |p: Pending| {
        let (subject, namespace) = p.payload.subject();
        let event = Event {
            specversion: std::borrow::Cow::Borrowed(SPEC_VERSION),
            id: format!("{}-{}", origin.id_prefix, p.seq),
            source: origin.source.clone(),
            time: p.time,
            subject,
            namespace,
            datacontenttype: std::borrow::Cow::Borrowed("application/json"),
            payload: p.payload,
        };
        Encoded {
            subject: format!(
                "{root}.{}.{}",
                event.kind().name(),
                subject_token(event.namespace.as_deref().unwrap_or(""))
            ),
            json: serde_json::to_vec(&event).map(bytes::Bytes::from).unwrap_or_default(),
            id: event.id,
        }
    })
}
