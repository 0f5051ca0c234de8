//! Admission of a planned failover (SPEC §2.6): may it start now, must it wait, or is it
//! impossible? A live failover-hold and the failover cooldown defer it (it re-enters admission
//! on its own when they lapse); an invalid target rejects it.

use std::time::Duration;

use crate::config::SiteRole;
use crate::controller::SiteView;
use crate::lease::LeaseView;
use crate::status::SiteState;
use crate::time::Timestamp;

/// Why admission deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    DeploymentHold,
    Cooldown,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::DeploymentHold => "DeploymentHold",
            DeferReason::Cooldown => "Cooldown",
        }
    }
}

/// The verdict of [`admit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Start now: fence `source`, move the primary to `target`.
    Proceed { source: String, target: String },
    /// Wait until `retry_time` (or until the hold is released).
    Defer {
        reason: DeferReason,
        retry_time: Timestamp,
        message: String,
    },
    /// Impossible as asked.
    Reject { reason: String, message: String },
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

fn reject(reason: &str, message: String) -> Admission {
    Admission::Reject {
        reason: reason.to_string(),
        message,
    }
}

/// Decides admission.
pub fn admit(i: &AdmissionInput<'_>) -> Admission {
    let Some(target) = i.sites.iter().find(|s| s.name == i.target) else {
        return reject(
            "UnknownTarget",
            format!("{:?} is not a site of this group", i.target),
        );
    };
    if target.role != SiteRole::PrimaryCandidate {
        return reject(
            "TargetNotCandidate",
            format!(
                "{} has role {} (only primary-candidate sites are promoted)",
                target.name,
                target.role.as_str()
            ),
        );
    }
    if i.active_site.is_empty() {
        return reject(
            "NoActiveSite",
            "the group has no active site to move".into(),
        );
    }
    if target.name == i.active_site {
        return reject(
            "AlreadyActive",
            format!("{} is already the active site", target.name),
        );
    }
    if let Some(hold) = i.live_hold {
        return Admission::Defer {
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
        return Admission::Defer {
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
            "NoActiveSite",
            format!("active site {} is not in the spec", i.active_site),
        );
    };
    if active.state != SiteState::Writable {
        return reject(
            "SourceNotWritable",
            format!(
                "the active site {} is {}",
                active.name,
                active.state.as_str()
            ),
        );
    }
    if target.recovery_blocked {
        return reject(
            "TargetRecoveryBlocked",
            format!("{} holds divergent transactions", target.name),
        );
    }
    if target.state != SiteState::ReadOnly {
        return reject(
            "TargetNotReady",
            format!(
                "{} is {} (must be reachable and read-only)",
                target.name,
                target.state.as_str()
            ),
        );
    }
    if !target.replicates_from(active) {
        return reject(
            "TargetNotReplicating",
            format!("{} does not replicate from {}", target.name, active.name),
        );
    }
    Admission::Proceed {
        source: active.name.clone(),
        target: target.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::ReplicaView;
    use crate::gtid::{GtidFlavor, GtidSet};
    use crate::lease::LeaseKind;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_unix_seconds(1_796_000_000 + s)
    }

    fn sites() -> Vec<SiteView> {
        let mk = |name: &str, index: usize, state| SiteView {
            name: name.into(),
            role: SiteRole::PrimaryCandidate,
            priority: 0,
            index,
            host: "127.0.0.1".into(),
            port: 3300 + u16::try_from(index).unwrap(),
            state,
            gtid: Some(GtidSet::parse(GtidFlavor::MariaDb, "0-1-5").unwrap()),
            replica: None,
            answered: true,
            writable_now: state == SiteState::Writable,
            recovery_blocked: false,
        };
        let iad = mk("iad", 0, SiteState::Writable);
        let mut pdx = mk("pdx", 1, SiteState::ReadOnly);
        pdx.replica = Some(ReplicaView {
            io_running: true,
            sql_running: true,
            source_host: "127.0.0.1".into(),
            source_port: 3300,
            seconds_behind: Some(0),
        });
        let mut reader = mk("reader", 2, SiteState::ReadOnly);
        reader.role = SiteRole::ReadOnly;
        vec![iad, pdx, reader]
    }

    fn input<'a>(sites: &'a [SiteView], target: &'a str) -> AdmissionInput<'a> {
        AdmissionInput {
            target,
            active_site: "iad",
            sites,
            now: t(100),
            last_failover: None,
            cooldown: Duration::from_secs(300),
            live_hold: None,
        }
    }

    #[test]
    fn a_ready_target_proceeds() {
        let s = sites();
        assert_eq!(
            admit(&input(&s, "pdx")),
            Admission::Proceed {
                source: "iad".into(),
                target: "pdx".into()
            }
        );
    }

    #[test]
    fn a_live_hold_defers_with_its_expiry_and_names_the_holder() {
        let s = sites();
        let hold = LeaseView {
            kind: LeaseKind::FailoverHold,
            operation_id: "a1c3f0e2".into(),
            instance: "counter-app".into(),
            expires_at: t(130),
            topology_generation: 17,
        };
        let mut i = input(&s, "pdx");
        i.live_hold = Some(&hold);
        assert_eq!(
            admit(&i),
            Admission::Defer {
                reason: DeferReason::DeploymentHold,
                retry_time: t(130),
                message: "deferred by failover-hold a1c3f0e2 (instance counter-app)".into()
            }
        );
    }

    #[test]
    fn cooldown_defers_until_it_ends() {
        let s = sites();
        let mut i = input(&s, "pdx");
        i.last_failover = Some(t(0));
        match admit(&i) {
            Admission::Defer {
                reason: DeferReason::Cooldown,
                retry_time,
                ..
            } => assert_eq!(retry_time, t(300)),
            other => panic!("{other:?}"),
        }
        i.now = t(300);
        assert!(matches!(admit(&i), Admission::Proceed { .. }));
    }

    #[test]
    fn invalid_targets_are_rejected_with_a_reason() {
        let mut s = sites();
        let reason = |a: Admission| match a {
            Admission::Reject { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason(admit(&input(&s, "nope"))), "UnknownTarget");
        assert_eq!(reason(admit(&input(&s, "reader"))), "TargetNotCandidate");
        assert_eq!(reason(admit(&input(&s, "iad"))), "AlreadyActive");
        s[1].replica = None;
        assert_eq!(reason(admit(&input(&s, "pdx"))), "TargetNotReplicating");
        s[1].state = SiteState::Unreachable;
        assert_eq!(reason(admit(&input(&s, "pdx"))), "TargetNotReady");
        s[1].recovery_blocked = true;
        assert_eq!(reason(admit(&input(&s, "pdx"))), "TargetRecoveryBlocked");
        s[0].state = SiteState::ReadOnly;
        assert_eq!(reason(admit(&input(&s, "pdx"))), "SourceNotWritable");
    }
}
