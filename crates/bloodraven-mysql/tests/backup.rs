//! Physical backups on real MariaDB servers, into a directory and into a bucket of a real
//! S3-compatible server (moto): a replica's backup taken with `mariadb-backup` while the
//! primary writes, its manifest's GTID position the one the prepared data holds, the rows of
//! that position and no others in a scratch server; a changed byte fails the verification by
//! name; an id is taken once; a failed backup leaves nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bloodraven_core::time::Timestamp;
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::backup::{self, BackupError, Job, ScratchServer, Storage};
use bloodraven_mysql::clone::Progress;
use bloodraven_testkit::s3::{ACCESS_KEY_ID, S3Server, SECRET_ACCESS_KEY};

fn now() -> Timestamp {
    bloodraven_core::time::Clock::now(&bloodraven_runtime::clock::SystemClock)
}

/// The sequence number of a one-domain MariaDB GTID position (`0-1-42` → 42).
fn seq_of(position: &str) -> u64 {
    position
        .rsplit('-')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("a one-domain position: {position:?}"))
}

fn job(h: &Launcher, site: usize, id: &str, storage: &Storage) -> Job {
    Job {
        id: id.into(),
        group: "g".into(),
        endpoint: h.clone_endpoint(site),
        datadir: Some(h.servers()[site].datadir()),
        // Empty: the manifest takes the version the tool reports.
        server_version: String::new(),
        topology_generation: 7,
        storage: storage.clone(),
        // Small files: the stream is cut into several, and read back as one.
        chunk_bytes: 64 * 1024,
    }
}

/// Where a story's backups go, and how a byte of one is changed behind the product's back.
enum Target<'a> {
    Dir(std::path::PathBuf),
    Bucket {
        server: &'a S3Server,
        bucket: &'static str,
        prefix: &'static str,
    },
}

impl Target<'_> {
    fn storage(&self) -> Storage {
        match self {
            Target::Dir(root) => Storage::Dir(root.clone()),
            Target::Bucket {
                server,
                bucket,
                prefix,
            } => server.storage(bucket, prefix).unwrap(),
        }
    }

    /// Flips a bit in the middle of `file` of backup `id`.
    async fn change_a_byte(&self, id: &str, file: &str) {
        let flip = |bytes: &mut Vec<u8>| {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        };
        match self {
            Target::Dir(root) => {
                let path = root.join(id).join(file);
                let mut bytes = std::fs::read(&path).unwrap();
                flip(&mut bytes);
                std::fs::write(&path, &bytes).unwrap();
            }
            Target::Bucket {
                server,
                bucket,
                prefix,
            } => {
                let key = format!("{prefix}/{id}/{file}");
                let mut bytes = server.get(bucket, &key).await.unwrap();
                flip(&mut bytes);
                server.put(bucket, &key, bytes).await.unwrap();
            }
        }
    }

    /// Whether anything of backup `id` (whole or staged) is stored.
    async fn holds_anything_of(&self, id: &str) -> bool {
        match self {
            Target::Dir(root) => {
                root.join(id).exists() || root.join(format!("{id}.partial")).exists()
            }
            Target::Bucket {
                server,
                bucket,
                prefix,
            } => !server
                .keys(bucket, &format!("{prefix}/{id}/"))
                .await
                .unwrap()
                .is_empty(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_backup_holds_exactly_its_position_and_a_changed_byte_fails_its_check() {
    let dir = tempfile::tempdir().unwrap();
    backup_story(&Target::Dir(dir.path().join("backups"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_story_in_a_bucket_of_an_s3_compatible_server() {
    let server = S3Server::start().await.expect("moto");
    server.create_bucket("backups").await.unwrap();
    let target = Target::Bucket {
        server: &server,
        bucket: "backups",
        prefix: "prod/g",
    };
    backup_story(&target).await;
    // Nothing of the keys in what the product shows of the storage.
    let shown = format!("{:?} {}", target.storage(), target.storage().url());
    assert!(
        !shown.contains(SECRET_ACCESS_KEY) && !shown.contains(ACCESS_KEY_ID),
        "{shown}"
    );
}

/// Backup, list, refusal of a taken id, verification, the rows of the position, a changed
/// byte, removal: the same on every kind of target.
async fn backup_story(target: &Target<'_>) {
    let storage = target.storage();
    let h = Launcher::start_group(&["iad", "pdx"]).await.unwrap();
    let iad = h.admin(0).unwrap();
    iad.execute("CREATE DATABASE shop").await.unwrap();
    iad.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v VARCHAR(200))")
        .await
        .unwrap();
    let base = seq_of(
        &iad.query_string("SELECT @@gtid_binlog_pos")
            .await
            .unwrap()
            .unwrap_or_default(),
    );
    // The primary writes all along; row `id` is the transaction `base + id`.
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, stop, iad) = (written.clone(), stop.clone(), h.admin(0).unwrap());
        tokio::spawn(async move {
            let mut id = 0u64;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                iad.execute(format!(
                    "INSERT INTO shop.t VALUES ({id}, REPEAT('x', 150))"
                ))
                .await
                .unwrap();
                written.store(id, Ordering::Relaxed);
            }
        })
    };
    while written.load(Ordering::Relaxed) < 200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let progress = Progress::default();
    let m = backup::take(&job(&h, 1, "b1", &storage), &now, &progress)
        .await
        .expect("the backup");
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert_eq!(m.site, "pdx");
    assert_eq!(m.topology_generation, 7);
    assert_eq!(progress.bytes(), m.bytes);
    assert!(m.bytes > 10_000, "{m:?}");
    assert!(m.files.len() > 1, "cut into several files: {:?}", m.files);
    assert!(m.start_time <= m.completion_time);
    let version = h
        .admin(1)
        .unwrap()
        .query_string("SELECT VERSION()")
        .await
        .unwrap()
        .unwrap_or_default();
    assert_eq!(
        m.server_version, version,
        "the server's version, as reported"
    );
    assert!(
        m.gtid_position.starts_with("0-"),
        "a position from the replica's binary log: {m:?}"
    );
    if let Target::Dir(root) = target {
        assert!(
            !root.join("b1.partial").exists(),
            "the staging directory is gone"
        );
    }
    // Listed, and an id is taken once.
    let listed = backup::list(&storage).await.unwrap();
    assert_eq!(listed, vec![m.clone()]);
    let again = backup::take(&job(&h, 1, "b1", &storage), &now, &progress).await;
    assert!(
        matches!(again, Err(BackupError::Exists { .. })),
        "{again:?}"
    );

    // Verified: checksums, prepared, opened, every table checked.
    let scratch = tempfile::tempdir().unwrap();
    let verified = backup::verify(&storage, "b1", scratch.path())
        .await
        .expect("verify");
    assert!(verified.tables > 5, "{verified:?}");

    // The prepared data holds exactly the rows of its position: the GTID sequence of the
    // last insert it holds is the position's.
    let again_dir = tempfile::tempdir().unwrap();
    let data = again_dir.path().join("data");
    backup::prepare(&storage, &m, &data).await.unwrap();
    let server = ScratchServer::start(&data, again_dir.path()).await.unwrap();
    let rows = server
        .sql("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM shop.t")
        .await
        .unwrap();
    server.stop().await;
    let mut cols = rows.split_whitespace().map(|c| c.parse::<u64>().unwrap());
    let (count, max) = (cols.next().unwrap(), cols.next().unwrap());
    assert_eq!(count, max, "no gap in the rows: {rows}");
    let seq = seq_of(&m.gtid_position);
    assert_eq!(
        base + max,
        seq,
        "the rows are the position's: {rows} at {m:?}"
    );
    assert!(
        max >= 200 && max < written.load(Ordering::Relaxed),
        "{rows}"
    );

    // One byte changed: the verification fails and names the file.
    target.change_a_byte("b1", &m.files[0].name).await;
    let scratch = tempfile::tempdir().unwrap();
    let err = backup::verify(&storage, "b1", scratch.path())
        .await
        .expect_err("a changed byte");
    assert!(
        matches!(&err, BackupError::Mismatch { file, what: "the SHA-256", .. } if *file == m.files[0].name),
        "{err}"
    );

    // Removed whole, and only itself: `b10` (whose name `b1` begins) is left as it was.
    let b10 = backup::take(&job(&h, 1, "b10", &storage), &now, &Progress::default())
        .await
        .expect("a second backup");
    backup::remove(&storage, "b1").await.unwrap();
    assert_eq!(backup::list(&storage).await.unwrap(), vec![b10]);
    assert!(!target.holds_anything_of("b1").await);
    assert!(target.holds_anything_of("b10").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_the_server_refuses_leaves_nothing_and_says_why() {
    let h = Launcher::start_group(&["iad"]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("backups");
    let storage = Storage::Dir(root.clone());
    let mut j = job(&h, 0, "b2", &storage);
    let wrong = "not-the-password-3f9";
    j.endpoint.credentials =
        bloodraven_mysql::Credentials::new(&j.endpoint.credentials.user, wrong);
    let err = backup::take(&j, &now, &Progress::default())
        .await
        .expect_err("a wrong password");
    assert!(
        matches!(
            &err,
            BackupError::Tool {
                tool: "mariadb-backup",
                ..
            }
        ),
        "{err}"
    );
    assert!(!root.join("b2").exists() && !root.join("b2.partial").exists());
    assert!(backup::list(&storage).await.unwrap().is_empty());
    // Nothing of the account's password in the error.
    let password = h
        .clone_endpoint(0)
        .credentials
        .password
        .expose()
        .to_string();
    assert!(!err.to_string().contains(&password), "{err}");
    // A bad id changes nothing either.
    let err = backup::take(&job(&h, 0, "../x", &storage), &now, &Progress::default())
        .await
        .expect_err("a bad id");
    assert!(matches!(err, BackupError::InvalidId { .. }), "{err}");
}
