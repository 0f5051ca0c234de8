//! Persisting what a poll learned: the sites' states, the conditions (`Ready`, `Degraded`,
//! `RecoveryPending`, `SidecarTimingsInSync`), the site metrics; and raising alerts (each
//! evented once, when it starts).

use std::collections::BTreeSet;

use bloodraven_core::config::GroupConfig;
use bloodraven_core::controller::{self, Alert};
use bloodraven_core::duration::{HumanDuration, parse_duration};
use bloodraven_core::reason::EventReason as E;
use bloodraven_core::reason::{ConditionReason as R, ConditionType as C, RecoveryState};
use bloodraven_core::status::{GroupStatus, SiteState, SiteStatus};

use super::Controller;
use crate::events::EventType;
use crate::metrics::{GroupLabel, GroupSite, GroupSiteState};

/// Which sidecars report timings other than `spec.sidecar`, as a condition message.
fn timings_mismatch(sites: &[SiteStatus], cfg: &GroupConfig) -> Option<String> {
    let off: Vec<String> = sites
        .iter()
        .filter_map(|s| {
            let t = s.sidecar_timings.as_ref()?;
            let lease = parse_duration(&t.lease_timeout).ok()?;
            let interval = parse_duration(&t.peer_check_interval).ok()?;
            (lease != cfg.lease_timeout || interval != cfg.peer_check_interval).then(|| {
                format!(
                    "{} runs leaseTimeout {} and peerCheckInterval {} ({})",
                    s.name, t.lease_timeout, t.peer_check_interval, t.source
                )
            })
        })
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "spec.sidecar says leaseTimeout {} and peerCheckInterval {}; {}",
            HumanDuration(cfg.lease_timeout),
            HumanDuration(cfg.peer_check_interval),
            off.join("; ")
        )
    })
}

impl Controller {
    pub(super) async fn persist_status(
        &self,
        c: &controller::Conditions,
        blocked: &[String],
        unblocked: &[String],
    ) {
        let now = self.rt.now();
        let snap = self.rt.snapshot();
        let previous = snap.status().clone();
        let sites: Vec<SiteStatus> = self
            .sites
            .iter()
            .map(|s| {
                let p = s.probe.as_ref();
                let mut recovery_state = previous
                    .site(s.name())
                    .map(|b| b.recovery_state.clone())
                    .unwrap_or_default();
                if blocked.iter().any(|b| b == s.name()) {
                    recovery_state = RecoveryState::RecoveryBlocked;
                }
                if unblocked.iter().any(|b| b == s.name()) {
                    recovery_state = RecoveryState::None;
                }
                let reachable =
                    matches!(s.tracker.state, SiteState::Writable | SiteState::ReadOnly);
                SiteStatus {
                    name: s.cfg.name.clone(),
                    role: s.cfg.role,
                    state: s.tracker.state,
                    last_seen: s.last_seen,
                    gtid_executed: p.map(|p| p.gtid.to_string()).unwrap_or_default(),
                    replicating: reachable
                        && p.and_then(|p| p.replica.as_ref())
                            .is_some_and(|r| r.io_running && r.sql_running),
                    seconds_behind_source: p
                        .and_then(|p| p.replica.as_ref())
                        .and_then(|r| r.seconds_behind),
                    recovery_state,
                    sidecar_self_fenced: s.sidecar.self_fenced,
                    sidecar_timings: s.sidecar.timings.clone(),
                }
            })
            .collect();
        for (site, s) in self.sites.iter().zip(&sites) {
            let semi_sync = site
                .probe
                .as_ref()
                .filter(|_| site.answered)
                .and_then(|p| p.semi_sync.as_ref());
            self.metrics()
                .semisync_active
                .get_or_create(&GroupSite {
                    group: self.group().to_string(),
                    site: s.name.clone(),
                })
                .set(i64::from(bloodraven_core::semisync::active(
                    semi_sync,
                    self.rt.config.replication_mode,
                    previous.active_site == s.name,
                )));
            for st in SiteState::ALL {
                self.metrics()
                    .site_state
                    .get_or_create(&GroupSiteState {
                        group: self.group().to_string(),
                        site: s.name.clone(),
                        state: st.as_str().to_string(),
                    })
                    .set(i64::from(site.tracker.state == st));
            }
            if let Some(lag) = s.seconds_behind_source {
                self.metrics()
                    .replication_lag
                    .get_or_create(&GroupSite {
                        group: self.group().to_string(),
                        site: s.name.clone(),
                    })
                    .set(i64::try_from(lag).unwrap_or(i64::MAX));
            }
        }
        let res = self
            .rt
            .update_status(|st| {
                st.sites.clone_from(&sites);
                st.observed_at = Some(now);
                set_conditions(st, c, &sites, &self.rt.config, now);
            })
            .await;
        if let Err(e) = res {
            tracing::warn!(group = %self.group(), step = "persist", error = %e, "cannot persist the group status");
        }
    }

    pub(super) async fn alerts(&mut self, alerts: &[Alert], status: &GroupStatus) {
        let mut now_raised = BTreeSet::new();
        for a in alerts {
            let (key, reason, message) = match a {
                Alert::SplitBrainUndecided { sites } => (
                    format!("split:{}", sites.join(",")),
                    E::SplitBrain,
                    format!(
                        "writable sites {} and no failover history or splitBrainPolicy says which wins; nothing was fenced",
                        sites.join(", ")
                    ),
                ),
                Alert::NoPrimary => (
                    "noprimary".into(),
                    E::NoPrimary,
                    "every reachable site is read-only and none can be restored automatically"
                        .into(),
                ),
                Alert::AllUnreachable => (
                    "allunreachable".into(),
                    E::AllSitesUnreachable,
                    "no site answers".into(),
                ),
                Alert::CooldownBlocksFailover { until } => {
                    if !self.raised.contains("cooldown") {
                        self.metrics()
                            .failovers_blocked_by_cooldown
                            .get_or_create(&GroupLabel {
                                group: self.group().to_string(),
                            })
                            .inc();
                    }
                    (
                        "cooldown".into(),
                        E::FailoverBlockedByCooldown,
                        format!(
                            "active site {} is unreachable, but failoverCooldown forbids another failover until {until}",
                            status.active_site
                        ),
                    )
                }
                Alert::NoCandidate { reason } => (
                    "nocandidate".into(),
                    E::NoFailoverCandidate,
                    format!(
                        "active site {} is unreachable: {reason}",
                        status.active_site
                    ),
                ),
                Alert::BootstrapWaiting { reason } => (
                    "bootstrapwaiting".into(),
                    E::NoPrimary,
                    format!(
                        "no site is writable and the group has never had an active site: {reason}"
                    ),
                ),
                Alert::SemiSyncFallback { site, why } => (
                    format!("semisync:{site}"),
                    E::SemiSyncFallback,
                    format!(
                        "spec.replication.mode is semi-sync, but on the active site {site} the lossless guarantee does not hold: {why}"
                    ),
                ),
                Alert::FailoverHeld => (
                    "held".into(),
                    E::AutomaticFailoverHeld,
                    format!(
                        "active site {} is unreachable while automatic failover is held",
                        status.active_site
                    ),
                ),
            };
            if !self.raised.contains(&key) {
                tracing::warn!(group = %self.group(), reason = reason.as_str(), message = %message, "alert");
                self.event(EventType::Warning, reason, &message).await;
            }
            now_raised.insert(key);
        }
        self.raised = now_raised;
    }
}

/// The conditions, from the decision's verdict and the sites as persisted now (a block raised
/// or cleared by this poll's actions counts at once).
fn set_conditions(
    st: &mut GroupStatus,
    c: &controller::Conditions,
    sites: &[SiteStatus],
    cfg: &GroupConfig,
    now: bloodraven_core::time::Timestamp,
) {
    st.set_condition(
        C::Ready,
        c.ready,
        c.ready_reason.condition_reason(),
        "",
        now,
    );
    match &c.degraded {
        Some(d) => st.set_condition(C::Degraded, true, d.reason.clone(), &d.message, now),
        None => st.set_condition(C::Degraded, false, R::AsExpected, "", now),
    }
    match timings_mismatch(sites, cfg) {
        None => st.set_condition(C::SidecarTimingsInSync, true, R::AsExpected, "", now),
        Some(m) => st.set_condition(
            C::SidecarTimingsInSync,
            false,
            R::SidecarTimingsMismatch,
            &m,
            now,
        ),
    }
    let blocked_now: Vec<&str> = sites
        .iter()
        .filter(|s| s.recovery_state.is_blocked())
        .map(|s| s.name.as_str())
        .collect();
    if blocked_now.is_empty() {
        st.set_condition(C::RecoveryPending, false, R::AsExpected, "", now);
    } else {
        let m = c.recovery_pending.clone().unwrap_or_else(|| {
            format!(
                "recovery blocked (divergent transactions): {}",
                blocked_now.join(", ")
            )
        });
        st.set_condition(C::RecoveryPending, true, R::RecoveryBlocked, &m, now);
    }
}
