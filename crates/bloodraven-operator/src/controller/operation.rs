//! The one executor of the stepped operations: the planned failover (in its own slot or as an
//! ordered update's switchover), the ordered update and the restore-in-place. It owns what is
//! the same for all of them — advancing an operation step by step within one poll, and
//! persisting a step's next status: its phase's deadline, the store write through the writer,
//! the log line, the notes as events and the end as a metric. Each operation says only what
//! differs through [`Operation`]: where its status lives, its deadline rule, its counters. The
//! executors (`planned`, `update`, `restore`, `reclone`) keep their platform calls.

use bloodraven_core::config::GroupConfig;
use bloodraven_core::planned::{Count as PlannedCount, Note, Persist, PlannedFailoverStatus};
use bloodraven_core::reason::FailureReason;
use bloodraven_core::status::{GroupStatus, PlannedFailoverPhase, RestoreStatus, UpdateStatus};
use bloodraven_core::time::Timestamp;
use bloodraven_core::update::Count as UpdateCount;
use bloodraven_mysql::Site;

use super::{Controller, ControllerError};
use crate::metrics::{FailoverLabels, GroupLabel, Metrics};

/// At most this many transitions per poll (a failover that can run straight through does).
pub(super) const MAX_STEPS_PER_POLL: usize = 12;

/// What differs between the stepped operations' stored statuses; the executor does the rest.
pub(super) trait Operation: Copy {
    /// The status it keeps in `GroupStatus`.
    type Status: Clone + Send + Sync;
    /// What its end counts.
    type Count;
    /// The store write's name (in the writer's errors and the poll trace).
    fn what(self) -> &'static str;
    /// Its status as stored now.
    fn get(self, s: &GroupStatus) -> Option<Self::Status>;
    /// Stores `next`; `announced` when the same write bumped `topologyGeneration`.
    fn set(self, s: &mut GroupStatus, next: Self::Status, announced: bool);
    /// The deadline `next` carries after `before`, by the operation's rule.
    fn deadline(
        self,
        before: &Self::Status,
        next: &Self::Status,
        now: Timestamp,
        cfg: &GroupConfig,
    ) -> Option<Timestamp>;
    /// Whether `next` keeps `before`'s deadline (same phase, a deadline already set).
    fn keeps_deadline(self, before: &Self::Status, next: &Self::Status) -> bool;
    /// Sets `next`'s deadline.
    fn set_deadline(self, next: &mut Self::Status, deadline: Option<Timestamp>);
    /// Logs the persisted transition.
    fn log(self, group: &str, before: Option<&Self::Status>, next: &Self::Status);
    /// Counts the operation's end (or a deferral) in `m`.
    fn count(self, c: Self::Count, group: &str, m: &Metrics);
}

/// Where a planned failover's status is kept: `status.plannedFailover`, or an ordered
/// update's own switchover (`status.updatePhase.switchover`). The machine is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Planned,
    Update,
}

impl Operation for Slot {
    type Status = PlannedFailoverStatus;
    type Count = PlannedCount;

    fn what(self) -> &'static str {
        "the planned failover phase"
    }

    fn get(self, s: &GroupStatus) -> Option<PlannedFailoverStatus> {
        match self {
            Slot::Planned => s.planned_failover.clone(),
            Slot::Update => s
                .update_phase
                .as_ref()
                .filter(|u| u.in_flight())
                .and_then(|u| u.switchover.clone()),
        }
    }

    /// The update's switchover, when announced, makes the update expect the new generation:
    /// only its own switchover may move it.
    fn set(self, s: &mut GroupStatus, pf: PlannedFailoverStatus, announced: bool) {
        match self {
            Slot::Planned => s.planned_failover = Some(pf),
            Slot::Update => {
                let generation = s.topology_generation;
                if let Some(u) = s.update_phase.as_mut() {
                    u.switchover = Some(pf);
                    if announced {
                        u.topology_generation = generation;
                    }
                }
            }
        }
    }

    fn deadline(
        self,
        before: &PlannedFailoverStatus,
        next: &PlannedFailoverStatus,
        now: Timestamp,
        cfg: &GroupConfig,
    ) -> Option<Timestamp> {
        bloodraven_core::planned::deadline_for(
            before,
            next,
            now,
            cfg.operation_timeouts.planned_failover,
        )
    }

    fn keeps_deadline(self, before: &PlannedFailoverStatus, next: &PlannedFailoverStatus) -> bool {
        next.deadline.is_some() && next.phase == before.phase
    }

    fn set_deadline(self, next: &mut PlannedFailoverStatus, deadline: Option<Timestamp>) {
        next.deadline = deadline;
    }

    fn log(
        self,
        group: &str,
        before: Option<&PlannedFailoverStatus>,
        next: &PlannedFailoverStatus,
    ) {
        let target = before.map_or(next.target.as_str(), |b| b.target.as_str());
        let from = before.map_or("", |b| b.phase.as_str());
        if next.phase == PlannedFailoverPhase::Failed {
            let reason = next
                .reason
                .as_ref()
                .map(FailureReason::as_str)
                .unwrap_or_default();
            tracing::warn!(group = %group, target = %target, reason = reason, message = %next.message, "planned failover failed");
        } else {
            tracing::info!(group = %group, target = %target, from = from, to = next.phase.as_str(), "planned failover: phase");
        }
    }

    fn count(self, c: PlannedCount, group: &str, m: &Metrics) {
        let planned = |result: &str| FailoverLabels {
            group: group.to_string(),
            kind: "planned".into(),
            result: result.into(),
        };
        match c {
            PlannedCount::Deferred(reason) => {
                m.planned_failovers_deferred
                    .get_or_create(&Metrics::reason(group, reason.as_str()))
                    .inc();
            }
            PlannedCount::Succeeded(d) => {
                m.failovers.get_or_create(&planned("succeeded")).inc();
                m.planned_failover_duration
                    .get_or_create(&GroupLabel {
                        group: group.to_string(),
                    })
                    .observe(d.as_secs_f64());
            }
            PlannedCount::Failed => {
                m.failovers.get_or_create(&planned("failed")).inc();
            }
        }
    }
}

/// The ordered update (`status.updatePhase`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Update;

impl Operation for Update {
    type Status = UpdateStatus;
    type Count = UpdateCount;

    fn what(self) -> &'static str {
        "the ordered update phase"
    }

    fn get(self, s: &GroupStatus) -> Option<UpdateStatus> {
        s.update_phase.clone()
    }

    fn set(self, s: &mut GroupStatus, next: UpdateStatus, _announced: bool) {
        s.update_phase = Some(next);
    }

    fn deadline(
        self,
        before: &UpdateStatus,
        next: &UpdateStatus,
        now: Timestamp,
        cfg: &GroupConfig,
    ) -> Option<Timestamp> {
        bloodraven_core::update::deadline_for(
            before,
            next,
            now,
            cfg.operation_timeouts.ordered_update,
        )
    }

    /// A new site is a new step, with a deadline of its own.
    fn keeps_deadline(self, before: &UpdateStatus, next: &UpdateStatus) -> bool {
        next.deadline.is_some() && next.phase == before.phase && next.site == before.site
    }

    fn set_deadline(self, next: &mut UpdateStatus, deadline: Option<Timestamp>) {
        next.deadline = deadline;
    }

    fn log(self, group: &str, _before: Option<&UpdateStatus>, next: &UpdateStatus) {
        tracing::info!(group = %group, phase = next.phase.as_str(), site = %next.site, message = %next.message, "ordered update: phase");
    }

    fn count(self, c: UpdateCount, group: &str, m: &Metrics) {
        let result = match c {
            UpdateCount::Succeeded => "succeeded",
            UpdateCount::Failed => "failed",
        };
        m.ordered_update_ended(group, result);
    }
}

/// The restore-in-place (`status.restoreInPlace`); its end counts as succeeded (`true`) or
/// failed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Restore;

impl Operation for Restore {
    type Status = RestoreStatus;
    type Count = bool;

    fn what(self) -> &'static str {
        "the restore-in-place phase"
    }

    fn get(self, s: &GroupStatus) -> Option<RestoreStatus> {
        s.restore_in_place.clone()
    }

    fn set(self, s: &mut GroupStatus, next: RestoreStatus, _announced: bool) {
        s.restore_in_place = Some(next);
    }

    fn deadline(
        self,
        before: &RestoreStatus,
        next: &RestoreStatus,
        now: Timestamp,
        cfg: &GroupConfig,
    ) -> Option<Timestamp> {
        bloodraven_core::restore::deadline_for(
            before,
            next,
            now,
            cfg.operation_timeouts.restore_in_place,
        )
    }

    fn keeps_deadline(self, before: &RestoreStatus, next: &RestoreStatus) -> bool {
        next.deadline.is_some() && next.phase == before.phase
    }

    fn set_deadline(self, next: &mut RestoreStatus, deadline: Option<Timestamp>) {
        next.deadline = deadline;
    }

    fn log(self, group: &str, _before: Option<&RestoreStatus>, next: &RestoreStatus) {
        tracing::info!(group = %group, phase = next.phase.as_str(), message = %next.message, "restore-in-place: phase");
    }

    fn count(self, ok: bool, group: &str, m: &Metrics) {
        m.restore_ended(group, if ok { "succeeded" } else { "failed" });
    }
}

/// The operations a poll advances step by step, each as far as it can go now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stepped {
    Planned,
    Restore,
    Update,
}

impl Stepped {
    fn label(self) -> &'static str {
        match self {
            Stepped::Planned => "planned failover",
            Stepped::Restore => "restore-in-place",
            Stepped::Update => "ordered update",
        }
    }
}

impl<S: Site> Controller<S> {
    /// Advances `op` by at most [`MAX_STEPS_PER_POLL`] transitions, stopping where it waits;
    /// a step that fails is logged and tried again next poll (every step starts from the
    /// stored phase, so nothing is half-applied).
    pub(super) async fn advance_steps(&mut self, op: Stepped) {
        for _ in 0..MAX_STEPS_PER_POLL {
            let advanced = match op {
                Stepped::Planned => self.advance(Slot::Planned).await,
                Stepped::Restore => self.advance_restore().await,
                Stepped::Update => self.advance_update().await,
            };
            match advanced {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(group = %self.group(), step = e.step(), error = %e, "{}: a step failed; retried next poll", op.label());
                    return;
                }
            }
        }
    }

    /// `next` with the deadline of the phase it enters after `before` (or the one it keeps).
    pub(super) fn with_deadline<O: Operation>(
        &self,
        op: O,
        before: &O::Status,
        mut next: O::Status,
    ) -> O::Status {
        if !op.keeps_deadline(before, &next) {
            let deadline = op.deadline(before, &next, self.rt.now(), &self.rt.config);
            op.set_deadline(&mut next, deadline);
        }
        next
    }

    /// Persists a step of `op` that followed `before` (the status the step was decided on):
    /// the next status with its deadline, through the writer; then its log line, its notes
    /// as events and its count. `Ok(again)`: whether the next step can run at once.
    pub(super) async fn persist_op<O: Operation>(
        &self,
        op: O,
        before: Option<&O::Status>,
        p: Persist<O::Status, O::Count>,
    ) -> Result<bool, ControllerError> {
        let next = match before {
            Some(b) => self.with_deadline(op, b, p.next),
            None => p.next,
        };
        self.persist_status(op.what(), |s| op.set(s, next.clone(), false))
            .await?;
        op.log(self.group(), before, &next);
        self.notes_and_count(op, p.notes, p.count).await;
        Ok(p.again)
    }

    /// Records an operation's notes as events and counts its end.
    pub(super) async fn notes_and_count<O: Operation>(
        &self,
        op: O,
        notes: impl IntoIterator<Item = Note>,
        count: Option<O::Count>,
    ) {
        for n in notes {
            self.note(n).await;
        }
        if let Some(c) = count {
            op.count(c, self.group(), self.metrics());
        }
    }
}
