//! Decision tables for restore-in-place: requests and their confirm, admission behind a hold,
//! the sequence, a failed load, the emergency that ends it, the reclones.

use super::*;
use crate::status::{RecloneStatus, SiteState, SiteStatus};
use std::time::Duration;

fn t(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_800_000_000 + s)
}

fn views() -> Vec<SiteView> {
    let mut v: Vec<SiteView> = ["iad", "pdx", "reader"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            SiteView::answered(
                n,
                i,
                if i == 0 {
                    SiteState::Writable
                } else {
                    SiteState::ReadOnly
                },
                "0-1-10",
            )
        })
        .collect();
    v[2].role = SiteRole::ReadOnly;
    v
}

fn group() -> GroupStatus {
    GroupStatus {
        active_site: "iad".into(),
        topology_generation: 4,
        ..GroupStatus::default()
    }
}

fn spec(confirm: &str, target: Option<&str>) -> RestoreInPlaceSpec {
    RestoreInPlaceSpec {
        confirm: confirm.into(),
        source: "/backups/orders.sql".into(),
        target: target.map(String::from),
    }
}

const C1: &str = "2027-01-15T10:00:00Z";
const C0: &str = "2027-01-15T09:00:00Z";

fn accepted(target: Option<&str>) -> RestoreStatus {
    match request(Some(&spec(C1, target)), &group(), &views(), t(0)) {
        Request::Accept(r) => r,
        other => panic!("{other:?}"),
    }
}

fn persisted(s: Step) -> (RestoreStatus, Vec<Note>) {
    match s {
        Step::Persist(Persist { next, notes, .. }) => (next, notes),
        other => panic!("expected a persist, got {other:?}"),
    }
}

#[test]
fn a_request_runs_once_per_confirm_and_never_beside_another_operation() {
    assert_eq!(request(None, &group(), &views(), t(0)), Request::None);
    let r = accepted(None);
    assert_eq!(
        (
            r.phase,
            r.target_site.as_str(),
            r.confirm_token_used.as_str()
        ),
        (RestorePhase::Pending, "iad", C1)
    );
    assert_eq!(
        (r.old_active_site.as_str(), r.topology_generation),
        ("iad", 4)
    );
    let mut g = group();
    g.restore_in_place = Some(RestoreStatus {
        phase: RestorePhase::Succeeded,
        ..r.clone()
    });
    // The same confirm is the one that ran; an older one is refused, saying why.
    assert_eq!(
        request(Some(&spec(C1, None)), &g, &views(), t(1)),
        Request::None
    );
    match request(Some(&spec(C0, None)), &g, &views(), t(1)) {
        Request::Refuse(m) => assert!(m.contains("not later than the confirmTokenUsed"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The same confirm for another dump is refused, saying why.
    let mut other = spec(C1, None);
    other.source = "/backups/other.sql".into();
    match request(Some(&other), &g, &views(), t(1)) {
        Request::Refuse(m) => assert!(m.contains("was used already"), "{m}"),
        x => panic!("{x:?}"),
    }
    // A later confirm runs again.
    assert!(matches!(
        request(
            Some(&spec("2027-01-15T11:00:00Z", None)),
            &g,
            &views(),
            t(1)
        ),
        Request::Accept(_)
    ));
    // Refused: a bad timestamp, a reader or unknown target, another operation.
    let mut busy = group();
    busy.sites.push(SiteStatus {
        name: "pdx".into(),
        reclone: Some(crate::reclone::accepted(&busy, "pdx")),
        ..SiteStatus::default()
    });
    for (s, g, why) in [
        (spec("yesterday", None), group(), "RFC 3339"),
        (spec(C1, Some("reader")), group(), "primary-candidate"),
        (spec(C1, Some("sfo")), group(), "not a site"),
        (spec(C1, None), busy, "a reclone of pdx"),
    ] {
        match request(Some(&s), &g, &views(), t(1)) {
            Request::Refuse(m) => assert!(m.contains(why), "{why}: {m}"),
            other => panic!("{why}: {other:?}"),
        }
    }
}

#[test]
fn it_defers_behind_a_live_hold_then_fences_loads_promotes_and_reclones() {
    let r = accepted(Some("pdx"));
    let mut g = group();
    g.restore_in_place = Some(r.clone());
    let names: Vec<String> = ["iad", "pdx", "reader"].map(String::from).to_vec();
    let hold = LeaseView {
        kind: crate::lease::LeaseKind::FailoverHold,
        operation_id: "mig-1".into(),
        instance: "app".into(),
        expires_at: t(60),
        topology_generation: 4,
    };
    let f = |g: &GroupStatus, hold: Option<&LeaseView>| -> Step {
        step(
            &Facts {
                status: g,
                site_names: &names,
                live_hold: hold,
                phase_timeout: Duration::from_secs(3600),
            },
            t(1),
        )
    };
    let (d, _) = persisted(f(&g, Some(&hold)));
    assert_eq!(d.phase, RestorePhase::Deferred);
    let a = d.admission.clone().unwrap();
    assert_eq!(
        (a.defer_reason, a.retry_time),
        (Some(DeferReason::DeploymentHold), Some(t(60)))
    );
    g.restore_in_place = Some(d);
    assert_eq!(f(&g, Some(&hold)), Step::Idle, "unchanged: nothing written");
    let (fencing, notes) = persisted(f(&g, None));
    assert_eq!(fencing.phase, RestorePhase::Fencing);
    assert_eq!(notes[0].reason, EventReason::RestoreStarted);
    g.restore_in_place = Some(fencing.clone());
    assert_eq!(
        f(&g, None),
        Step::Fence {
            active: "iad".into()
        }
    );
    assert!(fencing.holds_writes());
    let (mut loading, _) = persisted(finish(&fencing, Done::Fenced, t(2)));
    // The executor stamps each new phase's deadline as it persists it.
    loading.deadline = Some(t(3600));
    assert!(loading.target_fenced);
    g.restore_in_place = Some(loading.clone());
    assert_eq!(
        f(&g, None),
        Step::Load {
            target: "pdx".into(),
            source: "/backups/orders.sql".into()
        }
    );
    let (mut promoting, notes) = persisted(finish(&loading, Done::Loaded { bytes: 1234 }, t(3)));
    promoting.deadline = Some(t(3600));
    assert_eq!(
        (promoting.phase, promoting.bytes_loaded),
        (RestorePhase::Promoting, 1234)
    );
    assert_eq!(notes[0].reason, EventReason::RestoreLoaded);
    assert!(promoting.holds_writes(), "not announced yet");
    g.restore_in_place = Some(promoting.clone());
    assert_eq!(
        f(&g, None),
        Step::Promote {
            target: "pdx".into(),
            announced: false
        }
    );
    // Announced: its own generation bump, recorded with it.
    let mut announced = promoting.clone();
    announced.announced = true;
    announced.topology_generation = 5;
    assert!(!announced.holds_writes());
    g.topology_generation = 5;
    g.active_site = "pdx".into();
    let (mut recloning, _) = persisted(finish(&announced, Done::Promoted, t(4)));
    recloning.deadline = Some(t(3600));
    g.restore_in_place = Some(recloning.clone());
    // Every other site, in order, from the primary.
    assert_eq!(f(&g, None), Step::Reclone { site: "iad".into() });
    let mut rc = reclone_of(&recloning, &g);
    assert!(rc.from_primary);
    g.sites.push(SiteStatus {
        name: "iad".into(),
        reclone: Some(rc.clone()),
        ..SiteStatus::default()
    });
    assert_eq!(f(&g, None), Step::Wait);
    rc.phase = ReclonePhase::Succeeded;
    g.sites[0].reclone = Some(rc.clone());
    let (after_iad, _) = persisted(f(&g, None));
    assert_eq!(after_iad.recloned, ["iad"]);
    g.restore_in_place = Some(after_iad);
    assert_eq!(
        f(&g, None),
        Step::Reclone {
            site: "reader".into()
        }
    );
    g.sites.push(SiteStatus {
        name: "reader".into(),
        reclone: Some(RecloneStatus {
            phase: ReclonePhase::Succeeded,
            ..rc
        }),
        ..SiteStatus::default()
    });
    let (a, _) = persisted(f(&g, None));
    g.restore_in_place = Some(a);
    let (done, notes) = persisted(f(&g, None));
    assert_eq!(done.phase, RestorePhase::Succeeded);
    assert_eq!(done.recloned, ["iad", "reader"]);
    assert_eq!(notes[0].reason, EventReason::RestoreSucceeded);
}

#[test]
fn a_failed_load_leaves_the_target_fenced_and_an_emergency_ends_the_restore() {
    let r = accepted(None);
    let (loading, _) = persisted(finish(
        &RestoreStatus {
            phase: RestorePhase::Fencing,
            ..r.clone()
        },
        Done::Fenced,
        t(1),
    ));
    let (f1, notes) = persisted(finish(
        &loading,
        Done::LoadFailed {
            error: "ERROR 1064 (42000) at line 57".into(),
            bytes: 99,
        },
        t(2),
    ));
    assert_eq!(
        (f1.phase, f1.reason.clone(), f1.bytes_loaded),
        (RestorePhase::Failed, Some(RestoreFailure::LoadFailed), 99)
    );
    assert!(
        f1.message.contains("line 57") && f1.message.contains("stays fenced"),
        "{}",
        f1.message
    );
    assert!(
        f1.holds_writes(),
        "nothing is promoted onto a half-loaded site"
    );
    assert_eq!(notes[0].reason, EventReason::RestoreFailed);
    let (f2, _) = persisted(finish(
        &loading,
        Done::DumpInvalid {
            error: "no `-- Dump completed` line".into(),
        },
        t(2),
    ));
    assert_eq!(f2.reason, Some(RestoreFailure::DumpInvalid));
    assert!(f2.holds_writes());
    // The target died mid-load: an emergency failover moved the active site.
    let mut g = group();
    g.topology_generation = 5;
    g.active_site = "pdx".into();
    g.restore_in_place = Some(loading);
    let names: Vec<String> = ["iad", "pdx", "reader"].map(String::from).to_vec();
    let (e, _) = persisted(step(
        &Facts {
            status: &g,
            site_names: &names,
            live_hold: None,
            phase_timeout: Duration::from_secs(3600),
        },
        t(3),
    ));
    assert_eq!(e.reason, Some(RestoreFailure::ActiveSiteChanged));
    assert!(
        e.message
            .contains("pdx holds the data from before the restore"),
        "{}",
        e.message
    );
}

fn loading_into(target: &str, deadline: i64) -> RestoreStatus {
    RestoreStatus {
        phase: RestorePhase::Loading,
        target_fenced: true,
        deadline: Some(t(deadline)),
        ..accepted(Some(target))
    }
}

/// Past its deadline a restore fails `TimedOut` (event `OperationTimedOut`): fail-closed
/// before its announcement, writable after it; a status without a deadline gets one first.
#[test]
fn a_phase_past_its_deadline_fails_closed_before_the_announcement_and_open_after() {
    let names: Vec<String> = ["iad", "pdx", "reader"].map(String::from).to_vec();
    let facts = |g: &GroupStatus| {
        step(
            &Facts {
                status: g,
                site_names: &names,
                live_hold: None,
                phase_timeout: Duration::from_secs(600),
            },
            t(100),
        )
    };
    let mut g = group();
    g.restore_in_place = Some(loading_into("pdx", 100));
    let (r, notes) = persisted(facts(&g));
    assert_eq!(
        (r.phase, r.reason.clone(), r.deadline),
        (RestorePhase::Failed, Some(RestoreFailure::TimedOut), None)
    );
    assert!(r.holds_writes(), "a half-loaded target is never promoted");
    assert!(
        r.message.contains("failover --force --to SITE"),
        "the way out is named: {}",
        r.message
    );
    assert!(
        notes
            .iter()
            .any(|n| n.reason == EventReason::OperationTimedOut)
    );
    // Announced and recloning: the restored primary takes writes, the rest await a reclone.
    let mut g = group();
    g.active_site = "pdx".into();
    g.restore_in_place = Some(RestoreStatus {
        phase: RestorePhase::Recloning,
        announced: true,
        ..loading_into("pdx", 50)
    });
    let (r, _) = persisted(facts(&g));
    assert_eq!(r.reason, Some(RestoreFailure::TimedOut));
    assert!(!r.holds_writes());
    assert!(r.message.contains("AwaitingReclone"), "{}", r.message);
    // No deadline yet: one is set (now + the bound), nothing else happens.
    let mut g = group();
    g.restore_in_place = Some(RestoreStatus {
        deadline: None,
        ..loading_into("pdx", 0)
    });
    let (r, notes) = persisted(facts(&g));
    assert_eq!((r.phase, r.deadline), (RestorePhase::Loading, Some(t(700))));
    assert!(notes.is_empty());
}

/// `failover --force --to S` out of a failed restore: only then, only onto an answering
/// primary-candidate; whoever holds other data awaits a reclone; once forced, the failure
/// holds no write.
#[test]
fn a_failed_restore_is_left_only_by_a_forced_promotion_of_an_answering_candidate() {
    let mut failed = loading_into("pdx", 100);
    failed.phase = RestorePhase::Failed;
    let mut g = group();
    g.restore_in_place = Some(failed.clone());
    let mut v = views();
    assert_eq!(
        force_out(&g, &v, "pdx"),
        Ok(ForcedOut {
            site: "pdx".into(),
            awaiting_reclone: vec!["iad".into(), "reader".into()],
        })
    );
    assert_eq!(
        force_out(&g, &v, "iad"),
        Ok(ForcedOut {
            site: "iad".into(),
            awaiting_reclone: vec!["pdx".into()],
        })
    );
    assert_eq!(
        force_out(&g, &v, "reader"),
        Err(ForceOutRefusal::NotCandidate {
            site: "reader".into(),
            role: "read-only"
        })
    );
    assert_eq!(
        force_out(&g, &v, "sfo"),
        Err(ForceOutRefusal::UnknownSite("sfo".into()))
    );
    v[0].answered = false;
    assert_eq!(
        force_out(&g, &v, "iad"),
        Err(ForceOutRefusal::NotAnswering("iad".into()))
    );
    // Nothing to force out of: a restore that failed before its load, or one forced already.
    for r in [
        RestoreStatus {
            target_fenced: false,
            ..failed.clone()
        },
        RestoreStatus {
            forced_to: "pdx".into(),
            ..failed.clone()
        },
        RestoreStatus {
            phase: RestorePhase::Succeeded,
            ..failed.clone()
        },
    ] {
        assert!(!r.holds_writes() || r.phase != RestorePhase::Failed);
        g.restore_in_place = Some(r);
        assert_eq!(
            force_out(&g, &views(), "pdx"),
            Err(ForceOutRefusal::NoFailedRestore)
        );
    }
}
