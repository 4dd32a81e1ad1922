//! CPU lists in the kernel's list format (`0-23,48-71`), as nvidia-smi, sysfs and numactl print them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A set of logical CPU ids, kept sorted and without duplicates.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(Vec<u32>);

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

/// The largest CPU id accepted, so that a hostile `0-4294967295` cannot allocate gigabytes.
pub const MAX_CPU: u32 = 65_535;

impl CpuSet {
    /// Parses `0-23,48-71` (also `N/A` or empty as the empty set).
    pub fn parse(text: &str) -> Result<CpuSet, String> {
        let text = text.trim();
        if text.is_empty() || text.eq_ignore_ascii_case("N/A") {
            return Ok(CpuSet::default());
        }
        let mut cpus = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let parse = |s: &str| {
                s.trim().parse::<u32>().map_err(|_| format!("bad CPU list `{text}`: `{part}` is not a CPU id or range"))
            };
            let (lo, hi) = (parse(lo)?, parse(hi)?);
            if lo > hi || hi > MAX_CPU {
                return Err(format!("bad CPU list `{text}`: range `{part}` is reversed or beyond CPU {MAX_CPU}"));
            }
            cpus.extend(lo..=hi);
        }
        Ok(CpuSet::from_iter(cpus))
    }

    /// The CPU ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Number of CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no CPU is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.binary_search(&cpu).is_ok()
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut cpus: Vec<u32> = iter.into_iter().collect();
        cpus.sort_unstable();
        cpus.dedup();
        CpuSet(cpus)
    }
}

impl fmt::Display for CpuSet {
    /// The compact list format: consecutive ids become ranges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        CpuSet::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_list_format() {
        let set = CpuSet::parse("0-23,48-71").unwrap();
        assert_eq!(set.len(), 48);
        assert!(set.contains(48) && !set.contains(24));
        assert_eq!(set.to_string(), "0-23,48-71");
        assert_eq!(CpuSet::parse("5,1,2,3").unwrap().to_string(), "1-3,5");
        assert!(CpuSet::parse("N/A").unwrap().is_empty());
    }

    #[test]
    fn refuses_garbage_and_huge_ranges() {
        assert!(CpuSet::parse("0-x").unwrap_err().contains("not a CPU id"));
        assert!(CpuSet::parse("9-3").unwrap_err().contains("reversed"));
        assert!(CpuSet::parse("0-4294967295").unwrap_err().contains("beyond"));
    }
}
