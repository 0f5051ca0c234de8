//! Persist: the status after a poll — the sites' states, the conditions (`Ready`,
//! `Degraded`, `RecoveryPending`, `SidecarTimingsInSync`) as
//! [`bloodraven_core::controller::settle`] says them — written once, and only when it says
//! something new; the site metrics; and the alerts (each evented once, when it starts).
//!
//! The fields that move on every poll of a healthy group (`observedAt`, each site's
//! `lastSeen`, `gtidExecuted`, `secondsBehindSource`; see
//! [`bloodraven_core::status::GroupStatus::lasting`]) are persisted with any other change, and
//! on their own at most every [`REFRESH_EVERY`]: an idle group costs the store two writes a
//! minute, not one per poll. What is served carries them fresh
//! ([`crate::group::GroupRuntime::served_status`]).

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_core::controller::{self, Alert, DecideInput, Effect, Settled};
use bloodraven_core::reason::EventReason as E;
use bloodraven_core::reason::{ConditionReason as R, ConditionType as C, RecoveryState};
use bloodraven_core::status::{GroupStatus, SiteState, SiteStatus};
use bloodraven_core::time::Timestamp;
use bloodraven_mysql::Site;
use tokio::time::Instant;

use super::{Controller, ControllerError};
use crate::events::EventType;
use crate::metrics::{GroupLabel, GroupSite, GroupSiteState};

/// How often a status whose only changes are the moving fields is persisted anyway (so the
/// stored `observedAt` and positions are never older than this while the operator runs).
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);

impl<S: Site> Controller<S> {
    /// Persists the status `settled` describes, when it changed (or its moving fields are
    /// [`REFRESH_EVERY`] old), and hands the whole of it to the served view.
    pub(super) async fn persist(&mut self, settled: &Settled, input: &DecideInput<'_>) {
        let now = self.rt.now();
        let snap = self.rt.snapshot();
        let previous = snap.status();
        let sites = self.site_statuses(previous, &settled.effects, input);
        self.site_metrics(&sites, previous);
        let mut next = previous.clone();
        next.sites.clone_from(&sites);
        next.observed_at = previous.observed_at.max(Some(now));
        set_conditions(&mut next, &settled.conditions, now);
        let drift = self.rt.config_drift();
        set_config_condition(&mut next, drift.as_deref(), now);
        let transport = self.transport_verdict();
        set_transport_condition(&mut next, transport.as_ref(), now);
        self.metrics()
            .observe_status(self.group(), &next, self.rt.config.max_lag_seconds);
        let changed = next.lasting() != previous.lasting();
        let due = self
            .persisted
            .is_none_or(|at| at.elapsed() >= REFRESH_EVERY);
        if changed || due {
            let res = self
                .persist_status("the group status", |st| {
                    st.sites.clone_from(&sites);
                    st.observed_at = st.observed_at.max(Some(now));
                    set_conditions(st, &settled.conditions, now);
                    set_config_condition(st, drift.as_deref(), now);
                    set_transport_condition(st, transport.as_ref(), now);
                })
                .await;
            match res {
                Ok(()) => self.persisted = Some(Instant::now()),
                Err(e) => {
                    let e = match e {
                        ControllerError::Persist { source, .. } => source.to_string(),
                        other => other.to_string(),
                    };
                    tracing::warn!(group = %self.group(), step = "persist", error = %e, "cannot persist the group status");
                }
            }
        }
        self.rt.set_observed(next);
    }

    /// The group's transport as this poll's probes show it (see
    /// [`bloodraven_core::transport`]).
    fn transport_verdict(&self) -> Option<(R, String)> {
        use bloodraven_core::transport::{ReplicaTransport, TransportView};
        let views: Vec<TransportView> = self
            .sites
            .iter()
            .map(|s| {
                let p = s.probe.as_ref();
                TransportView {
                    site: s.cfg.name.clone(),
                    answered: s.answered,
                    require_secure_transport: p.and_then(|p| p.require_secure_transport),
                    replica: p
                        .and_then(|p| p.replica.as_ref())
                        .map(|r| ReplicaTransport {
                            ssl: r.ssl_allowed,
                            verifies: r.ssl_verify_server_cert,
                            tls_error: r.tls_failed().then(|| r.last_io_error.clone()),
                        }),
                }
            })
            .collect();
        bloodraven_core::transport::verdict(&views, &self.rt.config.replication_tls)
    }

    /// Every site's status after this poll: what was gathered, with the effects of the
    /// actions that succeeded (a block raised or cleared counts at once).
    ///
    /// A site a reclone holds keeps its state (only the reclone changes it) and the divergent
    /// set it was recloned for; a blocked site's divergent set is what it holds now that the
    /// group does not; any other site has none.
    fn site_statuses(
        &self,
        previous: &GroupStatus,
        effects: &[Effect],
        input: &DecideInput<'_>,
    ) -> Vec<SiteStatus> {
        self.sites
            .iter()
            .map(|s| {
                let p = s.probe.as_ref();
                let before = previous.site(s.name());
                let mut recovery_state =
                    before.map(|b| b.recovery_state.clone()).unwrap_or_default();
                let held = recovery_state.is_held_by_reclone();
                for e in effects {
                    match e {
                        Effect::Blocked(site) if site == s.name() && !held => {
                            recovery_state = RecoveryState::RecoveryBlocked;
                        }
                        Effect::Unblocked(site) if site == s.name() && !held => {
                            recovery_state = RecoveryState::None;
                        }
                        _ => {}
                    }
                }
                let (divergent_gtid_set, divergent_transaction_count) = if held {
                    before.map_or((String::new(), None), |b| {
                        (b.divergent_gtid_set.clone(), b.divergent_transaction_count)
                    })
                } else if recovery_state.is_blocked() {
                    input
                        .sites
                        .iter()
                        .find(|v| v.name == s.name())
                        .and_then(|v| controller::divergence(v, input))
                        .map_or_else(
                            || {
                                before.map_or((String::new(), None), |b| {
                                    (b.divergent_gtid_set.clone(), b.divergent_transaction_count)
                                })
                            },
                            |(set, n)| (set.to_string(), Some(n)),
                        )
                } else {
                    (String::new(), None)
                };
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
                    divergent_gtid_set,
                    divergent_transaction_count,
                    reclone: before.and_then(|b| b.reclone.clone()),
                }
            })
            .collect()
    }

    fn site_metrics(&self, sites: &[SiteStatus], previous: &GroupStatus) {
        for (site, s) in self.sites.iter().zip(sites) {
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
            self.metrics()
                .site_up
                .get_or_create(&GroupSite {
                    group: self.group().to_string(),
                    site: s.name.clone(),
                })
                .set(i64::from(site.answered));
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
                Alert::FenceUnconfirmed { old, target, why } => (
                    format!("fence:{old}:{target}"),
                    E::FenceUnconfirmed,
                    format!(
                        "fencing: strict: {target} is announced and stays read-only until {old} is proven fenced: {why}"
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

/// `TransportSecure` (informational): what [`bloodraven_core::transport::verdict`] says of
/// the last probes.
fn set_transport_condition(st: &mut GroupStatus, verdict: Option<&(R, String)>, now: Timestamp) {
    match verdict {
        None => st.set_condition(C::TransportSecure, true, R::AsExpected, "", now),
        Some((reason, message)) => {
            st.set_condition(C::TransportSecure, false, reason.clone(), message, now);
        }
    }
}

/// `ConfigInSync`, where the store is the truth: whether the leading operator's file says
/// of the group what the store says (`drift`: the fields that differ). Informational.
fn set_config_condition(st: &mut GroupStatus, drift: Option<&[String]>, now: Timestamp) {
    match drift {
        None => {}
        Some([]) => st.set_condition(C::ConfigInSync, true, R::AsExpected, "", now),
        Some(fields) => st.set_condition(
            C::ConfigInSync,
            false,
            R::ConfigDrift,
            &format!(
                "the leading operator's configuration file differs from the stored group at {}; the stored spec is in force (`bloodraven apply -f FILE` changes it)",
                fields.join(", ")
            ),
            now,
        ),
    }
}

/// The conditions, as the settled decision says them.
pub(super) fn set_conditions(st: &mut GroupStatus, c: &controller::Conditions, now: Timestamp) {
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
    match &c.sidecar_timings_mismatch {
        None => st.set_condition(C::SidecarTimingsInSync, true, R::AsExpected, "", now),
        Some(m) => st.set_condition(
            C::SidecarTimingsInSync,
            false,
            R::SidecarTimingsMismatch,
            m,
            now,
        ),
    }
    match &c.recovery_pending {
        None => st.set_condition(C::RecoveryPending, false, R::AsExpected, "", now),
        Some(m) => st.set_condition(C::RecoveryPending, true, R::RecoveryBlocked, m, now),
    }
}
