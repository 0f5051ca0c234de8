//! `bloodraven restore-in-place --group G --from FILE --confirm now|TIMESTAMP [--target S]
//! [--check] [--wait D]`: checks a `mariadb-dump` file and requests a restore-in-place of it
//! (`spec.restoreInPlace` on the stored group, through the store of the platform the
//! configuration names), then follows `status.restoreInPlace`.
//!
//! `--from-backup ID` instead of `--from`: the backup (`spec.backup`'s target, a directory
//! this host reaches) is checked, prepared and opened by a scratch server in the operator's
//! data directory (`restores/`), and its application schemas dumped into
//! `restores/ID.sql`: the dump the restore then loads (docs/backup.md).
//!
//! `--to-time T`, `--to-gtid G` or `--before-migration OP`: the group as it was at that point,
//! from the newest backup before it and the binlog archive after it
//! ([`crate::restore_point`], docs/pitr.md);
//! `--check` then prints the plan (the backup, the segments, the stop, what is lost).
//!
//! `--check` reads the dump only (its header, the databases it replaces, its size) and
//! touches nothing. Without it the dump is checked first too: an incomplete file is refused
//! before anything is written.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::RestoreStatus;
use bloodraven_core::time::{Clock as _, Timestamp};
use bloodraven_runtime::clock::SystemClock;
use bloodraven_store::{StoreError, StoreExt as _};
use clap::Args;

/// Exit codes of `bloodraven restore-in-place`.
pub mod exit {
    /// `REFUSED` here: the dump is incomplete, the confirm is not new, another operation
    /// runs.
    pub use crate::cli::exit::{ERROR, OK as SUCCEEDED, REFUSED, USAGE};
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The `mariadb-dump` file (a path the operator reads).
    #[arg(
        long = "from",
        required_unless_present_any = ["from_backup", "to_time", "to_gtid", "before_migration"],
        conflicts_with_all = ["from_backup", "to_time", "to_gtid", "before_migration"]
    )]
    from: Option<PathBuf>,
    /// A backup of the group (`bloodraven backup list`): its application schemas become the
    /// dump the restore loads.
    #[arg(
        long = "from-backup",
        value_name = "ID",
        conflicts_with_all = ["to_time", "to_gtid", "before_migration"]
    )]
    from_backup: Option<String>,
    /// The group as it was at this moment (RFC 3339): the newest backup before it and the
    /// binlog archive up to the last transaction at or before its second (docs/pitr.md).
    #[arg(long = "to-time", value_name = "TIME", conflicts_with_all = ["to_gtid", "before_migration"])]
    to_time: Option<String>,
    /// The group up to and including this GTID (`domain-server-sequence`), from the newest
    /// backup before it and the binlog archive.
    #[arg(
        long = "to-gtid",
        value_name = "GTID",
        conflicts_with = "before_migration"
    )]
    to_gtid: Option<String>,
    /// The group just before the first DDL transaction after this operation's migration lease
    /// was granted (`deploy migrate --operation-id`), from the newest backup before it and the
    /// binlog archive (docs/pitr.md).
    #[arg(long = "before-migration", value_name = "OPERATION_ID")]
    before_migration: Option<String>,
    /// `now`, or an RFC 3339 timestamp later than the group's `confirmTokenUsed`.
    #[arg(long)]
    confirm: Option<String>,
    /// The site that becomes the primary (default: the active site).
    #[arg(long)]
    target: Option<String>,
    /// Read the dump and say what it would replace; change nothing.
    #[arg(long)]
    check: bool,
    /// The operator's configuration file (for its store).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: Option<PathBuf>,
    /// How long to follow the restore; 0s requests it and returns at once.
    #[arg(long, default_value = "1h")]
    wait: String,
}

pub fn run(args: &RestoreArgs) -> i32 {
    let wait = match crate::cli::wait_flag(&args.wait) {
        Ok(d) => d,
        Err(code) => return code,
    };
    crate::cli::run(crate::cli::Flavor::CurrentThread, go(args, wait))
}

/// Writes the restore request into the stored group's spec, with the stored object's version
/// (a concurrent change is read again), after the operator's own rules; the store and the
/// group's key, or the exit code.
async fn request(
    cfg: &bloodraven_operator::config::LoadedConfig,
    args: &RestoreArgs,
    confirm: &str,
    from: &std::path::Path,
) -> Result<
    (
        std::sync::Arc<dyn bloodraven_store::Store>,
        bloodraven_store::ObjectKey,
    ),
    i32,
> {
    let (store, key, _) = crate::cli::open_group(cfg, &args.group).await?;
    let request = bloodraven_core::config::RestoreInPlaceSpec {
        confirm: confirm.to_string(),
        source: from.display().to_string(),
        target: args.target.clone(),
    };
    // Written with the stored object's version: a concurrent change is read again.
    for attempt in 1..=5 {
        let obj = match store.get(&key).await {
            Ok(Some(o)) => o,
            Ok(None) => {
                eprintln!("error: group {} is not in the store", args.group);
                return Err(exit::ERROR);
            }
            Err(e) => {
                eprintln!("error: {e}");
                return Err(exit::ERROR);
            }
        };
        let body = match obj.decode::<FailoverGroupBody>() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: the stored group {} cannot be read: {e}", args.group);
                return Err(exit::ERROR);
            }
        };
        // The operator's own rules, before anything is written.
        let mut spec = body.spec.clone();
        spec.restore_in_place = Some(request.clone());
        match bloodraven_core::restore::admit_confirm(&request, &body.status) {
            Ok(true) => {}
            Ok(false) => {
                eprintln!(
                    "confirm {confirm} is the restore in flight (or the one that ran); following it"
                );
                break;
            }
            Err(why) => {
                eprintln!("error: refused, nothing was written: {why}");
                return Err(exit::REFUSED);
            }
        }
        if let Some(t) = &request.target
            && !body.spec.sites.iter().any(|s| &s.name == t)
        {
            eprintln!(
                "error: --target: {t:?} is not a site of group {}",
                args.group
            );
            return Err(exit::USAGE);
        }
        let mut next = obj.clone();
        let value = match serde_json::to_value(&spec) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: {e}");
                return Err(exit::ERROR);
            }
        };
        next.body.insert("spec".into(), value);
        match store.replace(next).await {
            Ok(_) => break,
            Err(StoreError::Conflict { .. }) if attempt < 5 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return Err(exit::ERROR);
            }
        }
    }
    Ok((store, key))
}

/// The group's backup target and the operator's `restores/` directory (created), for
/// `flag`.
async fn backup_target(
    args: &RestoreArgs,
    flag: &str,
) -> Result<(bloodraven_mysql::backup::Storage, PathBuf), i32> {
    let Some(config_path) = &args.config else {
        eprintln!("error: --config: required with {flag} (the group's backup target)");
        return Err(exit::USAGE);
    };
    let cfg = crate::cli::load_config(config_path)?;
    let (_, key, body) = crate::cli::open_group(&cfg, &args.group).await?;
    let group = bloodraven_core::config::validate_group(&key.name, &key.namespace, &body.spec)
        .map_err(|e| {
            eprintln!("error: the stored spec does not validate: {e}");
            exit::ERROR
        })?;
    let Some(target) = group.backup.map(|b| b.target) else {
        eprintln!(
            "error: refused, nothing was written: group {} has no spec.backup",
            args.group
        );
        return Err(exit::REFUSED);
    };
    let storage = crate::backup_cmd::reachable_storage(&target, &key.namespace)
        .await
        .map_err(|why| {
            eprintln!("error: refused, nothing was written: {why}");
            exit::REFUSED
        })?;
    let data_dir = if cfg.settings.data_dir.is_absolute() {
        cfg.settings.data_dir.clone()
    } else {
        cfg.base.join(&cfg.settings.data_dir)
    };
    let dir = data_dir.join("restores");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: {}: {e}", dir.display());
        return Err(exit::ERROR);
    }
    Ok((storage, dir))
}

/// The dump a backup becomes: its application schemas, dumped from a scratch server on its
/// prepared data, into the operator's data directory (`restores/ID.sql`).
async fn dump_of_backup(args: &RestoreArgs, id: &str) -> Result<PathBuf, i32> {
    if !bloodraven_mysql::backup::valid_id(id) {
        eprintln!(
            "error: --from-backup: must be 1 to 64 of letters, digits, -, _ and ., not starting with ., and not binlog"
        );
        return Err(exit::USAGE);
    }
    let (storage, dir) = backup_target(args, "--from-backup").await?;
    let work = dir.join(format!("{id}.work"));
    let out = dir.join(format!("{id}.sql"));
    let _ = std::fs::remove_dir_all(&work);
    eprintln!(
        "preparing backup {id} from {} in a scratch server under {} (needs about the data's size)",
        storage.url(),
        work.display()
    );
    let dumped = bloodraven_mysql::backup::dump_of(&storage, id, &work, &out).await;
    let _ = std::fs::remove_dir_all(&work);
    match dumped {
        Ok((m, databases)) => {
            eprintln!(
                "backup {id} (site {}, GTID position {}) dumped: {} into {}",
                m.site,
                m.gtid_position,
                databases.join(", "),
                out.display()
            );
            Ok(out)
        }
        Err(e) => {
            eprintln!("error: refused, nothing was written: backup {id}: {e}");
            Err(exit::REFUSED)
        }
    }
}

/// The dump the restore loads, as the flags say (`--from`, `--from-backup`, `--to-time`,
/// `--to-gtid`); `Err(code)`: the command ends with `code` (a point's `--check` ends here).
async fn given_dump(args: &RestoreArgs) -> Result<PathBuf, i32> {
    let point = crate::restore_point::Point::parse(
        args.to_time.as_deref(),
        args.to_gtid.as_deref(),
        args.before_migration.as_deref(),
    )?;
    match (&args.from, &args.from_backup, &point) {
        (Some(f), _, _) => Ok(f.clone()),
        (None, Some(id), _) => dump_of_backup(args, id).await,
        (None, None, Some(point)) => {
            let flag = match point {
                crate::restore_point::Point::Time(_) => "--to-time",
                crate::restore_point::Point::Gtid(_) => "--to-gtid",
                crate::restore_point::Point::Migration(_) => "--before-migration",
            };
            let (storage, dir) = backup_target(args, flag).await?;
            match crate::restore_point::dump_at(&storage, &dir, point, args.check).await? {
                Some(p) => Ok(p),
                // --check: the plan is printed; nothing was prepared or written.
                None => Err(exit::SUCCEEDED),
            }
        }
        (None, None, None) => {
            eprintln!(
                "error: --from, --from-backup, --to-time, --to-gtid or --before-migration: one is required"
            );
            Err(exit::USAGE)
        }
    }
}

async fn go(args: &RestoreArgs, wait: Duration) -> i32 {
    let given = match given_dump(args).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let from = match std::fs::canonicalize(&given) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --from {}: {e}", given.display());
            return exit::USAGE;
        }
    };
    let summary = match bloodraven_mysql::restore::inspect(&from).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: refused, nothing was written: {e}");
            return exit::REFUSED;
        }
    };
    println!(
        "{}: {} ({} bytes, {} lines); replaces the databases: {}",
        from.display(),
        summary.header,
        summary.bytes,
        summary.lines,
        if summary.databases.is_empty() {
            "none named".to_string()
        } else {
            summary.databases.join(", ")
        }
    );
    if args.check {
        return exit::SUCCEEDED;
    }
    let Some(confirm) = &args.confirm else {
        eprintln!("error: --confirm: required (now, or an RFC 3339 timestamp) unless --check");
        return exit::USAGE;
    };
    let confirm = if confirm == "now" {
        SystemClock.now().to_rfc3339()
    } else {
        match Timestamp::parse_rfc3339(confirm) {
            Ok(t) => t.to_rfc3339(),
            Err(e) => {
                eprintln!("error: --confirm: must be `now` or an RFC 3339 timestamp: {e}");
                return exit::USAGE;
            }
        }
    };
    let Some(config_path) = &args.config else {
        eprintln!(
            "error: --config: required to request the restore (the operator's configuration file)"
        );
        return exit::USAGE;
    };
    let cfg = match crate::cli::load_config(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (store, key) = match request(&cfg, args, &confirm, &from).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    eprintln!(
        "requested a restore-in-place of {} into {} (confirm {confirm})",
        from.display(),
        args.group
    );
    if wait.is_zero() {
        return exit::SUCCEEDED;
    }
    follow(&*store, &key, &confirm, wait).await
}

async fn follow(
    store: &dyn bloodraven_store::Store,
    key: &bloodraven_store::ObjectKey,
    confirm: &str,
    wait: Duration,
) -> i32 {
    use crate::cli::Progress;
    crate::cli::follow(store, key, wait, |_, body| {
        let Some(r) = body
            .status
            .restore_in_place
            .as_ref()
            .filter(|r| r.confirm_token_used == confirm)
        else {
            return Progress::Nothing;
        };
        Progress::of("restore-in-place", progress_line(r), r)
    })
    .await
}

fn progress_line(r: &RestoreStatus) -> String {
    let mut line = format!("phase {} (target {})", r.phase.as_str(), r.target_site);
    if r.bytes_loaded > 0 {
        let _ = write!(line, ", {} bytes loaded", r.bytes_loaded);
    }
    if !r.message.is_empty() {
        let _ = write!(line, ": {}", r.message);
    }
    line
}
