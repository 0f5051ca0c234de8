//! `bloodraven backup now|list --group G --config F`: take a backup of the group now and follow
//! it, or list the group's backups (docs/backup.md).
//!
//! `now` asks through the store (the `bloodraven.shipstream.io/backup-now` annotation on the
//! stored group, its value the backup's id); the leading operator takes it on its next poll,
//! picks the source site and asks that site's sidecar. The command prints the bytes stored and
//! the rate while it runs. It is checked here first: a group without `spec.backup`, a backup
//! already running or a malformed `--id` is refused with the rule, and nothing is written.
//!
//! `verify` asks the same way (`bloodraven.shipstream.io/backup-verify`); the operator verifies
//! on its host and records the result in `status.backups.lastVerified`.
//!
//! `list` reads the manifests under the group's target (a directory this host reaches), plus
//! the status's running or failed last backup; `--output json` prints an array of objects of
//! the status's shape (`status.backups.last`).

use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::config::{BackupTarget, GroupConfig, validate_group};
use bloodraven_core::contract::annotations::{BACKUP_NOW, BACKUP_VERIFY};
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::{BackupPhase, BackupRecord, BackupsStatus};
use bloodraven_operator::config;
use clap::{Args, Subcommand, ValueEnum};

use crate::cli::{Progress, exit};

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(subcommand)]
    command: BackupCommand,
}

#[derive(Debug, Subcommand)]
enum BackupCommand {
    /// Take a backup now (on the healthiest replica, as spec.backup.source says) and follow
    /// it: bytes stored and rate while it runs, its GTID position when it ends.
    Now(RequestArgs),
    /// List the group's backups: newest first.
    List(ListArgs),
    /// Verify a backup (default: the newest good one) on the operator's host: every file's
    /// checksum, the data prepared and opened by a scratch server, every table checked, the
    /// GTID position. The result goes to status.backups.lastVerified.
    Verify(RequestArgs),
}

/// `now` and `verify`: a request the operator takes, followed.
#[derive(Debug, Args)]
struct RequestArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The backup: for `now` the new one's id (letters, digits, -, _ and .; default
    /// `<group>-<UTC time>`), for `verify` the one to verify (default: the newest good one).
    #[arg(long)]
    id: Option<String>,
    /// The operator's configuration file (for its store).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// How long to follow it; 0s requests it and returns at once.
    #[arg(long, default_value = "1h")]
    wait: String,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The operator's configuration file (for its store).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

pub fn run(args: &BackupArgs) -> i32 {
    match &args.command {
        BackupCommand::Now(a) => {
            let (wait, cfg) = match crate::cli::request_flags(&a.wait, &a.config) {
                Ok(f) => f,
                Err(code) => return code,
            };
            crate::cli::run(crate::cli::Flavor::CurrentThread, now(&cfg, a, wait))
        }
        BackupCommand::Verify(a) => {
            let (wait, cfg) = match crate::cli::request_flags(&a.wait, &a.config) {
                Ok(f) => f,
                Err(code) => return code,
            };
            crate::cli::run(crate::cli::Flavor::CurrentThread, verify(&cfg, a, wait))
        }
        BackupCommand::List(a) => {
            let cfg = match crate::cli::request_flags("0s", &a.config) {
                Ok((_, cfg)) => cfg,
                Err(code) => return code,
            };
            crate::cli::run(crate::cli::Flavor::CurrentThread, list(&cfg, a))
        }
    }
}

/// The group's validated configuration, with its backup settings; the refusal otherwise.
fn backup_config(
    key: &bloodraven_store::ObjectKey,
    body: &FailoverGroupBody,
) -> Result<GroupConfig, BackupsUnavailable> {
    let name = &key.name;
    let cfg =
        validate_group(name, &key.namespace, &body.spec).map_err(BackupsUnavailable::Invalid)?;
    if cfg.backup.is_none() {
        return Err(BackupsUnavailable::NotConfigured(name.clone()));
    }
    Ok(cfg)
}

/// Why the backup commands cannot serve a group, or reach its target from here.
#[derive(Debug, thiserror::Error)]
pub enum BackupsUnavailable {
    #[error("the stored spec does not validate: {0}")]
    Invalid(#[source] bloodraven_core::config::ValidationErrors),
    #[error("group {0} has no spec.backup: add one (target, and optionally a schedule) first")]
    NotConfigured(String),
    #[error("the target {0} is not a directory this host reaches")]
    Unreachable(String),
    #[error("the target {target} cannot be opened here: {source}")]
    Open {
        target: String,
        #[source]
        source: bloodraven_operator::secrets::SecretError,
    },
}

/// The group's store, key and body, once its stored spec has a valid `spec.backup`; the exit
/// code after saying why not otherwise (nothing written).
async fn open_backups(
    cfg: &config::LoadedConfig,
    group: &str,
) -> Result<
    (
        std::sync::Arc<dyn bloodraven_store::Store>,
        bloodraven_store::ObjectKey,
        FailoverGroupBody,
    ),
    i32,
> {
    let (store, key, body) = crate::cli::open_group(cfg, group).await?;
    if let Err(refusal) = backup_config(&key, &body) {
        eprintln!("error: refused, nothing was written: {refusal}");
        return Err(exit::REFUSED);
    }
    Ok((store, key, body))
}

async fn now(cfg: &config::LoadedConfig, args: &RequestArgs, wait: Duration) -> i32 {
    let (store, key, body) = match open_backups(cfg, &args.group).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let id = match &args.id {
        Some(id) if bloodraven_mysql::backup::valid_id(id) => id.clone(),
        Some(_) => {
            eprintln!(
                "error: refused, nothing was written: --id must be 1 to 64 of letters, digits, -, _ and ., not starting with ."
            );
            return exit::REFUSED;
        }
        None => bloodraven_core::backup::backup_id(
            &args.group,
            bloodraven_core::time::Clock::now(&bloodraven_runtime::clock::SystemClock),
        ),
    };
    if let Some(b) = body
        .status
        .backups
        .as_ref()
        .and_then(BackupsStatus::running)
    {
        eprintln!(
            "error: refused, nothing was written: backup {} is running on {} (one at a time)",
            b.id, b.site
        );
        return exit::REFUSED;
    }
    if let Err(e) = bloodraven_store::set_annotation(&*store, &key, BACKUP_NOW, &id).await {
        eprintln!("error: {e}");
        return exit::ERROR;
    }
    eprintln!("requested backup {id} of {}", args.group);
    if wait.is_zero() {
        return exit::OK;
    }
    let started = tokio::time::Instant::now();
    let mut taken = false;
    crate::cli::follow(&*store, &key, wait, |obj, body| {
        taken |= obj.metadata.annotations.get(BACKUP_NOW) != Some(&id);
        let last = body
            .status
            .backups
            .as_ref()
            .and_then(|b| b.last.as_ref())
            .filter(|b| b.id == id);
        match last {
            Some(b) => look(b, started.elapsed()),
            // Taken and not started (an event says why).
            None if taken => Progress::refused("BackupFailed"),
            None => Progress::Nothing,
        }
    })
    .await
}

async fn verify(cfg: &config::LoadedConfig, args: &RequestArgs, wait: Duration) -> i32 {
    let (store, key, body) = match open_backups(cfg, &args.group).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let backups = body.status.backups.clone().unwrap_or_default();
    let id = match (&args.id, &backups.last_succeeded) {
        (Some(id), _) if bloodraven_mysql::backup::valid_id(id) => id.clone(),
        (Some(_), _) => {
            eprintln!(
                "error: refused, nothing was written: --id must be 1 to 64 of letters, digits, -, _ and ., not starting with ."
            );
            return exit::REFUSED;
        }
        (None, Some(newest)) => newest.id.clone(),
        (None, None) => {
            eprintln!(
                "error: refused, nothing was written: the group has no good backup yet (bloodraven backup now), or name one with --id"
            );
            return exit::REFUSED;
        }
    };
    if let Some(v) = backups
        .last_verified
        .as_ref()
        .filter(|v| v.phase == BackupPhase::Running)
    {
        eprintln!(
            "error: refused, nothing was written: backup {} is being verified (one at a time)",
            v.id
        );
        return exit::REFUSED;
    }
    let before = backups.last_verified.clone();
    if let Err(e) = bloodraven_store::set_annotation(&*store, &key, BACKUP_VERIFY, &id).await {
        eprintln!("error: {e}");
        return exit::ERROR;
    }
    eprintln!(
        "requested the verification of backup {id} of {}",
        args.group
    );
    if wait.is_zero() {
        return exit::OK;
    }
    let mut taken = false;
    crate::cli::follow(&*store, &key, wait, |obj, body| {
        taken |= obj.metadata.annotations.get(BACKUP_VERIFY) != Some(&id);
        let current = body
            .status
            .backups
            .as_ref()
            .and_then(|b| b.last_verified.as_ref())
            .filter(|v| taken && v.id == id && Some(*v) != before.as_ref());
        match current {
            Some(v) => {
                let line = format!("verification of backup {}: {}", v.id, v.phase.as_str());
                match v.phase {
                    BackupPhase::Running => Progress::Line(line),
                    BackupPhase::Succeeded => Progress::Ended {
                        line,
                        outcome: format!("backup {} verified: {}", v.id, v.message),
                        code: exit::OK,
                    },
                    BackupPhase::Failed => Progress::Ended {
                        line,
                        outcome: format!("backup {} failed its verification: {}", v.id, v.message),
                        code: exit::FAILED,
                    },
                }
            }
            None if taken => Progress::refused("BackupVerifyFailed"),
            None => Progress::Nothing,
        }
    })
    .await
}

/// What one look at the followed backup says.
fn look(b: &BackupRecord, elapsed: Duration) -> Progress {
    // Tenths of a megabyte are precise enough for a progress line.
    let tenths = f64::from(u32::try_from(b.bytes / 100_000).unwrap_or(u32::MAX));
    let rate = tenths / 10.0 / elapsed.as_secs_f64().max(1.0);
    let line = format!(
        "backup {} on {}: {}, {} stored ({rate:.1} MB/s)",
        b.id,
        b.site,
        b.phase.as_str(),
        megabytes(b.bytes)
    );
    match b.phase {
        BackupPhase::Running => Progress::Line(line),
        BackupPhase::Succeeded => Progress::Ended {
            line,
            outcome: format!(
                "backup {} succeeded: GTID position {}, {}",
                b.id,
                b.gtid_position,
                megabytes(b.bytes)
            ),
            code: exit::OK,
        },
        BackupPhase::Failed => Progress::Ended {
            line,
            outcome: format!("backup {} failed: {}", b.id, b.message),
            code: exit::FAILED,
        },
    }
}

/// The storage of `target` as this host reaches it: a directory it sees, or a bucket whose
/// keys are in a file it reads (a Secret is read only by the operator in its cluster).
pub async fn reachable_storage(
    target: &BackupTarget,
    namespace: &str,
) -> Result<bloodraven_mysql::backup::Storage, BackupsUnavailable> {
    if let BackupTarget::File(root) = target
        && !root.is_dir()
    {
        return Err(BackupsUnavailable::Unreachable(root.display().to_string()));
    }
    bloodraven_operator::secrets::backup_storage(
        target,
        namespace,
        &bloodraven_operator::secrets::NoSecrets,
    )
    .await
    .map(|(storage, _)| storage)
    .map_err(|source| BackupsUnavailable::Open {
        target: target.url(),
        source,
    })
}

/// `n` bytes as megabytes with one decimal.
fn megabytes(n: u64) -> String {
    format!("{}.{} MB", n / 1_000_000, (n % 1_000_000) / 100_000)
}

async fn list(cfg: &config::LoadedConfig, args: &ListArgs) -> i32 {
    let (_store, key, body) = match crate::cli::open_group(cfg, &args.group).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let group = match backup_config(&key, &body) {
        Ok(g) => g,
        Err(refusal) => {
            eprintln!("error: {refusal}");
            return exit::REFUSED;
        }
    };
    let Some(target) = group.backup.as_ref().map(|b| b.target.clone()) else {
        return exit::ERROR;
    };
    let manifests = match reachable_storage(&target, &key.namespace).await {
        Ok(storage) => match bloodraven_mysql::backup::list(&storage).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        },
        Err(why) => {
            eprintln!("warning: {why}; only the status's backups are shown");
            Vec::new()
        }
    };
    let mut rows: Vec<BackupRecord> = manifests
        .into_iter()
        .filter(|m| m.group == args.group)
        .map(|m| BackupRecord {
            id: m.id,
            phase: BackupPhase::Succeeded,
            site: m.site,
            gtid_position: m.gtid_position,
            topology_generation: m.topology_generation,
            start_time: Some(m.start_time),
            completion_time: Some(m.completion_time),
            bytes: m.bytes,
            message: String::new(),
            from_primary: false,
        })
        .collect();
    if let Some(last) = body.status.backups.as_ref().and_then(|b| b.last.as_ref())
        && last.phase != BackupPhase::Succeeded
        && !rows.iter().any(|r| r.id == last.id)
    {
        rows.push(last.clone());
    }
    rows.sort_by(|a, b| (b.start_time, &b.id).cmp(&(a.start_time, &a.id)));
    match args.output {
        Output::Json => match serde_json::to_string_pretty(&rows) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        },
        Output::Text => {
            println!(
                "{:<40} {:<10} {:<8} {:>12} {:<22} GTID POSITION",
                "ID", "PHASE", "SITE", "SIZE", "STARTED"
            );
            for r in &rows {
                println!(
                    "{:<40} {:<10} {:<8} {:>12} {:<22} {}",
                    r.id,
                    r.phase.as_str(),
                    r.site,
                    megabytes(r.bytes),
                    r.start_time
                        .map(bloodraven_core::time::Timestamp::to_rfc3339)
                        .unwrap_or_default(),
                    if r.phase == BackupPhase::Succeeded {
                        r.gtid_position.clone()
                    } else {
                        r.message.clone()
                    }
                );
            }
        }
    }
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: BackupPhase, bytes: u64) -> BackupRecord {
        BackupRecord {
            id: "b1".into(),
            phase,
            site: "pdx".into(),
            gtid_position: "0-1-42".into(),
            topology_generation: 3,
            start_time: None,
            completion_time: None,
            bytes,
            message: "its tools failed".into(),
            from_primary: false,
        }
    }

    #[test]
    fn a_look_shows_bytes_and_rate_and_ends_with_the_phase() {
        let running = look(
            &record(BackupPhase::Running, 20_000_000),
            Duration::from_secs(10),
        );
        let Progress::Line(line) = running else {
            panic!("running is a line");
        };
        assert!(line.contains("20.0 MB stored (2.0 MB/s)"), "{line}");
        let Progress::Ended { outcome, code, .. } =
            look(&record(BackupPhase::Succeeded, 1), Duration::from_secs(1))
        else {
            panic!("ended");
        };
        assert_eq!(code, exit::OK);
        assert!(outcome.contains("0-1-42"), "{outcome}");
        let Progress::Ended { outcome, code, .. } =
            look(&record(BackupPhase::Failed, 1), Duration::from_secs(1))
        else {
            panic!("ended");
        };
        assert_eq!(code, exit::FAILED);
        assert!(outcome.contains("its tools failed"), "{outcome}");
    }
}
