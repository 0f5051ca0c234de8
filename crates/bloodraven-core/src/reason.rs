//! Every reason, condition type and recovery state the product writes, as enums that
//! serialize to their exact contract strings.
//!
//! This module owns the *names*: condition types and reasons of `status.conditions`, the
//! reasons a planned failover defers or fails with, event reasons, and a site's
//! `recoveryState`. A misspelled reason no longer compiles; the wire and the docs do not change
//! (each enum serializes to the same string the constants were, and its JSON schema is a plain
//! string, so the CRDs are unchanged).
//!
//! Each enum also reads back a string it does not know (written by another version of the
//! operator) as `Other`, which this version never writes itself.
//!
//! It depends on nothing but serde: every other module may use it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An enum of contract names: `as_str`, `ALL` (the names this version writes), `Display`,
/// serde as the string, and a JSON schema of a plain string.
macro_rules! names {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A name this version does not know, read from a status or event written by
            /// another version. Never written by this one.
            Other(String),
        }

        impl $name {
            /// Every name this version writes, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The contract string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )*
                    $name::Other(s) => s,
                }
            }

            /// The name `s` stands for (`Other` when this version does not know it).
            pub fn parse(s: &str) -> Self {
                match s {
                    $( $text => $name::$variant, )*
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Ok($name::parse(&s))
            }
        }

        #[cfg(feature = "schema")]
        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                "String".into()
            }

            fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
                <String as schemars::JsonSchema>::json_schema(g)
            }

            fn inline_schema() -> bool {
                true
            }
        }
    };
}

names! {
    /// `status.conditions[].type`.
    pub enum ConditionType {
        Ready = "Ready",
        Degraded = "Degraded",
        RecoveryPending = "RecoveryPending",
        /// Informational: every sidecar runs with the group's `spec.sidecar` timings. Never
        /// makes the group unstable.
        SidecarTimingsInSync = "SidecarTimingsInSync",
    }
}

names! {
    /// `status.conditions[].reason`.
    pub enum ConditionReason {
        AsExpected = "AsExpected",
        ActiveSiteWritable = "ActiveSiteWritable",
        SplitBrain = "SplitBrain",
        NoPrimary = "NoPrimary",
        ReplicationNotRunning = "ReplicationNotRunning",
        /// Degraded by lag alone: reported, but never makes the group unstable.
        ReplicationLagging = "ReplicationLagging",
        SiteUnreachable = "SiteUnreachable",
        /// A site holds divergent transactions (`RecoveryPending`).
        RecoveryBlocked = "RecoveryBlocked",
        SidecarTimingsMismatch = "SidecarTimingsMismatch",
        /// `spec.replication.mode: semi-sync` and the active site's lossless guarantee does not
        /// hold (not configured yet, a lossy wait point, or fell back to asynchronous).
        SemiSyncFallback = "SemiSyncFallback",
        /// `semi-sync` and no replica acknowledges: the guarantee holds, writes wait.
        SemiSyncWritesWait = "SemiSyncWritesWait",
        /// `fencing: strict`: the new primary is announced and stays read-only until the old
        /// one is proven fenced (docs/failover.md, Fencing modes).
        FenceUnconfirmed = "FenceUnconfirmed",
    }
}

names! {
    /// Why admission deferred a planned failover (`admission.deferReason`).
    pub enum DeferReason {
        DeploymentHold = "DeploymentHold",
        Cooldown = "Cooldown",
    }
}

names! {
    /// Why a planned failover failed (`status.plannedFailover.reason`).
    pub enum FailureReason {
        // Admission.
        UnknownTarget = "UnknownTarget",
        TargetNotCandidate = "TargetNotCandidate",
        NoActiveSite = "NoActiveSite",
        AlreadyActive = "AlreadyActive",
        SourceNotWritable = "SourceNotWritable",
        TargetRecoveryBlocked = "TargetRecoveryBlocked",
        TargetNotReady = "TargetNotReady",
        TargetNotReplicating = "TargetNotReplicating",
        // Execution.
        FenceFailed = "FenceFailed",
        SourceUnreadable = "SourceUnreadable",
        LagTimeout = "LagTimeout",
        WaitFailed = "WaitFailed",
        SiteUnknown = "SiteUnknown",
    }
}

names! {
    /// Event reasons on the `MysqlFailoverGroup`. docs/operator.md lists them from here.
    pub enum EventReason {
        /// Deploy leases were revoked (`TopologyChanged` or `OperatorRevoked`).
        DeploymentLeaseRevoked = "DeploymentLeaseRevoked",
        /// Kubernetes mode: the group's spec does not validate, so the group does not run.
        SpecInvalid = "SpecInvalid",
        /// The group got its first active site.
        ActiveSiteBootstrapped = "ActiveSiteBootstrapped",
        /// An emergency failover started, succeeded, failed (with the step that failed).
        FailoverStarted = "FailoverStarted",
        FailoverSucceeded = "FailoverSucceeded",
        FailoverFailed = "FailoverFailed",
        /// A writable site that is not the active one was fenced.
        SiteFenced = "SiteFenced",
        /// A returning site holds transactions the group never received: it stays fenced.
        DataLossDetected = "DataLossDetected",
        /// A recovery-blocked site no longer diverges.
        RecoveryUnblocked = "RecoveryUnblocked",
        /// Every site was read-only: writability was restored on the last failover target.
        PrimaryReasserted = "PrimaryReasserted",
        /// `fencing: strict`: an announced emergency promotion waits for proof that the old
        /// primary is fenced; then it takes writes, with the proof (or by hand, `--force`).
        FenceUnconfirmed = "FenceUnconfirmed",
        FenceConfirmed = "FenceConfirmed",
        ForcedPromotion = "ForcedPromotion",
        /// A replica now follows the active site.
        ReplicaRepointed = "ReplicaRepointed",
        /// A planned failover entered (or re-entered, after a deferral) admission.
        PlannedFailoverAdmitting = "PlannedFailoverAdmitting",
        PlannedFailoverDeferred = "PlannedFailoverDeferred",
        /// A planned failover request was dropped: another one is in flight.
        PlannedFailoverRejected = "PlannedFailoverRejected",
        PlannedFailoverSucceeded = "PlannedFailoverSucceeded",
        PlannedFailoverFailed = "PlannedFailoverFailed",
        /// Draining killed an application session that kept the fence from landing.
        BlockingSessionKilled = "BlockingSessionKilled",
        /// Alerts, raised once when they start.
        SplitBrain = "SplitBrain",
        NoPrimary = "NoPrimary",
        AllSitesUnreachable = "AllSitesUnreachable",
        FailoverBlockedByCooldown = "FailoverBlockedByCooldown",
        NoFailoverCandidate = "NoFailoverCandidate",
        AutomaticFailoverHeld = "AutomaticFailoverHeld",
        SemiSyncFallback = "SemiSyncFallback",
        /// An emergency failover's candidate first caught up from a more advanced site.
        CaughtUpBeforePromotion = "CaughtUpBeforePromotion",
        /// A reclone (`bloodraven site reclone`) started copying, succeeded, failed; or its
        /// request was refused and changed nothing.
        RecloneStarted = "RecloneStarted",
        RecloneSucceeded = "RecloneSucceeded",
        RecloneFailed = "RecloneFailed",
        RecloneRefused = "RecloneRefused",
        /// An ordered update began, naming the order.
        OrderedUpdateStarted = "OrderedUpdateStarted",
        /// A site of an ordered update is updated and caught up.
        SiteUpdated = "SiteUpdated",
        /// Every other site is updated: the update's switchover begins.
        OrderedUpdateFailingOver = "OrderedUpdateFailingOver",
        OrderedUpdateSucceeded = "OrderedUpdateSucceeded",
        OrderedUpdateFailed = "OrderedUpdateFailed",
        /// A request for an ordered update was dropped (another operation runs, nothing to
        /// update).
        OrderedUpdateRejected = "OrderedUpdateRejected",
        /// A restore-in-place was accepted (its target and source named).
        RestoreStarted = "RestoreStarted",
        /// The dump is loaded on the target; the target is announced.
        RestoreLoaded = "RestoreLoaded",
        RestoreSucceeded = "RestoreSucceeded",
        RestoreFailed = "RestoreFailed",
        /// A restore request was not run (a stale `confirm`, another operation, a bad target).
        RestoreRefused = "RestoreRefused",
    }
}

names! {
    /// Why an ordered update stopped as `Failed` (`status.updatePhase.reason`).
    pub enum UpdateFailure {
        /// The active site changed while it ran, not by its own switchover.
        EmergencyFailover = "EmergencyFailover",
        /// A site was not a caught-up replica before its update, within its timeout.
        SiteNotCaughtUp = "SiteNotCaughtUp",
        /// A site's update (its command) failed or ran past its timeout.
        UpdateFailed = "UpdateFailed",
        /// A site did not come back as a caught-up replica within its timeout.
        SiteUnhealthy = "SiteUnhealthy",
        /// No updated primary candidate was caught up to take the primary.
        NoCandidate = "NoCandidate",
        /// The update's switchover failed (its reason in the message).
        SwitchoverFailed = "SwitchoverFailed",
    }
}

names! {
    /// Why a restore-in-place stopped as `Failed` (`status.restoreInPlace.reason`).
    pub enum RestoreFailure {
        /// Writes could not be fenced on the active site.
        FenceFailed = "FenceFailed",
        /// The dump is not a complete `mariadb-dump` file (header, end marker).
        DumpInvalid = "DumpInvalid",
        /// Loading the dump failed (the message names the line).
        LoadFailed = "LoadFailed",
        /// The active site changed while it ran (the target died: an emergency failover).
        ActiveSiteChanged = "ActiveSiteChanged",
        /// A reclone of another site from the target failed.
        RecloneFailed = "RecloneFailed",
        /// The group's clone account is missing or unreadable.
        NoCredentials = "NoCredentials",
    }
}

names! {
    /// Why a reclone stopped as `Failed` (`status.sites[].reclone.reason`).
    pub enum RecloneFailure {
        /// The active site changed while it ran (an emergency or a planned failover): the copy
        /// is of a primary that no longer is one.
        ActiveSiteChanged = "ActiveSiteChanged",
        /// The target became the active site meanwhile; it is not touched.
        TargetPromoted = "TargetPromoted",
        /// Taking or loading the copy failed.
        CopyFailed = "CopyFailed",
        /// The target's replication from the active site did not start or broke while it
        /// caught up.
        ReplicationFailed = "ReplicationFailed",
        /// The group has no site to copy from (the active site does not answer).
        NoDonor = "NoDonor",
        /// The group's `spec.clone.credentials` are missing or unreadable.
        NoCredentials = "NoCredentials",
    }
}

/// A site's `recoveryState`: nothing to recover, blocked (it holds transactions the active
/// site never received; `DataLossDetected`), or being rebuilt from the group (a reclone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum RecoveryState {
    /// Written as the empty string (and left out of the status).
    #[default]
    None,
    RecoveryBlocked,
    /// A reclone is replacing its data: the controller leaves it alone (no re-point, no
    /// promotion, no unblocking) until the reclone ends.
    Recloning,
    /// A reclone failed after it had begun replacing the data: what the site holds is not
    /// to be trusted, whatever its position says. Only another reclone ends it.
    RecloneFailed,
    /// A state this version does not know (written by another version).
    Other(String),
}

impl RecoveryState {
    pub fn as_str(&self) -> &str {
        match self {
            RecoveryState::None => "",
            RecoveryState::RecoveryBlocked => "RecoveryBlocked",
            RecoveryState::Recloning => "Recloning",
            RecoveryState::RecloneFailed => "RecloneFailed",
            RecoveryState::Other(s) => s,
        }
    }

    pub fn parse(s: &str) -> Self {
        match s {
            "" => RecoveryState::None,
            "RecoveryBlocked" => RecoveryState::RecoveryBlocked,
            "Recloning" => RecoveryState::Recloning,
            "RecloneFailed" => RecoveryState::RecloneFailed,
            other => RecoveryState::Other(other.to_string()),
        }
    }

    /// Nothing to recover (serialized as nothing).
    pub fn is_none(&self) -> bool {
        *self == RecoveryState::None
    }

    /// The site needs a human (or a reclone) before it rejoins.
    pub fn is_blocked(&self) -> bool {
        !self.is_none()
    }

    /// A reclone holds the site (running, or failed after it began replacing the data): the
    /// controller never unblocks it because of its position.
    pub fn is_held_by_reclone(&self) -> bool {
        matches!(
            self,
            RecoveryState::Recloning | RecoveryState::RecloneFailed
        )
    }
}

impl fmt::Display for RecoveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RecoveryState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RecoveryState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(RecoveryState::parse(&s))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for RecoveryState {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "String".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <String as schemars::JsonSchema>::json_schema(g)
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_as_their_contract_strings() {
        for r in EventReason::ALL {
            let json = serde_json::to_string(r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(&serde_json::from_str::<EventReason>(&json).unwrap(), r);
            assert_eq!(&EventReason::parse(r.as_str()), r);
        }
        for r in ConditionReason::ALL {
            assert_eq!(&ConditionReason::parse(r.as_str()), r);
        }
        assert_eq!(
            serde_json::from_str::<ConditionReason>("\"FromTheFuture\"").unwrap(),
            ConditionReason::Other("FromTheFuture".into())
        );
        assert_eq!(
            serde_json::to_string(&RecoveryState::RecoveryBlocked).unwrap(),
            "\"RecoveryBlocked\""
        );
        assert_eq!(
            serde_json::from_str::<RecoveryState>("\"\"").unwrap(),
            RecoveryState::None
        );
        assert!(RecoveryState::parse("Recloning").is_blocked());
        assert_eq!(RecoveryState::parse("Recloning"), RecoveryState::Recloning);
        assert!(RecoveryState::parse("FromTheFuture").is_blocked());
    }

    #[test]
    fn the_names_are_unique_within_each_enum() {
        fn unique<T: Ord + Clone>(all: &[T]) -> bool {
            let mut v = all.to_vec();
            v.sort();
            v.dedup();
            v.len() == all.len()
        }
        assert!(unique(EventReason::ALL));
        assert!(unique(ConditionReason::ALL));
        assert!(unique(ConditionType::ALL));
        assert!(unique(FailureReason::ALL));
        assert!(unique(DeferReason::ALL));
        assert!(unique(RecloneFailure::ALL));
        assert!(unique(UpdateFailure::ALL));
        assert!(unique(RestoreFailure::ALL));
    }
}
