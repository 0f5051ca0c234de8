//! Decision tables for the ordered update: requests, the order, the waits, the switchover's
//! mirror, and the emergency that ends it.

use super::*;
use crate::reason::DeferReason;
use crate::status::Admission;
use crate::view::ReplicaView;

fn t(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_800_000_000 + s)
}

/// `iad` writable, `pdx` and `reader` caught-up replicas of it.
fn sites(active: &str) -> Vec<SiteView> {
    let names = ["iad", "pdx", "reader"];
    let a = names.iter().position(|n| *n == active).unwrap();
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut v = SiteView::answered(
                n,
                i,
                if i == a {
                    SiteState::Writable
                } else {
                    SiteState::ReadOnly
                },
                "0-1-10",
            );
            if *n == "reader" {
                v.role = SiteRole::ReadOnly;
            }
            if i != a {
                v.replica = Some(ReplicaView {
                    io_running: true,
                    sql_running: true,
                    source_host: "127.0.0.1".into(),
                    source_port: 3300 + u16::try_from(a).unwrap(),
                    seconds_behind: Some(0),
                });
            }
            v
        })
        .collect()
}

fn all() -> Vec<Updatable> {
    ["iad", "pdx", "reader"]
        .map(|s| Updatable {
            site: s.into(),
            timeout: Duration::from_secs(60),
        })
        .to_vec()
}

fn facts<'a>(sites: &'a [SiteView], active: &'a str, gen_: u64, up: &'a [Updatable]) -> Facts<'a> {
    Facts {
        sites,
        active_site: active,
        topology_generation: gen_,
        updatable: up,
        current: &[],
        phase_timeout: Duration::from_secs(3600),
    }
}

/// The persisted status, the last note recorded with it, and the count.
fn persisted(s: Step) -> (UpdateStatus, Option<Note>, Option<Count>) {
    match s {
        Step::Persist(Persist {
            next, notes, count, ..
        }) => (next, notes.last().cloned(), count),
        other => panic!("expected a persist, got {other:?}"),
    }
}

/// What a fresh drift request (`drift-1`, made at 0 s) does at 1 s, persisted.
fn first_step(f: &Facts<'_>) -> (UpdateStatus, Option<Note>, Option<Count>) {
    persisted(step(
        Some(&UpdateStatus::requested("drift-1", t(0))),
        f,
        t(1),
    ))
}

#[test]
fn a_request_runs_once_and_never_beside_another_operation() {
    let up = all();
    let running = UpdateStatus {
        phase: UpdatePhase::UpdatingReplicas,
        ..UpdateStatus::requested("r1", t(0))
    };
    let done = UpdateStatus {
        phase: UpdatePhase::Succeeded,
        ..UpdateStatus::requested("r1", t(0))
    };
    let with = |u: Option<&UpdateStatus>| crate::status::GroupStatus {
        active_site: "iad".into(),
        update_phase: u.cloned(),
        ..crate::status::GroupStatus::default()
    };
    assert!(matches!(
        request("r1", &with(None), &up, t(1)),
        Request::Accept(u) if u.phase == UpdatePhase::Pending && u.request_id == "r1"
    ));
    // The same id: the update in flight, or one that ran (a request id runs once).
    assert_eq!(
        request("r1", &with(Some(&running)), &up, t(1)),
        Request::Taken
    );
    assert_eq!(request("r1", &with(Some(&done)), &up, t(1)), Request::Taken);
    // Another id while one runs, or beside another operation (the arbiter's answer), or with
    // nothing to update.
    let mut planned = with(None);
    planned.planned_failover = Some(crate::status::PlannedFailoverStatus {
        phase: crate::status::PlannedFailoverPhase::Draining,
        ..crate::status::PlannedFailoverStatus::requested("pdx", "iad", t(0))
    });
    let mut recloning = with(None);
    let mut rc = crate::reclone::accepted(&recloning, "pdx");
    rc.phase = crate::status::ReclonePhase::Copying;
    recloning.sites.push(crate::status::SiteStatus {
        name: "pdx".into(),
        reclone: Some(rc),
        ..crate::status::SiteStatus::default()
    });
    for (status, up, why) in [
        (with(Some(&running)), &up[..], "an ordered update (r1"),
        (planned, &up[..], "a planned failover to pdx"),
        (recloning, &up[..], "a reclone of pdx"),
        (with(None), &[][..], "no site needs an update"),
    ] {
        match request("r2", &status, up, t(1)) {
            Request::Reject(n) => {
                assert_eq!(n.reason, EventReason::OrderedUpdateRejected);
                assert!(n.message.contains(why), "{why}: {}", n.message);
            }
            other => panic!("{why}: {other:?}"),
        }
    }
    // A finished update with another id does not stop a new one.
    assert!(matches!(
        request("r2", &with(Some(&done)), &up, t(1)),
        Request::Accept(_)
    ));
}

#[test]
fn the_replicas_go_first_one_at_a_time_then_one_switchover_then_the_old_primary() {
    let up = all();
    let v = sites("iad");
    let f = facts(&v, "iad", 3, &up);
    assert_eq!(order(&f), ["pdx", "reader", "iad"]);
    // Pending: the first replica, the old primary and the generation recorded.
    let (u, note, _) = persisted(step(Some(&UpdateStatus::requested("r", t(0))), &f, t(1)));
    assert_eq!(
        (
            u.phase,
            u.site.as_str(),
            u.old_primary.as_str(),
            u.topology_generation
        ),
        (UpdatePhase::UpdatingReplicas, "pdx", "iad", 3)
    );
    assert_eq!(note.unwrap().reason, EventReason::OrderedUpdateStarted);
    // Caught up before its update: run it, within what is left of its timeout.
    assert_eq!(
        step(Some(&u), &f, t(11)),
        Step::Update {
            site: "pdx".into(),
            timeout: Duration::from_secs(50)
        }
    );
    // Updated: wait for it to come back.
    let (u, _, _) = persisted(finish(&u, Done::Updated, t(20)));
    assert_eq!(
        (u.phase, u.site_updated),
        (UpdatePhase::WaitingForReplica, true)
    );
    let mut down = v.clone();
    down[1].state = SiteState::Unreachable;
    down[1].answered = false;
    assert_eq!(
        step(Some(&u), &facts(&down, "iad", 3, &up), t(30)),
        Step::Wait
    );
    // Back and caught up: the next replica (the reader is updated, never promoted).
    let (u, note, _) = persisted(step(Some(&u), &f, t(31)));
    assert_eq!(
        (u.phase, u.site.as_str()),
        (UpdatePhase::UpdatingReplicas, "reader")
    );
    assert_eq!(u.sites_done, ["pdx"]);
    assert_eq!(note.unwrap().reason, EventReason::SiteUpdated);
    let (u, _, _) = persisted(finish(&u, Done::Updated, t(40)));
    // Every replica done: one switchover, to an updated primary candidate (not the reader).
    let (u, note, _) = persisted(step(Some(&u), &f, t(41)));
    assert_eq!(
        (u.phase, u.site.as_str()),
        (UpdatePhase::FailingOver, "pdx")
    );
    let sw = u.switchover.clone().unwrap();
    assert_eq!((sw.target.as_str(), sw.source.as_str()), ("pdx", "iad"));
    assert_eq!(note.unwrap().reason, EventReason::OrderedUpdateFailingOver);
    assert_eq!(step(Some(&u), &f, t(42)), Step::Switchover);
    // The switchover succeeded (its own generation bump recorded with it): the old primary.
    let mut u = u;
    u.switchover = Some(sw.ended(PlannedFailoverPhase::Succeeded, t(50)));
    u.topology_generation = 4;
    let v2 = sites("pdx");
    let f2 = facts(&v2, "pdx", 4, &up);
    let (u, _, _) = persisted(step(Some(&u), &f2, t(51)));
    assert_eq!(
        (u.phase, u.site.as_str()),
        (UpdatePhase::UpdatingOldPrimary, "iad")
    );
    assert!(matches!(step(Some(&u), &f2, t(52)), Step::Update { site, .. } if site == "iad"));
    let (u, _, _) = persisted(finish(&u, Done::Updated, t(60)));
    assert_eq!(u.phase, UpdatePhase::UpdatingOldPrimary);
    let (u, note, count) = persisted(step(Some(&u), &f2, t(61)));
    assert_eq!(u.phase, UpdatePhase::Succeeded);
    assert_eq!(u.sites_done, ["pdx", "reader", "iad"]);
    assert_eq!(u.completion_time, Some(t(61)));
    assert_eq!(note.unwrap().reason, EventReason::OrderedUpdateSucceeded);
    assert_eq!(count, Some(Count::Succeeded));
    assert_eq!(step(Some(&u), &f2, t(62)), Step::Idle);
}

#[test]
fn a_site_that_is_not_caught_up_or_does_not_come_back_stops_the_update() {
    let up = all();
    let mut v = sites("iad");
    v[1].replica.as_mut().unwrap().seconds_behind = Some(30);
    let f = facts(&v, "iad", 3, &up);
    let u = UpdateStatus {
        phase: UpdatePhase::UpdatingReplicas,
        site: "pdx".into(),
        old_primary: "iad".into(),
        topology_generation: 3,
        site_start: Some(t(0)),
        deadline: Some(t(3600)),
        ..UpdateStatus::requested("r", t(0))
    };
    // Lagging before its update: wait, then fail without updating it.
    assert_eq!(step(Some(&u), &f, t(59)), Step::Wait);
    let (n, _, count) = persisted(step(Some(&u), &f, t(60)));
    assert_eq!(
        (n.phase, n.reason),
        (UpdatePhase::Failed, Some(UpdateFailure::SiteNotCaughtUp))
    );
    assert_eq!(count, Some(Count::Failed));
    // Updated, never back within its timeout.
    let waiting = UpdateStatus {
        phase: UpdatePhase::WaitingForReplica,
        site_updated: true,
        ..u.clone()
    };
    let (n, _, _) = persisted(step(Some(&waiting), &f, t(60)));
    assert_eq!(n.reason, Some(UpdateFailure::SiteUnhealthy));
    assert!(n.message.contains("pdx"), "{}", n.message);
    // The update itself failed (a command that exited non-zero, or ran past its timeout).
    let (n, _, _) = persisted(finish(
        &u,
        Done::Failed {
            error: "exit status 3".into(),
        },
        t(5),
    ));
    assert_eq!(n.reason, Some(UpdateFailure::UpdateFailed));
    assert!(n.message.contains("exit status 3"));
}

#[test]
fn the_primary_never_moves_onto_a_site_that_is_not_updated_and_caught_up() {
    let up = all();
    let mut v = sites("iad");
    v[1].replica.as_mut().unwrap().io_running = false; // pdx broke after its update
    let f = facts(&v, "iad", 3, &up);
    let u = UpdateStatus {
        phase: UpdatePhase::WaitingForReplica,
        site: "reader".into(),
        site_updated: true,
        sites_done: vec!["pdx".into()],
        old_primary: "iad".into(),
        topology_generation: 3,
        site_start: Some(t(0)),
        deadline: Some(t(3600)),
        ..UpdateStatus::requested("r", t(0))
    };
    let (n, _, _) = persisted(step(Some(&u), &f, t(1)));
    assert_eq!(
        (n.phase, n.reason),
        (UpdatePhase::Failed, Some(UpdateFailure::NoCandidate))
    );
    assert!(n.switchover.is_none());
    // A group whose only updatable site is the active one fails before touching anything.
    let only = vec![Updatable {
        site: "iad".into(),
        timeout: Duration::from_secs(60),
    }];
    let (n, _, _) = persisted(step(
        Some(&UpdateStatus::requested("r", t(0))),
        &facts(&sites("iad"), "iad", 3, &only),
        t(1),
    ));
    assert_eq!(n.reason, Some(UpdateFailure::NoCandidate));
}

#[test]
fn a_deferred_switchover_shows_on_the_update_and_the_update_goes_on_after_it() {
    let up = all();
    let v = sites("iad");
    let f = facts(&v, "iad", 3, &up);
    let mut sw = PlannedFailoverStatus::requested("pdx", "iad", t(0));
    sw.phase = PlannedFailoverPhase::Deferred;
    sw.admission = Admission {
        defer_reason: Some(DeferReason::DeploymentHold),
        retry_time: Some(t(90)),
        message: "held by deploy-7".into(),
    };
    let u = UpdateStatus {
        phase: UpdatePhase::FailingOver,
        site: "pdx".into(),
        sites_done: vec!["pdx".into(), "reader".into()],
        old_primary: "iad".into(),
        topology_generation: 3,
        switchover: Some(sw.clone()),
        ..UpdateStatus::requested("r", t(0))
    };
    let (d, _, _) = persisted(step(Some(&u), &f, t(1)));
    assert_eq!(d.phase, UpdatePhase::Deferred);
    assert_eq!(d.admission.as_ref().unwrap().retry_time, Some(t(90)));
    // Still deferred, same block: drive the switchover (its admission looks again).
    assert_eq!(step(Some(&d), &f, t(2)), Step::Switchover);
    // The retry time moved with a renewal: shown.
    let mut d2 = d.clone();
    let mut sw2 = sw.clone();
    sw2.admission.retry_time = Some(t(120));
    d2.switchover = Some(sw2);
    let (d3, _, _) = persisted(step(Some(&d2), &f, t(3)));
    assert_eq!(d3.admission.unwrap().retry_time, Some(t(120)));
    // The hold lapsed: the switchover drains, the update shows FailingOver again.
    let mut going = d.clone();
    going.switchover = Some(sw.in_phase(PlannedFailoverPhase::Draining));
    let (g, _, _) = persisted(step(Some(&going), &f, t(4)));
    assert_eq!(
        (g.phase, g.admission.clone()),
        (UpdatePhase::FailingOver, None)
    );
    // A switchover that failed fails the update, saying why.
    let mut bad = g.clone();
    let mut swf = sw.ended(PlannedFailoverPhase::Failed, t(5));
    swf.reason = Some(crate::reason::FailureReason::LagTimeout);
    bad.switchover = Some(swf);
    let (b, _, _) = persisted(step(Some(&bad), &f, t(5)));
    assert_eq!(b.reason, Some(UpdateFailure::SwitchoverFailed));
    assert!(b.message.contains("LagTimeout"), "{}", b.message);
}

#[test]
fn an_emergency_failover_ends_the_update_wherever_it_is() {
    let up = all();
    let v = sites("pdx");
    let f = facts(&v, "pdx", 4, &up);
    for phase in [
        UpdatePhase::UpdatingReplicas,
        UpdatePhase::WaitingForReplica,
        UpdatePhase::FailingOver,
        UpdatePhase::Deferred,
        UpdatePhase::UpdatingOldPrimary,
    ] {
        let u = UpdateStatus {
            phase,
            site: "reader".into(),
            old_primary: "iad".into(),
            topology_generation: 3,
            switchover: Some(PlannedFailoverStatus::requested("pdx", "iad", t(0))),
            ..UpdateStatus::requested("r", t(0))
        };
        let (n, note, _) = persisted(step(Some(&u), &f, t(1)));
        assert_eq!(
            (n.phase, n.reason),
            (UpdatePhase::Failed, Some(UpdateFailure::EmergencyFailover)),
            "{phase:?}"
        );
        assert_eq!(note.unwrap().reason, EventReason::OrderedUpdateFailed);
        assert!(n.message.contains("pdx"), "{}", n.message);
    }
}

#[test]
fn a_drifted_primary_moves_to_a_current_candidate_without_updating_the_replicas() {
    // Kubernetes mode: only iad's Pod drifted; pdx and the reader are at their update
    // revision. The update fails over to pdx (current counts as updated), then updates iad.
    let v = sites("iad");
    let up = vec![Updatable {
        site: "iad".into(),
        timeout: Duration::from_secs(60),
    }];
    let current = vec!["pdx".to_string(), "reader".to_string()];
    let f = Facts {
        current: &current,
        ..facts(&v, "iad", 4, &up)
    };
    let (next, _, _) = first_step(&f);
    assert_eq!(next.phase, UpdatePhase::FailingOver, "{next:?}");
    assert_eq!(next.site, "pdx");
    assert_eq!(next.switchover.as_ref().unwrap().target, "pdx");
    assert!(next.sites_done.is_empty());
    // Without a current candidate it fails before touching anything, as before.
    let f = facts(&v, "iad", 4, &up);
    let (next, _, count) = first_step(&f);
    assert_eq!(next.phase, UpdatePhase::Failed);
    assert_eq!(next.reason, Some(UpdateFailure::NoCandidate));
    assert_eq!(count, Some(Count::Failed));
    // A current reader is never a candidate.
    let only_reader = vec!["reader".to_string()];
    let f = Facts {
        current: &only_reader,
        ..facts(&v, "iad", 4, &up)
    };
    let (next, _, _) = first_step(&f);
    assert_eq!(next.phase, UpdatePhase::Failed, "{next:?}");
}

#[test]
fn a_drift_names_its_request_once_whatever_the_order() {
    let a = |pairs: &[(&str, &str)]| {
        drift_request_id(
            &pairs
                .iter()
                .map(|(s, r)| ((*s).to_string(), (*r).to_string()))
                .collect::<Vec<_>>(),
        )
    };
    let one = a(&[("iad", "mysql-iad-7f"), ("pdx", "mysql-pdx-7f")]);
    assert_eq!(one, a(&[("pdx", "mysql-pdx-7f"), ("iad", "mysql-iad-7f")]));
    assert!(one.starts_with("drift-") && one.len() == 22, "{one}");
    assert_ne!(one, a(&[("iad", "mysql-iad-80"), ("pdx", "mysql-pdx-7f")]));
    assert_ne!(one, a(&[("iad", "mysql-iad-7f")]));
    // Site and revision are kept apart: no two pairs run together into the same text.
    assert_ne!(a(&[("ia", "dx")]), a(&[("i", "adx")]));
}

/// Each step of an ordered update is bounded by `spec.operationTimeouts.orderedUpdate`: past
/// it the update fails (`TimedOut`, event `OperationTimedOut`); a switchover in flight is
/// never cut short from outside (it has bounds of its own).
#[test]
fn a_step_past_its_deadline_fails_the_update_but_a_running_switchover_is_left_to_its_own_bound() {
    let up = all();
    let v = sites("iad");
    let f = facts(&v, "iad", 3, &up);
    let waiting = UpdateStatus {
        phase: UpdatePhase::WaitingForReplica,
        site: "pdx".into(),
        site_updated: true,
        old_primary: "iad".into(),
        topology_generation: 3,
        site_start: Some(t(0)),
        deadline: Some(t(30)),
        ..UpdateStatus::requested("r", t(0))
    };
    let (n, note, count) = persisted(step(Some(&waiting), &f, t(30)));
    assert_eq!(
        (n.phase, n.reason),
        (UpdatePhase::Failed, Some(UpdateFailure::TimedOut))
    );
    assert_eq!(n.deadline, None);
    assert!(
        n.message.contains("WaitingForReplica at pdx"),
        "{}",
        n.message
    );
    assert_eq!(note.unwrap().reason, EventReason::OperationTimedOut);
    assert_eq!(count, Some(Count::Failed));
    // A status without a deadline gets one (now + the bound) before anything else.
    let old = UpdateStatus {
        deadline: None,
        ..waiting.clone()
    };
    let (n, _, _) = persisted(step(Some(&old), &f, t(10)));
    assert_eq!(
        (n.phase, n.deadline),
        (UpdatePhase::WaitingForReplica, Some(t(3610)))
    );
    // The switchover runs: the update waits for it, whatever its own deadline says.
    let failing_over = UpdateStatus {
        phase: UpdatePhase::FailingOver,
        switchover: Some(crate::status::PlannedFailoverStatus {
            phase: crate::status::PlannedFailoverPhase::Draining,
            ..crate::status::PlannedFailoverStatus::requested("pdx", "iad", t(0))
        }),
        ..waiting.clone()
    };
    assert!(
        !matches!(
            step(Some(&failing_over), &f, t(4000)),
            Step::Persist(Persist { ref next, .. }) if next.reason == Some(UpdateFailure::TimedOut)
        ),
        "a running switchover was cut short"
    );
}
