//! `kill -9` of the operator mid-reclone, then a restart: the playground's whole group (the
//! operator a process of this binary, real MariaDB servers). The copy into `reader` waits
//! behind a table lock on `reader` when the operator dies; the restarted operator finds the
//! reclone `Copying`, ends what the dead one left behind, starts the copy again (attempt 2),
//! and finishes it once the lock goes: never half-done and silent.

mod common;

use std::time::Duration;

use common::until;
use mysql_async::prelude::Queryable;
use serde_json::Value;

fn reader(s: &Value) -> &Value {
    s["sites"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "reader"))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_reclone_restarts_the_copy_and_finishes_it() {
    let pg = common::playground(|_| {}).await;
    let mut lock = bloodraven_testkit::server::root_session(&*pg.harness.lock().await, 2).await;
    lock.query_drop("LOCK TABLES app.counter READ")
        .await
        .unwrap();

    pg.reclone_site("reader").await.expect("the request");
    until(&pg, Duration::from_secs(30), "copying into reader", |s| {
        reader(s)["reclone"]["phase"] == "Copying" && reader(s)["recoveryState"] == "Recloning"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    pg.kill_operator().await.expect("the operator runs");
    assert!(!pg.operator_running().await, "the operator died");
    // Dead mid-copy: the status says where it stopped.
    let s = pg.status_value().await;
    assert_eq!(reader(&s)["reclone"]["phase"], "Copying", "{s}");
    assert_eq!(reader(&s)["reclone"]["attempts"], 1, "{s}");

    pg.start_operator().await.expect("the operator restarts");
    until(
        &pg,
        Duration::from_secs(30),
        "the copy started again",
        |s| reader(s)["reclone"]["attempts"] == 2,
    )
    .await;
    lock.query_drop("UNLOCK TABLES").await.unwrap();
    drop(lock);
    let s = until(&pg, Duration::from_secs(60), "the reclone succeeded", |s| {
        reader(s)["reclone"]["phase"] == "Succeeded" || reader(s)["reclone"]["phase"] == "Failed"
    })
    .await;
    assert_eq!(reader(&s)["reclone"]["phase"], "Succeeded", "{s}");
    until(
        &pg,
        Duration::from_secs(30),
        "reader replicating again",
        |s| reader(s)["replicating"] == true && reader(s)["recoveryState"].is_null(),
    )
    .await;
    // Its data is the primary's: the counter row is there.
    let h = pg.harness.lock().await;
    let c = h.admin(2).unwrap();
    let n = c
        .query_string("SELECT COUNT(*) FROM app.counter")
        .await
        .unwrap();
    assert_eq!(n.as_deref(), Some("1"));
    drop(h);
    pg.shutdown().await;
}
