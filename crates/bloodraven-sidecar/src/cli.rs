//! The sidecar's command line, shared by `bloodraven sidecar` and the sidecar-only
//! `bloodraven-sidecar` binary (the same flags, environment fallbacks, exit codes and logs).
//!
//! Reads flags (each with an environment fallback), validates them with the sidecar's rules —
//! a bad value exits with code 2 and a message naming the flag and the rule — then installs the
//! log format and runs [`crate::run`] on one thread until SIGINT or SIGTERM.

use std::path::PathBuf;

use bloodraven_runtime::logging::{self, Format};
use clap::{Args, ValueEnum};

use crate::config::{RawSettings, limits, validate};

/// Exit codes of the sidecar: the same numbers as every `bloodraven` command.
pub mod exit {
    /// Stopped by a signal.
    pub const STOPPED: i32 = 0;
    /// Could not run: the listener could not bind, the runtime could not start.
    pub const ERROR: i32 = 1;
    /// A bad flag or environment value (also clap's own code).
    pub const USAGE: i32 = 2;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Args)]
pub struct SidecarArgs {
    /// This site's name, as in the group's spec (required).
    #[arg(long, env = "BLOODRAVEN_SITE", value_name = "NAME")]
    site: Option<String>,
    /// The failover group's name (required).
    #[arg(long, env = "BLOODRAVEN_GROUP", value_name = "NAME")]
    group: Option<String>,
    /// The group's namespace.
    #[arg(
        long,
        env = "BLOODRAVEN_NAMESPACE",
        value_name = "NAME",
        default_value = "default"
    )]
    namespace: String,
    /// The operator's plain-HTTP base URL, e.g. `http://bloodraven:8082` (required). On the
    /// etcd platform, every operator's, separated by commas: whichever leads is the operator.
    #[arg(long, env = "BLOODRAVEN_OPERATOR", value_name = "URL")]
    operator: Option<String>,
    /// A peer sidecar's base URL; repeat for every other site of the group (readers too).
    /// The environment variable takes a comma-separated list.
    #[arg(
        long = "peer",
        env = "BLOODRAVEN_PEERS",
        value_name = "URL",
        value_delimiter = ','
    )]
    peers: Vec<String>,
    /// This site's MySQL over TCP, HOST:PORT (or --mysql-socket).
    #[arg(long, env = "BLOODRAVEN_MYSQL", value_name = "HOST:PORT")]
    mysql: Option<String>,
    /// This site's MySQL over a Unix socket (or --mysql).
    #[arg(long, env = "BLOODRAVEN_MYSQL_SOCKET", value_name = "PATH")]
    mysql_socket: Option<PathBuf>,
    /// A file with `username=` and `password=` lines for the control-plane account (required).
    #[arg(long, env = "BLOODRAVEN_MYSQL_CREDENTIALS_FILE", value_name = "PATH")]
    mysql_credentials_file: Option<PathBuf>,
    /// Rule #2 fences after the operator and every peer were silent for longer than this.
    #[arg(
        long,
        env = "BLOODRAVEN_LEASE_TIMEOUT",
        value_name = "DURATION",
        default_value = "20s"
    )]
    lease_timeout: String,
    /// How often the fencing monitor ticks.
    #[arg(
        long,
        env = "BLOODRAVEN_PEER_CHECK_INTERVAL",
        value_name = "DURATION",
        default_value = "5s"
    )]
    peer_check_interval: String,
    /// A file with the operator's topology public key (`bloodraven topology keygen` writes
    /// it): only active-site views it signed are adopted, read from the operator or relayed by
    /// a peer, and their spec.sidecar timings replace the two flags above. Repeat for a key
    /// rotation. Without it views are adopted unsigned (a warning at start).
    #[arg(
        long = "operator-public-key",
        env = "BLOODRAVEN_OPERATOR_PUBLIC_KEYS",
        value_name = "FILE",
        value_delimiter = ','
    )]
    operator_public_keys: Vec<PathBuf>,
    /// Keep --lease-timeout and --peer-check-interval even when the operator's signed view
    /// carries the group's spec.sidecar timings.
    #[arg(long, env = "BLOODRAVEN_PIN_TIMINGS")]
    pin_timings: bool,
    /// `GET /replica` answers 200 only within this lag, unless the request says `?lag=S`.
    #[arg(
        long,
        env = "BLOODRAVEN_REPLICA_MAX_LAG",
        value_name = "DURATION",
        default_value = "10s"
    )]
    replica_max_lag: String,
    /// Where the HTTP server listens (/health, /status, /primary, /replica, /read-only,
    /// /peer/*, /metrics).
    #[arg(long, env = "BLOODRAVEN_LISTEN", value_name = "ADDRESS:PORT", default_value = limits::DEFAULT_LISTEN)]
    listen: String,
    /// Log format on stderr.
    #[arg(
        long,
        env = "BLOODRAVEN_LOG_FORMAT",
        value_enum,
        default_value = "json"
    )]
    log_format: LogFormat,
}

/// Runs the sidecar and returns the process's exit code.
pub fn run(args: SidecarArgs) -> i32 {
    let raw = RawSettings {
        site: args.site,
        group: args.group,
        namespace: Some(args.namespace),
        operator: args.operator,
        peers: args.peers,
        mysql: args.mysql,
        mysql_socket: args.mysql_socket,
        mysql_credentials_file: args.mysql_credentials_file,
        lease_timeout: Some(args.lease_timeout),
        peer_check_interval: Some(args.peer_check_interval),
        listen: Some(args.listen),
        operator_public_keys: args.operator_public_keys,
        pin_timings: args.pin_timings,
        replica_max_lag: Some(args.replica_max_lag),
    };
    let settings = match validate(&raw) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {}: {}", e.field, e.rule);
            }
            return exit::USAGE;
        }
    };
    logging::init(match args.log_format {
        LogFormat::Json => Format::Json,
        LogFormat::Text => Format::Text,
    });
    // One thread: the sidecar is a few timers and sockets, and each worker thread would cost
    // its stack and its share of the allocator's arenas next to every MySQL server.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return exit::ERROR;
        }
    };
    runtime.block_on(async move {
        let result = crate::run(
            settings,
            bloodraven_runtime::clock::system(),
            bloodraven_runtime::shutdown::signal(),
        )
        .await;
        match result {
            Ok(()) => exit::STOPPED,
            Err(e) => {
                tracing::error!(
                    error = %format!("the sidecar could not run: {}", chain(&e)),
                    "sidecar stopped with an error"
                );
                exit::ERROR
            }
        }
    })
}

/// `e` and every error below it, joined by `: ` (what `anyhow`'s `{:#}` prints).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}
