//! `bloodraven-sidecar`: the self-fencing sidecar alone, for the container next to every MySQL
//! server. It takes exactly the flags of `bloodraven sidecar` (no subcommand) and exits with
//! the same codes; it links only the sidecar, so it maps a fraction of the single binary's code
//! (docs/benchmarks.md, "The sidecar").

use bloodraven_sidecar::cli::{SidecarArgs, run};
use clap::Parser;

/// The self-fencing sidecar of one MySQL server: safety net, fencing monitor, peer server.
#[derive(Debug, Parser)]
#[command(name = "bloodraven-sidecar", version)]
struct Cli {
    #[command(flatten)]
    args: SidecarArgs,
}

fn main() {
    // clap exits 2 (`exit::USAGE`) on a flag it cannot parse, 0 for --help and --version.
    let cli = Cli::parse();
    std::process::exit(run(cli.args));
}
