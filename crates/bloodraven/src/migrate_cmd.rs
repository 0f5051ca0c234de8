//! `bloodraven deploy migrate … -- COMMAND`: the command line of the migrate engine
//! ([`bloodraven_deploy::migrate`]): flags, their validation, the client, the runtime.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::duration::parse_duration;
use bloodraven_deploy::lease::{HttpLeaseApi, LeaseApi};
use bloodraven_deploy::migrate::{Migration, migrate};
use clap::Args;

pub use bloodraven_deploy::migrate::exit;

/// Where the deploy API is and who we are: shared by every `deploy` subcommand.
#[derive(Debug, Args, Clone)]
pub struct ApiArgs {
    /// The deploy API, e.g. `https://bloodraven.example:8443`.
    #[arg(long, env = "BLOODRAVEN_API")]
    pub api: String,
    /// The CA certificate (PEM) to trust for the API.
    #[arg(long, env = "BLOODRAVEN_CACERT")]
    pub cacert: PathBuf,
    /// The bearer token file (re-read on every request: projected tokens rotate).
    #[arg(long, env = "BLOODRAVEN_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// The failover group.
    #[arg(long, env = "BLOODRAVEN_GROUP")]
    pub group: String,
}

impl ApiArgs {
    pub fn client(&self, request_timeout: Duration) -> Result<HttpLeaseApi, ClientError> {
        if !self.token_file.is_file() {
            return Err(ClientError::NoTokenFile(self.token_file.clone()));
        }
        HttpLeaseApi::new(
            &self.api,
            &self.cacert,
            &self.token_file,
            &self.group,
            request_timeout,
        )
        .map_err(ClientError::Setup)
    }
}

/// The lease API's client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--token-file: {} does not exist", .0.display())]
    NoTokenFile(PathBuf),
    #[error(transparent)]
    Setup(bloodraven_deploy::lease::api::ClientSetupError),
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// The MysqlDatabase resource name the migration is for.
    #[arg(long)]
    pub instance: String,
    /// The operation's ID (default: a new UUID). Re-using a revoked one is refused.
    #[arg(long)]
    pub operation_id: Option<String>,
    /// Lease TTL in seconds (clamped to 5–120); leases are renewed every ttl/3.
    #[arg(long, default_value_t = 30)]
    pub ttl: u32,
    /// Largest replication lag (seconds) accepted before starting.
    #[arg(long, default_value_t = 10.0)]
    pub max_lag: f64,
    /// How long to wait for another operation's migration lease (e.g. 10m).
    #[arg(long, default_value = "10m")]
    pub wait: String,
    /// Run when authority is lost before the DDL boundary (through `sh -c`, same environment).
    #[arg(long)]
    pub abort_command: Option<String>,
    /// The command signals the DDL boundary by creating the file `BLOODRAVEN_DDL_MARKER`.
    #[arg(long)]
    pub ddl_marker: bool,
    /// Where the append-only record is written.
    #[arg(long, default_value = ".bloodraven/deploys")]
    pub records_dir: PathBuf,
    /// How long a terminated command gets to exit before it is killed.
    #[arg(long, default_value = "10s")]
    pub grace: String,
    /// The migration command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Validates and runs; returns the exit code.
pub fn run(args: &MigrateArgs) -> i32 {
    let wait = match crate::cli::wait_flag(&args.wait) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let grace = match parse_duration(&args.grace) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: --grace: {e}");
            return exit::USAGE;
        }
    };
    if let Err(e) = bloodraven_core::lease::validate_instance(&args.instance) {
        eprintln!("error: --instance: {e}");
        return exit::USAGE;
    }
    let operation_id = match &args.operation_id {
        Some(o) => o.clone(),
        None => match bloodraven_deploy::migrate::new_operation_id() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: cannot generate an operation ID: {e}");
                return exit::ERROR;
            }
        },
    };
    if let Err(e) = bloodraven_core::lease::validate_operation_id(&operation_id) {
        eprintln!("error: --operation-id: {e}");
        return exit::USAGE;
    }
    if !args.max_lag.is_finite() || args.max_lag < 0.0 {
        eprintln!("error: --max-lag: must be a number of seconds ≥ 0");
        return exit::USAGE;
    }
    let ttl = bloodraven_core::lease::clamp_ttl(i64::from(args.ttl));
    let timeout = (Duration::from_secs(u64::from(ttl)) / 3)
        .clamp(Duration::from_secs(1), Duration::from_secs(10));
    let api = match args.api.client(timeout) {
        Ok(a) => Arc::new(a) as Arc<dyn LeaseApi>,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let run = Migration {
        instance: args.instance.clone(),
        operation_id,
        ttl_seconds: ttl,
        max_lag: args.max_lag,
        wait,
        abort_command: args.abort_command.clone(),
        ddl_marker: args.ddl_marker,
        records_dir: args.records_dir.clone(),
        grace,
        command: args.command.clone(),
    };
    crate::cli::run(crate::cli::Flavor::MultiThread, migrate(api, &run))
}
