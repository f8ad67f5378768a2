//! Go `time.Duration` strings (`"20m"`, `"1h30m"`, `"2h0m0s"`), as `metav1.Duration` writes them.
//!
//! The wire value is kept as the string it was written as (so JSON round-trips byte for byte),
//! with helpers to convert to and from [`std::time::Duration`].

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A duration in Go syntax, stored verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GoDuration(String);

/// Why a Go duration string could not be converted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationParseError {
    #[error("invalid duration {0:?}: empty")]
    Empty(String),
    #[error("invalid duration {0:?}: expected a number")]
    ExpectedNumber(String),
    #[error("invalid duration {0:?}: missing unit")]
    MissingUnit(String),
    #[error("invalid duration {0:?}: unknown unit {1:?}")]
    UnknownUnit(String, String),
    #[error("invalid duration {0:?}: negative durations are not supported here")]
    Negative(String),
    #[error("invalid duration {0:?}: out of range")]
    Overflow(String),
}

const NANOS_PER_SEC: u128 = 1_000_000_000;
/// Go durations are an int64 of nanoseconds.
const MAX_NANOS: u128 = i64::MAX as u128;

impl GoDuration {
    /// Wraps a string as written (not validated; see [`GoDuration::to_std`]).
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// Formats a duration the way Go's `Duration.String()` does (`20m0s`, `2h0m0s`, `1.5s`).
    pub fn from_std(d: Duration) -> Self {
        Self(format_go(d))
    }

    /// The string as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the string with Go's `time.ParseDuration` rules; negative values are an error.
    pub fn to_std(&self) -> Result<Duration, DurationParseError> {
        parse_go(&self.0)
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        Self::from_std(d)
    }
}

impl TryFrom<&GoDuration> for Duration {
    type Error = DurationParseError;
    fn try_from(d: &GoDuration) -> Result<Self, Self::Error> {
        d.to_std()
    }
}

impl JsonSchema for GoDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GoDuration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3_600 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or a bare `0`.
pub fn parse_go(input: &str) -> Result<Duration, DurationParseError> {
    let err_input = || input.to_owned();
    let (negative, mut rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        Some(_) => (false, input),
        None => return Err(DurationParseError::Empty(err_input())),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationParseError::Empty(err_input()));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after_int) = rest.split_at(int_len);
        let (frac_part, after_num) = match after_int.strip_prefix('.') {
            Some(after_dot) => {
                let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
                after_dot.split_at(frac_len)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(DurationParseError::ExpectedNumber(err_input()));
        }
        let unit_len = after_num
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(after_num.len(), |(i, _)| i);
        let (unit, after_unit) = after_num.split_at(unit_len);
        if unit.is_empty() {
            return Err(DurationParseError::MissingUnit(err_input()));
        }
        let scale = unit_nanos(unit)
            .ok_or_else(|| DurationParseError::UnknownUnit(err_input(), unit.to_owned()))?;
        let overflow = || DurationParseError::Overflow(err_input());
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| overflow())?
        };
        let mut value = whole.checked_mul(scale).ok_or_else(overflow)?;
        // Fractions are truncated to whole nanoseconds, like Go.
        let mut frac_scale = scale;
        for digit in frac_part.bytes() {
            frac_scale /= 10;
            if frac_scale == 0 {
                break;
            }
            value = value
                .checked_add(u128::from(digit - b'0') * frac_scale)
                .ok_or_else(overflow)?;
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or_else(overflow)?;
        rest = after_unit;
    }
    if negative && total != 0 {
        return Err(DurationParseError::Negative(err_input()));
    }
    let secs = u64::try_from(total / NANOS_PER_SEC)
        .map_err(|_| DurationParseError::Overflow(err_input()))?;
    let nanos = u32::try_from(total % NANOS_PER_SEC)
        .map_err(|_| DurationParseError::Overflow(err_input()))?;
    Ok(Duration::new(secs, nanos))
}

/// Go's `Duration.String()`.
pub fn format_go(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < NANOS_PER_SEC {
        let (unit_nanos, unit) = if nanos < 1_000 {
            (1, "ns")
        } else if nanos < 1_000_000 {
            (1_000, "\u{b5}s")
        } else {
            (1_000_000, "ms")
        };
        return format!("{}{unit}", fixed_point(nanos, unit_nanos));
    }
    let hours = nanos / (3_600 * NANOS_PER_SEC);
    let minutes = (nanos / (60 * NANOS_PER_SEC)) % 60;
    let seconds = fixed_point(nanos % (60 * NANOS_PER_SEC), NANOS_PER_SEC);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `value / unit` with the fraction written out and trailing zeros dropped.
fn fixed_point(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Duration, DurationParseError> {
        GoDuration::new(s).to_std()
    }

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("2h0m0s"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse("3."),
            Err(DurationParseError::MissingUnit("3.".into()))
        );
        assert_eq!(parse("3.s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse("7us"), Ok(Duration::from_micros(7)));
        assert_eq!(parse("7\u{b5}s"), Ok(Duration::from_micros(7)));
        assert_eq!(parse("7\u{3bc}s"), Ok(Duration::from_micros(7)));
        assert_eq!(parse("15ns"), Ok(Duration::from_nanos(15)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("+5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("-0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1h1m1s1ms1us1ns"), Ok(Duration::new(3661, 1_001_001)));
    }

    #[test]
    fn rejects_what_go_rejects() {
        assert!(matches!(parse(""), Err(DurationParseError::Empty(_))));
        assert!(matches!(parse("-"), Err(DurationParseError::Empty(_))));
        assert!(matches!(
            parse("20"),
            Err(DurationParseError::MissingUnit(_))
        ));
        assert!(matches!(
            parse("s"),
            Err(DurationParseError::ExpectedNumber(_))
        ));
        assert!(matches!(
            parse("."),
            Err(DurationParseError::ExpectedNumber(_))
        ));
        assert!(matches!(parse("3d"), Err(DurationParseError::UnknownUnit(_, u)) if u == "d"));
        assert!(matches!(
            parse("1h 2m"),
            Err(DurationParseError::UnknownUnit(..))
        ));
        assert!(matches!(parse("-5s"), Err(DurationParseError::Negative(_))));
        assert!(matches!(
            parse("9999999999h"),
            Err(DurationParseError::Overflow(_))
        ));
        // Go's limit is i64::MAX nanoseconds, about 2562047h.
        assert!(parse("2562047h").is_ok());
        assert!(matches!(
            parse("2562048h"),
            Err(DurationParseError::Overflow(_))
        ));
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_go(Duration::ZERO), "0s");
        assert_eq!(format_go(Duration::from_secs(1200)), "20m0s");
        assert_eq!(format_go(Duration::from_secs(7200)), "2h0m0s");
        assert_eq!(format_go(Duration::from_secs(5405)), "1h30m5s");
        assert_eq!(format_go(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_go(Duration::from_millis(300)), "300ms");
        assert_eq!(format_go(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(format_go(Duration::from_nanos(1500)), "1.5\u{b5}s");
        assert_eq!(format_go(Duration::from_nanos(15)), "15ns");
        assert_eq!(format_go(Duration::new(61, 1)), "1m1.000000001s");
    }

    #[test]
    fn format_then_parse_is_identity() {
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(999),
            Duration::from_millis(1234),
            Duration::new(3661, 5),
            Duration::from_secs(7 * 24 * 3600),
        ] {
            assert_eq!(GoDuration::from_std(d).to_std(), Ok(d), "{d:?}");
        }
    }

    #[test]
    fn serde_keeps_the_string_as_written() {
        let d: GoDuration = serde_json::from_str("\"20m\"").expect("a string");
        assert_eq!(d.as_str(), "20m");
        assert_eq!(serde_json::to_string(&d).expect("serialises"), "\"20m\"");
    }
}
