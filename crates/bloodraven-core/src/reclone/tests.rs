//! Decision tables for reclone requests, donors and steps.

use super::*;
use crate::config::SiteRole;
use crate::gtid::{GtidFlavor, GtidSet};
use crate::health::PlannedFailoverPhase;
use crate::status::{PlannedFailoverStatus, ReclonePhase, SiteState};
use crate::view::ReplicaView;

fn shown(name: &str, divergent: &str) -> SiteStatus {
    SiteStatus {
        name: name.into(),
        divergent_gtid_set: divergent.into(),
        ..SiteStatus::default()
    }
}

fn group(active: &str, sites: Vec<SiteStatus>) -> GroupStatus {
    GroupStatus {
        active_site: active.into(),
        topology_generation: 4,
        sites,
        ..GroupStatus::default()
    }
}

fn names() -> Vec<String> {
    ["iad", "pdx", "reader"].map(String::from).to_vec()
}

/// Why `s` fails the reclone, if it does.
fn failure(s: Step) -> Option<RecloneFailure> {
    match s {
        Step::Fail { reason, .. } => Some(reason),
        _ => None,
    }
}

#[test]
fn a_confirmation_names_what_is_discarded() {
    let long = "0-1-105,1-1-2000";
    // (divergent set, given, accepted, why)
    let rows = [
        (long, "0-1-105,", true, "eight characters of the set"),
        (long, "0-1-105,1-1-2000", true, "the whole set"),
        (long, "0-1-105", false, "seven characters are too few"),
        (long, "0-1-105,2", false, "not a prefix of the set"),
        (long, "0-1-105,1-1-20001", false, "longer than the set"),
        (
            "0-1-105",
            "0-1-105",
            true,
            "a set shorter than eight: the whole set",
        ),
        ("0-1-105", "0-1-10", false, "a short set, not whole"),
        ("", "pdx", true, "nothing diverges: the site's name"),
        ("", "iad", false, "another site's name"),
        ("", "", false, "nothing"),
    ];
    for (set, given, ok, why) in rows {
        let c = Confirmation::of(&shown("pdx", set));
        assert_eq!(c.accepts(given), ok, "{why}: {set:?} / {given:?}");
        assert!(c.accepts(&c.shortest()), "{why}: the shortest is accepted");
    }
}

#[test]
fn requests_are_refused_with_the_rule_they_break() {
    let blocked = group(
        "iad",
        vec![shown("iad", ""), shown("pdx", "0-1-105,1-1-2000")],
    );
    let refused = |site: &str, confirm: &str, status: &GroupStatus| {
        admit(site, confirm, status, &names()).unwrap_err()
    };
    assert_eq!(
        refused("sfo", "sfo", &blocked),
        Refusal::UnknownSite("sfo".into())
    );
    assert_eq!(
        refused("iad", "iad", &blocked),
        Refusal::ActiveSite("iad".into())
    );
    assert_eq!(
        refused("pdx", "pdx", &group("", vec![])),
        Refusal::NoActiveSite
    );
    let wrong = refused("pdx", "0-1-999", &blocked);
    assert!(matches!(&wrong, Refusal::NotConfirmed { site, .. } if site == "pdx"));
    let m = wrong.to_string();
    assert!(
        m.contains("\"0-1-105,1-1-2000\"") && m.contains("first 8"),
        "the refusal names the set and the rule: {m}"
    );
    assert!(
        refused("reader", "pdx", &blocked)
            .to_string()
            .contains("confirm with the site's name (reader)")
    );
    // Another operation runs.
    let mut planned = blocked.clone();
    planned.planned_failover = Some(
        PlannedFailoverStatus::requested(
            "pdx",
            "iad",
            crate::time::Timestamp::from_unix_seconds(0),
        )
        .in_phase(PlannedFailoverPhase::Draining),
    );
    assert!(matches!(
        refused("pdx", "0-1-105,", &planned),
        Refusal::OperationInProgress(w) if w.contains("planned failover")
    ));
    let mut recloning = blocked.clone();
    recloning.sites[1].reclone = Some(accepted(&blocked, "0-1-105,"));
    assert!(matches!(
        refused("reader", "reader", &recloning),
        Refusal::OperationInProgress(w) if w.contains("reclone of pdx")
    ));
    // A finished one does not count.
    recloning.sites[1].reclone.as_mut().unwrap().phase = ReclonePhase::Failed;
    assert_eq!(admit("reader", "reader", &recloning, &names()), Ok(()));
    assert_eq!(admit("pdx", "0-1-105,", &blocked, &names()), Ok(()));
}

#[test]
fn the_annotation_is_site_colon_confirmation() {
    assert_eq!(
        parse_request("pdx:0-1-105,1-1"),
        Ok(("pdx".into(), "0-1-105,1-1".into()))
    );
    for bad in ["pdx", ":0-1", "pdx:", ""] {
        assert!(
            matches!(parse_request(bad), Err(Refusal::Malformed(_))),
            "{bad:?}"
        );
    }
    assert_eq!(
        parse_request(&request_value("pdx", "pdx")),
        Ok(("pdx".into(), "pdx".into()))
    );
}

fn g(s: &str) -> GtidSet {
    GtidSet::parse(GtidFlavor::MariaDb, s).unwrap()
}

fn view(name: &str, index: usize, state: SiteState, gtid: &str) -> SiteView {
    SiteView::answered(name, index, state, gtid)
}

fn follows(mut s: SiteView, from: &SiteView, lag: Option<u64>) -> SiteView {
    s.replica = Some(ReplicaView {
        io_running: true,
        sql_running: true,
        source_host: from.host.clone(),
        source_port: from.port,
        seconds_behind: lag,
    });
    s
}

/// iad primary, pdx (the target, blocked), reader following iad with `lag`.
fn trio(lag: Option<u64>) -> Vec<SiteView> {
    let iad = view("iad", 0, SiteState::Writable, "0-1-100");
    let mut pdx = view("pdx", 1, SiteState::ReadOnly, "0-2-5");
    pdx.recovery_blocked = true;
    let mut reader = follows(view("reader", 2, SiteState::ReadOnly, "0-1-100"), &iad, lag);
    reader.role = SiteRole::ReadOnly;
    vec![iad, pdx, reader]
}

#[test]
fn the_donor_is_a_caught_up_replica_when_there_is_one() {
    let replica = |s: &str| Donor {
        site: s.into(),
        replica: true,
    };
    let primary = Donor {
        site: "iad".into(),
        replica: false,
    };
    assert_eq!(
        choose_donor(&trio(Some(0)), "iad", "pdx", false),
        Some(replica("reader"))
    );
    assert_eq!(
        choose_donor(&trio(Some(3)), "iad", "pdx", false),
        Some(primary.clone()),
        "lagging"
    );
    assert_eq!(
        choose_donor(&trio(None), "iad", "pdx", false),
        Some(primary.clone()),
        "lag unknown"
    );
    let mut blocked = trio(Some(0));
    blocked[2].recovery_blocked = true;
    assert_eq!(
        choose_donor(&blocked, "iad", "pdx", false),
        Some(primary.clone())
    );
    // The target is never its own donor.
    assert_eq!(
        choose_donor(&trio(Some(0)), "iad", "reader", false),
        Some(primary.clone())
    );
    // A restore-in-place's reclone copies from the primary even beside a caught-up replica
    // (the replicas hold the data from before the restore).
    assert_eq!(
        choose_donor(&trio(Some(0)), "iad", "pdx", true),
        Some(primary.clone())
    );
    let mut down = trio(Some(0));
    down[0].answered = false;
    assert_eq!(
        choose_donor(&down, "iad", "pdx", false),
        None,
        "the active site does not answer"
    );
    down[0].answered = true;
    down[0].state = SiteState::ReadOnly;
    assert_eq!(
        choose_donor(&down, "iad", "pdx", false),
        None,
        "no writable active site"
    );
}

fn running(phase: ReclonePhase) -> RecloneStatus {
    let mut r = accepted(&group("iad", vec![]), "0-2-5");
    r.phase = phase;
    r.donor = "reader".into();
    r.attempts = 1;
    r.deadline = Some(at(3600));
    r
}

fn at(secs: i64) -> crate::time::Timestamp {
    crate::time::Timestamp::from_unix_seconds(secs)
}

fn facts(sites: &[SiteView], copy: Copy) -> Facts<'_> {
    Facts {
        sites,
        active_site: "iad",
        topology_generation: 4,
        copy,
        now: at(60),
        phase_timeout: std::time::Duration::from_secs(3600),
    }
}

#[test]
fn every_phase_gets_a_deadline_and_ends_timed_out_past_it() {
    use ReclonePhase as P;
    let sites = trio(Some(0));
    for phase in [P::Pending, P::Copying, P::CatchingUp] {
        let mut r = running(phase);
        r.deadline = None;
        assert_eq!(
            step(&r, "pdx", &facts(&sites, Copy::Running { bytes: 1 })),
            Step::SetDeadline(at(3660)),
            "{phase:?} without a deadline"
        );
        r.deadline = Some(at(60));
        assert_eq!(
            step(&r, "pdx", &facts(&sites, Copy::Running { bytes: 1 })),
            Step::Fail {
                reason: RecloneFailure::TimedOut,
                message: format!(
                    "{} ran past its phase bound (spec.operationTimeouts.reclone)",
                    phase.as_str()
                ),
            },
            "{phase:?} at its deadline"
        );
        r.deadline = Some(at(61));
        assert_ne!(
            step(&r, "pdx", &facts(&sites, Copy::Running { bytes: 1 })),
            Step::SetDeadline(at(3660)),
        );
    }
    // An ended reclone keeps nothing running, whatever its deadline says.
    let mut done = running(P::Failed);
    done.deadline = Some(at(0));
    assert_eq!(step(&done, "pdx", &facts(&sites, Copy::Idle)), Step::Wait);
}

#[test]
fn each_phase_steps_as_the_table_says() {
    use ReclonePhase as P;
    let sites = trio(Some(0));
    let reader = Donor {
        site: "reader".into(),
        replica: true,
    };
    let rows: Vec<(P, Copy, Step)> = vec![
        (
            P::Pending,
            Copy::Idle,
            Step::StartCopy {
                donor: reader.clone(),
                attempt: 1,
            },
        ),
        (
            P::Copying,
            Copy::Idle,
            Step::StartCopy {
                donor: reader.clone(),
                attempt: 2,
            },
        ),
        (
            P::Copying,
            Copy::Running { bytes: 7 },
            Step::Progress { bytes: 7 },
        ),
        (
            P::Copying,
            Copy::Done { bytes: 9 },
            Step::CatchUp {
                bytes: 9,
                to: "0-1-100".into(),
            },
        ),
        (
            P::Copying,
            Copy::Failed {
                message: "dump: exit 2".into(),
            },
            Step::Fail {
                reason: RecloneFailure::CopyFailed,
                message: "dump: exit 2".into(),
            },
        ),
        (P::Succeeded, Copy::Idle, Step::Wait),
        (P::Failed, Copy::Running { bytes: 1 }, Step::Wait),
    ];
    for (phase, copy, want) in rows {
        let r = running(phase);
        assert_eq!(
            step(&r, "pdx", &facts(&sites, copy.clone())),
            want,
            "{phase:?} with {copy:?}"
        );
    }
}

#[test]
fn a_change_of_active_site_stops_it_and_a_promoted_target_is_not_touched() {
    let sites = trio(Some(0));
    for phase in [
        ReclonePhase::Pending,
        ReclonePhase::Copying,
        ReclonePhase::CatchingUp,
    ] {
        let r = running(phase);
        let mut f = facts(&sites, Copy::Running { bytes: 1 });
        f.topology_generation = 5;
        f.active_site = "reader";
        assert_eq!(
            failure(step(&r, "pdx", &f)),
            Some(RecloneFailure::ActiveSiteChanged),
            "{phase:?}"
        );
        f.active_site = "pdx";
        assert_eq!(
            failure(step(&r, "pdx", &f)),
            Some(RecloneFailure::TargetPromoted),
            "{phase:?}"
        );
    }
}

#[test]
fn it_has_caught_up_once_the_target_holds_what_the_primary_had_when_loaded() {
    let mut r = running(ReclonePhase::CatchingUp);
    r.catch_up_to = "0-1-100".into();
    let iad = view("iad", 0, SiteState::Writable, "0-1-130");
    let mk = |gtid: &str, io: bool, sql: bool| {
        let mut t = follows(view("pdx", 1, SiteState::ReadOnly, gtid), &iad, Some(9));
        t.recovery_blocked = true;
        if let Some(rep) = t.replica.as_mut() {
            rep.io_running = io;
            rep.sql_running = sql;
        }
        vec![iad.clone(), t]
    };
    let sites = mk("0-1-99", true, true);
    assert_eq!(
        step(&r, "pdx", &facts(&sites, Copy::Idle)),
        Step::Wait,
        "behind"
    );
    let sites = mk("0-1-100", true, true);
    assert_eq!(step(&r, "pdx", &facts(&sites, Copy::Idle)), Step::Succeed);
    let sites = mk("0-1-90", true, false);
    assert_eq!(
        failure(step(&r, "pdx", &facts(&sites, Copy::Idle))),
        Some(RecloneFailure::ReplicationFailed)
    );
    let mut sites = mk("0-1-100", true, true);
    sites[1].replica = None;
    assert_eq!(
        failure(step(&r, "pdx", &facts(&sites, Copy::Idle))),
        Some(RecloneFailure::ReplicationFailed)
    );
    let mut sites = mk("0-1-100", true, true);
    sites[1].answered = false;
    assert_eq!(
        step(&r, "pdx", &facts(&sites, Copy::Idle)),
        Step::Wait,
        "no answer"
    );
    let _ = g("0-1-1");
}
