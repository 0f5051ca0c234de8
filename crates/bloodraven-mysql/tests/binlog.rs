//! The binlog archive on real MariaDB servers: an archiver follows the primary, a switchover
//! moves it to the new primary after the last archived GTID, and the chain read back from the
//! target has no gap and no transaction twice (two archivers wrote the same range); replayed
//! into an empty server up to a point, it gives exactly the rows written up to that point.
//! A segment removed behind the archive's back is a gap named by its range.

use std::time::Duration;

use bloodraven_core::binlog::{self, Chain, Entry, Gtid, StopAt};
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::backup::Storage;
use bloodraven_mysql::binlog::{ArchiveSettings, Progress, Start, follow, piece_bytes, replay};
use bloodraven_mysql::{Credentials, SiteClient};
use tokio::sync::watch;

const ARCHIVER: &str = "archiver";
const ARCHIVER_PW: &str = "archive-pw-1";
const REPLAYER: &str = "replayer";
const REPLAYER_PW: &str = "replay-pw-1";

fn endpoint(h: &Launcher, i: usize, user: &str, pw: &str) -> bloodraven_mysql::clone::Endpoint {
    bloodraven_mysql::clone::Endpoint {
        credentials: Credentials::new(user, pw),
        ..h.clone_endpoint(i)
    }
}

/// The domain-0 GTID of `@@gtid_binlog_pos`.
async fn position(c: &SiteClient) -> Gtid {
    let pos = c
        .query_string("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default();
    let parts: Vec<u64> = pos.split('-').map(|p| p.trim().parse().unwrap()).collect();
    Gtid {
        domain: u32::try_from(parts[0]).unwrap(),
        server: u32::try_from(parts[1]).unwrap(),
        seq: parts[2],
    }
}

async fn insert(c: &SiteClient, ids: std::ops::RangeInclusive<u64>) {
    for id in ids {
        c.execute(format!(
            "INSERT INTO shop.t VALUES ({id}, REPEAT('x', 100))"
        ))
        .await
        .unwrap();
    }
}

async fn ids(c: &SiteClient) -> Vec<u64> {
    c.query_string("SELECT GROUP_CONCAT(id ORDER BY id) FROM shop.t")
        .await
        .unwrap()
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The archive as the target holds it.
async fn chain(storage: &Storage) -> Chain {
    let mut segments = Vec::new();
    let mut forks = Vec::new();
    for name in storage.list_archived().await.unwrap() {
        match Entry::parse(&name).unwrap() {
            Entry::Segment(s) => segments.push(s),
            Entry::Fork(f) => forks.push(f),
        }
    }
    Chain::build(segments, &forks)
}

/// Waits until the archive's last sequence number is `seq`.
async fn archived_up_to(storage: &Storage, seq: u64) -> Chain {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let c = chain(storage).await;
        if c.last(0) == Some(seq) {
            return c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the archive did not reach {seq}: {:?}",
            c.last(0)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn settings(generation: u64, term: u64) -> ArchiveSettings {
    ArchiveSettings {
        generation,
        term,
        segment_interval: Duration::from_millis(200),
        segment_bytes: 16 * 1024,
        reader_server_id: 4_000_000_000 - u32::try_from(term).unwrap(),
    }
}

/// Runs an archiver in a task of its own (aborted to stop it, as a leader's is dropped).
fn spawn_archiver(
    source: bloodraven_mysql::clone::Endpoint,
    start: Start,
    storage: Storage,
    s: ArchiveSettings,
) -> (tokio::task::JoinHandle<()>, watch::Receiver<Progress>) {
    let (tx, rx) = watch::channel(Progress::default());
    let task = tokio::spawn(async move {
        let r = follow(&source, &start, &storage, &s, &tx).await;
        panic!("the archiver ended: {r:?}");
    });
    (task, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_follows_a_switchover_and_replays_to_any_point_with_no_gap_or_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::Dir(dir.path().join("backups"));
    let mut h = Launcher::start_group(&["iad", "pdx"]).await.unwrap();
    let iad = h.admin(0).unwrap();
    for sql in [
        "CREATE DATABASE shop".to_string(),
        "CREATE TABLE shop.t (id BIGINT PRIMARY KEY, v VARCHAR(200))".to_string(),
        format!("CREATE USER '{ARCHIVER}'@'127.0.0.1' IDENTIFIED BY '{ARCHIVER_PW}'"),
        format!("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{ARCHIVER}'@'127.0.0.1'"),
    ] {
        iad.execute(sql).await.unwrap();
    }
    // The base: what a backup would hold. The archive starts after it.
    let base = position(&iad).await;

    // Generation 1: two archivers at once (an old and a new leader), both on iad.
    let (a1, p1) = spawn_archiver(
        endpoint(&h, 0, ARCHIVER, ARCHIVER_PW),
        Start::After(base),
        storage.clone(),
        settings(1, 1),
    );
    let (a2, _) = spawn_archiver(
        endpoint(&h, 0, ARCHIVER, ARCHIVER_PW),
        Start::After(base),
        storage.clone(),
        settings(1, 2),
    );
    insert(&iad, 1..=300).await;
    let on_iad = position(&iad).await;
    archived_up_to(&storage, on_iad.seq).await;
    a1.abort();
    a2.abort();
    assert!(
        p1.borrow().segments > 1,
        "cut into segments: {:?}",
        *p1.borrow()
    );

    // A switchover: iad read-only, pdx caught up and made the primary.
    iad.execute("SET GLOBAL read_only=ON").await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
    let pdx = h.admin(1).unwrap();
    pdx.execute("STOP SLAVE").await.unwrap();
    pdx.execute("RESET SLAVE ALL").await.unwrap();
    h.wire(1).await.unwrap();

    // Generation 2: resume where the archive ends, on pdx.
    let c = chain(&storage).await;
    let r = binlog::resume(&c, 0, Some(position(&pdx).await), 2, None);
    assert_eq!(r.fork, None, "pdx holds everything archived");
    let (a3, _) = spawn_archiver(
        endpoint(&h, 1, ARCHIVER, ARCHIVER_PW),
        Start::After(r.after.unwrap()),
        storage.clone(),
        settings(2, 2),
    );
    insert(&pdx, 301..=500).await;
    let on_pdx = position(&pdx).await;
    let c = archived_up_to(&storage, on_pdx.seq).await;
    a3.abort();
    assert!(c.gaps().is_empty(), "{:?}", c.gaps());
    assert_eq!(c.domains[&0].span(), Some((base.seq + 1, on_pdx.seq)));

    // Replayed into an empty server up to three points: the rows up to each, no more.
    let scratch = Launcher::start(bloodraven_launch::mysql::LauncherOptions::new(["scratch"]))
        .await
        .unwrap();
    let sa = scratch.admin(0).unwrap();
    for (stop, want) in [(base.seq + 120, 120), (on_iad.seq, 300), (on_pdx.seq, 500)] {
        sa.execute_unlogged(vec![
            "DROP DATABASE IF EXISTS shop".into(),
            "CREATE DATABASE shop".into(),
            "CREATE TABLE shop.t (id BIGINT PRIMARY KEY, v VARCHAR(200))".into(),
            format!(
                "CREATE USER IF NOT EXISTS '{REPLAYER}'@'127.0.0.1' IDENTIFIED BY '{REPLAYER_PW}'"
            ),
            format!("GRANT ALL PRIVILEGES ON *.* TO '{REPLAYER}'@'127.0.0.1'"),
            "RESET MASTER".into(),
        ])
        .await
        .unwrap();
        let p = binlog::plan(
            &c,
            &[binlog::BackupAt {
                id: "base".into(),
                seq: base.seq,
            }],
            StopAt {
                domain: 0,
                seq: stop,
            },
        )
        .unwrap();
        let mut files = Vec::new();
        for piece in &p.pieces {
            let name = c.segment(piece).name();
            files.push(
                piece_bytes(&storage, &name, piece.from, piece.to)
                    .await
                    .unwrap(),
            );
        }
        replay(files, &endpoint(&scratch, 0, REPLAYER, REPLAYER_PW))
            .await
            .expect("the replay");
        assert_eq!(
            ids(&sa).await,
            (1..=want).collect::<Vec<u64>>(),
            "to {stop}"
        );
        // The replayed transactions keep their GTIDs.
        assert_eq!(position(&sa).await.seq, stop, "to {stop}");
    }

    // A segment removed behind the archive's back: a gap, named by its range.
    let middle = c.domains[&0].pieces[1];
    let removed = c.segment(&middle).clone();
    let copies: Vec<String> = storage
        .list_archived()
        .await
        .unwrap()
        .into_iter()
        .filter(|n| {
            matches!(Entry::parse(n), Ok(Entry::Segment(s))
                if s.first <= middle.from && middle.from <= s.last)
        })
        .collect();
    for n in &copies {
        storage.delete_archived(n).await.unwrap();
    }
    let gaps = chain(&storage).await.gaps();
    assert!(
        gaps.iter()
            .any(|g| g.from <= middle.from && middle.from <= g.to),
        "removed {removed:?}: {gaps:?}"
    );
    let e = binlog::plan(
        &chain(&storage).await,
        &[binlog::BackupAt {
            id: "base".into(),
            seq: base.seq,
        }],
        StopAt {
            domain: 0,
            seq: on_pdx.seq,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archiver_that_cannot_read_its_source_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::Dir(dir.path().to_path_buf());
    let h = Launcher::start_group(&["iad"]).await.unwrap();
    let (tx, _rx) = watch::channel(Progress::default());
    // The clone account may not read the binlog (no REPLICATION SLAVE).
    let e = follow(
        &h.clone_endpoint(0),
        &Start::After(Gtid {
            domain: 0,
            server: 1,
            seq: 1,
        }),
        &storage,
        &settings(1, 1),
        &tx,
    )
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("mariadb-binlog") && text.contains("iad"),
        "{text}"
    );
    assert!(
        !text.contains(h.accounts().clone.password.expose()),
        "no password in {text}"
    );
}
