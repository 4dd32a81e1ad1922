//! The embedded default sink: one event per line in a local file, so the simulator and a laptop run
//! need no server. Also the reader that `wasmsched events tail` uses for such files.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::outbox::OutboxConfig;
use crate::schema::Event;
use crate::sink::{EventSink, Origin, Shared};

impl EventSink {
    /// Append events to the JSONL file at `path` (created if missing; parent directories too).
    pub fn jsonl(path: impl Into<PathBuf>, origin: Origin, outbox: OutboxConfig) -> Result<EventSink, Error> {
        let path = path.into();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Io { what: format!("create {}", dir.display()), source: e })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::Io { what: format!("open {}", path.display()), source: e })?;
        EventSink::start(origin, outbox, String::new(), "jsonl", move |shared| drain(shared, file, path))
            .map_err(|e| Error::Io { what: "start the event writer".into(), source: e })
    }
}

fn drain(shared: Arc<Shared>, file: File, path: PathBuf) {
    let encode = shared.encoder();
    let mut out = BufWriter::with_capacity(256 << 10, file);
    shared.set_connected(true);
    let mut backoff = Duration::from_millis(100);
    while let Some(mut items) = shared.next_batch() {
        let written = (|| -> io::Result<()> {
            for item in &mut items {
                let rec = item.encoded(&*encode);
                out.write_all(&rec.json)?;
                out.write_all(b"\n")?;
            }
            out.flush()
        })();
        match written {
            Ok(()) => {
                for item in &mut items {
                    shared.delivered_to_tap(&item.encoded(&*encode).json);
                }
                let taken = items.len();
                shared.ack(items, 0);
                shared.linger_after(taken);
                shared.set_error(None);
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                // Disk full or gone: keep the events and retry; the outbox bounds what is held.
                tracing::error!(error = %e, file = %path.display(), "cannot write events");
                shared.set_error(Some(format!("write {}: {e}", path.display())));
                shared.requeue(items);
                if shared.is_closed() {
                    shared.spill_remaining();
                    return;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    let _ = out.flush();
    shared.set_connected(false);
}

/// A line of a JSONL event file that is not an event.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: not an event: {message}")]
pub struct BadLine {
    /// The file.
    pub path: String,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads events from a JSONL file, optionally following appends like `tail -f`.
pub struct JsonlReader {
    path: PathBuf,
    reader: BufReader<File>,
    line: usize,
    partial: String,
}

impl JsonlReader {
    /// Open `path` for reading from its start.
    pub fn open(path: &Path) -> Result<JsonlReader, Error> {
        let file = File::open(path).map_err(|e| Error::Io { what: format!("open {}", path.display()), source: e })?;
        Ok(JsonlReader { path: path.into(), reader: BufReader::new(file), line: 0, partial: String::new() })
    }

    /// The next complete line's event; `Ok(None)` at the current end of the file. A malformed line
    /// is an error naming the file and line; reading can go on after it.
    pub fn next_event(&mut self) -> Result<Option<Event>, Error> {
        loop {
            let mut buf = String::new();
            let n = self
                .reader
                .read_line(&mut buf)
                .map_err(|e| Error::Io { what: format!("read {}", self.path.display()), source: e })?;
            if n == 0 {
                return Ok(None);
            }
            self.partial.push_str(&buf);
            if !self.partial.ends_with('\n') {
                // A line still being written: wait for the rest.
                return Ok(None);
            }
            let text = std::mem::take(&mut self.partial);
            self.line += 1;
            if text.trim().is_empty() {
                continue;
            }
            return serde_json::from_str(&text).map(Some).map_err(|e| {
                Error::BadLine(BadLine {
                    path: self.path.display().to_string(),
                    line: self.line,
                    message: e.to_string(),
                })
            });
        }
    }
}
