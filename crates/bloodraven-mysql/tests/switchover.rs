//! The planned switchover's MySQL steps on real MariaDB servers, as the operator runs them:
//! `drain` through a held `LOCK TABLES … WRITE` under a writer, `catch_up`, promotion,
//! `repoint_all`, with nothing acknowledged lost; a drain that runs out of time changed
//! nothing; the typed undo rules; a catch-up that times out counts what is missing.

use std::time::Duration;

use bloodraven_core::planned::Undo;
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::FenceOutcome;
use bloodraven_mysql::switchover::{CatchUp, Undone, catch_up, drain, repoint_all, undo};
use bloodraven_testkit::ledger::{self, Writer};
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use tokio::time::sleep;

async fn group() -> Launcher {
    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .expect("harness");
    let [lockable, grant] = ledger::LOCKABLE_TABLE_SETUP;
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, lockable, grant]).await;
    h
}

/// An application session holding `LOCK TABLES app.locked WRITE` on server `i`.
async fn lock_held(h: &Launcher, i: usize) -> Conn {
    let mut c = Conn::new(h.app_opts(i)).await.unwrap();
    c.query_drop("LOCK TABLES app.locked WRITE").await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_steps_move_the_primary_through_a_held_lock_and_lose_nothing() {
    let h = group().await;
    let (iad, pdx, reader) = (
        h.failover_client(0),
        h.failover_client(1),
        h.failover_client(2),
    );
    let writer = Writer::start(ledger::sites(&h), Duration::from_millis(1));
    sleep(Duration::from_millis(200)).await;
    let mut holder = lock_held(&h, 0).await;

    let d = drain(&iad, Duration::from_secs(10)).await;
    assert_eq!(d.fence, FenceOutcome::Fenced);
    assert!(d.attempts >= 2, "the first attempt waited behind the lock");
    assert!(
        d.blockers
            .iter()
            .any(|s| s.account() == "app@127.0.0.1" && !s.is_busy()),
        "the idle lock holder was killed: {:?}",
        d.blockers
    );
    assert!(
        holder.query_drop("SELECT 1").await.is_err(),
        "its session is gone"
    );
    let want = d.source_gtid.unwrap().unwrap();
    assert!(matches!(
        catch_up(&pdx, &want, Duration::from_secs(30))
            .await
            .unwrap(),
        CatchUp::CaughtUp
    ));
    let promotion = pdx.promote().await.unwrap();
    assert!(
        promotion.gtid.contains(&want),
        "the promotion point holds every acknowledged write"
    );
    let failures = repoint_all(&[iad, reader], &h.source_spec(1).unwrap()).await;
    assert!(failures.is_empty(), "{failures:?}");
    sleep(Duration::from_millis(300)).await;
    let log = writer.stop().await;
    h.wait_replicas_caught_up(1, Duration::from_secs(20))
        .await
        .unwrap();
    let r = ledger::check(&h.app_opts(1), &log, None).await.unwrap();
    println!("{}", r.summary());
    assert!(r.lost.is_empty(), "acknowledged writes lost: {:?}", r.lost);
    assert!(r.unexpected.is_empty(), "{:?}", r.unexpected);
    assert!(log.acked.iter().any(|a| a.site == 1), "writes moved to pdx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_runs_out_changed_nothing_and_undo_follows_its_rule() {
    let h = group().await;
    let iad = h.failover_client(0);
    let holder = lock_held(&h, 0).await;
    // Shorter than one attempt: no time to kill the holder and try again.
    let d = drain(&iad, Duration::from_millis(500)).await;
    assert!(
        matches!(d.fence, FenceOutcome::NotFenced { .. }),
        "{:?}",
        d.fence
    );
    assert!(d.blockers.is_empty() && d.source_gtid.is_none());
    assert!(!iad.is_fenced().await.unwrap(), "nothing was changed");
    assert!(matches!(undo(&iad, &Undo::Nothing).await, Undone::Nothing));
    // Unknown outcome: read back first; a source that is not fenced is left alone…
    let read_back = Undo::ReadBackThenUnfence { site: "iad".into() };
    assert!(matches!(undo(&iad, &read_back).await, Undone::WasNotFenced));
    // …and one that is, is unfenced.
    drop(holder);
    assert_eq!(
        iad.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    assert!(matches!(undo(&iad, &read_back).await, Undone::Unfenced));
    assert!(!iad.is_fenced().await.unwrap());
    assert_eq!(
        iad.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    assert!(matches!(
        undo(&iad, &Undo::Unfence { site: "iad".into() }).await,
        Undone::Unfenced
    ));
    assert!(!iad.is_fenced().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_that_times_out_counts_what_is_missing() {
    let h = group().await;
    let (iad, pdx) = (h.failover_client(0), h.failover_client(1));
    h.admin(1)
        .unwrap()
        .execute("STOP SLAVE SQL_THREAD")
        .await
        .unwrap();
    let mut c = Conn::new(h.app_opts(0)).await.unwrap();
    for id in 1..=3 {
        c.exec_drop("INSERT INTO app.writes (id, site) VALUES (?, 'iad')", (id,))
            .await
            .unwrap();
    }
    let want = iad.probe().await.unwrap().gtid;
    match catch_up(&pdx, &want, Duration::from_millis(300))
        .await
        .unwrap()
    {
        CatchUp::TimedOut { missing } => assert_eq!(missing, 3),
        other @ CatchUp::CaughtUp => panic!("{other:?}"),
    }
}

/// An application that retries: whenever its session is killed it reconnects and queues the
/// same insert behind the held lock again, so a busy session exists at every look. Killing
/// busy sessions alone would never let the fence land; the drain goes on to the idle holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_gets_through_a_lock_whose_queued_writer_keeps_retrying() {
    let h = group().await;
    let iad = h.failover_client(0);
    let mut holder = lock_held(&h, 0).await;
    let opts = h.app_opts(0);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let retrying = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut tries = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tries += 1;
                let Ok(mut c) = Conn::new(opts.clone()).await else {
                    sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if c.query_drop("INSERT INTO app.locked VALUES (2)")
                    .await
                    .is_ok()
                {
                    break;
                }
            }
            tries
        })
    };
    assert!(
        h.wait_app_statement_running(0, "INSERT INTO app.locked", Duration::from_secs(10))
            .await,
        "the queued insert never ran"
    );
    let d = drain(&iad, Duration::from_secs(10)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(d.fence, FenceOutcome::Fenced, "{d:?}");
    assert!(
        d.attempts <= 3,
        "busy first, then idle too: {} attempts",
        d.attempts
    );
    assert!(
        holder.query_drop("SELECT 1").await.is_err(),
        "the idle lock holder was killed"
    );
    assert!(retrying.await.unwrap() >= 1);
    assert!(iad.is_fenced().await.unwrap());
}
