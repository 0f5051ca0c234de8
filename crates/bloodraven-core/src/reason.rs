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

/// `Display`, serde as the string and a JSON schema of a plain string, for an enum with
/// `as_str` (the contract string) and `parse` (its inverse).
macro_rules! contract_string {
    ($name:ident) => {
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

/// An enum of contract names, each variant's contract string its own name: `as_str`, `ALL`
/// (the names this version writes), and `contract_string!`'s `Display`, serde and schema.
macro_rules! names {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident, )*
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
                    $( $name::$variant => stringify!($variant), )*
                    $name::Other(s) => s,
                }
            }

            /// The name `s` stands for (`Other` when this version does not know it).
            pub fn parse(s: &str) -> Self {
                match s {
                    $( stringify!($variant) => $name::$variant, )*
                    other => $name::Other(other.to_string()),
                }
            }
        }

        contract_string!($name);
    };
}

names! {
    /// `status.conditions[].type`.
    pub enum ConditionType {
        Ready,
        Degraded,
        RecoveryPending,
        /// Informational: every sidecar runs with the group's `spec.sidecar` timings. Never
        /// makes the group unstable.
        SidecarTimingsInSync,
        /// Informational: the leading operator's configuration file says of the group what the
        /// store says (where the store is the truth: etcd). Never makes the group unstable.
        ConfigInSync,
        /// Informational: every server refuses clear-text logins and replication runs over
        /// TLS as `spec.replication.tls` says. Never makes the group unstable.
        TransportSecure,
        /// Informational: the binlog archive's chain has no gap (`spec.backup` set). Never
        /// makes the group unstable.
        BinlogArchiveContinuous,
    }
}

names! {
    /// `status.conditions[].reason`.
    pub enum ConditionReason {
        AsExpected,
        ActiveSiteWritable,
        SplitBrain,
        NoPrimary,
        ReplicationNotRunning,
        /// Degraded by lag alone: reported, but never makes the group unstable.
        ReplicationLagging,
        SiteUnreachable,
        /// A site holds divergent transactions (`RecoveryPending`).
        RecoveryBlocked,
        SidecarTimingsMismatch,
        /// `spec.replication.mode: semi-sync` and the active site's lossless guarantee does not
        /// hold (not configured yet, a lossy wait point, or fell back to asynchronous).
        SemiSyncFallback,
        /// `semi-sync` and no replica acknowledges: the guarantee holds, writes wait.
        SemiSyncWritesWait,
        /// `fencing: strict`: the new primary is announced and stays read-only until the old
        /// one is proven fenced (docs/failover.md, Fencing modes).
        FenceUnconfirmed,
        /// The leading operator's configuration file differs from the stored group (the store
        /// wins; the message names the fields).
        ConfigDrift,
        /// A replica does not replicate over TLS as `spec.replication.tls` asks, or cannot
        /// verify its source's certificate (`TransportSecure`; the message names it).
        ReplicationInsecure,
        /// A server accepts clear-text logins (`require_secure_transport=OFF`); the operator
        /// reports it and changes nothing (`TransportSecure`).
        InsecureTransport,
        /// The binlog archive misses transactions (`BinlogArchiveContinuous`; the message
        /// names the ranges): no restore point past the first gap is reachable from before it.
        BinlogArchiveGap,
    }
}

names! {
    /// Why admission deferred a planned failover (`admission.deferReason`).
    pub enum DeferReason {
        DeploymentHold,
        Cooldown,
    }
}

names! {
    /// Why a planned failover failed (`status.plannedFailover.reason`).
    pub enum FailureReason {
        // Admission.
        UnknownTarget,
        TargetNotCandidate,
        NoActiveSite,
        AlreadyActive,
        SourceNotWritable,
        TargetRecoveryBlocked,
        TargetNotReady,
        TargetNotReplicating,
        // Execution.
        FenceFailed,
        SourceUnreadable,
        LagTimeout,
        WaitFailed,
        SiteUnknown,
        /// A phase ran past `spec.operationTimeouts.plannedFailover`.
        TimedOut,
    }
}

names! {
    /// Event reasons on the `MysqlFailoverGroup`. docs/operator.md lists them from here.
    pub enum EventReason {
        /// Deploy leases were revoked (`TopologyChanged` or `OperatorRevoked`).
        DeploymentLeaseRevoked,
        /// Kubernetes mode: the group's spec does not validate, so the group does not run.
        SpecInvalid,
        /// The group got its first active site.
        ActiveSiteBootstrapped,
        /// An emergency failover started, succeeded, failed (with the step that failed).
        FailoverStarted,
        FailoverSucceeded,
        FailoverFailed,
        /// A writable site that is not the active one was fenced.
        SiteFenced,
        /// A returning site holds transactions the group never received: it stays fenced.
        DataLossDetected,
        /// A recovery-blocked site no longer diverges.
        RecoveryUnblocked,
        /// Every site was read-only: writability was restored on the last failover target.
        PrimaryReasserted,
        /// `fencing: strict`: an announced emergency promotion waits for proof that the old
        /// primary is fenced; then it takes writes, with the proof (or by hand, `--force`).
        FenceUnconfirmed,
        FenceConfirmed,
        ForcedPromotion,
        /// A replica now follows the active site.
        ReplicaRepointed,
        /// A planned failover entered (or re-entered, after a deferral) admission.
        PlannedFailoverAdmitting,
        PlannedFailoverDeferred,
        /// A planned failover request was dropped: another one is in flight.
        PlannedFailoverRejected,
        PlannedFailoverSucceeded,
        PlannedFailoverFailed,
        /// Draining killed an application session that kept the fence from landing.
        BlockingSessionKilled,
        /// Alerts, raised once when they start.
        SplitBrain,
        NoPrimary,
        AllSitesUnreachable,
        FailoverBlockedByCooldown,
        NoFailoverCandidate,
        AutomaticFailoverHeld,
        SemiSyncFallback,
        /// An emergency failover's candidate first caught up from a more advanced site.
        CaughtUpBeforePromotion,
        /// A reclone (`bloodraven site reclone`) started copying, succeeded, failed; or its
        /// request was refused and changed nothing.
        RecloneStarted,
        RecloneSucceeded,
        RecloneFailed,
        RecloneRefused,
        /// An ordered update began, naming the order.
        OrderedUpdateStarted,
        /// A site of an ordered update is updated and caught up.
        SiteUpdated,
        /// Every other site is updated: the update's switchover begins.
        OrderedUpdateFailingOver,
        OrderedUpdateSucceeded,
        OrderedUpdateFailed,
        /// A request for an ordered update was dropped (another operation runs, nothing to
        /// update).
        OrderedUpdateRejected,
        /// A restore-in-place was accepted (its target and source named).
        RestoreStarted,
        /// The dump is loaded on the target; the target is announced.
        RestoreLoaded,
        RestoreSucceeded,
        RestoreFailed,
        /// A restore request was not run (a stale `confirm`, another operation, a bad target).
        RestoreRefused,
        /// A phase of a day-2 operation ran past its bound (`spec.operationTimeouts`): the
        /// operation ended in its documented state.
        OperationTimedOut,
        /// The leading operator's configuration file differs from the stored group.
        ConfigDrift,
        /// A backup started on its source site (the primary named as a fallback when no
        /// replica is healthy), succeeded, or failed (abandoned, refused, or its tools failed).
        BackupStarted,
        BackupSucceeded,
        BackupFailed,
        /// A backup's verification passed (every file's checksum, the data prepared and
        /// opened, every table checked, the GTID position the manifest's), or failed (why).
        BackupVerified,
        BackupVerifyFailed,
        /// The binlog archive misses transactions (the message names the ranges).
        BinlogArchiveGap,
        /// The new primary holds less than the archive (an emergency failover lost what the
        /// old primary had not shipped): the archive forks there, and the old primary's tail
        /// is kept apart (docs/pitr.md).
        BinlogArchiveForked,
    }
}

names! {
    /// Why an ordered update stopped as `Failed` (`status.updatePhase.reason`).
    pub enum UpdateFailure {
        /// The active site changed while it ran, not by its own switchover.
        EmergencyFailover,
        /// A site was not a caught-up replica before its update, within its timeout.
        SiteNotCaughtUp,
        /// A site's update (its command) failed or ran past its timeout.
        UpdateFailed,
        /// A site did not come back as a caught-up replica within its timeout.
        SiteUnhealthy,
        /// No updated primary candidate was caught up to take the primary.
        NoCandidate,
        /// The update's switchover failed (its reason in the message).
        SwitchoverFailed,
        /// A phase ran past `spec.operationTimeouts.orderedUpdate`.
        TimedOut,
    }
}

names! {
    /// Why a restore-in-place stopped as `Failed` (`status.restoreInPlace.reason`).
    pub enum RestoreFailure {
        /// Writes could not be fenced on the active site.
        FenceFailed,
        /// The dump is not a complete `mariadb-dump` file (header, end marker).
        DumpInvalid,
        /// Loading the dump failed (the message names the line).
        LoadFailed,
        /// The active site changed while it ran (the target died: an emergency failover).
        ActiveSiteChanged,
        /// A reclone of another site from the target failed.
        RecloneFailed,
        /// The group's clone account is missing or unreadable.
        NoCredentials,
        /// A phase ran past `spec.operationTimeouts.restoreInPlace`.
        TimedOut,
    }
}

names! {
    /// Why a reclone stopped as `Failed` (`status.sites[].reclone.reason`).
    pub enum RecloneFailure {
        /// The active site changed while it ran (an emergency or a planned failover): the copy
        /// is of a primary that no longer is one.
        ActiveSiteChanged,
        /// The target became the active site meanwhile; it is not touched.
        TargetPromoted,
        /// Taking or loading the copy failed.
        CopyFailed,
        /// The target's replication from the active site did not start or broke while it
        /// caught up.
        ReplicationFailed,
        /// The group has no site to copy from (the active site does not answer).
        NoDonor,
        /// The group's `spec.clone.credentials` are missing or unreadable.
        NoCredentials,
        /// A phase ran past `spec.operationTimeouts.reclone`.
        TimedOut,
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
    /// Its data no longer matches the primary's (a restore-in-place replaced the primary's,
    /// and this site is not recloned yet): never a promotion candidate until a reclone ends
    /// it.
    AwaitingReclone,
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
            RecoveryState::AwaitingReclone => "AwaitingReclone",
            RecoveryState::Other(s) => s,
        }
    }

    pub fn parse(s: &str) -> Self {
        match s {
            "" => RecoveryState::None,
            "RecoveryBlocked" => RecoveryState::RecoveryBlocked,
            "Recloning" => RecoveryState::Recloning,
            "RecloneFailed" => RecoveryState::RecloneFailed,
            "AwaitingReclone" => RecoveryState::AwaitingReclone,
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

    /// A reclone holds the site (running, or failed after it began replacing the data, or
    /// awaited after a restore replaced the primary's data): the controller never unblocks
    /// it because of its position; only a reclone ends it.
    pub fn is_held_by_reclone(&self) -> bool {
        matches!(
            self,
            RecoveryState::Recloning
                | RecoveryState::RecloneFailed
                | RecoveryState::AwaitingReclone
        )
    }
}

contract_string!(RecoveryState);

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
