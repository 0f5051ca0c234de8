//! Tables of admission, the state machine's steps and transitions, and the undo rules.

use std::time::Duration;

use super::machine::*;
use super::*;
use crate::config::SiteRole;
use crate::gtid::{GtidFlavor, GtidSet};
use crate::lease::LeaseKind;
use crate::lease::LeaseView;
use crate::status::SiteState;
use crate::time::Timestamp;
use crate::view::{ReplicaView, SiteView};

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
    assert_eq!(reason(admit(&input(&s, "nope"))).as_str(), "UnknownTarget");
    assert_eq!(
        reason(admit(&input(&s, "reader"))).as_str(),
        "TargetNotCandidate"
    );
    assert_eq!(reason(admit(&input(&s, "iad"))).as_str(), "AlreadyActive");
    s[1].replica = None;
    assert_eq!(
        reason(admit(&input(&s, "pdx"))).as_str(),
        "TargetNotReplicating"
    );
    s[1].state = SiteState::Unreachable;
    assert_eq!(reason(admit(&input(&s, "pdx"))).as_str(), "TargetNotReady");
    s[1].recovery_blocked = true;
    assert_eq!(
        reason(admit(&input(&s, "pdx"))).as_str(),
        "TargetRecoveryBlocked"
    );
    s[0].state = SiteState::ReadOnly;
    assert_eq!(
        reason(admit(&input(&s, "pdx"))).as_str(),
        "SourceNotWritable"
    );
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
        phase_timeout: Duration::from_secs(3600),
    }
}

fn pf(phase: PlannedFailoverPhase) -> PlannedFailoverStatus {
    PlannedFailoverStatus {
        phase,
        source: "iad".into(),
        source_gtid_executed: "0-1-5".into(),
        deadline: Some(t(3600)),
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
    assert_eq!(n.unwrap().reason, EventReason::PlannedFailoverAdmitting);
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
    assert_eq!(
        deferred.admission.defer_reason,
        Some(DeferReason::DeploymentHold)
    );
    assert_eq!(deferred.admission.retry_time, Some(t(30)));
    assert_eq!(n.unwrap().reason, EventReason::PlannedFailoverDeferred);
    assert_eq!(count, Some(Count::Deferred(DeferReason::DeploymentHold)));
    assert!(!again);
    // Unchanged: nothing to do.
    assert_eq!(
        step(Some(&deferred), &facts(&s, Some(&h)), t(11)),
        Step::Idle
    );
    // Renewed: retryTime moves, no new event, not counted again.
    let renewed = hold(40);
    let (moved, n, count, _) = persisted(step(Some(&deferred), &facts(&s, Some(&renewed)), t(12)));
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
    assert_eq!(failed.reason, Some(FailureReason::TargetNotReady));
    assert_eq!(failed.completion_time, Some(t(14)));
    assert_eq!(n.unwrap().reason, EventReason::PlannedFailoverFailed);
    assert_eq!(count, Some(Count::Failed));
    assert!(!again);
}

/// An outcome, the phase it leads to, the failure reason and the undo.
type Case = (
    PlannedFailoverPhase,
    Done,
    Option<PlannedFailoverPhase>,
    Option<FailureReason>,
    Undo,
);

/// One row per outcome: the transition, and what is undone on failure.
#[test]
fn each_outcome_leads_to_its_transition_with_the_typed_undo() {
    use PlannedFailoverPhase as P;
    let unfence = Undo::Unfence { site: "iad".into() };
    let cases: Vec<Case> = vec![
        (
            P::Draining,
            Done::Drained {
                source_gtid: "0-1-9".into(),
            },
            Some(P::WaitingForLag),
            None,
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
            Some(FailureReason::FenceFailed),
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
            Some(FailureReason::FenceFailed),
            Undo::ReadBackThenUnfence { site: "iad".into() },
        ),
        (
            P::Draining,
            Done::SourceUnreadable {
                error: "gone".into(),
            },
            Some(P::Failed),
            Some(FailureReason::SourceUnreadable),
            unfence.clone(),
        ),
        (
            P::WaitingForLag,
            Done::CaughtUp,
            Some(P::Promoting),
            None,
            Undo::Nothing,
        ),
        (
            P::WaitingForLag,
            Done::LagTimeout { missing: 3 },
            Some(P::Failed),
            Some(FailureReason::LagTimeout),
            unfence.clone(),
        ),
        (
            P::WaitingForLag,
            Done::CatchUpFailed {
                error: "gone".into(),
            },
            Some(P::Failed),
            Some(FailureReason::WaitFailed),
            unfence.clone(),
        ),
        (
            P::Promoting,
            Done::PromoteFailed {
                error: "refused".into(),
            },
            None,
            None,
            Undo::Nothing,
        ),
        (
            P::Resuming,
            Done::LiftFailed {
                error: "refused".into(),
            },
            None,
            None,
            Undo::Nothing,
        ),
        (
            P::Resuming,
            Done::Resumed {
                failures: vec![("reader".into(), "refused".into())],
            },
            Some(P::Succeeded),
            None,
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
                tr.note.as_ref().map(|n| n.reason.clone()),
                Some(EventReason::PlannedFailoverFailed)
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

/// A group status whose planned failover is `pf` (its active site iad).
fn with_planned(pf: PlannedFailoverStatus) -> crate::status::GroupStatus {
    crate::status::GroupStatus {
        active_site: "iad".into(),
        planned_failover: Some(pf),
        ..crate::status::GroupStatus::default()
    }
}

#[test]
fn a_second_request_while_one_is_in_flight_is_dropped() {
    let current = pf(PlannedFailoverPhase::Draining);
    match request("reader", &with_planned(current), t(5)) {
        Request::Reject(n) => {
            assert_eq!(n.reason, EventReason::PlannedFailoverRejected);
            assert!(n.message.contains("reader"));
        }
        other => panic!("{other:?}"),
    }
    let done = pf(PlannedFailoverPhase::Succeeded);
    match request("pdx", &with_planned(done), t(5)) {
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
        request(&current.target, &with_planned(current.clone()), t(5)),
        Request::Taken
    );
    let draining = pf(PlannedFailoverPhase::Draining);
    assert_eq!(
        request(&draining.target, &with_planned(draining.clone()), t(5)),
        Request::Taken
    );
}

/// Past its deadline, a phase before the announcement is abandoned (the source keeps the
/// primary, its fence read back and lifted); `Resuming` rolls back as a new topology change.
#[test]
fn a_phase_past_its_deadline_ends_timed_out_and_resuming_rolls_back() {
    use PlannedFailoverPhase as P;
    let s = sites();
    let f = facts(&s, None);
    for phase in [P::Draining, P::WaitingForLag, P::Promoting] {
        let mut late = pf(phase);
        late.deadline = Some(t(100));
        let Step::Abandon(tr) = step(Some(&late), &f, t(100)) else {
            panic!("{phase:?} past its deadline is not abandoned");
        };
        let next = tr.next.expect("a failed status");
        assert_eq!(
            (next.phase, next.reason),
            (P::Failed, Some(FailureReason::TimedOut))
        );
        assert_eq!(next.deadline, None, "an ended failover has no deadline");
        assert_eq!(tr.undo, Undo::ReadBackThenUnfence { site: "iad".into() });
        assert!(tr.new_active_site.is_none() && tr.lift_after.is_none());
        assert_eq!(tr.note.unwrap().reason, EventReason::OperationTimedOut);
        assert_eq!(tr.count, Some(Count::Failed));
        // One second earlier it runs as usual.
        assert!(!matches!(
            step(Some(&late), &f, t(99)),
            Step::Abandon(_) | Step::SetDeadline(_)
        ));
    }
    let mut resuming = pf(P::Resuming);
    resuming.deadline = Some(t(100));
    assert_eq!(
        step(Some(&resuming), &f, t(101)),
        Step::RollBack {
            target: "pdx".into(),
            source: "iad".into()
        }
    );
    let back = finish(&resuming, Done::RollbackFenced, t(102));
    assert_eq!(
        back.new_active_site,
        Some(NewActiveSite {
            site: "iad".into(),
            promotion_gtid: "0-1-5".into()
        }),
        "the source is announced again: a new generation, every lease revoked"
    );
    assert_eq!(back.lift_after.as_deref(), Some("iad"));
    assert_eq!(back.undo, Undo::Nothing);
    assert_eq!(back.next.unwrap().reason, Some(FailureReason::TimedOut));
    let stuck = finish(
        &resuming,
        Done::RollbackUnfenced {
            error: "timeout".into(),
        },
        t(102),
    );
    assert!(stuck.new_active_site.is_none() && stuck.lift_after.is_none());
    assert_eq!(stuck.next.unwrap().phase, P::Failed);
    // Admission phases and ended failovers are not bounded by it.
    for phase in [P::Pending, P::Admitting, P::Succeeded, P::Failed] {
        let mut p = pf(phase);
        p.deadline = Some(t(0));
        assert!(!matches!(
            step(Some(&p), &f, t(100)),
            Step::Abandon(_) | Step::RollBack { .. } | Step::SetDeadline(_)
        ));
    }
}

/// A status without a deadline (written by an older version) gets one before anything runs;
/// a new phase gets `now + bound`, the same phase keeps its own, a deferral shows its retry.
#[test]
fn deadlines_are_set_per_phase() {
    use PlannedFailoverPhase as P;
    let s = sites();
    let f = facts(&s, None);
    let mut old = pf(P::Draining);
    old.deadline = None;
    let Step::SetDeadline(next) = step(Some(&old), &f, t(10)) else {
        panic!("no deadline set");
    };
    assert_eq!(next.deadline, Some(t(3610)));
    let bound = Duration::from_secs(60);
    let draining = pf(P::Draining);
    let lag = PlannedFailoverStatus {
        phase: P::WaitingForLag,
        deadline: None,
        ..draining.clone()
    };
    assert_eq!(deadline_for(&draining, &lag, t(5), bound), Some(t(65)));
    assert_eq!(
        deadline_for(&draining, &draining, t(5), bound),
        draining.deadline
    );
    let done = PlannedFailoverStatus {
        phase: P::Succeeded,
        ..draining.clone()
    };
    assert_eq!(deadline_for(&draining, &done, t(5), bound), None);
    let mut deferred = PlannedFailoverStatus {
        phase: P::Deferred,
        ..draining.clone()
    };
    deferred.admission.retry_time = Some(t(42));
    assert_eq!(deadline_for(&draining, &deferred, t(5), bound), Some(t(42)));
}
