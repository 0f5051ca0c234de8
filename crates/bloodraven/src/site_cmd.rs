//! `bloodraven site reclone --group G --site S --confirm PREFIX`: requests a reclone (the
//! `bloodraven.shipstream.io/reclone-site` annotation on the stored group, through the store of
//! the platform the configuration names) and follows it.
//!
//! The request is checked here first, against the stored status, by the rules the operator
//! applies when it takes it ([`bloodraven_core::reclone::admit`]): a wrong confirmation, the
//! active site, a site the group does not have, or another operation in progress is refused
//! with the rule, and nothing is written.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::contract::annotations::RECLONE_SITE;
use bloodraven_core::reclone;
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::RecloneStatus;
use bloodraven_operator::config;
use clap::{Args, Subcommand};

/// Exit codes of `bloodraven site reclone`.
pub mod exit {
    pub use crate::cli::exit::{ERROR, OK as SUCCEEDED, REFUSED};
}

#[derive(Debug, Args)]
pub struct SiteArgs {
    #[command(subcommand)]
    command: SiteCommand,
}

#[derive(Debug, Subcommand)]
enum SiteCommand {
    /// Rebuild a site from the group: a copy of the data from a caught-up replica (or the
    /// primary) loaded into it, then replication from the active site. What the site holds
    /// that the group does not is discarded: --confirm names it.
    Reclone(RecloneArgs),
}

#[derive(Debug, Args)]
pub struct RecloneArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The site to rebuild (never the active site).
    #[arg(long)]
    site: String,
    /// The first 8 or more characters of the site's divergent GTID set as `bloodraven status`
    /// shows it (`divergentGtidSet`; the whole set when it is shorter), or the site's name
    /// when nothing of it diverges.
    #[arg(long)]
    confirm: String,
    /// The operator's configuration file (for its store).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// How long to follow the reclone; 0s requests it and returns at once.
    #[arg(long, default_value = "1h")]
    wait: String,
}

pub fn run(args: &SiteArgs) -> i32 {
    match &args.command {
        SiteCommand::Reclone(a) => run_reclone(a),
    }
}

fn run_reclone(args: &RecloneArgs) -> i32 {
    let (wait, cfg) = match crate::cli::request_flags(&args.wait, &args.config) {
        Ok(f) => f,
        Err(code) => return code,
    };
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        request_and_follow(&cfg, args, wait),
    )
}

async fn request_and_follow(cfg: &config::LoadedConfig, args: &RecloneArgs, wait: Duration) -> i32 {
    let (store, key, FailoverGroupBody { spec, status }) =
        match crate::cli::open_group(cfg, &args.group).await {
            Ok(g) => g,
            Err(code) => return code,
        };
    let names: Vec<String> = spec.sites.iter().map(|s| s.name.clone()).collect();
    if let Err(refusal) = reclone::admit(&args.site, &args.confirm, &status, &names) {
        eprintln!("error: refused, nothing was written: {refusal}");
        return exit::REFUSED;
    }
    let before = status.site(&args.site).and_then(|s| s.reclone.clone());
    let value = reclone::request_value(&args.site, &args.confirm);
    if let Err(e) = bloodraven_store::set_annotation(&*store, &key, RECLONE_SITE, &value).await {
        eprintln!("error: {e}");
        return exit::ERROR;
    }
    eprintln!("requested a reclone of {} in {}", args.site, args.group);
    if wait.is_zero() {
        return exit::SUCCEEDED;
    }
    follow(&*store, &key, &args.site, before, wait).await
}

/// Prints each change of the reclone (phase, donor, bytes) until it ends or `wait` passes.
async fn follow(
    store: &dyn bloodraven_store::Store,
    key: &bloodraven_store::ObjectKey,
    site: &str,
    before: Option<RecloneStatus>,
    wait: Duration,
) -> i32 {
    use crate::cli::Progress;
    // The request is taken on the operator's next poll: until then the reclone shown (if
    // any) is an earlier one; its start is recognised by the annotation's removal.
    let mut taken = false;
    crate::cli::follow(store, key, wait, |obj, body| {
        taken |= !obj.metadata.annotations.contains_key(RECLONE_SITE);
        // Once taken, a reclone that is still the one before means the request was refused.
        let current = body
            .status
            .site(site)
            .and_then(|s| s.reclone.as_ref())
            .filter(|r| taken && Some(*r) != before.as_ref());
        match current {
            Some(r) => Progress::of(&format!("reclone of {site}"), progress_line(r), r),
            // Taken and refused (an event says why): the annotation is gone, no reclone.
            None if taken => Progress::refused("RecloneRefused"),
            None => Progress::Nothing,
        }
    })
    .await
}

fn progress_line(r: &RecloneStatus) -> String {
    let mut line = format!("phase {}", r.phase.as_str());
    if !r.donor.is_empty() {
        let _ = write!(line, " from {}", r.donor);
    }
    if r.bytes_copied > 0 {
        let _ = write!(line, ", {} copied", megabytes(r.bytes_copied));
    }
    if !r.message.is_empty() {
        let _ = write!(line, ": {}", r.message);
    }
    line
}

/// `n` bytes as megabytes with one decimal.
fn megabytes(n: u64) -> String {
    format!("{}.{} MB", n / 1_000_000, (n % 1_000_000) / 100_000)
}
