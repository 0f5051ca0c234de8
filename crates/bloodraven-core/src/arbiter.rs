//! The arbiter: the one place that decides which day-2 operation may start while others run.
//!
//! # Terminology
//! - **Operation**: a planned failover, an ordered update, a restore-in-place, a reclone, a
//!   backup.
//! - **Running**: the operations a group's status shows in progress ([`Running::of`]), each
//!   with its phase. A **child** runs inside its parent and is never judged on its own: the
//!   ordered update's own switchover (`status.updatePhase.switchover`, a planned failover's
//!   machine) and the reclones a restore-in-place starts (`fromPrimary`).
//! - **Requested**: an operation someone asks for now ([`Requested`]).
//!
//! # Invariants
//! - [`admit`] is the only function that compares what runs with what is asked; the
//!   operations' own modules ask it and never look at each other's phases.
//! - [`TABLE`] is the whole policy, written once: for each (running, requested) pair, start,
//!   refuse, or "the same request" (a request already taken, answered once, not run twice).
//! - Two exclusive operations never run together. The one exception is written in the table:
//!   a planned failover may start while a reclone runs (the reclone then ends
//!   `ActiveSiteChanged`, its target untouched or blocked as docs/reclone.md says).
//! - A backup holds nothing and is held by nothing but another backup: it reads a replica's
//!   data and changes nothing. What runs beside it decides its *source* instead
//!   ([`crate::backup::source`]): never a site being recloned, none while a restore-in-place
//!   runs; a backup whose source stops being fit is abandoned and taken again elsewhere.
//! - Emergency failover is not an operation here: it is never held by one (docs/failover.md).

use std::fmt;

use crate::status::GroupStatus;

/// The kinds of day-2 operation the arbiter judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    PlannedFailover,
    OrderedUpdate,
    RestoreInPlace,
    Reclone,
    Backup,
}

impl Kind {
    /// Every kind, in the table's order.
    pub const ALL: [Kind; 5] = [
        Kind::PlannedFailover,
        Kind::OrderedUpdate,
        Kind::RestoreInPlace,
        Kind::Reclone,
        Kind::Backup,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PlannedFailover => "planned failover",
            Kind::OrderedUpdate => "ordered update",
            Kind::RestoreInPlace => "restore-in-place",
            Kind::Reclone => "reclone",
            Kind::Backup => "backup",
        }
    }

    fn index(self) -> usize {
        match self {
            Kind::PlannedFailover => 0,
            Kind::OrderedUpdate => 1,
            Kind::RestoreInPlace => 2,
            Kind::Reclone => 3,
            Kind::Backup => 4,
        }
    }
}

/// What the table says of one (running, requested) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The requested one may start beside the running one.
    Start,
    /// It is refused while the running one runs (asked again once it has ended).
    Refuse,
    /// The same kind: the same request is the one running (taken); another is refused.
    Own,
}

/// Rows: the operation running; columns: the operation requested (both in [`Kind::ALL`]'s
/// order: planned failover, ordered update, restore-in-place, reclone, backup).
pub const TABLE: [[Rule; 5]; 5] = {
    use Rule::{Own, Refuse, Start};
    [
        // running planned failover (a backup may start: its source is a replica)
        [Own, Refuse, Refuse, Refuse, Start],
        // running ordered update (its switchover is its child)
        [Refuse, Own, Refuse, Refuse, Start],
        // running restore-in-place (its reclones are its children); a backup may be asked
        // for, and its source waits until the restore ends
        [Refuse, Refuse, Own, Refuse, Start],
        // running reclone: a planned failover may start (the reclone then ends
        // ActiveSiteChanged); a backup, never on the recloned site
        [Start, Refuse, Refuse, Own, Start],
        // running backup: holds nothing (one whose source stops being fit is abandoned)
        [Start, Start, Start, Start, Own],
    ]
};

/// The rule for `requested` while `running` runs.
pub fn rule(running: Kind, requested: Kind) -> Rule {
    TABLE[running.index()][requested.index()]
}

/// One operation in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InProgress {
    pub kind: Kind,
    /// What names it: the failover's target, the update's request id, the restore's
    /// `confirm`, the reclone's site, the backup's id.
    pub key: String,
    /// Its phase, for messages.
    pub phase: &'static str,
}

impl fmt::Display for InProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::PlannedFailover => write!(f, "a planned failover to {}", self.key),
            Kind::OrderedUpdate => write!(f, "an ordered update ({})", self.key),
            Kind::RestoreInPlace => write!(f, "a restore-in-place (confirm {})", self.key),
            Kind::Reclone => write!(f, "a reclone of {}", self.key),
            Kind::Backup => write!(f, "backup {}", self.key),
        }?;
        write!(f, " ({})", self.phase)
    }
}

/// The operations a group runs, children left out (they are their parents' part).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Running(pub Vec<InProgress>);

impl Running {
    /// What `status` shows in progress: a planned failover, an ordered update (its
    /// switchover is its child), a restore-in-place (the reclones it started are its
    /// children), and the reclones someone asked for.
    pub fn of(status: &GroupStatus) -> Running {
        let mut v = Vec::new();
        if let Some(p) = status
            .planned_failover
            .as_ref()
            .filter(|p| !p.phase.is_terminal())
        {
            v.push(InProgress {
                kind: Kind::PlannedFailover,
                key: p.target.clone(),
                phase: p.phase.as_str(),
            });
        }
        if let Some(u) = status.update_phase.as_ref().filter(|u| u.in_flight()) {
            v.push(InProgress {
                kind: Kind::OrderedUpdate,
                key: u.request_id.clone(),
                phase: u.phase.as_str(),
            });
        }
        let restoring = status.restore_in_place.as_ref().filter(|r| r.in_flight());
        if let Some(r) = restoring {
            v.push(InProgress {
                kind: Kind::RestoreInPlace,
                key: r.confirm_token_used.clone(),
                phase: r.phase.as_str(),
            });
        }
        for s in &status.sites {
            let Some(r) = s.reclone.as_ref().filter(|r| !r.phase.is_terminal()) else {
                continue;
            };
            // A restore's own reclone is its child.
            if restoring.is_some() && r.from_primary {
                continue;
            }
            v.push(InProgress {
                kind: Kind::Reclone,
                key: s.name.clone(),
                phase: r.phase.as_str(),
            });
        }
        if let Some(b) = status.backups.as_ref().and_then(|b| b.running()) {
            v.push(InProgress {
                kind: Kind::Backup,
                key: b.id.clone(),
                phase: b.phase.as_str(),
            });
        }
        Running(v)
    }

    /// The running operation of `kind`, if any.
    pub fn get(&self, kind: Kind) -> Option<&InProgress> {
        self.0.iter().find(|r| r.kind == kind)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An operation asked for: its kind and what names it (as [`InProgress::key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requested {
    pub kind: Kind,
    pub key: String,
}

impl Requested {
    pub fn new(kind: Kind, key: impl Into<String>) -> Requested {
        Requested {
            kind,
            key: key.into(),
        }
    }
}

/// The arbiter's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// It may start.
    Start,
    /// It is the operation already running (a request taken before): nothing to start.
    Taken,
    /// Refused while `by` runs; the text says so, for the request's event.
    Refused { by: InProgress },
}

impl Answer {
    /// The refusal's reason, as a sentence's start (`a reclone of pdx (Copying) is in
    /// progress`), if refused.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Answer::Refused { by } => Some(format!("{by} is in progress")),
            _ => None,
        }
    }
}

/// Whether `requested` may start while `running` runs: the first running operation whose
/// rule refuses it refuses it; the same request already running is taken.
pub fn admit(running: &Running, requested: &Requested) -> Answer {
    for r in &running.0 {
        match rule(r.kind, requested.kind) {
            Rule::Start => {}
            Rule::Own if r.key == requested.key => return Answer::Taken,
            Rule::Own | Rule::Refuse => return Answer::Refused { by: r.clone() },
        }
    }
    Answer::Start
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{
        PlannedFailoverPhase, PlannedFailoverStatus, RestorePhase, RestoreStatus, SiteStatus,
        UpdatePhase, UpdateStatus,
    };
    use crate::time::Timestamp;

    fn t() -> Timestamp {
        Timestamp::from_unix_seconds(1_800_000_000)
    }

    /// A status with `kind` running, named `key`.
    fn running(kind: Kind, key: &str) -> GroupStatus {
        let mut s = GroupStatus {
            active_site: "iad".into(),
            ..GroupStatus::default()
        };
        match kind {
            Kind::PlannedFailover => {
                s.planned_failover = Some(PlannedFailoverStatus {
                    phase: PlannedFailoverPhase::Draining,
                    ..PlannedFailoverStatus::requested(key, "iad", t())
                });
            }
            Kind::OrderedUpdate => {
                s.update_phase = Some(UpdateStatus {
                    phase: UpdatePhase::UpdatingReplicas,
                    ..UpdateStatus::requested(key, t())
                });
            }
            Kind::RestoreInPlace => {
                s.restore_in_place = Some(RestoreStatus {
                    phase: RestorePhase::Loading,
                    target_fenced: true,
                    ..RestoreStatus::accepted(
                        "iad".into(),
                        key.into(),
                        "/dump.sql".into(),
                        t(),
                        "iad".into(),
                        1,
                    )
                });
            }
            Kind::Reclone => {
                let mut r = crate::reclone::accepted(&s, key);
                r.phase = crate::status::ReclonePhase::Copying;
                s.sites.push(SiteStatus {
                    name: key.into(),
                    reclone: Some(r),
                    ..SiteStatus::default()
                });
            }
            Kind::Backup => {
                s.backups = Some(crate::status::BackupsStatus {
                    last: Some(crate::status::BackupRecord {
                        id: key.into(),
                        phase: crate::status::BackupPhase::Running,
                        site: "pdx".into(),
                        gtid_position: String::new(),
                        topology_generation: 1,
                        start_time: Some(t()),
                        completion_time: None,
                        bytes: 0,
                        message: String::new(),
                        from_primary: false,
                    }),
                    ..crate::status::BackupsStatus::default()
                });
            }
        }
        s
    }

    /// Every (running, requested) pair: the answer the table gives, from a real status.
    #[test]
    fn every_pair_of_running_and_requested_gets_the_tables_answer() {
        for run in Kind::ALL {
            let status = running(run, "x");
            let r = Running::of(&status);
            assert_eq!(r.0.len(), 1, "{run:?}: {r:?}");
            for req in Kind::ALL {
                let other = admit(&r, &Requested::new(req, "y"));
                let same = admit(&r, &Requested::new(req, "x"));
                match rule(run, req) {
                    Rule::Start => {
                        assert_eq!(other, Answer::Start, "{run:?} / {req:?}");
                        assert_eq!(same, Answer::Start, "{run:?} / {req:?}");
                    }
                    Rule::Refuse => {
                        assert!(matches!(other, Answer::Refused { .. }), "{run:?} / {req:?}");
                        assert!(matches!(same, Answer::Refused { .. }), "{run:?} / {req:?}");
                    }
                    Rule::Own => {
                        assert_eq!(run, req, "only the same kind owns its requests");
                        assert!(matches!(other, Answer::Refused { .. }), "{run:?}");
                        assert_eq!(same, Answer::Taken, "{run:?}");
                    }
                }
            }
            // Nothing running: everything starts.
            for req in Kind::ALL {
                assert_eq!(
                    admit(&Running::default(), &Requested::new(req, "y")),
                    Answer::Start
                );
            }
        }
        // The whole table, as docs/architecture.md shows it.
        assert_eq!(
            TABLE,
            [
                [
                    Rule::Own,
                    Rule::Refuse,
                    Rule::Refuse,
                    Rule::Refuse,
                    Rule::Start
                ],
                [
                    Rule::Refuse,
                    Rule::Own,
                    Rule::Refuse,
                    Rule::Refuse,
                    Rule::Start
                ],
                [
                    Rule::Refuse,
                    Rule::Refuse,
                    Rule::Own,
                    Rule::Refuse,
                    Rule::Start
                ],
                [
                    Rule::Start,
                    Rule::Refuse,
                    Rule::Refuse,
                    Rule::Own,
                    Rule::Start
                ],
                [
                    Rule::Start,
                    Rule::Start,
                    Rule::Start,
                    Rule::Start,
                    Rule::Own
                ],
            ]
        );
    }

    #[test]
    fn children_run_inside_their_parents_and_ended_operations_hold_nothing() {
        // A restore's own reclone is its child: only the restore runs.
        let mut s = running(Kind::RestoreInPlace, "c1");
        let mut child = crate::reclone::accepted(&s, "pdx");
        child.from_primary = true;
        child.phase = crate::status::ReclonePhase::Copying;
        s.sites.push(SiteStatus {
            name: "pdx".into(),
            reclone: Some(child),
            ..SiteStatus::default()
        });
        let r = Running::of(&s);
        assert_eq!(
            r.0.iter().map(|i| i.kind).collect::<Vec<_>>(),
            [Kind::RestoreInPlace]
        );
        // An update's switchover is its child: no planned failover runs beside it.
        let mut u = running(Kind::OrderedUpdate, "u1");
        if let Some(x) = u.update_phase.as_mut() {
            x.phase = UpdatePhase::FailingOver;
            x.switchover = Some(PlannedFailoverStatus {
                phase: PlannedFailoverPhase::Promoting,
                ..PlannedFailoverStatus::requested("pdx", "iad", t())
            });
        }
        assert_eq!(Running::of(&u).0.len(), 1);
        // Ended operations hold nothing.
        let mut ended = running(Kind::PlannedFailover, "pdx");
        if let Some(p) = ended.planned_failover.as_mut() {
            p.phase = PlannedFailoverPhase::Failed;
        }
        let mut done_reclone = crate::reclone::accepted(&ended, "reader");
        done_reclone.phase = crate::status::ReclonePhase::Succeeded;
        ended.sites.push(SiteStatus {
            name: "reader".into(),
            reclone: Some(done_reclone),
            ..SiteStatus::default()
        });
        assert!(Running::of(&ended).is_empty());
        // An ended backup holds nothing; a running one only another backup.
        let mut b = running(Kind::Backup, "b1");
        assert_eq!(
            admit(&Running::of(&b), &Requested::new(Kind::Backup, "b2"))
                .refusal()
                .as_deref(),
            Some("backup b1 (Running) is in progress")
        );
        if let Some(last) = b.backups.as_mut().and_then(|x| x.last.as_mut()) {
            last.phase = crate::status::BackupPhase::Succeeded;
        }
        assert!(Running::of(&b).is_empty());
        // The refusal names what runs, and its phase.
        let a = admit(
            &Running::of(&running(Kind::Reclone, "pdx")),
            &Requested::new(Kind::OrderedUpdate, "u"),
        );
        assert_eq!(
            a.refusal().as_deref(),
            Some("a reclone of pdx (Copying) is in progress")
        );
    }
}
