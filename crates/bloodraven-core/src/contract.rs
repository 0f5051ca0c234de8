//! Names that are interfaces: users, dashboards, alerts and scripts depend on them, so each is
//! defined exactly once, here. Tests reference these constants; a rename is one edit.

/// The API group of Bloodraven's custom resources and annotation keys.
pub const API_GROUP: &str = "bloodraven.shipstream.io";

/// The audience deploy tokens must carry.
pub const DEPLOY_AUDIENCE: &str = "bloodraven-deploy";

/// Annotation keys on the `MysqlFailoverGroup`.
pub mod annotations {
    /// Requests a planned failover to the named site.
    pub const PLANNED_FAILOVER: &str = "bloodraven.shipstream.io/planned-failover";
    /// Requests that every deploy lease of the group be revoked (`OperatorRevoked`); removed by
    /// the operator once done.
    pub const REVOKE_DEPLOYMENT_LEASES: &str = "bloodraven.shipstream.io/revoke-deployment-leases";
    /// On a deploy-lease object: the lease record (JSON, token hashes only).
    pub const LEASE_RECORD: &str = "bloodraven.shipstream.io/lease-record";
    /// Requests a reclone: `<site>:<confirmation>` (`bloodraven site reclone`); removed by the
    /// operator once taken.
    pub const RECLONE_SITE: &str = "bloodraven.shipstream.io/reclone-site";
    /// On the group: request an ordered update; the value is the request's id (an id runs
    /// once).
    pub const ORDERED_UPDATE: &str = "bloodraven.shipstream.io/ordered-update";
    /// `fencing: strict`: promote the announced site without proof that the old primary is
    /// fenced (`bloodraven failover --force`). The value is `<site>:<who asked>`; removed by
    /// the operator once carried out, or when nothing waits.
    pub const FORCE_PROMOTION: &str = "bloodraven.shipstream.io/force-promotion";
    /// Requests a backup now (`bloodraven backup now`); the value is the backup's id (an id
    /// runs once). Removed by the operator once taken or refused.
    pub const BACKUP_NOW: &str = "bloodraven.shipstream.io/backup-now";
    /// Requests the verification of a backup (`bloodraven backup verify`); the value is its
    /// id. Removed by the operator once taken or refused.
    pub const BACKUP_VERIFY: &str = "bloodraven.shipstream.io/backup-verify";
}

/// Label keys.
pub mod labels {
    /// On an operator Pod (Kubernetes mode): `"true"` while that replica leads, `"false"`
    /// otherwise. The chart's Services select `"true"`, so requests reach the leader.
    pub const LEADER: &str = "bloodraven.shipstream.io/leader";
    /// On each site's MySQL Pods (found by `spec.sites[].selector`): `primary` on the active
    /// site once it takes writes, `replica` on the others, `reader` on `read-only` sites
    /// (`crate::routing::RoleLabel`). A `-primary` Service selects `primary`.
    pub const ROLE: &str = "bloodraven.shipstream.io/role";
}

/// Log messages that are part of the contract (the `msg` field of a log line).
pub mod logs {
    /// The operator held back a cross-site action (reassertion) because a restore-in-place
    /// keeps writes fenced.
    pub const RESTORE_DEFERRED: &str = "cross-site action deferred: in-place restore in progress";
    /// Prefix of the line the sidecar logs when it starts fencing (then the rule and why).
    pub const SELF_FENCING: &str = "SELF-FENCING:";
    /// Prefix of the line the sidecar logs once the fence is confirmed.
    pub const SELF_FENCED: &str = "SELF-FENCED:";
    /// The startup safety net could not ask the operator.
    pub const SAFETY_NET_QUERY_FAILED: &str =
        "safety net: could not query active site, staying fenced";
    /// The operator answered without an active site.
    pub const SAFETY_NET_NO_ACTIVE_SITE: &str =
        "safety net: no active site reported by operator, staying fenced";
    /// The operator named another site.
    pub const SAFETY_NET_STANDBY: &str = "safety net: confirmed standby site, staying fenced";
    /// The operator named this site and the fence was cleared.
    pub const SAFETY_NET_CLEARED: &str = "safety net: confirmed active site, fence cleared";
    /// The operator named this site but clearing the fence failed.
    pub const SAFETY_NET_CLEAR_FAILED: &str =
        "safety net: confirmed active site but could not clear the fence, staying fenced";
    /// The server restarted under a running sidecar: it is fenced and the operator asked, as
    /// at boot (then one of the lines above says how it ended).
    pub const SAFETY_NET_SERVER_RESTARTED: &str =
        "safety net: server restarted, fencing before asking";
    /// One line per deploy API request.
    pub const DEPLOY_API: &str = "deploy api";
    /// The tracing target of the operator's poll stages (`gather`, `decide`, `persist`,
    /// `act`, `event`), at `debug`: `RUST_LOG=bloodraven::poll=debug` shows how each poll ran.
    pub const POLL_TRACE_TARGET: &str = "bloodraven::poll";
}

/// Event reasons, condition types and reasons, why a planned failover defers or fails, and a
/// site's recovery state: enums in [`crate::reason`] that serialize to their contract strings
/// (docs/operator.md lists them from there).
pub use crate::reason::{
    ConditionReason, ConditionType, DeferReason, EventReason, FailureReason, RecoveryState,
};

/// Every metric name as scrapers see it (counters with their `_total`); dashboards and alerts
/// depend on them. Operator metrics carry `group` (and `site`, `kind`, `reason` where named);
/// every counter of a group exists at zero from the group's start.
pub mod metrics {

    /// Operator: live deploy leases, by `group` and `kind`.
    pub const DEPLOY_LEASES_ACTIVE: &str = "bloodraven_deploy_leases_active";
    /// Operator: planned failovers deferred, by `group` and `reason`.
    pub const PLANNED_FAILOVERS_DEFERRED_TOTAL: &str =
        "bloodraven_planned_failovers_deferred_total";
    /// Operator: deploy leases granted, by `group` and `kind`.
    pub const DEPLOY_LEASE_GRANTS_TOTAL: &str = "bloodraven_deploy_lease_grants_total";
    /// Operator: deploy lease renewals, by `group` and `kind`.
    pub const DEPLOY_LEASE_RENEWALS_TOTAL: &str = "bloodraven_deploy_lease_renewals_total";
    /// Operator: deploy leases released, by `group` and `kind`.
    pub const DEPLOY_LEASE_RELEASES_TOTAL: &str = "bloodraven_deploy_lease_releases_total";
    /// Operator: deploy leases that expired, by `group` and `kind`.
    pub const DEPLOY_LEASE_EXPIRATIONS_TOTAL: &str = "bloodraven_deploy_lease_expirations_total";
    /// Operator: deploy leases revoked, by `group` and `reason`.
    pub const DEPLOY_LEASE_REVOCATIONS_TOTAL: &str = "bloodraven_deploy_lease_revocations_total";
    /// Operator: deploy API requests, by `handler` and `code`.
    pub const DEPLOY_API_REQUESTS_TOTAL: &str = "bloodraven_deploy_api_requests_total";
    /// Operator: deploy API latency by `handler`, a histogram.
    pub const DEPLOY_API_REQUEST_DURATION_SECONDS: &str =
        "bloodraven_deploy_api_request_duration_seconds";
    /// Operator: reclones that ended, by `group`, `site` and `result` (`succeeded`, `failed`).
    pub const RECLONES_TOTAL: &str = "bloodraven_reclones_total";
    /// Operator: ordered updates that ended, by `group` and `result` (`succeeded`, `failed`).
    pub const ORDERED_UPDATES_TOTAL: &str = "bloodraven_ordered_updates_total";
    /// Operator: 1 for the ordered update's current phase, by `group` and `phase`; every
    /// phase 0 when none ran since the operator started.
    pub const ORDERED_UPDATE_PHASE: &str = "bloodraven_ordered_update_phase";
    /// Operator: restores-in-place that ended, by `group` and `result` (`succeeded`, `failed`).
    pub const RESTORES_TOTAL: &str = "bloodraven_restores_total";
    /// Operator: the group's `topologyGeneration`.
    pub const TOPOLOGY_GENERATION: &str = "bloodraven_topology_generation";
    /// Operator: 1 for the group's active site, 0 for its other sites.
    pub const ACTIVE_SITE: &str = "bloodraven_active_site";
    /// Operator: 1 for each site's current debounced `state`.
    pub const SITE_STATE: &str = "bloodraven_site_state";
    /// Operator: seconds behind the source, per replica `site`.
    pub const REPLICATION_LAG_SECONDS: &str = "bloodraven_replication_lag_seconds";
    /// Operator: time to probe every site of a group, a histogram.
    pub const POLL_DURATION_SECONDS: &str = "bloodraven_poll_duration_seconds";
    /// Operator: failovers by `group`, `kind` (emergency, planned) and `result`.
    pub const FAILOVERS_TOTAL: &str = "bloodraven_failovers_total";
    /// Operator: emergency failovers not started because of `failoverCooldown`.
    pub const FAILOVERS_BLOCKED_BY_COOLDOWN_TOTAL: &str =
        "bloodraven_failovers_blocked_by_cooldown_total";
    /// Operator: planned failover duration, admission to completion, a histogram.
    pub const PLANNED_FAILOVER_DURATION_SECONDS: &str =
        "bloodraven_planned_failover_duration_seconds";
    /// Operator: 1 while a site plays its semi-synchronous part (the active site runs the
    /// source side losslessly; another site acknowledges as a replica), 0 otherwise and always
    /// in `async` mode; by `group` and `site`.
    pub const SEMISYNC_ACTIVE: &str = "bloodraven_semisync_active";
    /// Operator: fences it confirmed, by `group`, `site` and `reason` ([`FENCE_INTRUDER`],
    /// [`FENCE_PLANNED`], [`FENCE_EMERGENCY`]).
    pub const FENCES_TOTAL: &str = "bloodraven_fences_total";

    /// `reason` of a fence of a writable site that is not the active site.
    pub const FENCE_INTRUDER: &str = "intruder";
    /// `reason` of the source's fence in a planned failover.
    pub const FENCE_PLANNED: &str = "planned";
    /// `reason` of the old primary's best-effort fence in an emergency failover.
    pub const FENCE_EMERGENCY: &str = "emergency";

    /// Operator: 1 when this site's last probe answered, 0 when it did not (undebounced: the
    /// debounced verdict is [`SITE_STATE`]), by `group` and `site`.
    pub const SITE_UP: &str = "bloodraven_site_up";
    /// Operator: 1 for each site's current `recoveryState` (`none`, `RecoveryBlocked`,
    /// `Recloning`, `RecloneFailed`, `other`), 0 for the rest; by `group`, `site` and `state`.
    pub const SITE_RECOVERY_STATE: &str = "bloodraven_site_recovery_state";
    /// Operator: 1 when the site's replication threads both run, 0 otherwise (the active site
    /// included: it replicates from nobody), by `group` and `site`.
    pub const REPLICATION_RUNNING: &str = "bloodraven_replication_running";
    /// Operator: the group's `spec.replication.maxLagSeconds`, by `group`.
    pub const REPLICATION_MAX_LAG_SECONDS: &str = "bloodraven_replication_max_lag_seconds";
    /// Operator: 1 for each of the group's current conditions, by `group`, `type`, `status`
    /// (`True`, `False`) and `reason`; a condition's earlier reason or status is removed.
    pub const CONDITION: &str = "bloodraven_condition";
    /// Operator: 1 while this process leads, 0 while it follows. Every operator process serves
    /// it from its start, so `absent()` of it means no operator is scraped.
    pub const OPERATOR_LEADER: &str = "bloodraven_operator_leader";
    /// Operator: the times this process became the leader.
    pub const LEADERSHIP_ACQUIRED_TOTAL: &str = "bloodraven_leadership_acquired_total";
    /// Operator: store calls that failed for want of an answer (the backend or the API server
    /// failed, or a write's answer was lost), by `operation` (`get`, `list`, `apply`). A
    /// conflict, a missing object or a refused object is an answer, not counted.
    pub const STORE_ERRORS_TOTAL: &str = "bloodraven_store_errors_total";

    /// Every operator metric, for checks that a dashboard or alert names only these.
    pub const OPERATOR: &[&str] = &[
        DEPLOY_LEASES_ACTIVE,
        PLANNED_FAILOVERS_DEFERRED_TOTAL,
        DEPLOY_LEASE_GRANTS_TOTAL,
        DEPLOY_LEASE_RENEWALS_TOTAL,
        DEPLOY_LEASE_RELEASES_TOTAL,
        DEPLOY_LEASE_EXPIRATIONS_TOTAL,
        DEPLOY_LEASE_REVOCATIONS_TOTAL,
        DEPLOY_API_REQUESTS_TOTAL,
        DEPLOY_API_REQUEST_DURATION_SECONDS,
        TOPOLOGY_GENERATION,
        ACTIVE_SITE,
        SITE_STATE,
        REPLICATION_LAG_SECONDS,
        POLL_DURATION_SECONDS,
        FAILOVERS_TOTAL,
        FAILOVERS_BLOCKED_BY_COOLDOWN_TOTAL,
        PLANNED_FAILOVER_DURATION_SECONDS,
        FENCES_TOTAL,
        SEMISYNC_ACTIVE,
        RECLONES_TOTAL,
        ORDERED_UPDATES_TOTAL,
        ORDERED_UPDATE_PHASE,
        RESTORES_TOTAL,
        SITE_UP,
        SITE_RECOVERY_STATE,
        REPLICATION_RUNNING,
        REPLICATION_MAX_LAG_SECONDS,
        CONDITION,
        OPERATOR_LEADER,
        LEADERSHIP_ACQUIRED_TOTAL,
        STORE_ERRORS_TOTAL,
        CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
        CONFIG_DRIFT,
        BACKUP_LAST_SUCCESS_TIMESTAMP_SECONDS,
        BACKUP_DURATION_SECONDS,
        BACKUP_BYTES,
        BACKUP_VERIFICATIONS_TOTAL,
        BINLOG_ARCHIVE_LAG_SECONDS,
        BINLOG_ARCHIVE_GAPS_TOTAL,
    ];
    /// Every sidecar metric. Each carries `group` and `site` (the sidecar's `--group` and
    /// `--site`), so alerts join them with the operator's series.
    pub const SIDECAR: &[&str] = &[
        SIDECAR_FENCES_TOTAL,
        SIDECAR_TICK_DURATION_SECONDS,
        SIDECAR_LAST_CONTACT_AGE_SECONDS,
        SIDECAR_SELF_FENCED,
        CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
    ];

    /// Operator, sidecar, router: when the component certificate in use stops being valid
    /// (Unix seconds), by `component` ([`COMPONENT_OPERATOR`], [`COMPONENT_SIDECAR`],
    /// [`COMPONENT_ROUTER`]); a sidecar's also carries its `group` and `site`. An expired
    /// certificate looks like silence to every peer: alert `BloodravenCertificateExpiring`.
    pub const CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS: &str =
        "bloodraven_certificate_expiry_timestamp_seconds";
    /// Operator, per `group`: 1 while this operator's configuration file says of the group
    /// something other than the store (or names a group the store lacks); 0 when they agree.
    /// Only where the store is the truth (etcd).
    pub const CONFIG_DRIFT: &str = "bloodraven_config_drift";
    /// Operator, per `group`: when the last good backup completed (Unix seconds); alert
    /// `BloodravenBackupTooOld`.
    pub const BACKUP_LAST_SUCCESS_TIMESTAMP_SECONDS: &str =
        "bloodraven_backup_last_success_timestamp_seconds";
    /// Operator, per `group`: how long the last good backup took.
    pub const BACKUP_DURATION_SECONDS: &str = "bloodraven_backup_duration_seconds";
    /// Operator, per `group`: the stored (compressed) bytes of the last good backup.
    pub const BACKUP_BYTES: &str = "bloodraven_backup_bytes";
    /// Operator: backup verifications that ended, by `group` and `result` (`succeeded`,
    /// `failed`); alert `BloodravenBackupVerifyFailed`.
    pub const BACKUP_VERIFICATIONS_TOTAL: &str = "bloodraven_backup_verifications_total";
    /// Operator, per `group`: how long the binlog archive has been behind the primary (0:
    /// caught up); alert `BloodravenBinlogArchiveLagging`.
    pub const BINLOG_ARCHIVE_LAG_SECONDS: &str = "bloodraven_binlog_archive_lag_seconds";
    /// Operator, per `group`: gaps found in the binlog archive's chain (each new run of
    /// missing transactions counts once); alert `BloodravenBinlogArchiveGap`.
    pub const BINLOG_ARCHIVE_GAPS_TOTAL: &str = "bloodraven_binlog_archive_gaps_total";
    /// `component` label value of the operator.
    pub const COMPONENT_OPERATOR: &str = "operator";
    /// `component` label value of a sidecar.
    pub const COMPONENT_SIDECAR: &str = "sidecar";
    /// `component` label value of a router.
    pub const COMPONENT_ROUTER: &str = "router";

    /// Sidecar: confirmed self-fences, by `rule` ([`RULE_TOPOLOGY_MISMATCH`],
    /// [`RULE_LEASE_EXPIRY`], and [`FENCE_SERVER_RESTART`] for a server fenced because it
    /// restarted under the sidecar).
    pub const SIDECAR_FENCES_TOTAL: &str = "bloodraven_sidecar_fences_total";
    /// Sidecar: duration of one monitor tick (gather, decide, act), a histogram.
    pub const SIDECAR_TICK_DURATION_SECONDS: &str = "bloodraven_sidecar_tick_duration_seconds";
    /// Sidecar: seconds since a `party` ([`PARTY_OPERATOR`], [`PARTY_PEERS`]) last answered.
    pub const SIDECAR_LAST_CONTACT_AGE_SECONDS: &str =
        "bloodraven_sidecar_last_contact_age_seconds";
    /// Sidecar: 1 while the monitor's own fence is in effect.
    pub const SIDECAR_SELF_FENCED: &str = "bloodraven_sidecar_self_fenced";

    /// `rule` label value of rule #1.
    pub const RULE_TOPOLOGY_MISMATCH: &str = "topology-mismatch";
    /// `rule` label value of rule #2.
    pub const RULE_LEASE_EXPIRY: &str = "lease-expiry";
    /// `rule` label value of the fence of a server that restarted under a running sidecar
    /// (not a rule: the startup safety net run again).
    pub const FENCE_SERVER_RESTART: &str = "server-restart";
    /// `party` label value of the operator.
    pub const PARTY_OPERATOR: &str = "operator";
    /// `party` label value of the peers (any of them).
    pub const PARTY_PEERS: &str = "peers";
}
