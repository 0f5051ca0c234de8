//! The planned failover's state machine: [`request`] takes the annotation, [`step`] says what
//! the current phase asks for, [`finish`] turns what happened into the next phase, its event,
//! its metric and what to undo.

use std::time::Duration;

use super::admission::{AdmissionInput, Verdict, admit};
use crate::lease::LeaseView;
use crate::reason::{DeferReason, EventReason, FailureReason};
use crate::status::{Admission, PlannedFailoverPhase, PlannedFailoverStatus, SiteState};
use crate::time::Timestamp;
use crate::view::SiteView;

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

/// How loud an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// An event to record on the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub severity: Severity,
    pub reason: EventReason,
    pub message: String,
}

/// A step of a followed operation (an ordered update, a restore-in-place) that persists `next`,
/// its new status, then records `notes` and counts its end as `count` (for metrics); the
/// operation steps again at once when `again`.
#[derive(Clone, Debug, PartialEq)]
pub struct Persist<S, C> {
    pub next: S,
    pub notes: Vec<Note>,
    pub count: Option<C>,
    pub again: bool,
}

impl<S, C> Persist<S, C> {
    /// `next` alone: no note, nothing counted.
    pub fn quiet(next: S, again: bool) -> Self {
        Persist {
            next,
            notes: Vec::new(),
            count: None,
            again,
        }
    }
}

#[allow(clippy::unnecessary_wraps)] // every note of a transition is optional
fn note(severity: Severity, reason: EventReason, message: String) -> Option<Note> {
    Some(Note {
        severity,
        reason,
        message,
    })
}

/// What a transition counts, for metrics.
#[derive(Clone, Debug, PartialEq)]
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
pub fn request(target: &str, status: &crate::status::GroupStatus, now: Timestamp) -> Request {
    use crate::arbiter::{Answer, Kind, Requested, Running, admit};
    match admit(
        &Running::of(status),
        &Requested::new(Kind::PlannedFailover, target),
    ) {
        Answer::Taken => Request::Taken,
        Answer::Refused { by } => Request::Reject(Note {
            severity: Severity::Warning,
            reason: EventReason::PlannedFailoverRejected,
            message: format!("{by} is in progress; the planned failover to {target} was dropped"),
        }),
        Answer::Start => Request::Accept(PlannedFailoverStatus::requested(
            target,
            &status.active_site,
            now,
        )),
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
    /// `operationTimeouts.plannedFailover`: how long each phase past admission may last.
    pub phase_timeout: Duration,
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
    /// A phase ran past its deadline before anything was announced: apply this transition
    /// (undo the source's fence, persist `Failed`) without executing anything else.
    Abandon(Transition),
    /// `Resuming` ran past its deadline (the announced target never took writes): fence
    /// `target` and report [`Done::RollbackFenced`] or [`Done::RollbackUnfenced`]; a fenced
    /// target is rolled back to `source` as a new topology change.
    RollBack { target: String, source: String },
    /// An executing phase without a deadline yet (a status an older version wrote): persist
    /// it with one.
    SetDeadline(PlannedFailoverStatus),
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
    /// The timed-out target is fenced: it never took a write, the source holds everything.
    RollbackFenced,
    /// The timed-out target's fence could not be confirmed: no rollback.
    RollbackUnfenced {
        error: String,
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
    /// A site whose fence is cleared once `next` (and its new active site) is persisted: the
    /// source of a rolled-back failover, announced again first.
    pub lift_after: Option<String>,
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
            lift_after: None,
            note: None,
            count: None,
            again: true,
        }
    }

    /// The failover ran past its deadline: `Failed` (`TimedOut`), event `OperationTimedOut`.
    fn timed_out(pf: &PlannedFailoverStatus, message: String, undo: Undo, now: Timestamp) -> Self {
        Transition {
            note: note(
                Severity::Warning,
                EventReason::OperationTimedOut,
                format!("planned failover to {}: {message}", pf.target),
            ),
            next: Some(pf.failed(FailureReason::TimedOut, message, now)),
            undo,
            new_active_site: None,
            lift_after: None,
            count: Some(Count::Failed),
            again: false,
        }
    }

    fn fail(
        pf: &PlannedFailoverStatus,
        reason: FailureReason,
        message: String,
        undo: Undo,
        now: Timestamp,
    ) -> Self {
        Transition {
            note: note(
                Severity::Warning,
                EventReason::PlannedFailoverFailed,
                format!("{reason}: {message}"),
            ),
            next: Some(pf.failed(reason, message, now)),
            undo,
            new_active_site: None,
            lift_after: None,
            count: Some(Count::Failed),
            again: false,
        }
    }
}

/// Whether `phase` runs against `spec.operationTimeouts.plannedFailover` (the admission
/// phases wait for what their admission block names instead).
pub fn executing(phase: PlannedFailoverPhase) -> bool {
    use PlannedFailoverPhase as P;
    matches!(
        phase,
        P::Draining | P::WaitingForLag | P::Promoting | P::Resuming
    )
}

/// The deadline `next` should carry once it replaces `before`: a new executing phase gets
/// `now + phase_timeout`; the same phase keeps its deadline; a deferral shows when it is tried
/// again; anything else has none.
pub fn deadline_for(
    before: &PlannedFailoverStatus,
    next: &PlannedFailoverStatus,
    now: Timestamp,
    phase_timeout: Duration,
) -> Option<Timestamp> {
    use PlannedFailoverPhase as P;
    if next.phase.is_terminal() {
        return None;
    }
    if executing(next.phase) {
        if next.phase == before.phase && before.deadline.is_some() {
            return before.deadline;
        }
        return Some(now.plus(phase_timeout));
    }
    if next.phase == P::Deferred {
        return next.admission.retry_time;
    }
    None
}

/// What a phase that ran past its deadline comes to.
fn expired(pf: &PlannedFailoverStatus, now: Timestamp) -> Step {
    use PlannedFailoverPhase as P;
    let source = pf.source.clone();
    let bound = "its phase bound (spec.operationTimeouts.plannedFailover)";
    match pf.phase {
        // Nothing announced: the source stays the primary (its fence read back and lifted).
        P::Draining | P::WaitingForLag | P::Promoting => Step::Abandon(Transition::timed_out(
            pf,
            format!(
                "{} ran past {bound}; nothing was announced, {source} stays the primary (its fence read back and lifted)",
                pf.phase.as_str()
            ),
            Undo::ReadBackThenUnfence { site: source },
            now,
        )),
        P::Resuming => Step::RollBack {
            target: pf.target.clone(),
            source,
        },
        _ => Step::Idle,
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
    if executing(pf.phase) {
        match pf.deadline {
            None => {
                return Step::SetDeadline(PlannedFailoverStatus {
                    deadline: Some(now.plus(f.phase_timeout)),
                    ..pf.clone()
                });
            }
            Some(d) if now >= d => return expired(pf, now),
            Some(_) => {}
        }
    }
    match pf.phase {
        P::Succeeded | P::Failed => Step::Idle,
        P::Pending => persist(
            pf.in_phase(P::Admitting),
            note(
                Severity::Normal,
                EventReason::PlannedFailoverAdmitting,
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
                EventReason::PlannedFailoverAdmitting,
                format!(
                    "planned failover to {}: no longer deferred ({}); admitting again",
                    pf.target,
                    pf.admission
                        .defer_reason
                        .as_ref()
                        .map(DeferReason::as_str)
                        .unwrap_or_default()
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
                defer_reason: Some(reason.clone()),
                retry_time: Some(retry_time),
                message: message.clone(),
            };
            let entering =
                pf.phase != P::Deferred || pf.admission.defer_reason.as_ref() != Some(&reason);
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
                    reason: EventReason::PlannedFailoverDeferred,
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
                EventReason::PlannedFailoverFailed,
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
        } => drain_failed(pf, fence, blockers_killed, now),
        Done::SourceUnreadable { error } => Transition::fail(
            pf,
            FailureReason::SourceUnreadable,
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
            FailureReason::LagTimeout,
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
            FailureReason::WaitFailed,
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
        } => promoted(pf, promotion_gtid, transactions_lost),
        // Retried next poll, unchanged. PromoteFailed: the source stays fenced (no site
        // writable is recoverable; two writable sites are not). LiftFailed: the new active
        // site is announced, the change stands, and the target's fence is cleared again
        // (reassertion would do it too); no site takes writes meanwhile.
        Done::PromoteFailed { .. } | Done::LiftFailed { .. } => Transition {
            next: None,
            undo: Undo::Nothing,
            new_active_site: None,
            lift_after: None,
            note: None,
            count: None,
            again: false,
        },
        Done::RollbackFenced => rolled_back(pf, now),
        Done::RollbackUnfenced { error } => Transition::timed_out(
            pf,
            format!(
                "Resuming ran past its phase bound (spec.operationTimeouts.plannedFailover), and {} could not be fenced to roll back ({error}): it stays the announced active site; the controller lifts its fence once it answers (reassertion), or an emergency failover replaces it",
                pf.target
            ),
            Undo::Nothing,
            now,
        ),
        Done::Resumed { failures } => resumed(pf, &failures, now),
    }
}

/// A drain whose fence of the source failed: the failover fails, and the undo follows from
/// what is known of the fence.
fn drain_failed(
    pf: &PlannedFailoverStatus,
    fence: FenceVerdict,
    blockers_killed: usize,
    now: Timestamp,
) -> Transition {
    let source = pf.source.clone();
    let (what, undo) = match fence {
        FenceVerdict::NotApplied { reason } => (
            format!("it did not take effect ({reason}); nothing was changed"),
            Undo::Nothing,
        ),
        FenceVerdict::Unknown { reason } => (
            format!("its outcome is unknown ({reason}); it was read back and lifted if set"),
            Undo::ReadBackThenUnfence {
                site: source.clone(),
            },
        ),
    };
    Transition::fail(
        pf,
        FailureReason::FenceFailed,
        format!(
            "fencing {source} within drainTimeout failed after killing {blockers_killed} blocking session(s): {what}; {source} stays the primary"
        ),
        undo,
        now,
    )
}

/// The target was promoted: the failover resumes, with the target announced as the new
/// active site.
fn promoted(
    pf: &PlannedFailoverStatus,
    promotion_gtid: String,
    transactions_lost: u64,
) -> Transition {
    use PlannedFailoverPhase as P;
    Transition {
        next: Some(PlannedFailoverStatus {
            transactions_lost: Some(transactions_lost),
            ..pf.in_phase(P::Resuming)
        }),
        undo: Undo::Nothing,
        new_active_site: Some(NewActiveSite {
            site: pf.target.clone(),
            promotion_gtid,
        }),
        lift_after: None,
        note: None,
        count: None,
        again: true,
    }
}

/// Resuming ran past its phase bound and the target was fenced again: the source is
/// announced again, then its fence is lifted.
fn rolled_back(pf: &PlannedFailoverStatus, now: Timestamp) -> Transition {
    let source = pf.source.clone();
    // Rolling back after the announce is a new topology change: the source is announced
    // again (a generation bump, every deploy lease revoked), then its fence is lifted.
    // Otherwise rule #1 would fence the source that was just made writable again.
    Transition {
        lift_after: Some(source.clone()),
        new_active_site: Some(NewActiveSite {
            site: source.clone(),
            promotion_gtid: pf.source_gtid_executed.clone(),
        }),
        ..Transition::timed_out(
            pf,
            format!(
                "Resuming ran past its phase bound (spec.operationTimeouts.plannedFailover): {} never took writes; rolled back to {source}, announced again",
                pf.target
            ),
            Undo::Nothing,
            now,
        )
    }
}

/// The failover succeeded: it ends, noting the re-pointings that the next polls retry.
fn resumed(
    pf: &PlannedFailoverStatus,
    failures: &[(String, String)],
    now: Timestamp,
) -> Transition {
    use PlannedFailoverPhase as P;
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
            EventReason::PlannedFailoverSucceeded,
            format!(
                "{} is the active site; {} transactions lost{pending}",
                pf.target,
                pf.transactions_lost.unwrap_or(0)
            ),
        ),
        next: Some(next),
        undo: Undo::Nothing,
        new_active_site: None,
        lift_after: None,
        count: Some(Count::Succeeded(duration)),
        again: false,
    }
}
