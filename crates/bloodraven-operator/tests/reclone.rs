//! Reclones on real MariaDB servers, the operator in-process: a returning old primary blocked
//! by a divergent write is rebuilt (its divergent rows gone, no second writable site seen by
//! the probe, the group `Ready`), after a wrong confirmation and a reclone of the active site
//! were refused without changing anything; a replica whose source purged the binary logs it
//! needed is rebuilt and catches up; an emergency failover during a copy stops it as `Failed`
//! and a second reclone finishes.

mod support;

use std::time::Duration;

use bloodraven_core::contract::annotations::RECLONE_SITE;
use bloodraven_core::reason::{ConditionType, RecloneFailure, RecoveryState};
use bloodraven_core::status::{Condition, GroupStatus, ReclonePhase, SiteState};
use bloodraven_operator::OperatorHandle;
use bloodraven_testkit::ledger::Probe;
use mysql_async::prelude::Queryable;
use support::{GROUP, Live, Timings, bootstrapped, event_messages, wait_event, wait_status};

async fn request(op: &OperatorHandle, site: &str, confirm: &str) {
    op.group(GROUP)
        .await
        .unwrap()
        .annotate(RECLONE_SITE, &format!("{site}:{confirm}"))
        .await
        .unwrap();
}

/// Requests a reclone of `site` confirmed by `confirm`, and waits (up to 60 s) until it
/// succeeded: its status.
async fn recloned(
    op: &OperatorHandle,
    site: &'static str,
    confirm: &str,
) -> bloodraven_core::status::RecloneStatus {
    request(op, site, confirm).await;
    let what = format!("the reclone of {site} succeeded");
    let done = wait_status(
        op,
        Duration::from_secs(60),
        &what,
        reclone_in(site, ReclonePhase::Succeeded),
    )
    .await;
    done.site(site).unwrap().reclone.clone().unwrap()
}

fn reclone_in(site: &'static str, phase: ReclonePhase) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.site(site)
            .and_then(|x| x.reclone.as_ref())
            .is_some_and(|r| r.phase == phase)
    }
}

fn ready(s: &GroupStatus) -> bool {
    s.condition(&ConditionType::Ready)
        .is_some_and(Condition::is_true)
}

/// Waits until the annotation is gone (the operator took, or refused, the request).
async fn taken(op: &OperatorHandle) {
    let rt = op.group(GROUP).await.unwrap();
    for _ in 0..300 {
        if !rt.snapshot().annotations.contains_key(RECLONE_SITE) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the reclone request was never taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_returning_old_primary_blocked_by_a_divergent_write_is_recloned() {
    let mut live = Live::start(Timings::default()).await;
    let op = bootstrapped(&live).await;
    // iad writes two rows nobody else receives, then dies; pdx takes over and writes more.
    support::diverge_and_fail_over(&mut live, &op).await;
    live.harness.restart(0).await.unwrap();
    let blocked = wait_status(
        &op,
        Duration::from_secs(20),
        "iad blocked, reader following pdx",
        |s| {
            s.site("iad").is_some_and(|i| {
                i.recovery_state == RecoveryState::RecoveryBlocked
                    && !i.divergent_gtid_set.is_empty()
            }) && s.site("reader").is_some_and(|r| r.replicating)
        },
    )
    .await;
    let iad = blocked.site("iad").unwrap();
    // One statement, one transaction: what status says is discarded.
    assert_eq!(iad.divergent_transaction_count, Some(1), "{iad:?}");
    assert!(
        iad.divergent_gtid_set.starts_with("0-1-"),
        "iad's own transactions: {}",
        iad.divergent_gtid_set
    );
    assert_eq!(live.write_ids(0, "site = 'iad-only'").await, [9001, 9002]);

    // The application's view from here on: a probe tries a write on every site.
    let probe = Probe::start(live.probe_targets(), Duration::from_millis(5));

    // A wrong confirmation and the active site are refused; nothing changes.
    request(&op, "iad", "0-9-99999999").await;
    taken(&op).await;
    request(&op, "pdx", "pdx").await;
    taken(&op).await;
    let refused = event_messages(&op, "RecloneRefused").await;
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].contains("does not confirm") && refused[0].contains(&iad.divergent_gtid_set),
        "{}",
        refused[0]
    );
    assert!(
        refused[1].contains("pdx is the active site"),
        "{}",
        refused[1]
    );
    let unchanged = op.group(GROUP).await.unwrap().snapshot().status().clone();
    let still = unchanged.site("iad").unwrap();
    assert_eq!(still.recovery_state, RecoveryState::RecoveryBlocked);
    assert!(still.reclone.is_none() && unchanged.site("pdx").unwrap().reclone.is_none());

    // The right confirmation: the first 8 characters of what is discarded.
    let confirm: String = iad.divergent_gtid_set.chars().take(8).collect();
    let r = recloned(&op, "iad", &confirm).await;
    assert_eq!(r.donor, "reader", "a caught-up replica is preferred: {r:?}");
    assert!(r.bytes_copied > 0 && r.completion_time.is_some(), "{r:?}");
    let s = wait_status(
        &op,
        Duration::from_secs(20),
        "iad replicating, the group ready",
        |s| {
            ready(s)
                && s.site("iad").is_some_and(|i| {
                    i.state == SiteState::ReadOnly
                        && i.replicating
                        && i.recovery_state.is_none()
                        && i.divergent_gtid_set.is_empty()
                })
        },
    )
    .await;
    assert_eq!(s.active_site, "pdx");
    let log = probe.stop().await;
    assert!(
        log.two_writable().is_empty(),
        "two writable sites while recloning: {:?}",
        log.two_writable_window()
    );
    assert!(
        live.write_ids(0, "site = 'iad-only'").await.is_empty(),
        "the divergent rows are gone"
    );
    assert_eq!(
        live.write_ids(0, "site = 'pdx'").await.len(),
        5,
        "pdx's rows reached iad"
    );
    let p = live.harness.failover_client(0).probe().await.unwrap();
    assert!(p.read_only, "the recloned site stays fenced");
    assert!(
        !p.gtid.to_string().contains("-1-") || p.gtid.to_string().contains("0-2-"),
        "iad holds the group's history: {}",
        p.gtid
    );
    wait_event(&op, "RecloneStarted", 1).await;
    wait_event(&op, "RecloneSucceeded", 1).await;
    let metrics = op.state.metrics.render();
    assert!(
        metrics.contains(
            r#"bloodraven_reclones_total{group="playground",site="iad",result="succeeded"} 1"#
        ),
        "{metrics}"
    );
    op.stop().await;
}

/// reader is down while its source writes, rotates and purges the binary logs reader still
/// needs: back up, it cannot resume (error 1236), and re-pointing cannot fix it. A reclone
/// confirmed with the site's name (nothing of it diverges) rebuilds it, and it replicates
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_source_purged_its_binary_logs_is_recloned_and_catches_up() {
    let mut live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    live.harness.kill(2).unwrap();
    let mut c = mysql_async::Conn::new(live.harness.app_opts(0))
        .await
        .unwrap();
    for id in 1..=20 {
        c.query_drop(format!(
            "INSERT INTO app.writes (id, site) VALUES ({id}, 'iad')"
        ))
        .await
        .unwrap();
    }
    drop(c);
    // Rotate and purge every binary log but the new one (as root, over the socket).
    let mut root = bloodraven_testkit::server::root_session(&live.harness, 0).await;
    root.query_drop("FLUSH BINARY LOGS").await.unwrap();
    let row: mysql_async::Row = root
        .query_first("SHOW MASTER STATUS")
        .await
        .unwrap()
        .expect("binary logging is on");
    let file: String = row.get(0).unwrap();
    // A log a replica's dump thread still reads is not purged: try until only the newest is
    // left (pdx moves on to it at once).
    let mut left = usize::MAX;
    for _ in 0..100 {
        root.query_drop(format!("PURGE BINARY LOGS TO '{file}'"))
            .await
            .unwrap();
        let logs: Vec<mysql_async::Row> = root.query("SHOW BINARY LOGS").await.unwrap();
        left = logs.len();
        if left == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 1, "the older binary logs are purged");
    drop(root);
    live.harness.restart(2).await.unwrap();
    wait_status(
        &op,
        Duration::from_secs(20),
        "reader up, not replicating",
        |s| {
            s.site("reader")
                .is_some_and(|r| r.state == SiteState::ReadOnly && !r.replicating)
        },
    )
    .await;
    // Re-pointing it does not help: it still cannot replicate a poll or two later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = live.harness.failover_client(2).probe().await.unwrap();
    assert!(
        !p.replica
            .as_ref()
            .is_some_and(|r| r.io_running && r.sql_running),
        "{p:?}"
    );
    let r = recloned(&op, "reader", "reader").await;
    assert_eq!(r.donor, "pdx", "the caught-up replica is the donor: {r:?}");
    wait_status(
        &op,
        Duration::from_secs(20),
        "reader replicating again",
        |s| ready(s) && s.replication_running(),
    )
    .await;
    assert_eq!(live.write_ids(2, "site = 'iad'").await.len(), 20);
    op.stop().await;
}

/// The copy into reader waits behind a table lock on reader; meanwhile iad is killed. The
/// emergency failover happens (on its usual detection budget) and stops the reclone as
/// `Failed` (`ActiveSiteChanged`); reader, whose data the copy had begun to replace, stays
/// blocked (`RecloneFailed`) and is not re-pointed; a second reclone rebuilds it from the new
/// primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emergency_failover_during_a_copy_stops_it_and_a_second_reclone_finishes() {
    let mut live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    // A root session on reader holds a lock the load's DROP DATABASE waits behind.
    let mut lock = bloodraven_testkit::server::root_session(&live.harness, 2).await;
    lock.query_drop("LOCK TABLES app.writes READ")
        .await
        .unwrap();
    request(&op, "reader", "reader").await;
    wait_status(
        &op,
        Duration::from_secs(20),
        "copying into reader",
        reclone_in("reader", ReclonePhase::Copying),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = tokio::time::Instant::now();
    live.harness.kill(0).unwrap();
    let s = wait_status(
        &op,
        Duration::from_secs(30),
        "failover to pdx, the reclone failed",
        |s| s.active_site == "pdx" && reclone_in("reader", ReclonePhase::Failed)(s),
    )
    .await;
    let took = killed.elapsed();
    let budget = op.group(GROUP).await.unwrap().config.detection_budget();
    assert!(
        took < budget + Duration::from_secs(10),
        "the failover took {took:?} (budget {budget:?})"
    );
    let site = s.site("reader").unwrap();
    let r = site.reclone.clone().unwrap();
    assert_eq!(r.reason, Some(RecloneFailure::ActiveSiteChanged), "{r:?}");
    assert_eq!(site.recovery_state, RecoveryState::RecloneFailed);
    wait_event(&op, "RecloneFailed", 1).await;
    drop(lock);
    // It stays blocked: not re-pointed to pdx by the failover or after it.
    live.stays_fenced_unreplicated(2, "a site whose reclone failed")
        .await;
    let s = op.group(GROUP).await.unwrap().snapshot().status().clone();
    assert!(
        s.condition(&ConditionType::RecoveryPending)
            .is_some_and(|c| c.is_true() && c.message.contains("reclone failed")),
        "{:?}",
        s.conditions
    );
    // A second reclone, from the new primary's side.
    recloned(&op, "reader", "reader").await;
    support::wait_follows(&op, "reader").await;
    op.stop().await;
}
