//! Durations as Kubernetes writes them (`metav1.Duration`, Go's `time.ParseDuration`): `2s`,
//! `5m`, `1m30s`, `500ms`, `1.5h`. Configuration files and CRDs use this form.

use std::fmt;
use std::time::Duration;

/// A duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be a duration such as 500ms, 5s, 1m30s or 2h ({problem})")]
pub struct DurationParseError {
    problem: &'static str,
}

fn err(problem: &'static str) -> DurationParseError {
    DurationParseError { problem }
}

/// Parses a Go-style duration. Negative durations are refused (nothing in Bloodraven waits a
/// negative time). `0` alone is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, DurationParseError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.starts_with('-') {
        return Err(err("negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_nanos: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("missing unit"))?;
        if num_len == 0 {
            return Err(err("expected a number"));
        }
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err("unknown unit; use ns, us, ms, s, m or h")),
        };
        total_nanos = total_nanos
            .checked_add(scaled(num, unit_nanos)?)
            .ok_or_else(|| err("too large"))?;
        rest = next;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| err("too large"))?;
    // The remainder is below 10^9 and always fits.
    let sub = u32::try_from(total_nanos % 1_000_000_000).unwrap_or(0);
    Ok(Duration::new(secs, sub))
}

/// `num` (an integer or decimal) times `unit_nanos`, in nanoseconds.
fn scaled(num: &str, unit_nanos: u128) -> Result<u128, DurationParseError> {
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if frac_part.contains('.') || (int_part.is_empty() && frac_part.is_empty()) {
        return Err(err("malformed number"));
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| err("too large"))?
    };
    let mut value = int
        .checked_mul(unit_nanos)
        .ok_or_else(|| err("too large"))?;
    let mut scale = unit_nanos;
    for d in frac_part.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        value = value
            .checked_add(u128::from(d - b'0') * scale)
            .ok_or_else(|| err("too large"))?;
    }
    Ok(value)
}

/// Formats a duration the way [`parse_duration`] reads it (`1m30s`, `500ms`, `0s`).
#[derive(Debug, Clone, Copy)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let f = out;
        if d.is_zero() {
            return f.write_str("0s");
        }
        if d < Duration::from_secs(1) {
            if d.subsec_nanos().is_multiple_of(1_000_000) {
                return write!(f, "{}ms", d.as_millis());
            }
            return write!(f, "{}ns", d.as_nanos());
        }
        let secs = d.as_secs();
        let (hours, mins, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        let ms = d.subsec_millis();
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if mins > 0 {
            write!(f, "{mins}m")?;
        }
        if s > 0 || ms > 0 {
            if ms > 0 {
                write!(f, "{s}.{ms:03}s")?;
            } else {
                write!(f, "{s}s")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("2s", Duration::from_secs(2)),
            ("5m", Duration::from_secs(300)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("250us", Duration::from_micros(250)),
            (".5s", Duration::from_millis(500)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn rejects_bad_durations() {
        for s in [
            "",
            "5",
            "s",
            "-1s",
            "1x",
            "1.2.3s",
            "5 m",
            "1e3s",
            "99999999999999999999999h",
        ] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["2s", "5m", "1m30s", "500ms", "1h", "20s", "0s", "1.250s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&HumanDuration(d).to_string()), Ok(d), "{s}");
        }
        assert_eq!(HumanDuration(Duration::from_secs(90)).to_string(), "1m30s");
    }
}
