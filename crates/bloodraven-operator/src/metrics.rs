//! The operator's Prometheus metrics, named by `bloodraven_core::contract::metrics`. Every
//! label has a bounded set of values: group and site names come from the groups' specs,
//! kinds, reasons, handlers and codes are fixed lists. Every series of a group exists from the
//! group's start ([`Metrics::init_group`]): a counter at zero, so `rate()` and `increase()`
//! work before its first event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use bloodraven_core::contract::metrics as names;
use bloodraven_core::lease::{LeaseKind, RevocationReason};
use bloodraven_core::planned::DeferReason;
use bloodraven_core::reason::RecoveryState;
use bloodraven_core::status::{GroupStatus, SiteState, UpdatePhase};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupKind {
    pub group: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupResult {
    pub group: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupPhase {
    pub group: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupReason {
    pub group: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandlerCode {
    pub handler: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Handler {
    pub handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupSite {
    pub group: String,
    pub site: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupSiteState {
    pub group: String,
    pub site: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupSiteReason {
    pub group: String,
    pub site: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupSiteResult {
    pub group: String,
    pub site: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub group: String,
    #[prometheus(flatten)]
    pub condition: ConditionValue,
}

/// A condition's `type`, `status` and `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionValue {
    pub r#type: String,
    pub status: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    pub group: String,
    pub kind: String,
    pub result: String,
}

fn latency_buckets() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

fn duration_buckets() -> Histogram {
    Histogram::new([
        0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ])
}

/// The deploy API's handlers (the `handler` label), each with its success code: their series
/// exist from the start, at zero.
pub const API_HANDLERS: [(&str, u16); 5] = [
    ("observe", 200),
    ("grant", 201),
    ("renew", 200),
    ("release", 200),
    ("unknown", 404),
];

/// Every metric of the operator.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    pub leases_active: Family<GroupKind, Gauge>,
    pub planned_failovers_deferred: Family<GroupReason, Counter>,
    pub lease_grants: Family<GroupKind, Counter>,
    pub lease_renewals: Family<GroupKind, Counter>,
    pub lease_releases: Family<GroupKind, Counter>,
    pub lease_expirations: Family<GroupKind, Counter>,
    pub lease_revocations: Family<GroupReason, Counter>,
    pub api_requests: Family<HandlerCode, Counter>,
    pub api_request_duration: Family<Handler, Histogram, fn() -> Histogram>,
    pub topology_generation: Family<GroupLabel, Gauge>,
    pub site_state: Family<GroupSiteState, Gauge>,
    pub replication_lag: Family<GroupSite, Gauge>,
    pub poll_duration: Family<GroupLabel, Histogram, fn() -> Histogram>,
    pub failovers: Family<FailoverLabels, Counter>,
    pub failovers_blocked_by_cooldown: Family<GroupLabel, Counter>,
    pub planned_failover_duration: Family<GroupLabel, Histogram, fn() -> Histogram>,
    pub active_site: Family<GroupSite, Gauge>,
    pub fences: Family<GroupSiteReason, Counter>,
    pub semisync_active: Family<GroupSite, Gauge>,
    pub reclones: Family<GroupSiteResult, Counter>,
    pub ordered_updates: Family<GroupResult, Counter>,
    pub ordered_update_phase: Family<GroupPhase, Gauge>,
    pub restores: Family<GroupResult, Counter>,
    pub site_up: Family<GroupSite, Gauge>,
    pub site_recovery_state: Family<GroupSiteState, Gauge>,
    pub replication_running: Family<GroupSite, Gauge>,
    pub replication_max_lag: Family<GroupLabel, Gauge>,
    pub conditions: Family<ConditionLabels, Gauge>,
    /// The condition series each group has now, per condition type (so a changed reason or
    /// status removes the old series rather than leaving a stale 1 or a growing set of 0s).
    current_conditions: Arc<Mutex<BTreeMap<(String, String), ConditionValue>>>,
    pub operator_leader: Gauge,
    pub leadership_acquired: Counter,
    pub store_errors: Family<Operation, Counter>,
    pub certificate_expiry: Family<Component, Gauge>,
    pub config_drift: Family<GroupLabel, Gauge>,
    pub backup_last_success: Family<GroupLabel, Gauge>,
    pub backup_duration: Family<GroupLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub backup_bytes: Family<GroupLabel, Gauge>,
    pub backup_verifications: Family<GroupResult, Counter>,
    pub binlog_archive_lag: Family<GroupLabel, Gauge>,
    pub binlog_archive_gaps: Family<GroupLabel, Counter>,
}

/// The `component` label of [`names::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Component {
    pub component: &'static str,
}

/// The `state` label of [`names::SITE_RECOVERY_STATE`] for a recovery state (a state another
/// version wrote is `other`: the label set stays bounded).
pub fn recovery_label(state: &RecoveryState) -> &'static str {
    match state {
        RecoveryState::None => "none",
        RecoveryState::RecoveryBlocked => "RecoveryBlocked",
        RecoveryState::Recloning => "Recloning",
        RecoveryState::RecloneFailed => "RecloneFailed",
        RecoveryState::AwaitingReclone => "AwaitingReclone",
        RecoveryState::Other(_) => "other",
    }
}

/// Every value of the `state` label of [`names::SITE_RECOVERY_STATE`].
pub const RECOVERY_LABELS: [&str; 6] = [
    "none",
    "RecoveryBlocked",
    "Recloning",
    "RecloneFailed",
    "AwaitingReclone",
    "other",
];

/// The store operations [`names::STORE_ERRORS_TOTAL`] counts.
pub const STORE_OPERATIONS: [&str; 3] = ["get", "list", "apply"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::default();
        let m = Metrics {
            registry: Arc::new(Mutex::new(Registry::default())),
            leases_active: Family::default(),
            planned_failovers_deferred: Family::default(),
            lease_grants: Family::default(),
            lease_renewals: Family::default(),
            lease_releases: Family::default(),
            lease_expirations: Family::default(),
            lease_revocations: Family::default(),
            api_requests: Family::default(),
            api_request_duration: Family::new_with_constructor(latency_buckets),
            topology_generation: Family::default(),
            site_state: Family::default(),
            replication_lag: Family::default(),
            poll_duration: Family::new_with_constructor(latency_buckets),
            failovers: Family::default(),
            failovers_blocked_by_cooldown: Family::default(),
            planned_failover_duration: Family::new_with_constructor(duration_buckets),
            active_site: Family::default(),
            fences: Family::default(),
            reclones: Family::default(),
            ordered_updates: Family::default(),
            ordered_update_phase: Family::default(),
            restores: Family::default(),
            semisync_active: Family::default(),
            site_up: Family::default(),
            site_recovery_state: Family::default(),
            replication_running: Family::default(),
            replication_max_lag: Family::default(),
            conditions: Family::default(),
            current_conditions: Arc::default(),
            operator_leader: Gauge::default(),
            leadership_acquired: Counter::default(),
            store_errors: Family::default(),
            certificate_expiry: Family::default(),
            config_drift: Family::default(),
            backup_last_success: Family::default(),
            backup_duration: Family::default(),
            backup_bytes: Family::default(),
            backup_verifications: Family::default(),
            binlog_archive_lag: Family::default(),
            binlog_archive_gaps: Family::default(),
        };
        m.register_all(&mut r);
        for operation in STORE_OPERATIONS {
            let _ = m.store_errors.get_or_create(&Operation {
                operation: operation.to_string(),
            });
        }
        for (handler, code) in API_HANDLERS {
            let _ = m.api_requests.get_or_create(&HandlerCode {
                handler: handler.to_string(),
                code: code.to_string(),
            });
            let _ = m.api_request_duration.get_or_create(&Handler {
                handler: handler.to_string(),
            });
        }
        *m.registry.lock().unwrap_or_else(PoisonError::into_inner) = r;
        m
    }

    /// Registers every family with its help text. Over 100 lines: one statement per metric
    /// family of the contract, a table more than logic, best read in one place.
    fn register_all(&self, r: &mut Registry) {
        // prometheus-client appends `_total` to a counter's name: register it without.
        fn counter(name: &str) -> &str {
            name.strip_suffix("_total").unwrap_or(name)
        }
        r.register(
            names::DEPLOY_LEASES_ACTIVE,
            "Live deploy leases by group and kind",
            self.leases_active.clone(),
        );
        r.register(
            counter(names::PLANNED_FAILOVERS_DEFERRED_TOTAL),
            "Planned failovers deferred, by reason (DeploymentHold, Cooldown)",
            self.planned_failovers_deferred.clone(),
        );
        r.register(
            counter(names::DEPLOY_LEASE_GRANTS_TOTAL),
            "Deploy leases granted (new and re-granted)",
            self.lease_grants.clone(),
        );
        r.register(
            counter(names::DEPLOY_LEASE_RENEWALS_TOTAL),
            "Deploy lease renewals",
            self.lease_renewals.clone(),
        );
        r.register(
            counter(names::DEPLOY_LEASE_RELEASES_TOTAL),
            "Deploy leases released",
            self.lease_releases.clone(),
        );
        r.register(
            counter(names::DEPLOY_LEASE_EXPIRATIONS_TOTAL),
            "Deploy leases that expired",
            self.lease_expirations.clone(),
        );
        r.register(
            counter(names::DEPLOY_LEASE_REVOCATIONS_TOTAL),
            "Deploy leases revoked, by reason (TopologyChanged, OperatorRevoked)",
            self.lease_revocations.clone(),
        );
        r.register(
            counter(names::DEPLOY_API_REQUESTS_TOTAL),
            "Deploy API requests by handler and HTTP status",
            self.api_requests.clone(),
        );
        r.register(
            names::DEPLOY_API_REQUEST_DURATION_SECONDS,
            "Deploy API request latency by handler",
            self.api_request_duration.clone(),
        );
        r.register(
            names::TOPOLOGY_GENERATION,
            "The group's topologyGeneration",
            self.topology_generation.clone(),
        );
        r.register(
            names::ACTIVE_SITE,
            "1 for the group's active site, 0 for its other sites",
            self.active_site.clone(),
        );
        r.register(
            names::SEMISYNC_ACTIVE,
            "1 while the site plays its semi-synchronous part (the active site lossless, another site acknowledging); 0 otherwise and in async mode",
            self.semisync_active.clone(),
        );
        r.register(
            names::SITE_STATE,
            "1 for the site's current debounced state (unknown, writable, read-only, unreachable)",
            self.site_state.clone(),
        );
        r.register(
            names::REPLICATION_LAG_SECONDS,
            "Seconds behind the source, per replica",
            self.replication_lag.clone(),
        );
        r.register(
            names::POLL_DURATION_SECONDS,
            "Time to probe every site of a group",
            self.poll_duration.clone(),
        );
        r.register(
            counter(names::FAILOVERS_TOTAL),
            "Failovers by kind (emergency, planned) and result (succeeded, failed)",
            self.failovers.clone(),
        );
        r.register(
            counter(names::FAILOVERS_BLOCKED_BY_COOLDOWN_TOTAL),
            "Emergency failovers not started because of failoverCooldown",
            self.failovers_blocked_by_cooldown.clone(),
        );
        r.register(
            names::PLANNED_FAILOVER_DURATION_SECONDS,
            "Planned failover duration from admission to completion",
            self.planned_failover_duration.clone(),
        );
        r.register(
            counter(names::FENCES_TOTAL),
            "Fences the operator confirmed, by site and reason (intruder, planned, emergency)",
            self.fences.clone(),
        );
        r.register(
            counter(names::RECLONES_TOTAL),
            "Reclones that ended, by site and result (succeeded, failed)",
            self.reclones.clone(),
        );
        r.register(
            counter(names::ORDERED_UPDATES_TOTAL),
            "Ordered updates that ended, by result (succeeded, failed)",
            self.ordered_updates.clone(),
        );
        r.register(
            counter(names::RESTORES_TOTAL),
            "Restores-in-place that ended, by result (succeeded, failed)",
            self.restores.clone(),
        );
        r.register(
            names::ORDERED_UPDATE_PHASE,
            "1 for the ordered update's current phase, 0 for the others",
            self.ordered_update_phase.clone(),
        );
        r.register(
            names::SITE_UP,
            "1 when the site's last probe answered, 0 when it did not (undebounced)",
            self.site_up.clone(),
        );
        r.register(
            names::SITE_RECOVERY_STATE,
            "1 for the site's current recoveryState (none, RecoveryBlocked, Recloning, RecloneFailed, other)",
            self.site_recovery_state.clone(),
        );
        r.register(
            names::REPLICATION_RUNNING,
            "1 when both of the site's replication threads run",
            self.replication_running.clone(),
        );
        r.register(
            names::REPLICATION_MAX_LAG_SECONDS,
            "The group's spec.replication.maxLagSeconds",
            self.replication_max_lag.clone(),
        );
        r.register(
            names::CONDITION,
            "1 for each of the group's current conditions, by type, status and reason",
            self.conditions.clone(),
        );
        r.register(
            names::OPERATOR_LEADER,
            "1 while this operator process leads, 0 while it follows",
            self.operator_leader.clone(),
        );
        r.register(
            counter(names::LEADERSHIP_ACQUIRED_TOTAL),
            "Times this operator process became the leader",
            self.leadership_acquired.clone(),
        );
        r.register(
            counter(names::STORE_ERRORS_TOTAL),
            "Store calls that got no answer (backend or API server failed, or a write's answer was lost), by operation",
            self.store_errors.clone(),
        );
        r.register(
            names::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
            "When the operator's component certificate stops being valid (Unix seconds); an expired one makes every sidecar count the operator silent",
            self.certificate_expiry.clone(),
        );
        r.register(
            names::CONFIG_DRIFT,
            "1 while this operator's configuration file differs from the stored group (the store is in force), or names a group the store lacks",
            self.config_drift.clone(),
        );
        r.register(
            names::BACKUP_LAST_SUCCESS_TIMESTAMP_SECONDS,
            "When the group's last good backup completed (Unix seconds)",
            self.backup_last_success.clone(),
        );
        r.register(
            names::BACKUP_DURATION_SECONDS,
            "How long the group's last good backup took",
            self.backup_duration.clone(),
        );
        r.register(
            names::BACKUP_BYTES,
            "The stored (compressed) bytes of the group's last good backup",
            self.backup_bytes.clone(),
        );
        r.register(
            counter(names::BACKUP_VERIFICATIONS_TOTAL),
            "Backup verifications that ended, by result (succeeded, failed)",
            self.backup_verifications.clone(),
        );
        r.register(
            names::BINLOG_ARCHIVE_LAG_SECONDS,
            "How long the group's binlog archive has been behind its primary (0: caught up)",
            self.binlog_archive_lag.clone(),
        );
        r.register(
            counter(names::BINLOG_ARCHIVE_GAPS_TOTAL),
            "Gaps found in the group's binlog archive (each run of missing transactions once)",
            self.binlog_archive_gaps.clone(),
        );
    }

    /// Sets the series a group's status carries: its conditions, and per site its recovery
    /// state and whether it replicates; and the group's `maxLagSeconds`.
    pub fn observe_status(&self, group: &str, status: &GroupStatus, max_lag_seconds: u64) {
        self.replication_max_lag
            .get_or_create(&GroupLabel {
                group: group.to_string(),
            })
            .set(i64::try_from(max_lag_seconds).unwrap_or(i64::MAX));
        for site in &status.sites {
            let now = recovery_label(&site.recovery_state);
            for state in RECOVERY_LABELS {
                self.site_recovery_state
                    .get_or_create(&GroupSiteState {
                        group: group.to_string(),
                        site: site.name.clone(),
                        state: state.to_string(),
                    })
                    .set(i64::from(state == now));
            }
            self.replication_running
                .get_or_create(&GroupSite {
                    group: group.to_string(),
                    site: site.name.clone(),
                })
                .set(i64::from(site.replicating));
        }
        let mut current = self
            .current_conditions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for c in &status.conditions {
            let value = ConditionValue {
                r#type: c.type_.as_str().to_string(),
                status: c.status.clone(),
                reason: c.reason.as_str().to_string(),
            };
            let key = (group.to_string(), value.r#type.clone());
            if let Some(old) = current.insert(key, value.clone())
                && old != value
            {
                self.conditions.remove(&ConditionLabels {
                    group: group.to_string(),
                    condition: old,
                });
            }
            self.conditions
                .get_or_create(&ConditionLabels {
                    group: group.to_string(),
                    condition: value,
                })
                .set(1);
        }
    }

    /// Whether this process leads now; a `true` begins a term and is counted.
    pub fn set_leader(&self, leads: bool) {
        if leads {
            self.leadership_acquired.inc();
        }
        self.operator_leader.set(i64::from(leads));
    }

    /// When the component certificate in use stops being valid.
    pub fn certificate_expiry(&self, not_after: bloodraven_core::time::Timestamp) {
        self.certificate_expiry
            .get_or_create(&Component {
                component: names::COMPONENT_OPERATOR,
            })
            .set(not_after.unix_seconds());
    }

    /// Whether this operator's file differs from the stored `group`.
    pub fn config_drift(&self, group: &str, drifted: bool) {
        self.config_drift
            .get_or_create(&GroupLabel {
                group: group.to_string(),
            })
            .set(i64::from(drifted));
    }

    /// The last good backup of `group`: when it completed, how long it took, its size.
    pub fn backup_succeeded(&self, group: &str, completed_unix: i64, took_secs: f64, bytes: u64) {
        let g = GroupLabel {
            group: group.to_string(),
        };
        self.backup_last_success
            .get_or_create(&g)
            .set(completed_unix);
        self.backup_duration.get_or_create(&g).set(took_secs);
        self.backup_bytes
            .get_or_create(&g)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The binlog archive of `group`: how long it has been behind, and `new_gaps` more gaps.
    pub fn binlog_archive(&self, group: &str, lag_secs: u64, new_gaps: u64) {
        let g = GroupLabel {
            group: group.to_string(),
        };
        self.binlog_archive_lag
            .get_or_create(&g)
            .set(i64::try_from(lag_secs).unwrap_or(i64::MAX));
        let gaps = self.binlog_archive_gaps.get_or_create(&g);
        if new_gaps > 0 {
            gaps.inc_by(new_gaps);
        }
    }

    /// Counts a backup verification of `group` that ended.
    pub fn backup_verified(&self, group: &str, ok: bool) {
        self.backup_verifications
            .get_or_create(&GroupResult {
                group: group.to_string(),
                result: if ok { "succeeded" } else { "failed" }.to_string(),
            })
            .inc();
    }

    /// Counts a store call of `operation` that got no answer.
    pub fn store_error(&self, operation: &'static str) {
        self.store_errors
            .get_or_create(&Operation {
                operation: operation.to_string(),
            })
            .inc();
    }

    /// Creates every series of `group` (sites `sites`, active site `active`): counters and
    /// histograms at zero, lease gauges at zero, each site's state `unknown` and lag 0 until
    /// its first poll.
    pub fn init_group(&self, group: &str, sites: &[String], active: &str, generation: u64) {
        let g = || GroupLabel {
            group: group.to_string(),
        };
        for kind in LeaseKind::ALL {
            let k = Metrics::kind(group, kind);
            let _ = self.leases_active.get_or_create(&k);
            let _ = self.lease_grants.get_or_create(&k);
            let _ = self.lease_renewals.get_or_create(&k);
            let _ = self.lease_releases.get_or_create(&k);
            let _ = self.lease_expirations.get_or_create(&k);
        }
        for reason in [DeferReason::DeploymentHold, DeferReason::Cooldown] {
            let _ = self
                .planned_failovers_deferred
                .get_or_create(&Metrics::reason(group, reason.as_str()));
        }
        for reason in [
            RevocationReason::TopologyChanged,
            RevocationReason::OperatorRevoked,
        ] {
            let _ = self
                .lease_revocations
                .get_or_create(&Metrics::reason(group, reason.as_str()));
        }
        for kind in ["emergency", "planned"] {
            for result in ["succeeded", "failed"] {
                let _ = self.failovers.get_or_create(&FailoverLabels {
                    group: group.to_string(),
                    kind: kind.to_string(),
                    result: result.to_string(),
                });
            }
        }
        for result in ["succeeded", "failed"] {
            let _ = self.ordered_updates.get_or_create(&GroupResult {
                group: group.to_string(),
                result: result.to_string(),
            });
        }
        self.set_update_phase(group, None);
        for result in ["succeeded", "failed"] {
            let _ = self.restores.get_or_create(&GroupResult {
                group: group.to_string(),
                result: result.to_string(),
            });
            let _ = self.backup_verifications.get_or_create(&GroupResult {
                group: group.to_string(),
                result: result.to_string(),
            });
        }
        let _ = self.failovers_blocked_by_cooldown.get_or_create(&g());
        let _ = self.poll_duration.get_or_create(&g());
        let _ = self.planned_failover_duration.get_or_create(&g());
        self.topology_generation
            .get_or_create(&g())
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        for site in sites {
            self.init_site(group, site, site == active);
        }
    }

    /// Creates every series of one site of `group` (see [`Metrics::init_group`]).
    fn init_site(&self, group: &str, site: &str, active: bool) {
        let gs = GroupSite {
            group: group.to_string(),
            site: site.to_string(),
        };
        self.active_site.get_or_create(&gs).set(i64::from(active));
        let _ = self.semisync_active.get_or_create(&gs);
        let _ = self.site_up.get_or_create(&gs);
        let _ = self.replication_running.get_or_create(&gs);
        for state in RECOVERY_LABELS {
            self.site_recovery_state
                .get_or_create(&GroupSiteState {
                    group: group.to_string(),
                    site: site.to_string(),
                    state: state.to_string(),
                })
                .set(i64::from(state == "none"));
        }
        for result in ["succeeded", "failed"] {
            let _ = self.reclones.get_or_create(&GroupSiteResult {
                group: group.to_string(),
                site: site.to_string(),
                result: result.to_string(),
            });
        }
        for reason in [
            names::FENCE_INTRUDER,
            names::FENCE_PLANNED,
            names::FENCE_EMERGENCY,
        ] {
            let _ = self.fences.get_or_create(&GroupSiteReason {
                group: group.to_string(),
                site: site.to_string(),
                reason: reason.to_string(),
            });
        }
        for st in SiteState::ALL {
            self.site_state
                .get_or_create(&GroupSiteState {
                    group: group.to_string(),
                    site: site.to_string(),
                    state: st.as_str().to_string(),
                })
                .set(i64::from(st == SiteState::Unknown));
        }
    }

    /// Sets the active-site gauge of each of `sites`.
    pub fn set_active_site(&self, group: &str, sites: &[String], active: &str) {
        for site in sites {
            self.active_site
                .get_or_create(&GroupSite {
                    group: group.to_string(),
                    site: site.clone(),
                })
                .set(i64::from(site == active));
        }
    }

    /// Sets the ordered-update phase gauge: 1 for `phase`, 0 for every other.
    pub fn set_update_phase(&self, group: &str, phase: Option<UpdatePhase>) {
        for &p in UpdatePhase::ALL {
            self.ordered_update_phase
                .get_or_create(&GroupPhase {
                    group: group.to_string(),
                    phase: p.as_str().to_string(),
                })
                .set(i64::from(Some(p) == phase));
        }
    }

    /// An ordered update ended with `result` (`succeeded`, `failed`).
    pub fn ordered_update_ended(&self, group: &str, result: &str) {
        self.ordered_updates
            .get_or_create(&GroupResult {
                group: group.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// A restore-in-place ended with `result` (`succeeded`, `failed`).
    pub fn restore_ended(&self, group: &str, result: &str) {
        self.restores
            .get_or_create(&GroupResult {
                group: group.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// A reclone of `site` ended with `result` (`succeeded`, `failed`).
    pub fn reclone_ended(&self, group: &str, site: &str, result: &str) {
        self.reclones
            .get_or_create(&GroupSiteResult {
                group: group.to_string(),
                site: site.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts a confirmed fence of `site`.
    pub fn fenced(&self, group: &str, site: &str, reason: &'static str) {
        self.fences
            .get_or_create(&GroupSiteReason {
                group: group.to_string(),
                site: site.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The registry as OpenMetrics text (see `bloodraven_runtime::exposition` for the
    /// classic format).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }

    pub fn kind(group: &str, kind: LeaseKind) -> GroupKind {
        GroupKind {
            group: group.to_string(),
            kind: kind.as_str().to_string(),
        }
    }

    pub fn reason(group: &str, reason: &str) -> GroupReason {
        GroupReason {
            group: group.to_string(),
            reason: reason.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::contract::metrics::{
        DEPLOY_LEASES_ACTIVE, PLANNED_FAILOVERS_DEFERRED_TOTAL,
    };

    #[test]
    fn contract_names_appear_in_the_exposition() {
        let m = Metrics::new();
        m.leases_active
            .get_or_create(&Metrics::kind("g", LeaseKind::Migration))
            .set(1);
        m.planned_failovers_deferred
            .get_or_create(&Metrics::reason("g", "DeploymentHold"))
            .inc();
        let text = m.render();
        assert!(
            text.contains(&format!(
                "{DEPLOY_LEASES_ACTIVE}{{group=\"g\",kind=\"migration\"}} 1"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{PLANNED_FAILOVERS_DEFERRED_TOTAL}{{group=\"g\",reason=\"DeploymentHold\"}} 1"
            )),
            "{text}"
        );
    }
}
