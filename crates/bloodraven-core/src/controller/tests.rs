//! Decision tables for every case of SPEC §2.3.

use super::*;
use crate::gtid::GtidFlavor;
use crate::semisync::SemiSyncState;
use crate::view::{ProbeResult, ReplicaView, SiteTracker, debounce, debounce_poll};

fn g(s: &str) -> GtidSet {
    GtidSet::parse(GtidFlavor::MariaDb, s).unwrap()
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_796_000_000 + s)
}

fn site(name: &str, index: usize, state: SiteState, gtid: &str) -> SiteView {
    SiteView::answered(name, index, state, gtid)
}

fn replicating(mut s: SiteView, from: &SiteView) -> SiteView {
    s.replica = Some(ReplicaView {
        io_running: true,
        sql_running: true,
        source_host: from.host.clone(),
        source_port: from.port,
        seconds_behind: Some(0),
    });
    s
}

fn input<'a>(sites: &'a [SiteView], active: &'a str, last_target: &'a str) -> DecideInput<'a> {
    DecideInput {
        sites,
        active_site: active,
        last_failover_target: last_target,
        last_failover: None,
        promotion_gtid: None,
        now: t(1000),
        cooldown: Duration::from_secs(300),
        automatic_failover_held: false,
        restore_holds_writes: false,
        site_priorities: &[],
        last_reassertion: None,
        reassert_interval: Duration::from_secs(30),
        max_lag_seconds: 300,
        bootstrap_site: None,
        no_site_answers: false,
        replication_mode: ReplicationMode::Async,
        max_lag_wait: Duration::from_secs(300),
        lease_timeout: Duration::from_secs(20),
        peer_check_interval: Duration::from_secs(5),
        repoint_settle: Duration::from_secs(3),
        fencing: crate::config::FencingMode::Fast,
        awaiting_fence: None,
        fence_facts: None,
        forced_by: None,
    }
}

/// `i` after a failover that promoted at `promo`.
fn promoted<'a>(mut i: DecideInput<'a>, promo: &'a GtidSet) -> DecideInput<'a> {
    i.promotion_gtid = Some(promo);
    i
}

/// The async-mode emergency promotion of `to`, with no catch-up, re-pointing `repoint`.
fn emergency(from: &str, to: &str, repoint: &[&str]) -> Action {
    Action::EmergencyFailover {
        from: from.into(),
        to: to.into(),
        drain: DrainPlan {
            bound: ASYNC_DRAIN_BOUND,
            required: false,
        },
        catch_up: None,
        repoint: repoint.iter().map(|s| (*s).to_string()).collect(),
        hold_fence: false,
    }
}

/// The catch-up source `from` (with its GTID set) of an emergency promotion.
fn caught_up_from(a: &Action) -> Option<(String, String)> {
    match a {
        Action::EmergencyFailover { catch_up, .. } => catch_up
            .as_ref()
            .map(|c| (c.from.clone(), c.target.to_string())),
        _ => None,
    }
}

fn fence(site: &str, divergent: bool) -> Action {
    Action::FenceIntruder {
        site: site.into(),
        divergent,
    }
}

fn repoint(site: &str) -> Action {
    Action::Repoint { site: site.into() }
}

fn bootstrap(site: &str, promote: bool) -> Action {
    Action::Bootstrap {
        site: site.into(),
        promote,
    }
}

/// The healthy trio whose primary iad died: unreachable, and silent this poll.
fn iad_dead() -> Vec<SiteView> {
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unreachable;
    sites[0].answered = false;
    sites
}

/// Why `c` says the group is degraded, if it does.
fn degraded_reason(c: &Conditions) -> Option<ConditionReason> {
    c.degraded.as_ref().map(|x| x.reason.clone())
}

fn healthy_trio() -> Vec<SiteView> {
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let pdx = replicating(site("pdx", 1, SiteState::ReadOnly, "0-1-100"), &iad);
    let mut reader = replicating(site("reader", 2, SiteState::ReadOnly, "0-1-100"), &iad);
    reader.role = SiteRole::ReadOnly;
    vec![iad, pdx, reader]
}

#[test]
fn debounce_thresholds() {
    use ProbeResult::{ReadOnly, Unreachable, Writable};
    // failureThreshold 3, recoveryThreshold 2: (probe, state after it, why)
    let steps = [
        (
            Writable,
            SiteState::Unknown,
            "one writable probe is not enough",
        ),
        (Writable, SiteState::Writable, "the second confirms it"),
        (
            Unreachable,
            SiteState::Writable,
            "one failure keeps the state",
        ),
        (
            Unreachable,
            SiteState::Writable,
            "two failures keep the state",
        ),
        (
            Unreachable,
            SiteState::Unreachable,
            "the third makes it unreachable",
        ),
        (
            Writable,
            SiteState::Unknown,
            "back, not yet confirmed writable",
        ),
        (ReadOnly, SiteState::ReadOnly, "read-only at once"),
    ];
    let mut tr = SiteTracker::default();
    for (probe, state, why) in steps {
        tr = debounce(tr, probe, 3, 2);
        assert_eq!(tr.state, state, "{why}");
    }
    assert_eq!((tr.failures, tr.writable_streak), (0, 0));
    // A blip does not reset a writable site.
    let w = SiteTracker {
        state: SiteState::Writable,
        failures: 0,
        writable_streak: 5,
    };
    let w = debounce(w, ProbeResult::Unreachable, 3, 2);
    assert_eq!(
        debounce(w, ProbeResult::Writable, 3, 2).state,
        SiteState::Writable
    );
}

#[test]
fn a_poll_in_which_no_site_answered_counts_for_no_site() {
    use ProbeResult::{ReadOnly, Unreachable, Writable};
    let healthy = [
        SiteTracker {
            state: SiteState::Writable,
            failures: 0,
            writable_streak: 5,
        },
        SiteTracker {
            state: SiteState::ReadOnly,
            ..SiteTracker::default()
        },
    ];
    // Ten blind polls (the operator cut off): nothing moves.
    let mut t = healthy.to_vec();
    for _ in 0..10 {
        t = debounce_poll(&t, &[Unreachable, Unreachable], 3, 2);
    }
    assert_eq!(t, healthy);
    // The candidate comes back a poll before the primary: one failure, not a failover.
    t = debounce_poll(&t, &[Unreachable, ReadOnly], 3, 2);
    assert_eq!((t[0].state, t[0].failures), (SiteState::Writable, 1));
    // A primary that keeps failing while others answer is unreachable after the threshold.
    t = debounce_poll(&t, &[Unreachable, ReadOnly], 3, 2);
    t = debounce_poll(&t, &[Unreachable, ReadOnly], 3, 2);
    assert_eq!(t[0].state, SiteState::Unreachable);
    t = debounce_poll(&t, &[Writable, ReadOnly], 3, 2);
    assert_eq!(t[0].failures, 0);
}

#[test]
fn healthy_group_does_nothing() {
    let sites = healthy_trio();
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.alerts.is_empty());
    assert!(d.conditions.ready);
    assert_eq!(d.conditions.degraded, None);
}

#[test]
fn bootstrap_cases() {
    let mut sites = healthy_trio();
    let d = decide(&input(&sites, "", ""));
    assert_eq!(d.actions, vec![bootstrap("iad", false)]);
    for s in &mut sites {
        s.state = SiteState::ReadOnly;
        s.writable_now = false;
    }
    // Every site booted read-only and answers: the most advanced candidate is promoted.
    let i = input(&sites, "", "");
    let d = decide(&i);
    assert_eq!(d.actions, vec![bootstrap("iad", true)]);
    assert!(d.alerts.is_empty(), "{d:?}");
    // The conditions are those after the bootstrap; had it failed, there is no primary.
    assert!(d.conditions.ready, "{:?}", d.conditions);
    assert_eq!(
        settle(&i, &d, &[false])
            .conditions
            .degraded
            .unwrap()
            .reason
            .as_str(),
        "NoPrimary"
    );
    sites[0].state = SiteState::Writable;
    sites[1].state = SiteState::Writable;
    let d = decide(&input(&sites, "", ""));
    assert!(
        d.actions.is_empty(),
        "two writable, no history, no policy: alert only"
    );
    assert_eq!(
        d.alerts,
        vec![Alert::SplitBrainUndecided {
            sites: vec!["iad".into(), "pdx".into()]
        }]
    );
    assert_eq!(d.conditions.degraded.unwrap().reason.as_str(), "SplitBrain");
    let prio = vec!["pdx".to_string(), "iad".to_string()];
    let mut i = input(&sites, "", "");
    i.site_priorities = &prio;
    let d = decide(&i);
    assert_eq!(
        d.actions,
        vec![fence("iad", false), bootstrap("pdx", false)]
    );
    for s in &mut sites {
        s.state = SiteState::Unreachable;
    }
    let d = decide(&input(&sites, "", ""));
    assert_eq!(d.alerts, vec![Alert::AllUnreachable]);
}

/// An operator cut off from every site keeps the sites' last states (the polls count for none)
/// but says that no site answers, and acts on nothing.
#[test]
fn an_operator_that_reaches_no_site_says_so_and_acts_on_nothing() {
    let sites = healthy_trio();
    let mut i = input(&sites, "iad", "");
    i.no_site_answers = true;
    let d = decide(&i);
    assert_eq!(d.alerts, vec![Alert::AllUnreachable]);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

/// A group whose servers all boot read-only gets its first primary from the operator:
/// `spec.bootstrapSite` when set, else the most advanced candidate; never a site that would
/// orphan another's transactions, never while (without `bootstrapSite`) a site is silent.
#[test]
fn bootstrap_of_a_group_whose_sites_all_boot_read_only() {
    let all_ro = || {
        let mut sites = healthy_trio();
        for s in &mut sites {
            s.state = SiteState::ReadOnly;
            s.writable_now = false;
            s.replica = None;
        }
        sites
    };
    let promote = |site: &str| {
        vec![Action::Bootstrap {
            site: site.into(),
            promote: true,
        }]
    };
    let waiting = |d: &Decision| {
        assert!(d.actions.is_empty(), "{d:?}");
        match d.alerts.as_slice() {
            [Alert::BootstrapWaiting { reason }] => reason.clone(),
            other => panic!("expected a BootstrapWaiting alert: {other:?}"),
        }
    };

    // Equal positions: priority, then spec order.
    let mut sites = all_ro();
    assert_eq!(decide(&input(&sites, "", "")).actions, promote("iad"));
    sites[1].priority = 10;
    assert_eq!(decide(&input(&sites, "", "")).actions, promote("pdx"));
    // The most advanced candidate wins over priority; a reader is never chosen.
    sites[0].gtid = Some(g("0-1-120"));
    sites[2].gtid = Some(g("0-1-130"));
    let r = waiting(&decide(&input(&sites, "", "")));
    assert!(r.contains("reader"), "{r}");
    sites[2].gtid = Some(g("0-1-100"));
    assert_eq!(decide(&input(&sites, "", "")).actions, promote("iad"));

    // bootstrapSite decides, but only if it holds everything the others hold.
    let mut i = input(&sites, "", "");
    i.bootstrap_site = Some("pdx");
    let r = waiting(&decide(&i));
    assert!(r.contains("pdx lacks transactions that iad"), "{r}");
    sites[1].gtid = Some(g("0-1-120"));
    let mut i = input(&sites, "", "");
    i.bootstrap_site = Some("pdx");
    assert_eq!(decide(&i).actions, promote("pdx"));
    // An unknown or read-only bootstrapSite is refused with its reason.
    i.bootstrap_site = Some("reader");
    assert!(waiting(&decide(&i)).contains("never promoted"));
    i.bootstrap_site = Some("nowhere");
    assert!(waiting(&decide(&i)).contains("not a site"));

    // A silent site may hold the newest data: without bootstrapSite, wait for it.
    let mut sites = all_ro();
    sites[1].state = SiteState::Unreachable;
    sites[1].answered = false;
    let r = waiting(&decide(&input(&sites, "", "")));
    assert!(r.contains("waiting for pdx"), "{r}");
    // With bootstrapSite, the human has decided: promote it if it holds what the others do.
    let mut i = input(&sites, "", "");
    i.bootstrap_site = Some("iad");
    assert_eq!(decide(&i).actions, promote("iad"));
    // Still settling: nothing yet.
    let mut sites = all_ro();
    sites[1].state = SiteState::Unknown;
    let d = decide(&input(&sites, "", ""));
    assert!(d.actions.is_empty() && d.alerts.is_empty(), "{d:?}");
}

/// A site seen writable by one probe while another site is active is fenced by that poll's
/// decision: the debounce applies to its reported state, never to fencing.
#[test]
fn a_writable_intruder_is_fenced_on_first_sight() {
    let mut sites = healthy_trio();
    let promotion = g("0-1-100");
    // pdx is active after a failover; iad restarted and answered writable once.
    sites[0].state = SiteState::Unknown;
    sites[0].writable_now = true;
    sites[1].state = SiteState::Writable;
    sites[1].writable_now = true;
    sites[1].replica = None;
    let i = promoted(input(&sites, "pdx", "pdx"), &promotion);
    let d = decide(&i);
    assert!(d.actions.contains(&fence("iad", false)), "{d:?}");
    // No split-brain alarm for a site the debounce has not confirmed.
    assert!(d.alerts.is_empty(), "{d:?}");
    // Divergent on first sight too (it took writes the group never received).
    sites[0].gtid = Some(GtidSet::parse(GtidFlavor::MariaDb, "0-1-101").unwrap());
    sites[1].gtid = Some(GtidSet::parse(GtidFlavor::MariaDb, "0-2-101").unwrap());
    let i = promoted(input(&sites, "pdx", "pdx"), &promotion);
    assert!(
        decide(&i).actions.contains(&fence("iad", true)),
        "{:?}",
        decide(&i)
    );
    // A probe that did not answer this poll cannot fence: next poll.
    sites[0].answered = false;
    sites[0].writable_now = false;
    let i = promoted(input(&sites, "pdx", "pdx"), &promotion);
    assert!(
        !decide(&i)
            .actions
            .iter()
            .any(|a| matches!(a, Action::FenceIntruder { .. }))
    );
}

#[test]
fn no_primary_waits_until_every_site_has_settled() {
    // A fresh group's first poll: iad answered writable once (not yet confirmed), the others
    // are read-only. No alarm: iad is about to be bootstrapped.
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unknown;
    let d = decide(&input(&sites, "", ""));
    assert!(d.actions.is_empty() && d.alerts.is_empty(), "{d:?}");
    // Settled read-only: every site answers read-only, so the first primary is chosen.
    sites[0].state = SiteState::ReadOnly;
    sites[0].writable_now = false;
    let d = decide(&input(&sites, "", ""));
    assert_eq!(d.actions, vec![bootstrap("iad", true)]);
    // Settled unreachable: now it is news (and nothing is promoted past it).
    sites[0].state = SiteState::Unreachable;
    sites[0].answered = false;
    let d = decide(&input(&sites, "", ""));
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(
        matches!(d.alerts.as_slice(), [Alert::BootstrapWaiting { reason }] if reason.contains("iad")),
        "{d:?}"
    );
}

#[test]
fn emergency_failover_picks_the_most_advanced_candidate() {
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unreachable;
    sites.push(site("sfo", 3, SiteState::ReadOnly, "0-1-90"));
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![emergency("iad", "pdx", &["reader", "sfo"])]);
    // The more advanced one wins over priority and spec order.
    sites[3].gtid = Some(g("0-1-120"));
    sites[1].priority = 100;
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![emergency("iad", "sfo", &["pdx", "reader"])]);
    // Equal sets: priority, then spec order.
    sites[3].gtid = Some(g("0-1-100"));
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![emergency("iad", "pdx", &["reader", "sfo"])]);
    sites[1].priority = 0;
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![emergency("iad", "pdx", &["reader", "sfo"])]);
}

#[test]
fn never_a_reader_or_dr_only_or_blocked_site() {
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unreachable;
    sites[2].gtid = Some(g("0-1-500"));
    sites[1].role = SiteRole::DrOnly;
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(matches!(d.alerts.as_slice(), [Alert::NoCandidate { .. }]));
    sites[1].role = SiteRole::PrimaryCandidate;
    sites[1].recovery_blocked = true;
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty());
    assert!(d.conditions.recovery_pending.is_some());
}

#[test]
fn cooldown_and_holds_block_emergency_failover() {
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unreachable;
    let mut i = input(&sites, "iad", "iad");
    i.last_failover = Some(t(900));
    let d = decide(&i);
    assert!(d.actions.is_empty());
    assert_eq!(
        d.alerts,
        vec![Alert::CooldownBlocksFailover { until: t(1200) }]
    );
    i.last_failover = Some(t(600));
    assert_eq!(decide(&i).actions.len(), 1, "cooldown over");
    let mut i = input(&sites, "iad", "");
    i.automatic_failover_held = true;
    let d = decide(&i);
    assert!(d.actions.is_empty());
    assert_eq!(d.alerts, vec![Alert::FailoverHeld]);
}

#[test]
fn a_lease_cannot_influence_emergency_failover() {
    // There is no lease input at all: DecideInput has no field for one. This test documents
    // that, and checks the decision is the same whatever else is set.
    let mut sites = healthy_trio();
    sites[0].state = SiteState::Unreachable;
    let a = decide(&input(&sites, "iad", ""));
    let mut i = input(&sites, "iad", "");
    i.last_reassertion = Some(t(999));
    assert_eq!(decide(&i).actions, a.actions);
}

#[test]
fn returning_primary_is_fenced_and_compared_with_the_promotion_point() {
    let pdx = site("pdx", 1, SiteState::Writable, "0-2-150");
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let sites = vec![iad, pdx];
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    let d = decide(&i);
    assert_eq!(d.actions, vec![fence("iad", false)]);
    // After the fence: one writable site, iad still to be re-pointed.
    assert_eq!(
        d.conditions.degraded.as_ref().unwrap().reason.as_str(),
        "ReplicationNotRunning"
    );
    assert!(d.conditions.ready);
    // Had the fence not landed: two writable sites.
    let failed = settle(&i, &d, &[false]).conditions;
    assert_eq!(
        failed.degraded.as_ref().unwrap().reason.as_str(),
        "SplitBrain"
    );
    assert!(!failed.ready);
    // The old primary wrote past the promotion point: divergent.
    let mut sites2 = sites.clone();
    sites2[0].gtid = Some(g("0-1-103"));
    let i = promoted(input(&sites2, "pdx", "pdx"), &promo);
    assert_eq!(decide(&i).actions, vec![fence("iad", true)]);
    // Even though pdx's current position is numerically ahead (0-2-150 > 0-1-103):
    // positions alone would have hidden the divergence.
    assert!(
        sites2[1]
            .gtid
            .as_ref()
            .unwrap()
            .contains(sites2[0].gtid.as_ref().unwrap())
    );
}

#[test]
fn a_returning_primary_that_comes_back_read_only_is_still_checked_for_divergence() {
    // iad died at 0-1-103 with three transactions pdx never received; pdx was promoted at
    // 0-1-100 and has written since. iad returns read-only (as its option file says, or after
    // a fence whose answer was lost) and does not replicate.
    let pdx = site("pdx", 1, SiteState::Writable, "0-2-150");
    let reader = replicating(site("reader", 2, SiteState::ReadOnly, "0-2-150"), &pdx);
    let iad = site("iad", 0, SiteState::ReadOnly, "0-1-103");
    let mut sites = vec![iad, pdx, reader];
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    assert_eq!(
        decide(&i).actions,
        vec![Action::BlockDivergent { site: "iad".into() }],
        "not re-pointed: replication would stop or bury the transactions"
    );
    // At (or behind) the promotion point, or already following pdx: re-pointed.
    for ok in ["0-1-100", "0-1-97", "0-2-120"] {
        sites[0].gtid = Some(g(ok));
        let i = promoted(input(&sites, "pdx", "pdx"), &promo);
        assert_eq!(decide(&i).actions, vec![repoint("iad")], "{ok}");
    }
    // Once blocked, it is unblocked only when a human has brought it in line.
    sites[0].gtid = Some(g("0-1-103"));
    sites[0].recovery_blocked = true;
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    assert!(decide(&i).actions.is_empty());
    sites[0].gtid = Some(g("0-2-150"));
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    assert_eq!(
        decide(&i).actions,
        vec![Action::ClearRecoveryBlock { site: "iad".into() }]
    );
}

#[test]
fn positions_from_an_earlier_poll_never_block_or_repoint() {
    // pdx (active since a failover at 0-1-100) was last seen at 0-2-120 and has just stopped
    // answering; its replicas have since received up to 0-2-140 and lost their source.
    let mut pdx = site("pdx", 1, SiteState::Writable, "0-2-120");
    pdx.answered = false;
    let mut iad = replicating(site("iad", 0, SiteState::ReadOnly, "0-2-140"), &pdx);
    iad.replica.as_mut().unwrap().io_running = false;
    let sites = vec![iad, pdx];
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    let d = decide(&i);
    assert!(
        d.actions.is_empty(),
        "iad is ahead of pdx's stale position, not divergent: {d:?}"
    );
    // Once pdx answers again (at 0-2-150), iad is simply re-pointed.
    let mut sites = sites;
    sites[1].answered = true;
    sites[1].gtid = Some(g("0-2-150"));
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    assert_eq!(decide(&i).actions, vec![repoint("iad")]);
}

#[test]
fn writes_on_a_replica_by_a_stale_client_are_divergent_even_when_numbered_lower() {
    // No failover history (a priority list decides): iad is active at 0-1-100. A stale client
    // wrote two transactions on reader while it was writable by mistake; their numbers
    // (0-3-17) look "behind".
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let reader = site("reader", 2, SiteState::Writable, "0-3-17");
    let sites = vec![iad, reader];
    assert!(sites[0].gtid.as_ref().unwrap().contains(&g("0-3-17")));
    let prio = vec!["iad".to_string()];
    let mut i = input(&sites, "iad", "");
    i.site_priorities = &prio;
    let d = decide(&i);
    assert_eq!(d.actions, vec![fence("reader", true)]);
}

#[test]
fn split_brain_after_failover_fences_all_but_the_last_target() {
    let mut sites = vec![
        site("iad", 0, SiteState::Writable, "0-1-100"),
        site("pdx", 1, SiteState::Writable, "0-2-110"),
        site("sfo", 2, SiteState::Writable, "0-1-100"),
    ];
    sites[2].role = SiteRole::DrOnly;
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    let d = decide(&i);
    assert_eq!(d.actions, vec![fence("iad", false), fence("sfo", false)]);
}

#[test]
fn split_brain_without_history_alerts_unless_a_priority_list_decides() {
    let sites = vec![
        site("iad", 0, SiteState::Writable, "0-1-100"),
        site("pdx", 1, SiteState::Writable, "0-1-100"),
    ];
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty());
    assert_eq!(
        d.alerts,
        vec![Alert::SplitBrainUndecided {
            sites: vec!["iad".into(), "pdx".into()]
        }]
    );
    let prio = vec!["iad".to_string()];
    let mut i = input(&sites, "iad", "");
    i.site_priorities = &prio;
    assert_eq!(decide(&i).actions, vec![fence("pdx", false)]);
    // A policy naming the other site does not move the active site by itself.
    let prio = vec!["pdx".to_string()];
    let mut i = input(&sites, "iad", "");
    i.site_priorities = &prio;
    let d = decide(&i);
    assert!(d.actions.is_empty());
    assert!(matches!(
        d.alerts.as_slice(),
        [Alert::SplitBrainUndecided { .. }]
    ));
}

#[test]
fn reassertion_restores_the_last_target_when_it_has_everything() {
    let mut sites = healthy_trio();
    for s in &mut sites {
        s.state = SiteState::ReadOnly;
    }
    sites[0].gtid = Some(g("0-2-120"));
    let mut i = input(&sites, "iad", "iad");
    let d = decide(&i);
    assert_eq!(d.actions, vec![Action::Reassert { site: "iad".into() }]);
    i.last_reassertion = Some(t(990));
    let d = decide(&i);
    assert!(d.actions.is_empty(), "rate-limited");
    i.last_reassertion = Some(t(900));
    assert_eq!(decide(&i).actions.len(), 1);
    // Another site has transactions the last target lacks: never restore it.
    sites[1].gtid = Some(g("0-2-121"));
    let d = decide(&input(&sites, "iad", "iad"));
    assert!(d.actions.is_empty());
    assert_eq!(d.alerts, vec![Alert::NoPrimary]);
    // Without history: alert only.
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty());
    assert_eq!(d.alerts, vec![Alert::NoPrimary]);
}

#[test]
fn reassertion_completes_an_announced_promotion_whose_old_primary_is_gone() {
    // An emergency failover announced pdx, but clearing its fence failed; iad is dead.
    let mut sites = iad_dead();
    sites[0].gtid = Some(g("0-1-130"));
    sites[1].state = SiteState::ReadOnly;
    sites[1].gtid = Some(g("0-1-120"));
    sites[2].state = SiteState::ReadOnly;
    sites[2].gtid = Some(g("0-1-120"));
    let d = decide(&input(&sites, "pdx", "pdx"));
    assert_eq!(d.actions, vec![Action::Reassert { site: "pdx".into() }]);
    // Never while a reachable site holds what pdx lacks.
    sites[2].gtid = Some(g("0-1-121"));
    let d = decide(&input(&sites, "pdx", "pdx"));
    assert!(d.actions.is_empty());
    assert_eq!(d.alerts, vec![Alert::NoPrimary]);
    // Nor while a site is still settling (seen again, not confirmed).
    sites[2].gtid = Some(g("0-1-120"));
    sites[0].state = SiteState::Unknown;
    let d = decide(&input(&sites, "pdx", "pdx"));
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::Reassert { .. })),
        "{:?}",
        d.actions
    );
}

/// An announced strict promotion of pdx, iad (the old primary) unreachable.
fn awaiting_trio() -> Vec<SiteView> {
    let mut sites = iad_dead();
    sites[1].state = SiteState::ReadOnly;
    sites[1].replica = None;
    sites
}

#[test]
fn strict_fencing_announces_and_holds_then_lifts_on_proof_or_force() {
    use crate::strict::{Facts, SidecarReport, Timings};
    use std::collections::BTreeMap;
    // The emergency itself: strict holds the fence of the new primary.
    let sites = iad_dead();
    let mut i = input(&sites, "iad", "");
    i.fencing = crate::config::FencingMode::Strict;
    let d = decide(&i);
    assert!(
        matches!(&d.actions[..], [Action::EmergencyFailover { to, hold_fence: true, .. }] if to == "pdx"),
        "{:?}",
        d.actions
    );

    // Announced, waiting.
    let sites = awaiting_trio();
    let awaiting = crate::status::AwaitingFence {
        site: "iad".into(),
        target: "pdx".into(),
        topology_generation: 2,
        since: t(990),
    };
    let names: Vec<String> = ["iad", "pdx", "reader"].map(String::from).to_vec();
    let quiet = |up: u64| SidecarReport {
        read_only: Some(true),
        up_for: Duration::from_secs(up),
        ..SidecarReport::default()
    };
    let mut reports = BTreeMap::from([("pdx".to_string(), quiet(100))]);
    let judge_with = |reports: &BTreeMap<String, SidecarReport>, operator_silent: u64| {
        let mut i = input(&sites, "pdx", "pdx");
        i.fencing = crate::config::FencingMode::Strict;
        i.awaiting_fence = Some(&awaiting);
        i.fence_facts = Some(Facts {
            old_primary: "iad",
            generation: 2,
            sites: &names,
            reports,
            operator_silent_for: Duration::from_secs(operator_silent),
            operator_receipt: None,
            timings: Timings {
                lease_timeout: Duration::from_secs(6),
                peer_check_interval: Duration::from_secs(2),
            },
        });
        decide(&i)
    };
    // The reader's sidecar is not heard: no promotion, FenceUnconfirmed says why.
    let d = judge_with(&reports, 100);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert!(
        matches!(&d.alerts[..], [Alert::FenceUnconfirmed { old, target, why }] if old == "iad" && target == "pdx" && why.contains("reader")),
        "{:?}",
        d.alerts
    );
    let degraded = d.conditions.degraded.clone().unwrap();
    assert_eq!(degraded.reason, ConditionReason::FenceUnconfirmed);
    assert!(degraded.message.contains("--force"), "{}", degraded.message);
    assert!(!d.conditions.ready);
    // Everyone quiet long enough: the fence is confirmed and pdx takes writes.
    reports.insert("reader".into(), quiet(100));
    let d = judge_with(&reports, 100);
    assert!(
        matches!(&d.actions[..], [Action::ConfirmFence { site, forced: false, why, catch_up: None }] if site == "pdx" && why.contains("rule #2")),
        "{:?}",
        d.actions
    );
    assert!(d.conditions.ready, "the conditions after the action");
    // Without facts it waits; a human can force it.
    let mut i = input(&sites, "pdx", "pdx");
    i.awaiting_fence = Some(&awaiting);
    let d = decide(&i);
    assert!(d.actions.is_empty());
    i.forced_by = Some("alice");
    let d = decide(&i);
    assert!(
        matches!(&d.actions[..], [Action::ConfirmFence { forced: true, why, .. }] if why.contains("alice")),
        "{:?}",
        d.actions
    );
    // The old primary kept replicating to the reader until it was fenced: pdx catches up
    // from the reader first, rather than lose what the reader holds.
    let mut ahead = sites.clone();
    ahead[2].gtid = Some(g("0-1-105"));
    let mut i = input(&ahead, "pdx", "pdx");
    i.awaiting_fence = Some(&awaiting);
    i.forced_by = Some("alice");
    let d = decide(&i);
    assert!(
        matches!(&d.actions[..], [Action::ConfirmFence { catch_up: Some(c), .. }] if c.from == "reader" && c.target == g("0-1-105")),
        "{:?}",
        d.actions
    );
}

#[test]
fn replicas_not_following_the_active_site_are_repointed() {
    let mut sites = healthy_trio();
    let pdx = sites[1].clone();
    sites[2] = replicating(sites[2].clone(), &pdx);
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![repoint("reader")]);
    assert_eq!(
        d.conditions.degraded.as_ref().unwrap().reason.as_str(),
        "ReplicationNotRunning"
    );
    // A replica with no replication configured at all (an old primary after a restart).
    sites[2].replica = None;
    assert_eq!(
        decide(&input(&sites, "iad", "")).actions,
        vec![repoint("reader")]
    );
    // A stopped applier on the right source is an errant transaction: no blind re-point.
    let iad = sites[0].clone();
    sites[2] = replicating(sites[2].clone(), &iad);
    if let Some(r) = sites[2].replica.as_mut() {
        r.sql_running = false;
    }
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty());
    assert_eq!(
        d.conditions.degraded.as_ref().unwrap().reason.as_str(),
        "ReplicationNotRunning"
    );
}

#[test]
fn recovery_block_clears_once_the_site_is_contained() {
    let mut sites = healthy_trio();
    sites[1].recovery_blocked = true;
    sites[1].replica = None;
    sites[1].gtid = Some(g("0-1-90"));
    let d = decide(&input(&sites, "iad", "iad"));
    assert_eq!(
        d.actions,
        vec![Action::ClearRecoveryBlock { site: "pdx".into() }]
    );
    sites[1].gtid = Some(g("0-1-101"));
    let d = decide(&input(&sites, "iad", "iad"));
    assert!(
        d.actions.is_empty(),
        "still divergent: no repoint, no unblock"
    );
    assert!(d.conditions.recovery_pending.is_some());
}

#[test]
fn lag_and_unreachable_replicas_degrade_with_their_reasons() {
    let mut sites = healthy_trio();
    if let Some(r) = sites[1].replica.as_mut() {
        r.seconds_behind = Some(301);
    }
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(
        d.conditions.degraded.as_ref().unwrap().reason.as_str(),
        "ReplicationLagging"
    );
    assert!(d.conditions.ready);
    sites[2].state = SiteState::Unreachable;
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(
        d.conditions.degraded.as_ref().unwrap().reason.as_str(),
        "SiteUnreachable"
    );
}

// ---------------------------------------------------------------------------------------------
// spec.replication.mode: semi-sync; promotion by what was received; catch-up before promotion

fn lossless_source() -> SemiSyncState {
    SemiSyncState {
        available: true,
        source_enabled: true,
        after_sync: true,
        timeout_ms: semisync::NO_FALLBACK_TIMEOUT_MS,
        source_active: true,
        source_clients: 2,
        waiting_sessions: 0,
        replica_enabled: true,
        replica_active: false,
    }
}

fn acknowledging_replica() -> SemiSyncState {
    SemiSyncState {
        available: true,
        replica_enabled: true,
        replica_active: true,
        ..SemiSyncState::default()
    }
}

fn semi_sync_trio(primary: SemiSyncState) -> Vec<SiteView> {
    let mut sites = healthy_trio();
    sites[0].semi_sync = Some(primary);
    sites[1].semi_sync = Some(acknowledging_replica());
    sites[2].semi_sync = Some(acknowledging_replica());
    sites
}

fn semi_sync_input(sites: &[SiteView]) -> DecideInput<'_> {
    let mut i = input(sites, "iad", "");
    i.replication_mode = ReplicationMode::SemiSync;
    i
}

#[test]
fn semi_sync_mode_configures_every_site_and_a_configured_group_is_left_alone() {
    let sites = semi_sync_trio(lossless_source());
    let d = decide(&semi_sync_input(&sites));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert!(d.alerts.is_empty(), "{:?}", d.alerts);
    assert_eq!(d.conditions.degraded, None);

    // Freshly switched to semi-sync: everything off.
    let mut fresh = healthy_trio();
    for s in &mut fresh {
        s.semi_sync = Some(SemiSyncState {
            available: true,
            ..SemiSyncState::default()
        });
    }
    let d = decide(&semi_sync_input(&fresh));
    let configure = |site: &str, source: bool| Action::ConfigureSemiSync {
        site: site.into(),
        settings: Settings {
            source,
            replica: true,
        },
    };
    assert_eq!(
        d.actions,
        vec![
            configure("iad", true),
            configure("pdx", false),
            configure("reader", false)
        ]
    );
    // Until it is on, the guarantee does not hold, and the group says so.
    assert_eq!(
        d.conditions.degraded.as_ref().map(|d| d.reason.as_str()),
        Some("SemiSyncFallback")
    );
    assert!(matches!(&d.alerts[..], [Alert::SemiSyncFallback { site, .. }] if site == "iad"));

    // Back to async: everything is switched off again, no failover needed.
    let d = decide(&input(&sites, "iad", ""));
    let off = |site: &str| Action::ConfigureSemiSync {
        site: site.into(),
        settings: Settings {
            source: false,
            replica: false,
        },
    };
    assert_eq!(d.actions, vec![off("iad"), off("pdx"), off("reader")]);
    assert_eq!(d.conditions.degraded, None);
}

#[test]
fn a_fallback_or_a_lossy_wait_point_is_reported_and_corrected() {
    let mut fell_back = lossless_source();
    fell_back.source_active = false;
    let sites = semi_sync_trio(fell_back);
    let d = decide(&semi_sync_input(&sites));
    let Degraded { reason, message } = d.conditions.degraded.clone().unwrap();
    assert_eq!(reason, ConditionReason::SemiSyncFallback);
    assert!(message.contains("fell back"), "{message}");
    assert!(matches!(&d.alerts[..], [Alert::SemiSyncFallback { .. }]));

    let mut lossy = lossless_source();
    lossy.after_sync = false;
    let sites = semi_sync_trio(lossy);
    let d = decide(&semi_sync_input(&sites));
    assert!(d.actions.contains(&Action::ConfigureSemiSync {
        site: "iad".into(),
        settings: Settings {
            source: true,
            replica: true
        }
    }));
    assert_eq!(
        d.conditions.degraded.unwrap().reason.as_str(),
        "SemiSyncFallback"
    );
}

#[test]
fn a_primary_without_acknowledging_replicas_makes_writes_wait_and_says_what_restores_them() {
    let mut alone = lossless_source();
    alone.source_clients = 0;
    alone.waiting_sessions = 4;
    let sites = semi_sync_trio(alone);
    let d = decide(&semi_sync_input(&sites));
    let Degraded { reason, message } = d.conditions.degraded.unwrap();
    assert_eq!(reason, ConditionReason::SemiSyncWritesWait);
    assert!(message.contains("4 waiting") && message.contains("start replication"));
    // The guarantee holds: no fallback alert, no action on the primary.
    assert!(d.alerts.is_empty());
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn semi_sync_settings_wait_while_a_planned_failover_runs_and_in_a_poll_that_fails_over() {
    let mut fresh = semi_sync_trio(lossless_source());
    fresh[1].semi_sync = Some(SemiSyncState {
        available: true,
        ..SemiSyncState::default()
    });
    let mut i = semi_sync_input(&fresh);
    i.automatic_failover_held = true;
    assert!(
        !decide(&i)
            .actions
            .iter()
            .any(|a| matches!(a, Action::ConfigureSemiSync { .. }))
    );
    let mut down = fresh.clone();
    down[0].state = SiteState::Unreachable;
    down[0].answered = false;
    let d = decide(&semi_sync_input(&down));
    assert!(
        matches!(&d.actions[..], [Action::EmergencyFailover { .. }]),
        "{:?}",
        d.actions
    );
}

#[test]
fn the_candidate_that_received_the_most_is_promoted_even_if_it_applied_less() {
    let iad = site("iad", 0, SiteState::Unreachable, "0-1-100");
    // pdx applied 95 but received 100 (its relay log holds the rest); sfo applied 98.
    let mut pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-95");
    pdx.received = Some(g("0-1-100"));
    let sfo = site("sfo", 2, SiteState::ReadOnly, "0-1-98");
    let sites = vec![iad, pdx, sfo];
    let d = decide(&input(&sites, "iad", ""));
    // sfo is ahead of what pdx applied: named as the catch-up source, used only if pdx still
    // lacks something once its relay log is drained (here it will not).
    assert_eq!(d.actions.len(), 1, "{:?}", d.actions);
    assert!(matches!(&d.actions[0], Action::EmergencyFailover { to, .. } if to == "pdx"));
    assert_eq!(
        caught_up_from(&d.actions[0]),
        Some(("sfo".into(), "0-1-98".into()))
    );
}

#[test]
fn a_candidate_catches_up_from_a_more_advanced_reader_before_its_promotion() {
    let iad = site("iad", 0, SiteState::Unreachable, "0-1-100");
    let pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-97");
    let mut reader = site("reader", 2, SiteState::ReadOnly, "0-1-100");
    reader.role = SiteRole::ReadOnly;
    let sites = vec![iad.clone(), pdx.clone(), reader.clone()];
    let d = decide(&input(&sites, "iad", ""));
    assert!(matches!(&d.actions[..], [Action::EmergencyFailover { to, .. }] if to == "pdx"));
    assert_eq!(
        caught_up_from(&d.actions[0]),
        Some(("reader".into(), "0-1-100".into()))
    );
    // Not from a site that did not answer this poll, nor from a blocked one.
    let mut silent = reader.clone();
    silent.answered = false;
    let mut blocked = reader;
    blocked.recovery_blocked = true;
    for r in [silent, blocked] {
        let sites = vec![iad.clone(), pdx.clone(), r];
        assert!(matches!(
            &decide(&input(&sites, "iad", "")).actions[..],
            [Action::EmergencyFailover { catch_up: None, .. }]
        ));
    }
}

#[test]
fn catch_up_takes_the_site_that_holds_every_other_and_none_when_they_disagree() {
    let pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-90");
    let a = site("a", 2, SiteState::ReadOnly, "0-1-95");
    let b = site("b", 3, SiteState::ReadOnly, "0-1-99");
    let sites = vec![pdx.clone(), a.clone(), b.clone()];
    assert_eq!(
        catch_up_source(&sites, &pdx, "iad").map(|s| s.name.as_str()),
        Some("b")
    );
    // Two domains, each ahead in one: neither holds the other's.
    let pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-90,1-1-10");
    let a = site("a", 2, SiteState::ReadOnly, "0-1-95,1-1-10");
    let b = site("b", 3, SiteState::ReadOnly, "0-1-90,1-1-12");
    let sites = vec![pdx.clone(), a, b];
    assert_eq!(catch_up_source(&sites, &pdx, "iad"), None);
    // Nothing ahead: nothing to catch up from; the old primary is never a source.
    let old = site("iad", 0, SiteState::ReadOnly, "0-1-200");
    let sites = vec![pdx.clone(), old];
    assert_eq!(catch_up_source(&sites, &pdx, "iad"), None);
}

/// `d` does not configure iad's semi-sync.
fn leaves_semi_sync_of_iad_alone(d: &Decision) {
    assert!(
        !d.actions
            .iter()
            .any(|a| matches!(a, Action::ConfigureSemiSync { site, .. } if site == "iad")),
        "{:?}",
        d.actions
    );
}

#[test]
fn a_returning_or_blocked_old_primary_keeps_its_source_side_so_waiting_sessions_never_commit() {
    // iad came back writable (its sessions waiting for an acknowledgement) while pdx is active.
    let mut sites = semi_sync_trio(lossless_source());
    sites[0].name = "iad".into();
    let mut pdx_source = lossless_source();
    pdx_source.replica_enabled = true;
    sites[1].semi_sync = Some(pdx_source);
    sites[1].state = SiteState::Writable;
    sites[1].writable_now = true;
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    let d = decide(&i);
    leaves_semi_sync_of_iad_alone(&d);
    // Blocked and read-only: still left alone.
    let mut blocked = sites.clone();
    blocked[0].state = SiteState::ReadOnly;
    blocked[0].writable_now = false;
    blocked[0].recovery_blocked = true;
    let d = decide(&promoted(input(&blocked, "pdx", "pdx"), &promo));
    leaves_semi_sync_of_iad_alone(&d);
}

/// What the emergency promotion used to decide while executing is decided here, in the
/// action: the drain bound, whether a relay log that does not drain aborts the promotion, and
/// the catch-up source with its target and bound. One row per mode and catch-up case.
#[test]
fn the_emergency_action_carries_its_drain_bound_abort_rule_and_catch_up() {
    struct Row {
        mode: ReplicationMode,
        max_lag_wait: u64,
        reader_gtid: &'static str,
        drain: (u64, bool),
        catch_up: Option<(&'static str, &'static str, u64)>,
    }
    let rows = [
        // async: a short drain, promote what was applied; nothing to catch up.
        Row {
            mode: ReplicationMode::Async,
            max_lag_wait: 300,
            reader_gtid: "0-1-97",
            drain: (5, false),
            catch_up: None,
        },
        // async, a reader ahead: catch up from it, bounded by maxLagWait capped at 30 s.
        Row {
            mode: ReplicationMode::Async,
            max_lag_wait: 300,
            reader_gtid: "0-1-100",
            drain: (5, false),
            catch_up: Some(("reader", "0-1-100", 30)),
        },
        // semi-sync: the drain must complete (acknowledged writes may be in the relay log),
        // bounded like a catch-up.
        Row {
            mode: ReplicationMode::SemiSync,
            max_lag_wait: 300,
            reader_gtid: "0-1-97",
            drain: (30, true),
            catch_up: None,
        },
        // A short maxLagWait bounds both waits.
        Row {
            mode: ReplicationMode::SemiSync,
            max_lag_wait: 8,
            reader_gtid: "0-1-99",
            drain: (8, true),
            catch_up: Some(("reader", "0-1-99", 8)),
        },
    ];
    for (n, r) in rows.iter().enumerate() {
        let iad = site("iad", 0, SiteState::Unreachable, "0-1-100");
        let pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-97");
        let mut reader = site("reader", 2, SiteState::ReadOnly, r.reader_gtid);
        reader.role = SiteRole::ReadOnly;
        let sites = vec![iad, pdx, reader];
        let mut i = input(&sites, "iad", "");
        i.replication_mode = r.mode;
        i.max_lag_wait = Duration::from_secs(r.max_lag_wait);
        let d = decide(&i);
        let [
            Action::EmergencyFailover {
                from,
                to,
                drain,
                catch_up,
                repoint,
                hold_fence: false,
            },
        ] = &d.actions[..]
        else {
            panic!("row {n}: {:?}", d.actions);
        };
        assert_eq!((from.as_str(), to.as_str()), ("iad", "pdx"), "row {n}");
        assert_eq!(repoint, &["reader".to_string()], "row {n}");
        assert_eq!(
            (drain.bound, drain.required),
            (Duration::from_secs(r.drain.0), r.drain.1),
            "row {n}"
        );
        assert_eq!(
            catch_up
                .as_ref()
                .map(|c| (c.from.as_str(), c.target.to_string(), c.bound.as_secs())),
            r.catch_up.map(|(f, t, b)| (f, t.to_string(), b)),
            "row {n}"
        );
    }
}

/// The conditions of a decision are those after its actions: the poll that fails over to
/// pdx reports pdx as the active site without `NoPrimary`; if the promotion fails, the group
/// is what it was.
#[test]
fn a_poll_that_changes_the_active_site_never_reports_it_with_no_primary() {
    let sites = iad_dead();
    let i = input(&sites, "iad", "");
    let d = decide(&i);
    assert_eq!(d.actions, vec![emergency("iad", "pdx", &["reader"])]);
    assert!(d.conditions.ready, "{:?}", d.conditions);
    assert_ne!(
        degraded_reason(&d.conditions),
        Some(ConditionReason::NoPrimary)
    );
    let ok = settle(&i, &d, &[true]);
    assert_eq!(ok.active_site, "pdx");
    assert_eq!(ok.conditions, d.conditions);
    // The announcement (persisted before pdx takes writes) already says so.
    assert_eq!(announced(&i, "pdx"), d.conditions);
    assert_eq!(
        ok.effects,
        vec![
            Effect::ActiveSite("pdx".into()),
            Effect::Writable("pdx".into())
        ]
    );
    // The reader still follows iad: shown as not replicating until a probe sees it follow pdx.
    assert_eq!(
        degraded_reason(&ok.conditions),
        Some(ConditionReason::ReplicationNotRunning)
    );
    let failed = settle(&i, &d, &[false]);
    assert_eq!(failed.active_site, "iad");
    assert!(failed.effects.is_empty());
    assert!(!failed.conditions.ready);
    assert_eq!(
        degraded_reason(&failed.conditions),
        Some(ConditionReason::NoPrimary)
    );
}

#[test]
fn settled_effects_follow_the_actions_that_succeeded() {
    // An intruder fenced (divergent) and a replica re-pointed.
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let pdx = site("pdx", 1, SiteState::Writable, "0-2-5");
    let sites = vec![iad, pdx];
    let promo = g("0-1-90");
    let i = promoted(input(&sites, "iad", "iad"), &promo);
    let d = decide(&i);
    assert_eq!(d.actions, vec![fence("pdx", true)]);
    let ok = settle(&i, &d, &[true]);
    assert_eq!(
        ok.effects,
        vec![
            Effect::ReadOnly("pdx".into()),
            Effect::Blocked("pdx".into())
        ]
    );
    assert!(ok.conditions.ready, "one writable site once pdx is fenced");
    assert!(ok.conditions.recovery_pending.is_some());
    let failed = settle(&i, &d, &[false]);
    assert_eq!(
        degraded_reason(&failed.conditions),
        Some(ConditionReason::SplitBrain),
        "the fence did not land: still two writable sites"
    );
    assert_eq!(
        effects_of(&Action::Repoint { site: "x".into() }),
        vec![Effect::Repointed("x".into())]
    );
}

/// A replica re-pointed to the active site is given `repoint_settle` for its IO thread to
/// connect before it is re-pointed again; one re-pointed to another site is re-pointed now.
#[test]
fn a_replica_just_re_pointed_is_given_time_to_connect() {
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let mut pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-100");
    let repoint = vec![Action::Repoint { site: "pdx".into() }];
    for (source, ago, expect) in [
        (None, 0, repoint.clone()),
        (Some("iad"), 1, vec![]),
        (Some("iad"), 2, vec![]),
        (Some("iad"), 3, repoint.clone()),
        (Some("iad"), 60, repoint.clone()),
        (Some("sea"), 1, repoint.clone()),
    ] {
        pdx.repointed = source.map(|s| crate::view::Repointed {
            source: s.into(),
            at: t(1000 - ago),
        });
        let sites = vec![iad.clone(), pdx.clone()];
        let d = decide(&input(&sites, "iad", ""));
        assert_eq!(d.actions, expect, "re-pointed to {source:?} {ago} s ago");
    }
}

/// `SidecarTimingsInSync`: a sidecar running other timings than `spec.sidecar`'s is named in
/// the message; one that reports none, or the same, is not.
#[test]
fn sidecars_with_other_timings_are_named() {
    let timings = |lease: &str, interval: &str| crate::status::SidecarTimings {
        lease_timeout: lease.into(),
        peer_check_interval: interval.into(),
        source: "flags".into(),
        signed_topology: false,
    };
    let mut sites = healthy_trio();
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.conditions.sidecar_timings_mismatch, None);
    sites[0].sidecar_timings = Some(timings("20s", "5s"));
    sites[1].sidecar_timings = Some(timings("30s", "5s"));
    let d = decide(&input(&sites, "iad", ""));
    let m = d.conditions.sidecar_timings_mismatch.expect("pdx differs");
    assert!(
        m.contains("pdx runs leaseTimeout 30s and peerCheckInterval 5s (flags)"),
        "{m}"
    );
    assert!(!m.contains("iad"), "{m}");
    assert!(
        m.starts_with("spec.sidecar says leaseTimeout 20s and peerCheckInterval 5s"),
        "{m}"
    );
}

/// A blocked site (divergent, or being recloned) is never re-pointed: not by the emergency
/// promotion's re-points, not by a poll's; a recloning one is not unblocked either, whatever
/// its position says mid-copy.
#[test]
fn blocked_and_recloning_sites_are_left_alone() {
    let mut sites = iad_dead();
    sites[2].recovery_blocked = true;
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(d.actions, vec![emergency("iad", "pdx", &[])]);
    // Mid-copy the target's position is empty: it diverges from nothing, yet stays blocked.
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let mut pdx = site("pdx", 1, SiteState::ReadOnly, "");
    pdx.gtid = Some(g(""));
    pdx.recovery_blocked = true;
    pdx.recloning = true;
    let sites = vec![iad, pdx.clone()];
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(
        d.conditions.recovery_pending.as_deref(),
        Some("being recloned: pdx")
    );
    // Not recloning: the same position unblocks it.
    pdx.recloning = false;
    let sites = vec![sites[0].clone(), pdx];
    let d = decide(&input(&sites, "iad", ""));
    assert_eq!(
        d.actions,
        vec![Action::ClearRecoveryBlock { site: "pdx".into() }]
    );
}

/// The divergent part a status shows for a blocked site: against the promotion point with
/// failover history, against the active site without.
#[test]
fn a_blocked_sites_divergence_is_reported() {
    let iad = site("iad", 0, SiteState::ReadOnly, "0-1-105");
    let pdx = site("pdx", 1, SiteState::Writable, "0-2-130");
    let sites = vec![iad, pdx];
    let promo = g("0-1-100");
    let i = promoted(input(&sites, "pdx", "pdx"), &promo);
    let (set, n) = divergence(&sites[0], &i).unwrap();
    assert_eq!((set.to_string(), n), ("0-1-105".to_string(), 5));
    let (set, n) = divergence(&sites[1], &i).unwrap();
    assert!(set.is_empty() && n == 0);
    let mut blind = sites.clone();
    blind[0].gtid = None;
    assert_eq!(divergence(&blind[0], &i), None);
}

/// A site whose reclone failed part-way stays blocked whatever its position says: only
/// another reclone clears it.
#[test]
fn a_site_whose_reclone_failed_is_not_unblocked_by_its_position() {
    let iad = site("iad", 0, SiteState::Writable, "0-1-100");
    let mut pdx = site("pdx", 1, SiteState::ReadOnly, "0-1-40");
    pdx.recovery_blocked = true;
    pdx.reclone_failed = true;
    let sites = vec![iad, pdx];
    let d = decide(&input(&sites, "iad", ""));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(
        d.conditions.recovery_pending.as_deref(),
        Some("reclone failed part-way (reclone again): pdx")
    );
}

#[test]
fn every_topology_has_its_name() {
    let state =
        |sites: &[SiteView], active: &str, last: &str| decide(&input(sites, active, last)).topology;
    // No active site yet.
    assert_eq!(state(&healthy_trio(), "", ""), TopologyState::Bootstrapping);
    // The primary takes writes.
    assert_eq!(state(&healthy_trio(), "iad", ""), TopologyState::Healthy);
    // A second writable site, whether or not the debounce confirmed it.
    let mut split = healthy_trio();
    split[1].writable_now = true;
    assert_eq!(state(&split, "iad", ""), TopologyState::Split);
    split[1].state = SiteState::Writable;
    assert_eq!(state(&split, "iad", ""), TopologyState::Split);
    // The primary is gone.
    assert_eq!(state(&iad_dead(), "iad", ""), TopologyState::PrimaryLost);
    // Announced, not yet writable: completed by a reassertion (the old primary silent, so
    // not seen writable this poll).
    let mut announced = awaiting_trio();
    announced[0].writable_now = false;
    assert_eq!(state(&announced, "pdx", "pdx"), TopologyState::Promoting);
    // The same in strict mode, waiting for the proof.
    let awaiting = crate::status::AwaitingFence {
        site: "iad".into(),
        target: "pdx".into(),
        topology_generation: 2,
        since: t(990),
    };
    let mut i = input(&announced, "pdx", "pdx");
    i.awaiting_fence = Some(&awaiting);
    let d = decide(&i);
    assert_eq!(d.topology, TopologyState::Fencing);
    assert!(
        d.alerts
            .iter()
            .any(|a| matches!(a, Alert::FenceUnconfirmed { .. })),
        "{:?}",
        d.alerts
    );
    // Every site read-only and no promotion to complete.
    let mut all_ro = healthy_trio();
    all_ro[0].state = SiteState::ReadOnly;
    let d = decide(&input(&all_ro, "iad", ""));
    assert_eq!(d.topology, TopologyState::Blocked);
    assert_eq!(d.alerts, vec![Alert::NoPrimary]);
    // The primary's state not settled yet.
    let mut settling = healthy_trio();
    settling[0].state = SiteState::Unknown;
    assert_eq!(state(&settling, "iad", ""), TopologyState::Settling);
}
