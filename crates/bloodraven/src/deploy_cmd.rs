//! `bloodraven deploy`: deploy-lease tools for humans.
//!
//! `revoke-all` annotates the stored group with `bloodraven.shipstream.io/revoke-deployment-leases`;
//! the operator revokes every lease (`OperatorRevoked`) and removes the annotation. The command
//! waits (bounded) for that and says what happened.

use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::duration::parse_duration;
use bloodraven_core::resources::KIND_GROUP;
use bloodraven_operator::config;
use bloodraven_operator::operator::STORE_FILE;
use bloodraven_runtime::clock::{self, Clock as _};
use bloodraven_store::{ObjectKey, SqliteStore, Store, StoreExt};
use clap::{Args, Subcommand};

use crate::operator_cmd::exit;

#[derive(Debug, Args)]
pub struct DeployArgs {
    #[command(subcommand)]
    command: DeployCommand,
}

#[derive(Debug, Subcommand)]
enum DeployCommand {
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

pub fn run(args: DeployArgs) -> i32 {
    match args.command {
        DeployCommand::RevokeAll {
            group,
            config: cfg_path,
            wait,
        } => {
            let wait = match parse_duration(&wait) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: --wait: {e}");
                    return exit::USAGE;
                }
            };
            let cfg = match config::load(&cfg_path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit::USAGE;
                }
            };
            let Some(g) = cfg.groups.iter().find(|g| g.metadata.name == group) else {
                eprintln!(
                    "error: --group: no group {group:?} in {}",
                    cfg_path.display()
                );
                return exit::USAGE;
            };
            let namespace = g.metadata.namespace.clone();
            let path = cfg.settings.data_dir.join(STORE_FILE);
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                eprintln!("error: cannot start the async runtime");
                return exit::ERROR;
            };
            rt.block_on(revoke_all(&path, &namespace, &group, wait))
        }
    }
}

async fn revoke_all(path: &std::path::Path, namespace: &str, group: &str, wait: Duration) -> i32 {
    let store = match SqliteStore::open(path, bloodraven_store::Durability::Full) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let key = ObjectKey::new(KIND_GROUP, namespace, group);
    for _ in 0..5 {
        let obj = match store.get(&key).await {
            Ok(Some(o)) => o,
            Ok(None) => {
                eprintln!(
                    "error: group {namespace}/{group} is not in the store yet (has the operator run?)"
                );
                return exit::ERROR;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        };
        let mut next = obj;
        next.metadata.annotations.insert(
            REVOKE_DEPLOYMENT_LEASES.to_string(),
            clock::SystemClock.now().to_rfc3339(),
        );
        match store.replace(next).await {
            Ok(_) => break,
            Err(bloodraven_store::StoreError::Conflict { .. }) => {}
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        }
    }
    eprintln!("requested revocation of every deploy lease of {group}; waiting for the operator…");
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(o)) = store.get(&key).await
            && !o
                .metadata
                .annotations
                .contains_key(REVOKE_DEPLOYMENT_LEASES)
        {
            println!("revoked: every deploy lease of {group} (reason OperatorRevoked)");
            return exit::OK;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "the operator has not acted within {} s; the request stays on the group until the leader does",
        wait.as_secs()
    );
    exit::ERROR
}
