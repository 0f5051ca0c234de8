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
    /// One line per deploy API request.
    pub const DEPLOY_API: &str = "deploy api";
}

/// Event reasons on the `MysqlFailoverGroup`.
pub mod events {
    pub const DEPLOYMENT_LEASE_REVOKED: &str = "DeploymentLeaseRevoked";
    pub const PLANNED_FAILOVER_DEFERRED: &str = "PlannedFailoverDeferred";
    pub const DATA_LOSS_DETECTED: &str = "DataLossDetected";
    /// A planned failover entered (or re-entered, after a deferral) admission.
    pub const PLANNED_FAILOVER_ADMITTING: &str = "PlannedFailoverAdmitting";
    /// Draining killed an application session that kept the fence from landing.
    pub const BLOCKING_SESSION_KILLED: &str = "BlockingSessionKilled";
}

/// Metric names as they appear in the Prometheus exposition.
pub mod metrics {
    pub const DEPLOY_LEASES_ACTIVE: &str = "bloodraven_deploy_leases_active";
    pub const PLANNED_FAILOVERS_DEFERRED_TOTAL: &str =
        "bloodraven_planned_failovers_deferred_total";

    /// Sidecar: confirmed self-fences, by `rule` ([`RULE_TOPOLOGY_MISMATCH`],
    /// [`RULE_LEASE_EXPIRY`]).
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
    /// `party` label value of the operator.
    pub const PARTY_OPERATOR: &str = "operator";
    /// `party` label value of the peers (any of them).
    pub const PARTY_PEERS: &str = "peers";
}
