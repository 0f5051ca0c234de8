//! Figures for the binlog archive on a real MariaDB server:
//! - **archive lag** under a steady writer (the playground counter's load, one autocommit
//!   `UPDATE` every 10 ms, for `SECONDS`, default 30): for each transaction, the time from its
//!   commit being acknowledged to the segment holding it being in the target (a directory),
//!   p50 / p99 / max. The archiver runs as the operator runs it (a segment half a second after
//!   its first transaction);
//! - **replay rate**: every archived transaction replayed into an empty server with
//!   `mariadb-binlog | mariadb`, in transactions and binlog bytes per second.
//!
//! Run: `cargo bench -p bloodraven-mysql --bench binlog` (optionally `-- SECONDS`).

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::binlog::{self, Gtid, StopAt};
use bloodraven_launch::mysql::{Launcher, LauncherOptions};
use bloodraven_mysql::Credentials;
use bloodraven_mysql::backup::Storage;
use bloodraven_mysql::binlog::{
    ArchiveSettings, Progress, ReplayTarget, Start, follow, plan_files, read_chain, replay,
};
use tokio::sync::watch;
use tokio::time::Instant;

const USER: &str = "bench";
const PASSWORD: &str = "bench-pw-1";

fn seq_of(pos: &str) -> u64 {
    pos.rsplit('-').next().unwrap().trim().parse().unwrap()
}

/// The `per_mille`th of `sorted` (nearest rank).
fn pct(sorted: &[Duration], per_mille: usize) -> Duration {
    let i = (sorted.len().saturating_sub(1) * per_mille + 500) / 1000;
    sorted[i.min(sorted.len().saturating_sub(1))]
}

/// Notes now as when each sequence number of the segments under `dir` was first seen.
fn scan(dir: &std::path::Path, seen: &mut BTreeMap<u64, Instant>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = format!("0/{}", e.file_name().to_string_lossy());
        if let Ok(binlog::Entry::Segment(s)) = binlog::Entry::parse(&name) {
            let now = Instant::now();
            for n in s.first..=s.last {
                seen.entry(n).or_insert(now);
            }
        }
    }
}

#[allow(clippy::cast_precision_loss)] // figures for a report
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::Dir(dir.path().join("backups"));
    let h = Launcher::start_group(&["iad"]).await.unwrap();
    let iad = h.admin(0).unwrap();
    for sql in [
        "CREATE DATABASE IF NOT EXISTS bench".to_string(),
        "CREATE TABLE bench.counter (id INT PRIMARY KEY, value BIGINT)".to_string(),
        "INSERT INTO bench.counter VALUES (1, 0)".to_string(),
        format!("CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'"),
        format!("GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1'"),
    ] {
        iad.execute(sql).await.unwrap();
    }
    let pos = iad
        .query_string("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap();
    let base = Gtid {
        domain: 0,
        server: 1,
        seq: seq_of(&pos),
    };
    let endpoint = bloodraven_mysql::clone::Endpoint {
        credentials: Credentials::new(USER, PASSWORD),
        ..h.clone_endpoint(0)
    };
    let (tx, _rx) = watch::channel(Progress::default());
    let settings = ArchiveSettings {
        generation: 1,
        term: 1,
        segment_interval: Duration::from_millis(500),
        segment_bytes: 16 * 1024 * 1024,
        reader_server_id: 4_000_000_001,
    };
    let archiver = {
        let (storage, endpoint) = (storage.clone(), endpoint.clone());
        tokio::spawn(async move {
            let r = follow(&endpoint, &Start::After(base), &storage, &settings, &tx).await;
            eprintln!("the archiver ended: {r:?}");
        })
    };
    // Let the reader connect before the first write is timed.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The writer: one UPDATE every 10 ms; the acknowledged time of each sequence number.
    let acked: std::sync::Arc<std::sync::Mutex<BTreeMap<u64, Instant>>> = std::sync::Arc::default();
    let writer = {
        let acked = acked.clone();
        let c = h.admin(0).unwrap();
        tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(seconds);
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while Instant::now() < end {
                tick.tick().await;
                c.execute("UPDATE bench.counter SET value = value + 1 WHERE id = 1")
                    .await
                    .unwrap();
                let at = Instant::now();
                let pos = c
                    .query_string("SELECT @@gtid_binlog_pos")
                    .await
                    .unwrap()
                    .unwrap();
                acked.lock().unwrap().insert(seq_of(&pos), at);
            }
        })
    };
    // The watcher: when each sequence number is first in the target.
    let mut seen: BTreeMap<u64, Instant> = BTreeMap::new();
    let segments_dir = dir.path().join("backups/binlog/0");
    let mut done = false;
    while !done {
        done = writer.is_finished();
        scan(&segments_dir, &mut seen);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writer.await.unwrap();
    let last = *acked.lock().unwrap().keys().last().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains_key(&last) && Instant::now() < deadline {
        scan(&segments_dir, &mut seen);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    archiver.abort();
    let mut lags: Vec<Duration> = acked
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(n, at)| seen.get(n).map(|s| s.saturating_duration_since(*at)))
        .collect();
    lags.sort();
    let (chain, segments) = read_chain(&storage).await.unwrap();
    println!(
        "archive lag over {} transactions ({} s at one per 10 ms, {} segments): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; gaps {}",
        lags.len(),
        seconds,
        segments,
        pct(&lags, 500).as_secs_f64() * 1000.0,
        pct(&lags, 990).as_secs_f64() * 1000.0,
        lags.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
        chain.gaps().len()
    );

    // Replay: everything archived, into an empty server.
    let scratch = Launcher::start(LauncherOptions::new(["scratch"]))
        .await
        .unwrap();
    let sa = scratch.admin(0).unwrap();
    sa.execute_unlogged(vec![
        "CREATE DATABASE IF NOT EXISTS bench".into(),
        "CREATE TABLE bench.counter (id INT PRIMARY KEY, value BIGINT)".into(),
        "INSERT INTO bench.counter VALUES (1, 0)".into(),
        format!("CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'"),
        format!("GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1'"),
    ])
    .await
    .unwrap();
    let stop = chain.last(0).unwrap();
    let plan = binlog::plan(
        &chain,
        &[binlog::BackupAt {
            id: "base".into(),
            seq: base.seq,
            generation: 1,
        }],
        StopAt {
            domain: 0,
            seq: stop,
        },
    )
    .unwrap();
    let files = plan_files(&storage, &chain, &plan).await.unwrap();
    let transactions = stop - base.seq;
    let target = bloodraven_mysql::clone::Endpoint {
        credentials: Credentials::new(USER, PASSWORD),
        ..scratch.clone_endpoint(0)
    };
    let started = Instant::now();
    let r = replay(files, &ReplayTarget::Server(&target)).await.unwrap();
    let took = started.elapsed().as_secs_f64();
    let value = sa
        .query_string("SELECT value FROM bench.counter WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    println!(
        "replay of {transactions} transactions ({} bytes of binlog in {} files): {took:.2} s, {:.0} transactions/s, {:.1} MB/s; the counter reads {value}",
        r.bytes,
        r.files,
        transactions as f64 / took,
        r.bytes as f64 / took / 1e6
    );
}
