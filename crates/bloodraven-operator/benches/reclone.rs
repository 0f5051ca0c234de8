//! The reclone's copy on real MariaDB servers: a data set of at least 1 GB made here
//! (`bench.big`, rows of 1 kB), copied into `pdx` from a replica donor (`reader`, with
//! `--dump-slave`) and from the primary (`iad`, with `--master-data`), each time the way a
//! reclone does it (target prepared, dump streamed into the load, position seeded, re-pointed,
//! caught up). Reported per donor: MB/s and rows/s of the copy, and the p99 latency of a writer
//! inserting on the primary every millisecond during the copy, against the same writer's p99
//! before it. Then restore-in-place's load: the same data dumped to a file and loaded into a
//! fenced server (MB/s, rows/s), and a three-site restore's total (the load and two reclones
//! from the primary, from the parts measured here).
//!
//! Run: `cargo bench -p bloodraven-operator --bench reclone -- [MB]` (default 1024).

use std::time::Duration;

use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::clone::{CopyPlan, Progress, copy};
use bloodraven_testkit::ledger::{Outcome, WRITES_TABLE_DDL, Writer, percentile};
use tokio::time::Instant;

/// Rows per insert while the data set is made.
const CHUNK: u64 = 20_000;

/// The writer's acknowledged-insert latencies (answered − sent).
fn latencies(log: &bloodraven_testkit::ledger::WriterLog) -> Vec<Duration> {
    log.attempts
        .iter()
        .filter(|a| a.outcome == Outcome::Acknowledged)
        .map(|a| a.answered.saturating_duration_since(a.sent))
        .collect()
}

fn p99(mut v: Vec<Duration>) -> f64 {
    percentile(&mut v, 99.0).unwrap_or_default().as_secs_f64() * 1e3
}

async fn writer_p99(h: &Launcher, d: Duration) -> f64 {
    let w = Writer::start(
        vec![("iad".into(), h.app_opts(0))],
        Duration::from_millis(1),
    );
    tokio::time::sleep(d).await;
    p99(latencies(&w.stop().await))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let megabytes: u64 = bloodraven_testkit::report::number_arg(1024);
    let rows = megabytes * 1024;
    let h = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .unwrap();
    let iad = h.admin(0).unwrap();
    iad.execute(WRITES_TABLE_DDL).await.unwrap();
    iad.execute("CREATE DATABASE bench").await.unwrap();
    iad.execute(
        "CREATE TABLE bench.big (id BIGINT PRIMARY KEY, pad VARCHAR(1000) NOT NULL) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    let made = Instant::now();
    let mut next = 1;
    while next <= rows {
        let last = (next + CHUNK - 1).min(rows);
        iad.execute(format!(
            "INSERT INTO bench.big SELECT seq, REPEAT(CHAR(65 + seq % 26), 1000) FROM bench.seq_{next}_to_{last}"
        ))
        .await
        .unwrap();
        next = last + 1;
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(1800))
        .await
        .unwrap();
    eprintln!(
        "made {rows} rows ({megabytes} MB of payload) in {:.0} s",
        made.elapsed().as_secs_f64()
    );
    let idle = writer_p99(&h, Duration::from_secs(5)).await;
    bloodraven_testkit::figure!(
        "{:<44} p99 {idle:>6.1} ms",
        "writer on the primary, no copy running"
    );
    let mut primary_copy = 0.0;
    for (label, donor) in [("replica donor (reader)", 2), ("primary donor (iad)", 0)] {
        let target = h.failover_client(1);
        target.prepare_clone_target().await.unwrap();
        let databases = h.clone_client(donor).application_databases().await.unwrap();
        let plan = CopyPlan {
            donor: h.clone_endpoint(donor),
            donor_is_replica: donor != 0,
            target: h.clone_endpoint(1),
            databases,
            drop: Vec::new(),
        };
        let w = Writer::start_from(
            vec![("iad".into(), h.app_opts(0))],
            Duration::from_millis(1),
            10_000_000 * (donor as u64 + 1),
        );
        let progress = Progress::default();
        let copied = copy(&plan, &progress).await.expect("the copy");
        let log = w.stop().await;
        target.seed_gtid_position(&copied.position).await.unwrap();
        target.repoint(&h.source_spec(0).unwrap()).await.unwrap();
        let want = h.failover_client(0).probe().await.unwrap().gtid;
        let caught_up = Instant::now();
        assert!(
            target
                .wait_for_gtid(&want, Duration::from_secs(600))
                .await
                .unwrap()
        );
        let secs = copied.took.as_secs_f64();
        if donor == 0 {
            primary_copy = secs + caught_up.elapsed().as_secs_f64();
        }
        #[allow(clippy::cast_precision_loss)] // figures, far below 2^52
        let (total, rows) = (copied.bytes as f64 / 1e6, rows as f64);
        let (mb, rps) = (total / secs, rows / secs);
        bloodraven_testkit::figure!(
            "{label:<24} {total:>7.0} MB in {secs:>6.1} s: {mb:>6.1} MB/s, {rps:>8.0} rows/s; writer p99 {:>6.1} ms; caught up {:.1} s later",
            p99(latencies(&log)),
            caught_up.elapsed().as_secs_f64()
        );
    }

    // Restore-in-place's load: the same data as a mariadb-dump file, loaded into a fenced
    // server with binary logging off, as a restore does.
    let file = h.dir().join("bench-restore.sql");
    let dumped = Instant::now();
    bloodraven_testkit::server::dump_database(&h, 0, "bench", &file);
    let dump_secs = dumped.elapsed().as_secs_f64();
    let target = h.failover_client(1);
    target.prepare_clone_target().await.unwrap();
    let summary = bloodraven_mysql::restore::inspect(&file).await.unwrap();
    let loaded = Instant::now();
    let bytes = bloodraven_mysql::restore::load(&file, &h.clone_endpoint(1), &Progress::default())
        .await
        .expect("the load");
    let secs = loaded.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // figures, far below 2^52
    let (mb, rps) = (bytes as f64 / 1e6, rows as f64 / secs);
    bloodraven_testkit::figure!(
        "{:<24} {mb:>7.0} MB in {secs:>6.1} s: {:>6.1} MB/s, {rps:>8.0} rows/s (dump file written in {dump_secs:.1} s, {} lines)",
        "restore-in-place load",
        mb / secs,
        summary.lines
    );
    bloodraven_testkit::figure!(
        "{:<24} {:>7.1} s: the load, then two reclones from the primary ({primary_copy:.1} s each, measured above)",
        "restore of a 3-site group",
        secs + 2.0 * primary_copy
    );
    let _ = std::fs::remove_file(&file);
}
