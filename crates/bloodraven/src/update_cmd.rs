//! `bloodraven update --group G [--wait D]`: requests an ordered update (the
//! `bloodraven.shipstream.io/ordered-update` annotation on the stored group, whose value is a
//! new request id, through the store of the platform the configuration names) and follows it,
//! printing each phase.
//!
//! The request is checked here first by the rules the operator applies when it takes it
//! ([`bloodraven_core::update::request`]): another operation in progress, or no site with an
//! update, is refused with the rule, and nothing is written.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::config::validate_group;
use bloodraven_core::contract::annotations::ORDERED_UPDATE;
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::UpdateStatus;
use bloodraven_core::time::Clock as _;
use bloodraven_core::update::{self, Request, Updatable};
use bloodraven_operator::config;
use bloodraven_runtime::clock::SystemClock;
use clap::Args;

/// Exit codes of `bloodraven update`.
pub mod exit {
    pub use crate::cli::exit::{ERROR, OK as SUCCEEDED, REFUSED, USAGE};
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// The group.
    #[arg(long)]
    group: String,
    /// The operator's configuration file (for its store).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// How long to follow the update; 0s requests it and returns at once.
    #[arg(long, default_value = "1h")]
    wait: String,
    /// The request's id (default: `update-<unix seconds>`). An id runs once: asking again
    /// with the id of an update that ran changes nothing.
    #[arg(long)]
    id: Option<String>,
}

pub fn run(args: &UpdateArgs) -> i32 {
    let wait = match crate::cli::wait_flag(&args.wait) {
        Ok(d) => d,
        Err(code) => return code,
    };
    if let Some(id) = &args.id
        && (id.is_empty()
            || id.len() > 63
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        eprintln!(
            "error: --id: must be 1 to 63 characters of letters, digits, '-', '_' and '.', got {id:?}"
        );
        return exit::USAGE;
    }
    let cfg = match crate::cli::load_config(&args.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        request_and_follow(&cfg, args, wait),
    )
}

async fn request_and_follow(cfg: &config::LoadedConfig, args: &UpdateArgs, wait: Duration) -> i32 {
    let (store, key, FailoverGroupBody { spec, status }) =
        match crate::cli::open_group(cfg, &args.group).await {
            Ok(g) => g,
            Err(code) => return code,
        };
    let updatable: Vec<Updatable> = match validate_group(&key.name, &key.namespace, &spec) {
        Ok(g) => g
            .sites
            .iter()
            .filter_map(|s| {
                s.update.as_ref().map(|u| Updatable {
                    site: s.name.clone(),
                    timeout: u.timeout,
                })
            })
            .collect(),
        Err(e) => {
            eprintln!("error: the stored group {} is not valid: {e}", args.group);
            return exit::ERROR;
        }
    };
    let now = SystemClock.now();
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("update-{}", now.unix_seconds()));
    match update::request(&id, &status, &updatable, now) {
        Request::Reject(note) => {
            eprintln!("error: refused, nothing was written: {}", note.message);
            return exit::REFUSED;
        }
        Request::Taken => {
            eprintln!("request {id} is the ordered update in flight or one that ran; following it");
        }
        Request::Accept(_) => {
            if let Err(e) =
                bloodraven_store::set_annotation(&*store, &key, ORDERED_UPDATE, &id).await
            {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
            eprintln!("requested ordered update {id} of {}", args.group);
        }
    }
    if wait.is_zero() {
        return exit::SUCCEEDED;
    }
    follow(&*store, &key, &id, wait).await
}

/// Prints each change of the update until it ends or `wait` passes.
async fn follow(
    store: &dyn bloodraven_store::Store,
    key: &bloodraven_store::ObjectKey,
    id: &str,
    wait: Duration,
) -> i32 {
    use crate::cli::Progress;
    crate::cli::follow(store, key, wait, |obj, body| {
        let pending = obj.metadata.annotations.contains_key(ORDERED_UPDATE);
        match body
            .status
            .update_phase
            .as_ref()
            .filter(|u| u.request_id == id)
        {
            Some(u) => Progress::of(&format!("ordered update {id}"), progress_line(u), u),
            None if !pending => Progress::refused("OrderedUpdateRejected"),
            None => Progress::Nothing,
        }
    })
    .await
}

fn progress_line(u: &UpdateStatus) -> String {
    let mut line = format!("phase {}", u.phase.as_str());
    if !u.site.is_empty() {
        let _ = write!(line, " ({})", u.site);
    }
    if !u.sites_done.is_empty() {
        let _ = write!(line, ", done: {}", u.sites_done.join(", "));
    }
    if let Some(a) = &u.admission
        && let Some(r) = &a.retry_time
    {
        let _ = write!(line, ", retry at {r}");
    }
    if !u.message.is_empty() {
        let _ = write!(line, ": {}", u.message);
    }
    line
}
