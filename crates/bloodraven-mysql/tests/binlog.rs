//! The binlog archive on real MariaDB servers: an archiver follows the primary, a switchover
//! moves it to the new primary after the last archived GTID, and the chain read back from the
//! target has no gap and no transaction twice (two archivers wrote the same range); replayed
//! into an empty server up to a point, it gives exactly the rows written up to that point.
//! A segment removed behind the archive's back is a gap named by its range.

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_core::binlog::mark::MigrationMark;
use bloodraven_core::binlog::{self, Chain, Entry, Gtid, StopAt};
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::backup::Storage;
use bloodraven_mysql::binlog::{
    ArchiveSettings, Progress, ReplayTarget, Start, fetch_tail, follow, piece_bytes, replay,
};
use bloodraven_mysql::{Credentials, SiteClient};
use bloodraven_testkit::s3::S3Server;
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
        match Entry::parse(&name) {
            Ok(Entry::Segment(s)) => segments.push(s),
            Ok(Entry::Fork(f)) => forks.push(f),
            // Nothing else is written there but a migration's mark.
            Err(e) => assert!(name.starts_with("migration-"), "{name}: {e}"),
        }
    }
    Chain::build(segments, &forks)
}

/// Empties `shop` on the scratch server, replays the archive from the base to `stop` into it,
/// and returns the ids it then holds.
async fn replay_to(
    scratch: &Launcher,
    storage: &Storage,
    c: &Chain,
    base: u64,
    stop: u64,
) -> Vec<u64> {
    let sa = scratch.admin(0).unwrap();
    sa.execute_unlogged(vec![
        "DROP DATABASE IF EXISTS shop".into(),
        "CREATE DATABASE shop".into(),
        "CREATE TABLE shop.t (id BIGINT PRIMARY KEY, v VARCHAR(200))".into(),
        format!("CREATE USER IF NOT EXISTS '{REPLAYER}'@'127.0.0.1' IDENTIFIED BY '{REPLAYER_PW}'"),
        format!("GRANT ALL PRIVILEGES ON *.* TO '{REPLAYER}'@'127.0.0.1'"),
        "RESET MASTER".into(),
    ])
    .await
    .unwrap();
    let p = binlog::plan(
        c,
        &[binlog::BackupAt {
            id: "base".into(),
            seq: base,
            generation: 1,
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
            piece_bytes(storage, &name, piece.from, piece.to)
                .await
                .unwrap(),
        );
    }
    replay(
        files,
        &ReplayTarget::Server(&endpoint(scratch, 0, REPLAYER, REPLAYER_PW)),
    )
    .await
    .expect("the replay");
    ids(&sa).await
}

async fn scratch_server() -> Launcher {
    Launcher::start(bloodraven_launch::mysql::LauncherOptions::new(["scratch"]))
        .await
        .unwrap()
}

/// The group of a story: `shop.t` and the archive's account on the primary (replicated), and
/// the position after them (what a backup would hold).
async fn group() -> (Launcher, Gtid) {
    let h = Launcher::start_group(&["iad", "pdx"]).await.unwrap();
    let iad = h.admin(0).unwrap();
    for sql in [
        "CREATE DATABASE shop".to_string(),
        "CREATE TABLE shop.t (id BIGINT PRIMARY KEY, v VARCHAR(200))".to_string(),
        format!("CREATE USER '{ARCHIVER}'@'127.0.0.1' IDENTIFIED BY '{ARCHIVER_PW}'"),
        format!("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{ARCHIVER}'@'127.0.0.1'"),
    ] {
        iad.execute(sql).await.unwrap();
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
    let base = position(&iad).await;
    (h, base)
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

/// The server's clock, in whole seconds.
async fn unix_now(c: &SiteClient) -> u64 {
    let now = c.query_string("SELECT UNIX_TIMESTAMP()").await.unwrap();
    now.unwrap().parse().unwrap()
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

/// Runs an archiver of `site` (in `generation`, for the leader of `term`) reading after
/// `after`, in a task of its own (aborted to stop it, as a leader's is dropped).
fn spawn_archiver(
    h: &Launcher,
    site: usize,
    after: Gtid,
    storage: &Storage,
    (generation, term): (u64, u64),
) -> (tokio::task::JoinHandle<()>, watch::Receiver<Progress>) {
    let (source, start) = (
        endpoint(h, site, ARCHIVER, ARCHIVER_PW),
        Start::After(after),
    );
    let (storage, s) = (storage.clone(), settings(generation, term));
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
    switchover_story(Storage::Dir(dir.path().join("backups"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_story_in_a_bucket_of_an_s3_compatible_server() {
    let server = S3Server::start().await.expect("moto");
    server.create_bucket("backups").await.unwrap();
    let storage = server.storage("backups", "prod/g").unwrap();
    switchover_story(storage).await;
    // The archive sits under the prefix, beside where the backups go.
    let keys = server.keys("backups", "prod/g/binlog/0/").await.unwrap();
    assert!(!keys.is_empty(), "segments under prod/g/binlog/0/");
}

/// Two archivers, a switchover, the chain, replays to three points, a removed segment: the
/// same on every kind of target.
async fn switchover_story(storage: Storage) {
    let (mut h, base) = group().await;
    let iad = h.admin(0).unwrap();

    // Generation 1: two archivers at once (an old and a new leader), both on iad.
    let (a1, p1) = spawn_archiver(&h, 0, base, &storage, (1, 1));
    let (a2, _) = spawn_archiver(&h, 0, base, &storage, (1, 2));
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
    let (a3, _) = spawn_archiver(&h, 1, r.after.unwrap(), &storage, (2, 2));
    insert(&pdx, 301..=500).await;
    let on_pdx = position(&pdx).await;
    let c = archived_up_to(&storage, on_pdx.seq).await;
    a3.abort();
    assert!(c.gaps().is_empty(), "{:?}", c.gaps());
    assert_eq!(c.domains[&0].span(), Some((base.seq + 1, on_pdx.seq)));

    // Replayed into an empty server up to three points: the rows up to each, no more.
    let scratch = scratch_server().await;
    let sa = scratch.admin(0).unwrap();
    for (stop, want) in [(base.seq + 120, 120), (on_iad.seq, 300), (on_pdx.seq, 500)] {
        let got = replay_to(&scratch, &storage, &c, base.seq, stop).await;
        assert_eq!(got, (1..=want).collect::<Vec<u64>>(), "to {stop}");
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
            generation: 1,
        }],
        StopAt {
            domain: 0,
            seq: on_pdx.seq,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

/// A group whose primary iad wrote ids 1 to 50, replicated everywhere, with an archiver of
/// generation 1 (term 1) following iad: its directory, storage, servers, start and task.
async fn fifty_archived_on_iad() -> (
    tempfile::TempDir,
    Storage,
    Launcher,
    Gtid,
    tokio::task::JoinHandle<()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::Dir(dir.path().join("backups"));
    let (h, base) = group().await;
    let (a1, _) = spawn_archiver(&h, 0, base, &storage, (1, 1));
    insert(&h.admin(0).unwrap(), 1..=50).await;
    h.wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
    (dir, storage, h, base, a1)
}

/// An emergency failover by hand: iad is killed, pdx stops replicating and takes writes.
async fn iad_dies_pdx_takes_over(h: &mut Launcher, pdx: &SiteClient) {
    h.kill(0).unwrap();
    pdx.execute("RESET SLAVE ALL").await.unwrap();
    pdx.execute("SET GLOBAL read_only=OFF").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_failover_that_lost_writes_forks_the_archive_and_keeps_the_old_tail_apart() {
    let (_dir, storage, mut h, base, a1) = fifty_archived_on_iad().await;
    let (iad, pdx) = (h.admin(0).unwrap(), h.admin(1).unwrap());
    // pdx stops receiving: what iad writes next is archived but never reaches pdx.
    pdx.execute("STOP SLAVE").await.unwrap();
    insert(&iad, 51..=80).await;
    let on_iad = position(&iad).await;
    archived_up_to(&storage, on_iad.seq).await;
    a1.abort();
    iad_dies_pdx_takes_over(&mut h, &pdx).await;

    // Generation 2 on pdx: the archive holds more than pdx, so it forks at pdx's position.
    let at = position(&pdx).await;
    let r = binlog::resume(&chain(&storage).await, 0, Some(at), 2, None);
    let fork = r.fork.expect("a fork");
    assert_eq!((fork.at, fork.generation), (at.seq, 2));
    assert_eq!(on_iad.seq - at.seq, 30);
    storage
        .put_archived(&fork.name(), Vec::new())
        .await
        .unwrap();
    let (a2, _) = spawn_archiver(&h, 1, r.after.unwrap(), &storage, (2, 1));
    insert(&pdx, 1001..=1020).await;
    // T: every transaction so far is at or before it; the next ones come a second later.
    let t = unix_now(&pdx).await;
    while unix_now(&pdx).await <= t {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A migration starts (its mark: the position before it), then its DDL runs among writes.
    let start = position(&pdx).await;
    let mark = MigrationMark {
        operation_id: "add-notes".into(),
        granted_at: bloodraven_core::time::Timestamp::from_unix_seconds(1_800_000_000),
        gtid_position: start.to_string(),
    };
    storage
        .put_archived(&mark.name(), mark.to_bytes())
        .await
        .unwrap();
    insert(&pdx, 1021..=1030).await;
    pdx.execute("CREATE TABLE shop.notes (id INT PRIMARY KEY)")
        .await
        .unwrap();
    let ddl = position(&pdx).await;
    insert(&pdx, 1031..=1040).await;
    let on_pdx = position(&pdx).await;
    let c = archived_up_to(&storage, on_pdx.seq).await;
    a2.abort();
    assert_eq!(
        bloodraven_mysql::binlog::marks_of(&storage, "add-notes")
            .await
            .unwrap(),
        [mark]
    );
    assert!(
        bloodraven_mysql::binlog::marks_of(&storage, "another")
            .await
            .unwrap()
            .is_empty()
    );
    // The mark is no segment: the chain is read as before.
    assert_eq!(chain(&storage).await, c);
    let first = bloodraven_mysql::binlog::first_ddl_after(&storage, &c, 0, start.seq)
        .await
        .unwrap();
    assert_eq!(
        first,
        Some(ddl.seq),
        "the DDL, not a write before or after it"
    );
    assert_eq!(
        bloodraven_mysql::binlog::first_ddl_after(&storage, &c, 0, ddl.seq)
            .await
            .unwrap(),
        None
    );

    // The chain: no gap; iad's 30 unshipped transactions are the lost tail, not in it.
    let d = &c.domains[&0];
    assert!(d.gaps.is_empty(), "{:?}", d.gaps);
    let lost: u64 = d.lost.iter().map(|p| p.to - p.from + 1).sum();
    assert_eq!(lost, 30, "{:?}", d.lost);
    assert!(d.lost.iter().all(|p| c.segment(p).generation == 1));

    let scratch = scratch_server().await;
    let everything: Vec<u64> = (1..=50).chain(1001..=1040).collect();
    assert_eq!(
        replay_to(&scratch, &storage, &c, base.seq, on_pdx.seq).await,
        everything
    );
    // To a time: the transactions at or before T's second, none after.
    let stop = bloodraven_mysql::binlog::stop_at_time(&storage, &c, 0, t)
        .await
        .unwrap()
        .expect("a point");
    let before_t: Vec<u64> = (1..=50).chain(1001..=1020).collect();
    assert_eq!(
        replay_to(&scratch, &storage, &c, base.seq, stop.seq).await,
        before_t
    );
    assert_eq!(
        bloodraven_mysql::binlog::stop_at_time(&storage, &c, 0, 0)
            .await
            .unwrap(),
        None
    );
    // Before the migration: every write before its DDL, none after.
    let before_ddl: Vec<u64> = (1..=50).chain(1001..=1030).collect();
    assert_eq!(
        replay_to(&scratch, &storage, &c, base.seq, ddl.seq - 1).await,
        before_ddl
    );
}

/// An old primary's tail that no archiver read: the archive stopped with the new primary's
/// position, the old primary wrote on alone and died. Once it is back, its tail is fetched
/// after the new primary's start, behind a fork there: kept apart as the lost tail, with its
/// own generation, never replayed; the chain is the new primary's, with no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primarys_unarchived_tail_is_fetched_once_it_is_back_and_kept_apart() {
    let (_dir, storage, mut h, base, a1) = fifty_archived_on_iad().await;
    let (iad, pdx) = (h.admin(0).unwrap(), h.admin(1).unwrap());
    archived_up_to(&storage, position(&iad).await.seq).await;
    // The archiver's leader dies and pdx stops receiving: what iad writes next is on iad alone.
    a1.abort();
    pdx.execute("STOP SLAVE").await.unwrap();
    insert(&iad, 51..=80).await;
    let tail_end = position(&iad).await;
    iad_dies_pdx_takes_over(&mut h, &pdx).await;
    // Generation 2 on pdx: the archive holds exactly what pdx holds, so no fork is written.
    let at = position(&pdx).await;
    let r = binlog::resume(&chain(&storage).await, 0, Some(at), 2, None);
    assert_eq!(r.fork, None);
    let (a2, _) = spawn_archiver(&h, 1, r.after.unwrap(), &storage, (2, 1));
    insert(&pdx, 1001..=1010).await;
    let on_pdx = position(&pdx).await;
    archived_up_to(&storage, on_pdx.seq).await;
    a2.abort();

    h.restart(0).await.unwrap();
    let got = fetch_tail(
        &endpoint(&h, 0, ARCHIVER, ARCHIVER_PW),
        at,
        tail_end,
        2,
        &storage,
        &settings(1, 3),
    )
    .await
    .unwrap();
    assert_eq!(
        got.last,
        Some(tail_end),
        "the whole tail, to its last transaction"
    );
    let c = chain(&storage).await;
    let d = &c.domains[&0];
    assert!(d.gaps.is_empty(), "{:?}", d.gaps);
    let lost: Vec<u64> = d.lost.iter().flat_map(|p| p.from..=p.to).collect();
    assert_eq!(lost, (at.seq + 1..=tail_end.seq).collect::<Vec<_>>());
    assert!(d.lost.iter().all(|p| c.segment(p).generation == 1));
    let scratch = scratch_server().await;
    let chained: Vec<u64> = (1..=50).chain(1001..=1010).collect();
    assert_eq!(
        replay_to(&scratch, &storage, &c, base.seq, on_pdx.seq).await,
        chained
    );
    // Fetched again by another term: a second copy of the same lost transactions at most;
    // the chain and the set of lost transactions are unchanged.
    fetch_tail(
        &endpoint(&h, 0, ARCHIVER, ARCHIVER_PW),
        at,
        tail_end,
        2,
        &storage,
        &settings(1, 4),
    )
    .await
    .unwrap();
    let again = chain(&storage).await;
    assert_eq!(again.domains[&0].pieces.len(), d.pieces.len());
    assert!(again.domains[&0].gaps.is_empty());
    let lost_again: BTreeSet<u64> = again.domains[&0]
        .lost
        .iter()
        .flat_map(|p| p.from..=p.to)
        .collect();
    assert_eq!(lost_again, lost.iter().copied().collect::<BTreeSet<u64>>());
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
