//! `bloodraven move-to-kubernetes`: moves the groups of an embedded data directory into a
//! cluster ([`bloodraven_operator::relocate`]): custom resources, their status (topology
//! generation included), databases, deploy leases and tombstones. The embedded operator must be
//! stopped; its leader lock is held for the whole move, and the directory is marked moved so no
//! embedded operator leads on it again.

use std::path::PathBuf;

use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_core::time::Clock as _;
use bloodraven_kube::cluster::{ClusterOptions, connect};
use bloodraven_operator::config;
use bloodraven_operator::platform::Platform as _;
use bloodraven_operator::platform::embedded::EmbeddedPlatform;
use bloodraven_operator::platform::kubernetes::store::{KubeStore, Scope};
use bloodraven_operator::relocate::{self, MoveOptions, MovePlan, Moved, Step};
use bloodraven_operator::{leader, operator::STORE_FILE};
use bloodraven_runtime::clock::SystemClock;
use clap::Args;

/// Exit codes of `bloodraven move-to-kubernetes`.
pub mod exit {
    pub use crate::cli::exit::{ERROR, OK, USAGE};
    /// Refused before writing anything: the operator runs, a planned failover is in flight,
    /// or objects already exist in the cluster.
    pub const REFUSED: i32 = 3;
    /// Stopped part-way: some objects were written (listed on standard error).
    pub const PARTIAL: i32 = 4;
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The embedded operator's configuration file (for its data directory).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// The kubeconfig of the target cluster (default: `KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A context of that kubeconfig (default: its current context).
    #[arg(long)]
    context: Option<String>,
    /// Put every object in this namespace (default: each keeps the namespace it has).
    #[arg(long)]
    namespace: Option<String>,
    /// Read every site's MySQL credentials from this Secret (keys username and password)
    /// instead of the files the embedded configuration names.
    #[arg(long)]
    credentials_secret: Option<String>,
    /// Read the replication account's credentials from this Secret instead of a file.
    #[arg(long)]
    replication_credentials_secret: Option<String>,
    /// Print what would be written, check the cluster, write nothing.
    #[arg(long)]
    dry_run: bool,
}

fn check_args(args: &MoveArgs) -> Result<MoveOptions, String> {
    if let Some(ns) = &args.namespace {
        check_dns1123_label(ns).map_err(|rule| format!("--namespace: {rule}"))?;
    }
    for (flag, v) in [
        ("--credentials-secret", &args.credentials_secret),
        (
            "--replication-credentials-secret",
            &args.replication_credentials_secret,
        ),
    ] {
        if let Some(name) = v {
            check_dns1123_subdomain(name).map_err(|rule| format!("{flag}: {rule}"))?;
        }
    }
    Ok(MoveOptions {
        namespace: args.namespace.clone(),
        credentials_secret: args.credentials_secret.clone(),
        replication_credentials_secret: args.replication_credentials_secret.clone(),
    })
}

pub fn run(args: &MoveArgs) -> i32 {
    let opts = match check_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let cfg = match crate::cli::load_config(&args.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if !cfg.settings.store.groups_in_file() {
        eprintln!(
            "error: --config: {} does not run on the embedded store (store.backend: {}); give the embedded operator's configuration",
            args.config.display(),
            cfg.settings.store.as_str()
        );
        return exit::USAGE;
    }
    let data_dir = cfg.settings.data_dir.clone();
    if let Some(m) = relocate::moved(&data_dir) {
        eprintln!("error: {}", relocate::refusal(&data_dir, &m));
        return exit::REFUSED;
    }
    let store_file = data_dir.join(STORE_FILE);
    if !store_file.exists() {
        eprintln!(
            "error: --config: no embedded store at {} (has the operator run with this configuration?)",
            store_file.display()
        );
        return exit::USAGE;
    }
    // Held until the end: no embedded operator can lead while the groups move.
    let _lock = match leader::try_lock(&data_dir) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            eprintln!(
                "error: an operator is running on {} (it holds {}): stop it first, so the groups are not run from two places",
                data_dir.display(),
                leader::LOCK_FILE
            );
            return exit::REFUSED;
        }
        Err(e) => {
            eprintln!(
                "error: cannot lock {}: {e}",
                data_dir.join(leader::LOCK_FILE).display()
            );
            return exit::ERROR;
        }
    };
    let cluster = ClusterOptions {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
    };
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        move_groups(&cfg, &cluster, &opts, args.dry_run, &data_dir),
    )
}

async fn move_groups(
    cfg: &config::LoadedConfig,
    cluster: &ClusterOptions,
    opts: &MoveOptions,
    dry_run: bool,
    data_dir: &std::path::Path,
) -> i32 {
    let source = match EmbeddedPlatform::open(cfg) {
        Ok(p) => p.store(),
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let plan = match relocate::plan(&*source, opts).await {
        Ok(p) => p,
        Err(e @ relocate::MoveError::NotMovable { .. }) => {
            eprintln!("error: {e}");
            return exit::REFUSED;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let cluster = match connect(cluster).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let target = KubeStore::new(cluster.client.clone(), Scope::AllNamespaces);
    print_plan(&plan, &cluster.endpoint, dry_run);
    match relocate::check_target(&plan, &target).await {
        Ok(()) => {}
        Err(e @ relocate::MoveError::AlreadyThere { .. }) => {
            eprintln!("error: {e}");
            return exit::REFUSED;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    }
    if dry_run {
        eprintln!("dry run: nothing written; the cluster holds none of these objects yet");
        return exit::OK;
    }
    let mut report = |step: &Step| match step {
        Step::Created(key) => eprintln!("created {key}"),
        Step::StatusWritten {
            key,
            active_site,
            topology_generation,
        } => eprintln!(
            "wrote the status of {key}: active site {}, topology generation {topology_generation}",
            if active_site.is_empty() {
                "(none yet)"
            } else {
                active_site
            }
        ),
    };
    if let Err(e) = relocate::execute(&plan, &target, &mut report).await {
        eprintln!("error: {e}");
        eprintln!(
            "the move stopped part-way; the embedded directory is unchanged and not marked: delete what was written (kubectl delete) and run the move again"
        );
        return exit::PARTIAL;
    }
    let record = Moved {
        server: cluster.endpoint.clone(),
        moved_at: SystemClock.now().to_rfc3339(),
        groups: plan
            .groups
            .iter()
            .map(|g| format!("{}/{}", g.object.metadata.namespace, g.object.metadata.name))
            .collect(),
    };
    if let Err(e) = relocate::mark_moved(data_dir, &record) {
        eprintln!(
            "error: the groups were written but {} could not be marked moved ({e}): never start the embedded operator on it again",
            data_dir.display()
        );
        return exit::ERROR;
    }
    eprintln!(
        "moved {} group(s) to {}; {} is marked moved and no embedded operator will lead on it. Start the operator in Kubernetes mode with the same topology signing key.",
        plan.groups.len(),
        cluster.endpoint,
        data_dir.display()
    );
    exit::OK
}

fn print_plan(plan: &MovePlan, endpoint: &str, dry_run: bool) {
    let verb = if dry_run { "would write" } else { "writing" };
    eprintln!("{verb} to {endpoint}:");
    for g in &plan.groups {
        eprintln!(
            "  {} (active site {}, topology generation {}), {} lease object(s)",
            g.object.key(),
            if g.status.active_site.is_empty() {
                "(none yet)"
            } else {
                &g.status.active_site
            },
            g.status.topology_generation,
            g.leases.len()
        );
    }
    for d in &plan.databases {
        eprintln!("  {}", d.key());
    }
    if plan.events_left > 0 {
        eprintln!(
            "  ({} stored event(s) stay behind: history, not state)",
            plan.events_left
        );
    }
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: MoveArgs,
    }

    fn parse(extra: &[&str]) -> MoveArgs {
        let mut argv = vec!["t", "--config", "c.yaml"];
        argv.extend_from_slice(extra);
        T::parse_from(argv).args
    }

    #[test]
    fn names_are_checked_before_anything_is_read() {
        for (flags, field) in [
            (vec!["--namespace", "Prod"], "--namespace"),
            (vec!["--credentials-secret", "a_b"], "--credentials-secret"),
            (
                vec!["--replication-credentials-secret", ""],
                "--replication-credentials-secret",
            ),
        ] {
            let e = check_args(&parse(&flags)).unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        let ok = check_args(&parse(&[
            "--namespace",
            "db",
            "--credentials-secret",
            "mysql",
        ]))
        .unwrap();
        assert_eq!(ok.namespace.as_deref(), Some("db"));
    }
}
