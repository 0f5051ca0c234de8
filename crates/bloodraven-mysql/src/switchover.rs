//! The planned switchover primitive, built only from [`SiteClient`] calls:
//! fence the source → kill its application sessions → read its GTID set → wait until the
//! target contains it → promote the target → re-point the source and the other replicas.
//!
//! Zero acknowledged writes are lost by construction: once the fence is confirmed no client
//! can commit on the source, every commit acknowledged before it is in the source's GTID set,
//! and the target is promoted only after it contains that set.
//!
//! Failure before promotion undoes the fence (the source stays the primary). A failed or
//! uncertain promotion leaves the source fenced: the group then has no writable site rather
//! than two, and the operator's reassertion path (or a human) resolves it.

use std::time::Duration;

use bloodraven_core::gtid::GtidSet;
use tokio::time::Instant;

use crate::error::MysqlError;
use crate::site::{FenceOutcome, KillReport, Promotion, SiteClient, SourceSpec};

/// Bounds of a switchover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchoverOptions {
    /// How long the fence may wait behind running statements and locks.
    pub fence_timeout: Duration,
    /// How long the target may take to apply the source's last transactions
    /// (`plannedFailover.maxLagWait`).
    pub catch_up_timeout: Duration,
}

impl Default for SwitchoverOptions {
    fn default() -> Self {
        SwitchoverOptions {
            fence_timeout: Duration::from_secs(5),
            catch_up_timeout: Duration::from_secs(300),
        }
    }
}

/// The steps of a switchover, for timings and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Fence,
    KillSessions,
    ReadSourceGtid,
    CatchUp,
    Promote,
    Repoint,
}

/// What a completed switchover did.
#[derive(Debug)]
pub struct SwitchoverReport {
    /// The fenced source's GTID set: everything it ever acknowledged.
    pub source_gtid: GtidSet,
    pub promotion: Promotion,
    pub killed: KillReport,
    /// A kill that failed as a whole (the switchover went on: the fence already blocks
    /// writes; surviving sessions can only read stale data).
    pub kill_error: Option<MysqlError>,
    /// Sites that could not be re-pointed to the new primary, with the reason. The new
    /// primary is writable regardless; the operator retries these.
    pub repoint_failures: Vec<(String, MysqlError)>,
    /// Time per step, in order.
    pub timings: Vec<(Step, Duration)>,
    /// From the start of the fence to the new primary confirmed writable.
    pub write_unavailable: Duration,
}

/// Why a switchover stopped.
#[derive(Debug, thiserror::Error)]
pub enum SwitchoverError {
    #[error("the fence on {site} did not take effect ({reason}); nothing was changed")]
    FenceNotApplied { site: String, reason: String },
    #[error("the fence on {site} has an unknown outcome ({reason}); {undo}")]
    FenceUnknown {
        site: String,
        reason: String,
        undo: Undo,
    },
    #[error("could not read the GTID set of fenced {site}: {error}; {undo}")]
    ReadSourceGtid {
        site: String,
        error: MysqlError,
        undo: Undo,
    },
    #[error("{target} did not catch up with {source_site} within {} s ({missing} transactions missing); {undo}", timeout.as_secs())]
    CatchUpTimeout {
        target: String,
        source_site: String,
        missing: u64,
        timeout: Duration,
        undo: Undo,
    },
    #[error("waiting for {target} to catch up failed: {error}; {undo}")]
    CatchUp {
        target: String,
        error: MysqlError,
        undo: Undo,
    },
    #[error(
        "promotion of {target} failed: {error}; {source_site} stays fenced (no site is writable until the operator or a human resolves it)"
    )]
    Promote {
        target: String,
        source_site: String,
        error: MysqlError,
    },
}

/// Whether the fence on the source was lifted again after an abort.
#[derive(Debug)]
pub enum Undo {
    Unfenced,
    UnfenceFailed(MysqlError),
}

impl std::fmt::Display for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undo::Unfenced => f.write_str("the source was unfenced and stays the primary"),
            Undo::UnfenceFailed(e) => write!(f, "unfencing the source failed too: {e}"),
        }
    }
}

async fn undo(source: &SiteClient) -> Undo {
    match source.unfence().await {
        Ok(()) => Undo::Unfenced,
        Err(e) => Undo::UnfenceFailed(e),
    }
}

/// Moves the primary from `source` to `target`; `others` are re-pointed to `target`, and so is
/// `source`. `replication` is how replicas authenticate to their new source.
pub async fn switchover(
    source: &SiteClient,
    target: &SiteClient,
    others: &[SiteClient],
    replication: &crate::creds::Credentials,
    opts: SwitchoverOptions,
) -> Result<SwitchoverReport, SwitchoverError> {
    let t0 = Instant::now();
    let mut timings = Vec::with_capacity(6);
    let mut lap = Instant::now();
    let mut mark = |step: Step, timings: &mut Vec<(Step, Duration)>| {
        let now = Instant::now();
        timings.push((step, now - lap));
        lap = now;
    };

    match source.fence(opts.fence_timeout).await {
        FenceOutcome::Fenced => {}
        FenceOutcome::NotFenced { reason } => {
            return Err(SwitchoverError::FenceNotApplied {
                site: source.label().to_string(),
                reason,
            });
        }
        FenceOutcome::Unknown { reason } => {
            return Err(SwitchoverError::FenceUnknown {
                site: source.label().to_string(),
                reason,
                undo: undo(source).await,
            });
        }
    }
    mark(Step::Fence, &mut timings);

    let (killed, kill_error) = match source.kill_application_sessions().await {
        Ok(r) => (r, None),
        Err(e) => (KillReport::default(), Some(e)),
    };
    mark(Step::KillSessions, &mut timings);

    let source_gtid = match source.probe().await {
        Ok(p) => p.gtid,
        Err(error) => {
            return Err(SwitchoverError::ReadSourceGtid {
                site: source.label().to_string(),
                error,
                undo: undo(source).await,
            });
        }
    };
    mark(Step::ReadSourceGtid, &mut timings);

    match target
        .wait_for_gtid(&source_gtid, opts.catch_up_timeout)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            let missing = match target.probe().await {
                Ok(p) => source_gtid.count_missing_from(&p.gtid),
                Err(_) => source_gtid.transaction_count(),
            };
            return Err(SwitchoverError::CatchUpTimeout {
                target: target.label().to_string(),
                source_site: source.label().to_string(),
                missing,
                timeout: opts.catch_up_timeout,
                undo: undo(source).await,
            });
        }
        Err(error) => {
            return Err(SwitchoverError::CatchUp {
                target: target.label().to_string(),
                error,
                undo: undo(source).await,
            });
        }
    }
    mark(Step::CatchUp, &mut timings);

    let promotion = target
        .promote()
        .await
        .map_err(|error| SwitchoverError::Promote {
            target: target.label().to_string(),
            source_site: source.label().to_string(),
            error,
        })?;
    mark(Step::Promote, &mut timings);
    let write_unavailable = t0.elapsed();

    let spec = SourceSpec {
        host: target.endpoint().host.clone(),
        port: target.endpoint().port,
        credentials: replication.clone(),
    };
    let mut to_repoint = Vec::with_capacity(others.len() + 1);
    to_repoint.push(source.clone());
    to_repoint.extend(others.iter().cloned());
    let results = futures::future::join_all(to_repoint.iter().map(|s| s.repoint(&spec))).await;
    let repoint_failures = to_repoint
        .iter()
        .zip(results)
        .filter_map(|(s, r)| r.err().map(|e| (s.label().to_string(), e)))
        .collect();
    mark(Step::Repoint, &mut timings);

    Ok(SwitchoverReport {
        source_gtid,
        promotion,
        killed,
        kill_error,
        repoint_failures,
        timings,
        write_unavailable,
    })
}
