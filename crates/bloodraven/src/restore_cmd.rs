//! `bloodraven restore-in-place --group G --from FILE --confirm now|TIMESTAMP [--target S]
//! [--check] [--wait D]`: checks a `mariadb-dump` file and requests a restore-in-place of it
//! (`spec.restoreInPlace` on the stored group, through the store of the platform the
//! configuration names), then follows `status.restoreInPlace`.
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
    #[arg(long = "from")]
    from: PathBuf,
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

async fn go(args: &RestoreArgs, wait: Duration) -> i32 {
    let from = match std::fs::canonicalize(&args.from) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --from {}: {e}", args.from.display());
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
    let (store, key, _) = match crate::cli::open_group(&cfg, &args.group).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let request = bloodraven_core::config::RestoreInPlaceSpec {
        confirm: confirm.clone(),
        source: from.display().to_string(),
        target: args.target.clone(),
    };
    // Written with the stored object's version: a concurrent change is read again.
    for attempt in 1..=5 {
        let obj = match store.get(&key).await {
            Ok(Some(o)) => o,
            Ok(None) => {
                eprintln!("error: group {} is not in the store", args.group);
                return exit::ERROR;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        };
        let body = match obj.decode::<FailoverGroupBody>() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: the stored group {} cannot be read: {e}", args.group);
                return exit::ERROR;
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
                return exit::REFUSED;
            }
        }
        if let Some(t) = &request.target
            && !body.spec.sites.iter().any(|s| &s.name == t)
        {
            eprintln!(
                "error: --target: {t:?} is not a site of group {}",
                args.group
            );
            return exit::USAGE;
        }
        let mut next = obj.clone();
        let value = match serde_json::to_value(&spec) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
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
                return exit::ERROR;
            }
        }
    }
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
