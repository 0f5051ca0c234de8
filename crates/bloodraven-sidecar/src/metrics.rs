//! The sidecar's Prometheus metrics. Names come from
//! [`bloodraven_core::contract::metrics`]; labels are bounded (two rules and the restart fence,
//! two parties).

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bloodraven_core::contract::metrics as names;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartyLabel {
    party: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComponentLabel {
    component: &'static str,
}

/// The registry and its metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    fences: Family<RuleLabel, Counter>,
    tick_duration: Histogram,
    last_contact_age: Family<PartyLabel, Gauge<f64, AtomicU64>>,
    self_fenced: Gauge,
    certificate_expiry: Family<ComponentLabel, Gauge>,
}

/// prometheus-client appends `_total` to counters itself.
fn counter_name(exposed: &'static str) -> &'static str {
    exposed.strip_suffix("_total").unwrap_or(exposed)
}

/// Registered with [`Unit::Seconds`], which appends `_seconds` itself.
fn seconds_name(exposed: &'static str) -> &'static str {
    exposed.strip_suffix("_seconds").unwrap_or(exposed)
}

impl Metrics {
    /// The metrics of the sidecar of `site` in `group`: every series carries both, so alerts
    /// join a sidecar's series with the operator's (`on(group, site)`).
    pub fn new(group: &str, site: &str) -> Self {
        let mut registry = Registry::with_labels(
            [
                (Cow::Borrowed("group"), Cow::Owned(group.to_string())),
                (Cow::Borrowed("site"), Cow::Owned(site.to_string())),
            ]
            .into_iter(),
        );
        let fences = Family::<RuleLabel, Counter>::default();
        let tick_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let last_contact_age = Family::<PartyLabel, Gauge<f64, AtomicU64>>::default();
        let self_fenced = Gauge::default();
        let certificate_expiry = Family::<ComponentLabel, Gauge>::default();
        registry.register(
            names::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
            "When this sidecar's component certificate stops being valid (Unix seconds); an expired one looks like silence to every peer",
            certificate_expiry.clone(),
        );
        registry.register(
            counter_name(names::SIDECAR_FENCES_TOTAL),
            "Confirmed self-fences of this site's MySQL, by rule",
            fences.clone(),
        );
        registry.register_with_unit(
            seconds_name(names::SIDECAR_TICK_DURATION_SECONDS),
            "Duration of one fencing-monitor tick (gather, decide, act)",
            Unit::Seconds,
            tick_duration.clone(),
        );
        registry.register_with_unit(
            seconds_name(names::SIDECAR_LAST_CONTACT_AGE_SECONDS),
            "Seconds since the party last answered (since the monitor started, if it never did)",
            Unit::Seconds,
            last_contact_age.clone(),
        );
        registry.register(
            names::SIDECAR_SELF_FENCED,
            "1 while the fencing monitor's own fence is in effect",
            self_fenced.clone(),
        );
        // Every series exists from the start, so rates and alerts see zeros, not gaps.
        for rule in [
            names::RULE_TOPOLOGY_MISMATCH,
            names::RULE_LEASE_EXPIRY,
            names::FENCE_SERVER_RESTART,
        ] {
            let _ = fences.get_or_create(&RuleLabel { rule });
        }
        for party in [names::PARTY_OPERATOR, names::PARTY_PEERS] {
            let _ = last_contact_age.get_or_create(&PartyLabel { party });
        }
        Metrics {
            registry,
            fences,
            tick_duration,
            last_contact_age,
            self_fenced,
            certificate_expiry,
        }
    }

    /// When the certificate in use stops being valid.
    pub fn certificate_expiry(&self, not_after: bloodraven_core::time::Timestamp) {
        self.certificate_expiry
            .get_or_create(&ComponentLabel {
                component: names::COMPONENT_SIDECAR,
            })
            .set(not_after.unix_seconds());
    }

    /// Counts a confirmed fence for `rule` (a [`bloodraven_core::fencing::Rule::label`]).
    pub fn fenced(&self, rule: &'static str) {
        self.fences.get_or_create(&RuleLabel { rule }).inc();
    }

    pub fn tick(&self, took: Duration) {
        self.tick_duration.observe(took.as_secs_f64());
    }

    pub fn contact_ages(&self, operator: Duration, peers: Duration) {
        for (party, age) in [
            (names::PARTY_OPERATOR, operator),
            (names::PARTY_PEERS, peers),
        ] {
            self.last_contact_age
                .get_or_create(&PartyLabel { party })
                .set(age.as_secs_f64());
        }
    }

    pub fn set_self_fenced(&self, fenced: bool) {
        self.self_fenced.set(i64::from(fenced));
    }

    /// The text exposition (`OpenMetrics`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_the_contract_names() {
        let m = Metrics::new("shop", "iad");
        m.fenced(names::RULE_LEASE_EXPIRY);
        m.tick(Duration::from_millis(3));
        m.contact_ages(Duration::from_millis(1500), Duration::from_secs(4));
        m.set_self_fenced(true);
        let text = m.encode();
        for line in [
            "bloodraven_sidecar_fences_total{group=\"shop\",site=\"iad\",rule=\"lease-expiry\"} 1",
            "bloodraven_sidecar_fences_total{group=\"shop\",site=\"iad\",rule=\"topology-mismatch\"} 0",
            "bloodraven_sidecar_fences_total{group=\"shop\",site=\"iad\",rule=\"server-restart\"} 0",
            "bloodraven_sidecar_tick_duration_seconds_count{group=\"shop\",site=\"iad\"} 1",
            "bloodraven_sidecar_last_contact_age_seconds{group=\"shop\",site=\"iad\",party=\"operator\"} 1.5",
            "bloodraven_sidecar_last_contact_age_seconds{group=\"shop\",site=\"iad\",party=\"peers\"} 4.0",
            "bloodraven_sidecar_self_fenced{group=\"shop\",site=\"iad\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
