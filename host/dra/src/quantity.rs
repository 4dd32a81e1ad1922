//! Kubernetes resource quantities (`80Gi`, `500m`, `1.5`, `2e3`) as exact numbers, for device
//! capacities and CEL's `quantity()`.

use std::fmt;

/// A quantity in nano-units (10⁻⁹), exact for every suffix Kubernetes accepts down to `n`; smaller
/// fractions round up, as the API server rounds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(pub i128);

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a quantity (a number with an optional suffix: Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or e<exponent>)"
)]
pub struct BadQuantity(pub String);

const NANO: i128 = 1_000_000_000;

impl Quantity {
    /// Parse the Kubernetes quantity syntax.
    pub fn parse(text: &str) -> Result<Quantity, BadQuantity> {
        let bad = || BadQuantity(text.to_string());
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(bad());
        }
        let digits: i128 = format!("{whole}{fraction}").parse().map_err(|_| bad())?;
        // value = digits × 10^-fraction_len × multiplier, in nano-units.
        let (numerator, denominator): (i128, i128) = match suffix {
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let power = 10 * (1 + "KMGTPE".find(&suffix[..1]).expect("listed") as u32);
                (NANO.checked_mul(1i128 << power).ok_or_else(bad)?, 1)
            }
            _ => {
                let exponent: i32 = match suffix {
                    "n" => -9,
                    "u" => -6,
                    "m" => -3,
                    "" => 0,
                    "k" => 3,
                    "M" => 6,
                    "G" => 9,
                    "T" => 12,
                    "P" => 15,
                    "E" => 18,
                    e if e.starts_with(['e', 'E']) => e[1..].parse().map_err(|_| bad())?,
                    _ => return Err(bad()),
                };
                let exponent = exponent + 9;
                if !(-40..=30).contains(&exponent) {
                    return Err(bad());
                }
                if exponent >= 0 { (10i128.pow(exponent as u32), 1) } else { (1, 10i128.pow((-exponent) as u32)) }
            }
        };
        let scale = 10i128.checked_pow(fraction.len() as u32).ok_or_else(bad)?;
        let top = digits.checked_mul(numerator).ok_or_else(bad)?;
        let bottom = denominator.checked_mul(scale).ok_or_else(bad)?;
        // Round up what is below a nano-unit.
        let magnitude = top / bottom + i128::from(top % bottom != 0);
        Ok(Quantity(if negative { -magnitude } else { magnitude }))
    }

    /// The quantity as a whole number, if it is one.
    pub fn as_integer(self) -> Option<i64> {
        (self.0 % NANO == 0).then(|| i64::try_from(self.0 / NANO).ok()).flatten()
    }

    /// The nearest `f64`.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / NANO as f64
    }
}

impl fmt::Display for Quantity {
    /// Plain decimal (`42949672960`, `0.5`): unambiguous in messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, nanos) = (self.0 / NANO, (self.0 % NANO).abs());
        if nanos == 0 {
            return write!(f, "{whole}");
        }
        let sign = if self.0 < 0 && whole == 0 { "-" } else { "" };
        let fraction = format!("{nanos:09}");
        write!(f, "{sign}{whole}.{}", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suffix_kind_parses_exactly() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("80Gi"), Quantity(80 * (1 << 30) * NANO));
        assert_eq!(q("1.5Gi"), Quantity(3 * (1 << 29) * NANO));
        assert_eq!(q("500m"), Quantity(NANO / 2));
        assert_eq!(q("40G"), Quantity(40_000_000_000 * NANO));
        assert_eq!(q("2e3"), Quantity(2000 * NANO));
        assert_eq!(q("1"), Quantity(NANO));
        assert_eq!(q("-3k"), Quantity(-3000 * NANO));
        assert_eq!(q(".5"), Quantity(NANO / 2));
        assert_eq!(q("1n"), Quantity(1));
        assert_eq!(q("0.1n"), Quantity(1), "below a nano-unit rounds up");
        assert_eq!(q("80Gi").as_integer(), Some(85_899_345_920));
        assert_eq!(q("500m").as_integer(), None);
        assert_eq!(q("500m").to_string(), "0.5");
        assert_eq!(q("-500m").to_string(), "-0.5");
    }

    #[test]
    fn malformed_quantities_are_refused() {
        for bad in
            ["", "Gi", "1.2.3", "1Qi", "1e", "1e99", "abc", "1 Gi", "99999999999999999999999999999999999999999Ei"]
        {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
    }
}
