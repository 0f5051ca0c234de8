//! Figures for the MySQL adapter on real MariaDB servers, printed as median and p99:
//! - time to start 3 servers (exec → accepting connections) and to wire replication;
//! - fence latency, idle and under a continuous writer;
//! - the latency of an acknowledged single-row write, asynchronous and then semi-synchronous
//!   (`AFTER_SYNC`) on the same servers: what `spec.replication.mode: semi-sync` costs.
//!
//! The planned switchover is measured through the operator, on the path it really runs:
//! `cargo bench -p bloodraven-operator --bench failover`.
//!
//! Run: `cargo bench -p bloodraven-mysql --bench mysql` (optionally `-- RUNS`, default 20).

use std::time::Duration;

use bloodraven_core::config::ReplicationMode;
use bloodraven_core::semisync;
use bloodraven_mysql::FenceOutcome;
use bloodraven_mysql::launcher::{Launcher, LauncherOptions};
use bloodraven_testkit::ledger::{Outcome, WRITES_TABLE_DDL, Writer, percentile};
use tokio::time::{Instant, sleep};

fn show(label: &str, v: &mut [Duration]) {
    let p50 = percentile(v, 50.0).unwrap_or_default();
    let p99 = percentile(v, 99.0).unwrap_or_default();
    bloodraven_testkit::figure!(
        "{label:<58} n={:<3} p50 {:>8.2} ms   p99 {:>8.2} ms",
        v.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);

    // 1. Start-up.
    let mut start = Vec::new();
    let mut wire = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let mut h = Launcher::start(LauncherOptions::new(["iad", "pdx", "reader"]))
            .await
            .expect("start");
        start.push(t.elapsed());
        let t = Instant::now();
        h.wire(0).await.expect("wire");
        wire.push(t.elapsed());
    }
    show(
        "start 3 servers (spawn → all accept connections)",
        &mut start,
    );
    show("wire GTID replication primary → 2 replicas", &mut wire);

    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .expect("harness");
    h.admin(0).unwrap().execute(WRITES_TABLE_DDL).await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    let clients: Vec<_> = (0..3).map(|i| h.failover_client(i)).collect();

    // 2. Fence latency.
    for (label, load) in [
        ("fence (idle primary)", false),
        ("fence (primary under a 1 ms writer)", true),
    ] {
        let writer = load.then(|| {
            Writer::start_from(
                vec![(h.name(0).to_string(), h.app_opts(0))],
                Duration::from_millis(1),
                1_000_000_000,
            )
        });
        let mut v = Vec::new();
        for _ in 0..runs {
            sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            assert_eq!(
                clients[0].fence(Duration::from_secs(5)).await,
                FenceOutcome::Fenced
            );
            v.push(t.elapsed());
            clients[0].unfence().await.unwrap();
        }
        if let Some(w) = writer {
            w.stop().await;
        }
        show(label, &mut v);
    }
    // 3. The write-latency cost of semi-sync: single-row autocommit inserts, one at a time,
    //    on the same servers, asynchronous first, then lossless semi-synchronous.
    for (label, mode) in [
        ("acknowledged write (async)", ReplicationMode::Async),
        (
            "acknowledged write (semi-sync, AFTER_SYNC)",
            ReplicationMode::SemiSync,
        ),
    ] {
        for (i, c) in clients.iter().enumerate() {
            c.configure_semi_sync(semisync::desired(mode, i == 0))
                .await
                .expect("configure semi-sync");
        }
        if mode == ReplicationMode::SemiSync {
            let deadline = Instant::now() + Duration::from_secs(10);
            while clients[0]
                .semi_sync_state()
                .await
                .map_or(true, |s| s.source_clients < 2)
            {
                assert!(Instant::now() < deadline, "replicas never acknowledged");
                sleep(Duration::from_millis(50)).await;
            }
        }
        let writer = Writer::start_from(
            vec![(h.name(0).to_string(), h.app_opts(0))],
            Duration::ZERO,
            2_000_000_000 + u64::from(mode == ReplicationMode::SemiSync) * 100_000_000,
        );
        sleep(Duration::from_secs(
            u64::try_from(runs).unwrap_or(20).clamp(2, 10),
        ))
        .await;
        let log = writer.stop().await;
        let mut latencies: Vec<Duration> = log
            .attempts
            .iter()
            .filter(|a| a.outcome == Outcome::Acknowledged)
            .map(|a| a.answered - a.sent)
            .collect();
        show(label, &mut latencies);
    }
    bloodraven_testkit::report::splice_figures(
        "<!-- perf-mysql:begin (generated by scripts/bench; edits here are overwritten) -->",
        "<!-- perf-mysql:end -->",
        &format!("scripts/bench (mysql, {runs} runs)"),
        &bloodraven_runtime::clock::system().now().to_string(),
    );
}
