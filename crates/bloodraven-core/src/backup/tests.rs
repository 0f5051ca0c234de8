use std::time::Duration;

use super::*;
use crate::config::SiteRole;
use crate::status::{RestorePhase, RestoreStatus};
use crate::view::ReplicaView;

fn at(rfc3339: &str) -> Timestamp {
    Timestamp::parse_rfc3339(rfc3339).unwrap()
}

fn next(schedule: &str, after: &str) -> String {
    Schedule::parse(schedule)
        .unwrap()
        .next_after(at(after))
        .map_or_else(|| "never".into(), Timestamp::to_rfc3339)
}

#[test]
fn the_schedule_names_the_next_minute_in_utc() {
    let cases = [
        ("0 3 * * *", "2026-12-07T07:15:00Z", "2026-12-08T03:00:00Z"),
        ("0 3 * * *", "2026-12-08T02:59:59Z", "2026-12-08T03:00:00Z"),
        // Strictly after: the minute itself is not "next".
        ("0 3 * * *", "2026-12-08T03:00:00Z", "2026-12-09T03:00:00Z"),
        (
            "*/15 * * * *",
            "2026-12-07T07:15:00Z",
            "2026-12-07T07:30:00Z",
        ),
        (
            "5/20 * * * *",
            "2026-12-07T07:26:00Z",
            "2026-12-07T07:45:00Z",
        ),
        ("0 0 1 * *", "2026-12-07T07:15:00Z", "2027-01-01T00:00:00Z"),
        ("@weekly", "2026-12-07T07:15:00Z", "2026-12-13T00:00:00Z"),
        // Day of week 7 is Sunday too.
        ("0 12 * * 7", "2026-12-07T07:15:00Z", "2026-12-13T12:00:00Z"),
        (
            "30 1 * * 1-5",
            "2026-12-11T02:00:00Z",
            "2026-12-14T01:30:00Z",
        ),
        // Both day fields restricted: either matches (the 15th, or a Monday).
        ("0 0 15 * 1", "2026-12-08T00:00:00Z", "2026-12-14T00:00:00Z"),
        ("0 0 29 2 *", "2026-03-01T00:00:00Z", "2028-02-29T00:00:00Z"),
        ("0 0 31 2 *", "2026-03-01T00:00:00Z", "never"),
        (
            "0,30 9-10 * * *",
            "2026-12-07T10:30:00Z",
            "2026-12-08T09:00:00Z",
        ),
    ];
    for (schedule, after, want) in cases {
        assert_eq!(next(schedule, after), want, "{schedule} after {after}");
    }
}

#[test]
fn a_scheduled_backup_is_due_once_its_minute_has_come() {
    let s = Schedule::parse("0 3 * * *").unwrap();
    let since = at("2026-12-07T03:00:00Z");
    assert!(!s.due(since, at("2026-12-08T02:59:59Z")));
    assert!(s.due(since, at("2026-12-08T03:00:00Z")));
    // A missed night runs once, not once per missed night.
    assert!(s.due(since, at("2026-12-10T12:00:00Z")));
    assert!(!s.due(at("2026-12-10T12:00:00Z"), at("2026-12-10T12:01:00Z")));
}

#[test]
fn a_bad_schedule_names_its_field_and_rule() {
    let cases = [
        ("0 3 * *", "five fields"),
        ("60 3 * * *", "minute field's value 60 is outside 0-59"),
        ("0 24 * * *", "hour field's value 24 is outside 0-23"),
        ("0 3 0 * *", "day-of-month field's value 0 is outside 1-31"),
        ("0 3 * 13 *", "month field's value 13"),
        ("0 3 * * 8", "day-of-week field's value 8"),
        ("*/0 3 * * *", "the minute field \"*/0\""),
        ("5-1 3 * * *", "the minute field \"5-1\""),
        ("x 3 * * *", "the minute field \"x\""),
        ("@yearly-ish", "five fields"),
    ];
    for (schedule, want) in cases {
        let err = Schedule::parse(schedule).unwrap_err().to_string();
        assert!(err.contains(want), "{schedule}: {err}");
        assert!(err.starts_with("spec.backup.schedule"), "{err}");
    }
}

fn site(name: &str, index: usize, state: SiteState, lag: Option<u64>) -> SiteView {
    let mut s = SiteView::new(name, SiteRole::PrimaryCandidate, index, ("h", 3306), state);
    s.answered = true;
    if state == SiteState::ReadOnly {
        s.replica = Some(ReplicaView {
            io_running: true,
            sql_running: true,
            source_host: "h".into(),
            source_port: 3306,
            seconds_behind: lag,
        });
    }
    s
}

fn group() -> (GroupStatus, Vec<SiteView>) {
    let status = GroupStatus {
        active_site: "iad".into(),
        ..GroupStatus::default()
    };
    let sites = vec![
        site("iad", 0, SiteState::Writable, None),
        site("pdx", 1, SiteState::ReadOnly, Some(3)),
        site("fra", 2, SiteState::ReadOnly, Some(0)),
    ];
    (status, sites)
}

const LAG: Duration = Duration::from_secs(60);

#[test]
fn the_least_behind_healthy_replica_is_the_source() {
    let (status, mut sites) = group();
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Site("fra".into())
    );
    // Being recloned, stopped, too far behind or not answering: never the source.
    sites[2].recloning = true;
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Site("pdx".into())
    );
    sites[1].replica.as_mut().unwrap().sql_running = false;
    let fallback = source(SourcePolicy::Replica, &status, &sites, LAG);
    assert_eq!(fallback, Source::PrimaryFallback("iad".into()));
    assert!(fallback.to_string().contains("no replica is healthy"));
    sites[1].replica.as_mut().unwrap().sql_running = true;
    sites[1].replica.as_mut().unwrap().seconds_behind = Some(61);
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::PrimaryFallback("iad".into())
    );
    sites[1].replica.as_mut().unwrap().seconds_behind = Some(1);
    sites[1].answered = false;
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::PrimaryFallback("iad".into())
    );
    // No replica and no primary: wait.
    sites[0].answered = false;
    assert!(matches!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Wait(_)
    ));
}

#[test]
fn ties_go_to_priority_then_the_specs_order() {
    let (status, mut sites) = group();
    sites[1].replica.as_mut().unwrap().seconds_behind = Some(0);
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Site("pdx".into())
    );
    sites[2].priority = 5;
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Site("fra".into())
    );
}

#[test]
fn source_primary_takes_the_primary_and_a_restore_holds_every_source() {
    let (mut status, sites) = group();
    assert_eq!(
        source(SourcePolicy::Primary, &status, &sites, LAG),
        Source::Site("iad".into())
    );
    status.restore_in_place = Some(RestoreStatus {
        phase: RestorePhase::Recloning,
        announced: true,
        ..RestoreStatus::accepted(
            "iad".into(),
            "2026-12-07T07:00:00Z".into(),
            "/dump.sql".into(),
            at("2026-12-07T07:00:00Z"),
            "iad".into(),
            1,
        )
    });
    for policy in [SourcePolicy::Replica, SourcePolicy::Primary] {
        let s = source(policy, &status, &sites, LAG);
        assert!(
            matches!(&s, Source::Wait(why) if why.contains("restore-in-place runs (Recloning)")),
            "{s}"
        );
    }
    // Once it has ended, backups run again.
    status.restore_in_place.as_mut().unwrap().phase = RestorePhase::Succeeded;
    assert_eq!(
        source(SourcePolicy::Replica, &status, &sites, LAG),
        Source::Site("fra".into())
    );
}

fn stored(id: &str, start: &str, good: bool) -> Stored {
    Stored {
        id: id.into(),
        start_time: at(start),
        good,
    }
}

#[test]
fn retention_removes_whole_backups_but_never_the_newest_good_or_the_pinned_one() {
    let all = vec![
        stored("b1", "2026-12-01T03:00:00Z", true),
        stored("b2", "2026-12-02T03:00:00Z", true),
        stored("f3", "2026-12-03T03:00:00Z", false),
        stored("b4", "2026-12-04T03:00:00Z", true),
        stored("f5", "2026-12-05T03:00:00Z", false),
    ];
    let now = at("2026-12-05T12:00:00Z");
    let count = |n| Retention {
        count: Some(n),
        max_age: None,
    };
    // Keep two good ones: b1 goes; the failed one between goes; the failed one after the
    // newest good one stays (it may be the run in progress).
    assert_eq!(expired(&all, count(2), now, None), ["b1", "f3"]);
    assert_eq!(expired(&all, count(1), now, None), ["b1", "b2", "f3"]);
    // count 0 is read as 1: the newest good one always stays.
    assert_eq!(expired(&all, count(0), now, None), ["b1", "b2", "f3"]);
    // The pinned one stays whatever the policy.
    assert_eq!(expired(&all, count(1), now, Some("b1")), ["b2", "f3"]);
    // By age: older than 2 days, but never the newest good one, even when old.
    let age = Retention {
        count: None,
        max_age: Some(Duration::from_secs(2 * 86_400)),
    };
    assert_eq!(expired(&all, age, now, None), ["b1", "b2", "f3"]);
    let later = at("2027-01-01T00:00:00Z");
    assert_eq!(expired(&all, age, later, None), ["b1", "b2", "f3"]);
    // No policy: only failed ones before the newest good one.
    assert_eq!(expired(&all, Retention::default(), now, None), ["f3"]);
    // Nothing good yet: nothing goes.
    let failed = vec![stored("f1", "2026-12-01T03:00:00Z", false)];
    assert!(expired(&failed, count(1), now, None).is_empty());
}

#[test]
fn a_generated_id_names_the_group_and_the_second_and_fits_a_directory_name() {
    let t = Timestamp::parse_rfc3339("2026-12-07T03:00:05Z").unwrap();
    assert_eq!(backup_id("shop", t), "shop-20261207T030005Z");
    let frac = Timestamp::from_unix_millis(t.unix_millis() + 123);
    assert_eq!(backup_id("shop", frac), "shop-20261207T030005Z");
    // A group's name may be 253 characters: the id still fits.
    let long = "a".repeat(200);
    let id = backup_id(&long, t);
    assert_eq!(id.len(), MAX_ID_LEN, "{id}");
    assert!(id.ends_with("-20261207T030005Z"), "{id}");
}
