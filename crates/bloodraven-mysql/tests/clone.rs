//! A reclone's MySQL steps on real MariaDB servers: a divergent replica is rebuilt from a
//! replica donor and then from the primary — its divergent row and stray database gone, its
//! binary log free of any GTID of its own, replicating from the primary again — and the donor
//! replica's applier runs after the dump.

use std::time::Duration;

use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::clone::{CopyPlan, Progress, copy};
use bloodraven_mysql::site::SiteClient;

async fn rows(c: &SiteClient, sql: &str) -> Vec<String> {
    let text = c.query_string(format!("SELECT GROUP_CONCAT(x ORDER BY x) FROM ({sql}) t"));
    text.await
        .unwrap()
        .map(|s| s.split(',').map(String::from).collect())
        .unwrap_or_default()
}

/// Rebuilds `target` from `donor`, as a reclone does, and re-points it to `primary`.
async fn reclone(h: &Launcher, target: usize, donor: usize, primary: usize) -> u64 {
    let t = h.failover_client(target);
    t.prepare_clone_target().await.unwrap();
    let databases = h.clone_client(donor).application_databases().await.unwrap();
    let present = h
        .clone_client(target)
        .application_databases()
        .await
        .unwrap();
    let plan = CopyPlan {
        donor: h.clone_endpoint(donor),
        donor_is_replica: donor != primary,
        target: h.clone_endpoint(target),
        drop: present
            .into_iter()
            .filter(|d| !databases.contains(d))
            .collect(),
        databases,
    };
    let progress = Progress::default();
    let copied = copy(&plan, &progress).await.expect("the copy");
    assert_eq!(progress.bytes(), copied.bytes);
    assert!(copied.bytes > 1000, "{copied:?}");
    let primary_gtid = h.failover_client(primary).probe().await.unwrap().gtid;
    assert!(
        primary_gtid.contains(&copied.position),
        "the copy's position {} is one the primary has ({primary_gtid})",
        copied.position
    );
    t.seed_gtid_position(&copied.position).await.unwrap();
    t.repoint(&h.source_spec(primary).unwrap()).await.unwrap();
    copied.bytes
}

async fn wait_holds(h: &Launcher, target: usize, primary: usize) {
    let want = h.failover_client(primary).probe().await.unwrap().gtid;
    let t = h.failover_client(target);
    assert!(
        t.wait_for_gtid(&want, Duration::from_secs(20))
            .await
            .unwrap(),
        "{} caught up",
        h.name(target)
    );
    // Caught up says nothing about the I/O thread: with no write since the copy the seeded
    // position already equals the primary's while the thread still reports `Connecting`.
    // What must hold is that both threads end up running, so wait for that state.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let p = loop {
        let p = t.probe().await.unwrap();
        let r = p.replica.as_ref().expect("a replica");
        if (r.io_running && r.sql_running) || tokio::time::Instant::now() > deadline {
            break p;
        }
        assert!(
            r.io_connecting || r.io_running,
            "replication stopped: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let r = p.replica.as_ref().expect("a replica");
    assert!(r.io_running && r.sql_running, "{r:?}");
    assert!(p.read_only, "a recloned site stays fenced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergent_replica_is_rebuilt_from_a_replica_and_then_from_the_primary() {
    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .unwrap();
    let iad = h.admin(0).unwrap();
    iad.execute("CREATE DATABASE shop").await.unwrap();
    iad.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v VARCHAR(40))")
        .await
        .unwrap();
    iad.execute("CREATE VIEW shop.v AS SELECT id FROM shop.t WHERE id < 100")
        .await
        .unwrap();
    for id in 1..=50 {
        iad.execute(format!("INSERT INTO shop.t VALUES ({id}, 'row {id}')"))
            .await
            .unwrap();
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    // pdx diverges: replication stopped, a row and a database of its own (as root).
    let pdx = h.admin(1).unwrap();
    pdx.execute("STOP SLAVE").await.unwrap();
    pdx.execute("SET GLOBAL read_only = OFF").await.unwrap();
    pdx.execute("INSERT INTO shop.t VALUES (999, 'divergent')")
        .await
        .unwrap();
    pdx.execute("CREATE DATABASE stray").await.unwrap();
    pdx.execute("SET GLOBAL read_only = ON").await.unwrap();
    for id in 51..=60 {
        iad.execute(format!("INSERT INTO shop.t VALUES ({id}, 'row {id}')"))
            .await
            .unwrap();
    }
    let own = h.failover_client(1).probe().await.unwrap().gtid.to_string();
    assert!(own.contains("-2-"), "pdx wrote GTIDs of its own: {own}");

    // From the replica donor.
    reclone(&h, 1, 2, 0).await;
    wait_holds(&h, 1, 0).await;
    let ids = rows(&pdx, "SELECT id AS x FROM shop.t").await;
    assert_eq!(ids.len(), 60, "{ids:?}");
    assert!(
        !ids.contains(&"999".to_string()),
        "the divergent row is gone"
    );
    assert!(
        rows(
            &pdx,
            "SELECT schema_name AS x FROM information_schema.schemata WHERE schema_name = 'stray'"
        )
        .await
        .is_empty(),
        "the stray database is gone"
    );
    assert_eq!(rows(&pdx, "SELECT COUNT(*) AS x FROM shop.v").await, ["60"]);
    let binlog = pdx
        .query_string("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(!binlog.contains("-2-"), "no GTID of pdx's own: {binlog}");
    // The donor replica applies again.
    let reader = h.failover_client(2).probe().await.unwrap();
    let r = reader.replica.unwrap();
    assert!(
        r.io_running && r.sql_running,
        "the donor's applier runs: {r:?}"
    );

    // From the primary, with writes after it.
    reclone(&h, 1, 0, 0).await;
    iad.execute("INSERT INTO shop.t VALUES (61, 'after')")
        .await
        .unwrap();
    wait_holds(&h, 1, 0).await;
    assert_eq!(rows(&pdx, "SELECT COUNT(*) AS x FROM shop.t").await, ["61"]);
}
