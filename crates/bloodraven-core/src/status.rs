//! `MysqlFailoverGroup.status` (SPEC §2.2) and what it says about stability.
//!
//! The operator's controller writes this status; the deploy API reads it. [`health_inputs`]
//! reduces a status (plus the operator's in-memory "pending" flags) to the facts
//! [`crate::health::assess`] decides on.

use serde::{Deserialize, Serialize};

use crate::health::HealthInputs;
pub use crate::planned::{Admission, PlannedFailoverPhase, PlannedFailoverStatus};
use crate::time::Timestamp;

/// Condition types (defined in [`crate::contract::reasons`]).
pub mod condition {
    pub use crate::contract::reasons::{
        DEGRADED, READY, RECOVERY_PENDING, SIDECAR_TIMINGS_IN_SYNC,
    };
}

/// Condition reasons that the stability rules look at (defined in
/// [`crate::contract::reasons`]).
pub mod reason {
    pub use crate::contract::reasons::{
        NO_PRIMARY, REPLICATION_LAGGING, REPLICATION_NOT_RUNNING, SEMI_SYNC_FALLBACK,
        SEMI_SYNC_WRITES_WAIT, SIDECAR_TIMINGS_MISMATCH, SPLIT_BRAIN,
    };
}

/// A site's debounced state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SiteState {
    #[default]
    Unknown,
    Writable,
    ReadOnly,
    Unreachable,
}

impl SiteState {
    pub const ALL: [SiteState; 4] = [
        SiteState::Unknown,
        SiteState::Writable,
        SiteState::ReadOnly,
        SiteState::Unreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SiteState::Unknown => "unknown",
            SiteState::Writable => "writable",
            SiteState::ReadOnly => "read-only",
            SiteState::Unreachable => "unreachable",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::site_status)
)]
pub struct SiteStatus {
    pub name: String,
    #[serde(default)]
    pub role: crate::config::SiteRole,
    #[serde(default)]
    pub state: SiteState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
    #[serde(default)]
    pub gtid_executed: String,
    #[serde(default)]
    pub replicating: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_behind_source: Option<u64>,
    /// Empty, or e.g. `RecoveryBlocked` (a returning primary with divergent transactions).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub recovery_state: String,
    /// The sidecar's last reported fence state, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_self_fenced: Option<bool>,
    /// The timings the sidecar last reported running with, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_timings: Option<SidecarTimings>,
}

/// A sidecar's effective timings, as its `/status` reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SidecarTimings {
    pub lease_timeout: String,
    pub peer_check_interval: String,
    /// `flags`, `operator` (the group's spec, from a verified view) or `pinned`.
    #[serde(default)]
    pub source: String,
    /// The sidecar adopts only signed views.
    #[serde(default)]
    pub signed_topology: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Timestamp>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// `MysqlFailoverGroup.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::group_status)
)]
pub struct GroupStatus {
    /// Empty until the group has had an active site.
    #[serde(default)]
    pub active_site: String,
    /// Durable; bumped on every authoritative change of active site.
    #[serde(default)]
    pub topology_generation: u64,
    #[serde(default)]
    pub sites: Vec<SiteStatus>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_failover_target: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub promotion_gtid_executed: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_failover: Option<PlannedFailoverStatus>,
    #[serde(default)]
    pub observed_generation: i64,
    /// When the operator last confirmed this status (its clock); `None` before the first poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Timestamp>,
}

impl GroupStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    fn condition_true_with(&self, type_: &str, reason: &str) -> bool {
        self.condition(type_)
            .is_some_and(|c| c.is_true() && c.reason == reason)
    }

    pub fn site(&self, name: &str) -> Option<&SiteStatus> {
        self.sites.iter().find(|s| s.name == name)
    }

    /// Whether every site that should replicate does: each reachable site other than the
    /// active one. A group without an active site has nothing to replicate from.
    pub fn replication_running(&self) -> bool {
        // Before the first poll is published the site list is empty: nothing is known to
        // replicate yet (an empty list must not read as "every replica runs").
        if self.active_site.is_empty() || self.sites.is_empty() {
            return false;
        }
        self.sites
            .iter()
            .filter(|s| s.name != self.active_site)
            .all(|s| s.replicating)
    }

    /// The largest replication lag among replicas, if any reports one.
    pub fn max_lag_seconds(&self) -> Option<u64> {
        self.sites
            .iter()
            .filter(|s| s.name != self.active_site)
            .filter_map(|s| s.seconds_behind_source)
            .max()
    }

    /// Sets (or replaces) a condition, keeping its transition time when the status is unchanged.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) {
        let status_s = if status { "True" } else { "False" };
        if let Some(c) = self.conditions.iter_mut().find(|c| c.type_ == type_) {
            if c.status != status_s {
                c.last_transition_time = Some(now);
            }
            c.status = status_s.to_string();
            c.reason = reason.to_string();
            c.message = message.to_string();
        } else {
            self.conditions.push(Condition {
                type_: type_.to_string(),
                status: status_s.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition_time: Some(now),
            });
        }
    }
}

/// The operator's in-memory flags that are not (yet) in the stored status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingFlags {
    /// A new `topologyGeneration` is being persisted, or leases are being revoked for it.
    pub topology_change_pending: bool,
    /// A revoke-all has been requested and not yet applied.
    pub revocation_pending: bool,
    /// Automatic failover is held outside a planned failover's executing phases.
    pub automatic_failover_held: bool,
}

/// Reduces a stored status and the pending flags to the inputs of [`crate::health::assess`].
pub fn health_inputs(status: &GroupStatus, flags: PendingFlags) -> HealthInputs {
    let split_brain = status.condition_true_with(condition::DEGRADED, reason::SPLIT_BRAIN);
    let no_primary = status.active_site.is_empty()
        || status.condition_true_with(condition::DEGRADED, reason::NO_PRIMARY)
        || status
            .condition(condition::READY)
            .is_some_and(|c| !c.is_true() && c.reason == reason::NO_PRIMARY);
    // Degraded for any reason other than those with their own unstable reason, and other than
    // lag: lag alone never makes the group unstable (the caller applies its own threshold).
    let degraded = status.condition(condition::DEGRADED).is_some_and(|c| {
        c.is_true()
            && ![
                reason::SPLIT_BRAIN,
                reason::NO_PRIMARY,
                reason::REPLICATION_LAGGING,
            ]
            .contains(&c.reason.as_str())
    });
    let recovery_pending = status
        .condition(condition::RECOVERY_PENDING)
        .is_some_and(Condition::is_true)
        || status.sites.iter().any(|s| !s.recovery_state.is_empty());
    HealthInputs {
        planned_failover: status
            .planned_failover
            .as_ref()
            .map(|p| p.phase)
            .filter(|p| !p.is_terminal()),
        automatic_failover_held: flags.automatic_failover_held,
        ordered_update_in_progress: false,
        restore_in_place_in_progress: false,
        topology_change_pending: flags.topology_change_pending,
        revocation_pending: flags.revocation_pending,
        split_brain,
        no_primary,
        degraded,
        recovery_pending,
        replication_running: status.replication_running(),
        #[allow(clippy::cast_precision_loss)]
        replication_lag_seconds: status.max_lag_seconds().map(|s| s as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::{UnstableReason, assess};

    fn healthy() -> GroupStatus {
        GroupStatus {
            active_site: "iad".into(),
            topology_generation: 17,
            sites: vec![
                SiteStatus {
                    name: "iad".into(),
                    state: SiteState::Writable,
                    ..SiteStatus::default()
                },
                SiteStatus {
                    name: "pdx".into(),
                    state: SiteState::ReadOnly,
                    replicating: true,
                    seconds_behind_source: Some(0),
                    ..SiteStatus::default()
                },
            ],
            ..GroupStatus::default()
        }
    }

    fn reason_of(s: &GroupStatus) -> Option<UnstableReason> {
        assess(&health_inputs(s, PendingFlags::default())).unstable_reason
    }

    #[test]
    fn healthy_status_is_stable() {
        assert_eq!(reason_of(&healthy()), None);
    }

    #[test]
    fn replication_is_not_running_before_any_site_was_seen() {
        let mut s = healthy();
        assert!(s.replication_running());
        s.sites.clear();
        assert!(
            !s.replication_running(),
            "an empty site list proves nothing"
        );
    }

    #[test]
    fn lagging_is_degraded_but_stable() {
        let mut s = healthy();
        s.sites[1].seconds_behind_source = Some(9000);
        s.set_condition(
            condition::DEGRADED,
            true,
            reason::REPLICATION_LAGGING,
            "lag 9000s",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), None);
        let h = health_inputs(&s, PendingFlags::default());
        assert_eq!(h.replication_lag_seconds, Some(9000.0));
    }

    /// A semi-sync group whose guarantee does not hold, or whose writes wait, is unstable for
    /// the deploy API: no new lease while acknowledged writes could be lost or none can be made.
    #[test]
    fn a_semi_sync_fallback_or_waiting_writes_make_the_group_unstable() {
        for why in [reason::SEMI_SYNC_FALLBACK, reason::SEMI_SYNC_WRITES_WAIT] {
            let mut s = healthy();
            assert_eq!(reason_of(&s), None);
            s.set_condition(condition::DEGRADED, true, why, "x", Timestamp::EPOCH);
            assert_eq!(reason_of(&s), Some(UnstableReason::Degraded), "{why}");
        }
    }

    #[test]
    fn conditions_map_to_reasons() {
        let mut s = healthy();
        s.set_condition(
            condition::DEGRADED,
            true,
            reason::SPLIT_BRAIN,
            "two writable",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), Some(UnstableReason::SplitBrain));
        s.set_condition(
            condition::DEGRADED,
            true,
            "SiteUnreachable",
            "pdx down",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), Some(UnstableReason::Degraded));
        s.set_condition(condition::DEGRADED, false, "", "", Timestamp::EPOCH);
        s.set_condition(
            condition::RECOVERY_PENDING,
            true,
            "RecoveryBlocked",
            "",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), Some(UnstableReason::RecoveryPending));
        let mut s = healthy();
        s.sites[1].replicating = false;
        assert_eq!(reason_of(&s), Some(UnstableReason::ReplicationNotRunning));
        let mut s = healthy();
        s.active_site.clear();
        assert_eq!(reason_of(&s), Some(UnstableReason::NoPrimary));
    }

    #[test]
    fn pending_flags_and_planned_failover() {
        let s = healthy();
        let flags = PendingFlags {
            topology_change_pending: true,
            ..PendingFlags::default()
        };
        let a = assess(&health_inputs(&s, flags));
        assert_eq!(
            a.unstable_reason,
            Some(UnstableReason::TopologyChangePending)
        );
        assert!(a.renewal_allowed().is_err());
        let mut s = healthy();
        let mut planned =
            PlannedFailoverStatus::requested("pdx", "iad", Timestamp::from_unix_seconds(0));
        planned.phase = PlannedFailoverPhase::Deferred;
        s.planned_failover = Some(planned);
        assert_eq!(reason_of(&s), Some(UnstableReason::PlannedFailover));
        if let Some(p) = s.planned_failover.as_mut() {
            p.phase = PlannedFailoverPhase::Succeeded;
        }
        assert_eq!(reason_of(&s), None);
    }

    #[test]
    fn condition_transition_time_moves_only_on_change() {
        let mut s = GroupStatus::default();
        let t1 = Timestamp::from_unix_seconds(1);
        let t2 = Timestamp::from_unix_seconds(2);
        s.set_condition(condition::READY, true, "Healthy", "", t1);
        s.set_condition(condition::READY, true, "Healthy", "again", t2);
        assert_eq!(
            s.condition(condition::READY).unwrap().last_transition_time,
            Some(t1)
        );
        s.set_condition(condition::READY, false, "NoPrimary", "", t2);
        assert_eq!(
            s.condition(condition::READY).unwrap().last_transition_time,
            Some(t2)
        );
    }

    #[test]
    fn status_serialises_with_spec_names() {
        let s = healthy();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["activeSite"], "iad");
        assert_eq!(v["topologyGeneration"], 17);
        assert_eq!(v["sites"][1]["state"], "read-only");
        assert_eq!(v["sites"][1]["secondsBehindSource"], 0);
    }
}
