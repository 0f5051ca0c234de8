//! `bloodraven move --to kubernetes|etcd` (`move-to-kubernetes` is `move --to kubernetes`):
//! moves the groups of an embedded data directory onto another platform
//! ([`bloodraven_operator::relocate`]): the groups, their status (topology generation
//! included), databases, deploy leases and tombstones. The embedded operator must be stopped;
//! its leader lock is held for the whole move, and the directory is marked moved so no
//! embedded operator leads on it again. On etcd the move also holds the etcd leader key while
//! it writes, so no etcd operator runs the groups before they are whole.

use std::path::PathBuf;

use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_core::time::Clock as _;
use bloodraven_kube::cluster::{ClusterOptions, connect};
use bloodraven_operator::config::{self, StoreBackend};
use bloodraven_operator::platform::Platform as _;
use bloodraven_operator::platform::embedded::EmbeddedPlatform;
use bloodraven_operator::platform::etcd::{ClaimError, MoveTarget};
use bloodraven_operator::platform::kubernetes::store::{KubeStore, Scope};
use bloodraven_operator::relocate::{self, Destination, MoveOptions, MovePlan, Moved, Step};
use bloodraven_operator::{leader, operator::STORE_FILE};
use bloodraven_runtime::clock::SystemClock;
use bloodraven_store::Store;
use clap::Args;

/// Exit codes of `bloodraven move`.
pub mod exit {
    pub use crate::cli::exit::{ERROR, OK, USAGE};
    /// Refused before writing anything: the operator runs (on either side), a planned
    /// failover is in flight, objects already exist on the target, or (etcd) the target's
    /// configuration lacks a moved group.
    pub const REFUSED: i32 = 3;
    /// Stopped part-way: some objects were written (listed on standard error).
    pub const PARTIAL: i32 = 4;
}

/// Where the groups go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum To {
    Etcd,
    Kubernetes,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The platform to move to: etcd or kubernetes.
    #[arg(long, value_enum)]
    to: Option<To>,
    /// The embedded operator's configuration file (for its data directory).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// With --to etcd: the configuration the etcd operators run with (`store.backend: etcd`).
    /// It must configure every group and database that moves: the operator that leads there
    /// writes its file's groups into etcd and deletes the others.
    #[arg(long)]
    target_config: Option<PathBuf>,
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

/// A flag that does not fit the destination.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("--to: move-to-kubernetes moves to Kubernetes; use bloodraven move --to etcd")]
    ImpliedKubernetes,
    #[error("--to: required: etcd or kubernetes")]
    NoDestination,
    #[error("{0}: only with --to kubernetes")]
    KubernetesOnly(&'static str),
    #[error("--target-config: required with --to etcd (the etcd operators' configuration)")]
    NoTargetConfig,
    #[error("--target-config: only with --to etcd")]
    EtcdOnly,
    #[error("{flag}: {rule}")]
    Name {
        flag: &'static str,
        rule: &'static str,
    },
}

/// Checks the flags for the destination (`implied`: the command's own, for
/// `move-to-kubernetes`).
fn check_args(args: &MoveArgs, implied: Option<To>) -> Result<(To, MoveOptions), ArgError> {
    let to = match (args.to, implied) {
        (Some(t), None) | (None, Some(t)) => t,
        (Some(t), Some(i)) if t == i => t,
        (Some(_), Some(_)) => return Err(ArgError::ImpliedKubernetes),
        (None, None) => return Err(ArgError::NoDestination),
    };
    if to == To::Etcd {
        for (flag, given) in [
            ("--kubeconfig", args.kubeconfig.is_some()),
            ("--context", args.context.is_some()),
            ("--namespace", args.namespace.is_some()),
            ("--credentials-secret", args.credentials_secret.is_some()),
            (
                "--replication-credentials-secret",
                args.replication_credentials_secret.is_some(),
            ),
        ] {
            if given {
                return Err(ArgError::KubernetesOnly(flag));
            }
        }
        if args.target_config.is_none() {
            return Err(ArgError::NoTargetConfig);
        }
        return Ok((
            to,
            MoveOptions {
                destination: Destination::Etcd,
                ..MoveOptions::default()
            },
        ));
    }
    if args.target_config.is_some() {
        return Err(ArgError::EtcdOnly);
    }
    if let Some(ns) = &args.namespace {
        check_dns1123_label(ns).map_err(|rule| ArgError::Name {
            flag: "--namespace",
            rule,
        })?;
    }
    for (flag, v) in [
        ("--credentials-secret", &args.credentials_secret),
        (
            "--replication-credentials-secret",
            &args.replication_credentials_secret,
        ),
    ] {
        if let Some(name) = v {
            check_dns1123_subdomain(name).map_err(|rule| ArgError::Name { flag, rule })?;
        }
    }
    Ok((
        to,
        MoveOptions {
            destination: Destination::Kubernetes,
            namespace: args.namespace.clone(),
            credentials_secret: args.credentials_secret.clone(),
            replication_credentials_secret: args.replication_credentials_secret.clone(),
        },
    ))
}

/// `bloodraven move` (`implied` is `Some(To::Kubernetes)` for `move-to-kubernetes`).
pub fn run(args: &MoveArgs, implied: Option<To>) -> i32 {
    let (to, opts) = match check_args(args, implied) {
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
    let target = match &args.target_config {
        Some(path) => {
            let t = match crate::cli::load_config(path) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if !matches!(t.settings.store, StoreBackend::Etcd(_)) {
                eprintln!(
                    "error: --target-config: {} runs on store.backend: {}, not etcd; give the etcd operators' configuration",
                    path.display(),
                    t.settings.store.as_str()
                );
                return exit::USAGE;
            }
            Some(t)
        }
        None => None,
    };
    if !matches!(cfg.settings.store, StoreBackend::Embedded) {
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
    if let (To::Etcd, Some(target)) = (to, &target) {
        return crate::cli::run(
            crate::cli::Flavor::MultiThread,
            move_to_etcd(&cfg, target, &opts, args.dry_run, &data_dir),
        );
    }
    let cluster = ClusterOptions {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
    };
    crate::cli::run(
        crate::cli::Flavor::CurrentThread,
        move_to_kubernetes(&cfg, &cluster, &opts, args.dry_run, &data_dir),
    )
}

/// Reads the embedded store and plans the move; `Err` is the exit code (printed).
async fn plan(cfg: &config::LoadedConfig, opts: &MoveOptions) -> Result<MovePlan, i32> {
    let source = match EmbeddedPlatform::open(cfg) {
        Ok(p) => p.store(),
        Err(e) => {
            eprintln!("error: {e}");
            return Err(exit::ERROR);
        }
    };
    match relocate::plan(&*source, opts).await {
        Ok(p) => Ok(p),
        Err(e @ relocate::MoveError::NotMovable { .. }) => {
            eprintln!("error: {e}");
            Err(exit::REFUSED)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(exit::ERROR)
        }
    }
}

async fn move_to_kubernetes(
    cfg: &config::LoadedConfig,
    cluster: &ClusterOptions,
    opts: &MoveOptions,
    dry_run: bool,
    data_dir: &std::path::Path,
) -> i32 {
    let plan = match plan(cfg, opts).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let cluster = match connect(cluster).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let target = KubeStore::new(cluster.client.clone(), Scope::AllNamespaces);
    let code = write_plan(
        &plan,
        &target,
        Destination::Kubernetes,
        &cluster.endpoint,
        dry_run,
        data_dir,
    )
    .await;
    if code == exit::OK && !dry_run {
        eprintln!("Start the operator in Kubernetes mode with the same topology signing key.");
    }
    code
}

/// What in `plan` the etcd operators' configuration does not name (they would delete it).
fn unconfigured(plan: &MovePlan, target: &config::LoadedConfig) -> Vec<String> {
    let mut missing = Vec::new();
    for g in &plan.groups {
        let m = &g.object.metadata;
        if !target
            .groups
            .iter()
            .any(|t| t.metadata.name == m.name && t.metadata.namespace == m.namespace)
        {
            missing.push(g.object.key().to_string());
        }
    }
    for d in &plan.databases {
        let m = &d.metadata;
        if !target
            .databases
            .iter()
            .any(|t| t.metadata.name == m.name && t.metadata.namespace == m.namespace)
        {
            missing.push(d.key().to_string());
        }
    }
    missing
}

async fn move_to_etcd(
    cfg: &config::LoadedConfig,
    target: &config::LoadedConfig,
    opts: &MoveOptions,
    dry_run: bool,
    data_dir: &std::path::Path,
) -> i32 {
    let StoreBackend::Etcd(settings) = &target.settings.store else {
        eprintln!("error: --target-config: not an etcd configuration");
        return exit::USAGE;
    };
    let plan = match plan(cfg, opts).await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let missing = unconfigured(&plan, target);
    if !missing.is_empty() {
        eprintln!(
            "error: --target-config does not configure {}: the etcd operator that leads would delete it with its leases at the start of its term; add it to that file first",
            missing.join(", ")
        );
        return exit::REFUSED;
    }
    let etcd = match MoveTarget::claim(settings).await {
        Ok(t) => t,
        Err(e @ ClaimError::Led { .. }) => {
            eprintln!("error: {e}");
            return exit::REFUSED;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    let server = etcd.describe();
    let code = write_plan(
        &plan,
        etcd.store(),
        Destination::Etcd,
        &server,
        dry_run,
        data_dir,
    )
    .await;
    etcd.release().await;
    if code == exit::OK && !dry_run {
        eprintln!(
            "Start the etcd operators with the --target-config file (the same topology and token signing keys): they carry on at the moved generation."
        );
    }
    code
}

/// Checks the target, writes the plan into it and marks the directory moved.
async fn write_plan(
    plan: &MovePlan,
    target: &dyn Store,
    destination: Destination,
    server: &str,
    dry_run: bool,
    data_dir: &std::path::Path,
) -> i32 {
    print_plan(plan, server, dry_run);
    match relocate::check_target(plan, target).await {
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
        eprintln!("dry run: nothing written; the target holds none of these objects yet");
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
    if let Err(e) = relocate::execute(plan, target, &mut report).await {
        eprintln!("error: {e}");
        eprintln!(
            "the move stopped part-way; the embedded directory is unchanged and not marked: delete what was written ({}) and run the move again",
            match destination {
                Destination::Kubernetes => "kubectl delete",
                Destination::Etcd => "etcdctl del",
            }
        );
        return exit::PARTIAL;
    }
    let record = Moved {
        platform: destination.name().into(),
        server: server.to_string(),
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
        "moved {} group(s) to {} {server}; {} is marked moved and no embedded operator will lead on it.",
        plan.groups.len(),
        destination.name(),
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
            let e = check_args(&parse(&flags), Some(To::Kubernetes))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(field), "{e}");
        }
        let (to, ok) = check_args(
            &parse(&["--namespace", "db", "--credentials-secret", "mysql"]),
            Some(To::Kubernetes),
        )
        .unwrap();
        assert_eq!(to, To::Kubernetes);
        assert_eq!(ok.namespace.as_deref(), Some("db"));
    }

    #[test]
    fn the_destination_decides_which_flags_belong() {
        let e =
            |flags: &[&str], implied| check_args(&parse(flags), implied).unwrap_err().to_string();
        assert!(e(&[], None).starts_with("--to: required"));
        assert!(e(&["--to", "etcd"], None).starts_with("--target-config: required"));
        assert!(
            e(
                &[
                    "--to",
                    "etcd",
                    "--target-config",
                    "t.yaml",
                    "--namespace",
                    "db"
                ],
                None
            )
            .starts_with("--namespace: only with --to kubernetes")
        );
        assert!(e(&["--to", "etcd", "--kubeconfig", "k"], None).starts_with("--kubeconfig: only"));
        assert!(
            e(&["--to", "kubernetes", "--target-config", "t.yaml"], None)
                .starts_with("--target-config: only with --to etcd")
        );
        assert!(e(&["--to", "etcd"], Some(To::Kubernetes)).starts_with("--to: move-to-kubernetes"));
        let (to, opts) =
            check_args(&parse(&["--to", "etcd", "--target-config", "t.yaml"]), None).unwrap();
        assert_eq!(to, To::Etcd);
        assert_eq!(opts.destination, Destination::Etcd);
        let (to, _) = check_args(&parse(&[]), Some(To::Kubernetes)).unwrap();
        assert_eq!(to, To::Kubernetes);
    }
}
