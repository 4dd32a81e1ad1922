//! The watcher thread: polls sources and prepares what they deliver, off the hot path.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::prepare::Preparer;
use crate::registry::Registry;
use crate::source::Source;

/// Polls sources every interval until stopped (or dropped).
pub struct Watcher {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Start polling `sources` every `interval`. Each new version is prepared on this thread and
    /// offered to `registry`; failures are recorded in its status and events, and the live version
    /// keeps running.
    pub fn spawn(
        registry: Arc<Registry>,
        preparer: Preparer,
        mut sources: Vec<Box<dyn Source>>,
        interval: Duration,
    ) -> std::io::Result<Watcher> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new().name("wasmsched-policy-watch".into()).spawn(move || {
            loop {
                for source in &mut sources {
                    poll_once(&registry, &preparer, source.as_mut());
                }
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
        Ok(Watcher { stop: Some(stop), handle: Some(handle) })
    }

    /// Stop and wait for the thread (a preparation under way finishes first).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Poll `source` once and offer what it delivers.
pub fn poll_once(registry: &Registry, preparer: &Preparer, source: &mut dyn Source) {
    let name = source.describe();
    match source.poll() {
        Ok(Some(fetched)) => {
            registry.source_ok(&name);
            // Rejections are recorded (status, history, `policy-rejected`) by the registry.
            let _ = registry.offer(&fetched, preparer);
        }
        Ok(None) => registry.source_ok(&name),
        Err(e) => registry.report_fetch_failure(&name, &e.to_string()),
    }
}
