//! Admission of a planned failover: proceed, defer (a live failover-hold, the cooldown) or
//! reject, from the gathered sites and the live hold.

use std::time::Duration;

use crate::config::SiteRole;
use crate::lease::LeaseView;
use crate::reason::{DeferReason, FailureReason};
use crate::status::SiteState;
use crate::time::Timestamp;
use crate::view::SiteView;

/// The verdict of [`admit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Start now: fence `source`, move the primary to `target`.
    Proceed { source: String, target: String },
    /// Wait until `retry_time` (or until the hold is released).
    Defer {
        reason: DeferReason,
        retry_time: Timestamp,
        message: String,
    },
    /// Impossible as asked.
    Reject {
        reason: FailureReason,
        message: String,
    },
}

/// Everything admission looks at.
#[derive(Clone, Debug)]
pub struct AdmissionInput<'a> {
    pub target: &'a str,
    pub active_site: &'a str,
    pub sites: &'a [SiteView],
    pub now: Timestamp,
    pub last_failover: Option<Timestamp>,
    pub cooldown: Duration,
    /// The group's live failover-hold, if any.
    pub live_hold: Option<&'a LeaseView>,
}

fn reject(reason: FailureReason, message: String) -> Verdict {
    Verdict::Reject { reason, message }
}

/// Decides admission.
pub fn admit(i: &AdmissionInput<'_>) -> Verdict {
    let Some(target) = i.sites.iter().find(|s| s.name == i.target) else {
        return reject(
            FailureReason::UnknownTarget,
            format!("{:?} is not a site of this group", i.target),
        );
    };
    if target.role != SiteRole::PrimaryCandidate {
        return reject(
            FailureReason::TargetNotCandidate,
            format!(
                "{} has role {} (only primary-candidate sites are promoted)",
                target.name,
                target.role.as_str()
            ),
        );
    }
    if i.active_site.is_empty() {
        return reject(
            FailureReason::NoActiveSite,
            "the group has no active site to move".into(),
        );
    }
    if target.name == i.active_site {
        return reject(
            FailureReason::AlreadyActive,
            format!("{} is already the active site", target.name),
        );
    }
    if let Some(hold) = i.live_hold {
        return Verdict::Defer {
            reason: DeferReason::DeploymentHold,
            retry_time: hold.expires_at,
            message: format!(
                "deferred by failover-hold {} (instance {})",
                hold.operation_id, hold.instance
            ),
        };
    }
    if let Some(until) = i
        .last_failover
        .map(|t| t.plus(i.cooldown))
        .filter(|until| *until > i.now)
    {
        return Verdict::Defer {
            reason: DeferReason::Cooldown,
            retry_time: until,
            message: format!(
                "deferred by failoverCooldown until {until} (last failover at {})",
                i.last_failover.unwrap_or(until)
            ),
        };
    }
    let Some(active) = i.sites.iter().find(|s| s.name == i.active_site) else {
        return reject(
            FailureReason::NoActiveSite,
            format!("active site {} is not in the spec", i.active_site),
        );
    };
    if active.state != SiteState::Writable {
        return reject(
            FailureReason::SourceNotWritable,
            format!(
                "the active site {} is {}",
                active.name,
                active.state.as_str()
            ),
        );
    }
    if target.recovery_blocked {
        return reject(
            FailureReason::TargetRecoveryBlocked,
            format!("{} holds divergent transactions", target.name),
        );
    }
    if target.state != SiteState::ReadOnly {
        return reject(
            FailureReason::TargetNotReady,
            format!(
                "{} is {} (must be reachable and read-only)",
                target.name,
                target.state.as_str()
            ),
        );
    }
    if !target.replicates_from(active) {
        return reject(
            FailureReason::TargetNotReplicating,
            format!("{} does not replicate from {}", target.name, active.name),
        );
    }
    Verdict::Proceed {
        source: active.name.clone(),
        target: target.name.clone(),
    }
}
