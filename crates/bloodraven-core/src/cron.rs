//! Cron schedules (`spec.backup.schedule`): five fields — minute, hour, day of month, month,
//! day of week — read in UTC, or `@hourly`, `@daily`, `@weekly`, `@monthly`. Pure: when the
//! next run is after a given instant, and whether one is due.
//!
//! As in cron, when both the day-of-month and the day-of-week fields are restricted (neither
//! is `*`), a day that matches either runs; day of week 7 is Sunday, like 0.

use time::OffsetDateTime;

use crate::time::Timestamp;

/// A parsed `spec.backup.schedule`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, Sunday 0.
    weekdays: u8,
    /// Whether the day-of-month and day-of-week fields were both restricted (`*` in neither):
    /// cron then runs on a day that matches either.
    either_day: bool,
}

/// Why a schedule is not valid. The message names the field and the rule; it never echoes
/// more than the field's own text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "spec.backup.schedule must have five fields (minute hour day-of-month month day-of-week, UTC) or be @hourly, @daily, @weekly or @monthly; it has {0}"
    )]
    FieldCount(usize),
    #[error(
        "spec.backup.schedule: the {field} field {text:?} is not a number, `*`, a range `a-b`, a step `/n` or a list of them"
    )]
    Syntax { field: &'static str, text: String },
    #[error("spec.backup.schedule: the {field} field's value {value} is outside {min}-{max}")]
    Range {
        field: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
}

/// The five fields: name, lowest and highest value.
const FIELDS: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

impl Schedule {
    /// Parses a cron expression (UTC).
    pub fn parse(text: &str) -> Result<Schedule, ScheduleError> {
        let expanded = match text.trim() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(ScheduleError::FieldCount(parts.len()));
        }
        let mut bits = [0u64; 5];
        for (i, part) in parts.iter().enumerate() {
            bits[i] = field_bits(part, FIELDS[i])?;
        }
        // Day of week 7 is Sunday, as 0.
        let weekdays = (bits[4] | (bits[4] >> 7)) & 0x7f;
        Ok(Schedule {
            minutes: bits[0],
            hours: u32::try_from(bits[1]).unwrap_or(u32::MAX),
            days: u32::try_from(bits[2]).unwrap_or(u32::MAX),
            months: u16::try_from(bits[3]).unwrap_or(u16::MAX),
            weekdays: u8::try_from(weekdays).unwrap_or(u8::MAX),
            either_day: parts[2] != "*" && parts[4] != "*",
        })
    }

    fn day_matches(&self, dt: OffsetDateTime) -> bool {
        let dom = self.days & (1 << dt.day()) != 0;
        let dow = self.weekdays & (1 << dt.weekday().number_days_from_sunday()) != 0;
        if self.either_day {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// The first whole minute strictly after `t` that the schedule names; `None` when none
    /// comes within five years (`30 0 31 2 *`: February never has a 31st).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        // Start at the next whole minute.
        let mut minute = t.unix_seconds().div_euclid(60) + 1;
        let limit = minute + 5 * 366 * 24 * 60;
        while minute < limit {
            let dt = OffsetDateTime::from_unix_timestamp(minute * 60).ok()?;
            if self.months & (1 << u8::from(dt.month())) == 0 || !self.day_matches(dt) {
                // The rest of this day cannot match.
                let into_day = i64::from(dt.hour()) * 60 + i64::from(dt.minute());
                minute += 24 * 60 - into_day;
                continue;
            }
            if self.hours & (1 << dt.hour()) == 0 {
                minute += 60 - i64::from(dt.minute());
                continue;
            }
            if self.minutes & (1 << dt.minute()) != 0 {
                return Some(Timestamp::from_unix_seconds(minute * 60));
            }
            minute += 1;
        }
        None
    }

    /// Whether a scheduled backup is due at `now`: the schedule named a minute after `since`
    /// (the last scheduled backup's start, or when the schedule was first seen) that has come.
    pub fn due(&self, since: Timestamp, now: Timestamp) -> bool {
        self.next_after(since).is_some_and(|next| next <= now)
    }
}

/// One field's values as bits.
fn field_bits(
    text: &str,
    (field, min, max): (&'static str, u32, u32),
) -> Result<u64, ScheduleError> {
    let syntax = || ScheduleError::Syntax {
        field,
        text: text.chars().take(32).collect(),
    };
    let number = |s: &str| -> Result<u32, ScheduleError> {
        let v: u32 = s.parse().map_err(|_| syntax())?;
        if v < min || v > max {
            return Err(ScheduleError::Range {
                field,
                value: v,
                min,
                max,
            });
        }
        Ok(v)
    };
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| syntax())?;
                if step == 0 {
                    return Err(syntax());
                }
                (r, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (number(a)?, number(b)?);
            if a > b {
                return Err(syntax());
            }
            (a, b)
        } else {
            let v = number(range)?;
            // `5/15` means from 5 to the end, every 15.
            (v, if step > 1 { max } else { v })
        };
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}
