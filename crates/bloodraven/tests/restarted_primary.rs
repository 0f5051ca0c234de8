//! A fenced old primary whose `mariadbd` restarts writable while the operator is down: the
//! playground's whole group (operator and sidecars as processes of this binary, real MariaDB
//! servers), judged by the ledger's all-site probe.
//!
//! The sidecar keeps its topology cache across the re-arm (every promotion is announced before
//! the promoted server takes writes), and it treats a server that restarted under it like a
//! boot: fenced first, cleared only on the operator's answer. With the operator down, the
//! restarted old primary is fenced within one `peerCheckInterval` and stays fenced; before, it
//! stayed writable beside the new primary until the operator came back.

mod common;

use std::time::Duration;

use bloodraven_playground::playground::Playground;
use bloodraven_testkit::ledger::{self, Probe};
use common::until;
use tokio::time::Instant;

/// The playground's sidecar `peerCheckInterval` (docs/playground.md).
const PEER_CHECK: Duration = Duration::from_secs(2);

async fn read_only(pg: &Playground, i: usize) -> Option<bool> {
    let c = pg.harness.lock().await.failover_client(i);
    c.probe().await.ok().map(|p| p.read_only)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_old_primary_restarted_writable_while_the_operator_is_down_is_fenced_within_a_tick()
 {
    let pg = common::playground(|_| {}).await;
    let sites = {
        let h = pg.harness.lock().await;
        ledger::set_up_primary(&h, &[ledger::PROBES_TABLE_DDL]).await;
        ledger::sites(&h)
    };

    // A planned failover to pdx; iad is fenced and its sidecar holds the view naming pdx.
    pg.planned_failover("pdx").await.unwrap();
    until(
        &pg,
        Duration::from_secs(30),
        "the planned failover to pdx",
        |s| s["activeSite"] == "pdx" && s["plannedFailover"]["phase"] == "Succeeded",
    )
    .await;
    assert_eq!(read_only(&pg, 0).await, Some(true), "iad fenced");
    assert_eq!(read_only(&pg, 1).await, Some(false), "pdx writable");
    // Let every sidecar tick at least once with the new view.
    tokio::time::sleep(PEER_CHECK * 2).await;

    // The operator goes away; nobody will announce anything from now on.
    pg.stop_operator().await;
    let probe = Probe::start(ledger::targets(&sites), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // iad's mariadbd dies and comes back writable (no read_only=ON in its configuration).
    pg.kill_site("iad").await.unwrap();
    tokio::time::sleep(PEER_CHECK).await;
    pg.restart_site("iad", true).await.unwrap();
    let back = Instant::now();
    let mut fenced_after = None;
    while back.elapsed() < PEER_CHECK * 6 {
        if read_only(&pg, 0).await == Some(true) {
            fenced_after = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fenced_at = Instant::now();
    // It stays fenced: nothing may unfence it while the operator cannot confirm it.
    tokio::time::sleep(PEER_CHECK * 3).await;
    let stays = read_only(&pg, 0).await;
    let log = probe.stop().await;
    pg.shutdown().await;

    let took = fenced_after.expect("the restarted old primary was never fenced");
    println!(
        "fenced {:.0} ms after the restarted server accepted connections",
        took.as_secs_f64() * 1e3
    );
    assert!(
        took <= PEER_CHECK,
        "fenced after {took:?}, more than one peerCheckInterval"
    );
    assert_eq!(stays, Some(true), "iad stayed fenced");
    // A server that boots writable takes writes from the moment it listens until its sidecar
    // fences it: that window is all the probe may see, never a moment after it.
    let two: Vec<_> = log.two_writable();
    println!(
        "probe rounds with two writable sites: {} (all between the restart and the fence)",
        two.len()
    );
    for r in &two {
        assert!(
            r.started >= back - Duration::from_secs(1) && r.started <= fenced_at,
            "two writable sites outside the restart window: round {r:?}"
        );
    }
    assert!(
        log.answered_by(1, back).len() > 10,
        "the probe kept reaching pdx"
    );
}
