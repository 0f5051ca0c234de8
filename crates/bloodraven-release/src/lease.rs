//! The per-Deployment release Lease: acquire once, never renew, release only if still ours.
//!
//! Every write is a compare-and-swap on the Lease's `resourceVersion` (or a create that fails if
//! the Lease exists), sent once. Releasing clears the holder with an update; the Lease object
//! stays, so the next release contends on the same object.

use std::collections::BTreeMap;

use bloodraven_core::release::{
    CLOCK_SKEW_MARGIN, FIELD_MANAGER, LEASE_DEPLOYMENT_ANNOTATION, LEASE_DEPLOYMENT_LABEL,
    LEASE_DURATION, LeaseState, PlanId, is_label_value, lease_name, lease_state,
};
use bloodraven_core::time::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::WriteFailure;
use crate::convert::{lease_facts, to_micro};

/// A Lease this plan holds.
#[derive(Clone, Debug)]
pub struct HeldLease {
    pub name: String,
    pub expires_at: Timestamp,
}

/// Why the Lease was not acquired.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "Deployment is being released by another client: Lease {lease} is held by {holder} {}",
        match until { Some(t) => format!("until {t}"), None => "with no expiry time (delete the Lease if it is stale)".to_owned() }
    )]
    HeldByOther {
        lease: String,
        holder: String,
        until: Option<Timestamp>,
    },
    #[error("failed to read Lease {lease}: {source}")]
    Read { lease: String, source: kube::Error },
    #[error("failed to write Lease {lease}: {failure}")]
    Write {
        lease: String,
        failure: WriteFailure,
    },
}

fn lease_object(name: &str, deployment: &str) -> Lease {
    let mut labels = BTreeMap::new();
    if is_label_value(deployment) {
        labels.insert(LEASE_DEPLOYMENT_LABEL.to_owned(), deployment.to_owned());
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(
        LEASE_DEPLOYMENT_ANNOTATION.to_owned(),
        deployment.to_owned(),
    );
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

fn hold(spec: &mut LeaseSpec, plan_id: &PlanId, now: Timestamp) {
    spec.holder_identity = Some(plan_id.to_string());
    spec.acquire_time = Some(to_micro(now));
    spec.renew_time = Some(to_micro(now));
    spec.lease_duration_seconds = i32::try_from(LEASE_DURATION.as_secs()).ok();
}

fn params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

fn held_by_other(lease: &Lease, name: &str, plan_id: &PlanId, now: Timestamp) -> LeaseError {
    match lease_state(&lease_facts(lease), plan_id, now, CLOCK_SKEW_MARGIN) {
        LeaseState::HeldByOther { holder, until } => LeaseError::HeldByOther {
            lease: name.to_owned(),
            holder,
            until,
        },
        // Someone changed it between our read and our write, and it is free again or ours:
        // still a lost race, reported with whoever it names.
        _ => LeaseError::HeldByOther {
            lease: name.to_owned(),
            holder: lease_facts(lease).holder.unwrap_or_default(),
            until: None,
        },
    }
}

/// Takes the release Lease of `deployment` for `plan_id`, or says who holds it.
pub async fn acquire(
    api: &Api<Lease>,
    deployment: &str,
    plan_id: &PlanId,
    now: Timestamp,
) -> Result<HeldLease, LeaseError> {
    let name = lease_name(deployment);
    let read = |source| LeaseError::Read {
        lease: name.clone(),
        source,
    };
    let held = HeldLease {
        name: name.clone(),
        expires_at: now.plus(LEASE_DURATION),
    };
    let written = match api.get_opt(&name).await.map_err(read)? {
        None => {
            let mut lease = lease_object(&name, deployment);
            let mut spec = LeaseSpec::default();
            hold(&mut spec, plan_id, now);
            spec.lease_transitions = Some(0);
            lease.spec = Some(spec);
            api.create(&params(), &lease).await
        }
        Some(current) => {
            match lease_state(&lease_facts(&current), plan_id, now, CLOCK_SKEW_MARGIN) {
                LeaseState::HeldByOther { holder, until } => {
                    return Err(LeaseError::HeldByOther {
                        lease: name,
                        holder,
                        until,
                    });
                }
                LeaseState::Free | LeaseState::Ours => {}
            }
            let mut next = current.clone();
            let spec = next.spec.get_or_insert_with(LeaseSpec::default);
            hold(spec, plan_id, now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            api.replace(&name, &params(), &next).await
        }
    };
    match written {
        Ok(_) => Ok(held),
        Err(e) => match WriteFailure::classify(e) {
            // Another client created or replaced it first: report who.
            WriteFailure::Conflict { .. } => {
                let current = api.get(&name).await.map_err(read)?;
                Err(held_by_other(&current, &name, plan_id, now))
            }
            failure => Err(LeaseError::Write {
                lease: name.clone(),
                failure,
            }),
        },
    }
}

/// What happened when giving the Lease back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The holder was cleared.
    Released,
    /// The Lease no longer names this plan (it expired and someone else took it, or it is
    /// gone): left alone.
    NotOurs,
}

/// Clears the holder of `lease` if, and only if, it still names `plan_id`. An update, never a
/// delete, and a compare-and-swap on the `resourceVersion` just read.
pub async fn release(
    api: &Api<Lease>,
    lease: &HeldLease,
    plan_id: &PlanId,
) -> Result<Released, LeaseError> {
    let current = match api.get_opt(&lease.name).await {
        Ok(Some(l)) => l,
        Ok(None) => return Ok(Released::NotOurs),
        Err(source) => {
            return Err(LeaseError::Read {
                lease: lease.name.clone(),
                source,
            });
        }
    };
    if lease_facts(&current).holder.as_deref() != Some(plan_id.as_str()) {
        return Ok(Released::NotOurs);
    }
    let mut next = current;
    if let Some(spec) = next.spec.as_mut() {
        spec.holder_identity = None;
    }
    match api.replace(&lease.name, &params(), &next).await {
        Ok(_) => Ok(Released::Released),
        Err(e) => match WriteFailure::classify(e) {
            // Changed since our read: not ours to clear any more.
            WriteFailure::Conflict { .. } => Ok(Released::NotOurs),
            failure => Err(LeaseError::Write {
                lease: lease.name.clone(),
                failure,
            }),
        },
    }
}
