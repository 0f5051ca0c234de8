//! The operator's binlog archive on real servers: with `spec.backup` set, it archives the
//! primary's transactions; after a planned failover, then a kill -9 of the new primary and an
//! emergency failover, it resumes on each new primary, and `status.binlogArchive` reaches the new primary's position with no
//! gap, the `BinlogArchiveContinuous` condition true and the lag metric 0. The chain read from
//! the target agrees.

mod support;

use std::time::Duration;

use bloodraven_core::binlog::{Chain, Entry};
use bloodraven_core::reason::ConditionType;
use bloodraven_core::status::GroupStatus;
use bloodraven_mysql::SiteClient;
use support::{GROUP, Live, Timings};

async fn position(c: &SiteClient) -> String {
    c.query_string("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default()
}

async fn write(c: &SiteClient, from: u64, to: u64) {
    for id in from..=to {
        c.execute(format!("INSERT INTO app.pitr VALUES ({id})"))
            .await
            .unwrap();
    }
}

fn archived(s: &GroupStatus) -> Option<(String, u64, u64)> {
    s.binlog_archive
        .as_ref()
        .map(|a| (a.last_gtid.clone(), a.segments, a.gaps))
}

async fn wait_archived(
    op: &bloodraven_operator::operator::OperatorHandle,
    at: &str,
) -> GroupStatus {
    let want = at.to_string();
    support::wait_status(
        op,
        Duration::from_secs(60),
        "the archive's status at the primary's position",
        move |s| archived(s).is_some_and(|(last, _, _)| last == want),
    )
    .await
}

/// The chain the target holds.
fn chain_in(target: &std::path::Path) -> Chain {
    let mut segments = Vec::new();
    let mut forks = Vec::new();
    for folder in ["0", "forks"] {
        let Ok(dir) = std::fs::read_dir(target.join("binlog").join(folder)) else {
            continue;
        };
        for e in dir {
            let name = format!("{folder}/{}", e.unwrap().file_name().to_string_lossy());
            match Entry::parse(&name) {
                Ok(Entry::Segment(seg)) => segments.push(seg),
                Ok(Entry::Fork(f)) => forks.push(f),
                Err(_) => {}
            }
        }
    }
    Chain::build(segments, &forks)
}

/// Writes one row at a time until the archive holds the primary's position: the archiver
/// then runs (it starts at the primary's position of the poll that starts it, and archives
/// what comes after).
async fn until_archiving(c: &SiteClient, target: &std::path::Path, first_id: u64) -> u64 {
    for id in first_id..first_id + 60 {
        write(c, id, id).await;
        let at = position(c).await;
        // A segment is written about a second after its first transaction.
        for _ in 0..60 {
            if chain_in(target).last_gtid(0).map(|g| g.to_string()) == Some(at.clone()) {
                return id + 1;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("the archive never reached the primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_follows_the_primary_through_a_planned_and_an_emergency_failover_with_no_gap() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let target = tempfile::tempdir().unwrap();
    let url = format!("file://{}", target.path().display());
    let mut live = Live::start_with(Timings::default(), |o| o.backup_target = Some(url)).await;
    let op = support::replicating(&live).await;
    let iad = live.harness.admin(0).unwrap();
    iad.execute("CREATE TABLE app.pitr (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let next = until_archiving(&iad, target.path(), 1).await;
    write(&iad, next, next + 49).await;
    let on_iad = position(&iad).await;
    let s = wait_archived(&op, &on_iad).await;
    assert_eq!(archived(&s).unwrap().2, 0, "no gap");

    // A planned failover to pdx: the archive follows it.
    support::request_failover(&op, "pdx").await;
    support::wait_failover_to(&op, "pdx", Duration::from_secs(30)).await;
    let pdx = live.harness.admin(1).unwrap();
    write(&pdx, 501, 550).await;
    let on_pdx = position(&pdx).await;
    wait_archived(&op, &on_pdx).await;
    support::wait_replicating(&op, Duration::from_secs(30)).await;

    // kill -9 of pdx: an emergency failover back to iad, and the archive follows again.
    live.harness.kill(1).unwrap();
    support::wait_failover_to(&op, "iad", Duration::from_secs(30)).await;
    // A new client: the planned failover ended the old one's sessions on iad.
    let iad = live.harness.admin(0).unwrap();
    write(&iad, 1001, 1050).await;
    let on_iad = position(&iad).await;
    let s = wait_archived(&op, &on_iad).await;
    let (_, segments, gaps) = archived(&s).unwrap();
    assert_eq!(gaps, 0, "{s:?}");
    assert!(segments >= 2, "{s:?}");
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::BinlogArchiveContinuous)
        .expect("the condition");
    assert_eq!(c.status, "True", "{c:?}");

    // The target holds the same chain: continuous, its last segments from the new generation.
    let chain = chain_in(target.path());
    assert!(chain.gaps().is_empty());
    let last = chain.domains[&0].pieces.last().unwrap();
    assert_eq!(chain.segment(last).generation, s.topology_generation);
    assert_eq!(chain.last_gtid(0).unwrap().to_string(), on_iad);

    // Caught up: the lag is 0.
    let metrics = support::plain_text(&op, "/metrics").await;
    assert!(
        metrics.contains(&format!(
            "bloodraven_binlog_archive_lag_seconds{{group=\"{GROUP}\"}} 0"
        )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("binlog_archive"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    op.stop().await;
}
