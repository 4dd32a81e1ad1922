//! Reading events for usage: a JSONL file, or a NATS JetStream durable consumer whose events are
//! appended to a local journal before the server is told they were read.
//!
//! The journal is what makes the durable consumer exact across restarts: the consumer's position
//! moves past an event only once the event is on disk (written and synced), and a batch that a
//! crash interrupted comes again and is appended again — the ledger reads each id once. It is
//! also the billing record when the stream's own retention has let old events go.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use wasmsched_events::NatsConfig;

use crate::facts::Parsed;
use crate::{Error, Ledger};

/// Read every line of the JSONL file at `path` into `ledger`.
pub fn read_file(path: &Path, ledger: &mut Ledger) -> Result<(), Error> {
    let file = File::open(path).map_err(|e| Error::Io { what: format!("open {}", path.display()), source: e })?;
    read(file, &path.display().to_string(), ledger)
}

/// Bytes read and parsed at a time.
const BLOCK: usize = 4 << 20;

/// Read every line of `input` into `ledger`; `name` says where lines came from in reports.
///
/// Parsing is most of the work and each line parses alone, so a block of lines is parsed on every
/// CPU at once; the ledger then takes the results in order, on this thread.
pub fn read(mut input: impl Read, name: &str, ledger: &mut Ledger) -> Result<(), Error> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let mut buf: Vec<u8> = Vec::with_capacity(BLOCK + (64 << 10));
    let mut number = 0usize;
    let mut eof = false;
    while !eof {
        // Fill to a block, then keep whole lines only (the rest starts the next block).
        let want = BLOCK.saturating_sub(buf.len()).max(64 << 10) as u64;
        let got = (&mut input)
            .take(want)
            .read_to_end(&mut buf)
            .map_err(|e| Error::Io { what: format!("read {name}"), source: e })?;
        eof = got == 0;
        let end = if eof {
            buf.len()
        } else {
            match buf.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                // One line longer than the block: read on.
                None => {
                    buf.reserve(BLOCK);
                    continue;
                }
            }
        };
        let mut lines: Vec<(usize, &[u8])> = Vec::new();
        for line in buf[..end].split(|&b| b == b'\n') {
            number += 1;
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push((number, line));
            }
        }
        // `split` yields an empty piece after the last line break: not a line.
        if buf[..end].ends_with(b"\n") {
            number -= 1;
        }
        let chunk = lines.len().div_ceil(workers).max(1);
        let parsed: Vec<Vec<_>> = std::thread::scope(|s| {
            let jobs: Vec<_> = lines
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().map(|(n, l)| (*n, Parsed::line(l))).collect::<Vec<_>>()))
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        for (n, result) in parsed.into_iter().flatten() {
            ledger.take(result, || format!("{name}:{n}"));
        }
        buf.drain(..end);
    }
    Ok(())
}

/// Append every event waiting for durable consumer `durable` to the journal at `journal`
/// (created if missing), acknowledging each batch once it is synced to disk. Returns the events
/// appended.
pub fn pull(config: &NatsConfig, durable: &str, journal: &Path) -> Result<u64, Error> {
    let mut file = open_journal(journal)?;
    let what = || format!("append to {}", journal.display());
    let appended = wasmsched_events::pull_durable(config, durable, 4096, |batch| {
        let mut text = Vec::with_capacity(batch.iter().map(|b| b.len() + 1).sum());
        for event in batch {
            // A message is one event's JSON, never a line break inside (the sink writes compact
            // JSON); one that had some would be split into malformed lines, not lost silently.
            text.extend_from_slice(event);
            text.push(b'\n');
        }
        file.write_all(&text).and_then(|()| file.sync_data()).map_err(|e| format!("{}: {e}", what()))
    })?;
    Ok(appended)
}

/// The journal opened for appending, a partial last line (a crash while writing: its event was
/// not acknowledged and comes again) cut off first.
fn open_journal(path: &Path) -> Result<File, Error> {
    let io = |what: &str, e| Error::Io { what: format!("{what} {}", path.display()), source: e };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
    }
    let mut file = OpenOptions::new().create(true).read(true).append(true).open(path).map_err(|e| io("open", e))?;
    let len = file.metadata().map_err(|e| io("stat", e))?.len();
    if len > 0 {
        // Find the last line break in the tail.
        let tail = len.min(1 << 20);
        file.seek(SeekFrom::Start(len - tail)).map_err(|e| io("seek in", e))?;
        let mut bytes = Vec::with_capacity(tail as usize);
        file.read_to_end(&mut bytes).map_err(|e| io("read", e))?;
        if bytes.last() != Some(&b'\n') {
            let keep = match bytes.iter().rposition(|&b| b == b'\n') {
                Some(i) => len - tail + i as u64 + 1,
                None if tail == len => 0,
                None => return Err(io("find the last line of", std::io::Error::other("a line over 1 MiB"))),
            };
            tracing::warn!(journal = %path.display(), cut = len - keep, "cutting a partly written last line; its event comes again");
            file.set_len(keep).map_err(|e| io("truncate", e))?;
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partly_written_last_line_is_cut_and_whole_lines_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j/usage.jsonl");
        drop(open_journal(&path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::write(&path, b"{\"a\":1}\n{\"b\":").unwrap();
        let mut f = open_journal(&path).unwrap();
        f.write_all(b"{\"c\":3}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n{\"c\":3}\n");
        std::fs::write(&path, b"{\"half").unwrap();
        drop(open_journal(&path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }
}
