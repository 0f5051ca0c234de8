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
}

/// Label keys.
pub mod labels {
    /// On an operator Pod (Kubernetes mode): `"true"` while that replica leads, `"false"`
    /// otherwise. The chart's Services select `"true"`, so requests reach the leader.
    pub const LEADER: &str = "bloodraven.shipstream.io/leader";
}

/// Log messages that are part of the contract (the `msg` field of a log line).
pub mod logs {
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
}

/// Event reasons on the `MysqlFailoverGroup`. docs/operator.md lists them from here.
pub mod events {
    /// Deploy leases were revoked (`TopologyChanged` or `OperatorRevoked`).
    pub const DEPLOYMENT_LEASE_REVOKED: &str = "DeploymentLeaseRevoked";
    /// The group got its first active site.
    pub const ACTIVE_SITE_BOOTSTRAPPED: &str = "ActiveSiteBootstrapped";
    /// An emergency failover started, succeeded, failed (with the step that failed).
    pub const FAILOVER_STARTED: &str = "FailoverStarted";
    pub const FAILOVER_SUCCEEDED: &str = "FailoverSucceeded";
    pub const FAILOVER_FAILED: &str = "FailoverFailed";
    /// A writable site that is not the active one was fenced.
    pub const SITE_FENCED: &str = "SiteFenced";
    /// A returning site holds transactions the group never received: it stays fenced.
    pub const DATA_LOSS_DETECTED: &str = "DataLossDetected";
    /// A recovery-blocked site no longer diverges.
    pub const RECOVERY_UNBLOCKED: &str = "RecoveryUnblocked";
    /// Every site was read-only: writability was restored on the last failover target.
    pub const PRIMARY_REASSERTED: &str = "PrimaryReasserted";
    /// A replica now follows the active site.
    pub const REPLICA_REPOINTED: &str = "ReplicaRepointed";
    /// A planned failover entered (or re-entered, after a deferral) admission.
    pub const PLANNED_FAILOVER_ADMITTING: &str = "PlannedFailoverAdmitting";
    pub const PLANNED_FAILOVER_DEFERRED: &str = "PlannedFailoverDeferred";
    /// A planned failover request was dropped: another one is in flight.
    pub const PLANNED_FAILOVER_REJECTED: &str = "PlannedFailoverRejected";
    pub const PLANNED_FAILOVER_SUCCEEDED: &str = "PlannedFailoverSucceeded";
    pub const PLANNED_FAILOVER_FAILED: &str = "PlannedFailoverFailed";
    /// Draining killed an application session that kept the fence from landing.
    pub const BLOCKING_SESSION_KILLED: &str = "BlockingSessionKilled";
    /// Kubernetes mode: the group's spec does not validate, so the group does not run.
    pub const SPEC_INVALID: &str = "SpecInvalid";
    /// Alerts (raised once when they start): see [`super::reasons`].
    pub const SPLIT_BRAIN: &str = super::reasons::SPLIT_BRAIN;
    pub const NO_PRIMARY: &str = super::reasons::NO_PRIMARY;
    pub const ALL_SITES_UNREACHABLE: &str = "AllSitesUnreachable";
    pub const FAILOVER_BLOCKED_BY_COOLDOWN: &str = "FailoverBlockedByCooldown";
    pub const NO_FAILOVER_CANDIDATE: &str = "NoFailoverCandidate";
    pub const AUTOMATIC_FAILOVER_HELD: &str = "AutomaticFailoverHeld";
    pub const SEMI_SYNC_FALLBACK: &str = super::reasons::SEMI_SYNC_FALLBACK;
    /// An emergency failover's candidate first caught up from a more advanced site.
    pub const CAUGHT_UP_BEFORE_PROMOTION: &str = "CaughtUpBeforePromotion";

    /// Every event reason, for docs and tests.
    pub const ALL: &[&str] = &[
        DEPLOYMENT_LEASE_REVOKED,
        SPEC_INVALID,
        ACTIVE_SITE_BOOTSTRAPPED,
        FAILOVER_STARTED,
        FAILOVER_SUCCEEDED,
        FAILOVER_FAILED,
        SITE_FENCED,
        DATA_LOSS_DETECTED,
        RECOVERY_UNBLOCKED,
        PRIMARY_REASSERTED,
        REPLICA_REPOINTED,
        PLANNED_FAILOVER_ADMITTING,
        PLANNED_FAILOVER_DEFERRED,
        PLANNED_FAILOVER_REJECTED,
        PLANNED_FAILOVER_SUCCEEDED,
        PLANNED_FAILOVER_FAILED,
        BLOCKING_SESSION_KILLED,
        SPLIT_BRAIN,
        NO_PRIMARY,
        ALL_SITES_UNREACHABLE,
        FAILOVER_BLOCKED_BY_COOLDOWN,
        NO_FAILOVER_CANDIDATE,
        AUTOMATIC_FAILOVER_HELD,
        SEMI_SYNC_FALLBACK,
        CAUGHT_UP_BEFORE_PROMOTION,
    ];
}

/// Condition types and reasons of `status.conditions`, and the reasons a planned failover
/// fails or defers with (`status.plannedFailover.reason`, `admission.deferReason`).
pub mod reasons {
    /// Condition types.
    pub const READY: &str = "Ready";
    pub const DEGRADED: &str = "Degraded";
    pub const RECOVERY_PENDING: &str = "RecoveryPending";
    /// Informational: every sidecar runs with the group's `spec.sidecar` timings. Never makes
    /// the group unstable.
    pub const SIDECAR_TIMINGS_IN_SYNC: &str = "SidecarTimingsInSync";

    /// Condition reasons.
    pub const AS_EXPECTED: &str = "AsExpected";
    pub const ACTIVE_SITE_WRITABLE: &str = "ActiveSiteWritable";
    pub const SPLIT_BRAIN: &str = "SplitBrain";
    pub const NO_PRIMARY: &str = "NoPrimary";
    pub const REPLICATION_NOT_RUNNING: &str = "ReplicationNotRunning";
    /// Degraded by lag alone: reported, but never makes the group unstable.
    pub const REPLICATION_LAGGING: &str = "ReplicationLagging";
    pub const SITE_UNREACHABLE: &str = "SiteUnreachable";
    /// Also a site's `recoveryState`.
    pub const RECOVERY_BLOCKED: &str = "RecoveryBlocked";
    pub const SIDECAR_TIMINGS_MISMATCH: &str = "SidecarTimingsMismatch";
    /// `spec.replication.mode: semi-sync` and the active site's lossless guarantee does not
    /// hold (not configured yet, a lossy wait point, or fell back to asynchronous).
    pub const SEMI_SYNC_FALLBACK: &str = "SemiSyncFallback";
    /// `semi-sync` and no replica acknowledges: the guarantee holds, writes wait.
    pub const SEMI_SYNC_WRITES_WAIT: &str = "SemiSyncWritesWait";

    /// Why admission deferred a planned failover.
    pub const DEPLOYMENT_HOLD: &str = "DeploymentHold";
    pub const COOLDOWN: &str = "Cooldown";

    /// Why a planned failover failed: admission.
    pub const UNKNOWN_TARGET: &str = "UnknownTarget";
    pub const TARGET_NOT_CANDIDATE: &str = "TargetNotCandidate";
    pub const NO_ACTIVE_SITE: &str = "NoActiveSite";
    pub const ALREADY_ACTIVE: &str = "AlreadyActive";
    pub const SOURCE_NOT_WRITABLE: &str = "SourceNotWritable";
    pub const TARGET_RECOVERY_BLOCKED: &str = "TargetRecoveryBlocked";
    pub const TARGET_NOT_READY: &str = "TargetNotReady";
    pub const TARGET_NOT_REPLICATING: &str = "TargetNotReplicating";
    /// Why a planned failover failed: execution.
    pub const FENCE_FAILED: &str = "FenceFailed";
    pub const SOURCE_UNREADABLE: &str = "SourceUnreadable";
    pub const LAG_TIMEOUT: &str = "LagTimeout";
    pub const WAIT_FAILED: &str = "WaitFailed";
    pub const SITE_UNKNOWN: &str = "SiteUnknown";

    /// Every condition type and reason, for docs and tests.
    pub const ALL: &[&str] = &[
        READY,
        DEGRADED,
        RECOVERY_PENDING,
        SIDECAR_TIMINGS_IN_SYNC,
        AS_EXPECTED,
        ACTIVE_SITE_WRITABLE,
        SPLIT_BRAIN,
        NO_PRIMARY,
        REPLICATION_NOT_RUNNING,
        REPLICATION_LAGGING,
        SITE_UNREACHABLE,
        RECOVERY_BLOCKED,
        SIDECAR_TIMINGS_MISMATCH,
        SEMI_SYNC_FALLBACK,
        SEMI_SYNC_WRITES_WAIT,
        DEPLOYMENT_HOLD,
        COOLDOWN,
        UNKNOWN_TARGET,
        TARGET_NOT_CANDIDATE,
        NO_ACTIVE_SITE,
        ALREADY_ACTIVE,
        SOURCE_NOT_WRITABLE,
        TARGET_RECOVERY_BLOCKED,
        TARGET_NOT_READY,
        TARGET_NOT_REPLICATING,
        FENCE_FAILED,
        SOURCE_UNREADABLE,
        LAG_TIMEOUT,
        WAIT_FAILED,
        SITE_UNKNOWN,
    ];
}

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
    ];
    /// Every sidecar metric.
    pub const SIDECAR: &[&str] = &[
        SIDECAR_FENCES_TOTAL,
        SIDECAR_TICK_DURATION_SECONDS,
        SIDECAR_LAST_CONTACT_AGE_SECONDS,
        SIDECAR_SELF_FENCED,
    ];

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
