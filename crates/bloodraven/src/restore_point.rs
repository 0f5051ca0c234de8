//! `restore-in-place --to-time T` / `--to-gtid G` / `--before-migration OP`: the dump of the
//! group as it was at a point, from the newest backup at or before it and the binlog archive after it
//! (docs/pitr.md). The point becomes one sequence number of the archive's domain; the plan
//! ([`bloodraven_core::binlog::plan`]) names the backup, the segments, the stop and what is
//! lost; `--check` prints it and changes nothing. Otherwise the backup is prepared and opened
//! by a scratch server in the operator's data directory (`restores/`), the archive replayed
//! into it up to the point, and its application schemas dumped into `restores/ID.sql`: the dump
//! the restore-in-place flow then loads.

use std::path::{Path, PathBuf};

use bloodraven_core::binlog::{self, BackupAt, Chain, Gtid, ReplayPlan, StopAt};
use bloodraven_core::time::Timestamp;
use bloodraven_mysql::backup::Storage;
use bloodraven_mysql::binlog::ReplayTarget;

use crate::cli::exit;

/// Why no dump at the point was made.
#[derive(Debug, thiserror::Error)]
enum PointError {
    #[error("the binlog archive: {0}")]
    Archive(#[from] bloodraven_mysql::binlog::ArchiveError),
    #[error("the backups: {0}")]
    Backups(#[source] bloodraven_mysql::backup::BackupError),
    #[error("the binlog archive holds no transaction at or before {0}")]
    NothingBefore(String),
    #[error(
        "the binlog archive holds no start of operation {0}: the operator records it when it grants the operation's migration lease, with spec.backup set, and copies it into the archive while the lease lives"
    )]
    NoMark(String),
    #[error(
        "the binlog archive holds no DDL transaction after operation {operation}'s start ({position}): nothing of the migration to undo"
    )]
    NoDdlAfter { operation: String, position: String },
    #[error(transparent)]
    Plan(#[from] binlog::PlanError),
    #[error("backup {id}: {source}")]
    Scratch {
        id: String,
        #[source]
        source: bloodraven_mysql::backup::BackupError,
    },
    #[error("the dump of the scratch server: {0}")]
    Dump(#[source] bloodraven_mysql::backup::BackupError),
}

/// A point to restore to, as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Point {
    /// `--to-time`: every transaction whose binlog second is at or before it.
    Time(Timestamp),
    /// `--to-gtid`: everything up to and including it (`domain-server-seq`).
    Gtid(Gtid),
    /// `--before-migration`: everything before the first DDL transaction after the
    /// operation's migration lease was granted.
    Migration(String),
}

impl Point {
    /// The point of `--to-time`, `--to-gtid` or `--before-migration` (at most one is given;
    /// clap says so).
    ///
    /// # Errors
    /// The exit code, after a line naming the flag and its rule.
    pub fn parse(
        to_time: Option<&str>,
        to_gtid: Option<&str>,
        before_migration: Option<&str>,
    ) -> Result<Option<Point>, i32> {
        if let Some(op) = before_migration {
            if op.trim().is_empty() || op.len() > 253 {
                eprintln!(
                    "error: --before-migration: must be the operation ID the migration's lease was granted to (1 to 253 characters)"
                );
                return Err(exit::USAGE);
            }
            return Ok(Some(Point::Migration(op.to_string())));
        }
        if let Some(t) = to_time {
            return Timestamp::parse_rfc3339(t).map(|t| Some(Point::Time(t))).map_err(|e| {
                eprintln!("error: --to-time: must be an RFC 3339 timestamp (2026-12-07T14:01:00Z): {e}");
                exit::USAGE
            });
        }
        let Some(g) = to_gtid else {
            return Ok(None);
        };
        Gtid::parse(g).map(|g| Some(Point::Gtid(g))).ok_or_else(|| {
            eprintln!(
                "error: --to-gtid: must be one MariaDB GTID, domain-server-sequence (0-1-1234)"
            );
            exit::USAGE
        })
    }
}

/// The plan of a restore to `point`, from the backups and the archive `storage` holds.
async fn plan_of(
    storage: &Storage,
    point: &Point,
) -> Result<(Chain, ReplayPlan, String, String), PointError> {
    let (chain, _) = bloodraven_mysql::binlog::read_chain(storage).await?;
    let domain = chain.domains.keys().next().copied().unwrap_or(0);
    let (stop, how) = match point {
        Point::Gtid(g) => (
            StopAt {
                domain: g.domain,
                seq: g.seq,
            },
            format!("--to-gtid {g}"),
        ),
        Point::Time(t) => {
            let seconds = u64::try_from(t.unix_seconds()).unwrap_or(0);
            let stop = bloodraven_mysql::binlog::stop_at_time(storage, &chain, domain, seconds)
                .await?
                .ok_or_else(|| PointError::NothingBefore(t.to_rfc3339()))?;
            let how = format!(
                "--to-time {}: the last transaction at or before that second",
                t.to_rfc3339()
            );
            (stop, how)
        }
        Point::Migration(op) => before_migration(storage, &chain, domain, op).await?,
    };
    let manifests = bloodraven_mysql::backup::list(storage)
        .await
        .map_err(PointError::Backups)?;
    let backups: Vec<BackupAt> = manifests
        .iter()
        .map(|m| BackupAt {
            id: m.id.clone(),
            // A position without the domain holds none of it.
            seq: binlog::seq_in(&m.gtid_position, stop.domain).unwrap_or(0),
            generation: m.topology_generation,
        })
        .collect();
    let plan = binlog::plan(&chain, &backups, stop)?;
    let site = manifests
        .iter()
        .find(|m| m.id == plan.backup.id)
        .map(|m| format!("site {}, GTID position {}", m.site, m.gtid_position))
        .unwrap_or_default();
    Ok((chain, plan, site, how))
}

/// The stop of `--before-migration OP`: the transaction before the first DDL of `domain`
/// after the operation's start (the earliest grant's mark), and how the plan says it.
async fn before_migration(
    storage: &Storage,
    chain: &Chain,
    domain: u32,
    op: &str,
) -> Result<(StopAt, String), PointError> {
    let marks = bloodraven_mysql::binlog::marks_of(storage, op).await?;
    let start = binlog::mark::start_of(&marks, op).ok_or_else(|| PointError::NoMark(op.into()))?;
    let after = binlog::seq_in(&start.gtid_position, domain).unwrap_or(0);
    let ddl = bloodraven_mysql::binlog::first_ddl_after(storage, chain, domain, after)
        .await?
        .ok_or_else(|| PointError::NoDdlAfter {
            operation: op.into(),
            position: start.gtid_position.clone(),
        })?;
    let how = format!(
        "--before-migration {op}: the last transaction before its first DDL, {domain}-*-{ddl}; its lease was granted at {} with the primary at {}",
        start.granted_at.to_rfc3339(),
        if start.gtid_position.is_empty() {
            "nothing"
        } else {
            &start.gtid_position
        }
    );
    Ok((
        StopAt {
            domain,
            seq: ddl - 1,
        },
        how,
    ))
}

/// Prints the plan: the point, the backup, the segments, what is lost.
fn print_plan(how: &str, chain: &Chain, plan: &ReplayPlan, backup_site: &str) {
    println!(
        "restore to {}-*-{} ({how})",
        plan.stop.domain, plan.stop.seq
    );
    println!("from backup {} ({backup_site})", plan.backup.id);
    let replayed: u64 = plan.pieces.iter().map(|p| p.to - p.from + 1).sum();
    println!(
        "replays {replayed} transactions from {} archive segments{}",
        plan.pieces.len(),
        if plan.pieces.is_empty() { "" } else { ":" }
    );
    for p in &plan.pieces {
        println!("  {} ({}..{})", chain.segment(p).name(), p.from, p.to);
    }
    println!(
        "loses {} transactions archived after the point",
        plan.discarded
    );
}

/// The dump of the group at `point` (`None` with `check`: the plan was printed, nothing else
/// done), under `dir` (`restores/`).
///
/// # Errors
/// The exit code, after a line that says why.
pub async fn dump_at(
    storage: &Storage,
    dir: &Path,
    point: &Point,
    check: bool,
) -> Result<Option<PathBuf>, i32> {
    let (chain, plan, site, how) = plan_of(storage, point).await.map_err(|why| {
        eprintln!("error: refused, nothing was written: {why}");
        exit::REFUSED
    })?;
    print_plan(&how, &chain, &plan, &site);
    if check {
        return Ok(None);
    }
    let id = &plan.backup.id;
    let name = format!("{id}-to-{}-{}", plan.stop.domain, plan.stop.seq);
    let work = dir.join(format!("{name}.work"));
    let out = dir.join(format!("{name}.sql"));
    let _ = std::fs::remove_dir_all(&work);
    eprintln!(
        "preparing backup {id} from {} in a scratch server under {} (needs about the data's size)",
        storage.url(),
        work.display()
    );
    let result = replay_and_dump(storage, &chain, &plan, &work, &out).await;
    let _ = std::fs::remove_dir_all(&work);
    match result {
        Ok(databases) => {
            eprintln!(
                "backup {id} replayed to {}-*-{} and dumped: {} into {}",
                plan.stop.domain,
                plan.stop.seq,
                databases.join(", "),
                out.display()
            );
            Ok(Some(out))
        }
        Err(why) => {
            eprintln!("error: refused, nothing was written: {why}");
            Err(exit::REFUSED)
        }
    }
}

async fn replay_and_dump(
    storage: &Storage,
    chain: &Chain,
    plan: &ReplayPlan,
    work: &Path,
    out: &Path,
) -> Result<Vec<String>, PointError> {
    let files = bloodraven_mysql::binlog::plan_files(storage, chain, plan).await?;
    let (_, server) = bloodraven_mysql::backup::open_scratch(storage, &plan.backup.id, work)
        .await
        .map_err(|source| PointError::Scratch {
            id: plan.backup.id.clone(),
            source,
        })?;
    let replayed =
        bloodraven_mysql::binlog::replay(files, &ReplayTarget::Socket(server.socket())).await;
    let dumped = match replayed {
        Ok(r) => {
            eprintln!("replayed {} archive files ({} bytes)", r.files, r.bytes);
            server.dump_schemas(out).await.map_err(PointError::Dump)
        }
        Err(e) => Err(PointError::Archive(e)),
    };
    server.stop().await;
    dumped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_read_or_refused_by_its_flag() {
        assert_eq!(
            Point::parse(None, Some("0-1-42"), None),
            Ok(Some(Point::Gtid(Gtid {
                domain: 0,
                server: 1,
                seq: 42
            })))
        );
        assert!(matches!(
            Point::parse(Some("2026-12-07T14:01:00Z"), None, None),
            Ok(Some(Point::Time(_)))
        ));
        assert_eq!(Point::parse(None, None, None), Ok(None));
        assert_eq!(
            Point::parse(None, None, Some("release-42")),
            Ok(Some(Point::Migration("release-42".into())))
        );
        for bad in ["", "  ", &"x".repeat(254)] {
            assert_eq!(
                Point::parse(None, None, Some(bad)),
                Err(exit::USAGE),
                "{bad}"
            );
        }
        for bad in ["", "0-1", "0-1-2-3", "0-1-x", "-1-1-2", "0-1-2,1-1-3"] {
            assert_eq!(
                Point::parse(None, Some(bad), None),
                Err(exit::USAGE),
                "{bad}"
            );
        }
        assert_eq!(
            Point::parse(Some("yesterday"), None, None),
            Err(exit::USAGE)
        );
    }
}
