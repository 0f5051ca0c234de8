//! Figures for physical backups on real MariaDB servers:
//! - the disk's own sequential write rate (`dd … conv=fdatasync`), beside which the others read;
//! - backup throughput: a replica holding about `GB` gigabytes (default 1) backed up with
//!   `mariadb-backup | zstd` into checksummed files while the primary writes every millisecond
//!   (data-directory bytes per second of wall time);
//! - the CPU (user + system seconds) and peak RSS the backup's tools cost the source host
//!   (`mariadb-backup` and `zstd`, RSS sampled every 100 ms), and this process's own peak RSS
//!   (what the sidecar's part, the cutting and hashing, holds);
//! - the time to verify it (checksums, extract, prepare, a scratch server, every table);
//! - the time to restore from it, in the two parts `restore-in-place --from-backup` runs on
//!   the target: the backup turned into a dump of its schemas (checksums, prepare, a scratch
//!   server, `mariadb-dump`), then that dump loaded into the (fenced) target server. The
//!   reclones of the other sites that follow are the reclone's own figure.
//!
//! - with an S3-compatible test server at hand (`BLOODRAVEN_MOTO_SERVER`, as `scripts/test`
//!   installs it), the same replica backed up into a bucket of it: the time, and this
//!   process's peak RSS after it (the multipart upload's pieces are held here). The time is
//!   moto's more than the upload's: a Python server on the same two cores.
//!
//! Run: `cargo bench -p bloodraven-mysql --bench backup` (optionally `-- GB`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::backup::{self, Job};
use bloodraven_mysql::clone::Progress;
use bloodraven_testkit::ledger::{self, Writer};
use tokio::time::Instant;

fn now() -> bloodraven_core::time::Timestamp {
    bloodraven_core::time::Clock::now(&bloodraven_runtime::clock::SystemClock)
}

/// `dd`'s own figure for a 1 GiB sequential write to `dir`, synced.
fn disk_write_rate(dir: &Path) -> String {
    let file = dir.join("dd.bin");
    let out = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args(["bs=1M", "count=1024", "conv=fdatasync"])
        .output()
        .expect("dd runs");
    let _ = std::fs::remove_file(&file);
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// The resident set (kB) of every process of ours named `mariadb-backup` or `zstd`.
fn tools_rss_kb() -> u64 {
    let me = std::process::id().to_string();
    let mut total = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let name = field("Name:");
        if (name == "mariadb-backup" || name == "zstd") && field("PPid:") == me {
            total += field("VmRSS:")
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    total
}

/// (user + system seconds of this process's waited-for children, this process's peak RSS
/// in kB), from `/proc/self`.
fn children_cpu_and_own_peak() -> (f64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; cutime and cstime are the 16th and
    // 17th fields of the line (13th and 14th after it).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let clk = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    let cpu = (ticks(13) + ticks(14)) / clk;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0);
    (cpu, hwm)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::cast_precision_loss)] // figures for a report
async fn main() {
    let gb: u64 = bloodraven_testkit::report::number_arg(1);
    let h = Launcher::start_group(&["iad", "pdx"])
        .await
        .expect("harness");
    let iad = h.admin(0).unwrap();
    println!(
        "disk (dd 1 GiB, fdatasync): {}",
        disk_write_rate(&h.servers()[1].datadir())
    );

    // ~1 KiB rows, half random bytes (incompressible) and half hex text (about 2:1), doubled
    // until the table holds about GB gigabytes.
    iad.execute("CREATE DATABASE bench").await.unwrap();
    iad.execute("CREATE TABLE bench.big (id BIGINT AUTO_INCREMENT PRIMARY KEY, r VARBINARY(512), t VARCHAR(512)) ENGINE=InnoDB")
        .await
        .unwrap();
    iad.execute("INSERT INTO bench.big (r, t) SELECT RANDOM_BYTES(512), REPEAT(MD5(RAND()), 16) FROM bench.seq_1_to_1024")
        .await
        .unwrap();
    let rows_wanted = gb * 1024 * 1024;
    let t = Instant::now();
    loop {
        let n: u64 = iad
            .query_string("SELECT COUNT(*) FROM bench.big")
            .await
            .unwrap()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if n >= rows_wanted {
            break;
        }
        let take = n.min(rows_wanted - n).min(131_072);
        iad.execute(&format!(
            "INSERT INTO bench.big (r, t) SELECT RANDOM_BYTES(512), REPEAT(MD5(RAND()), 16) FROM bench.big LIMIT {take}"
        ))
        .await
        .unwrap();
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(1800))
        .await
        .expect("the replica catches up");
    let data_bytes: u64 = h
        .admin(1)
        .unwrap()
        .query_string("SELECT SUM(data_length + index_length) FROM information_schema.tables")
        .await
        .unwrap()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    println!(
        "generated {:.2} GB of table data in {:.0} s",
        data_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );

    // The primary writes every millisecond all along.
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL]).await;
    let writer = Writer::start_from(
        vec![(h.name(0).to_string(), h.app_opts(0))],
        Duration::from_millis(1),
        1_000_000_000,
    );

    let root = tempfile::tempdir_in(h.servers()[1].datadir().parent().unwrap()).unwrap();
    let job = Job {
        id: "bench".into(),
        group: "bench".into(),
        endpoint: h.clone_endpoint(1),
        datadir: Some(h.servers()[1].datadir()),
        server_version: String::new(),
        topology_generation: 1,
        storage: backup::Storage::Dir(root.path().to_path_buf()),
        chunk_bytes: bloodraven_mysql::backup::CHUNK_BYTES,
    };
    let progress = Progress::default();
    let peak_tools = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak_tools.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(tools_rss_kb(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let (cpu_before, _) = children_cpu_and_own_peak();
    let t = Instant::now();
    let m = backup::take(&job, &now, &progress).await.expect("backup");
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let (cpu_after, own_peak) = children_cpu_and_own_peak();
    let _ = writer.stop().await;
    println!(
        "backup of the replica under a 1 ms writer: {:.1} s, {:.0} MB/s of data ({:.2} GB data → {:.2} GB stored, {} files)",
        took.as_secs_f64(),
        data_bytes as f64 / 1e6 / took.as_secs_f64(),
        data_bytes as f64 / 1e9,
        m.bytes as f64 / 1e9,
        m.files.len()
    );
    println!(
        "source host cost: mariadb-backup + zstd {:.1} CPU s ({:.0}% of one core over the backup), peak RSS {} MB; this process's peak RSS {} MB",
        cpu_after - cpu_before,
        (cpu_after - cpu_before) / took.as_secs_f64() * 100.0,
        peak_tools.load(Ordering::Relaxed) / 1024,
        own_peak / 1024
    );

    if bloodraven_testkit::s3::moto_binary().is_ok() {
        into_a_bucket(&h, data_bytes).await;
    }

    let scratch = tempfile::tempdir_in(h.servers()[1].datadir().parent().unwrap()).unwrap();
    let t = Instant::now();
    let v = backup::verify(
        &backup::Storage::Dir(root.path().to_path_buf()),
        "bench",
        &scratch.path().join("v"),
    )
    .await
    .expect("verify");
    println!(
        "verify (checksums, extract, prepare, scratch server, {} tables checked): {:.1} s",
        v.tables,
        t.elapsed().as_secs_f64()
    );

    // Restore from it: the dump of its schemas, then the load into the replica (replication
    // stopped first, as a restore's target is fenced and out of the topology).
    let work = tempfile::tempdir_in(h.servers()[1].datadir().parent().unwrap()).unwrap();
    let out = work.path().join("bench.sql");
    let t = Instant::now();
    let (_, schemas) = backup::dump_of(
        &backup::Storage::Dir(root.path().to_path_buf()),
        "bench",
        &work.path().join("w"),
        &out,
    )
    .await
    .expect("dump of the backup");
    let dumped = t.elapsed();
    let dump_bytes = std::fs::metadata(&out).map_or(0, |m| m.len());
    h.admin(1)
        .unwrap()
        .execute("STOP SLAVE")
        .await
        .expect("replication stops");
    let t = Instant::now();
    let loaded = bloodraven_mysql::restore::load(&out, &h.clone_endpoint(1), &Progress::default())
        .await
        .expect("the load");
    let load = t.elapsed();
    println!(
        "restore from it: dump of {} ({:.2} GB SQL) {:.1} s, load into the target {:.1} s ({:.0} MB/s of SQL), together {:.1} s",
        schemas.join(", "),
        dump_bytes as f64 / 1e9,
        dumped.as_secs_f64(),
        load.as_secs_f64(),
        loaded as f64 / 1e6 / load.as_secs_f64(),
        (dumped + load).as_secs_f64()
    );
}

/// The replica's backup into a bucket of a moto server: its time and this process's peak RSS.
#[allow(clippy::cast_precision_loss)] // figures for a report
async fn into_a_bucket(h: &Launcher, data_bytes: u64) {
    use bloodraven_testkit::s3::S3Server;
    let server = S3Server::start().await.expect("moto");
    server.create_bucket("bench").await.expect("the bucket");
    let storage = server.storage("bench", "g").expect("the bucket's storage");
    let job = Job {
        id: "bench-s3".into(),
        group: "bench".into(),
        endpoint: h.clone_endpoint(1),
        datadir: Some(h.servers()[1].datadir()),
        server_version: String::new(),
        topology_generation: 1,
        storage,
        chunk_bytes: bloodraven_mysql::backup::CHUNK_BYTES,
    };
    let (_, before) = children_cpu_and_own_peak();
    let t = Instant::now();
    let m = backup::take(&job, &now, &Progress::default())
        .await
        .expect("the backup into the bucket");
    let took = t.elapsed();
    let (_, after) = children_cpu_and_own_peak();
    println!(
        "backup into a bucket of moto (S3-compatible, Python, same host): {:.1} s, {:.0} MB/s of data, {:.2} GB stored in {} files; this process's peak RSS {} MB before, {} MB after",
        took.as_secs_f64(),
        data_bytes as f64 / 1e6 / took.as_secs_f64(),
        m.bytes as f64 / 1e9,
        m.files.len(),
        before / 1024,
        after / 1024
    );
}
