//! `RunSafetyNet`: the startup check, run before the monitor exists and before the HTTP server
//! listens. It is not a third rule. The monitor runs its second half again
//! ([`SafetyNet::ask_and_clear`])
//! when the server restarts under it (docs/sidecar.md says why this goes beyond seed 02, which
//! runs it once).
//!
//! It fences first and asks afterwards: set the fence (retrying until the server confirms it),
//! then ask the operator for the active site once, and clear the fence only if the answer names
//! this site. Every other answer — no answer, a bad answer, no active site, another site —
//! leaves the server fenced, each with its own contract log line. With signed topology, an
//! answer that does not verify counts as no answer.

use std::sync::Arc;

use bloodraven_core::contract::logs;
use bloodraven_core::wire::ActiveSite;
use bloodraven_mysql::FenceOutcome;
use tokio::time::{sleep, timeout};
use tracing::{error, info, warn};

use crate::config::Timing;
use crate::contacts::{ContactError, Contacts};
use crate::database::Database;
use crate::identity::Identity;
use crate::trust::Trust;

/// How the safety net ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SafetyNetOutcome {
    /// The operator named this site; the fence was cleared.
    Cleared(ActiveSite),
    /// The operator named this site, but clearing the fence failed: still fenced.
    ClearFailed { view: ActiveSite, reason: String },
    /// The operator could not be asked, or answered badly: still fenced.
    QueryFailed { reason: String },
    /// The operator has no active site: still fenced.
    NoActiveSite(ActiveSite),
    /// The operator named another site: still fenced, a standby.
    Standby(ActiveSite),
}

impl SafetyNetOutcome {
    /// The operator's answer, if there was one (it seeds the monitor's cache).
    pub fn view(&self) -> Option<&ActiveSite> {
        match self {
            SafetyNetOutcome::Cleared(v)
            | SafetyNetOutcome::ClearFailed { view: v, .. }
            | SafetyNetOutcome::NoActiveSite(v)
            | SafetyNetOutcome::Standby(v) => Some(v),
            SafetyNetOutcome::QueryFailed { .. } => None,
        }
    }

    /// Whether the safety net left the server writable.
    pub fn cleared(&self) -> bool {
        matches!(self, SafetyNetOutcome::Cleared(_))
    }
}

/// One run of the safety net: whose site, whom to ask, which server, with what timing and trust.
#[derive(Debug)]
pub struct SafetyNet<'a, C, D> {
    /// The site this sidecar guards.
    pub identity: &'a Identity,
    /// The operator to ask.
    pub contacts: &'a Arc<C>,
    /// The site's server.
    pub db: &'a Arc<D>,
    pub timing: Timing,
    /// How the operator's answer is verified (signed topology).
    pub trust: &'a Trust,
}

impl<C: Contacts, D: Database> SafetyNet<'_, C, D> {
    /// Runs the safety net for the identity's site. Returns only once the fence was confirmed
    /// and the operator was asked; cancel it (drop the future) to give up.
    pub async fn run(&self) -> SafetyNetOutcome {
        let (site, timing, db) = (&self.identity.site, self.timing, self.db);
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            match db.fence(timing.fence_bound).await {
                FenceOutcome::Fenced => break,
                FenceOutcome::NotFenced { reason } => {
                    warn!(site = %site, attempt, reason = %reason, "safety net: fence not in effect yet; killing application sessions and retrying");
                    if let Err(e) = db.kill_application_sessions().await {
                        warn!(error = %e, "safety net: could not kill application sessions");
                    }
                }
                FenceOutcome::Unknown { reason } => {
                    warn!(site = %site, attempt, reason = %reason, "safety net: cannot confirm the fence yet (server unreadable); retrying");
                }
            }
            sleep(timing.peer_check_interval).await;
        }
        info!(site = %site, "safety net: fenced; asking the operator for the active site");
        self.ask_and_clear().await
    }

    /// The safety net's second half, on a server whose fence is confirmed: asks the operator
    /// for the active site once and clears the fence only if the answer (verified, with signed
    /// topology) names this site. Every other answer leaves the server fenced, with its
    /// contract log line.
    pub async fn ask_and_clear(&self) -> SafetyNetOutcome {
        let (identity, timing) = (self.identity, self.timing);
        let site = &identity.site;
        let answer = timeout(timing.request_timeout, self.contacts.operator_active_site())
            .await
            .unwrap_or(Err(ContactError::TimedOut(timing.request_timeout)))
            .map_err(|e| e.to_string())
            .and_then(|view| match self.trust.check(&view, identity) {
                Ok(()) => Ok(view),
                Err(e) => Err(format!(
                    "the operator's answer was refused: {e} (is --operator-public-key the operator's key?)"
                )),
            });
        match answer {
            Err(reason) => {
                warn!(site = %site, reason = %reason, "{}", logs::SAFETY_NET_QUERY_FAILED);
                SafetyNetOutcome::QueryFailed { reason }
            }
            Ok(view) if view.active_site.is_empty() => {
                warn!(site = %site, topology_generation = view.topology_generation, "{}", logs::SAFETY_NET_NO_ACTIVE_SITE);
                SafetyNetOutcome::NoActiveSite(view)
            }
            Ok(view) if view.active_site != *site => {
                info!(site = %site, active_site = %view.active_site, topology_generation = view.topology_generation, "{}", logs::SAFETY_NET_STANDBY);
                SafetyNetOutcome::Standby(view)
            }
            Ok(view) => match self.db.unfence().await {
                Ok(()) => {
                    info!(site = %site, topology_generation = view.topology_generation, "{}", logs::SAFETY_NET_CLEARED);
                    SafetyNetOutcome::Cleared(view)
                }
                Err(e) => {
                    let reason = e.to_string();
                    error!(site = %site, reason = %reason, "{}", logs::SAFETY_NET_CLEAR_FAILED);
                    SafetyNetOutcome::ClearFailed { view, reason }
                }
            },
        }
    }
}
