//! Wall-clock instants as plain values.
//!
//! The core never reads a clock: every decision that depends on time takes a [`Timestamp`] as an
//! argument. A `Timestamp` is milliseconds since the Unix epoch (UTC). It serialises as an
//! RFC 3339 string (`2026-11-30T10:00:30Z`, with milliseconds when they are not zero) because
//! that is what the API, the status objects and humans read.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Milliseconds since the Unix epoch, UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

/// The earliest and latest instants a [`Timestamp`] may hold: years 0001 to 9999, the range
/// RFC 3339 can express.
const MIN_MILLIS: i64 = -62_135_596_800_000;
const MAX_MILLIS: i64 = 253_402_300_799_999;

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// Builds a timestamp from milliseconds since the epoch, clamped to years 0001–9999.
    pub fn from_unix_millis(ms: i64) -> Self {
        Timestamp(ms.clamp(MIN_MILLIS, MAX_MILLIS))
    }

    /// Builds a timestamp from whole seconds since the epoch.
    pub fn from_unix_seconds(s: i64) -> Self {
        Self::from_unix_millis(s.saturating_mul(1000))
    }

    pub fn unix_millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch, rounded down.
    pub fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// `self + d`, saturating at the representable range.
    #[must_use]
    pub fn plus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self::from_unix_millis(self.0.saturating_add(ms))
    }

    /// `self - d`, saturating at the representable range.
    #[must_use]
    pub fn minus(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self::from_unix_millis(self.0.saturating_sub(ms))
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is not earlier.
    pub fn since(self, earlier: Timestamp) -> Duration {
        let diff = self.0.saturating_sub(earlier.0);
        Duration::from_millis(u64::try_from(diff).unwrap_or(0))
    }

    /// Seconds from `self` until `later`, rounded up, never negative.
    pub fn seconds_until(self, later: Timestamp) -> u64 {
        let ms = later.0.saturating_sub(self.0);
        u64::try_from(ms).map_or(0, |ms| ms.div_ceil(1000))
    }

    /// Parses an RFC 3339 timestamp (any offset; normalised to UTC).
    pub fn parse_rfc3339(s: &str) -> Result<Self, TimestampParseError> {
        let dt = OffsetDateTime::parse(s, &Rfc3339)
            .map_err(|_| TimestampParseError { input_len: s.len() })?;
        let ms = dt.unix_timestamp_nanos() / 1_000_000;
        let ms = i64::try_from(ms).map_err(|_| TimestampParseError { input_len: s.len() })?;
        Ok(Self::from_unix_millis(ms))
    }

    /// Formats as RFC 3339 in UTC (`Z`), with milliseconds only when they are not zero.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(dt) => {
                let dt = if self.0.rem_euclid(1000) == 0 {
                    dt.replace_nanosecond(0).unwrap_or(dt)
                } else {
                    dt
                };
                dt.format(&Rfc3339).unwrap_or_else(|_| self.0.to_string())
            }
            // Unreachable for clamped values; keep a readable fallback instead of panicking.
            Err(_) => self.0.to_string(),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// A source of wall-clock time. The runtime's implementation reads the system clock (the only
/// place that may); tests use [`ManualClock`] to pause, advance and skew it.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// A clock that only moves when told to. Shared between threads; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(
            start.unix_millis(),
        )))
    }

    pub fn set(&self, t: Timestamp) {
        self.0
            .store(t.unix_millis(), std::sync::atomic::Ordering::SeqCst);
    }

    pub fn advance(&self, d: Duration) {
        let now = self.now().plus(d);
        self.set(now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// An RFC 3339 string could not be parsed. Carries only the input's length, never the input,
/// so a secret pasted into a time field cannot leak through an error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an RFC 3339 timestamp (e.g. 2026-11-30T10:00:30Z); got {input_len} characters")]
pub struct TimestampParseError {
    input_len: usize,
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Timestamp::parse_rfc3339(&s).map_err(serde::de::Error::custom)
    }
}

/// An RFC 3339 string in the CRDs' schemas.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Timestamp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "date-time", "maxLength": 64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_whole_seconds_without_fraction() {
        let t = Timestamp::parse_rfc3339("2026-11-30T10:00:30Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-30T10:00:30Z");
        assert_eq!(
            t.plus(Duration::from_millis(250)).to_rfc3339(),
            "2026-11-30T10:00:30.25Z"
        );
    }

    #[test]
    fn parses_offsets_to_utc() {
        let a = Timestamp::parse_rfc3339("2026-11-30T12:00:30+02:00").unwrap();
        let b = Timestamp::parse_rfc3339("2026-11-30T10:00:30Z").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn rejects_garbage_without_echoing_it() {
        let err = Timestamp::parse_rfc3339("hunter2").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_unix_millis(i64::MAX);
        assert_eq!(t.plus(Duration::from_secs(10)), t);
        let z = Timestamp::from_unix_seconds(100);
        assert_eq!(z.since(z.plus(Duration::from_secs(1))), Duration::ZERO);
        assert_eq!(z.seconds_until(z.plus(Duration::from_millis(1001))), 2);
        assert_eq!(z.plus(Duration::from_secs(3)).seconds_until(z), 0);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp::from_unix_seconds(10));
        let shared = c.clone();
        assert_eq!(c.now(), Timestamp::from_unix_seconds(10));
        shared.advance(Duration::from_millis(1500));
        assert_eq!(c.now().unix_millis(), 11_500);
        c.set(Timestamp::EPOCH);
        assert_eq!(shared.now(), Timestamp::EPOCH);
    }

    #[test]
    fn serde_round_trip() {
        let t = Timestamp::from_unix_millis(1_796_032_830_123);
        let json = serde_json::to_string(&t).unwrap();
        let back: Timestamp = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }
}
