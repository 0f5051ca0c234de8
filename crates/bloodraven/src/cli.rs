//! What every subcommand shares: the exit codes they all use, and how they run async code.
//! Each command adds its own codes (documented with it) after these.

use std::future::Future;

use bloodraven_operator::config::{LoadedConfig, StoreBackend};
use bloodraven_operator::operator::STORE_FILE;
use bloodraven_operator::relocate;
use bloodraven_store::SqliteStore;

/// Exit codes shared by every subcommand.
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// Could not run: a connection, local IO, the runtime.
    pub const ERROR: i32 = 1;
    /// Bad command-line input (also clap's own code).
    pub const USAGE: i32 = 2;
}

/// How a command runs its async code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// One thread: clients that make a few requests.
    CurrentThread,
    /// Worker threads: long-running servers and commands that supervise children.
    MultiThread,
}

/// Runs `fut` to completion on a new runtime and returns its value; a runtime that cannot
/// start is reported once and answered with [`exit::ERROR`].
pub fn block_on<F: Future>(flavor: Flavor, fut: F) -> Result<F::Output, i32> {
    let mut builder = match flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
    };
    match builder.enable_all().build() {
        Ok(rt) => Ok(rt.block_on(fut)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            Err(exit::ERROR)
        }
    }
}

/// [`block_on`] for a future that already yields the exit code.
pub fn run<F: Future<Output = i32>>(flavor: Flavor, fut: F) -> i32 {
    block_on(flavor, fut).unwrap_or_else(|code| code)
}

/// The embedded store file of `cfg`, for the commands that write requests into it. Refuses a
/// Kubernetes-mode configuration and a data directory moved to Kubernetes (nobody acts on
/// requests written there), saying what to do `instead`. `Err` carries the exit code; the
/// message is already printed.
pub fn embedded_store(
    cfg: &LoadedConfig,
    cfg_path: &std::path::Path,
    instead: &str,
) -> Result<std::path::PathBuf, i32> {
    if let StoreBackend::Kubernetes { .. } = cfg.settings.store {
        eprintln!(
            "error: {} runs in Kubernetes mode (store.backend: kubernetes): {instead}",
            cfg_path.display()
        );
        return Err(exit::USAGE);
    }
    let data_dir = &cfg.settings.data_dir;
    if let Some(m) = relocate::moved(data_dir) {
        eprintln!("error: {}; {instead}", relocate::refusal(data_dir, &m));
        return Err(exit::ERROR);
    }
    Ok(data_dir.join(STORE_FILE))
}

/// Opens the embedded store at `path` (within a runtime: the store runs a task). `Err`
/// carries the exit code; the message is already printed.
pub fn open_store(path: &std::path::Path) -> Result<SqliteStore, i32> {
    SqliteStore::open(path, bloodraven_store::Durability::Full).map_err(|e| {
        eprintln!("error: {e}");
        exit::ERROR
    })
}
