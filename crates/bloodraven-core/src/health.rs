//! Group health as the deploy API reports it: `stable`, `unstableReason`, and the gates that
//! decide whether a lease may be granted or renewed (SPEC §3.2–3.3).
//!
//! This module owns [`health_inputs`], which reduces a stored status and the operator's
//! in-memory flags to a [`HealthInputs`] snapshot, and [`assess`], from that snapshot to an
//! [`Assessment`]. It never looks at replication lag: lag is reported to the caller, who applies
//! its own threshold (seed 01: "your lag threshold is your policy"). It reads the persisted
//! shapes ([`crate::status`]) and the in-memory flags ([`crate::view::PendingFlags`]), nothing
//! else.

use serde::{Deserialize, Serialize};

use crate::reason::{ConditionReason, ConditionType};
pub use crate::status::PlannedFailoverPhase;
use crate::status::{Condition, GroupStatus};
use crate::view::PendingFlags;

/// Reduces a stored status and the pending flags to the inputs of [`assess`].
pub fn health_inputs(status: &GroupStatus, flags: PendingFlags) -> HealthInputs {
    use ConditionReason as R;
    let split_brain = status.condition_true_with(&ConditionType::Degraded, &R::SplitBrain);
    let no_primary = status.active_site.is_empty()
        || status.condition_true_with(&ConditionType::Degraded, &R::NoPrimary)
        || status
            .condition(&ConditionType::Ready)
            .is_some_and(|c| !c.is_true() && c.reason == R::NoPrimary);
    // Degraded for any reason other than those with their own unstable reason, and other than
    // lag: lag alone never makes the group unstable (the caller applies its own threshold).
    let degraded = status.condition(&ConditionType::Degraded).is_some_and(|c| {
        c.is_true()
            && !matches!(
                c.reason,
                R::SplitBrain | R::NoPrimary | R::ReplicationLagging
            )
    });
    let recovery_pending = status
        .condition(&ConditionType::RecoveryPending)
        .is_some_and(Condition::is_true)
        || status.sites.iter().any(|s| s.recovery_state.is_blocked());
    HealthInputs {
        planned_failover: status
            .planned_failover
            .as_ref()
            .map(|p| p.phase)
            .filter(|p| !p.is_terminal()),
        automatic_failover_held: flags.automatic_failover_held,
        ordered_update_in_progress: status
            .update_phase
            .as_ref()
            .is_some_and(crate::status::UpdateStatus::in_flight),
        update_switchover: status.update_switchover(),
        restore_in_place_in_progress: status
            .restore_in_place
            .as_ref()
            .is_some_and(crate::status::RestoreStatus::in_flight),
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

/// Why the group is not `stable`, in the precedence order of SPEC §3.3 (the first that applies
/// is reported). The derived `Ord` follows declaration order, which is that precedence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum UnstableReason {
    PlannedFailover,
    AutomaticFailoverHeld,
    OrderedUpdate,
    RestoreInPlace,
    TopologyChangePending,
    DeploymentRevocationPending,
    SplitBrain,
    NoPrimary,
    Degraded,
    RecoveryPending,
    ReplicationNotRunning,
}

impl UnstableReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PlannedFailover => "PlannedFailover",
            Self::AutomaticFailoverHeld => "AutomaticFailoverHeld",
            Self::OrderedUpdate => "OrderedUpdate",
            Self::RestoreInPlace => "RestoreInPlace",
            Self::TopologyChangePending => "TopologyChangePending",
            Self::DeploymentRevocationPending => "DeploymentRevocationPending",
            Self::SplitBrain => "SplitBrain",
            Self::NoPrimary => "NoPrimary",
            Self::Degraded => "Degraded",
            Self::RecoveryPending => "RecoveryPending",
            Self::ReplicationNotRunning => "ReplicationNotRunning",
        }
    }
}

/// What the operator knows about a group at one instant, reduced to the facts that decide
/// stability. Built by the operator from the group status; no field is derived from a lease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthInputs {
    /// The phase of the group's planned failover, if one exists (terminal phases count as none).
    pub planned_failover: Option<PlannedFailoverPhase>,
    /// Automatic failover is held outside a planned failover's executing phases (for example,
    /// while an operator drains a group by hand). Executing phases hold it implicitly.
    pub automatic_failover_held: bool,
    pub ordered_update_in_progress: bool,
    /// The phase of the ordered update's own switchover, while it runs: its executing phases
    /// hold renewals as a planned failover's do, and the group reports `OrderedUpdate`.
    #[serde(default)]
    pub update_switchover: Option<PlannedFailoverPhase>,
    pub restore_in_place_in_progress: bool,
    /// A new `topologyGeneration` is being persisted.
    pub topology_change_pending: bool,
    /// A revoke-all has been requested and not yet applied.
    pub revocation_pending: bool,
    pub split_brain: bool,
    pub no_primary: bool,
    pub degraded: bool,
    pub recovery_pending: bool,
    pub replication_running: bool,
    /// Reported to callers as `health.replicationLagSeconds`; deliberately not an input of
    /// the verdict (lag alone never makes a group unstable).
    pub replication_lag_seconds: Option<f64>,
}

/// The verdict of [`assess`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessment {
    /// `unstable_reason.is_none()`.
    pub stable: bool,
    /// The first reason of SPEC §3.3's list that applies; `None` when stable.
    pub unstable_reason: Option<UnstableReason>,
    /// Set when renewals must answer `423`: only a pending topology change, a reservation
    /// (a planned failover past admission) or a pending revocation blocks a renewal.
    pub renewal_blocked_by: Option<UnstableReason>,
}

impl Assessment {
    /// Whether a new lease may be granted (requires `stable`).
    pub fn grant_allowed(&self) -> Result<(), UnstableReason> {
        match self.unstable_reason {
            None => Ok(()),
            Some(r) => Err(r),
        }
    }

    /// Whether an existing lease may be renewed.
    pub fn renewal_allowed(&self) -> Result<(), UnstableReason> {
        match self.renewal_blocked_by {
            None => Ok(()),
            Some(r) => Err(r),
        }
    }
}

/// Decides `stable`, `unstableReason` and the renewal gate from a snapshot.
pub fn assess(h: &HealthInputs) -> Assessment {
    let phase = h.planned_failover.filter(|p| !p.is_terminal());
    let executing = phase.is_some_and(PlannedFailoverPhase::is_executing);

    // Precedence order of SPEC §3.3. A planned failover that has not yet reserved the topology
    // (Pending, Admitting, Deferred) reports `PlannedFailover`; once it executes, automatic
    // failover is held and that is what is reported.
    let candidates = [
        (
            phase.is_some() && !executing,
            UnstableReason::PlannedFailover,
        ),
        (
            executing || h.automatic_failover_held,
            UnstableReason::AutomaticFailoverHeld,
        ),
        (h.ordered_update_in_progress, UnstableReason::OrderedUpdate),
        (
            h.restore_in_place_in_progress,
            UnstableReason::RestoreInPlace,
        ),
        (
            h.topology_change_pending,
            UnstableReason::TopologyChangePending,
        ),
        (
            h.revocation_pending,
            UnstableReason::DeploymentRevocationPending,
        ),
        (h.split_brain, UnstableReason::SplitBrain),
        (h.no_primary, UnstableReason::NoPrimary),
        (h.degraded, UnstableReason::Degraded),
        (h.recovery_pending, UnstableReason::RecoveryPending),
        (
            !h.replication_running,
            UnstableReason::ReplicationNotRunning,
        ),
    ];
    let unstable_reason = candidates
        .iter()
        .find(|(applies, _)| *applies)
        .map(|(_, r)| *r);

    let renewal_candidates = [
        (
            h.topology_change_pending,
            UnstableReason::TopologyChangePending,
        ),
        (
            executing
                || h.update_switchover
                    .is_some_and(PlannedFailoverPhase::is_executing),
            UnstableReason::AutomaticFailoverHeld,
        ),
        (
            h.revocation_pending,
            UnstableReason::DeploymentRevocationPending,
        ),
    ];
    let renewal_blocked_by = renewal_candidates
        .iter()
        .find(|(applies, _)| *applies)
        .map(|(_, r)| *r);

    Assessment {
        stable: unstable_reason.is_none(),
        unstable_reason,
        renewal_blocked_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> HealthInputs {
        HealthInputs {
            replication_running: true,
            ..HealthInputs::default()
        }
    }

    #[test]
    fn healthy_group_is_stable() {
        let a = assess(&healthy());
        assert!(a.stable);
        assert_eq!(a.unstable_reason, None);
        assert_eq!(a.renewal_blocked_by, None);
        assert!(a.grant_allowed().is_ok());
        assert!(a.renewal_allowed().is_ok());
    }

    #[test]
    fn each_condition_alone_gives_its_reason() {
        use UnstableReason as R;
        type Setter = fn(&mut HealthInputs);
        let cases: Vec<(Setter, R)> = vec![
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Pending),
                R::PlannedFailover,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Admitting),
                R::PlannedFailover,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Deferred),
                R::PlannedFailover,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Draining),
                R::AutomaticFailoverHeld,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::WaitingForLag),
                R::AutomaticFailoverHeld,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Promoting),
                R::AutomaticFailoverHeld,
            ),
            (
                |h| h.planned_failover = Some(PlannedFailoverPhase::Resuming),
                R::AutomaticFailoverHeld,
            ),
            (
                |h| h.automatic_failover_held = true,
                R::AutomaticFailoverHeld,
            ),
            (|h| h.ordered_update_in_progress = true, R::OrderedUpdate),
            (|h| h.restore_in_place_in_progress = true, R::RestoreInPlace),
            (
                |h| h.topology_change_pending = true,
                R::TopologyChangePending,
            ),
            (
                |h| h.revocation_pending = true,
                R::DeploymentRevocationPending,
            ),
            (|h| h.split_brain = true, R::SplitBrain),
            (|h| h.no_primary = true, R::NoPrimary),
            (|h| h.degraded = true, R::Degraded),
            (|h| h.recovery_pending = true, R::RecoveryPending),
            (|h| h.replication_running = false, R::ReplicationNotRunning),
        ];
        for (set, want) in cases {
            let mut h = healthy();
            set(&mut h);
            let a = assess(&h);
            assert!(!a.stable, "{want:?}");
            assert_eq!(a.unstable_reason, Some(want));
            assert_eq!(a.grant_allowed(), Err(want));
        }
    }

    #[test]
    fn lag_alone_never_makes_the_group_unstable() {
        let mut h = healthy();
        h.replication_lag_seconds = Some(86_400.0 * 365.0);
        let a = assess(&h);
        assert!(a.stable);
        assert!(a.renewal_allowed().is_ok());
    }

    #[test]
    fn terminal_phases_do_not_count() {
        for p in [
            PlannedFailoverPhase::Succeeded,
            PlannedFailoverPhase::Failed,
        ] {
            let mut h = healthy();
            h.planned_failover = Some(p);
            assert!(assess(&h).stable, "{p:?}");
        }
    }

    #[test]
    fn first_reason_in_spec_order_wins() {
        let mut h = HealthInputs {
            planned_failover: Some(PlannedFailoverPhase::Deferred),
            split_brain: true,
            degraded: true,
            replication_running: false,
            ..HealthInputs::default()
        };
        assert_eq!(
            assess(&h).unstable_reason,
            Some(UnstableReason::PlannedFailover)
        );
        h.planned_failover = None;
        assert_eq!(assess(&h).unstable_reason, Some(UnstableReason::SplitBrain));
        h.split_brain = false;
        assert_eq!(assess(&h).unstable_reason, Some(UnstableReason::Degraded));
        h.degraded = false;
        assert_eq!(
            assess(&h).unstable_reason,
            Some(UnstableReason::ReplicationNotRunning)
        );
    }

    #[test]
    fn only_pending_change_reservation_or_revocation_blocks_renewal() {
        // Degraded, split brain, a deferred planned failover: renewals still go through.
        let mut h = HealthInputs {
            planned_failover: Some(PlannedFailoverPhase::Deferred),
            degraded: true,
            split_brain: true,
            no_primary: true,
            recovery_pending: true,
            replication_running: false,
            ..HealthInputs::default()
        };
        assert!(assess(&h).renewal_allowed().is_ok());
        h.topology_change_pending = true;
        assert_eq!(
            assess(&h).renewal_allowed(),
            Err(UnstableReason::TopologyChangePending)
        );
        h.topology_change_pending = false;
        h.revocation_pending = true;
        assert_eq!(
            assess(&h).renewal_allowed(),
            Err(UnstableReason::DeploymentRevocationPending)
        );
        h.revocation_pending = false;
        h.planned_failover = Some(PlannedFailoverPhase::Promoting);
        assert_eq!(
            assess(&h).renewal_allowed(),
            Err(UnstableReason::AutomaticFailoverHeld)
        );
    }

    #[test]
    fn the_reason_list_is_in_spec_order() {
        use UnstableReason as R;
        let spec_order = [
            R::PlannedFailover,
            R::AutomaticFailoverHeld,
            R::OrderedUpdate,
            R::RestoreInPlace,
            R::TopologyChangePending,
            R::DeploymentRevocationPending,
            R::SplitBrain,
            R::NoPrimary,
            R::Degraded,
            R::RecoveryPending,
            R::ReplicationNotRunning,
        ];
        assert!(spec_order.windows(2).all(|w| w[0] < w[1]));
    }
}

#[cfg(test)]
mod inputs_tests {
    use super::*;
    use crate::status::{PlannedFailoverStatus, SiteState, SiteStatus};
    use crate::time::Timestamp;
    use ConditionReason as R;
    use ConditionType as C;

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
            C::Degraded,
            true,
            R::ReplicationLagging,
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
        for why in [R::SemiSyncFallback, R::SemiSyncWritesWait] {
            let mut s = healthy();
            assert_eq!(reason_of(&s), None);
            s.set_condition(C::Degraded, true, why.clone(), "x", Timestamp::EPOCH);
            assert_eq!(reason_of(&s), Some(UnstableReason::Degraded), "{why}");
        }
    }

    #[test]
    fn conditions_map_to_reasons() {
        let mut s = healthy();
        s.set_condition(
            C::Degraded,
            true,
            R::SplitBrain,
            "two writable",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), Some(UnstableReason::SplitBrain));
        s.set_condition(
            C::Degraded,
            true,
            R::SiteUnreachable,
            "pdx down",
            Timestamp::EPOCH,
        );
        assert_eq!(reason_of(&s), Some(UnstableReason::Degraded));
        s.set_condition(C::Degraded, false, R::AsExpected, "", Timestamp::EPOCH);
        s.set_condition(
            C::RecoveryPending,
            true,
            R::RecoveryBlocked,
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
        s.set_condition(C::Ready, true, R::ActiveSiteWritable, "", t1);
        s.set_condition(C::Ready, true, R::ActiveSiteWritable, "again", t2);
        assert_eq!(
            s.condition(&C::Ready).unwrap().last_transition_time,
            Some(t1)
        );
        s.set_condition(C::Ready, false, R::NoPrimary, "", t2);
        assert_eq!(
            s.condition(&C::Ready).unwrap().last_transition_time,
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
