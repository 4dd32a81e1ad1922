//! [`EventSink`]: the scheduler's handle for emitting events, whatever the destination.
//!
//! `emit` stamps the event and stages it on a bounded ring; the drainer thread of the sink (JSONL
//! file or NATS JetStream) moves staged events into the [outbox](crate::outbox), where they are
//! numbered (so ids follow the outbox order), held, spilled or dropped, then encodes and delivers
//! them. The scheduling thread thus never takes the outbox's lock, which the drainer holds while
//! it reads spilled events from disk and which a descheduled drainer could hold for milliseconds;
//! a slow or absent destination costs the scheduler nothing but outbox space. Only when the ring
//! is full (the drainer has not come for [`STAGING`] events: a long connect) does `emit` move the
//! events into the outbox itself, under the lock.
//!
//! Staging is what a placement costs the scheduling thread, so it is built to write and not to
//! wait: the ring is single-producer (a push is plain stores; a multi-producer channel's
//! compare-and-swap and slot check read lines the drainer last wrote), emitting threads take turns
//! through an ordinary `Mutex` (one thread emits nearly every event, so it is all but
//! uncontended; a custom spin lock saved under half a point of a decision, not worth `unsafe`:
//! docs/benchmarks-history.md, session 25), and `emit` does not fence before looking whether the drainer sleeps
//! (see [`IDLE_LOOK`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::outbox::{Encoded, Item, Outbox, OutboxConfig, Pending, Pushed};
use crate::record::Record;
use crate::schema::{Event, EventsDropped, Payload, SPEC_VERSION};
use crate::time::Timestamp;

/// Something that reads the sink's events as they leave the outbox, beside its destination: the
/// dashboard's live stream. Called on the drainer's thread with each event's JSON once the
/// destination has it (written to the file, acknowledged by JetStream), in the outbox's order, so
/// the scheduling thread never pays for it; it must not block. An event JetStream lost after
/// acknowledging it, and that is sent again, is read again.
pub trait Tap: Send + Sync {
    /// Whether anyone reads the events now. A sink whose only reader is the tap
    /// ([`EventSink::tap_only`]) does not even encode them while this is false.
    fn wants(&self) -> bool {
        true
    }
    /// Whether it takes the next event: a tap may read at a bounded rate (it counts what it leaves
    /// out). Asked once per event; a sink whose only reader is the tap does not encode an event
    /// it will not take.
    fn accepts(&self) -> bool {
        self.wants()
    }
    /// One event, as the destination gets it.
    fn event(&self, json: &[u8]);
}

/// What the sink has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Events passed to `emit`.
    pub emitted: u64,
    /// Events written (JSONL) or acknowledged by JetStream (less any the server lost afterwards):
    /// `emitted = delivered + dropped + lost_by_server + pending`.
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
    /// Events JetStream had acknowledged and then lost (a server that came back with an empty or
    /// shorter stream) beyond what the sink could re-send: gone for good.
    pub lost_by_server: u64,
    /// Events held now (memory, in flight, spill).
    pub pending: u64,
    /// Where undelivered events are kept across restarts (the spill directory), if anywhere.
    pub spill_dir: Option<std::path::PathBuf>,
    /// Whether the destination is reachable now.
    pub connected: bool,
    /// The last delivery or connection error.
    pub last_error: Option<String>,
}

impl Stats {
    /// Events lost for good: dropped, or lost by the server after it acknowledged them. A command
    /// whose sink lost any fails (events spilled for the next run are not lost).
    pub fn lost(&self) -> u64 {
        self.dropped + self.lost_by_server
    }
}

/// Events `emit` can stage for the drainer before it moves them into the outbox itself: ~15 ms
/// of decisions at 70,000 a second, far more than the drainer's 2 ms linger.
pub(crate) const STAGING: usize = 1024;

/// The longest a drainer waits before looking for events again: `emit` does not fence, so it can
/// miss a drainer announcing sleep at the same moment and not wake it; the event then waits this
/// long at most. Idle, this is a wake-up every 50 ms.
pub(crate) const IDLE_LOOK: Duration = Duration::from_millis(50);

/// Events a thread drainer takes at once (a JSONL write, a batch for the tap).
pub(crate) const DRAIN_BATCH: usize = 4096;

/// Counters the drainer updates, on cache lines of their own: the emitting thread's counter
/// beside them would bounce between the two CPUs' caches.
#[derive(Default)]
#[repr(align(128))]
struct Counters {
    delivered: AtomicU64,
    dropped: AtomicU64,
    spilled: AtomicU64,
    recovered: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
    lost_by_server: AtomicU64,
}

/// Dropped events not yet reported by an `events-dropped` event.
struct DropReport {
    count: u64,
    first: Timestamp,
    last: Timestamp,
}

/// An event on its way from `emit` to the outbox.
struct Staged {
    time: Timestamp,
    record: Record,
}

struct Queue {
    outbox: Outbox,
    /// What `emit` staged, oldest first.
    staged: rtrb::Consumer<Staged>,
    /// The next event's sequence number (its id's suffix), given as the event enters the outbox.
    next_seq: u64,
    unreported: Option<DropReport>,
}

/// State shared between the handle and the drainer.
pub(crate) struct Shared {
    /// `emit`'s way in while there is room; the lock only orders emitting threads (the drainer
    /// never takes it).
    staging: Mutex<rtrb::Producer<Staged>>,
    /// Events passed to `emit`.
    emitted: AtomicU64,
    /// The drainer is waiting for events: the next `emit` wakes it. Otherwise `emit` does not
    /// signal at all, so a busy drainer costs the scheduler no wake-up system calls.
    sleeping: AtomicBool,
    queue: Mutex<Queue>,
    /// Signalled when events arrive or the sink closes (for a blocking drainer).
    ready: Condvar,
    /// Signalled when the outbox becomes empty (for `flush`).
    drained: Condvar,
    /// The same as `ready`, for an async drainer.
    pub(crate) notify: tokio::sync::Notify,
    counters: Counters,
    pub(crate) closed: AtomicBool,
    /// Shutting down: a drainer waiting to reconnect retries at once and keeps retrying at the
    /// shortest back-off, so that a destination coming back within the grace gets every event.
    hurry: AtomicBool,
    connected: AtomicBool,
    /// Set when a session got as far as publishing, so the reconnect back-off restarts small.
    session_ok: AtomicBool,
    last_error: Mutex<Option<String>>,
    drop_reason: String,
    spill_dir: Option<std::path::PathBuf>,
    /// The tap, set at most once.
    tap: std::sync::OnceLock<Arc<dyn Tap>>,
    /// The tap is the sink's only reader ([`EventSink::tap_only`]).
    only_tap: AtomicBool,
    /// The drainer has returned (after spilling what it could not deliver).
    stopped: AtomicBool,
    /// `emit` waits for room instead of dropping ([`OutboxConfig::wait_when_full`]).
    wait_when_full: bool,
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
        let spill_dir = outbox.spill_dir.clone();
        let wait_when_full = outbox.wait_when_full;
        let (outbox, recovered) = Outbox::new(outbox, &subject_root, encoder(subject_root.clone(), origin))?;
        if recovered > 0 {
            tracing::info!(events = recovered, "recovered spilled events from a previous run");
        }
        let (staging, staged) = rtrb::RingBuffer::new(STAGING.min(outbox.max_events()));
        let shared = Arc::new(Shared {
            staging: Mutex::new(staging),
            emitted: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            queue: Mutex::new(Queue { outbox, staged, next_seq: 1, unreported: None }),
            ready: Condvar::new(),
            drained: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            counters: Counters { recovered: AtomicU64::new(recovered), ..Default::default() },
            closed: AtomicBool::new(false),
            hurry: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            session_ok: AtomicBool::new(false),
            last_error: Mutex::new(None),
            drop_reason,
            spill_dir,
            tap: std::sync::OnceLock::new(),
            only_tap: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            wait_when_full,
        });
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new().name(format!("wasmsched-events-{name}")).spawn(move || {
            drain(for_thread.clone());
            for_thread.stopped.store(true, Ordering::SeqCst);
        })?;
        open_sinks().push(OpenSink { shared: Arc::downgrade(&shared), drainer: thread.thread().id() });
        Ok(EventSink { shared: shared.clone(), worker: Arc::new(Worker { shared, thread: Mutex::new(Some(thread)) }) })
    }

    /// Emit an event stamped with the current time.
    pub fn emit(&self, payload: Payload) {
        self.emit_at(Timestamp::now(), payload);
    }

    /// Emit an event stamped with `time` (the simulator passes virtual time). Never blocks on
    /// I/O while the drainer keeps up: if the outbox is full the event is dropped and counted, and
    /// an `events-dropped` event reports the gap once there is room.
    #[inline]
    pub fn emit_at(&self, time: Timestamp, payload: Payload) {
        self.emit_record_at(time, Record::Payload(Box::new(payload)));
    }

    /// [`EventSink::emit_at`] for any outbox record (the packed form of the placement hot path).
    #[inline]
    pub(crate) fn emit_record_at(&self, time: Timestamp, record: Record) {
        let shared = &self.shared;
        if shared.wait_when_full {
            self.emit_waiting(time, record);
            return;
        }
        let pushed = {
            let mut staging = shared.staging.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Emitting threads are serialised by the lock: no read-modify-write needed.
            shared.emitted.store(shared.emitted.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            staging.push(Staged { time, record })
        };
        if let Err(rtrb::PushError::Full(staged)) = pushed {
            // The drainer has not come for a while: do its part, behind what is staged.
            let mut q = shared.lock();
            q.pull(shared);
            q.admit(shared, staged);
        }
        shared.wake_drainer();
    }

    /// [`EventSink::emit_at`] for a sink that waits for room ([`OutboxConfig::wait_when_full`]):
    /// straight into the outbox under its lock (behind anything staged), once it has room.
    fn emit_waiting(&self, time: Timestamp, record: Record) {
        let shared = &self.shared;
        let mut q = shared.lock();
        shared.emitted.store(shared.emitted.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        q.pull(shared);
        let mut progress = (shared.counters.delivered.load(Ordering::Relaxed), Instant::now());
        // Room for the event and a drop report.
        while !q.outbox.has_room(2) && !shared.is_closed() {
            let delivered = shared.counters.delivered.load(Ordering::Relaxed);
            if delivered != progress.0 {
                progress = (delivered, Instant::now());
            } else if progress.1.elapsed() > crate::outbox::WAIT_FOR_DRAINER {
                tracing::warn!("the event drainer delivered nothing for 30 s; dropping instead of waiting");
                break;
            }
            shared.ready.notify_all();
            shared.notify.notify_one();
            q = match shared.drained.wait_timeout(q, Duration::from_millis(20)) {
                Ok((q, _)) => q,
                Err(p) => p.into_inner().0,
            };
            q.pull(shared);
        }
        q.admit(shared, Staged { time, record });
        drop(q);
        shared.wake_drainer();
    }

    /// From now on every event this sink's destination takes also goes to `tap` (see [`Tap`]). A
    /// sink has one tap: false, and `tap` unused, when it has one already.
    pub fn tap(&self, tap: Arc<dyn Tap>) -> bool {
        self.shared.tap.set(tap).is_ok()
    }

    /// A sink whose only reader is `tap`: events go through the outbox (numbered, bounded, counted
    /// as delivered once the tap has seen them, or skipped unencoded while it wants none) and
    /// nowhere else; sources ask [`EventSink::wanted`] before building each. What `wasmsched run
    /// --dashboard` streams when no `--events` destination is set.
    pub fn tap_only(origin: Origin, outbox: OutboxConfig, tap: Arc<dyn Tap>) -> std::io::Result<EventSink> {
        let sink = EventSink::start(origin, outbox, String::new(), "tap", drain_to_tap)?;
        sink.tap(tap);
        sink.shared.only_tap.store(true, Ordering::Relaxed);
        Ok(sink)
    }

    /// Whether the event about to be built reaches anyone: always, but for a
    /// [`EventSink::tap_only`] sink, whose tap is asked whether it takes it ([`Tap::accepts`]: a
    /// tap may read at a bounded rate and count what it leaves out). Ask once per event (or per
    /// decision, for its events); on false, build nothing. A source that asks costs the
    /// scheduling thread nothing for events nobody will see.
    pub fn wanted(&self) -> bool {
        !self.shared.only_tap.load(Ordering::Relaxed) || self.shared.tap.get().is_some_and(|t| t.accepts())
    }

    /// Counters and connection state.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let pending = {
            let mut q = self.shared.lock();
            q.pull(&self.shared);
            q.outbox.held()
        };
        Stats {
            emitted: self.shared.emitted.load(Ordering::Relaxed),
            delivered: c.delivered.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            spilled: c.spilled.load(Ordering::Relaxed),
            recovered: c.recovered.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            lost_by_server: c.lost_by_server.load(Ordering::Relaxed),
            pending,
            spill_dir: self.shared.spill_dir.clone(),
            connected: self.shared.connected.load(Ordering::Relaxed),
            last_error: self.shared.last_error.lock().map(|e| e.clone()).unwrap_or_default(),
        }
    }

    /// Wait until every emitted event is delivered or `timeout` passes; true if all were.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        while {
            q.pull(&self.shared);
            q.outbox.held() > 0
        } {
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

    /// The end of a run: wait up to `grace` for every event to be delivered, retrying a
    /// destination that is away at once and then at the shortest back-off (so a server that comes
    /// back within the grace gets everything), then [`EventSink::close`].
    pub fn shutdown(self, grace: Duration) -> Stats {
        self.shared.hurry.store(true, Ordering::SeqCst);
        self.shared.notify.notify_one();
        self.flush(grace);
        self.close(Duration::ZERO)
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

impl Queue {
    /// Move what `emit` staged into the outbox, in order.
    fn pull(&mut self, shared: &Shared) {
        while let Ok(staged) = self.staged.pop() {
            self.admit(shared, staged);
        }
    }

    /// Number one event and put it in the outbox (memory, spill, or dropped and counted), after
    /// the report of earlier drops if there is room for it now.
    fn admit(&mut self, shared: &Shared, Staged { time, record }: Staged) {
        if self.unreported.is_some() && self.outbox.has_room(2) {
            let r = self.unreported.take().expect("checked above");
            let report = Payload::EventsDropped(EventsDropped {
                count: r.count,
                first: r.first,
                last: r.last,
                reason: shared.drop_reason.clone(),
            });
            let report = self.pending(time, Record::Payload(Box::new(report)));
            let _ = shared.count(self.outbox.push(report));
        }
        let event = self.pending(time, record);
        if shared.count(self.outbox.push(event)) == Pushed::Dropped {
            let r = self.unreported.get_or_insert(DropReport { count: 0, first: time, last: time });
            r.count += 1;
            r.last = time;
            if r.count == 1 || r.count.is_power_of_two() {
                tracing::warn!(dropped = r.count, reason = %shared.drop_reason, "dropping events");
            }
        }
    }

    fn pending(&mut self, time: Timestamp, payload: Record) -> Pending {
        let seq = self.next_seq;
        self.next_seq += 1;
        Pending { seq, time, payload }
    }

    /// Whether every held event is with the drainer already.
    fn idle(&self) -> bool {
        self.outbox.held() == self.outbox.taken() as u64
    }
}

impl Shared {
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

    /// Wakes the drainer if it sleeps waiting for events. No fence between the event's push and
    /// this look (it would wait for the event's stores to reach the other CPU): the look may miss a
    /// drainer falling asleep at this very moment, which then wakes by itself within `IDLE_LOOK`.
    #[inline]
    fn wake_drainer(&self) {
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::SeqCst) {
            // Taking the lock waits until the drainer is inside its wait, so the signal is not lost.
            drop(self.lock());
            self.ready.notify_one();
            self.notify.notify_one();
        }
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

    /// Whether the sink is shutting down (see [`Shared::hurry`]).
    pub(crate) fn in_a_hurry(&self) -> bool {
        self.hurry.load(Ordering::SeqCst)
    }

    /// Put `events`, which the destination had acknowledged and then lost, back at the front of
    /// the outbox (oldest first), and count `lost` more that can no longer be re-sent: neither is
    /// delivered any more.
    pub(crate) fn resend(&self, events: Vec<crate::outbox::Encoded>, lost: u64) {
        self.counters.delivered.fetch_sub(events.len() as u64 + lost, Ordering::Relaxed);
        self.counters.lost_by_server.fetch_add(lost, Ordering::Relaxed);
        self.lock().outbox.resend(events);
    }

    /// Take up to `max` items without waiting.
    pub(crate) fn take(&self, max: usize) -> Vec<Item> {
        let mut q = self.lock();
        q.pull(self);
        q.outbox.take(max)
    }

    /// Before waiting for events, under the lock: tell `emit` to wake us, then look once more.
    /// True if there is still nothing to take. An `emit` racing with this may neither be seen
    /// here nor see the flag (it does not fence): waits are bounded by [`IDLE_LOOK`].
    fn announce_sleep(&self, q: &mut Queue) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        q.pull(self);
        let idle = q.idle();
        if !idle {
            self.sleeping.store(false, Ordering::Relaxed);
        }
        idle
    }

    /// The next batch for a thread drainer (up to [`DRAIN_BATCH`] items), waiting as long as it
    /// takes; `None` once the sink is closed and nothing is left.
    pub(crate) fn next_batch(&self) -> Option<Vec<Item>> {
        loop {
            let items = self.take_blocking(DRAIN_BATCH, Duration::from_millis(200));
            if !items.is_empty() {
                return Some(items);
            }
            if self.is_closed() {
                return None;
            }
        }
    }

    /// After a thread drainer delivered a batch of `taken`: a short batch means events trickle
    /// in, so it lingers a moment to let a few gather instead of waking (and waking the emitting
    /// thread) per event (`bench --dashboard-clients`: 0.66–0.73 of the throughput without).
    pub(crate) fn linger_after(&self, taken: usize) {
        if taken < DRAIN_BATCH && !self.is_closed() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Take up to `max` items, waiting up to `wait` for some; empty on timeout or close.
    pub(crate) fn take_blocking(&self, max: usize, wait: Duration) -> Vec<Item> {
        let mut q = self.lock();
        let deadline = Instant::now() + wait;
        loop {
            q.pull(self);
            let items = q.outbox.take(max);
            let left = deadline.saturating_duration_since(Instant::now());
            if !items.is_empty() || self.is_closed() || left.is_zero() {
                self.sleeping.store(false, Ordering::Relaxed);
                return items;
            }
            if !self.announce_sleep(&mut q) {
                continue;
            }
            q = match self.ready.wait_timeout(q, left.min(IDLE_LOOK)) {
                Ok((q, _)) => q,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Before an async drainer waits on `notify`: true if there is nothing to take, in which case
    /// the next `emit` will notify.
    pub(crate) fn prepare_wait(&self) -> bool {
        let mut q = self.lock();
        q.pull(self);
        q.idle() && self.announce_sleep(&mut q)
    }

    pub(crate) fn ack(&self, items: Vec<Item>, duplicates: u64) {
        let n = items.len() as u64;
        let mut q = self.lock();
        q.outbox.ack(items);
        let empty = q.outbox.held() == 0;
        drop(q);
        self.counters.delivered.fetch_add(n, Ordering::Relaxed);
        self.counters.duplicates.fetch_add(duplicates, Ordering::Relaxed);
        // A sink whose `emit` waits for room is woken by every delivery, `flush` by the last.
        if empty || self.wait_when_full {
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
        self.spill_locked(self.lock());
    }

    fn spill_locked(&self, mut q: MutexGuard<'_, Queue>) {
        q.pull(self);
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

    /// An event the destination has just taken (written, or acknowledged by the server), in the
    /// outbox's order: the tap, if any, reads it too.
    pub(crate) fn delivered_to_tap(&self, json: &[u8]) {
        if let Some(tap) = self.tap.get().filter(|t| t.accepts()) {
            tap.event(json);
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

/// The drainer of [`EventSink::tap_only`]: hands events to the tap while it wants them.
fn drain_to_tap(shared: Arc<Shared>) {
    let encode = shared.encoder();
    shared.set_connected(true);
    while let Some(mut items) = shared.next_batch() {
        let taken = items.len();
        // Sources asked `wanted` before building each event: what is here, the tap takes (while
        // anyone reads).
        if let Some(tap) = shared.tap.get().filter(|t| t.wants()) {
            for item in &mut items {
                tap.event(&item.encoded(&*encode).json);
            }
        }
        shared.ack(items, 0);
        shared.linger_after(taken);
    }
    shared.set_connected(false);
}

/// Builds envelopes with ids `<id_prefix>-<seq>` and subjects `<root>.<kind>.<namespace or _>`
/// (none when `root` is empty: a JSONL sink).
fn encoder(root: String, origin: Origin) -> Arc<crate::outbox::Encoder> {
    Arc::new(move |p: Pending| {
        let payload = p.payload.into_payload();
        let (subject, namespace) = payload.subject();
        let event = Event {
            specversion: std::borrow::Cow::Borrowed(SPEC_VERSION),
            id: format!("{}-{}", origin.id_prefix, p.seq),
            source: origin.source.clone(),
            time: p.time,
            subject,
            namespace,
            datacontenttype: std::borrow::Cow::Borrowed("application/json"),
            payload,
        };
        Encoded {
            // Only NATS has subjects; a JSONL sink (empty root) skips building one per event.
            subject: if root.is_empty() {
                String::new()
            } else {
                format!("{root}.{}.{}", event.kind().name(), subject_token(event.namespace.as_deref().unwrap_or("")))
            },
            json: {
                // Sized for a typical event (~450 bytes), so serialising does not regrow it twice.
                let mut json = Vec::with_capacity(512);
                match serde_json::to_writer(&mut json, &event) {
                    Ok(()) => bytes::Bytes::from(json),
                    Err(_) => bytes::Bytes::new(),
                }
            },
            id: event.id,
        }
    })
}

#[cfg(all(test, feature = "decisions"))]
#[test]
fn a_staged_placement_is_three_cache_lines() {
    // What `emit` writes per placement, to memory the drainer reads next: keep it small. Two lines
    // until the usage fields (holdings, model, pool, submission) came in session 32; the third
    // cost nothing measurable (`emit/packed-inline` 249 ns vs 253 ns before, same machine).
    assert!(std::mem::size_of::<Staged>() <= 192, "{} bytes", std::mem::size_of::<Staged>());
}

/// A sink of this process that may still hold events, for [`keep_events_at_panic`].
struct OpenSink {
    /// Weak: being listed keeps no sink alive.
    shared: Weak<Shared>,
    drainer: ThreadId,
}

static OPEN_SINKS: Mutex<Vec<OpenSink>> = Mutex::new(Vec::new());

/// The list of sinks, without those already gone.
fn open_sinks() -> MutexGuard<'static, Vec<OpenSink>> {
    let mut open = OPEN_SINKS.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|s| s.shared.strong_count() > 0);
    open
}

/// For a panic hook: keep the events every open sink of this process still holds the way a
/// shutdown does, before the process ends. Each sink gets up to `grace` to deliver them (a
/// destination that is away is retried at once), then its drainer stops and puts what is left in
/// the spill directory (published by the next run), or counts and logs it as dropped when there
/// is none. A process built with `panic = "abort"` never unwinds, so without this the events in
/// memory would vanish with it, silently.
///
/// Never blocks on a lock the panicking thread may hold (it polls), and returns within about three
/// times `grace`: if a sink's outbox stays locked (the panic came from inside it), or its drainer
/// does not stop in time, the events it holds are reported as lost in the log. A panic on a
/// drainer's own thread spills what its outbox holds at once (the batch in its hands is lost, and
/// counted).
pub fn keep_events_at_panic(grace: Duration) {
    // Another thread may be opening a sink this very moment; the panicking one may be, too.
    let mut listed = None;
    wait_until(Instant::now() + grace, || {
        listed = match OPEN_SINKS.try_lock() {
            Ok(l) => Some(l),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        listed.is_some()
    });
    let Some(mut listed) = listed else {
        tracing::error!("a panic came while a sink was being opened: the events of this process are not kept");
        return;
    };
    let open: Vec<(Arc<Shared>, ThreadId)> =
        listed.iter().filter_map(|s| Some((s.shared.upgrade()?, s.drainer))).collect();
    listed.clear();
    drop(listed);
    let me = std::thread::current().id();
    let (own, others): (Vec<_>, Vec<_>) =
        open.into_iter().filter(|(s, _)| !s.stopped.load(Ordering::SeqCst)).partition(|(_, d)| *d == me);
    // The panic is on this sink's drainer: nobody else will deliver or spill its events.
    for (shared, _) in own {
        match shared.queue.try_lock() {
            Ok(q) => shared.spill_locked(q),
            Err(std::sync::TryLockError::Poisoned(p)) => shared.spill_locked(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                tracing::error!("the events sink panicked holding its outbox: its events are lost")
            }
        }
    }
    let others: Vec<Arc<Shared>> = others.into_iter().map(|(s, _)| s).collect();
    for shared in &others {
        shared.hurry.store(true, Ordering::SeqCst);
        shared.notify.notify_one();
        shared.ready.notify_all();
    }
    let delivered_by = Instant::now() + grace;
    wait_until(delivered_by, || {
        others.iter().all(|s| {
            s.queue.try_lock().is_ok_and(|mut q| {
                q.pull(s);
                q.outbox.held() == 0
            })
        })
    });
    for shared in &others {
        shared.closed.store(true, Ordering::SeqCst);
        shared.ready.notify_all();
        shared.notify.notify_one();
    }
    // A drainer notices `closed` within `IDLE_LOOK` even if its notification came just before it
    // waited; it then spills what it could not deliver, and stops.
    wait_until(Instant::now().max(delivered_by) + grace, || others.iter().all(|s| s.stopped.load(Ordering::SeqCst)));
    for shared in others.iter().filter(|s| !s.stopped.load(Ordering::SeqCst)) {
        match shared.queue.try_lock().map(|q| q.outbox.held()) {
            Ok(0) => {}
            held => tracing::error!(
                events = held.map_or_else(|_| "unknown".to_string(), |n| n.to_string()),
                "events not delivered and not spilled before the panic ended the process: lost"
            ),
        }
    }
}

/// Poll `done` every few milliseconds until it holds (true) or `deadline` passes (false).
fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
