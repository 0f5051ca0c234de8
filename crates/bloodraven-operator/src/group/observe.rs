//! What a group serves: the status with the last poll's observation (the persisted status is
//! written only when it changed), the assessment behind `stable` and the lease gates, and the
//! observation of SPEC §3.3.

use std::sync::PoisonError;

use bloodraven_core::health::{Assessment, assess, health_inputs};
use bloodraven_core::lease::LeaseGate;
use bloodraven_core::reason::ConditionType;
use bloodraven_core::status::GroupStatus;
use bloodraven_core::wire::deploy::{
    HealthView, Observation, Operations, OrderedUpdateView, PlannedFailoverView, RestoreInPlaceView,
};

use super::{GroupRuntime, GroupSnapshot, RETRY_AFTER_SECONDS};

impl GroupRuntime {
    /// Records what the controller's last poll saw (its whole status, `observedAt` its time):
    /// the status is persisted only when it changed, but what is served is this fresh.
    pub fn set_observed(&self, status: GroupStatus) {
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = Some(status);
    }

    /// The status as served (`/status`, `/active-site`'s `observedAt`, the deploy API's
    /// lag): the persisted status with the last poll's moving fields
    /// ([`GroupStatus::observed`]). Everything that decides — the active site, the
    /// generation, the states and conditions — is the persisted one.
    pub fn served_status(&self, snap: &GroupSnapshot) -> GroupStatus {
        match &*self.live.read().unwrap_or_else(PoisonError::into_inner) {
            Some(live) => snap.status().observed(live),
            None => snap.status().clone(),
        }
    }

    /// `stable`, `unstableReason` and the lease gates, from the status and the flags.
    pub fn assessment(&self, snap: &GroupSnapshot) -> Assessment {
        assess(&health_inputs(snap.status(), self.flags()))
    }

    pub(super) fn gate(&self, snap: &GroupSnapshot) -> LeaseGate {
        LeaseGate {
            topology_generation: snap.status().topology_generation,
            assessment: self.assessment(snap),
            retry_after_seconds: RETRY_AFTER_SECONDS,
        }
    }

    /// The observation of SPEC §3.3.
    pub async fn observe(&self) -> Observation {
        let snap = self.snapshot();
        let now = self.now();
        let live = self.leases.lock().await.engine.live(now);
        let served = self.served_status(&snap);
        let status = &served;
        let inputs = health_inputs(status, self.flags());
        let a = assess(&inputs);
        let degraded = status
            .condition(&ConditionType::Degraded)
            .filter(|c| c.is_true());
        let ready = status.condition(&ConditionType::Ready).map_or_else(
            || !status.active_site.is_empty() && degraded.is_none(),
            bloodraven_core::status::Condition::is_true,
        );
        Observation {
            group: self.name.clone(),
            namespace: self.namespace.clone(),
            active_site: status.active_site.clone(),
            topology_generation: status.topology_generation,
            health: HealthView {
                ready,
                degraded_reason: degraded.map(|c| c.reason.to_string()).unwrap_or_default(),
                replication_running: inputs.replication_running,
                replication_lag_seconds: inputs.replication_lag_seconds,
                recovery_pending: inputs.recovery_pending,
            },
            operations: Operations {
                planned_failover: status
                    .planned_failover
                    .as_ref()
                    .filter(|p| !p.phase.is_terminal())
                    .map(|p| PlannedFailoverView {
                        phase: p.phase.as_str().to_string(),
                        target: p.target.clone(),
                        admission: p.admission.clone(),
                    }),
                ordered_update: status
                    .update_phase
                    .as_ref()
                    .filter(|u| u.in_flight())
                    .map(|u| OrderedUpdateView {
                        phase: u.phase.as_str().to_string(),
                        site: u.site.clone(),
                        admission: u.admission.clone(),
                    }),
                restore_in_place: status
                    .restore_in_place
                    .as_ref()
                    .filter(|r| r.in_flight())
                    .map(|r| RestoreInPlaceView {
                        phase: r.phase.as_str().to_string(),
                        target_site: r.target_site.clone(),
                        admission: r.admission.clone(),
                    }),
            },
            stable: a.stable,
            unstable_reason: a
                .unstable_reason
                .map(|r| r.as_str().to_string())
                .unwrap_or_default(),
            leases: live,
        }
    }
}
