//! The persisted shapes of a failover group: `MysqlFailoverGroup.status` (SPEC §2.2), its
//! sites and conditions, and the planned failover's phases and admission block.
//!
//! This module owns what is stored and what the wire shows of it. It decides nothing: the
//! decisions ([`crate::health`], [`crate::planned`], [`crate::controller`]) read and build
//! these values. It depends only on vocabulary modules (config, reason, time).

use serde::{Deserialize, Serialize};

pub use crate::reason::{
    ConditionReason, ConditionType, DeferReason, FailureReason, RecoveryState,
};
use crate::time::Timestamp;

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
    #[serde(default, skip_serializing_if = "RecoveryState::is_none")]
    pub recovery_state: RecoveryState,
    /// The sidecar's last reported fence state, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_self_fenced: Option<bool>,
    /// The timings the sidecar last reported running with, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_timings: Option<SidecarTimings>,
    /// A blocked site's transactions that the group does not hold, as its GTID set renders
    /// them (what a reclone discards; its confirmation names a prefix of it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub divergent_gtid_set: String,
    /// How many transactions `divergentGtidSet` stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergent_transaction_count: Option<u64>,
    /// The site's last (or running) reclone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclone: Option<RecloneStatus>,
}

/// What every operation's phase enum shares: it ends `Succeeded` or `Failed`, and its name
/// on the wire is the variant's.
pub trait OperationPhase: Copy + Eq + 'static {
    const SUCCEEDED: Self;
    const FAILED: Self;
    /// Every phase, in the order an operation goes through them.
    const ALL: &'static [Self];
    /// The phase's name, as `status` holds it.
    fn as_str(self) -> &'static str;
    /// `Succeeded` and `Failed` end an operation; every other phase is in flight.
    fn is_terminal(self) -> bool {
        self == Self::SUCCEEDED || self == Self::FAILED
    }
}

/// What every operation's status shares, read the same way wherever one is shown: its
/// phase, the name of the reason it failed with, and its message.
pub trait OperationStatus {
    type Phase: OperationPhase;
    fn phase(&self) -> Self::Phase;
    /// The failure reason's contract name, when it failed with one.
    fn failure(&self) -> Option<&str>;
    fn message(&self) -> &str;
}

/// [`OperationStatus`] for status types with the fields `phase`, `reason` and `message`.
macro_rules! operation_status {
    ($($status:ty => $phase:ty,)*) => {$(
        impl OperationStatus for $status {
            type Phase = $phase;
            fn phase(&self) -> $phase {
                self.phase
            }
            fn failure(&self) -> Option<&str> {
                self.reason.as_ref().map(|r| r.as_str())
            }
            fn message(&self) -> &str {
                &self.message
            }
        }
    )*};
}

operation_status! {
    RecloneStatus => ReclonePhase,
    UpdateStatus => UpdatePhase,
    RestoreStatus => RestorePhase,
    PlannedFailoverStatus => PlannedFailoverPhase,
}

/// A phase enum of an operation: the given phases, then `Succeeded` and `Failed`; serde and
/// `as_str` use the variants' names; [`OperationPhase`] and inherent `as_str`/`is_terminal`.
macro_rules! phases {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            Succeeded,
            Failed,
        }

        impl OperationPhase for $name {
            const SUCCEEDED: Self = $name::Succeeded;
            const FAILED: Self = $name::Failed;
            const ALL: &'static [Self] = &[$($name::$variant,)* $name::Succeeded, $name::Failed];

            fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => stringify!($variant), )*
                    $name::Succeeded => "Succeeded",
                    $name::Failed => "Failed",
                }
            }
        }

        impl $name {
            /// Every phase, in the order an operation goes through them.
            pub const ALL: &'static [Self] = <Self as OperationPhase>::ALL;

            /// The phase's name, as `status` holds it.
            pub fn as_str(self) -> &'static str {
                OperationPhase::as_str(self)
            }

            /// `Succeeded` and `Failed` end an operation; every other phase is in flight.
            pub fn is_terminal(self) -> bool {
                OperationPhase::is_terminal(self)
            }
        }
    };
}

phases! {
    /// Phases of a reclone: accepted, copying from the donor into the target, the target
    /// catching up from the active site, and the two ends.
    pub enum ReclonePhase {
        Pending,
        Copying,
        CatchingUp,
    }
}

phases! {
    /// Phases of an ordered update (`status.updatePhase.phase`).
    pub enum UpdatePhase {
        Pending,
        /// The update's switchover waits for admission (`admission` says why, until when).
        Deferred,
        /// A site other than the active one is being updated (`site`).
        UpdatingReplicas,
        /// `site` is updated; waiting for it to be a caught-up replica again.
        WaitingForReplica,
        /// The switchover to an updated candidate runs (`switchover`).
        FailingOver,
        /// The old primary, now a replica, is being updated and waited for.
        UpdatingOldPrimary,
    }
}

/// `status.updatePhase`: the ordered update, persisted step by step so a restarted operator
/// resumes where it stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UpdateStatus {
    pub phase: UpdatePhase,
    /// The request's id (the annotation's value): an id runs once.
    pub request_id: String,
    /// The site in progress (the switchover's target while failing over).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
    #[serde(default)]
    pub sites_done: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reason: Option<crate::reason::UpdateFailure>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The switchover's admission while it is deferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// The active site when the update began.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub old_primary: String,
    /// The `topologyGeneration` it expects: set at its start and by its own switchover; any
    /// other change (an emergency failover) ends it.
    #[serde(default)]
    pub topology_generation: u64,
    /// `site`'s update ran; what is left is waiting for it to catch up.
    #[serde(default)]
    pub site_updated: bool,
    /// When the current site's step began (its timeout counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_start: Option<Timestamp>,
    /// The update's own switchover, run by the planned failover's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover: Option<PlannedFailoverStatus>,
    /// When the current phase's bound (`spec.operationTimeouts`) passes: past it the
    /// operation ends (event `OperationTimedOut`). In an admission phase, when it is tried
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
}

impl UpdateStatus {
    /// A new request.
    pub fn requested(id: &str, now: Timestamp) -> Self {
        UpdateStatus {
            phase: UpdatePhase::Pending,
            request_id: id.to_string(),
            site: String::new(),
            sites_done: Vec::new(),
            start_time: Some(now),
            completion_time: None,
            reason: None,
            message: String::new(),
            admission: None,
            old_primary: String::new(),
            topology_generation: 0,
            site_updated: false,
            site_start: None,
            switchover: None,
            deadline: None,
        }
    }

    pub fn in_flight(&self) -> bool {
        !self.phase.is_terminal()
    }
}

phases! {
    /// Phases of a restore-in-place (`status.restoreInPlace.phase`).
    pub enum RestorePhase {
        Pending,
        /// Admission waits (`admission` says why, until when).
        Deferred,
        /// Writes are being fenced on every site.
        Fencing,
        /// The dump streams into the target, binary logging off.
        Loading,
        /// The target is announced (one `topologyGeneration` bump) and its writes lifted.
        Promoting,
        /// Every other site is being recloned from the target.
        Recloning,
    }
}

/// `status.restoreInPlace`: a dump loaded into the live group, persisted step by step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestoreStatus {
    pub phase: RestorePhase,
    /// The site that holds the restored data and becomes (or stays) the primary.
    pub target_site: String,
    /// The request's `confirm` (RFC 3339): a request runs only with a later one.
    pub confirm_token_used: String,
    /// The dump's path, as the request named it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    #[serde(default)]
    pub bytes_loaded: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reason: Option<crate::reason::RestoreFailure>,
    /// Admission's block while deferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    /// The active site when it began.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub old_active_site: String,
    /// The `topologyGeneration` it expects (its start's, then its own announcement's).
    #[serde(default)]
    pub topology_generation: u64,
    /// The target was announced (the one generation bump is done).
    #[serde(default)]
    pub announced: bool,
    /// The load began: a failed restore leaves the target fenced (its data is half-loaded).
    #[serde(default)]
    pub target_fenced: bool,
    /// The other sites recloned from the target so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recloned: Vec<String>,
    /// The site a human forced to take writes after this restore failed fail-closed
    /// (`bloodraven failover --force --to SITE`): the failure no longer holds any write.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub forced_to: String,
    /// When the current phase's bound (`spec.operationTimeouts`) passes: past it the
    /// operation ends (event `OperationTimedOut`). In an admission phase, when it is tried
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
}

impl RestoreStatus {
    /// A restore just accepted: `Pending`, into `target` from `source` under `confirm`, with
    /// the active site and generation the group had then.
    pub fn accepted(
        target: String,
        confirm: String,
        source: String,
        now: Timestamp,
        old_active_site: String,
        topology_generation: u64,
    ) -> Self {
        RestoreStatus {
            phase: RestorePhase::Pending,
            target_site: target,
            confirm_token_used: confirm,
            source,
            start_time: Some(now),
            completion_time: None,
            bytes_loaded: 0,
            message: "accepted".into(),
            reason: None,
            admission: None,
            old_active_site,
            topology_generation,
            announced: false,
            target_fenced: false,
            recloned: Vec::new(),
            forced_to: String::new(),
            deadline: None,
        }
    }

    pub fn in_flight(&self) -> bool {
        !self.phase.is_terminal()
    }

    /// Writes stay fenced by it: while it runs up to the target's promotion, and after a
    /// failure that left the target half-loaded.
    pub fn holds_writes(&self) -> bool {
        match self.phase {
            RestorePhase::Failed => {
                self.target_fenced && !self.announced && self.forced_to.is_empty()
            }
            RestorePhase::Fencing | RestorePhase::Loading => true,
            RestorePhase::Promoting => !self.announced,
            _ => false,
        }
    }
}

/// `status.sites[].reclone`: rebuilding a site from the group (`bloodraven site reclone`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecloneStatus {
    pub phase: ReclonePhase,
    /// The site the copy is taken from (empty until it is chosen).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub donor: String,
    #[serde(default)]
    pub bytes_copied: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reason: Option<crate::reason::RecloneFailure>,
    /// The `topologyGeneration` it was accepted under: a change of active site stops it.
    #[serde(default)]
    pub topology_generation: u64,
    /// What the request confirmed: the divergent set's prefix, or the site's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub confirmed: String,
    /// How many times the copy was started (an operator that restarts mid-copy starts it
    /// again from the beginning).
    #[serde(default)]
    pub attempts: u32,
    /// `CatchingUp`: the active site's GTID set when the copy was loaded; the target has
    /// caught up once it holds it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub catch_up_to: String,
    /// The copy comes from the active site, never from a replica (a restore-in-place's
    /// reclones: the replicas hold the data from before the restore).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_primary: bool,
    /// When the current phase's bound (`spec.operationTimeouts`) passes: past it the
    /// operation ends (event `OperationTimedOut`). In an admission phase, when it is tried
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// `True` or `False`.
    pub status: String,
    #[serde(default = "no_reason")]
    pub reason: ConditionReason,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Timestamp>,
}

/// A condition read without a reason (written so by another writer) keeps the empty one.
fn no_reason() -> ConditionReason {
    ConditionReason::Other(String::new())
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// `status.awaitingFence`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AwaitingFence {
    /// The old primary, whose fence is unconfirmed.
    pub site: String,
    /// The announced new primary.
    pub target: String,
    /// The announced `topologyGeneration`.
    pub topology_generation: u64,
    /// When the promotion was announced.
    pub since: Timestamp,
}

/// Where a backup is (`status.backups.*.phase`, a sidecar's report).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum BackupPhase {
    Running,
    Succeeded,
    Failed,
}

impl BackupPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            BackupPhase::Running => "Running",
            BackupPhase::Succeeded => "Succeeded",
            BackupPhase::Failed => "Failed",
        }
    }
}

/// One backup as the status shows it (`status.backups.last`, `…lastSucceeded`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackupRecord {
    pub id: String,
    pub phase: BackupPhase,
    /// The source site.
    pub site: String,
    /// The GTID set the backup holds (once it succeeded).
    #[serde(default)]
    pub gtid_position: String,
    pub topology_generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    /// Stored bytes (so far, while it runs).
    #[serde(default)]
    pub bytes: u64,
    /// Why it failed, or what it waits for.
    #[serde(default)]
    pub message: String,
    /// It was taken on the primary (`source: primary`, or no replica was healthy): it is
    /// abandoned if the active site moves away from its source mid-way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_primary: bool,
}

/// `status.backups`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackupsStatus {
    /// The last backup, running or ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<BackupRecord>,
    /// The last backup that succeeded (what `BloodravenBackupTooOld` watches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_succeeded: Option<BackupRecord>,
    /// The last verified backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verified: Option<BackupRecord>,
}

impl BackupsStatus {
    /// The backup running, if any.
    pub fn running(&self) -> Option<&BackupRecord> {
        self.last
            .as_ref()
            .filter(|b| b.phase == BackupPhase::Running)
    }
}

/// `status.binlogArchive`: the binlog archive of point-in-time recovery (docs/pitr.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BinlogArchiveStatus {
    /// The GTID of the last transaction in the archive (`domain-server-seq`; empty: none).
    #[serde(default)]
    pub last_gtid: String,
    /// How long the archive has been behind the primary (0: it holds the primary's last
    /// transaction): the recovery point objective at this moment.
    #[serde(default)]
    pub lag_seconds: u64,
    /// Segments in the archive.
    #[serde(default)]
    pub segments: u64,
    /// Runs of missing transactions in the archive's chain (0: continuous).
    #[serde(default)]
    pub gaps: u64,
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
    /// `fencing: strict`: an emergency promotion announced its new primary, which stays
    /// read-only until the old one is proven fenced (or a human forces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_fence: Option<AwaitingFence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_failover: Option<PlannedFailoverStatus>,
    /// The ordered update (`bloodraven update`), in flight or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_phase: Option<UpdateStatus>,
    /// The restore-in-place (`spec.restoreInPlace`), in flight or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_in_place: Option<RestoreStatus>,
    /// Backups (`spec.backup`): the last one, running or ended, and the last good one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups: Option<BackupsStatus>,
    /// The binlog archive (`spec.backup` set): how far it reaches and whether it is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binlog_archive: Option<BinlogArchiveStatus>,
    #[serde(default)]
    pub observed_generation: i64,
    /// When the operator last confirmed this status (its clock); `None` before the first poll.
    /// Persisted when the status changes (and at least every few tens of seconds); the
    /// operator serves the last poll's time (see [`GroupStatus::observed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Timestamp>,
}

impl GroupStatus {
    pub fn condition(&self, type_: &ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| &c.type_ == type_)
    }

    /// Whether condition `type_` is `True` with `reason`.
    pub fn condition_true_with(&self, type_: &ConditionType, reason: &ConditionReason) -> bool {
        self.condition(type_)
            .is_some_and(|c| c.is_true() && &c.reason == reason)
    }

    /// The ordered update's switchover phase, while the update and its switchover run.
    pub fn update_switchover(&self) -> Option<PlannedFailoverPhase> {
        self.update_phase
            .as_ref()
            .filter(|u| u.in_flight())
            .and_then(|u| u.switchover.as_ref())
            .map(|sw| sw.phase)
            .filter(|p| !p.is_terminal())
    }

    /// A planned failover executes (its own, or an ordered update's switchover): the topology
    /// is reserved.
    pub fn switchover_executing(&self) -> bool {
        self.planned_failover
            .as_ref()
            .is_some_and(|p| p.phase.is_executing())
            || self
                .update_switchover()
                .is_some_and(PlannedFailoverPhase::is_executing)
    }

    pub fn site(&self, name: &str) -> Option<&SiteStatus> {
        self.sites.iter().find(|s| s.name == name)
    }

    /// `name`'s entry, added empty when the status has none yet (a site no poll has reported).
    pub fn site_mut(&mut self, name: &str) -> &mut SiteStatus {
        let i = self.sites.iter().position(|s| s.name == name);
        let i = i.unwrap_or_else(|| {
            self.sites.push(SiteStatus {
                name: name.to_string(),
                ..SiteStatus::default()
            });
            self.sites.len() - 1
        });
        &mut self.sites[i]
    }

    /// The status without the fields that move on every poll of a healthy group — `observedAt`
    /// and each site's `lastSeen`, `gtidExecuted` and `secondsBehindSource`. Two statuses
    /// whose lasting parts are equal say the same thing about the group; the operator
    /// persists a change of these fields only now and then (the served status carries them
    /// fresh, see [`GroupStatus::observed`]).
    #[must_use]
    pub fn lasting(&self) -> GroupStatus {
        let mut s = self.clone();
        s.observed_at = None;
        for site in &mut s.sites {
            site.last_seen = None;
            site.gtid_executed.clear();
            site.seconds_behind_source = None;
        }
        s
    }

    /// This (persisted) status with the moving fields of `live`, the last poll's: the newer
    /// `observedAt` of the two, and each site's `lastSeen`, `gtidExecuted` and
    /// `secondsBehindSource`. Everything else — the active site, states, conditions — stays
    /// as persisted, so a served status never says more than the store does.
    #[must_use]
    pub fn observed(&self, live: &GroupStatus) -> GroupStatus {
        let mut s = self.clone();
        s.observed_at = match (s.observed_at, live.observed_at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        for site in &mut s.sites {
            if let Some(l) = live.site(&site.name) {
                site.last_seen = l.last_seen;
                site.gtid_executed.clone_from(&l.gtid_executed);
                site.seconds_behind_source = l.seconds_behind_source;
            }
        }
        s
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
        type_: ConditionType,
        status: bool,
        reason: ConditionReason,
        message: &str,
        now: Timestamp,
    ) {
        let status_s = if status { "True" } else { "False" };
        if let Some(c) = self.conditions.iter_mut().find(|c| c.type_ == type_) {
            if c.status != status_s {
                c.last_transition_time = Some(now);
            }
            c.status = status_s.to_string();
            c.reason = reason;
            c.message = message.to_string();
        } else {
            self.conditions.push(Condition {
                type_,
                status: status_s.to_string(),
                reason,
                message: message.to_string(),
                last_transition_time: Some(now),
            });
        }
    }
}

phases! {
    /// Phases of a planned failover (SPEC §2.6).
    pub enum PlannedFailoverPhase {
        Pending,
        Admitting,
        Deferred,
        Draining,
        WaitingForLag,
        Promoting,
        Resuming,
    }
}

impl PlannedFailoverPhase {
    /// Phases past admission, in which the operation is moving the primary. The group's
    /// topology is reserved: automatic failover is held and lease renewals answer `423`.
    pub fn is_executing(self) -> bool {
        matches!(
            self,
            Self::Draining | Self::WaitingForLag | Self::Promoting | Self::Resuming
        )
    }

    /// Phases decided by admission: the lease lock is held while one of them is decided and
    /// persisted, so a failover-hold is either seen or refused.
    pub fn admits(self) -> bool {
        matches!(self, Self::Admitting | Self::Deferred)
    }
}

/// `status.plannedFailover.admission`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Admission {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub defer_reason: Option<DeferReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `status.plannedFailover`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::planned_failover_status)
)]
pub struct PlannedFailoverStatus {
    pub phase: PlannedFailoverPhase,
    pub target: String,
    #[serde(default)]
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transactions_lost: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reason: Option<FailureReason>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub admission: Admission,
    /// The fenced source's GTID set, recorded while draining (what the target must contain).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_gtid_executed: String,
    /// When the current phase's bound (`spec.operationTimeouts`) passes: past it the
    /// operation ends (event `OperationTimedOut`). In an admission phase, when it is tried
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
}

impl PlannedFailoverStatus {
    /// A new request for `target`, while `source` is the active site.
    pub fn requested(target: &str, source: &str, now: Timestamp) -> Self {
        PlannedFailoverStatus {
            phase: PlannedFailoverPhase::Pending,
            target: target.to_string(),
            source: source.to_string(),
            start_time: Some(now),
            completion_time: None,
            duration_seconds: None,
            transactions_lost: None,
            reason: None,
            message: String::new(),
            admission: Admission::default(),
            source_gtid_executed: String::new(),
            deadline: None,
        }
    }

    #[must_use]
    pub fn in_phase(&self, phase: PlannedFailoverPhase) -> Self {
        PlannedFailoverStatus {
            phase,
            ..self.clone()
        }
    }

    #[must_use]
    pub fn ended(&self, phase: PlannedFailoverPhase, now: Timestamp) -> Self {
        let start = self.start_time.unwrap_or(now);
        PlannedFailoverStatus {
            phase,
            completion_time: Some(now),
            duration_seconds: Some(now.since(start).as_secs_f64()),
            // An ended failover has nothing left to bound.
            deadline: None,
            ..self.clone()
        }
    }

    #[must_use]
    pub fn failed(&self, reason: FailureReason, message: String, now: Timestamp) -> Self {
        PlannedFailoverStatus {
            reason: Some(reason),
            message,
            ..self.ended(PlannedFailoverPhase::Failed, now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, seen: i64, gtid: &str, lag: Option<u64>) -> SiteStatus {
        SiteStatus {
            name: name.into(),
            state: SiteState::ReadOnly,
            last_seen: Some(Timestamp::from_unix_seconds(seen)),
            gtid_executed: gtid.into(),
            replicating: true,
            seconds_behind_source: lag,
            ..SiteStatus::default()
        }
    }

    fn status(at: i64, sites: Vec<SiteStatus>) -> GroupStatus {
        GroupStatus {
            active_site: "iad".into(),
            topology_generation: 3,
            sites,
            observed_at: Some(Timestamp::from_unix_seconds(at)),
            ..GroupStatus::default()
        }
    }

    #[test]
    fn site_mut_finds_a_site_or_adds_it_once() {
        let mut g = status(0, vec![site("iad", 0, "0-1-1", None)]);
        g.site_mut("iad").gtid_executed = "0-1-2".into();
        assert_eq!(g.sites.len(), 1);
        assert_eq!(g.site("iad").unwrap().gtid_executed, "0-1-2");
        g.site_mut("pdx").replicating = true;
        g.site_mut("pdx").seconds_behind_source = Some(1);
        assert_eq!(g.sites.len(), 2, "pdx added once");
        let pdx = g.site("pdx").unwrap();
        assert!(pdx.replicating && pdx.seconds_behind_source == Some(1));
        assert_eq!(pdx.state, SiteStatus::default().state, "the rest empty");
    }

    #[test]
    fn only_the_moving_fields_differ_between_two_polls_of_a_quiet_group() {
        let a = status(10, vec![site("pdx", 10, "0-1-5", Some(0))]);
        let b = status(12, vec![site("pdx", 12, "0-1-9", Some(1))]);
        assert_ne!(a, b);
        assert_eq!(a.lasting(), b.lasting());
        let mut c = b.clone();
        c.sites[0].replicating = false;
        assert_ne!(
            a.lasting(),
            c.lasting(),
            "a replica that stopped is a change"
        );
        let mut d = b.clone();
        d.sites[0].state = SiteState::Unreachable;
        assert_ne!(a.lasting(), d.lasting());
    }

    #[test]
    fn the_served_status_is_the_stored_one_with_the_last_polls_observation() {
        let stored = status(10, vec![site("pdx", 10, "0-1-5", Some(0))]);
        let mut live = status(14, vec![site("pdx", 14, "0-1-9", Some(2))]);
        // What the live copy says beyond the moving fields is not served: the store is the
        // authority for the active site and the states.
        live.active_site = "pdx".into();
        live.sites[0].replicating = false;
        let served = stored.observed(&live);
        assert_eq!(served.observed_at, Some(Timestamp::from_unix_seconds(14)));
        assert_eq!(served.active_site, "iad");
        assert!(served.sites[0].replicating);
        assert_eq!(served.sites[0].gtid_executed, "0-1-9");
        assert_eq!(served.sites[0].seconds_behind_source, Some(2));
        assert_eq!(
            served.sites[0].last_seen,
            Some(Timestamp::from_unix_seconds(14))
        );
        // A newer persisted observedAt (an announcement) is never served older.
        let announced = status(20, stored.sites.clone());
        assert_eq!(
            announced.observed(&live).observed_at,
            Some(Timestamp::from_unix_seconds(20))
        );
        assert_eq!(stored.observed(&GroupStatus::default()), stored);
    }

    #[test]
    fn every_operation_status_reads_its_phase_failure_and_message() {
        fn read<S: OperationStatus + serde::de::DeserializeOwned>(
            wire: &str,
        ) -> (&'static str, Option<String>, String) {
            let s: S = serde_json::from_str(wire).unwrap();
            (
                s.phase().as_str(),
                s.failure().map(str::to_string),
                s.message().to_string(),
            )
        }
        let failed =
            |reason: &str, message: &str| ("Failed", Some(reason.to_string()), message.to_string());
        assert_eq!(
            read::<RecloneStatus>(
                r#"{"phase":"Failed","reason":"CopyFailed","message":"the copy stopped"}"#
            ),
            failed("CopyFailed", "the copy stopped")
        );
        assert_eq!(
            read::<UpdateStatus>(
                r#"{"phase":"Failed","requestId":"u1","reason":"EmergencyFailover","message":"moved"}"#
            ),
            failed("EmergencyFailover", "moved")
        );
        assert_eq!(
            read::<RestoreStatus>(
                r#"{"phase":"Succeeded","targetSite":"iad","confirmTokenUsed":"c","message":"restored"}"#
            ),
            ("Succeeded", None, "restored".to_string())
        );
        // A reason this version does not know still reads as its name.
        assert_eq!(
            read::<PlannedFailoverStatus>(
                r#"{"phase":"Failed","target":"pdx","reason":"SomethingNewer"}"#
            ),
            failed("SomethingNewer", "")
        );
    }
}
