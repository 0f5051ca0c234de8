//! The adapter against real MariaDB servers started by the harness.

use std::time::Duration;

use bloodraven_core::gtid::{GtidFlavor, GtidSet};
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::{
    Cause, Credentials, Endpoint, FenceOutcome, MysqlError, SiteClient, Timeouts,
};
use bloodraven_testkit::ledger;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use tokio::time::{Instant, sleep};

async fn group() -> Launcher {
    let t = Instant::now();
    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .expect("harness");
    println!(
        "3 servers started and wired in {} ms",
        t.elapsed().as_millis()
    );
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL]).await;
    h
}

async fn app(h: &Launcher, i: usize) -> Conn {
    Conn::new(h.app_opts(i)).await.expect("app connection")
}

/// How many rows of `app.writes` on server `i` have `id`.
async fn rows_with_id(h: &Launcher, i: usize, id: u64) -> u64 {
    let mut c = app(h, i).await;
    let sql = format!("SELECT COUNT(*) FROM app.writes WHERE id = {id}");
    let n: Option<u64> = c.query_first(sql).await.unwrap();
    n.unwrap()
}

fn user_opts(h: &Launcher, i: usize, user: &str, pw: &str) -> mysql_async::Opts {
    OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(h.port(i))
        .prefer_socket(false)
        .user(Some(user))
        .pass(Some(pw))
        .into()
}

fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn harness_wires_gtid_replication_and_probe_sees_it() {
    let h = group().await;
    let primary = h.failover_client(0);
    let replica = h.failover_client(1);
    let mut c = app(&h, 0).await;
    c.query_drop("INSERT INTO app.writes (id, site) VALUES (1, 'iad')")
        .await
        .unwrap();
    let p = primary.probe().await.unwrap();
    assert!(p.flavor.is_mariadb());
    assert!(!p.read_only && !p.fenced());
    assert_eq!(p.super_read_only, None);
    assert!(p.replica.is_none(), "the primary is not a replica");
    assert_eq!(p.server_id, 1);
    assert!(!p.gtid.is_empty());
    assert!(
        replica
            .wait_for_gtid(&p.gtid, Duration::from_secs(10))
            .await
            .unwrap()
    );
    let r = replica.probe().await.unwrap();
    assert!(r.read_only, "replicas are fenced");
    assert!(r.gtid.contains(&p.gtid));
    let rs = r.replica.expect("replica status");
    assert!(rs.running(), "{rs:?}");
    assert_eq!(rs.source_port, h.port(0));
    // Seconds_Behind_Master can read 1 across a second boundary just after the last event.
    assert!(
        rs.seconds_behind.is_some_and(|s| s <= 1),
        "{:?}",
        rs.seconds_behind
    );
    assert_eq!(
        rows_with_id(&h, 2, 1).await,
        1,
        "the reader replicated the row"
    );
}

#[tokio::test]
async fn fence_blocks_super_and_app_but_replication_still_applies() {
    let h = group().await;
    let admin = h.admin(0).unwrap();
    admin
        .execute("CREATE USER 'super_u'@'127.0.0.1' IDENTIFIED BY 'pw'")
        .await
        .unwrap();
    admin
        .execute("GRANT SUPER, SELECT, INSERT ON *.* TO 'super_u'@'127.0.0.1'")
        .await
        .unwrap();
    let primary = h.failover_client(0);
    assert_eq!(
        primary.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    assert!(primary.is_fenced().await.unwrap());
    let mut su = Conn::new(user_opts(&h, 0, "super_u", "pw")).await.unwrap();
    let err = su
        .query_drop("INSERT INTO app.writes (id, site) VALUES (10, 'super')")
        .await
        .unwrap_err();
    assert_eq!(
        server_code(&err),
        Some(1290),
        "SUPER cannot write through read_only: {err}"
    );
    let mut a = app(&h, 0).await;
    let err = a
        .query_drop("INSERT INTO app.writes (id, site) VALUES (11, 'app')")
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(1290));

    // A fenced replica keeps applying: write on the primary (unfenced again), read on the replica.
    primary.unfence().await.unwrap();
    let replica = h.failover_client(1);
    assert_eq!(
        replica.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    a.query_drop("INSERT INTO app.writes (id, site) VALUES (12, 'iad')")
        .await
        .unwrap();
    let pos = primary.probe().await.unwrap().gtid;
    assert!(
        replica
            .wait_for_gtid(&pos, Duration::from_secs(10))
            .await
            .unwrap()
    );
    assert_eq!(rows_with_id(&h, 1, 12).await, 1);
}

#[tokio::test]
async fn fence_is_bounded_behind_lock_tables_and_reports_the_truth() {
    let h = group().await;
    let primary = h.failover_client(0);
    let admin = h.admin(0).unwrap();
    // Another session holds LOCK TABLES ... WRITE: without a short lock_wait_timeout the fence
    // would wait a day.
    let mut locker = bloodraven_testkit::server::root_session(&h, 0).await;
    locker
        .query_drop("LOCK TABLES app.writes WRITE")
        .await
        .unwrap();
    let t = Instant::now();
    let outcome = primary.fence(Duration::from_secs(1)).await;
    let took = t.elapsed();
    println!(
        "fence behind LOCK TABLES WRITE: {outcome:?} after {} ms",
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(10),
        "the fence wait was not bounded: {took:?}"
    );
    let actually = admin.is_fenced().await.unwrap();
    match &outcome {
        FenceOutcome::Fenced => assert!(actually),
        FenceOutcome::NotFenced { .. } => assert!(!actually),
        FenceOutcome::Unknown { reason } => panic!("the server was readable: {reason}"),
    }
    assert!(
        matches!(outcome, FenceOutcome::NotFenced { .. }),
        "{outcome:?}"
    );
    // Give the cancelled statement time to land if it were still pending: it must not.
    sleep(Duration::from_millis(1500)).await;
    assert!(
        !admin.is_fenced().await.unwrap(),
        "a cancelled fence landed late"
    );
    locker.query_drop("UNLOCK TABLES").await.unwrap();
    assert_eq!(
        primary.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
}

#[tokio::test]
async fn fence_waits_for_a_running_statement_and_idle_transactions_lose_their_commit() {
    let h = group().await;
    let primary = h.failover_client(0);
    // An open transaction with an uncommitted write does not hold the fence back; its COMMIT
    // fails afterwards and the row is never written.
    let mut open = app(&h, 0).await;
    open.query_drop("BEGIN").await.unwrap();
    open.query_drop("INSERT INTO app.writes (id, site) VALUES (100, 'open-trx')")
        .await
        .unwrap();
    let t = Instant::now();
    assert_eq!(
        primary.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    println!(
        "fence with an idle open write transaction: {} ms",
        t.elapsed().as_millis()
    );
    let err = open.query_drop("COMMIT").await.unwrap_err();
    assert_eq!(server_code(&err), Some(1290), "{err}");
    primary.unfence().await.unwrap();
    assert_eq!(rows_with_id(&h, 0, 100).await, 0);

    // A running statement makes the fence wait. With a bound shorter than the statement the
    // outcome must match what the server says.
    let opts = h.app_opts(0);
    let slow = tokio::spawn(async move {
        let mut c = Conn::new(opts).await.unwrap();
        c.query_drop("INSERT INTO app.writes (id, site) SELECT 101, CONCAT('slow', SLEEP(3))")
            .await
    });
    assert!(
        h.wait_app_statement_running(0, "SLEEP(3)", Duration::from_secs(10))
            .await,
        "the slow statement started"
    );
    let t = Instant::now();
    let short = primary.fence(Duration::from_millis(500)).await;
    let actually = h.admin(0).unwrap().is_fenced().await.unwrap();
    println!(
        "fence (0.5 s bound) behind a 3 s statement: {short:?} after {} ms",
        t.elapsed().as_millis()
    );
    match &short {
        FenceOutcome::Fenced => assert!(actually),
        FenceOutcome::NotFenced { .. } => assert!(!actually),
        FenceOutcome::Unknown { .. } => panic!("server was readable"),
    }
    // With a bound longer than the statement, the fence lands after the statement commits.
    let long = primary.fence(Duration::from_secs(10)).await;
    assert_eq!(long, FenceOutcome::Fenced);
    slow.await
        .unwrap()
        .expect("the running autocommit statement finishes and commits");
    assert_eq!(rows_with_id(&h, 0, 101).await, 1);
}

#[tokio::test]
async fn unreadable_server_gives_unknown_not_a_guess() {
    let mut h = group().await;
    let quick = Timeouts {
        connect: Duration::from_millis(300),
        statement: Duration::from_millis(300),
    };
    let c = SiteClient::new("iad", h.endpoint(0), h.accounts().failover.clone(), quick);
    assert!(c.probe().await.is_ok());
    h.pause(0).unwrap();
    let outcome = c.fence(Duration::from_millis(300)).await;
    h.resume(0).unwrap();
    assert!(
        matches!(outcome, FenceOutcome::Unknown { .. }),
        "{outcome:?}"
    );
    // And a refused connection is an error naming the operation and the site.
    h.kill(0).unwrap();
    let err = c.probe().await.unwrap_err();
    assert!(
        matches!(
            err,
            MysqlError::Probe { .. } | MysqlError::DetectFlavor { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("iad"), "{err}");
}

#[tokio::test]
async fn kill_application_sessions_spares_replication_and_itself() {
    let h = group().await;
    let primary = h.failover_client(0);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(app(&h, 0).await);
    }
    let report = primary.kill_application_sessions().await.unwrap();
    assert_eq!(report.killed.len(), 3, "{report:?}");
    assert!(report.failed.is_empty());
    for mut s in sessions {
        assert!(
            s.query_drop("SELECT 1").await.is_err(),
            "an application session survived"
        );
    }
    // The replicas' dump threads survived: replication still works.
    let mut a = app(&h, 0).await;
    a.query_drop("INSERT INTO app.writes (id, site) VALUES (7, 'iad')")
        .await
        .unwrap();
    let pos = primary.probe().await.unwrap().gtid;
    for i in [1, 2] {
        let r = h.failover_client(i);
        assert!(
            r.wait_for_gtid(&pos, Duration::from_secs(10))
                .await
                .unwrap()
        );
        assert!(r.probe().await.unwrap().replica.unwrap().running());
    }
    // On a replica, the applier threads are spared too.
    let replica = h.failover_client(1);
    let report = replica.kill_application_sessions().await.unwrap();
    assert!(report.killed.is_empty(), "{report:?}");
    assert!(replica.probe().await.unwrap().replica.unwrap().running());
    // The client's own connection is still usable.
    assert!(primary.probe().await.is_ok());
}

#[tokio::test]
async fn least_privilege_accounts_and_bypass_audit() {
    let h = group().await;
    let admin = h.admin(0).unwrap();
    let app_audit = admin.audit_account("app", "127.0.0.1").await.unwrap();
    assert!(!app_audit.can_bypass_fence(), "{app_audit:?}");
    let fo = admin
        .audit_account("bloodraven", "127.0.0.1")
        .await
        .unwrap();
    assert_eq!(
        fo.bypass_privileges,
        vec!["READ ONLY ADMIN"],
        "the control plane can lift the fence"
    );
    let root = admin.audit_self().await.unwrap();
    assert!(root.can_bypass_fence(), "root has ALL PRIVILEGES: {root:?}");
    // The failover account has no DML: it cannot create an errant transaction on a replica.
    let mut fo_conn = Conn::new(user_opts(
        &h,
        1,
        "bloodraven",
        h.accounts().failover.password.expose(),
    ))
    .await
    .unwrap();
    let err = fo_conn
        .query_drop("INSERT INTO app.writes (id, site) VALUES (9, 'fo')")
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(1142), "{err}");
}

#[tokio::test]
async fn credentials_never_leak_into_errors_or_debug() {
    let h = group().await;
    let admin = h.admin(0).unwrap();
    let err = admin
        .execute("CHANGE MASTER TO MASTER_PASSWORD='topsecret-pw', NOT_AN_OPTION=1")
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("topsecret-pw"), "{text}");
    assert_eq!(err.cause().server_code(), Some(1064));
    let c = h.failover_client(0);
    let dbg = format!("{c:?} {:?}", h.accounts());
    assert!(
        !dbg.contains(h.accounts().failover.password.expose()),
        "{dbg}"
    );
    let bad = SiteClient::new(
        "iad",
        h.endpoint(0),
        Credentials::new("bloodraven", "wrong-password-xyz"),
        Timeouts::default(),
    );
    let err = bad.probe().await.unwrap_err();
    assert!(matches!(err.cause(), Cause::Connect(_)), "{err}");
    assert!(!err.to_string().contains("wrong-password-xyz"));
}

#[tokio::test]
async fn wait_for_gtid_times_out_when_the_set_never_arrives() {
    let h = group().await;
    let replica = h.failover_client(1);
    let have = replica.probe().await.unwrap().gtid;
    let future = GtidSet::parse(GtidFlavor::MariaDb, "0-1-999999").unwrap();
    assert!(
        replica
            .wait_for_gtid(&have, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let t = Instant::now();
    assert!(
        !replica
            .wait_for_gtid(&future, Duration::from_millis(500))
            .await
            .unwrap()
    );
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn promote_and_repoint_move_replication() {
    let h = group().await;
    let (iad, pdx, reader) = (
        h.failover_client(0),
        h.failover_client(1),
        h.failover_client(2),
    );
    let mut a = app(&h, 0).await;
    a.query_drop("INSERT INTO app.writes (id, site) VALUES (1, 'iad')")
        .await
        .unwrap();
    assert_eq!(
        iad.fence(Duration::from_secs(5)).await,
        FenceOutcome::Fenced
    );
    let pos = iad.probe().await.unwrap().gtid;
    assert!(
        pdx.wait_for_gtid(&pos, Duration::from_secs(10))
            .await
            .unwrap()
    );
    let promo = pdx.promote().await.unwrap();
    assert!(promo.gtid.contains(&pos));
    let p = pdx.probe().await.unwrap();
    assert!(!p.read_only && p.replica.is_none());
    let spec = h.source_spec(1).unwrap();
    iad.repoint(&spec).await.unwrap();
    reader.repoint(&spec).await.unwrap();
    let mut b = app(&h, 1).await;
    b.query_drop("INSERT INTO app.writes (id, site) VALUES (2, 'pdx')")
        .await
        .unwrap();
    let pos = pdx.probe().await.unwrap().gtid;
    for r in [&iad, &reader] {
        assert!(
            r.wait_for_gtid(&pos, Duration::from_secs(10))
                .await
                .unwrap()
        );
        let st = r.probe().await.unwrap();
        assert!(st.read_only);
        let rs = st.replica.unwrap();
        assert!(rs.running() && rs.source_port == h.port(1), "{rs:?}");
    }
    let _ = Endpoint::tcp("127.0.0.1", 1);
}

/// Strict fencing's dead man's switch on a real server: armed, the server fences itself at
/// the deadline; armed again before it, nothing happens; dropped, nothing happens; never
/// written to the binary log (a replica gets no event and no GTID).
#[tokio::test]
async fn the_dead_mans_switch_fences_the_server_at_its_deadline_unless_renewed() {
    let h = group().await;
    let iad = h.failover_client(0);
    assert!(
        iad.event_scheduler_on().await.unwrap(),
        "the launcher starts servers with --event-scheduler=ON"
    );
    let gtid_before = h.admin(1).unwrap().probe().await.unwrap().gtid;
    // Renewed every second for four seconds with a 2 s deadline: it never fires.
    for _ in 0..4 {
        iad.arm_fence_deadline(Duration::from_secs(2))
            .await
            .unwrap();
        sleep(Duration::from_secs(1)).await;
        assert!(!iad.probe().await.unwrap().read_only, "renewed in time");
    }
    // Dropped: it never fires.
    iad.disarm_fence_deadline().await.unwrap();
    sleep(Duration::from_secs(3)).await;
    assert!(!iad.probe().await.unwrap().read_only, "dropped");
    // Armed and left alone (a hung sidecar): the server fences itself.
    let armed = Instant::now();
    iad.arm_fence_deadline(Duration::from_secs(1))
        .await
        .unwrap();
    loop {
        if iad.probe().await.unwrap().read_only {
            break;
        }
        assert!(
            armed.elapsed() < Duration::from_secs(10),
            "the event did not fence the server"
        );
        sleep(Duration::from_millis(100)).await;
    }
    println!(
        "the dead man's switch fenced the server {} ms after a 1 s deadline was set",
        armed.elapsed().as_millis()
    );
    // Nothing of it reached the binary log: the replica has no new GTID and no event.
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    let pdx = h.admin(1).unwrap();
    assert_eq!(pdx.probe().await.unwrap().gtid, gtid_before);
    let events = pdx
        .query_string("SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_NAME = 'bloodraven_fence_deadline'")
        .await
        .unwrap();
    assert_eq!(events.as_deref(), Some("0"));
    iad.unfence().await.unwrap();
}
