//! The failover controller on real MariaDB servers: bootstrap, emergency failover (with lease
//! revocation, a live hold that is not read, the old primary coming back with and without
//! divergent transactions), planned failover (deferred by a hold, 20 switchovers under a
//! writer, resumed after an operator restart), intruder fencing and reassertion, and a
//! replica that cannot connect being re-pointed once per settle period, not every poll.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::reason::{ConditionReason, ConditionType, RecoveryState};
use bloodraven_core::resources::KIND_GROUP;
use bloodraven_core::status::{GroupStatus, SiteState, SiteStatus};
use bloodraven_operator::operator::OperatorHandle;
use bloodraven_store::WriteOp;
use bloodraven_testkit::faults::{Fault, Faults, When};
use bloodraven_testkit::ledger::{Writer, percentile};
use mysql_async::prelude::Queryable;
use reqwest::StatusCode;
use support::{
    Client, GROUP, Live, Timings, bootstrapped, events, plain_json, plain_text, planned_in,
    request_failover, wait_event, wait_planned, wait_replicating, wait_status,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_sets_generation_one_and_reports_the_sites() {
    let live = Live::start(Timings::default()).await;
    let op = bootstrapped(&live).await;
    // The debounce settles each site's state over `recoveryThreshold` polls, independently of
    // when the replicas' threads are seen running: wait for both.
    let s = wait_status(
        &op,
        Duration::from_secs(10),
        "replication running and iad writable",
        |s| {
            s.replication_running()
                && s.site("iad")
                    .is_some_and(|x| x.state == SiteState::Writable)
        },
    )
    .await;
    assert_eq!(s.site("iad").unwrap().state, SiteState::Writable);
    assert_eq!(s.site("pdx").unwrap().state, SiteState::ReadOnly);
    assert!(s.site("reader").unwrap().replicating);
    assert!(!s.site("iad").unwrap().gtid_executed.is_empty());
    assert!(
        events(&op)
            .await
            .iter()
            .any(|(r, _)| r == "ActiveSiteBootstrapped")
    );
    let a = plain_json(
        &op,
        &format!("/active-site?namespace=default&group={GROUP}"),
    )
    .await;
    assert_eq!(a["activeSite"], "iad");
    assert_eq!(a["topologyGeneration"], 1);
    let metrics = plain_text(&op, "/metrics").await;
    assert!(
        metrics.contains(
            "bloodraven_site_state{group=\"playground\",site=\"iad\",state=\"writable\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("bloodraven_poll_duration_seconds"));
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emergency_failover_revokes_leases_and_fences_the_returning_primary() {
    let mut live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    let client = Client::new(&live.ca, op.https_addr.unwrap());
    let token = live.token();
    // A live hold: emergency failover must not read it.
    let (m, _hold) = client.migration_with_hold(&token, "mig-1", 60).await;
    let writer = Writer::start(live.writer_targets(), Duration::from_millis(2));
    tokio::time::sleep(Duration::from_millis(300)).await;

    live.harness.kill(0).unwrap();
    let killed_at = tokio::time::Instant::now();
    let s = support::wait_failover_to(&op, "pdx", Duration::from_secs(20)).await;
    let took = killed_at.elapsed();
    assert_eq!(s.topology_generation, 2);
    assert_eq!(s.last_failover_target, "pdx");
    assert!(!s.promotion_gtid_executed.is_empty());
    // Detection budget 3 × 300 ms, plus the failover itself: generous bound for a loaded machine.
    assert!(took < Duration::from_secs(15), "failover took {took:?}");
    support::wait_leases_synced(&op.group(GROUP).await.unwrap()).await;
    let r = client
        .renew(&token, "migration", "mig-1", m.lease_token())
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["reason"], "TopologyChanged");
    assert_eq!(r.body["topologyGeneration"], 2);
    // The reader follows the new primary, unless the kill left it ahead of pdx: replication
    // is asynchronous, a reader is never a candidate, and a row iad committed that reached the
    // reader but not pdx is one the group lost. Re-pointing would bury it; the reader is
    // blocked instead. pdx never gets such a row, so the difference is fixed once iad is dead.
    follows_pdx_unless_ahead(&live, &op, 2, |_| true).await;
    let log = writer.stop().await;
    let first_on_pdx = log.acked.iter().find(|a| a.site == 1).map(|a| a.at);
    assert!(first_on_pdx.is_some(), "writes resumed on the new primary");
    println!(
        "kill → status shows pdx: {took:?}; kill → first acknowledged write on pdx: {:?}",
        first_on_pdx.unwrap() - killed_at
    );

    // The old primary comes back writable (started without read_only=ON, the crash case) and
    // is fenced on first sight.
    // Whether it is then re-pointed depends on what the kill left behind: when its last
    // commits never reached pdx it holds transactions the group does not, and must be blocked
    // instead. The rows on both servers say which case this run is.
    live.harness.restart_writable(0).await.unwrap();
    let (s, blocked) =
        follows_pdx_unless_ahead(&live, &op, 0, |i| i.state == SiteState::ReadOnly).await;
    assert_eq!(s.active_site, "pdx");
    let ev = events(&op).await;
    assert!(ev.iter().any(|(r, _)| r == "FailoverSucceeded"), "{ev:?}");
    let fenced = if blocked {
        "DataLossDetected"
    } else {
        "SiteFenced"
    };
    assert!(ev.iter().any(|(r, _)| r == fenced), "{ev:?}");
    assert!(
        ev.iter().any(|(r, _)| r == "DeploymentLeaseRevoked"),
        "{ev:?}"
    );
    // Every acknowledged write is on the new primary.
    let present = row_ids(&live, 1).await;
    let lost: Vec<u64> = log
        .acked
        .iter()
        .filter(|a| a.site == 1)
        .map(|a| a.id)
        .filter(|id| !present.contains(id))
        .collect();
    assert!(lost.is_empty(), "{lost:?}");
    op.stop().await;
}

/// The ids in `app.writes` on harness server `i`.
async fn row_ids(live: &Live, i: usize) -> BTreeSet<u64> {
    live.write_ids(i, "TRUE").await.into_iter().collect()
}

/// Waits until server `i` follows pdx or, when it holds rows pdx never received (left behind
/// by the kill: re-pointing it would bury them), is blocked; `also` must hold for it too.
/// Returns the status and whether it was blocked.
async fn follows_pdx_unless_ahead(
    live: &Live,
    op: &OperatorHandle,
    i: usize,
    also: impl Fn(&SiteStatus) -> bool,
) -> (GroupStatus, bool) {
    let name = live.harness.name(i).to_string();
    let ahead = row_ids(live, i)
        .await
        .difference(&row_ids(live, 1).await)
        .count();
    if ahead > 0 {
        println!("{ahead} row(s) on {name} never reached pdx: expecting a block");
    }
    let s = wait_site(op, &name, ahead == 0, also).await;
    (s, ahead > 0)
}

/// Waits (up to 20 s) until `site` is re-pointed (replicating, no recovery state) or, when
/// not `repointed`, blocked (not replicating, `RecoveryBlocked`), and `also` holds for it.
async fn wait_site(
    op: &OperatorHandle,
    site: &str,
    repointed: bool,
    also: impl Fn(&SiteStatus) -> bool,
) -> GroupStatus {
    let (what, recovery) = if repointed {
        ("re-pointed", RecoveryState::None)
    } else {
        ("blocked", RecoveryState::RecoveryBlocked)
    };
    wait_status(
        op,
        Duration::from_secs(20),
        &format!("{site} {what}"),
        |s| {
            s.site(site).is_some_and(|x| {
                x.replicating == repointed && x.recovery_state == recovery && also(x)
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_primary_with_divergent_transactions_is_blocked() {
    divergent_primary_returns(false).await;
}

/// The same, when the old primary comes back read-only (as a production option file says):
/// by the numbers pdx's position is ahead of iad's, and only the promotion point and the
/// origin of iad's last transaction tell that re-pointing it would bury two transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_primary_that_comes_back_read_only_with_divergent_transactions_is_blocked() {
    divergent_primary_returns(true).await;
}

async fn divergent_primary_returns(read_only_at_start: bool) {
    let mut live = Live::start(Timings::default()).await;
    let op = bootstrapped(&live).await;
    // Cut replication, then write on iad: these transactions exist only on iad; pdx then
    // writes more than iad's extra transactions (its position is numerically ahead).
    support::diverge_and_fail_over(&mut live, &op).await;
    live.harness.set_read_only_at_start(read_only_at_start);
    live.harness.restart(0).await.unwrap();
    let s = wait_site(&op, "iad", false, |i| i.state == SiteState::ReadOnly).await;
    assert!(
        s.condition(&ConditionType::RecoveryPending)
            .is_some_and(bloodraven_core::status::Condition::is_true)
    );
    let ev = events(&op).await;
    assert!(
        ev.iter()
            .any(|(r, m)| r == "DataLossDetected" && m.contains("iad")),
        "{ev:?}"
    );
    live.stays_fenced_unreplicated(0, "a divergent site").await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_failover_waits_for_a_hold_and_proceeds_on_its_own() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    let client = Client::new(&live.ca, op.https_addr.unwrap());
    let token = live.token();
    let (m, h) = client.migration_with_hold(&token, "mig-2", 30).await;
    request_failover(&op, "pdx").await;
    let s = wait_planned(&op, Duration::from_secs(10), PlannedFailoverPhase::Deferred).await;
    let pf = s.planned_failover.unwrap();
    assert_eq!(
        pf.admission.defer_reason,
        Some(bloodraven_core::reason::DeferReason::DeploymentHold)
    );
    // The hold's effective expiry: the earlier of its own and its migration lease's.
    let earlier = |a: &serde_json::Value, b: &serde_json::Value| {
        let (a, b) = (a.as_str().unwrap(), b.as_str().unwrap());
        let t = |s: &str| bloodraven_core::time::Timestamp::parse_rfc3339(s).unwrap();
        t(a).min(t(b)).to_rfc3339()
    };
    assert_eq!(
        pf.admission
            .retry_time
            .map(bloodraven_core::time::Timestamp::to_rfc3339),
        Some(earlier(&m.body["expiresAt"], &h.body["expiresAt"]))
    );
    assert_eq!(
        pf.admission.message,
        "deferred by failover-hold mig-2 (instance counter-app)"
    );
    let obs = client.observe(&token, GROUP).await;
    assert_eq!(obs.body["stable"], false);
    assert_eq!(obs.body["unstableReason"], "PlannedFailover");
    assert_eq!(
        obs.body["operations"]["plannedFailover"]["phase"],
        "Deferred"
    );
    // Renewals (of both, as a client heartbeats them) push retryTime along.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rm = client
        .renew(&token, "migration", "mig-2", m.lease_token())
        .await;
    assert_eq!(rm.status, StatusCode::OK);
    let r = client
        .renew(&token, "failover-hold", "mig-2", h.lease_token())
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let want = earlier(&rm.body["expiresAt"], &r.body["expiresAt"]);
    let s = wait_status(&op, Duration::from_secs(5), "retryTime moved", |s| {
        s.planned_failover
            .as_ref()
            .and_then(|p| p.admission.retry_time)
            .map(bloodraven_core::time::Timestamp::to_rfc3339)
            == Some(want.clone())
    })
    .await;
    assert_eq!(s.active_site, "iad");
    let metrics = plain_text(&op, "/metrics").await;
    assert!(metrics.contains("bloodraven_planned_failovers_deferred_total{group=\"playground\",reason=\"DeploymentHold\"} 1"), "once per deferral: {metrics}");
    assert!(
        events(&op)
            .await
            .iter()
            .any(|(r, _)| r == "PlannedFailoverDeferred")
    );
    // Release the hold: the failover revalidates and proceeds by itself.
    let d = client
        .release(&token, "failover-hold", "mig-2", h.lease_token())
        .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    succeeded_to_pdx(&op, Duration::from_secs(15)).await;
    // It went back through Admitting (persisted, with its event) before Draining: once when
    // requested, once after the deferral ended.
    let ev = events(&op).await;
    let admitting: Vec<&String> = ev
        .iter()
        .filter(|(r, _)| r == "PlannedFailoverAdmitting")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(admitting.len(), 2, "{ev:?}");
    assert!(
        admitting
            .iter()
            .any(|m| m.contains("no longer deferred (DeploymentHold)")),
        "{admitting:?}"
    );
    // The migration lease (no hold any more) was revoked by the generation change.
    support::wait_leases_synced(&op.group(GROUP).await.unwrap()).await;
    let r = client
        .renew(&token, "migration", "mig-2", m.lease_token())
        .await;
    assert_eq!(r.body["reason"], "TopologyChanged");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_planned_switchovers_through_the_operator_lose_nothing() {
    let (live, op) = polled_every_200ms().await;
    let writer = Writer::start(live.writer_targets(), Duration::from_millis(1));
    let mut target = "pdx";
    for n in 0..20u64 {
        wait_replicating(&op, Duration::from_secs(15)).await;
        request_failover(&op, target).await;
        let s = wait_status(&op, Duration::from_secs(30), "switchover done", |s| {
            s.planned_failover
                .as_ref()
                .is_some_and(|p| p.phase.is_terminal() && p.target == target)
                && s.topology_generation == n + 2
        })
        .await;
        let pf = s.planned_failover.unwrap();
        assert_eq!(pf.phase, PlannedFailoverPhase::Succeeded, "{pf:?}");
        assert_eq!(pf.transactions_lost, Some(0));
        assert_eq!(s.active_site, target);
        target = if target == "pdx" { "iad" } else { "pdx" };
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = writer.stop().await;
    let active = op
        .group(GROUP)
        .await
        .unwrap()
        .snapshot()
        .status()
        .active_site
        .clone();
    let idx = live.harness.index_of(&active).unwrap();
    live.harness
        .wait_replicas_caught_up(idx, Duration::from_secs(20))
        .await
        .unwrap();
    let present = row_ids(&live, idx).await;
    let lost: Vec<u64> = log
        .acked_ids()
        .into_iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    let mut gaps = log.unavailability_gaps();
    assert!(gaps.len() >= 20, "{} changes of writable site", gaps.len());
    println!(
        "planned switchover through the operator, write unavailability over {} switchovers: p50 {:?} p99 {:?} (acked {}, refused {}, ambiguous {})",
        gaps.len(),
        percentile(&mut gaps, 50.0).unwrap(),
        percentile(&mut gaps, 99.0).unwrap(),
        log.acked.len(),
        log.refused,
        log.ambiguous.len()
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intruders_are_fenced_and_a_stale_fence_on_the_primary_is_reasserted() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    // Give the group failover history.
    request_failover(&op, "pdx").await;
    wait_status(&op, Duration::from_secs(20), "on pdx", |s| {
        s.active_site == "pdx" && s.replication_running()
    })
    .await;
    // Split brain: someone makes iad writable again.
    live.set_read_only(0, false).await;
    wait_event(&op, "SiteFenced", 1).await;
    let s = wait_status(&op, Duration::from_secs(15), "iad fenced again", |s| {
        s.site("iad")
            .is_some_and(|i| i.state == SiteState::ReadOnly && i.replicating)
    })
    .await;
    assert_eq!(s.active_site, "pdx");
    assert!(live.read_only(0).await);
    // A stale fence on the primary: every site read-only → reasserted.
    live.set_read_only(1, true).await;
    wait_event(&op, "PrimaryReasserted", 1).await;
    wait_status(&op, Duration::from_secs(15), "pdx writable again", |s| {
        s.site("pdx")
            .is_some_and(|p| p.state == SiteState::Writable)
    })
    .await;
    assert!(!live.read_only(1).await);
    let ev = events(&op).await;
    assert!(ev.iter().any(|(r, _)| r == "SiteFenced"), "{ev:?}");
    assert!(ev.iter().any(|(r, _)| r == "PrimaryReasserted"), "{ev:?}");
    op.stop().await;
}

/// Announce, then promote, in an emergency: while the write that makes pdx the active site is
/// held for two seconds, pdx stays fenced; it takes writes only once that write landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_promotion_is_announced_before_the_new_primary_takes_writes() {
    let mut live = Live::start(Timings::default()).await;
    let faults = Faults::new();
    faults.on(
        When::group_status(|s| s["topologyGeneration"] == 2),
        Fault::Delay(Duration::from_secs(2)),
    );
    let op = live.bootstrapped_under(&faults).await;
    live.harness.kill(0).unwrap();
    // Wait until the promotion has started (pdx prepared: no replication left), then watch
    // pdx and the stored view together.
    let pdx = live.harness.failover_client(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = pdx.probe().await.unwrap();
        if p.replica.is_none() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "pdx never prepared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let prepared = tokio::time::Instant::now();
    loop {
        let stored = op.group(GROUP).await.unwrap().snapshot();
        let announced = stored.status().active_site == "pdx";
        let writable = !pdx.probe().await.unwrap().read_only;
        if writable {
            let now_stored = op.group(GROUP).await.unwrap().snapshot();
            assert!(
                announced || now_stored.status().active_site == "pdx",
                "pdx took writes while the stored view named {}",
                now_stored.status().active_site
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline + Duration::from_secs(10),
            "pdx never became writable"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The announcement was held for 2 s right after pdx was prepared.
    let fenced_for = prepared.elapsed();
    assert!(
        fenced_for >= Duration::from_secs(1),
        "pdx stayed fenced only {fenced_for:?} of the held announcement"
    );
    let s = op.group(GROUP).await.unwrap().snapshot();
    assert_eq!(s.status().topology_generation, 2);
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_restarted_mid_planned_failover_resumes_and_finishes() {
    let live = Live::start(Timings::default()).await;
    // First run: bootstrap normally, then stall the write that would record `Resuming`
    // (after the target was prepared, before the generation bump is persisted).
    let resuming =
        When::group_status(|s| s.pointer("/plannedFailover/phase") == Some(&"Resuming".into()));
    let op = live.bootstrapped_stalling(resuming).await;
    request_failover(&op, "pdx").await;
    wait_planned(
        &op,
        Duration::from_secs(15),
        PlannedFailoverPhase::Promoting,
    )
    .await;
    // Announce, then promote: the stalled run prepared the target but cannot announce it, so
    // the target never takes a write while the stored view still names iad.
    for _ in 0..40 {
        assert!(
            live.read_only(1).await,
            "pdx became writable before its announcement was persisted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    op.stop().await;
    // Second run on the same data: it resumes from the persisted phase.
    let op = live.operator().await;
    succeeded_to_pdx(&op, Duration::from_secs(20)).await;
    wait_replicating(&op, Duration::from_secs(15)).await;
    op.stop().await;
}

/// The request is two writes, status first. An operator that stops between them finds, on
/// its next start, the annotation next to the failover it already started: it consumes the
/// annotation and runs that one failover — not a second one, and without a rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_annotation_was_not_consumed_runs_once() {
    let live = Live::start(Timings::default()).await;
    // The write consuming the planned-failover annotation (the second of the request's two
    // writes) never completes, as if the operator stopped between the two.
    let consuming = When::against_stored(|w| {
        matches!(w.op, WriteOp::Replace(o)
            if o.kind == KIND_GROUP && !o.metadata.annotations.contains_key(PLANNED_FAILOVER))
            && w.stored
                .is_some_and(|s| s.metadata.annotations.contains_key(PLANNED_FAILOVER))
    });
    let op = live.bootstrapped_stalling(consuming).await;
    request_failover(&op, "pdx").await;
    // The request's status is written.
    wait_planned(&op, Duration::from_secs(15), PlannedFailoverPhase::Pending).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let snap = op.group(GROUP).await.unwrap().snapshot();
    assert!(
        snap.annotations.contains_key(PLANNED_FAILOVER),
        "the annotation is still there"
    );
    assert_eq!(
        snap.status().planned_failover.as_ref().unwrap().phase,
        PlannedFailoverPhase::Pending,
        "nothing advances while the annotation is there"
    );
    op.stop().await;
    let op = live.operator().await;
    succeeded_to_pdx(&op, Duration::from_secs(20)).await;
    assert!(
        !op.group(GROUP)
            .await
            .unwrap()
            .snapshot()
            .annotations
            .contains_key(PLANNED_FAILOVER)
    );
    let reasons: Vec<String> = events(&op).await.into_iter().map(|(r, _)| r).collect();
    assert!(
        !reasons.iter().any(|r| r == "PlannedFailoverRejected"),
        "{reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| *r == "PlannedFailoverSucceeded")
            .count(),
        1
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_source_refuses_it_is_repointed_once_per_settle_period() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    let before = events(&op)
        .await
        .iter()
        .filter(|(r, m)| r == "ReplicaRepointed" && m.starts_with("reader "))
        .count();
    // iad refuses the replication account, and reader loses its replication: the operator
    // re-points reader, whose IO thread then keeps failing to connect.
    let repl = live.harness.accounts().replication.user.clone();
    let iad = live.harness.admin(0).unwrap();
    iad.execute(&format!("ALTER USER '{repl}'@'127.0.0.1' ACCOUNT LOCK"))
        .await
        .unwrap();
    let reader = live.harness.admin(2).unwrap();
    reader.execute("STOP SLAVE").await.unwrap();
    reader.execute("RESET SLAVE ALL").await.unwrap();
    wait_event(&op, "ReplicaRepointed", before + 1).await;
    let seen = tokio::time::Instant::now();
    // Polls come every 300 ms; a re-point every poll would be six more in two seconds. The
    // settle period (3 s here) allows none.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let count = |ev: &[(String, String)]| {
        ev.iter()
            .filter(|(r, m)| r == "ReplicaRepointed" && m.starts_with("reader "))
            .count()
    };
    let n = count(&events(&op).await);
    // A stalled machine can stretch the two seconds past the settle period, where one more
    // re-point is due; the strict check holds only while the count was read inside it.
    if seen.elapsed() < Duration::from_millis(2500) {
        assert_eq!(n, before + 1, "re-pointed again inside the settle period");
    } else {
        assert!(n <= before + 2, "{n} re-points, {before} before");
    }
    // Once iad lets it in again, reader replicates (re-pointed at most once more).
    iad.execute(&format!("ALTER USER '{repl}'@'127.0.0.1' ACCOUNT UNLOCK"))
        .await
        .unwrap();
    wait_status(
        &op,
        Duration::from_secs(20),
        "reader replicating again",
        |s| s.site("reader").is_some_and(|r| r.replicating),
    )
    .await;
    assert!(count(&events(&op).await) <= before + 3);
    op.stop().await;
}

/// From the announcement of a new active site until the group reports it `Ready`, no stored
/// status names the new active site next to `NoPrimary` — neither in a planned failover
/// (iad → pdx) nor in the emergency failover back (pdx killed → iad). Every status write is
/// read back from the store's record of what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stored_status_names_a_new_active_site_with_no_primary() {
    let mut live = Live::start(Timings::default()).await;
    let faults = Faults::new();
    let op = live.bootstrapped_under(&faults).await;
    request_failover(&op, "pdx").await;
    wait_status(
        &op,
        Duration::from_secs(30),
        "planned failover to pdx",
        |s| {
            planned_in(PlannedFailoverPhase::Succeeded)(s)
                && s.replication_running()
                && s.site("iad")
                    .is_some_and(|i| i.state == SiteState::ReadOnly)
        },
    )
    .await;
    live.harness.kill(1).unwrap();
    wait_status(
        &op,
        Duration::from_secs(30),
        "emergency failover to iad",
        |s| {
            s.active_site == "iad"
                && s.topology_generation == 3
                && s.condition(&ConditionType::Ready)
                    .is_some_and(bloodraven_core::status::Condition::is_true)
        },
    )
    .await;
    op.stop().await;

    let statuses: Vec<bloodraven_core::status::GroupStatus> = faults
        .written()
        .into_iter()
        .filter(|o| o.kind == KIND_GROUP)
        .filter_map(|o| o.body.get("status").cloned())
        .map(|s| serde_json::from_value(s).unwrap())
        .collect();
    let no_primary = |s: &bloodraven_core::status::GroupStatus| {
        s.conditions.iter().any(|c| {
            c.reason == ConditionReason::NoPrimary
                && (c.type_ == ConditionType::Degraded) == c.is_true()
        })
    };
    for generation in [2, 3] {
        let window: Vec<&bloodraven_core::status::GroupStatus> = statuses
            .iter()
            .skip_while(|s| s.topology_generation < generation)
            .take_while(|s| s.topology_generation == generation)
            .collect();
        let announced = window.first().expect("the announcement was recorded");
        let until_ready = window
            .iter()
            .position(|s| {
                s.condition(&ConditionType::Ready)
                    .is_some_and(bloodraven_core::status::Condition::is_true)
            })
            .expect("the new active site became ready");
        for (i, s) in window[..=until_ready].iter().enumerate() {
            assert!(
                !no_primary(s),
                "generation {generation} ({}), write {i} of the announcement window says NoPrimary: {}",
                announced.active_site,
                serde_json::to_string_pretty(s).unwrap()
            );
        }
    }
}

/// A planned switchover kills the demoted primary's application sessions: a pooled client
/// connection to the old primary gets an error on its next statement — a read included —
/// instead of silently reading from a server that no longer takes the group's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_to_a_demoted_primary_errors_instead_of_reading_stale_data() {
    let (live, op) = polled_every_200ms().await;
    let mut pooled = mysql_async::Conn::new(live.harness.app_opts(0))
        .await
        .unwrap();
    pooled.query_drop("SELECT 1").await.unwrap();
    // A replica's pooled connection is not touched by the switchover.
    let mut reader = mysql_async::Conn::new(live.harness.app_opts(2))
        .await
        .unwrap();
    reader.query_drop("SELECT 1").await.unwrap();
    request_failover(&op, "pdx").await;
    let s = wait_status(&op, Duration::from_secs(30), "switchover done", |s| {
        s.planned_failover
            .as_ref()
            .is_some_and(|p| p.phase.is_terminal())
    })
    .await;
    assert_eq!(s.active_site, "pdx");
    let stale: Result<Option<u64>, _> = pooled.query_first("SELECT COUNT(*) FROM app.writes").await;
    assert!(
        stale.is_err(),
        "the old primary's pooled connection still reads: {stale:?}"
    );
    assert!(reader.query_drop("SELECT 1").await.is_ok());
    op.stop().await;
}

/// A group polled every 200 ms, its operator started, bootstrapped and replicating.
async fn polled_every_200ms() -> (Live, OperatorHandle) {
    let live = Live::start(Timings {
        poll: "200ms",
        ..Timings::default()
    })
    .await;
    let op = support::replicating(&live).await;
    (live, op)
}

/// Waits (up to `limit`) until the planned failover succeeded, and checks that it made pdx
/// the active site at generation 2 and lost no transaction.
async fn succeeded_to_pdx(op: &OperatorHandle, limit: Duration) -> GroupStatus {
    let s = wait_planned(op, limit, PlannedFailoverPhase::Succeeded).await;
    assert_eq!((s.active_site.as_str(), s.topology_generation), ("pdx", 2));
    assert_eq!(
        s.planned_failover.as_ref().unwrap().transactions_lost,
        Some(0)
    );
    s
}
