//! `spec.replication.mode: semi-sync` and the catch-up before promotion, through the operator on
//! real MariaDB servers, judged by the ledger (a writer that records every answer, a probe that
//! tries a write on every site).

mod support;

use std::time::Duration;

use bloodraven_core::config::ReplicationMode;
use bloodraven_core::semisync::SemiSyncState;
use bloodraven_core::status::GroupStatus;
use bloodraven_mysql::SiteClient;
use bloodraven_testkit::ledger::{self, Probe, Writer};
use support::{Live, Timings, bootstrapped, event_messages, wait_status};
use tokio::time::{Instant, sleep};

fn writer(live: &Live) -> Writer {
    Writer::start(live.writer_targets(), Duration::from_millis(1))
}

fn probe(live: &Live) -> Probe {
    Probe::start(live.probe_targets(), Duration::from_millis(5))
}

async fn wait_semi_sync(c: &SiteClient, what: &str, pred: impl Fn(&SemiSyncState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.semi_sync_state().await.expect("semi-sync state");
        if pred(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: never seen; last {s:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

fn degraded_reason(s: &GroupStatus) -> Option<String> {
    s.conditions
        .iter()
        .find(|c| c.type_.as_str() == "Degraded" && c.status == "True")
        .map(|c| c.reason.to_string())
}

/// The operator turns a live asynchronous group semi-synchronous (no failover), and then a
/// kill -9 of the primary under a writer loses no acknowledged write: the candidate that
/// received the most is promoted after applying all of it, already lossless before its
/// first write. Stopping every replica makes writes wait, the status says why, and they
/// resume when one returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semi_sync_loses_nothing_acknowledged_when_the_primary_is_killed() {
    let mut live = Live::start_with(Timings::default(), |o| {
        o.replication_mode = ReplicationMode::SemiSync;
    })
    .await;
    let op = bootstrapped(&live).await;
    let iad = live.harness.failover_client(0);
    wait_semi_sync(&iad, "a lossless source with two replicas", |s| {
        s.source_active && s.after_sync && s.source_clients == 2
    })
    .await;
    wait_status(
        &op,
        Duration::from_secs(10),
        "no semi-sync condition",
        |s| degraded_reason(s).is_none(),
    )
    .await;

    // Every replica stops: writes wait, and the group says why.
    for i in 1..3 {
        live.harness
            .admin(i)
            .unwrap()
            .execute("STOP SLAVE")
            .await
            .unwrap();
    }
    let w = writer(&live);
    let s = wait_status(&op, Duration::from_secs(10), "writes wait", |s| {
        degraded_reason(s).as_deref() == Some("SemiSyncWritesWait")
    })
    .await;
    let message = s
        .conditions
        .iter()
        .find(|c| c.type_.as_str() == "Degraded")
        .unwrap()
        .message
        .clone();
    assert!(message.contains("start replication"), "{message}");
    sleep(Duration::from_secs(1)).await;
    // Replication comes back (the operator re-points the stopped replicas); writes resume.
    let s = wait_status(&op, Duration::from_secs(20), "writes flow again", |s| {
        degraded_reason(s).is_none() && s.replication_running()
    })
    .await;
    assert_eq!(s.active_site, "iad");
    let before_kill = w.stop().await;
    assert!(
        before_kill.acked.len() > 50,
        "writes resumed: {} acknowledged",
        before_kill.acked.len()
    );

    // kill -9 the primary under a writer and a probe.
    let w = writer(&live);
    let p = probe(&live);
    sleep(Duration::from_millis(500)).await;
    live.harness.kill(0).unwrap();
    let killed = Instant::now();
    support::wait_failover_to(&op, "pdx", Duration::from_secs(20)).await;
    sleep(Duration::from_secs(1)).await;
    let log = w.stop().await;
    let probes = p.stop().await;
    let report = ledger::check(&live.harness.app_opts(1), &log, Some(&probes))
        .await
        .unwrap();
    assert!(report.lost.is_empty(), "{}", report.summary());
    assert_eq!(report.two_writable_rounds, 0, "{}", report.summary());
    assert!(
        log.first_ack_on(1, killed).is_some(),
        "the new primary acknowledges writes (the reader acknowledges them): {}",
        report.summary()
    );
    // The new primary runs the source side losslessly.
    wait_semi_sync(&live.harness.failover_client(1), "pdx lossless", |s| {
        s.source_enabled && s.after_sync && s.source_active
    })
    .await;
    op.stop().await;
}

/// A candidate whose applier was stopped (it received but did not apply) is behind the
/// reader when the primary dies: it catches up from the reader before its promotion, so the
/// reader's transactions are not lost and the reader is not blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_candidate_behind_the_reader_catches_up_from_it_and_the_reader_is_not_blocked() {
    let mut live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    live.harness
        .admin(1)
        .unwrap()
        .execute("STOP SLAVE SQL_THREAD")
        .await
        .unwrap();
    let w = writer(&live);
    sleep(Duration::from_millis(800)).await;
    let log = w.stop().await;
    live.harness
        .wait_replicas_caught_up(0, Duration::from_millis(1))
        .await
        .ok();
    // The reader has every write; pdx applied none of them.
    let reader = live.harness.failover_client(2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let iad_gtid = live.harness.failover_client(0).probe().await.unwrap().gtid;
    while !reader.probe().await.unwrap().gtid.contains(&iad_gtid) {
        assert!(Instant::now() < deadline, "the reader never caught up");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !live
            .harness
            .failover_client(1)
            .probe()
            .await
            .unwrap()
            .gtid
            .contains(&iad_gtid)
    );

    live.harness.kill(0).unwrap();
    let s = support::wait_failover_to(&op, "pdx", Duration::from_secs(40)).await;
    assert_eq!(s.topology_generation, 2);
    let report = ledger::check(&live.harness.app_opts(1), &log, None)
        .await
        .unwrap();
    assert!(report.lost.is_empty(), "{}", report.summary());
    let s = support::wait_follows(&op, "reader").await;
    assert!(
        s.sites.iter().all(|x| x.recovery_state.is_none()),
        "no site blocked: {:?}",
        s.sites
    );
    let events = event_messages(&op, "CaughtUpBeforePromotion").await;
    assert!(
        events.iter().any(|m| m.contains("caught up from reader")),
        "{events:?}"
    );
    op.stop().await;
}
