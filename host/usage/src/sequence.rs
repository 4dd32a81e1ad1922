//! Which events of each publisher have been read: every sink numbers its events `<prefix>-1`,
//! `<prefix>-2`, … (one prefix per process run), so the numbers seen tell an event read twice from
//! a new one, and the holes between them are events that never arrived — whatever order they come
//! in. Kept as ranges, so a stream read in order costs one range per publisher.

use std::collections::BTreeMap;

use ahash::{AHashMap, AHashSet};
use serde::Serialize;

/// Consecutive sequence numbers seen, with the times of the events at both ends.
#[derive(Clone, Copy, Debug)]
struct Range {
    last: u64,
    first_time: u64,
    last_time: u64,
}

/// Sequence numbers seen per publisher, and ids of other shapes.
#[derive(Default)]
pub(crate) struct Seen {
    by_prefix: AHashMap<Box<str>, BTreeMap<u64, Range>>,
    other: AHashSet<Box<str>>,
}

/// Events that never arrived: numbers missing between two read, or before the first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// The publisher's id prefix (one per process run).
    pub publisher: String,
    /// First missing sequence number.
    pub from_seq: u64,
    /// Last missing sequence number.
    pub to_seq: u64,
    /// Time of the last event read before the gap (`None` when the gap is at the start: events
    /// published before the first one read).
    pub after: Option<u64>,
    /// Time of the first event read after it.
    pub before: u64,
}

impl Seen {
    /// Record event `id` at `time`; false when it was seen before.
    pub(crate) fn first_time(&mut self, id: &str, time: u64) -> bool {
        let Some((prefix, seq)) = id.rsplit_once('-').and_then(|(p, s)| Some((p, s.parse::<u64>().ok()?))) else {
            return self.other.insert(id.into());
        };
        let ranges = match self.by_prefix.get_mut(prefix) {
            Some(r) => r,
            None => self.by_prefix.entry(prefix.into()).or_default(),
        };
        // The range at or before `seq`.
        if let Some((&start, r)) = ranges.range_mut(..=seq).next_back() {
            if seq <= r.last {
                return false;
            }
            if seq == r.last + 1 {
                r.last = seq;
                r.last_time = time;
                // It may now touch the next range.
                if let Some((&next, &n)) = ranges.range(seq + 1..).next()
                    && next == seq + 1
                {
                    ranges.remove(&next);
                    let r = ranges.get_mut(&start).expect("the range just extended");
                    r.last = n.last;
                    r.last_time = n.last_time;
                }
                return true;
            }
        }
        match ranges.get(&(seq + 1)).copied() {
            Some(next) => {
                ranges.remove(&(seq + 1));
                ranges.insert(seq, Range { last: next.last, first_time: time, last_time: next.last_time });
            }
            None => {
                ranges.insert(seq, Range { last: seq, first_time: time, last_time: time });
            }
        }
        true
    }

    /// Every hole, by publisher and number.
    pub(crate) fn gaps(&self) -> Vec<Gap> {
        let mut gaps = Vec::new();
        let mut prefixes: Vec<&Box<str>> = self.by_prefix.keys().collect();
        prefixes.sort();
        for prefix in prefixes {
            let mut previous: Option<(u64, u64)> = None;
            let mut expected = 1;
            for (&first, r) in &self.by_prefix[prefix] {
                if first > expected {
                    gaps.push(Gap {
                        publisher: prefix.to_string(),
                        from_seq: expected,
                        to_seq: first - 1,
                        after: previous.map(|(_, t)| t),
                        before: r.first_time,
                    });
                }
                previous = Some((r.last, r.last_time));
                expected = r.last + 1;
            }
        }
        gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_any_order_merge_into_ranges_and_repeats_are_refused() {
        let mut seen = Seen::default();
        let order = [5u64, 1, 3, 2, 4, 9, 7, 8];
        for (i, n) in order.iter().enumerate() {
            assert!(seen.first_time(&format!("abc-{n}"), n * 10), "{n} at {i}");
        }
        for n in order {
            assert!(!seen.first_time(&format!("abc-{n}"), 0), "{n} twice");
        }
        assert_eq!(
            seen.gaps(),
            vec![Gap { publisher: "abc".into(), from_seq: 6, to_seq: 6, after: Some(50), before: 70 }]
        );
        assert_eq!(seen.by_prefix["abc"].len(), 2);
        assert!(seen.first_time("abc-6", 60));
        assert_eq!(seen.gaps(), vec![]);
        assert_eq!(seen.by_prefix["abc"].len(), 1);
    }

    #[test]
    fn a_stream_read_from_its_middle_has_a_gap_at_its_start() {
        let mut seen = Seen::default();
        assert!(seen.first_time("p-q-100", 1000));
        assert!(seen.first_time("other-id", 0));
        assert!(!seen.first_time("other-id", 0));
        assert_eq!(
            seen.gaps(),
            vec![Gap { publisher: "p-q".into(), from_seq: 1, to_seq: 99, after: None, before: 1000 }]
        );
    }
}
