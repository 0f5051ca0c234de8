//! `bloodraven release`: safe changes to a Kubernetes Deployment (SPEC §6, seed 03).
//!
//! Parses and validates the arguments, shows the plan, asks for confirmation (unless `--yes`),
//! applies it through `bloodraven_release::Releaser` and maps the outcome to an exit
//! code. All decisions live in the core and the engine; this file only talks to the user.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_core::release::selector::Selector;
use bloodraven_core::release::{AppCheck, Change, Plan, ReleaseAction, check_replicas};
use bloodraven_deploy::record::RecordLine;
use bloodraven_release::apps;
use bloodraven_release::cluster::{self, ClusterOptions};
use bloodraven_release::history::{self, ReleaseSummary};
use bloodraven_release::{ApplyError, ApplyReport, Outcome, PlanningError, Releaser, Timeouts};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

/// Exit codes of `bloodraven release`, one per outcome (documented in docs/release.md).
pub mod exit {
    /// Ready (or `history` listed the records) is `OK`; `ERROR` an unexpected error
    /// (kubeconfig, connection, local IO); `USAGE` bad command-line input.
    pub use crate::cli::exit::{ERROR, OK as READY, USAGE};
    /// No plan: a pre-check failed, the dry-run was rejected, nothing to roll back to.
    pub const NO_PLAN: i32 = 3;
    /// The plan was not confirmed (declined, or no terminal and no `--yes`).
    pub const NOT_CONFIRMED: i32 = 4;
    /// Another client holds the release Lease.
    pub const LEASE_HELD: i32 = 5;
    /// The Deployment changed since the plan; make a new plan.
    pub const STALE_PLAN: i32 = 6;
    /// The rollout failed (`ProgressDeadlineExceeded`); nothing was rolled back.
    pub const FAILED: i32 = 7;
    /// The apply bound passed with the rollout still progressing.
    pub const STILL_PROGRESSING: i32 = 8;
    /// Another actor changed or paused the Deployment during the rollout.
    pub const SUPERSEDED: i32 = 9;
    /// The update was sent and its answer lost: check the cluster.
    pub const UNCONFIRMED: i32 = 10;
    /// A record line could not be written; execution stopped.
    pub const RECORD_FAILED: i32 = 11;
    /// The update was refused, or the release stopped before it; nothing was changed.
    pub const NOT_APPLIED: i32 = 12;
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(subcommand)]
    command: ReleaseCommand,
}

#[derive(Debug, Subcommand)]
enum ReleaseCommand {
    /// Set one container's image: `image DEPLOYMENT CONTAINER=IMAGE`.
    Image {
        /// The Deployment's name.
        deployment: String,
        /// The container and its new image, e.g. `app=registry.example/web:2.0`.
        #[arg(value_name = "CONTAINER=IMAGE")]
        assignment: String,
        #[command(flatten)]
        app: AppArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Set the replica count (0–1000).
    Scale {
        /// The Deployment's name.
        deployment: String,
        /// The new replica count, 0–1000.
        #[arg(value_name = "REPLICAS", allow_hyphen_values = true)]
        replicas: String,
        #[command(flatten)]
        app: AppArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Replace every Pod (changes the Pod template's release annotation).
    Restart {
        /// The Deployment's name.
        deployment: String,
        #[command(flatten)]
        app: AppArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Put back the image of an earlier successful release, as a new plan.
    Rollback {
        /// The Deployment's name.
        deployment: String,
        /// The release record (plan ID) whose image to restore; default: the newest successful
        /// image release whose image differs from the current one.
        #[arg(long, value_name = "ID")]
        record: Option<String>,
        /// Accept a record without an image digest: release its image by tag, which may point
        /// at other bytes than the ones that ran.
        #[arg(long)]
        allow_tag: bool,
        #[command(flatten)]
        app: AppArgs,
        #[command(flatten)]
        common: Common,
    },
    /// List recorded releases (all, or one Deployment's), newest first.
    History {
        /// Only this Deployment's releases.
        deployment: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

/// Which application the release is for: the plan checks that the Deployment's Pod template
/// labels satisfy its selector (seed 03), so one application's change cannot land in another's
/// Deployment.
#[derive(Debug, Args)]
struct AppArgs {
    /// The application, looked up in the applications file (its namespace and selector).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["app_selector", "no_app_check"])]
    app: Option<String>,
    /// The applications file for --app (default: ~/.config/bloodraven/apps.yaml).
    #[arg(long, value_name = "FILE", requires = "app")]
    apps: Option<PathBuf>,
    /// The application's label selector, e.g. 'app=web,tier=frontend' or 'app in (web, web-canary)'.
    #[arg(long, value_name = "SELECTOR", conflicts_with = "no_app_check")]
    app_selector: Option<String>,
    /// Release without checking the Deployment belongs to the application (recorded).
    #[arg(long)]
    no_app_check: bool,
}

/// A release's arguments break a rule (before anything is read from the cluster).
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("--app-selector: {0}")]
    AppSelector(#[from] bloodraven_core::release::selector::SelectorError),
    #[error("--app: no applications file: HOME is not set; pass --apps FILE")]
    NoAppsFile,
    #[error(transparent)]
    Apps(#[from] apps::AppsError),
    #[error(
        "name the application this release is for, so the plan can check the Deployment is \
         its own: --app NAME (looked up in ~/.config/bloodraven/apps.yaml, or --apps FILE) or \
         --app-selector 'app=web'; --no-app-check releases without the check (the record says so)"
    )]
    NoApp,
    #[error(
        "CONTAINER=IMAGE: must be a container name, '=' and an image \
         (e.g. app=registry.example/web:2.0); got {0:?}"
    )]
    NotAnAssignment(String),
    #[error("CONTAINER: {0}")]
    Container(&'static str),
    #[error("IMAGE: must not be empty")]
    EmptyImage,
    #[error("REPLICAS: must be a whole number between 0 and 1000; got {0:?}")]
    ReplicasNotANumber(String),
    #[error(transparent)]
    Replicas(#[from] bloodraven_core::release::PlanError),
    #[error(
        "not applied: stdin is not a terminal, so the plan cannot be confirmed; pass --yes \
         to apply without asking"
    )]
    NotATerminal,
    #[error("not applied: failed to read the answer: {0}")]
    ReadAnswer(std::io::Error),
}

/// The application check and, from the applications file, the application's namespace.
fn resolve_app(a: &AppArgs) -> Result<(AppCheck, Option<String>), ArgError> {
    if a.no_app_check {
        return Ok((AppCheck::Skipped, None));
    }
    if let Some(text) = &a.app_selector {
        let selector = Selector::parse(text)?;
        return Ok((
            AppCheck::Selector {
                name: None,
                selector,
            },
            None,
        ));
    }
    if let Some(name) = &a.app {
        let Some(path) = a.apps.clone().or_else(apps::default_path) else {
            return Err(ArgError::NoAppsFile);
        };
        let r = apps::resolve(name, &path)?;
        return Ok((r.check, r.namespace));
    }
    Err(ArgError::NoApp)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct Common {
    /// Namespace of the Deployment (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long)]
    context: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Directory of the append-only release records.
    #[arg(long, value_name = "DIR", default_value = ".bloodraven/releases")]
    records_dir: PathBuf,
    /// Apply without asking (for CI); without it the plan is shown and confirmation asked.
    #[arg(long)]
    yes: bool,
    /// `json` prints the plan and the outcome as one JSON object on stdout.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

/// A release to plan: the action and its target.
enum Request {
    Action(ReleaseAction),
    /// The record (default: the newest fitting one) and `--allow-tag`.
    Rollback(Option<String>, bool),
}

/// Runs a `release` subcommand and returns the process's exit code.
pub fn run(args: ReleaseArgs) -> i32 {
    let (deployment, request, app, mut common) = match args.command {
        ReleaseCommand::History { deployment, common } => {
            return history_cmd(deployment.as_deref(), &common);
        }
        ReleaseCommand::Image {
            deployment,
            assignment,
            app,
            common,
        } => match parse_assignment(&assignment) {
            Ok(action) => (deployment, Request::Action(action), app, common),
            Err(e) => return usage(&e.to_string()),
        },
        ReleaseCommand::Scale {
            deployment,
            replicas,
            app,
            common,
        } => match parse_replicas(&replicas) {
            Ok(replicas) => (
                deployment,
                Request::Action(ReleaseAction::Scale { replicas }),
                app,
                common,
            ),
            Err(e) => return usage(&e.to_string()),
        },
        ReleaseCommand::Restart {
            deployment,
            app,
            common,
        } => (
            deployment,
            Request::Action(ReleaseAction::Restart),
            app,
            common,
        ),
        ReleaseCommand::Rollback {
            deployment,
            record,
            allow_tag,
            app,
            common,
        } => (
            deployment,
            Request::Rollback(record, allow_tag),
            app,
            common,
        ),
    };
    if let Err(rule) = check_dns1123_subdomain(&deployment) {
        return usage(&format!("DEPLOYMENT: {rule}"));
    }
    if let Some(ns) = &common.namespace
        && let Err(rule) = check_dns1123_label(ns)
    {
        return usage(&format!("--namespace: {rule}"));
    }
    if let Request::Rollback(Some(id), _) = &request
        && id.is_empty()
    {
        return usage("--record: must not be empty");
    }
    let app = match resolve_app(&app) {
        Ok((check, namespace)) => {
            match (&common.namespace, namespace) {
                (Some(given), Some(theirs)) if *given != theirs => {
                    return usage(&format!(
                        "--namespace {given}: the application lives in namespace {theirs} (applications file); drop --namespace or name the right one"
                    ));
                }
                (None, Some(theirs)) => common.namespace = Some(theirs),
                _ => {}
            }
            check
        }
        Err(e) => return usage(&e.to_string()),
    };
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        release(&deployment, request, &app, &common),
    )
}

fn usage(message: &str) -> i32 {
    eprintln!("error: {message}");
    exit::USAGE
}

fn error(output: Output, e: &anyhow::Error) -> i32 {
    report_error(output, "error", &format!("{e:#}"));
    exit::ERROR
}

fn report_error(output: Output, stage: &str, message: &str) {
    if output == Output::Json {
        println!("{}", json!({"stage": stage, "error": message}));
    }
    eprintln!("error: {message}");
}

/// Parses `CONTAINER=IMAGE`.
fn parse_assignment(s: &str) -> Result<ReleaseAction, ArgError> {
    let Some((container, image)) = s.split_once('=') else {
        return Err(ArgError::NotAnAssignment(s.to_owned()));
    };
    check_dns1123_label(container).map_err(ArgError::Container)?;
    if image.is_empty() {
        return Err(ArgError::EmptyImage);
    }
    Ok(ReleaseAction::Image {
        container: container.to_owned(),
        image: image.to_owned(),
    })
}

/// Parses `REPLICAS` and applies the 0–1000 rule before anything is read from the cluster.
fn parse_replicas(s: &str) -> Result<i64, ArgError> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| ArgError::ReplicasNotANumber(s.to_owned()))?;
    check_replicas(n)?;
    Ok(n)
}

async fn release(deployment: &str, request: Request, app: &AppCheck, common: &Common) -> i32 {
    let options = ClusterOptions {
        kubeconfig: common.kubeconfig.clone(),
        context: common.context.clone(),
    };
    let cluster = match cluster::connect(&options)
        .await
        .context("failed to connect to the cluster")
    {
        Ok(c) => c,
        Err(e) => return error(common.output, &e),
    };
    let namespace = common
        .namespace
        .clone()
        .unwrap_or_else(|| cluster.default_namespace.clone());
    let releaser = Releaser::new(
        cluster.client,
        cluster.endpoint,
        Arc::new(bloodraven_runtime::clock::SystemClock),
        common.records_dir.clone(),
        Timeouts::default(),
    );

    let planned = match &request {
        Request::Action(action) => releaser.plan(&namespace, deployment, action, app).await,
        Request::Rollback(record, allow_tag) => {
            releaser
                .plan_rollback(&namespace, deployment, record.as_deref(), app, *allow_tag)
                .await
        }
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => {
            let code = match e {
                PlanningError::ReadDeployment { .. } | PlanningError::Records(_) => exit::ERROR,
                _ => exit::NO_PLAN,
            };
            report_error(common.output, "plan", &format!("no plan: {e}"));
            return code;
        }
    };
    if common.output == Output::Text {
        print_plan(&plan);
    }

    if !common.yes {
        match confirm() {
            Ok(true) => {}
            Ok(false) => {
                releaser.discard(&plan.id);
                report_plan_only(common.output, &plan, "not applied: declined");
                return exit::NOT_CONFIRMED;
            }
            Err(why) => {
                releaser.discard(&plan.id);
                report_plan_only(common.output, &plan, &why.to_string());
                return exit::NOT_CONFIRMED;
            }
        }
    }

    let text = common.output == Output::Text;
    let mut show = |line: &RecordLine| {
        if text {
            eprintln!("  {} {}", line.ts, line.step);
        }
    };
    match releaser.apply(&plan.id, &mut show).await {
        Ok(report) => finish(common.output, &report),
        Err(e) => {
            let code = match &e {
                ApplyError::WriteRecord { .. } | ApplyError::OpenRecord(_) => exit::RECORD_FAILED,
                ApplyError::Plan(_) | ApplyError::ClusterMismatch { .. } => exit::NOT_APPLIED,
            };
            if common.output == Output::Json {
                println!(
                    "{}",
                    json!({"plan": plan, "stage": "apply", "error": e.to_string()})
                );
            }
            eprintln!("error: {e}");
            code
        }
    }
}

/// Asks on the terminal. Refuses when stdin is not a terminal.
fn confirm() -> Result<bool, ArgError> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(ArgError::NotATerminal);
    }
    eprint!("Apply this plan? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(ArgError::ReadAnswer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

fn report_plan_only(output: Output, plan: &Plan, message: &str) {
    if output == Output::Json {
        println!(
            "{}",
            json!({"plan": plan, "stage": "confirm", "error": message})
        );
    }
    eprintln!("{message}");
}

fn print_plan(plan: &Plan) {
    let kind = if plan.rollback_of.is_some() {
        "rollback"
    } else {
        plan.change.kind()
    };
    println!("Plan {} ({kind})", plan.id);
    println!("  cluster:      {}", plan.cluster);
    println!("  namespace:    {}", plan.namespace);
    println!(
        "  deployment:   {} (uid {}, resourceVersion {})",
        plan.deployment, plan.uid, plan.resource_version
    );
    match &plan.change {
        Change::Image {
            container,
            current_image,
            target_image,
        } => {
            println!("  container:    {container}");
            println!("  image:        {current_image} → {target_image}");
        }
        Change::Scale {
            current_replicas,
            target_replicas,
        } => println!("  replicas:     {current_replicas} → {target_replicas}"),
        Change::Restart => println!("  restart:      every Pod is replaced"),
    }
    if let Some(of) = &plan.rollback_of {
        println!("  rollback of:  release record {of}");
    }
    match plan.rollback_by.as_deref() {
        Some("digest") => println!("  image by:     digest (the bytes that ran, byte-exact)"),
        Some(_) => println!(
            "  image by:     tag (--allow-tag: the record has no digest; the tag may point at other bytes now)"
        ),
        None => {}
    }
    match &plan.app {
        Some(a) if a.check_skipped => {
            println!("  application:  not checked (--no-app-check; recorded)");
        }
        Some(a) => println!(
            "  application:  {}selector {} matches the Pod template labels",
            a.name
                .as_ref()
                .map(|n| format!("{n}, "))
                .unwrap_or_default(),
            a.selector.as_deref().unwrap_or("")
        ),
        None => {}
    }
    println!(
        "  progressDeadlineSeconds: {}",
        plan.progress_deadline_seconds
    );
    println!("  dry-run:      accepted by the API server");
    println!(
        "  expires:      {} (single use, this process only)",
        plan.expires_at
    );
}

fn exit_code(outcome: &Outcome) -> i32 {
    match outcome {
        Outcome::Ready { .. } => exit::READY,
        Outcome::Failed { .. } => exit::FAILED,
        Outcome::StillProgressing { .. } => exit::STILL_PROGRESSING,
        Outcome::Superseded { .. } | Outcome::Paused => exit::SUPERSEDED,
        Outcome::Unconfirmed { .. } => exit::UNCONFIRMED,
        Outcome::LeaseHeld { .. } => exit::LEASE_HELD,
        Outcome::StalePlan { .. } => exit::STALE_PLAN,
        Outcome::Rejected { .. } | Outcome::Aborted { .. } => exit::NOT_APPLIED,
    }
}

fn finish(output: Output, report: &ApplyReport) -> i32 {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string(report)
                .unwrap_or_else(|e| json!({"error": e.to_string()}).to_string())
        ),
        Output::Text => {
            println!("{}", report.outcome.describe());
            println!("record: {}", report.record.display());
            if let Some(problem) = &report.lease_problem {
                println!("lease: not released: {problem}");
            }
        }
    }
    exit_code(&report.outcome)
}

fn history_cmd(deployment: Option<&str>, common: &Common) -> i32 {
    let h = match history::summaries(&common.records_dir) {
        Ok(h) => h,
        Err(e) => return error(common.output, &anyhow::Error::new(e)),
    };
    let selected: Vec<&ReleaseSummary> = h
        .releases
        .iter()
        .filter(|s| deployment.is_none_or(|d| s.deployment == d))
        .filter(|s| common.namespace.as_deref().is_none_or(|n| s.namespace == n))
        .collect();
    for (path, e) in &h.unreadable {
        eprintln!("warning: skipped {}: {e}", path.display());
    }
    match common.output {
        Output::Json => println!("{}", json!({"releases": selected})),
        Output::Text => {
            if selected.is_empty() {
                println!("no releases recorded in {}", common.records_dir.display());
            }
            for s in selected {
                let what = match (&s.image, s.replicas) {
                    (Some(image), _) => {
                        format!("{}={}", s.container.as_deref().unwrap_or("?"), image)
                    }
                    (None, Some(r)) => format!("replicas={r}"),
                    (None, None) => String::new(),
                };
                println!(
                    "{}  {}  {}/{}  {:<8}  {:<17}  {}",
                    s.started,
                    s.id,
                    s.namespace,
                    s.deployment,
                    s.action,
                    s.outcome.as_deref().unwrap_or("(unfinished)"),
                    what
                );
            }
        }
    }
    exit::READY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_name_the_argument_and_the_rule() {
        assert_eq!(
            parse_assignment("app=web:2").unwrap(),
            ReleaseAction::Image {
                container: "app".into(),
                image: "web:2".into()
            }
        );
        // Only the first '=' splits: images may not contain one, but the server decides.
        assert!(parse_assignment("app=web:2=x").is_ok());
        assert!(
            parse_assignment("web:2")
                .unwrap_err()
                .to_string()
                .starts_with("CONTAINER=IMAGE:")
        );
        assert!(
            parse_assignment("App=web:2")
                .unwrap_err()
                .to_string()
                .starts_with("CONTAINER:")
        );
        assert_eq!(
            parse_assignment("app=").unwrap_err().to_string(),
            "IMAGE: must not be empty"
        );
    }

    #[test]
    fn replicas_are_checked_before_the_cluster_is_asked() {
        assert_eq!(parse_replicas("0").unwrap(), 0);
        assert_eq!(parse_replicas("1000").unwrap(), 1000);
        assert!(
            parse_replicas("1001")
                .unwrap_err()
                .to_string()
                .starts_with("REPLICAS: must be between 0 and 1000")
        );
        assert!(
            parse_replicas("-1")
                .unwrap_err()
                .to_string()
                .starts_with("REPLICAS:")
        );
        assert!(
            parse_replicas("three")
                .unwrap_err()
                .to_string()
                .starts_with("REPLICAS: must be a whole number")
        );
    }

    #[test]
    fn every_outcome_has_its_own_exit_code() {
        let outcomes = [
            Outcome::Ready { generation: 1 },
            Outcome::Failed {
                message: String::new(),
            },
            Outcome::StillProgressing {
                progress: String::new(),
            },
            Outcome::Superseded {
                detail: String::new(),
            },
            Outcome::Unconfirmed {
                detail: String::new(),
            },
            Outcome::LeaseHeld {
                lease: String::new(),
                holder: String::new(),
                until: None,
            },
            Outcome::StalePlan {
                detail: String::new(),
            },
            Outcome::Rejected {
                detail: String::new(),
            },
        ];
        let mut codes: Vec<i32> = outcomes.iter().map(exit_code).collect();
        codes.extend([
            exit::ERROR,
            exit::USAGE,
            exit::NO_PLAN,
            exit::NOT_CONFIRMED,
            exit::RECORD_FAILED,
        ]);
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        assert_eq!(exit_code(&Outcome::Paused), exit::SUPERSEDED);
        assert_eq!(
            exit_code(&Outcome::Aborted {
                detail: String::new()
            }),
            exit::NOT_APPLIED
        );
    }
}
