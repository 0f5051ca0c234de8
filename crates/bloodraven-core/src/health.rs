//! Group health as the deploy API reports it: `stable`, `unstableReason`, and the gates that
//! decide whether a lease may be granted or renewed (SPEC §3.2–3.3).
//!
//! This module owns one pure function, [`assess`], from a [`HealthInputs`] snapshot to an
//! [`Assessment`]. It never looks at replication lag: lag is reported to the caller, who applies
//! its own threshold (seed 01: "your lag threshold is your policy").

use serde::{Deserialize, Serialize};

pub use crate::planned::PlannedFailoverPhase;

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
        (executing, UnstableReason::AutomaticFailoverHeld),
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
