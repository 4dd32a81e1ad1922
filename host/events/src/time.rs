//! Event timestamps: milliseconds since the Unix epoch on the wire as RFC 3339 UTC text.
//!
//! Our own small type rather than a date-time crate: events need exactly one format, and the
//! simulator stamps events with virtual time, so the value must be constructible from a number.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A UTC instant with millisecond precision, written as `2026-11-22T05:56:59.123Z`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        Timestamp(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
    }

    /// The wall-clock time from the kernel's coarse clock (`CLOCK_REALTIME_COARSE` on Linux): the
    /// time of the last timer tick, so up to one tick (1–4 ms) behind [`Timestamp::now`] and never
    /// ahead of it, at a fraction of the cost (no clock-source read). For the placement hot path,
    /// where the millisecond is informational: an event's order is its id's sequence number.
    #[inline]
    pub fn now_coarse() -> Self {
        #[cfg(target_os = "linux")]
        {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
            Timestamp((t.tv_sec.max(0) as u64).saturating_mul(1000) + (t.tv_nsec.max(0) as u64) / 1_000_000)
        }
        #[cfg(not(target_os = "linux"))]
        Self::now()
    }

    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> u64 {
        self.0
    }

    /// Parse RFC 3339 text (`Z` or a numeric offset; fractional seconds truncated to milliseconds).
    pub fn parse(text: &str) -> Result<Self, String> {
        let err = || format!("`{text}` is not an RFC 3339 timestamp like 2026-11-22T05:56:59Z");
        let b = text.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return Err(err());
        }
        if b[13] != b':' || b[16] != b':' {
            return Err(err());
        }
        let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
            let s = text.get(r).ok_or_else(err)?;
            if !s.bytes().all(|c| c.is_ascii_digit()) {
                return Err(err());
            }
            s.parse::<i64>().map_err(|_| err())
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 60
        {
            return Err(err());
        }
        let mut i = 19;
        let mut millis = 0i64;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == start {
                return Err(err());
            }
            let frac = &text[start..i.min(start + 3)];
            millis = frac.parse::<i64>().map_err(|_| err())? * 10i64.pow(3 - frac.len() as u32);
        }
        let offset_minutes = match b.get(i) {
            Some(b'Z' | b'z') if i + 1 == b.len() => 0,
            Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
                let m = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
                if *sign == b'+' { m } else { -m }
            }
            _ => return Err(err()),
        };
        let days = days_from_civil(year, month, day);
        let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_minutes * 60;
        let total = secs * 1000 + millis;
        u64::try_from(total).map(Timestamp).map_err(|_| format!("`{text}` is before 1970"))
    }
}

impl Timestamp {
    /// The RFC 3339 text of years 0000–9999 (every realistic instant) without the formatting
    /// machinery: serialising events is the drainer's main work, and it competes with the
    /// scheduler for the machine.
    fn fixed_text(self) -> Option<[u8; 24]> {
        let secs = (self.0 / 1000) as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        if !(0..=9999).contains(&y) {
            return None;
        }
        let mut out = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut v: u64| {
            for i in (at..at + width).rev() {
                out[i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, 4, y as u64);
        put(5, 2, m as u64);
        put(8, 2, d as u64);
        put(11, 2, (rem / 3600) as u64);
        put(14, 2, (rem % 3600 / 60) as u64);
        put(17, 2, (rem % 60) as u64);
        put(20, 3, self.0 % 1000);
        Some(out)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(text) = self.fixed_text() {
            return f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?);
        }
        let secs = (self.0 / 1000) as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        write!(f, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, self.0 % 1000)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.fixed_text() {
            Some(text) => s.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?),
            None => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 UTC time with milliseconds, e.g. 2026-11-22T05:56:59.123Z"
        })
    }
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_is_never_ahead_and_at_most_a_few_ticks_behind() {
        for _ in 0..1000 {
            let coarse = Timestamp::now_coarse();
            let precise = Timestamp::now();
            assert!(coarse <= precise, "{coarse} after {precise}");
            // One tick is 1–10 ms (HZ 1000..100); allow for a descheduled thread between the reads.
            assert!(precise.0 - coarse.0 < 100, "{coarse} vs {precise}");
        }
    }

    #[test]
    fn formats_and_parses_known_instants() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z, a leap day.
        let t = Timestamp(1_709_210_096_789);
        assert_eq!(t.to_string(), "2024-02-29T12:34:56.789Z");
        assert_eq!(Timestamp::parse("2024-02-29T12:34:56.789Z"), Ok(t));
        assert_eq!(Timestamp::parse("2024-02-29T14:34:56.789123+02:00"), Ok(t));
        assert_eq!(Timestamp::parse("2024-02-29T12:34:56Z"), Ok(Timestamp(1_709_210_096_000)));
    }

    #[test]
    fn round_trips_over_centuries() {
        for days in (-1000..200_000).step_by(97) {
            let ms = (days.max(0) as u64) * 86_400_000 + 45_296_007;
            let t = Timestamp(ms);
            assert_eq!(Timestamp::parse(&t.to_string()), Ok(t), "{t}");
        }
    }

    #[test]
    fn serialised_text_is_the_displayed_text_inside_and_outside_four_digit_years() {
        let mut instants: Vec<u64> = (0..200_000u64).step_by(997).map(|d| d * 86_400_000 + d * 7_919).collect();
        instants.extend([253_402_300_799_999, 253_402_300_800_000, 400_000_000_000_000]);
        for ms in instants {
            let t = Timestamp(ms);
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{t}\""));
        }
        assert_eq!(Timestamp(253_402_300_799_999).to_string(), "9999-12-31T23:59:59.999Z");
        assert_eq!(Timestamp(253_402_300_800_000).to_string(), "10000-01-01T00:00:00.000Z");
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01 00:00:00",
            "yesterday",
            "2024-01-01T00:00:00.Z",
            "1969-12-31T23:59:59Z",
            "2024-01-01T00:00:00+0200",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad}");
        }
    }
}
