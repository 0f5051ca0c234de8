//! `bloodraven deploy`: the deploy lease API for pipelines and humans.
//!
//! `migrate` runs a migration under the two leases (see `migrate_cmd`); `status` shows the
//! group's observation; `lease grant|renew|release` drive one lease by hand for scripts that do
//! their own thing; `revoke-all` annotates the stored group with `bloodraven.shipstream.io/revoke-deployment-leases`;
//! the operator revokes every lease (`OperatorRevoked`) and removes the annotation. The command
//! waits (bounded) for that and says what happened.

use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_operator::config;
use bloodraven_runtime::clock::{self, Clock as _};
use clap::{Args, Subcommand};

use crate::cli::{Flavor, block_on};

use crate::operator_cmd::exit;

#[derive(Debug, Args)]
pub struct DeployArgs {
    #[command(subcommand)]
    command: DeployCommand,
}

#[derive(Debug, Subcommand)]
enum DeployCommand {
    /// Run a migration command under the migration mutex and a failover-hold.
    Migrate(Box<crate::migrate_cmd::MigrateArgs>),
    /// Show the group as the deploy API observes it (stable, reason, lag, leases).
    Status {
        #[command(flatten)]
        api: crate::migrate_cmd::ApiArgs,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take, renew or release one lease by hand (prints JSON).
    Lease {
        #[command(subcommand)]
        action: LeaseAction,
    },
    /// Revoke every deploy lease of a group (reason `OperatorRevoked`).
    RevokeAll {
        /// The group.
        #[arg(long)]
        group: String,
        /// The operator's configuration file (for its data directory).
        #[arg(long, env = "BLOODRAVEN_CONFIG")]
        config: PathBuf,
        /// How long to wait for the operator to act.
        #[arg(long, default_value = "15s")]
        wait: String,
    },
}

/// Which lease a hand-driven call is about.
#[derive(Debug, Args)]
struct LeaseTarget {
    #[command(flatten)]
    api: crate::migrate_cmd::ApiArgs,
    /// migration or failover-hold.
    #[arg(long)]
    kind: String,
    #[arg(long)]
    operation_id: String,
}

#[derive(Debug, Subcommand)]
enum LeaseAction {
    /// POST a lease; prints {kind, operationId, token, expiresAt, topologyGeneration}.
    Grant {
        #[command(flatten)]
        target: LeaseTarget,
        /// The MysqlDatabase resource name.
        #[arg(long)]
        instance: String,
        #[arg(long, default_value_t = 30)]
        ttl: u32,
    },
    /// PUT a renewal; the lease token comes from `BLOODRAVEN_LEASE_TOKEN` or `--lease-token-file`.
    Renew {
        #[command(flatten)]
        target: LeaseTarget,
        #[arg(long, env = "BLOODRAVEN_LEASE_TOKEN_FILE")]
        lease_token_file: Option<PathBuf>,
        #[arg(long)]
        ttl: Option<u32>,
    },
    /// DELETE a lease (idempotent).
    Release {
        #[command(flatten)]
        target: LeaseTarget,
        #[arg(long, env = "BLOODRAVEN_LEASE_TOKEN_FILE")]
        lease_token_file: Option<PathBuf>,
    },
}

/// The lease token could not be read.
#[derive(Debug, thiserror::Error)]
enum TokenError {
    #[error("--lease-token-file {0}: {1}")]
    Read(String, std::io::Error),
    #[error(
        "the lease token: set BLOODRAVEN_LEASE_TOKEN or --lease-token-file (never on the command line)"
    )]
    Missing,
}

fn lease_token(file: Option<&PathBuf>) -> Result<String, TokenError> {
    if let Ok(t) = std::env::var("BLOODRAVEN_LEASE_TOKEN")
        && !t.is_empty()
    {
        return Ok(t);
    }
    match file {
        Some(f) => std::fs::read_to_string(f)
            .map(|t| t.trim().to_string())
            .map_err(|e| TokenError::Read(f.display().to_string(), e)),
        None => Err(TokenError::Missing),
    }
}

fn api_error_code(e: &bloodraven_deploy::lease::ApiError) -> i32 {
    use bloodraven_deploy::lease::ApiError as E;
    match e {
        E::Held { .. } | E::Unstable { .. } | E::Revoked { .. } => {
            crate::migrate_cmd::exit::REFUSED
        }
        E::Invalid { .. } => exit::USAGE,
        _ => exit::ERROR,
    }
}

fn lease_command(action: &LeaseAction) -> i32 {
    use bloodraven_deploy::lease::LeaseApi as _;
    let (LeaseAction::Grant { target, .. }
    | LeaseAction::Renew { target, .. }
    | LeaseAction::Release { target, .. }) = action;
    let LeaseTarget {
        api: api_args,
        kind,
        operation_id,
    } = target;
    let kind: bloodraven_core::lease::LeaseKind = match kind.parse() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: --kind: {e}");
            return exit::USAGE;
        }
    };
    let client = match api_args.client(Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let result: Result<serde_json::Value, bloodraven_deploy::lease::ApiError> = match block_on(
        Flavor::CurrentThread,
        async {
            match action {
            LeaseAction::Grant { instance, ttl, .. } => client
                .grant(kind, operation_id, instance, *ttl)
                .await
                .map(|g| serde_json::json!({"kind": kind.as_str(), "operationId": operation_id, "token": g.token, "expiresAt": g.expires_at, "topologyGeneration": g.topology_generation})),
            LeaseAction::Renew { lease_token_file, ttl, .. } => {
                let token = lease_token(lease_token_file.as_ref()).map_err(|e| bloodraven_deploy::lease::ApiError::Invalid { message: e.to_string() })?;
                client
                    .renew(kind, operation_id, &token, *ttl)
                    .await
                    .map(|r| serde_json::json!({"expiresAt": r.expires_at, "topologyGeneration": r.topology_generation}))
            }
            LeaseAction::Release { lease_token_file, .. } => {
                let token = lease_token(lease_token_file.as_ref()).map_err(|e| bloodraven_deploy::lease::ApiError::Invalid { message: e.to_string() })?;
                client.release(kind, operation_id, &token).await.map(|()| serde_json::json!({"released": true}))
            }
        }
        },
    ) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match result {
        Ok(v) => {
            println!("{v}");
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            api_error_code(&e)
        }
    }
}

fn status_command(api: &crate::migrate_cmd::ApiArgs, json: bool) -> i32 {
    use bloodraven_deploy::lease::LeaseApi as _;
    let client = match api.client(Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let observed = match block_on(Flavor::CurrentThread, client.observe()) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match observed {
        Ok(o) if json => {
            println!(
                "{}",
                serde_json::json!({"group": o.group, "namespace": o.namespace, "activeSite": o.active_site,
                    "topologyGeneration": o.topology_generation, "stable": o.stable, "unstableReason": o.unstable_reason,
                    "replicationLagSeconds": o.health.replication_lag_seconds, "operations": o.operations, "leases": o.leases})
            );
            exit::OK
        }
        Ok(o) => {
            let active = if o.active_site.is_empty() {
                "(none)"
            } else {
                &o.active_site
            };
            let why = if o.unstable_reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", o.unstable_reason)
            };
            println!(
                "group {} (namespace {}): active site {active}, topologyGeneration {}, stable: {}{why}",
                o.group,
                o.namespace,
                o.topology_generation,
                if o.stable { "yes" } else { "no" },
            );
            println!(
                "health: ready {}, replication running {}, lag {}, recovery pending {}",
                o.health.ready,
                o.health.replication_running,
                o.health
                    .replication_lag_seconds
                    .map_or_else(|| "-".to_string(), |l| format!("{l}s")),
                o.health.recovery_pending
            );
            if let Some(pf) = &o.operations.planned_failover {
                let a = &pf.admission;
                println!(
                    "planned failover to {}: {}{}",
                    pf.target,
                    pf.phase,
                    match &a.defer_reason {
                        Some(d) => format!(" ({d}: {})", a.message),
                        None => String::new(),
                    }
                );
            }
            for l in &o.leases {
                println!(
                    "lease {} {} (instance {}) until {} (generation {})",
                    l.kind, l.operation_id, l.instance, l.expires_at, l.topology_generation
                );
            }
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            api_error_code(&e)
        }
    }
}

pub fn run(args: DeployArgs) -> i32 {
    match args.command {
        DeployCommand::Migrate(m) => crate::migrate_cmd::run(&m),
        DeployCommand::Status { api, json } => status_command(&api, json),
        DeployCommand::Lease { action } => lease_command(&action),
        DeployCommand::RevokeAll {
            group,
            config: cfg_path,
            wait,
        } => {
            let (wait, cfg) = match crate::cli::request_flags(&wait, &cfg_path) {
                Ok(f) => f,
                Err(code) => return code,
            };
            crate::cli::run(Flavor::CurrentThread, revoke_all(&cfg, &group, wait))
        }
    }
}

async fn revoke_all(cfg: &config::LoadedConfig, group: &str, wait: Duration) -> i32 {
    let store = match crate::cli::platform_store(cfg).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let key = match crate::cli::stored_group(&*store, group).await {
        Ok((key, _)) => key,
        Err(code) => return code,
    };
    let namespace = key.namespace.clone();
    let requested = clock::SystemClock.now().to_rfc3339();
    match bloodraven_store::set_annotation(&*store, &key, REVOKE_DEPLOYMENT_LEASES, &requested)
        .await
    {
        Ok(_) => {}
        Err(bloodraven_store::StoreError::NotFound { .. }) => {
            eprintln!(
                "error: group {namespace}/{group} is not in the store yet (has the operator run?)"
            );
            return exit::ERROR;
        }
        Err(e @ bloodraven_store::StoreError::Conflict { .. }) => {
            eprintln!(
                "error: nothing was requested: the group kept changing under {} attempts to write the revoke request ({e}); try again",
                bloodraven_store::ANNOTATE_ATTEMPTS
            );
            return exit::ERROR;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    }
    eprintln!("requested revocation of every deploy lease of {group}; waiting for the operator…");
    let stays = crate::cli::Unfinished {
        code: exit::ERROR,
        says: "the request stays on the group until the leading operator takes it",
    };
    crate::cli::follow_until(&*store, &key, wait, stays, |obj, _| {
        if obj
            .metadata
            .annotations
            .contains_key(REVOKE_DEPLOYMENT_LEASES)
        {
            return crate::cli::Progress::Nothing;
        }
        crate::cli::Progress::Ended {
            line: String::new(),
            outcome: format!("revoked: every deploy lease of {group} (reason OperatorRevoked)"),
            code: exit::OK,
        }
    })
    .await
}
