//! `bloodraven apply -f FILE [--dry-run]`: creates and changes groups and databases in the
//! store where the store is the truth (etcd), as a difference against it. Prints one line per
//! document (created, changed with the fields, unchanged); `--dry-run` writes nothing.
//! Nothing is deleted. Refused, changing nothing, on the embedded back-end (the file is the
//! configuration there: restart the operator with it) and on Kubernetes (`kubectl apply`).

use std::path::PathBuf;

use bloodraven_operator::apply::{self, Change};
use bloodraven_operator::config::StoreBackend;
use bloodraven_runtime::clock::Clock as _;
use clap::Args;

use crate::cli::exit;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The file with `MysqlFailoverGroup` and `MysqlDatabase` documents (an `OperatorConfig`
    /// document in it is skipped, so an operator's own file can be applied).
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    /// Print what would change; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// The operator's configuration file (for the store it names).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
}

pub fn run(args: &ApplyArgs) -> i32 {
    let cfg = match crate::cli::load_config(&args.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match &cfg.settings.store {
        StoreBackend::Etcd(_) => {}
        StoreBackend::Embedded => {
            eprintln!(
                "error: --config: the embedded back-end takes its groups from the operator's own configuration file; edit {} and restart the operator (nothing was applied)",
                args.config.display()
            );
            return exit::USAGE;
        }
        StoreBackend::Kubernetes(_) => {
            eprintln!(
                "error: --config: on Kubernetes, groups and databases are MysqlFailoverGroup and MysqlDatabase resources: `kubectl apply -f FILE` (nothing was applied)"
            );
            return exit::USAGE;
        }
    }
    let docs = match bloodraven_operator::config::load_documents(&args.file) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: -f: {e}");
            return exit::USAGE;
        }
    };
    if docs.groups.is_empty() && docs.databases.is_empty() {
        eprintln!(
            "error: -f: {} has no MysqlFailoverGroup or MysqlDatabase document; nothing to apply",
            args.file.display()
        );
        return exit::USAGE;
    }
    crate::cli::run(crate::cli::Flavor::CurrentThread, async move {
        let store = match crate::cli::platform_store(&cfg).await {
            Ok(s) => s,
            Err(code) => return code,
        };
        let now = bloodraven_runtime::clock::SystemClock.now();
        let planned = match apply::plan(&*store, &docs, now).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        };
        for p in &planned {
            println!("{p}{}", if args.dry_run { " (dry run)" } else { "" });
        }
        if args.dry_run {
            return exit::OK;
        }
        match apply::apply(&*store, &planned).await {
            Ok(n) => {
                let unchanged = planned
                    .iter()
                    .filter(|p| p.change == Change::Unchanged)
                    .count();
                eprintln!("applied: {n} written, {unchanged} unchanged");
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::ERROR
            }
        }
    })
}
