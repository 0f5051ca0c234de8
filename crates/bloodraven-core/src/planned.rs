//! The planned failover (SPEC §2.6), in one place: its phases, its status, admission, and the
//! state machine that says what to do next.
//!
//! The operator gathers facts, asks [`step`] what to do, executes that through the MySQL
//! adapter, and feeds what happened to [`finish`], which says which status to persist and what
//! to undo. Nothing else decides: no IO here, no clock read (time is passed in).
//!
//! ```text
//! annotation ─► Pending ─► Admitting ─┬─► Draining ─► WaitingForLag ─► Promoting ─► Resuming ─► Succeeded
//!                              ▲      ├─► Deferred ──┐ (hold or cooldown gone)
//!                              └──────┼──────────────┘
//!                                     └─► Failed (rejected)      any execution failure ─► Failed
//! ```
//!
//! Undo rules on failure ([`Undo`]): a fence that did not take effect changed nothing; a fence
//! whose outcome is unknown is re-read before deciding; a fence that took effect is lifted.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::SiteRole;
use crate::contract::events as E;
use crate::contract::reasons as R;
use crate::controller::SiteView;
use crate::lease::LeaseView;
use crate::status::SiteState;
use crate::time::Timestamp;

/// Phases of a planned failover (SPEC §2.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum PlannedFailoverPhase {
    Pending,
    Admitting,
    Deferred,
    Draining,
    WaitingForLag,
    Promoting,
    Resuming,
    Succeeded,
    Failed,
}

impl PlannedFailoverPhase {
    /// `Succeeded` and `Failed` end an operation; every other phase is in flight.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

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

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Admitting => "Admitting",
            Self::Deferred => "Deferred",
            Self::Draining => "Draining",
            Self::WaitingForLag => "WaitingForLag",
            Self::Promoting => "Promoting",
            Self::Resuming => "Resuming",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

/// `status.plannedFailover.admission`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Admission {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub defer_reason: String,
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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub admission: Admission,
    /// The fenced source's GTID set, recorded while draining (what the target must contain).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_gtid_executed: String,
}

/// Why admission deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    DeploymentHold,
    Cooldown,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::DeploymentHold => R::DEPLOYMENT_HOLD,
            DeferReason::Cooldown => R::COOLDOWN,
        }
    }
}

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
        reason: &'static str,
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

fn reject(reason: &'static str, message: String) -> Verdict {
    Verdict::Reject { reason, message }
}

/// Whether admission should wait: the active site or the target has no settled state yet
/// (an operator that just started needs `recoveryThreshold` polls to settle a site), and the
/// failover is younger than `maxLagWait`. Admitting on an unsettled state would fail a valid
/// request; waiting longer than `maxLagWait` would hide a site that never settles, which
/// admission then reports.
fn settling(pf: &PlannedFailoverStatus, f: &Facts<'_>, now: Timestamp) -> bool {
    let unsettled = |name: &str| {
        f.sites
            .iter()
            .any(|v| v.name == name && v.state == SiteState::Unknown)
    };
    let young = pf.start_time.is_none_or(|t| now.since(t) < f.max_lag_wait);
    young && (unsettled(f.active_site) || unsettled(&pf.target))
}

/// Decides admission.
pub fn admit(i: &AdmissionInput<'_>) -> Verdict {
    let Some(target) = i.sites.iter().find(|s| s.name == i.target) else {
        return reject(
            R::UNKNOWN_TARGET,
            format!("{:?} is not a site of this group", i.target),
        );
    };
    if target.role != SiteRole::PrimaryCandidate {
        return reject(
            R::TARGET_NOT_CANDIDATE,
            format!(
                "{} has role {} (only primary-candidate sites are promoted)",
                target.name,
                target.role.as_str()
            ),
        );
    }
    if i.active_site.is_empty() {
        return reject(
            R::NO_ACTIVE_SITE,
            "the group has no active site to move".into(),
        );
    }
    if target.name == i.active_site {
        return reject(
            R::ALREADY_ACTIVE,
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
            R::NO_ACTIVE_SITE,
            format!("active site {} is not in the spec", i.active_site),
        );
    };
    if active.state != SiteState::Writable {
        return reject(
            R::SOURCE_NOT_WRITABLE,
            format!(
                "the active site {} is {}",
                active.name,
                active.state.as_str()
            ),
        );
    }
    if target.recovery_blocked {
        return reject(
            R::TARGET_RECOVERY_BLOCKED,
            format!("{} holds divergent transactions", target.name),
        );
    }
    if target.state != SiteState::ReadOnly {
        return reject(
            R::TARGET_NOT_READY,
            format!(
                "{} is {} (must be reachable and read-only)",
                target.name,
                target.state.as_str()
            ),
        );
    }
    if !target.replicates_from(active) {
        return reject(
            R::TARGET_NOT_REPLICATING,
            format!("{} does not replicate from {}", target.name, active.name),
        );
    }
    Verdict::Proceed {
        source: active.name.clone(),
        target: target.name.clone(),
    }
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
            reason: String::new(),
            message: String::new(),
            admission: Admission::default(),
            source_gtid_executed: String::new(),
        }
    }

    fn in_phase(&self, phase: PlannedFailoverPhase) -> Self {
        PlannedFailoverStatus {
            phase,
            ..self.clone()
        }
    }

    fn ended(&self, phase: PlannedFailoverPhase, now: Timestamp) -> Self {
        let start = self.start_time.unwrap_or(now);
        PlannedFailoverStatus {
            phase,
            completion_time: Some(now),
            duration_seconds: Some(now.since(start).as_secs_f64()),
            ..self.clone()
        }
    }

    fn failed(&self, reason: &'static str, message: String, now: Timestamp) -> Self {
        PlannedFailoverStatus {
            reason: reason.to_string(),
            message,
            ..self.ended(PlannedFailoverPhase::Failed, now)
        }
    }
}

/// How loud an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// An event to record on the group (reasons from [`crate::contract::events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub severity: Severity,
    pub reason: &'static str,
    pub message: String,
}

#[allow(clippy::unnecessary_wraps)] // every note of a transition is optional
fn note(severity: Severity, reason: &'static str, message: String) -> Option<Note> {
    Some(Note {
        severity,
        reason,
        message,
    })
}

/// What a transition counts, for metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Count {
    /// A deferral began (`bloodraven_planned_failovers_deferred_total`).
    Deferred(DeferReason),
    /// The failover ended: succeeded (with its duration) or failed.
    Succeeded(Duration),
    Failed,
}

/// What to do with an annotation that asks for a planned failover.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per request, never stored
pub enum Request {
    /// Start it: persist this status, then consume the annotation.
    Accept(PlannedFailoverStatus),
    /// This request is the failover in flight: its status was persisted and the write that
    /// consumes the annotation did not land (an operator stopped between the two writes).
    /// Consume the annotation, start nothing.
    Taken,
    /// Another one is in flight: drop the request (and consume the annotation).
    Reject(Note),
}

/// Decides a request for a planned failover to `target`.
pub fn request(
    target: &str,
    current: Option<&PlannedFailoverStatus>,
    active_site: &str,
    now: Timestamp,
) -> Request {
    match current {
        Some(p) if !p.phase.is_terminal() && p.target == target => Request::Taken,
        Some(p) if !p.phase.is_terminal() => Request::Reject(Note {
            severity: Severity::Warning,
            reason: E::PLANNED_FAILOVER_REJECTED,
            message: format!(
                "a planned failover to {} is already in flight ({}); the request for {target} was dropped",
                p.target,
                p.phase.as_str()
            ),
        }),
        _ => Request::Accept(PlannedFailoverStatus::requested(target, active_site, now)),
    }
}

/// What [`step`] looks at besides the status.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub sites: &'a [SiteView],
    pub active_site: &'a str,
    pub last_failover: Option<Timestamp>,
    pub cooldown: Duration,
    /// The group's live failover-hold, read under the lease lock (see [`PlannedFailoverPhase::admits`]).
    pub live_hold: Option<&'a LeaseView>,
    /// `plannedFailover.drainTimeout`.
    pub drain_timeout: Duration,
    /// `plannedFailover.maxLagWait`, counted from the failover's start.
    pub max_lag_wait: Duration,
}

/// The next thing to do.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // one value per step, never stored
pub enum Step {
    /// Nothing now: no failover, a terminal phase, or a deferral that still holds unchanged.
    Idle,
    /// Persist `next` (a phase transition, or a changed admission block); then step again at
    /// once when `again`.
    Persist {
        next: PlannedFailoverStatus,
        note: Option<Note>,
        count: Option<Count>,
        again: bool,
    },
    /// `Draining`: fence `source` (killing the sessions that block it) within `budget`, kill
    /// the rest of its application sessions, read its GTID set. Report [`Done::Drained`] or
    /// [`Done::DrainFailed`] / [`Done::SourceUnreadable`].
    Drain { source: String, budget: Duration },
    /// `WaitingForLag`: wait until `target` holds `want` (the fenced source's GTID set), within
    /// `budget`. Report [`Done::CaughtUp`], [`Done::LagTimeout`] or [`Done::CatchUpFailed`].
    CatchUp {
        source: String,
        target: String,
        want: String,
        budget: Duration,
    },
    /// `Promoting`: prepare `target` for promotion (stop and reset its replication, record its
    /// GTID set), leaving it fenced; compare its promotion point with `source_gtid`. Report
    /// [`Done::Promoted`] or [`Done::PromoteFailed`]. The new active site is then persisted and
    /// served before `target` takes a write ("announce, then promote").
    Promote { target: String, source_gtid: String },
    /// `Resuming`: clear the fence of `target`, the announced active site (report
    /// [`Done::LiftFailed`] when that fails); then re-point `sites` to it — the fenced source
    /// (the target holds all of it) and every other site whose last probe shows nothing the
    /// target lacks; the rest are left to the controller's regular checks (re-point, or block
    /// when divergent). Report [`Done::Resumed`].
    Resume { target: String, sites: Vec<String> },
}

/// How the fence of `Draining` ended when it did not take effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceVerdict {
    /// The variable reads back unset: nothing was changed.
    NotApplied { reason: String },
    /// The server could not be read back: it may or may not be fenced.
    Unknown { reason: String },
}

/// What executing a [`Step`] came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Done {
    Drained {
        source_gtid: String,
    },
    DrainFailed {
        fence: FenceVerdict,
        blockers_killed: usize,
    },
    /// Fenced, but its GTID set could not be read.
    SourceUnreadable {
        error: String,
    },
    CaughtUp,
    LagTimeout {
        missing: u64,
    },
    CatchUpFailed {
        error: String,
    },
    Promoted {
        promotion_gtid: String,
        transactions_lost: u64,
    },
    PromoteFailed {
        error: String,
    },
    /// The announced target's fence could not be cleared.
    LiftFailed {
        error: String,
    },
    Resumed {
        /// Sites that could not be re-pointed, with why (the controller retries them).
        failures: Vec<(String, String)>,
    },
}

/// What to undo before persisting a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undo {
    /// The fence did not take effect: nothing was changed.
    Nothing,
    /// The fence took effect: lift it, the source stays the primary.
    Unfence { site: String },
    /// The fence's outcome is unknown: re-read the server; lift the fence if it is set.
    ReadBackThenUnfence { site: String },
}

/// A new active site to persist with the status (bumps `topologyGeneration`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewActiveSite {
    pub site: String,
    pub promotion_gtid: String,
}

/// Where a finished step leads.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The status to persist (`None`: nothing changes; the step runs again next poll).
    pub next: Option<PlannedFailoverStatus>,
    /// Done before persisting.
    pub undo: Undo,
    /// Persisted in the same write as `next`.
    pub new_active_site: Option<NewActiveSite>,
    pub note: Option<Note>,
    pub count: Option<Count>,
    /// Step again at once.
    pub again: bool,
}

impl Transition {
    fn to(next: PlannedFailoverStatus) -> Self {
        Transition {
            next: Some(next),
            undo: Undo::Nothing,
            new_active_site: None,
            note: None,
            count: None,
            again: true,
        }
    }

    fn fail(
        pf: &PlannedFailoverStatus,
        reason: &'static str,
        message: String,
        undo: Undo,
        now: Timestamp,
    ) -> Self {
        Transition {
            note: note(
                Severity::Warning,
                E::PLANNED_FAILOVER_FAILED,
                format!("{reason}: {message}"),
            ),
            next: Some(pf.failed(reason, message, now)),
            undo,
            new_active_site: None,
            count: Some(Count::Failed),
            again: false,
        }
    }
}

fn persist(next: PlannedFailoverStatus, note: Option<Note>, again: bool) -> Step {
    Step::Persist {
        next,
        note,
        count: None,
        again,
    }
}

/// Decides the next step of the planned failover `pf` (`None`: there is none).
pub fn step(pf: Option<&PlannedFailoverStatus>, f: &Facts<'_>, now: Timestamp) -> Step {
    use PlannedFailoverPhase as P;
    let Some(pf) = pf else { return Step::Idle };
    match pf.phase {
        P::Succeeded | P::Failed => Step::Idle,
        P::Pending => persist(
            pf.in_phase(P::Admitting),
            note(
                Severity::Normal,
                E::PLANNED_FAILOVER_ADMITTING,
                format!("planned failover to {}: admitting", pf.target),
            ),
            true,
        ),
        P::Admitting | P::Deferred if settling(pf, f, now) => Step::Idle,
        P::Admitting | P::Deferred => {
            let verdict = admit(&AdmissionInput {
                target: &pf.target,
                active_site: f.active_site,
                sites: f.sites,
                now,
                last_failover: f.last_failover,
                cooldown: f.cooldown,
                live_hold: f.live_hold,
            });
            admission_step(pf, verdict, now)
        }
        P::Draining => Step::Drain {
            source: pf.source.clone(),
            budget: f.drain_timeout,
        },
        P::WaitingForLag => {
            let elapsed = pf.start_time.map_or(Duration::ZERO, |t| now.since(t));
            Step::CatchUp {
                source: pf.source.clone(),
                target: pf.target.clone(),
                want: pf.source_gtid_executed.clone(),
                budget: f
                    .max_lag_wait
                    .saturating_sub(elapsed)
                    .max(Duration::from_millis(100)),
            }
        }
        P::Promoting => Step::Promote {
            target: pf.target.clone(),
            source_gtid: pf.source_gtid_executed.clone(),
        },
        P::Resuming => {
            let target = f.sites.iter().find(|v| v.name == pf.target);
            // Judged as a returning site is (a MariaDB position names only each domain's last
            // writer): nothing past the target's position, nor from another writer.
            let holds = |v: &SiteView| match (target.and_then(|t| t.gtid.as_ref()), &v.gtid) {
                (Some(t), Some(g)) => !g.diverged_since_promotion(t, t),
                _ => false,
            };
            let sites = f
                .sites
                .iter()
                .filter(|v| v.name != pf.target)
                .filter(|v| v.name == pf.source || (v.answered && !v.recovery_blocked && holds(v)))
                .map(|v| v.name.clone())
                .collect();
            Step::Resume {
                target: pf.target.clone(),
                sites,
            }
        }
    }
}

fn admission_step(pf: &PlannedFailoverStatus, verdict: Verdict, now: Timestamp) -> Step {
    use PlannedFailoverPhase as P;
    if pf.phase == P::Deferred && !matches!(verdict, Verdict::Defer { .. }) {
        // What deferred it is gone: back through Admitting, which revalidates.
        return persist(
            PlannedFailoverStatus {
                admission: Admission::default(),
                ..pf.in_phase(P::Admitting)
            },
            note(
                Severity::Normal,
                E::PLANNED_FAILOVER_ADMITTING,
                format!(
                    "planned failover to {}: no longer deferred ({}); admitting again",
                    pf.target, pf.admission.defer_reason
                ),
            ),
            true,
        );
    }
    match verdict {
        Verdict::Proceed { source, .. } => persist(
            PlannedFailoverStatus {
                source,
                admission: Admission::default(),
                ..pf.in_phase(P::Draining)
            },
            None,
            true,
        ),
        Verdict::Defer {
            reason,
            retry_time,
            message,
        } => {
            let admission = Admission {
                defer_reason: reason.as_str().to_string(),
                retry_time: Some(retry_time),
                message: message.clone(),
            };
            let entering = pf.phase != P::Deferred || pf.admission.defer_reason != reason.as_str();
            if !entering && pf.admission == admission {
                return Step::Idle;
            }
            Step::Persist {
                next: PlannedFailoverStatus {
                    admission,
                    ..pf.in_phase(P::Deferred)
                },
                note: entering.then(|| Note {
                    severity: Severity::Normal,
                    reason: E::PLANNED_FAILOVER_DEFERRED,
                    message: format!(
                        "planned failover to {} {message}; retry at {retry_time}",
                        pf.target
                    ),
                }),
                count: entering.then_some(Count::Deferred(reason)),
                again: false,
            }
        }
        Verdict::Reject { reason, message } => Step::Persist {
            note: note(
                Severity::Warning,
                E::PLANNED_FAILOVER_FAILED,
                format!("{reason}: {message}"),
            ),
            next: pf.failed(reason, message, now),
            count: Some(Count::Failed),
            again: false,
        },
    }
}

/// Where a finished step of `pf` leads.
pub fn finish(pf: &PlannedFailoverStatus, done: Done, now: Timestamp) -> Transition {
    use PlannedFailoverPhase as P;
    let source = pf.source.clone();
    match done {
        Done::Drained { source_gtid } => Transition::to(PlannedFailoverStatus {
            source_gtid_executed: source_gtid,
            ..pf.in_phase(P::WaitingForLag)
        }),
        Done::DrainFailed {
            fence,
            blockers_killed,
        } => {
            let (what, undo) = match fence {
                FenceVerdict::NotApplied { reason } => (
                    format!("it did not take effect ({reason}); nothing was changed"),
                    Undo::Nothing,
                ),
                FenceVerdict::Unknown { reason } => (
                    format!(
                        "its outcome is unknown ({reason}); it was read back and lifted if set"
                    ),
                    Undo::ReadBackThenUnfence {
                        site: source.clone(),
                    },
                ),
            };
            Transition::fail(
                pf,
                R::FENCE_FAILED,
                format!(
                    "fencing {source} within drainTimeout failed after killing {blockers_killed} blocking session(s): {what}; {source} stays the primary"
                ),
                undo,
                now,
            )
        }
        Done::SourceUnreadable { error } => Transition::fail(
            pf,
            R::SOURCE_UNREADABLE,
            format!(
                "cannot read {source}'s GTID set after fencing it: {error}; it was unfenced again"
            ),
            Undo::Unfence {
                site: source.clone(),
            },
            now,
        ),
        Done::CaughtUp => Transition::to(pf.in_phase(P::Promoting)),
        Done::LagTimeout { missing } => Transition::fail(
            pf,
            R::LAG_TIMEOUT,
            format!(
                "{} did not catch up with {source} within maxLagWait ({missing} transaction(s) missing); {source} was unfenced again",
                pf.target
            ),
            Undo::Unfence {
                site: source.clone(),
            },
            now,
        ),
        Done::CatchUpFailed { error } => Transition::fail(
            pf,
            R::WAIT_FAILED,
            format!(
                "waiting for {} failed: {error}; {source} was unfenced again",
                pf.target
            ),
            Undo::Unfence {
                site: source.clone(),
            },
            now,
        ),
        Done::Promoted {
            promotion_gtid,
            transactions_lost,
        } => Transition {
            next: Some(PlannedFailoverStatus {
                transactions_lost: Some(transactions_lost),
                ..pf.in_phase(P::Resuming)
            }),
            undo: Undo::Nothing,
            new_active_site: Some(NewActiveSite {
                site: pf.target.clone(),
                promotion_gtid,
            }),
            note: None,
            count: None,
            again: true,
        },
        // Retried next poll, unchanged. PromoteFailed: the source stays fenced (no site
        // writable is recoverable; two writable sites are not). LiftFailed: the new active
        // site is announced, the change stands, and the target's fence is cleared again
        // (reassertion would do it too); no site takes writes meanwhile.
        Done::PromoteFailed { .. } | Done::LiftFailed { .. } => Transition {
            next: None,
            undo: Undo::Nothing,
            new_active_site: None,
            note: None,
            count: None,
            again: false,
        },
        Done::Resumed { failures } => {
            let next = pf.ended(P::Succeeded, now);
            let duration = Duration::from_secs_f64(next.duration_seconds.unwrap_or(0.0));
            let pending = if failures.is_empty() {
                String::new()
            } else {
                format!(
                    "; re-pointing {} is retried by the next polls",
                    failures
                        .iter()
                        .map(|(s, _)| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            Transition {
                note: note(
                    Severity::Normal,
                    E::PLANNED_FAILOVER_SUCCEEDED,
                    format!(
                        "{} is the active site; {} transactions lost{pending}",
                        pf.target,
                        pf.transactions_lost.unwrap_or(0)
                    ),
                ),
                next: Some(next),
                undo: Undo::Nothing,
                new_active_site: None,
                count: Some(Count::Succeeded(duration)),
                again: false,
            }
        }
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
        let mk = |name, index, state| SiteView::answered(name, index, state, "0-1-5");
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
            Verdict::Proceed {
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
            Verdict::Defer {
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
            Verdict::Defer {
                reason: DeferReason::Cooldown,
                retry_time,
                ..
            } => assert_eq!(retry_time, t(300)),
            other => panic!("{other:?}"),
        }
        i.now = t(300);
        assert!(matches!(admit(&i), Verdict::Proceed { .. }));
    }

    #[test]
    fn invalid_targets_are_rejected_with_a_reason() {
        let mut s = sites();
        let reason = |a: Verdict| match a {
            Verdict::Reject { reason, .. } => reason,
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

    fn facts<'a>(sites: &'a [SiteView], hold: Option<&'a LeaseView>) -> Facts<'a> {
        Facts {
            sites,
            active_site: "iad",
            last_failover: None,
            cooldown: Duration::from_secs(300),
            live_hold: hold,
            drain_timeout: Duration::from_secs(30),
            max_lag_wait: Duration::from_secs(300),
        }
    }

    fn pf(phase: PlannedFailoverPhase) -> PlannedFailoverStatus {
        PlannedFailoverStatus {
            phase,
            source: "iad".into(),
            source_gtid_executed: "0-1-5".into(),
            ..PlannedFailoverStatus::requested("pdx", "iad", t(0))
        }
    }

    fn persisted(s: Step) -> (PlannedFailoverStatus, Option<Note>, Option<Count>, bool) {
        match s {
            Step::Persist {
                next,
                note,
                count,
                again,
            } => (next, note, count, again),
            other => panic!("expected a Persist step: {other:?}"),
        }
    }

    fn hold(expires: i64) -> LeaseView {
        LeaseView {
            kind: LeaseKind::FailoverHold,
            operation_id: "op".into(),
            instance: "counter-app".into(),
            expires_at: t(expires),
            topology_generation: 1,
        }
    }

    /// One row per phase: what `step` asks for.
    #[test]
    fn each_phase_asks_for_its_step() {
        use PlannedFailoverPhase as P;
        let s = sites();
        let f = facts(&s, None);
        assert_eq!(step(None, &f, t(10)), Step::Idle);
        for terminal in [P::Succeeded, P::Failed] {
            assert_eq!(step(Some(&pf(terminal)), &f, t(10)), Step::Idle);
        }
        let (next, n, _, again) = persisted(step(Some(&pf(P::Pending)), &f, t(10)));
        assert_eq!(next.phase, P::Admitting);
        assert_eq!(n.unwrap().reason, E::PLANNED_FAILOVER_ADMITTING);
        assert!(again);
        let (next, n, _, again) = persisted(step(Some(&pf(P::Admitting)), &f, t(10)));
        assert_eq!((next.phase, next.source.as_str()), (P::Draining, "iad"));
        assert!(n.is_none() && again);
        assert!(P::Admitting.admits() && P::Deferred.admits() && !P::Draining.admits());
        assert_eq!(
            step(Some(&pf(P::Draining)), &f, t(10)),
            Step::Drain {
                source: "iad".into(),
                budget: Duration::from_secs(30)
            }
        );
        // maxLagWait counts from the failover's start.
        assert_eq!(
            step(Some(&pf(P::WaitingForLag)), &f, t(100)),
            Step::CatchUp {
                source: "iad".into(),
                target: "pdx".into(),
                want: "0-1-5".into(),
                budget: Duration::from_secs(200)
            }
        );
        assert_eq!(
            step(Some(&pf(P::WaitingForLag)), &f, t(400)),
            Step::CatchUp {
                source: "iad".into(),
                target: "pdx".into(),
                want: "0-1-5".into(),
                budget: Duration::from_millis(100)
            }
        );
        assert_eq!(
            step(Some(&pf(P::Promoting)), &f, t(10)),
            Step::Promote {
                target: "pdx".into(),
                source_gtid: "0-1-5".into()
            }
        );
        assert_eq!(
            step(Some(&pf(P::Resuming)), &f, t(10)),
            Step::Resume {
                target: "pdx".into(),
                sites: vec!["iad".into(), "reader".into()]
            }
        );
        // A site holding something the target lacks is left to the regular checks.
        let mut ahead = sites();
        ahead[2].gtid = Some(GtidSet::parse(GtidFlavor::MariaDb, "0-3-9").unwrap());
        assert_eq!(
            step(Some(&pf(P::Resuming)), &facts(&ahead, None), t(10)),
            Step::Resume {
                target: "pdx".into(),
                sites: vec!["iad".into()]
            }
        );
    }

    #[test]
    fn admission_waits_for_unsettled_sites_up_to_max_lag_wait() {
        use PlannedFailoverPhase as P;
        // (which site has no settled state yet, seconds since the request, what step does)
        let cases = [
            (Some(0), 10, "waits"),
            (Some(1), 10, "waits"),
            (Some(0), 299, "waits"),
            (Some(0), 301, "rejects"),
            (None, 10, "admits"),
        ];
        for (unsettled, at, want) in cases {
            let mut all = sites();
            if let Some(i) = unsettled {
                all[i].state = SiteState::Unknown;
            }
            let got = step(Some(&pf(P::Admitting)), &facts(&all, None), t(at));
            let what = match &got {
                Step::Idle => "waits",
                Step::Persist { next, .. } if next.phase == P::Failed => "rejects",
                Step::Persist { next, .. } if next.phase == P::Draining => "admits",
                _ => "something else",
            };
            assert_eq!(what, want, "{unsettled:?} at {at}s: {got:?}");
        }
    }

    /// A hold defers (once counted), its renewal moves retryTime (not counted again), and when
    /// it goes the failover re-enters Admitting before anything else.
    #[test]
    fn deferral_and_the_way_back_through_admitting() {
        use PlannedFailoverPhase as P;
        let s = sites();
        let h = hold(30);
        let (deferred, n, count, again) =
            persisted(step(Some(&pf(P::Admitting)), &facts(&s, Some(&h)), t(10)));
        assert_eq!(deferred.phase, P::Deferred);
        assert_eq!(deferred.admission.defer_reason, R::DEPLOYMENT_HOLD);
        assert_eq!(deferred.admission.retry_time, Some(t(30)));
        assert_eq!(n.unwrap().reason, E::PLANNED_FAILOVER_DEFERRED);
        assert_eq!(count, Some(Count::Deferred(DeferReason::DeploymentHold)));
        assert!(!again);
        // Unchanged: nothing to do.
        assert_eq!(
            step(Some(&deferred), &facts(&s, Some(&h)), t(11)),
            Step::Idle
        );
        // Renewed: retryTime moves, no new event, not counted again.
        let renewed = hold(40);
        let (moved, n, count, _) =
            persisted(step(Some(&deferred), &facts(&s, Some(&renewed)), t(12)));
        assert_eq!(moved.admission.retry_time, Some(t(40)));
        assert!(n.is_none() && count.is_none());
        // Released: back to Admitting, with its event, then Draining.
        let (back, n, _, again) = persisted(step(Some(&moved), &facts(&s, None), t(13)));
        assert_eq!(back.phase, P::Admitting);
        assert_eq!(back.admission, Admission::default());
        assert!(
            n.unwrap()
                .message
                .contains("no longer deferred (DeploymentHold)")
        );
        assert!(again);
        let (draining, _, _, _) = persisted(step(Some(&back), &facts(&s, None), t(13)));
        assert_eq!(draining.phase, P::Draining);
        // A target that broke meanwhile: back to Admitting, then Failed with its reason.
        let mut broken = sites();
        broken[1].state = SiteState::Unreachable;
        let (back, _, _, _) = persisted(step(Some(&moved), &facts(&broken, None), t(13)));
        assert_eq!(back.phase, P::Admitting);
        let (failed, n, count, again) = persisted(step(Some(&back), &facts(&broken, None), t(14)));
        assert_eq!(failed.phase, P::Failed);
        assert_eq!(failed.reason, R::TARGET_NOT_READY);
        assert_eq!(failed.completion_time, Some(t(14)));
        assert_eq!(n.unwrap().reason, E::PLANNED_FAILOVER_FAILED);
        assert_eq!(count, Some(Count::Failed));
        assert!(!again);
    }

    /// One row per outcome: the transition, and what is undone on failure.
    #[test]
    fn each_outcome_leads_to_its_transition_with_the_typed_undo() {
        use PlannedFailoverPhase as P;
        let unfence = Undo::Unfence { site: "iad".into() };
        let cases: Vec<(P, Done, Option<P>, &str, Undo)> = vec![
            (
                P::Draining,
                Done::Drained {
                    source_gtid: "0-1-9".into(),
                },
                Some(P::WaitingForLag),
                "",
                Undo::Nothing,
            ),
            (
                P::Draining,
                Done::DrainFailed {
                    fence: FenceVerdict::NotApplied {
                        reason: "no answer within 2000 ms".into(),
                    },
                    blockers_killed: 2,
                },
                Some(P::Failed),
                R::FENCE_FAILED,
                Undo::Nothing,
            ),
            (
                P::Draining,
                Done::DrainFailed {
                    fence: FenceVerdict::Unknown {
                        reason: "connection lost".into(),
                    },
                    blockers_killed: 0,
                },
                Some(P::Failed),
                R::FENCE_FAILED,
                Undo::ReadBackThenUnfence { site: "iad".into() },
            ),
            (
                P::Draining,
                Done::SourceUnreadable {
                    error: "gone".into(),
                },
                Some(P::Failed),
                R::SOURCE_UNREADABLE,
                unfence.clone(),
            ),
            (
                P::WaitingForLag,
                Done::CaughtUp,
                Some(P::Promoting),
                "",
                Undo::Nothing,
            ),
            (
                P::WaitingForLag,
                Done::LagTimeout { missing: 3 },
                Some(P::Failed),
                R::LAG_TIMEOUT,
                unfence.clone(),
            ),
            (
                P::WaitingForLag,
                Done::CatchUpFailed {
                    error: "gone".into(),
                },
                Some(P::Failed),
                R::WAIT_FAILED,
                unfence.clone(),
            ),
            (
                P::Promoting,
                Done::PromoteFailed {
                    error: "refused".into(),
                },
                None,
                "",
                Undo::Nothing,
            ),
            (
                P::Resuming,
                Done::LiftFailed {
                    error: "refused".into(),
                },
                None,
                "",
                Undo::Nothing,
            ),
            (
                P::Resuming,
                Done::Resumed {
                    failures: vec![("reader".into(), "refused".into())],
                },
                Some(P::Succeeded),
                "",
                Undo::Nothing,
            ),
        ];
        for (phase, done, want, reason, undo) in cases {
            let label = format!("{phase:?} {done:?}");
            let tr = finish(&pf(phase), done, t(50));
            assert_eq!(tr.next.as_ref().map(|n| n.phase), want, "{label}");
            assert_eq!(tr.undo, undo, "{label}");
            if let Some(n) = &tr.next {
                assert_eq!(n.reason, reason, "{label}");
                if n.phase.is_terminal() {
                    assert_eq!(n.completion_time, Some(t(50)), "{label}");
                    assert!(!tr.again, "{label}");
                }
            }
            if want == Some(P::Failed) {
                assert_eq!(tr.count, Some(Count::Failed), "{label}");
                assert_eq!(
                    tr.note.as_ref().map(|n| n.reason),
                    Some(E::PLANNED_FAILOVER_FAILED)
                );
            }
        }
        // Promotion persists the new active site with Resuming, in one write.
        let tr = finish(
            &pf(P::Promoting),
            Done::Promoted {
                promotion_gtid: "0-1-9".into(),
                transactions_lost: 0,
            },
            t(50),
        );
        assert_eq!(
            tr.new_active_site,
            Some(NewActiveSite {
                site: "pdx".into(),
                promotion_gtid: "0-1-9".into()
            })
        );
        let next = tr.next.unwrap();
        assert_eq!((next.phase, next.transactions_lost), (P::Resuming, Some(0)));
        // Success counts its duration and names re-points left to the polls.
        let tr = finish(
            &pf(P::Resuming),
            Done::Resumed {
                failures: vec![("reader".into(), "refused".into())],
            },
            t(50),
        );
        assert_eq!(tr.count, Some(Count::Succeeded(Duration::from_secs(50))));
        assert!(
            tr.note
                .unwrap()
                .message
                .contains("re-pointing reader is retried")
        );
    }

    #[test]
    fn a_second_request_while_one_is_in_flight_is_dropped() {
        let current = pf(PlannedFailoverPhase::Draining);
        match request("reader", Some(&current), "iad", t(5)) {
            Request::Reject(n) => {
                assert_eq!(n.reason, E::PLANNED_FAILOVER_REJECTED);
                assert!(n.message.contains("reader"));
            }
            other => panic!("{other:?}"),
        }
        let done = pf(PlannedFailoverPhase::Succeeded);
        match request("pdx", Some(&done), "iad", t(5)) {
            Request::Accept(s) => {
                assert_eq!(s.phase, PlannedFailoverPhase::Pending);
                assert_eq!((s.target.as_str(), s.source.as_str()), ("pdx", "iad"));
                assert_eq!(s.start_time, Some(t(5)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_annotation_of_the_failover_in_flight_is_taken_not_rejected() {
        // The status write landed, the annotation's removal did not (the operator stopped
        // between the two): the next poll sees its own request again.
        let current = pf(PlannedFailoverPhase::Pending);
        assert_eq!(
            request(&current.target, Some(&current), "iad", t(5)),
            Request::Taken
        );
        let draining = pf(PlannedFailoverPhase::Draining);
        assert_eq!(
            request(&draining.target, Some(&draining), "iad", t(5)),
            Request::Taken
        );
    }
}
