//! The operator's Prometheus metrics. Every label has a bounded set of values: group names
//! come from configuration, kinds, reasons, handlers and codes are fixed lists.

use std::sync::{Arc, Mutex, PoisonError};

use bloodraven_core::lease::LeaseKind;
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
}

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
        };
        // prometheus-client appends `_total` to counters; names here are without it.
        r.register(
            "bloodraven_deploy_leases_active",
            "Live deploy leases by group and kind",
            m.leases_active.clone(),
        );
        r.register(
            "bloodraven_planned_failovers_deferred",
            "Planned failovers deferred, by reason (DeploymentHold, Cooldown)",
            m.planned_failovers_deferred.clone(),
        );
        r.register(
            "bloodraven_deploy_lease_grants",
            "Deploy leases granted (new and re-granted)",
            m.lease_grants.clone(),
        );
        r.register(
            "bloodraven_deploy_lease_renewals",
            "Deploy lease renewals",
            m.lease_renewals.clone(),
        );
        r.register(
            "bloodraven_deploy_lease_releases",
            "Deploy leases released",
            m.lease_releases.clone(),
        );
        r.register(
            "bloodraven_deploy_lease_expirations",
            "Deploy leases that expired",
            m.lease_expirations.clone(),
        );
        r.register(
            "bloodraven_deploy_lease_revocations",
            "Deploy leases revoked, by reason (TopologyChanged, OperatorRevoked)",
            m.lease_revocations.clone(),
        );
        r.register(
            "bloodraven_deploy_api_requests",
            "Deploy API requests by handler and HTTP status",
            m.api_requests.clone(),
        );
        r.register(
            "bloodraven_deploy_api_request_duration_seconds",
            "Deploy API request latency by handler",
            m.api_request_duration.clone(),
        );
        r.register(
            "bloodraven_topology_generation",
            "The group's topologyGeneration",
            m.topology_generation.clone(),
        );
        r.register(
            "bloodraven_site_state",
            "1 for the site's current debounced state (unknown, writable, read-only, unreachable)",
            m.site_state.clone(),
        );
        r.register(
            "bloodraven_replication_lag_seconds",
            "Seconds behind the source, per replica",
            m.replication_lag.clone(),
        );
        r.register(
            "bloodraven_poll_duration_seconds",
            "Time to probe every site of a group",
            m.poll_duration.clone(),
        );
        r.register(
            "bloodraven_failovers",
            "Failovers by kind (emergency, planned) and result (succeeded, failed)",
            m.failovers.clone(),
        );
        r.register(
            "bloodraven_failovers_blocked_by_cooldown",
            "Emergency failovers not started because of failoverCooldown",
            m.failovers_blocked_by_cooldown.clone(),
        );
        r.register(
            "bloodraven_planned_failover_duration_seconds",
            "Planned failover duration from admission to completion",
            m.planned_failover_duration.clone(),
        );
        *m.registry.lock().unwrap_or_else(PoisonError::into_inner) = r;
        m
    }

    /// The Prometheus text exposition.
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
