//! The dashboard: what the scheduler or the simulator does, for a person to watch.
//!
//! The source (a scheduler's loop, a replay) builds a [`View`] from its own copy-on-write
//! snapshots and hands it to a [`Publisher`] every so often, and pushes each scheduling event as a
//! JSON line. The [`Server`] answers a versioned JSON API (`/api/v1/...`, documented in
//! `docs/dashboard.md`) from the latest view, streams the events to browsers as server-sent
//! events, and serves the pages, which use only that API. It is read-only: nothing a browser sends
//! reaches the source.
//!
//! Nothing here can slow the source down: publishing swaps an `Arc`, and an event is one
//! non-blocking send on a bounded broadcast channel — a browser that reads slowly, or not at all,
//! misses events (it is told how many) rather than holding any back.

mod api;
mod assets;
#[cfg(feature = "browser")]
pub mod browser;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};
pub use view::View;

/// Events kept for browsers that read slowly: one behind by more misses the oldest.
pub const EVENTS_BUFFERED: usize = 1024;

/// Where the source publishes its views and events. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    views: watch::Sender<Arc<View>>,
    events: broadcast::Sender<Arc<str>>,
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
        Publisher { views, events }
    }

    /// `view` is what the API shows from now on.
    pub fn publish(&self, view: View) {
        self.views.send_replace(Arc::new(view));
    }

    /// One scheduling event (a JSON object) for the browsers connected now; never blocks, and
    /// costs one serialisation-free send when none is.
    pub fn event(&self, json: &str) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(Arc::from(json));
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
        let app = api::router(publisher);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "dashboard server stopped");
            }
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
