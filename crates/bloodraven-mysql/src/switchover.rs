//! The planned switchover's MySQL steps, as the operator runs them (the phases and what each
//! outcome means live in `bloodraven_core::planned`):
//!
//! - [`drain`] (`Draining`): fence the source, and when the fence does not land within its
//!   bound kill the application sessions that block it (the busy ones first, then the idle
//!   ones too) and try again, until it lands or the budget runs out; then kill the remaining application sessions and read the source's GTID
//!   set — everything it ever acknowledged;
//! - [`catch_up`] (`WaitingForLag`): wait until the target holds that set;
//! - [`SiteClient::promote`](crate::SiteClient::promote) (`Promoting`);
//! - [`repoint_all`] (`Resuming`): re-point sites to the new primary, concurrently;
//! - [`undo`]: the typed undo of a failure before promotion (`bloodraven_core::planned::Undo`).
//!
//! Zero acknowledged writes are lost by construction: once the fence is confirmed no client
//! can commit on the source, every commit acknowledged before it is in the source's GTID set,
//! and the target is promoted only after it holds that set.

use std::time::Duration;

use bloodraven_core::gtid::GtidSet;
use bloodraven_core::planned::Undo;
use tokio::time::Instant;

use crate::error::MysqlError;
use crate::ops::Site;
use crate::site::{FenceOutcome, KillReport, SourceSpec};
use crate::sql::Session;

/// How long one fence attempt of [`drain`] may wait behind running statements and locks
/// before the sessions that block it are killed and it is tried again.
pub const FENCE_ATTEMPT_BOUND: Duration = Duration::from_secs(2);

/// What [`drain`] did.
#[derive(Debug)]
pub struct Drain {
    /// The last fence attempt's outcome (`Fenced` when the drain succeeded).
    pub fence: FenceOutcome,
    /// Sessions killed because they kept the fence from landing (account and age for logs;
    /// never a statement's text).
    pub blockers: Vec<Session>,
    /// Once fenced: the application sessions killed afterwards (they can no longer write).
    pub killed_after: Option<Result<KillReport, MysqlError>>,
    /// Once fenced: the source's GTID set, or why it could not be read.
    pub source_gtid: Option<Result<GtidSet, MysqlError>>,
    pub attempts: u32,
}

/// Fences `source` within `budget`, killing what blocks the fence between attempts (see the
/// module docs).
pub async fn drain<S: Site>(source: &S, budget: Duration) -> Drain {
    let deadline = Instant::now() + budget;
    let mut blockers = Vec::new();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let bound = remaining
            .min(FENCE_ATTEMPT_BOUND)
            .max(Duration::from_millis(100));
        let fence = source.fence(bound).await;
        if fence == FenceOutcome::Fenced {
            break;
        }
        if Instant::now() >= deadline {
            return Drain {
                fence,
                blockers,
                killed_after: None,
                source_gtid: None,
                attempts,
            };
        }
        // From the second failed attempt on, the busy sessions were killed once already and
        // the fence still waits: what blocks it is idle (a held `LOCK TABLES … WRITE`).
        match source.kill_fence_blockers(attempts > 1).await {
            Ok((sessions, report)) => blockers.extend(
                sessions
                    .into_iter()
                    .filter(|s| report.killed.contains(&s.id)),
            ),
            Err(e) => {
                tracing::warn!(site = %source.label(), error = %e, "draining: cannot list or kill the sessions that block the fence");
            }
        }
    }
    // Fenced: sessions still connected can no longer write; close them (until none is left
    // or the budget runs out), then read everything the source ever acknowledged.
    let killed_after = loop {
        match source.kill_application_sessions().await {
            Ok(r) if r.killed.is_empty() || Instant::now() >= deadline => break Ok(r),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    let source_gtid = source.probe().await.map(|p| p.gtid);
    Drain {
        fence: FenceOutcome::Fenced,
        blockers,
        killed_after: Some(killed_after),
        source_gtid: Some(source_gtid),
        attempts,
    }
}

/// How [`catch_up`] ended.
#[derive(Debug)]
pub enum CatchUp {
    CaughtUp,
    /// The budget ran out; `missing` transactions of the source are not on the target.
    TimedOut {
        missing: u64,
    },
}

/// Waits until `target` holds `want`, within `budget`.
pub async fn catch_up<S: Site>(
    target: &S,
    want: &GtidSet,
    budget: Duration,
) -> Result<CatchUp, MysqlError> {
    if target.wait_for_gtid(want, budget).await? {
        return Ok(CatchUp::CaughtUp);
    }
    let missing = match target.probe().await {
        Ok(p) => want.count_missing_from(&p.gtid),
        Err(_) => want.transaction_count(),
    };
    Ok(CatchUp::TimedOut { missing })
}

/// Re-points every site of `sites` to `spec`, concurrently. Returns the failures, by label.
pub async fn repoint_all<S: Site>(sites: &[S], spec: &SourceSpec) -> Vec<(String, MysqlError)> {
    let results = futures::future::join_all(sites.iter().map(|s| s.repoint(spec))).await;
    sites
        .iter()
        .zip(results)
        .filter_map(|(s, r)| r.err().map(|e| (s.label().to_string(), e)))
        .collect()
}

/// What an undo did.
#[derive(Debug)]
pub enum Undone {
    /// Nothing had to be undone.
    Nothing,
    /// The fence was lifted: the source stays the primary.
    Unfenced,
    /// The source read back unfenced: nothing to lift.
    WasNotFenced,
    /// Lifting the fence (or reading the server back) failed: the source may stay fenced,
    /// and no site is writable until the operator's reassertion or a human resolves it.
    Failed(MysqlError),
}

/// Undoes a failure before promotion on `source`, by its rule.
pub async fn undo<S: Site>(source: &S, rule: &Undo) -> Undone {
    match rule {
        Undo::Nothing => Undone::Nothing,
        Undo::Unfence { .. } => match source.unfence().await {
            Ok(()) => Undone::Unfenced,
            Err(e) => Undone::Failed(e),
        },
        Undo::ReadBackThenUnfence { .. } => match source.is_fenced().await {
            Ok(false) => Undone::WasNotFenced,
            // Set, or unreadable: lifting the fence is safe either way (the source is the
            // active site and nothing was promoted).
            Ok(true) | Err(_) => match source.unfence().await {
                Ok(()) => Undone::Unfenced,
                Err(e) => Undone::Failed(e),
            },
        },
    }
}
