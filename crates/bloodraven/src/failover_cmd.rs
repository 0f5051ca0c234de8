//! `bloodraven failover --group G --to SITE`: requests a planned failover (the
//! `bloodraven.shipstream.io/planned-failover` annotation on the stored group, through the
//! store of the platform the configuration names: the embedded store, or the Kubernetes API,
//! where it is exactly `kubectl annotate`) and follows its phases.
//!
//! With `--force` it asks instead that a site announced by a strict emergency failover
//! (`status.awaitingFence`) take writes without proof that the old primary is fenced (the
//! `bloodraven.shipstream.io/force-promotion` annotation, `<site>:<who asked>`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::OperationStatus as _;
use bloodraven_core::status::RestorePhase;
use bloodraven_operator::config;
use bloodraven_store::{ObjectKey, Store, StoreError};
use clap::Args;

use crate::cli::{Progress, Unfinished};

/// Exit codes of `bloodraven failover`.
pub mod exit {
    pub use crate::cli::exit::{ERROR, FAILED, NOT_FINISHED, OK as SUCCEEDED, USAGE};
}

#[derive(Debug, Args)]
pub struct FailoverArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The site to promote.
    #[arg(long)]
    to: String,
    /// The operator's configuration file (for its data directory).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// How long to follow the failover; 0s requests it and returns at once.
    #[arg(long, default_value = "5m")]
    wait: String,
    /// `fencing: strict`: promote the site an emergency failover announced, now, without
    /// proof that the old primary is fenced (it may still take writes: two writable sites).
    #[arg(long)]
    force: bool,
    /// With --force: who asks, recorded in the request and its event (default: the user and
    /// host running this command).
    #[arg(long, requires = "force")]
    by: Option<String>,
}

/// Who runs this command: `$USER@host`.
fn whoami() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{user}@{host}")
}

pub fn run(args: &FailoverArgs) -> i32 {
    let (wait, cfg) = match crate::cli::request_flags(&args.wait, &args.config) {
        Ok(f) => f,
        Err(code) => return code,
    };
    if args.force {
        let by = args.by.clone().unwrap_or_else(whoami);
        if by.trim().is_empty() || by.len() > 128 || by.chars().any(char::is_control) {
            eprintln!("error: --by: must be 1 to 128 printable characters");
            return exit::USAGE;
        }
        return crate::cli::run(
            crate::cli::Flavor::CurrentThread,
            force_and_follow(&cfg, &args.group, &args.to, &by, wait),
        );
    }
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        request_and_follow(&cfg, &args.group, &args.to, wait),
    )
}

/// Whether `--force --to to` may be asked for: a promotion of `to` awaits a fence (`false`),
/// or a failed restore-in-place keeps every site fenced (`true`); the exit code after saying
/// why not otherwise.
fn forcible(body: &FailoverGroupBody, group: &str, to: &str) -> Result<bool, i32> {
    let failed_restore = body
        .status
        .restore_in_place
        .as_ref()
        .filter(|r| r.phase == RestorePhase::Failed && r.holds_writes());
    match (&body.status.awaiting_fence, failed_restore) {
        (Some(w), _) if w.target == to => Ok(false),
        (Some(w), _) => {
            eprintln!(
                "error: --to: {} awaits its promotion (announced after {} stopped answering), not {to}; nothing changed",
                w.target, w.site
            );
            Err(exit::USAGE)
        }
        (None, Some(r)) => {
            if !body.spec.sites.iter().any(|s| s.name == to) {
                eprintln!("error: --to: {to:?} is not a site of {group}; nothing changed");
                return Err(exit::USAGE);
            }
            eprintln!(
                "the restore-in-place ({}) failed and keeps every site fenced: {to} will take writes, and the sites whose data differs from it will await a reclone",
                r.confirm_token_used
            );
            Ok(true)
        }
        (None, None) => {
            eprintln!(
                "error: --force: no promotion of {group} awaits a fence (status.awaitingFence is empty: it happens with spec.emergencyFailover.fencing: strict), and no failed restore-in-place keeps the writes fenced; nothing changed. Without --force this command requests a planned failover."
            );
            Err(exit::USAGE)
        }
    }
}

/// `--force`: refused (changing nothing) unless `to` is the site a strict emergency failover
/// announced and keeps read-only; then requests it and follows until it takes writes.
async fn force_and_follow(
    cfg: &config::LoadedConfig,
    group: &str,
    to: &str,
    by: &str,
    wait: Duration,
) -> i32 {
    use bloodraven_core::contract::annotations::FORCE_PROMOTION;
    let (store, key, body) = match crate::cli::open_group(cfg, group).await {
        Ok(g) => g,
        Err(code) => return code,
    };
    let restore_forced = match forcible(&body, group, to) {
        Ok(restore_forced) => restore_forced,
        Err(code) => return code,
    };
    if let Err(e) =
        bloodraven_store::set_annotation(&*store, &key, FORCE_PROMOTION, &format!("{to}:{by}"))
            .await
    {
        eprintln!("error: {e}");
        return exit::ERROR;
    }
    eprintln!(
        "requested that {to} take writes without proof that the old primary is fenced (asked by {by})"
    );
    if wait.is_zero() {
        return exit::SUCCEEDED;
    }
    let stands = Unfinished {
        code: exit::NOT_FINISHED,
        says: "the request stands (follow it with `bloodraven status`)",
    };
    crate::cli::follow_until(&*store, &key, wait, stands, |obj, b| {
        if b.status.awaiting_fence.is_some() {
            return Progress::Nothing;
        }
        if restore_forced {
            let r = b.status.restore_in_place.as_ref();
            if r.is_some_and(|r| r.forced_to.is_empty() && r.holds_writes()) {
                if obj.metadata.annotations.contains_key(FORCE_PROMOTION) {
                    return Progress::Nothing;
                }
                return Progress::Ended {
                    line: String::new(),
                    outcome: format!(
                        "the operator refused to force {to} out of the failed restore (its event ForcedPromotion says why); nothing changed"
                    ),
                    code: exit::FAILED,
                };
            }
        }
        let (outcome, code) = if b.status.active_site == to {
            (
                format!(
                    "{to} takes writes (forced by {by}); topologyGeneration {}",
                    b.status.topology_generation
                ),
                exit::SUCCEEDED,
            )
        } else {
            (
                format!(
                    "the promotion of {to} no longer awaits (the active site is {:?}): nothing was forced",
                    b.status.active_site
                ),
                exit::FAILED,
            )
        };
        Progress::Ended {
            line: String::new(),
            outcome,
            code,
        }
    })
    .await
}

async fn request_and_follow(
    cfg: &config::LoadedConfig,
    group: &str,
    to: &str,
    wait: Duration,
) -> i32 {
    let (store, key, FailoverGroupBody { spec, .. }) =
        match crate::cli::open_group(cfg, group).await {
            Ok(g) => g,
            Err(code) => return code,
        };
    let key = &key;
    if !spec.sites.iter().any(|s| s.name == to) {
        eprintln!(
            "error: --to: {to:?} is not a site of {group} (sites: {})",
            spec.sites
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return exit::USAGE;
    }
    let before = match annotate(&*store, key, to).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    eprintln!("requested a planned failover of {} to {to}", key.name);
    if wait.is_zero() {
        return exit::SUCCEEDED;
    }
    crate::cli::follow(&*store, key, wait, |_, body| {
        let Some(pf) = body
            .status
            .planned_failover
            .as_ref()
            .filter(|pf| pf.target == to && pf.start_time != before)
        else {
            return Progress::Nothing;
        };
        let mut line = format!("phase {}", pf.phase.as_str());
        if let Some(defer) = &pf.admission.defer_reason
            && pf.phase == PlannedFailoverPhase::Deferred
        {
            let retry = pf
                .admission
                .retry_time
                .map(bloodraven_core::time::Timestamp::to_rfc3339)
                .unwrap_or_default();
            let _ = write!(
                line,
                " ({defer}; retry at {retry}): {}",
                pf.admission.message
            );
        }
        match pf.phase {
            PlannedFailoverPhase::Succeeded => Progress::Ended {
                line,
                outcome: format!(
                    "planned failover to {to} succeeded in {:.3} s ({} transactions lost); topologyGeneration {}",
                    pf.duration_seconds.unwrap_or(0.0),
                    pf.transactions_lost.unwrap_or(0),
                    body.status.topology_generation
                ),
                code: exit::SUCCEEDED,
            },
            PlannedFailoverPhase::Failed => Progress::Ended {
                line,
                outcome: format!(
                    "planned failover to {to} failed: {}: {}",
                    pf.failure().unwrap_or("unknown"),
                    pf.message
                ),
                code: exit::FAILED,
            },
            _ => Progress::Line(line),
        }
    })
    .await
}

/// Sets the annotation (compare-and-swap) and returns the start time of the planned failover
/// the status held before, to recognise the new one (the annotation leaves the status as it
/// was, so the written object still holds it).
async fn annotate(
    store: &dyn Store,
    key: &ObjectKey,
    to: &str,
) -> Result<Option<bloodraven_core::time::Timestamp>, StoreError> {
    let written = bloodraven_store::set_annotation(store, key, PLANNED_FAILOVER, to).await?;
    Ok(written
        .decode::<FailoverGroupBody>()
        .ok()
        .and_then(|b| b.status.planned_failover)
        .and_then(|p| p.start_time))
}
