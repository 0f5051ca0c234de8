//! A planned failover that a long lock cannot veto, on real MariaDB servers, judged by the
//! ledger's writer: `Draining` kills the application sessions that keep the fence from landing
//! (a `LOCK TABLES … WRITE` held for 40 s, a long transaction) and tries again until the fence
//! lands or `drainTimeout` runs out; killed sessions lose only what they had not committed.

mod support;

use std::time::Duration;

use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::reason::EventReason;
use bloodraven_operator::OperatorHandle;
use bloodraven_testkit::ledger::{self, Writer, WriterLog};
use mysql_async::prelude::Queryable;
use support::{Live, Timings, planned_ended, planned_in, request_failover, wait_status};

/// A group with a table the application may lock, and an operator that bootstrapped it.
async fn live_group(drain: &'static str) -> (Live, OperatorHandle) {
    let live = Live::start(Timings {
        drain,
        ..Timings::default()
    })
    .await;
    ledger::set_up_primary(&live.harness, &ledger::LOCKABLE_TABLE_SETUP).await;
    let op = live.operator().await;
    wait_status(
        &op,
        Duration::from_secs(15),
        "bootstrap, replication, Ready",
        |s| {
            s.active_site == "iad"
                && s.replication_running()
                && s.condition(&bloodraven_core::reason::ConditionType::Ready)
                    .is_some_and(bloodraven_core::status::Condition::is_true)
                && s.condition(&bloodraven_core::reason::ConditionType::Degraded)
                    .is_some_and(|c| !c.is_true())
        },
    )
    .await;
    (live, op)
}

fn writer(live: &Live) -> Writer {
    Writer::start(live.writer_targets(), Duration::from_millis(2))
}

/// Stops `writer` (after 300 ms more) and checks its log against pdx, the new primary: no
/// acknowledged write is lost.
async fn stop_and_check_on_pdx(live: &Live, writer: Writer) -> (WriterLog, ledger::Report) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = writer.stop().await;
    let r = ledger::check(&live.harness.app_opts(1), &log, None)
        .await
        .unwrap();
    println!("{}", r.summary());
    assert!(r.lost.is_empty(), "acknowledged writes lost: {:?}", r.lost);
    (log, r)
}

async fn succeeded(op: &OperatorHandle, what: &str) {
    let s = wait_status(op, Duration::from_secs(40), what, planned_ended).await;
    let pf = s.planned_failover.unwrap();
    assert_eq!(pf.phase, PlannedFailoverPhase::Succeeded, "{what}: {pf:?}");
    assert_eq!(pf.transactions_lost, Some(0));
    assert_eq!(s.active_site, "pdx");
}

/// Waits for the planned failover to end and checks it failed with `reason`, iad staying the
/// primary.
async fn failed_with(op: &OperatorHandle, reason: &str) {
    let s = wait_status(op, Duration::from_secs(20), reason, planned_ended).await;
    let pf = s.planned_failover.unwrap();
    assert_eq!(pf.phase, PlannedFailoverPhase::Failed, "{pf:?}");
    assert_eq!(
        pf.reason
            .as_ref()
            .map(bloodraven_core::reason::FailureReason::as_str),
        Some(reason),
        "{pf:?}"
    );
    assert_eq!(s.active_site, "iad");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forty_second_lock_tables_write_does_not_veto_a_planned_failover() {
    let (live, op) = live_group("5s").await;
    let w = writer(&live);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut holder, queued) = live.hold_a_long_lock().await;
    request_failover(&op, "pdx").await;
    succeeded(&op, "the failover through a long lock").await;
    // The lock holder's connection was killed, and the queued insert never committed.
    assert!(holder.query_drop("SELECT 1").await.is_err());
    assert!(
        !queued.await.unwrap(),
        "the queued insert was killed, not committed"
    );
    let kills = support::event_messages(&op, EventReason::BlockingSessionKilled.as_str()).await;
    assert!(!kills.is_empty());
    assert!(
        kills
            .iter()
            .all(|k| k.contains("app@127.0.0.1") && k.contains(" s")),
        "{kills:?}"
    );
    assert!(
        kills
            .iter()
            .all(|k| !k.contains("INSERT") && !k.contains("app.locked")),
        "an event carries a statement's text: {kills:?}"
    );
    let (log, r) = stop_and_check_on_pdx(&live, w).await;
    assert!(r.unexpected.is_empty(), "{:?}", r.unexpected);
    assert!(
        log.acked.iter().any(|a| a.site == 1),
        "writes resumed on pdx"
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_running_transaction_does_not_veto_a_planned_failover() {
    let (live, op) = live_group("5s").await;
    let w = writer(&live);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A transaction that wrote, then runs a 40 s write statement.
    let opts = live.harness.app_opts(0);
    let long = tokio::spawn(async move {
        let mut c = mysql_async::Conn::new(opts).await.unwrap();
        c.query_drop("BEGIN").await.unwrap();
        c.query_drop("INSERT INTO app.locked VALUES (7)")
            .await
            .unwrap();
        let slept = c
            .query_drop("INSERT INTO app.locked SELECT 8 FROM DUAL WHERE SLEEP(40) = 0")
            .await;
        let committed = c.query_drop("COMMIT").await;
        slept.is_ok() && committed.is_ok()
    });
    assert!(
        live.harness
            .wait_app_statement_running(0, "SLEEP(40)", Duration::from_secs(10))
            .await,
        "the long statement never ran"
    );
    request_failover(&op, "pdx").await;
    succeeded(&op, "the failover through a long transaction").await;
    assert!(!long.await.unwrap(), "the long transaction was killed");
    assert!(
        !support::event_messages(&op, EventReason::BlockingSessionKilled.as_str())
            .await
            .is_empty(),
        "the running statement kept the fence from landing and was killed"
    );
    stop_and_check_on_pdx(&live, w).await;
    // Its uncommitted insert is nowhere.
    let mut c = mysql_async::Conn::new(live.harness.app_opts(1))
        .await
        .unwrap();
    let n: Option<u64> = c
        .query_first("SELECT COUNT(*) FROM app.locked WHERE id IN (7, 8)")
        .await
        .unwrap();
    assert_eq!(n, Some(0));
    op.stop().await;
}

/// With `drainTimeout` shorter than one bounded fence attempt there is no time to kill the
/// blockers and try again: the failover fails, the source is unfenced and stays the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_timeout_shorter_than_the_fence_fails_and_unfences() {
    let (live, op) = live_group("1s").await;
    let (_holder, _queued) = live.hold_a_long_lock().await;
    request_failover(&op, "pdx").await;
    failed_with(&op, "FenceFailed").await;
    assert!(!live.read_only(0).await, "iad was unfenced again");
    op.stop().await;
}

/// A deferred failover re-enters Admitting when its hold goes, and a target that became
/// unhealthy meanwhile fails it with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_that_broke_while_deferred_fails_admission_with_its_reason() {
    let (mut live, op) = live_group("5s").await;
    let client = support::Client::new(&live.ca, op.https_addr.unwrap());
    let token = live.token();
    let (_migration, h) = client.migration_with_hold(&token, "mig-9", 60).await;
    request_failover(&op, "pdx").await;
    wait_status(
        &op,
        Duration::from_secs(10),
        "deferred",
        planned_in(PlannedFailoverPhase::Deferred),
    )
    .await;
    live.harness.kill(1).unwrap();
    wait_status(&op, Duration::from_secs(10), "pdx unreachable", |s| {
        s.site("pdx")
            .is_some_and(|p| p.state == bloodraven_core::status::SiteState::Unreachable)
    })
    .await;
    let d = client
        .release(&token, "failover-hold", "mig-9", h.lease_token())
        .await;
    assert_eq!(d.status, reqwest::StatusCode::NO_CONTENT);
    failed_with(&op, "TargetNotReady").await;
    let admitting = support::event_messages(&op, "PlannedFailoverAdmitting").await;
    assert_eq!(admitting.len(), 2, "{admitting:?}");
    op.stop().await;
}
