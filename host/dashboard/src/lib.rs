//! The dashboard: what the scheduler or the simulator does, for a person to watch.
//!
//! The source (a scheduler's loop, a replay) builds a [`View`] from its own copy-on-write
//! snapshots and hands it to a [`Publisher`] every so often; the scheduling events reach the
//! publisher as a tap on the source's event sink ([`wasmsched_events::Tap`]), from the sink's
//! drainer thread, as its destination gets them. The [`Server`] answers a versioned JSON API (`/api/v1/...`, documented in
//! `docs/dashboard.md`) from the latest view, streams the events to browsers as server-sent
//! events, and serves the pages, which use only that API. It is read-only: nothing a browser sends
//! reaches the source.
//!
//! Nothing here can slow the source down: publishing swaps an `Arc`, and an event is a push onto
//! a batch that goes to a bounded broadcast channel when full or within 50 ms — a browser that
//! reads slowly, or not at all, misses events (it is told how many) rather than holding any back.

mod api;
mod assets;
#[cfg(feature = "browser")]
pub mod browser;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tokio::sync::{broadcast, watch};
pub use view::View;

/// Batches of events kept for browsers that read slowly: one behind by more misses the oldest.
pub const EVENTS_BUFFERED: usize = 1024;
/// Events sent to the browsers together: waking the stream's readers once per batch, not per
/// event, is what keeps the source's cost per event at a push.
const BATCH: usize = 256;
/// The longest an event waits for its batch to fill.
const BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// Events a second the event sink's tap hands the browsers at most: more than a person reads or a
/// page redraws; the rest are counted and the pages told how many (`skipped`). Without it, a
/// scheduler deciding 50,000 pods a second spends a core encoding and streaming events nobody
/// can read (`bench --dashboard-clients`).
pub const EVENTS_PER_SECOND: u32 = 500;
/// The budget is spent in tenths of a second: a burst of decisions gets a tenth of the second's
/// events at once, not all of them.
const BUDGET_WINDOW_MS: u128 = 100;
const EVENTS_PER_WINDOW: u32 = EVENTS_PER_SECOND / 10;

/// Where the source publishes its views and events. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    views: watch::Sender<Arc<View>>,
    events: broadcast::Sender<Arc<Batch>>,
    pending: Arc<std::sync::Mutex<Vec<Arc<str>>>>,
    budget: Arc<Budget>,
}

/// Events sent together, and how many the tap left out since the last batch.
struct Batch {
    events: Vec<Arc<str>>,
    skipped: u64,
}

/// What the sink's tap may still hand the browsers: [`EVENTS_PER_SECOND`], spent per tenth of a
/// second, in atomics so that a source over it pays a count, not a lock.
struct Budget {
    epoch: std::time::Instant,
    /// The current window: tenths of a second since `epoch`.
    window: AtomicU64,
    /// Events taken in it.
    used: AtomicU32,
    /// Events left out since the last batch went out.
    skipped: AtomicU64,
}

impl Default for Publisher {
    fn default() -> Publisher {
        Publisher::new()
    }
}

impl Publisher {
    /// A publisher with an empty view.
    pub fn new() -> Publisher {
        let (views, _) = watch::channel(Arc::new(View::default()));
        let (events, _) = broadcast::channel(EVENTS_BUFFERED);
        let budget = Budget {
            epoch: std::time::Instant::now(),
            window: AtomicU64::new(0),
            used: AtomicU32::new(0),
            skipped: AtomicU64::new(0),
        };
        Publisher { views, events, pending: Arc::default(), budget: Arc::new(budget) }
    }

    /// `view` is what the API shows from now on.
    pub fn publish(&self, view: View) {
        self.views.send_replace(Arc::new(view));
    }

    /// One scheduling event (a JSON object) for the browsers connected now; never blocks: it
    /// joins a batch that goes out when full or within 50 ms. Nothing is kept while none follows.
    pub fn event(&self, json: &str) {
        if self.events.receiver_count() == 0 {
            return;
        }
        let full = {
            let mut pending = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            pending.push(Arc::from(json));
            (pending.len() >= BATCH).then(|| std::mem::take(&mut *pending))
        };
        if let Some(events) = full {
            self.send(events);
        }
    }

    /// Whether the next event of the sink's tap goes to the browsers: some follow, and fewer than
    /// [`EVENTS_PER_SECOND`] went (this tenth of a second: a tenth of them); otherwise, once the budget is spent, it is counted
    /// as skipped.
    fn takes_next(&self) -> bool {
        let b = &self.budget;
        let now = (b.epoch.elapsed().as_millis() / BUDGET_WINDOW_MS) as u64;
        if b.window.swap(now, Ordering::Relaxed) != now {
            b.used.store(0, Ordering::Relaxed);
        }
        if b.used.load(Ordering::Relaxed) >= EVENTS_PER_WINDOW {
            b.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if self.events.receiver_count() == 0 {
            return false;
        }
        b.used.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// `events` to the browsers, with the count of those left out meanwhile.
    fn send(&self, events: Vec<Arc<str>>) {
        let skipped = self.budget.skipped.swap(0, Ordering::Relaxed);
        let _ = self.events.send(Arc::new(Batch { events, skipped }));
    }

    /// Sends what waits in a batch that has not filled (the server does every 50 ms).
    fn flush(&self) {
        let events = std::mem::take(&mut *self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if !events.is_empty() || self.budget.skipped.load(Ordering::Relaxed) > 0 {
            self.send(events);
        }
    }

    /// Browsers following the event stream now.
    pub fn watchers(&self) -> usize {
        self.events.receiver_count()
    }

    /// The latest view.
    pub fn current(&self) -> Arc<View> {
        self.views.borrow().clone()
    }
}

/// The decision stream is a tap on the source's event sink: every event the outbox encodes, as
/// the JSONL file or JetStream gets it, while a page follows.
impl wasmsched_events::Tap for Publisher {
    fn wants(&self) -> bool {
        self.watchers() > 0
    }

    fn accepts(&self) -> bool {
        self.takes_next()
    }

    fn event(&self, json: &[u8]) {
        // The encoder writes JSON, which is UTF-8; anything else is not an event to show.
        if let Ok(json) = std::str::from_utf8(json) {
            Publisher::event(self, json);
        }
    }
}

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address could not be bound.
    #[error("dashboard: cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The dashboard being served.
pub struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Serves `publisher`'s views on `addr` (port 0: any free port) until dropped or stopped.
    pub async fn start(addr: SocketAddr, publisher: Publisher) -> Result<Server, Error> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind { addr, source })?;
        let app = api::router(publisher.clone());
        let task = tokio::spawn(async move {
            // Batches that did not fill go out within BATCH_WAIT.
            let flusher = tokio::spawn(async move {
                let mut tick = tokio::time::interval(BATCH_WAIT);
                loop {
                    tick.tick().await;
                    publisher.flush();
                }
            });
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "dashboard server stopped");
            }
            flusher.abort();
        });
        tracing::info!(url = %format!("http://{addr}/"), "dashboard serving");
        Ok(Server { addr, task })
    }

    /// The address served (the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
