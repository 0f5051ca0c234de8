//! The `bloodraven` command: one binary, one subcommand per component.

use clap::{Parser, Subcommand};

mod alerts_cmd;
mod apply_cmd;
mod backup_cmd;
mod cli;
mod crds_cmd;
mod deploy_cmd;
mod failover_cmd;
mod manifests_cmd;
mod migrate_cmd;
mod move_cmd;
mod operator_cmd;
mod playground_cmd;
mod release_cmd;
mod restore_cmd;
mod restore_point;
mod sidecar_cmd;
mod site_cmd;
mod status_cmd;
mod tls_cmd;
mod update_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "bloodraven",
    version,
    about = "Keeps exactly one MySQL/MariaDB site of a failover group writable"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator: failover controller, deploy lease API (TLS), status endpoints.
    Operator(operator_cmd::OperatorArgs),
    /// Deploy tokens for the lease API (embedded mode): issue one, or create a signing key.
    Token(operator_cmd::TokenArgs),
    /// The operator's topology signing key: sidecars adopt only active-site views it signed.
    Topology(operator_cmd::TopologyArgs),
    /// The component CA and the certificates every component proves itself with (mutual
    /// TLS between the operator, the sidecars and the routers).
    Tls(tls_cmd::TlsArgs),
    /// Create or change groups and databases in the store (etcd): a difference against it,
    /// `--dry-run` to see it first.
    Apply(apply_cmd::ApplyArgs),
    /// Request a planned failover of a group to a site and follow its phases.
    Failover(failover_cmd::FailoverArgs),
    /// Operations on one site of a group: rebuild it from the group (`site reclone`).
    Site(site_cmd::SiteArgs),
    /// Backups of a group: take one now and follow it, or list them (docs/backup.md).
    Backup(backup_cmd::BackupArgs),
    /// Update every site one at a time (replicas first, one switchover to an updated site,
    /// the old primary last) and follow the phases.
    Update(update_cmd::UpdateArgs),
    /// Load a mariadb-dump file into the live group (fenced, loaded on the target, one
    /// generation bump, the other sites recloned from it) and follow the phases.
    RestoreInPlace(restore_cmd::RestoreArgs),
    /// Show the groups: sites, states, lag, active site, generation, operations, leases.
    Status(status_cmd::StatusArgs),
    /// The deploy lease API: run a migration under the leases, observe, drive a lease, revoke all.
    Deploy(deploy_cmd::DeployArgs),
    /// A whole failover group on this machine: MariaDB servers, operator, sidecars, a counter
    /// app and a live dashboard.
    Playground(playground_cmd::PlaygroundArgs),
    /// Safe changes to a Kubernetes Deployment: plan, Lease, re-check, update, verify, record.
    Release(release_cmd::ReleaseArgs),
    /// The self-fencing sidecar of one MySQL server: safety net, fencing monitor, peer server.
    Sidecar(Box<sidecar_cmd::SidecarArgs>),
    /// Print Bloodraven's alerting rules as a Prometheus rules file (docs/runbook.md says
    /// what each alert means and what to do).
    Alerts(alerts_cmd::AlertsArgs),
    /// Print the custom resource definitions (failover groups, databases) as YAML.
    Crds(crds_cmd::CrdsArgs),
    /// Print the Helm chart's install (CRDs, RBAC, Deployment, Services, …) as YAML, from the
    /// same values, for installs without Helm.
    Manifests(manifests_cmd::ManifestsArgs),
    /// Move the groups of an embedded data directory to etcd or Kubernetes (groups, status,
    /// deploy leases), keeping their topology generation.
    Move(move_cmd::MoveArgs),
    /// `move --to kubernetes` (the older name).
    MoveToKubernetes(move_cmd::MoveArgs),
}

/// Per-group tasks the operator runs once it leads.
fn controller_tasks() -> Vec<std::sync::Arc<dyn bloodraven_operator::operator::GroupTask>> {
    vec![
        std::sync::Arc::new(bloodraven_operator::controller::ControllerTask),
        std::sync::Arc::new(bloodraven_operator::roles::RoleLabelTask),
    ]
}

fn main() {
    // One TLS crypto provider for every client and server of the process.
    bloodraven_runtime::tls::install_crypto_provider();
    let cli = Cli::parse();
    match cli.command {
        Command::Operator(args) => std::process::exit(operator_cmd::run_operator(&args)),
        Command::Token(args) => std::process::exit(operator_cmd::run_token(args)),
        Command::Topology(args) => std::process::exit(operator_cmd::run_topology(args)),
        Command::Tls(args) => std::process::exit(tls_cmd::run(args)),
        Command::Apply(args) => std::process::exit(apply_cmd::run(&args)),
        Command::Failover(args) => std::process::exit(failover_cmd::run(&args)),
        Command::Status(args) => std::process::exit(status_cmd::run(&args)),
        Command::Site(args) => std::process::exit(site_cmd::run(&args)),
        Command::Backup(args) => std::process::exit(backup_cmd::run(&args)),
        Command::Update(args) => std::process::exit(update_cmd::run(&args)),
        Command::RestoreInPlace(args) => std::process::exit(restore_cmd::run(&args)),
        Command::Deploy(args) => std::process::exit(deploy_cmd::run(args)),
        Command::Move(args) => std::process::exit(move_cmd::run(&args, None)),
        Command::MoveToKubernetes(args) => {
            std::process::exit(move_cmd::run(&args, Some(move_cmd::To::Kubernetes)))
        }
        Command::Alerts(args) => std::process::exit(alerts_cmd::run(&args)),
        Command::Crds(args) => std::process::exit(crds_cmd::run(&args)),
        Command::Manifests(args) => std::process::exit(manifests_cmd::run(&args)),
        Command::Playground(args) => std::process::exit(playground_cmd::run(args)),
        Command::Release(args) => std::process::exit(release_cmd::run(args)),
        Command::Sidecar(args) => std::process::exit(sidecar_cmd::run(*args)),
    }
}
