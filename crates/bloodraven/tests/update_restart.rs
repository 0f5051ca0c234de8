//! `kill -9` of the operator mid-update, then a restart: the playground's whole group (the
//! operator a process of this binary, real MariaDB servers, the update command the playground's
//! desk). Once while a replica is being updated (the desk held, so the command waits), once
//! while the update's switchover waits behind a failover-hold: each time the restarted
//! operator resumes from the stored phase and finishes the update.

mod common;

use std::time::Duration;

use bloodraven_playground::playground::{FIRST_MAX_CONNECTIONS, Playground};
use common::until;
use serde_json::Value;
use tokio::time::Instant;

async fn kill_operator(pg: &Playground) {
    pg.kill_operator().await.expect("the operator runs");
    assert!(!pg.operator_running().await, "the operator died");
}

fn phase(s: &Value) -> &str {
    s["updatePhase"]["phase"].as_str().unwrap_or("")
}

fn ended(s: &Value) -> bool {
    matches!(phase(s), "Succeeded" | "Failed")
}

async fn max_connections(pg: &Playground) -> Vec<u64> {
    let h = pg.harness.lock().await;
    let mut v = Vec::new();
    for i in 0..3 {
        let n = h
            .admin(i)
            .unwrap()
            .query_string("SELECT @@max_connections")
            .await
            .unwrap();
        v.push(n.unwrap().parse().unwrap());
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_update_resumes_and_finishes_it() {
    let pg = common::playground(|_| {}).await;
    let generation = pg.status_value().await["topologyGeneration"]
        .as_u64()
        .unwrap();

    // 1. Killed while a replica is being updated: the desk is held (its servers' lock), so
    //    pdx's update command waits for its restart.
    let held = pg.harness.lock().await;
    pg.ordered_update().await.expect("the request");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pg.desk.pending().iter().any(|s| s == "pdx") {
        assert!(Instant::now() < deadline, "pdx's update never ran");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    kill_operator(&pg).await;
    let s = pg.status_value().await;
    assert_eq!(phase(&s), "UpdatingReplicas", "{s}");
    assert_eq!(s["updatePhase"]["site"], "pdx", "{s}");
    drop(held);
    pg.start_operator().await.expect("the operator restarts");
    let s = until(&pg, Duration::from_secs(120), "the update ends", ended).await;
    assert_eq!(phase(&s), "Succeeded", "{s}");
    assert_eq!(s["activeSite"], "pdx", "{s}");
    assert_eq!(s["topologyGeneration"], generation + 1, "{s}");
    assert_eq!(
        s["updatePhase"]["sitesDone"],
        serde_json::json!(["pdx", "reader", "iad"])
    );
    for (i, n) in max_connections(&pg).await.into_iter().enumerate() {
        assert!(
            n > u64::from(FIRST_MAX_CONNECTIONS),
            "server {i} runs with its old setting ({n})"
        );
    }

    // 2. Killed while the update's switchover waits behind a failover-hold.
    until(&pg, Duration::from_secs(60), "the group settles", |s| {
        s["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        }) && s["sites"]
            .as_array()
            .is_some_and(|a| a.iter().filter(|x| x["replicating"] == true).count() == 2)
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match pg.take_lease().await {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "no lease: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    pg.ordered_update().await.expect("the second request");
    let s = until(
        &pg,
        Duration::from_secs(120),
        "the switchover is deferred",
        |s| {
            phase(s) == "Deferred"
                && s["updatePhase"]["admission"]["deferReason"] == "DeploymentHold"
        },
    )
    .await;
    assert_eq!(
        s["updatePhase"]["sitesDone"],
        serde_json::json!(["iad", "reader"]),
        "{s}"
    );
    kill_operator(&pg).await;
    pg.start_operator().await.expect("the operator restarts");
    until(
        &pg,
        Duration::from_secs(30),
        "still deferred after the restart",
        |s| phase(s) == "Deferred",
    )
    .await;
    pg.release_lease().await.expect("released");
    let s = until(
        &pg,
        Duration::from_secs(120),
        "the second update ends",
        ended,
    )
    .await;
    assert_eq!(phase(&s), "Succeeded", "{s}");
    assert_eq!(s["activeSite"], "iad", "{s}");
    assert_eq!(s["topologyGeneration"], generation + 2, "{s}");
    pg.shutdown().await;
}
