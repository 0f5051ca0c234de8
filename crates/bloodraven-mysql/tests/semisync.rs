//! Semi-synchronous replication and catch-up on real MariaDB servers: the settings the
//! operator applies take effect (a lossless source, acknowledging replicas); a source with no
//! replica keeps its writers waiting instead of falling back, and lets them go, with nothing
//! lost, when one returns; a crashed source started with the recommended recovery flags drops
//! what nobody acknowledged; a candidate catches up from a reader that is ahead of it.

use std::time::Duration;

use bloodraven_core::semisync::{self, Guarantee, SemiSyncState, Settings};
use bloodraven_launch::mysql::{Launcher, LauncherOptions};
use bloodraven_mysql::SiteClient;
use bloodraven_testkit::ledger;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use tokio::time::{Instant, sleep, timeout};

const PRIMARY: Settings = Settings {
    source: true,
    replica: true,
};
const REPLICA: Settings = Settings {
    source: false,
    replica: true,
};

async fn semi_sync_group(opts: LauncherOptions) -> Launcher {
    let mut h = Launcher::start(opts).await.expect("harness");
    h.wire(0).await.expect("wire");
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL]).await;
    // Through the control plane's own account, as the operator does.
    h.failover_client(0)
        .configure_semi_sync(PRIMARY)
        .await
        .expect("the failover account configures the source side");
    for i in 1..3 {
        h.failover_client(i)
            .configure_semi_sync(REPLICA)
            .await
            .expect("and the replica side");
    }
    wait_state(&h.failover_client(0), "two acknowledging replicas", |s| {
        s.source_active && s.source_clients == 2
    })
    .await;
    h
}

async fn wait_state(
    c: &SiteClient,
    what: &str,
    pred: impl Fn(&SemiSyncState) -> bool,
) -> SemiSyncState {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = c.semi_sync_state().await.expect("read semi-sync state");
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: never seen; last {s:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

async fn insert(h: &Launcher, i: usize, id: u64) -> Result<(), mysql_async::Error> {
    let mut c = Conn::new(h.app_opts(i)).await?;
    c.exec_drop(
        "INSERT INTO app.writes (id, site) VALUES (?, ?)",
        (id, h.name(i)),
    )
    .await
}

/// [`insert`] as a task of its own: a write that may wait for an acknowledgement.
async fn insert_owned(opts: mysql_async::Opts, id: u64) -> Result<(), mysql_async::Error> {
    let mut c = Conn::new(opts).await?;
    c.exec_drop("INSERT INTO app.writes (id, site) VALUES (?, 'iad')", (id,))
        .await
}

async fn has_row(h: &Launcher, i: usize, id: u64) -> bool {
    let mut c = Conn::new(h.app_opts(i)).await.unwrap();
    let n: Option<u64> = c
        .exec_first("SELECT COUNT(*) FROM app.writes WHERE id = ?", (id,))
        .await
        .unwrap();
    n == Some(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_without_replicas_keeps_its_writers_waiting_and_lets_them_go_losslessly() {
    let h = semi_sync_group(LauncherOptions::new(["iad", "pdx", "reader"])).await;
    let iad = h.failover_client(0);
    let state = iad.semi_sync_state().await.unwrap();
    assert!(state.after_sync, "AFTER_SYNC, not MariaDB's AFTER_COMMIT");
    assert_eq!(state.timeout_ms, semisync::NO_FALLBACK_TIMEOUT_MS);
    assert_eq!(semisync::guarantee(&state), Guarantee::Holds);
    for i in 1..3 {
        let r = h.failover_client(i).semi_sync_state().await.unwrap();
        assert!(
            r.replica_enabled && r.replica_active && !r.source_enabled,
            "{r:?}"
        );
    }
    insert(&h, 0, 1).await.expect("acknowledged by a replica");

    // Every replica stops: the next write waits instead of being acknowledged.
    for i in 1..3 {
        h.admin(i).unwrap().execute("STOP SLAVE").await.unwrap();
    }
    wait_state(&iad, "no replica connected", |s| s.source_clients == 0).await;
    let waiting = tokio::spawn(insert_owned(h.app_opts(0), 2));
    let s = wait_state(&iad, "a writer waiting for an acknowledgement", |s| {
        s.waiting_sessions >= 1
    })
    .await;
    assert!(s.source_active, "no fallback to asynchronous: {s:?}");
    assert!(matches!(
        semisync::guarantee(&s),
        Guarantee::WritesWait { waiting_sessions } if waiting_sessions >= 1
    ));
    // Well past MariaDB's default 10 s timeout would not be proven here; what is: it is not
    // acknowledged while no replica runs.
    sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "a write was acknowledged with no replica"
    );

    // One replica returns: the waiting write is acknowledged, and it is on that replica.
    h.admin(1).unwrap().execute("START SLAVE").await.unwrap();
    let done = timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the write is acknowledged once a replica returns")
        .unwrap();
    assert!(done.is_ok(), "{done:?}");
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .ok();
    assert!(has_row(&h, 1, 2).await);

    // Back to asynchronous without a failover: everything off.
    for i in 0..3 {
        h.failover_client(i)
            .configure_semi_sync(semisync::desired(
                bloodraven_core::config::ReplicationMode::Async,
                i == 0,
            ))
            .await
            .unwrap();
        let s = h.failover_client(i).semi_sync_state().await.unwrap();
        assert!(!s.source_enabled && !s.replica_enabled, "{s:?}");
    }
    insert(&h, 0, 3).await.expect("asynchronous again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_source_started_for_semi_sync_recovery_drops_what_nobody_acknowledged() {
    let mut opts = LauncherOptions::new(["iad", "pdx", "reader"]);
    opts.semi_sync_recovery = true;
    let mut h = semi_sync_group(opts).await;
    insert(&h, 0, 1).await.unwrap();
    let acknowledged = h.failover_client(0).probe().await.unwrap().gtid;
    for i in 1..3 {
        h.admin(i).unwrap().execute("STOP SLAVE").await.unwrap();
    }
    wait_state(&h.failover_client(0), "no replica connected", |s| {
        s.source_clients == 0
    })
    .await;
    let waiting = tokio::spawn(insert_owned(h.app_opts(0), 2));
    wait_state(&h.failover_client(0), "the write waiting", |s| {
        s.waiting_sessions >= 1
    })
    .await;
    h.kill(0).unwrap();
    assert!(
        timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .is_err(),
        "the waiting write was never acknowledged"
    );
    h.restart(0).await.unwrap();
    let after = h.failover_client(0).probe().await.unwrap().gtid;
    assert_eq!(
        after, acknowledged,
        "crash recovery truncated the unacknowledged transaction"
    );
    assert!(!has_row(&h, 0, 2).await);
    let log = std::fs::read_to_string(h.servers()[0].error_log()).unwrap();
    assert!(log.contains("truncated binlog"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_catches_up_from_a_reader_that_is_ahead_of_it() {
    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .expect("harness");
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL]).await;
    // pdx stops receiving; the reader goes on.
    h.admin(1).unwrap().execute("STOP SLAVE").await.unwrap();
    for id in 1..=20 {
        insert(&h, 0, id).await.unwrap();
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .ok();
    let reader_gtid = h.failover_client(2).probe().await.unwrap().gtid;
    let pdx = h.failover_client(1);
    assert!(!pdx.probe().await.unwrap().gtid.contains(&reader_gtid));

    let caught_up = pdx
        .catch_up(
            &h.source_spec(2).unwrap(),
            &reader_gtid,
            Duration::from_secs(10),
        )
        .await
        .expect("catch-up");
    assert_eq!(caught_up, bloodraven_mysql::CaughtUp::Replicated);
    let p = pdx.probe().await.unwrap();
    assert!(p.gtid.contains(&reader_gtid), "{} ⊉ {reader_gtid}", p.gtid);
    assert!(p.read_only, "a catching-up candidate stays fenced");
    for id in 1..=20 {
        assert!(
            has_row(&h, 1, id).await,
            "row {id} reached pdx through the reader"
        );
    }
}
