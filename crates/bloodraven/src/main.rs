//! The `bloodraven` command: one binary, one subcommand per component.

use clap::{Parser, Subcommand};

mod release_cmd;
mod sidecar_cmd;

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
    /// Safe changes to a Kubernetes Deployment: plan, Lease, re-check, update, verify, record.
    Release(release_cmd::ReleaseArgs),
    /// The self-fencing sidecar of one MySQL server: safety net, fencing monitor, peer server.
    Sidecar(sidecar_cmd::SidecarArgs),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Release(args) => std::process::exit(release_cmd::run(args)),
        Command::Sidecar(args) => std::process::exit(sidecar_cmd::run(args)),
    }
}
