//! Backups (`spec.backup`): the decisions — when the schedule is due, which site is the
//! source, and which backups retention removes. Pure: the operator gathers, this decides, the
//! source site's sidecar runs `mariadb-backup` (`bloodraven_mysql::backup`).
//!
//! # Terminology
//! - **Schedule**: a cron expression of five fields (minute, hour, day of month, month, day
//!   of week), read in UTC, or one of `@hourly`, `@daily`, `@weekly`, `@monthly`.
//! - **Source**: the site a backup is taken on; `replica` (default) or `primary`.
//! - **Good backup**: one that succeeded (its data whole and its manifest written).
//!
//! # Invariants
//! - A site being recloned is never the source, and no site is while a restore-in-place
//!   runs: their data is a mix of before and after until the operation ends ([`source`]).
//! - With `source: replica`, the primary is the source only when no replica is healthy, and
//!   the choice says so ([`Source::PrimaryFallback`]) so that an event can name it.
//! - Retention removes whole backups only, never the newest good one and never the one a
//!   restore in progress uses ([`expired`]).
//! - A backup waits for no lease or hold and defers nothing: nothing here looks at leases.

use std::fmt;
use std::time::Duration;

pub use crate::config::{Retention, SourcePolicy};
pub use crate::cron::{Schedule, ScheduleError};
pub use crate::status::BackupPhase;
use crate::status::{GroupStatus, SiteState};
use crate::time::Timestamp;
use crate::view::SiteView;

/// Where the next backup runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// On this site, as the policy asks.
    Site(String),
    /// On the primary, because no replica is healthy (`source: replica`): say so.
    PrimaryFallback(String),
    /// Not now; the reason, for the status's message.
    Wait(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Site(s) => write!(f, "{s}"),
            Source::PrimaryFallback(s) => {
                write!(f, "{s} (the primary: no replica is healthy)")
            }
            Source::Wait(why) => write!(f, "none yet: {why}"),
        }
    }
}

/// A replica fit to be a source: answering, read-only, replicating with both threads, not
/// recloned or blocked, and not behind by more than `max_lag`.
fn healthy_replica(s: &SiteView, max_lag: Duration) -> bool {
    s.answered
        && s.state == SiteState::ReadOnly
        && !s.recloning
        && !s.recovery_blocked
        && !s.reclone_failed
        && s.replica.as_ref().is_some_and(|r| {
            r.io_running
                && r.sql_running
                && r.seconds_behind.is_some_and(|lag| lag <= max_lag.as_secs())
        })
}

/// Chooses the source of the next backup: the healthiest replica (least behind, then the
/// highest priority, then the spec's order), the primary when the policy says so or no
/// replica is healthy; nobody while a restore-in-place runs.
pub fn source(
    policy: SourcePolicy,
    status: &GroupStatus,
    sites: &[SiteView],
    max_lag: Duration,
) -> Source {
    if let Some(r) = status.restore_in_place.as_ref().filter(|r| r.in_flight()) {
        return Source::Wait(format!(
            "a restore-in-place runs ({}): every site's data changes until it ends",
            r.phase.as_str()
        ));
    }
    let primary = sites.iter().find(|s| {
        s.name == status.active_site && s.answered && s.state == SiteState::Writable && !s.recloning
    });
    if policy == SourcePolicy::Primary {
        return primary.map_or_else(
            || Source::Wait("the primary does not answer as writable".into()),
            |p| Source::Site(p.name.clone()),
        );
    }
    let best = sites
        .iter()
        .filter(|s| s.name != status.active_site && healthy_replica(s, max_lag))
        .min_by_key(|s| {
            (
                s.replica.as_ref().and_then(|r| r.seconds_behind),
                std::cmp::Reverse(s.priority),
                s.index,
            )
        });
    match (best, primary) {
        (Some(r), _) => Source::Site(r.name.clone()),
        (None, Some(p)) => Source::PrimaryFallback(p.name.clone()),
        (None, None) => {
            Source::Wait("no replica is healthy and the primary does not answer".into())
        }
    }
}

/// The longest backup id (a directory name under the target).
pub const MAX_ID_LEN: usize = 64;

/// The id a backup gets when nobody names one: `<group>-<UTC time, basic format>`
/// (`shop-20261207T030000Z`), the group's name cut so that the whole stays within
/// [`MAX_ID_LEN`] (a group's name may be far longer).
pub fn backup_id(group: &str, now: Timestamp) -> String {
    let stamp: String = now
        .to_rfc3339()
        .split('.')
        .next()
        .unwrap_or_default()
        .trim_end_matches('Z')
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    let room = MAX_ID_LEN - stamp.len() - 2;
    let prefix: String = group.chars().take(room).collect();
    format!("{}-{stamp}Z", prefix.trim_end_matches(['-', '.']))
}

/// One stored backup, as retention sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub id: String,
    pub start_time: Timestamp,
    pub good: bool,
}

/// The ids retention removes at `now`: good backups beyond `count` (the oldest first) or
/// older than `max_age`, and failed ones older than the newest good one. Never the newest good
/// backup, never `pinned` (the backup a restore in progress uses).
pub fn expired(
    stored: &[Stored],
    policy: Retention,
    now: Timestamp,
    pinned: Option<&str>,
) -> Vec<String> {
    let mut good: Vec<&Stored> = stored.iter().filter(|b| b.good).collect();
    // Newest first.
    good.sort_by(|a, b| (b.start_time, &b.id).cmp(&(a.start_time, &a.id)));
    let newest = good.first().map(|b| (b.id.as_str(), b.start_time));
    let keep = policy.count.map_or(usize::MAX, |c| {
        usize::try_from(c.max(1)).unwrap_or(usize::MAX)
    });
    let mut out: Vec<String> = Vec::new();
    for (i, b) in good.iter().enumerate() {
        if i == 0 {
            continue;
        }
        let too_many = i >= keep;
        let too_old = policy
            .max_age
            .is_some_and(|age| now.since(b.start_time) > age);
        if too_many || too_old {
            out.push(b.id.clone());
        }
    }
    if let Some((_, newest_start)) = newest {
        out.extend(
            stored
                .iter()
                .filter(|b| !b.good && b.start_time < newest_start)
                .map(|b| b.id.clone()),
        );
    }
    out.retain(|id| Some(id.as_str()) != pinned && Some(id.as_str()) != newest.map(|n| n.0));
    out.sort();
    out
}

#[cfg(test)]
mod tests;
