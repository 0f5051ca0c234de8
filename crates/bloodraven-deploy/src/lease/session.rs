//! A lease session: the `migration` mutex, then the `failover-hold`, for one `operationId` and
//! `instance`, kept alive by a heartbeat every `ttl/3`, and the one place that decides when
//! authority is lost.
//!
//! # Invariants
//! - Authority lasts until the last *confirmed* deadline: the send time of the last request
//!   answered `200` plus the TTL (measured on this machine's monotonic clock, so it never
//!   outlives the operator's own deadline). A `423`, a lost answer or an unreachable operator
//!   confirm nothing and never move it.
//! - Renewals, re-grants and releases are serialized: a re-grant rotates the token and must
//!   not race a renewal that carries the old one.
//! - Every returned `topologyGeneration` is compared with the grant's; a change is a loss of
//!   authority even when the renewal itself succeeded.
//! - The session never reconnects anywhere or re-acquires on its own: once authority is lost,
//!   the heartbeat stops and the caller decides (by the DDL boundary) what to do.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use bloodraven_core::lease::{LeaseKind, clamp_ttl};
use bloodraven_core::time::Timestamp;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::api::{ApiError, LeaseApi};

/// What to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    pub operation_id: String,
    pub instance: String,
    /// Clamped to `[5, 120]` like the operator does.
    pub ttl_seconds: u32,
}

/// Why the session no longer holds authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorityLost {
    /// `409 revoked`.
    Revoked {
        kind: LeaseKind,
        reason: String,
        topology_generation: u64,
    },
    /// `404`: the lease expired or was released.
    Expired { kind: LeaseKind },
    /// `403 token_mismatch`.
    TokenMismatch { kind: LeaseKind },
    /// `403 forbidden` on a renewal: the service account lost its authorization.
    Forbidden { kind: LeaseKind, message: String },
    /// A renewal succeeded under a different `topologyGeneration` than the grant.
    GenerationChanged {
        kind: LeaseKind,
        granted: u64,
        seen: u64,
    },
    /// The last confirmed deadline passed without a `200`.
    DeadlinePassed { kind: LeaseKind },
}

impl fmt::Display for AuthorityLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthorityLost::Revoked {
                kind,
                reason,
                topology_generation,
            } => write!(
                f,
                "the {kind} lease was revoked ({reason}); topologyGeneration is now {topology_generation}"
            ),
            AuthorityLost::Expired { kind } => write!(f, "the {kind} lease expired (404)"),
            AuthorityLost::TokenMismatch { kind } => {
                write!(
                    f,
                    "the {kind} lease's token was refused (403 token_mismatch)"
                )
            }
            AuthorityLost::Forbidden { kind, message } => {
                write!(f, "renewing the {kind} lease was forbidden: {message}")
            }
            AuthorityLost::GenerationChanged {
                kind,
                granted,
                seen,
            } => write!(
                f,
                "the {kind} renewal reported topologyGeneration {seen}, granted under {granted}"
            ),
            AuthorityLost::DeadlinePassed { kind } => write!(
                f,
                "the {kind} lease's last confirmed deadline passed without a successful renewal"
            ),
        }
    }
}

impl AuthorityLost {
    /// A short machine-readable reason for records.
    pub fn code(&self) -> &'static str {
        match self {
            AuthorityLost::Revoked { .. } => "revoked",
            AuthorityLost::Expired { .. } => "expired",
            AuthorityLost::TokenMismatch { .. } => "token_mismatch",
            AuthorityLost::Forbidden { .. } => "forbidden",
            AuthorityLost::GenerationChanged { .. } => "generation_changed",
            AuthorityLost::DeadlinePassed { .. } => "deadline_passed",
        }
    }
}

/// Acquiring the two leases failed. On a failed hold, the migration lease was released.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("taking the migration lease failed: {0}")]
    Migration(ApiError),
    #[error("taking the failover-hold failed: {0}")]
    Hold(ApiError),
    #[error("the grants came back under different topology generations ({migration} and {hold})")]
    GenerationMoved { migration: u64, hold: u64 },
}

struct Held {
    token: String,
    deadline: Instant,
    expires_at: Timestamp,
}

#[derive(Default)]
struct State {
    migration: Option<Held>,
    hold: Option<Held>,
}

impl State {
    fn slot(&mut self, kind: LeaseKind) -> &mut Option<Held> {
        match kind {
            LeaseKind::Migration => &mut self.migration,
            LeaseKind::FailoverHold => &mut self.hold,
        }
    }
}

/// A held migration lease and failover-hold, renewed in the background.
pub struct LeaseSession {
    api: Arc<dyn LeaseApi>,
    cfg: SessionConfig,
    generation: u64,
    state: Arc<Mutex<State>>,
    lost: watch::Receiver<Option<AuthorityLost>>,
    stop: watch::Sender<bool>,
    task: StdMutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for LeaseSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseSession")
            .field("operation_id", &self.cfg.operation_id)
            .field("instance", &self.cfg.instance)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl LeaseSession {
    /// Takes the migration lease, then the failover-hold, and starts the heartbeat.
    pub async fn acquire(
        api: Arc<dyn LeaseApi>,
        mut cfg: SessionConfig,
    ) -> Result<LeaseSession, AcquireError> {
        cfg.ttl_seconds = clamp_ttl(i64::from(cfg.ttl_seconds));
        let ttl = Duration::from_secs(u64::from(cfg.ttl_seconds));
        let sent = Instant::now();
        let m = api
            .grant(
                LeaseKind::Migration,
                &cfg.operation_id,
                &cfg.instance,
                cfg.ttl_seconds,
            )
            .await
            .map_err(AcquireError::Migration)?;
        let sent_hold = Instant::now();
        let h = match api
            .grant(
                LeaseKind::FailoverHold,
                &cfg.operation_id,
                &cfg.instance,
                cfg.ttl_seconds,
            )
            .await
        {
            Ok(h) => h,
            Err(e) => {
                let _ = api
                    .release(LeaseKind::Migration, &cfg.operation_id, &m.token)
                    .await;
                return Err(AcquireError::Hold(e));
            }
        };
        if h.topology_generation != m.topology_generation {
            let _ = api
                .release(LeaseKind::FailoverHold, &cfg.operation_id, &h.token)
                .await;
            let _ = api
                .release(LeaseKind::Migration, &cfg.operation_id, &m.token)
                .await;
            return Err(AcquireError::GenerationMoved {
                migration: m.topology_generation,
                hold: h.topology_generation,
            });
        }
        let state = Arc::new(Mutex::new(State {
            migration: Some(Held {
                token: m.token,
                deadline: sent + ttl,
                expires_at: m.expires_at,
            }),
            hold: Some(Held {
                token: h.token,
                deadline: sent_hold + ttl,
                expires_at: h.expires_at,
            }),
        }));
        let (lost_tx, lost) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(heartbeat(
            api.clone(),
            cfg.clone(),
            m.topology_generation,
            state.clone(),
            lost_tx,
            stop_rx,
        ));
        Ok(LeaseSession {
            api,
            generation: m.topology_generation,
            cfg,
            state,
            lost,
            stop,
            task: StdMutex::new(Some(task)),
        })
    }

    /// The generation the leases were granted under.
    pub fn topology_generation(&self) -> u64 {
        self.generation
    }

    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// A receiver that turns `Some` when authority is lost (select on `changed()`).
    pub fn lost(&self) -> watch::Receiver<Option<AuthorityLost>> {
        self.lost.clone()
    }

    /// The last confirmed `expiresAt` of a lease (operator clock), if held.
    pub async fn expires_at(&self, kind: LeaseKind) -> Option<Timestamp> {
        self.state
            .lock()
            .await
            .slot(kind)
            .as_ref()
            .map(|h| h.expires_at)
    }

    /// Stops the heartbeat (and waits for it to end).
    pub async fn stop_heartbeat(&self) {
        let _ = self.stop.send(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }

    /// Re-POSTs a lease (same operation): rotates its token. Serialized with renewals.
    pub async fn regrant(&self, kind: LeaseKind) -> Result<(), ApiError> {
        let mut st = self.state.lock().await;
        let sent = Instant::now();
        let g = self
            .api
            .grant(
                kind,
                &self.cfg.operation_id,
                &self.cfg.instance,
                self.cfg.ttl_seconds,
            )
            .await?;
        *st.slot(kind) = Some(Held {
            token: g.token,
            deadline: sent + Duration::from_secs(u64::from(self.cfg.ttl_seconds)),
            expires_at: g.expires_at,
        });
        Ok(())
    }

    /// Releases one lease (idempotent; a lease already gone counts as released).
    pub async fn release(&self, kind: LeaseKind) -> Result<(), ApiError> {
        let mut st = self.state.lock().await;
        let Some(h) = st.slot(kind).take() else {
            return Ok(());
        };
        match self
            .api
            .release(kind, &self.cfg.operation_id, &h.token)
            .await
        {
            Ok(()) | Err(ApiError::NotFound) => Ok(()),
            Err(e) => {
                *st.slot(kind) = Some(h);
                Err(e)
            }
        }
    }
}

impl Drop for LeaseSession {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The renewal period: `ttl/3`, at least one second.
pub fn renewal_period(ttl_seconds: u32) -> Duration {
    (Duration::from_secs(u64::from(ttl_seconds)) / 3).max(Duration::from_secs(1))
}

async fn heartbeat(
    api: Arc<dyn LeaseApi>,
    cfg: SessionConfig,
    granted: u64,
    state: Arc<Mutex<State>>,
    lost: watch::Sender<Option<AuthorityLost>>,
    mut stop: watch::Receiver<bool>,
) {
    let period = renewal_period(cfg.ttl_seconds);
    let ttl = Duration::from_secs(u64::from(cfg.ttl_seconds));
    let mut next = Instant::now() + period;
    loop {
        let earliest = {
            let mut st = state.lock().await;
            LeaseKind::ALL
                .iter()
                .filter_map(|k| st.slot(*k).as_ref().map(|h| h.deadline))
                .min()
        };
        let Some(earliest) = earliest else { return };
        tokio::select! {
            () = sleep_until(next.min(earliest)) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let mut st = state.lock().await;
        // Authority ends at the last confirmed deadline: check it before anything else, so a
        // renewal due at the same instant cannot be mistaken for one that came in time.
        let now = Instant::now();
        let mut verdict = LeaseKind::ALL.into_iter().find_map(|kind| {
            st.slot(kind)
                .as_ref()
                .is_some_and(|h| now >= h.deadline)
                .then_some(AuthorityLost::DeadlinePassed { kind })
        });
        if verdict.is_none() && now >= next {
            for kind in LeaseKind::ALL {
                let Some(token) = st.slot(kind).as_ref().map(|h| h.token.clone()) else {
                    continue;
                };
                let sent = Instant::now();
                match api
                    .renew(kind, &cfg.operation_id, &token, Some(cfg.ttl_seconds))
                    .await
                {
                    Ok(r) if r.topology_generation != granted => {
                        verdict = Some(AuthorityLost::GenerationChanged {
                            kind,
                            granted,
                            seen: r.topology_generation,
                        });
                    }
                    Ok(r) => {
                        if let Some(h) = st.slot(kind).as_mut() {
                            h.deadline = sent + ttl;
                            h.expires_at = r.expires_at;
                        }
                    }
                    Err(ApiError::Revoked {
                        reason,
                        topology_generation,
                    }) => {
                        verdict = Some(AuthorityLost::Revoked {
                            kind,
                            reason,
                            topology_generation,
                        });
                    }
                    Err(ApiError::NotFound) => verdict = Some(AuthorityLost::Expired { kind }),
                    Err(ApiError::TokenMismatch) => {
                        verdict = Some(AuthorityLost::TokenMismatch { kind });
                    }
                    Err(ApiError::Forbidden { message }) => {
                        verdict = Some(AuthorityLost::Forbidden { kind, message });
                    }
                    // Not a renewal: the deadline stays where it was.
                    Err(e) => {
                        tracing::warn!(operationId = %cfg.operation_id, kind = %kind, error = %e, "renewal not confirmed");
                    }
                }
                if verdict.is_some() {
                    break;
                }
            }
            next = Instant::now() + period;
        }
        drop(st);
        if let Some(v) = verdict {
            tracing::warn!(operationId = %cfg.operation_id, reason = %v, "deploy lease authority lost; heartbeat stopped");
            let _ = lost.send(Some(v));
            return;
        }
    }
}

#[cfg(test)]
mod tests;
