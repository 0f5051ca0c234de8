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
    /// The operator's component listener (its `componentTLS.listen`), e.g.
    /// `https://bloodraven:8444` (required). On the etcd platform, every operator's,
    /// separated by commas: whichever leads is the operator.
    #[arg(long, env = "BLOODRAVEN_OPERATOR", value_name = "URL")]
    operator: Option<String>,
    /// A peer sidecar's base URL (`https://`); repeat for every other site of the group
    /// (readers too). The environment variable takes a comma-separated list.
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
    /// TLS to this site's MySQL over TCP: `disabled`, `required` (encrypted, the certificate
    /// not checked) or `verify-identity` (the default once --mysql-tls-ca is given).
    #[arg(long, env = "BLOODRAVEN_MYSQL_TLS_MODE", value_name = "MODE")]
    mysql_tls_mode: Option<String>,
    /// The CA bundle this site's MySQL certificate must chain to (re-read at every new
    /// connection).
    #[arg(long, env = "BLOODRAVEN_MYSQL_TLS_CA", value_name = "PATH")]
    mysql_tls_ca: Option<PathBuf>,
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
    /// This sidecar's component certificate (PEM; `bloodraven tls issue --site S`), naming
    /// `spiffe://bloodraven/<namespace>/<group>/<site>`. Re-read when it changes.
    #[arg(long, env = "BLOODRAVEN_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "BLOODRAVEN_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The component CA bundle (PEM; during a CA rotation, the old and the new CA): the
    /// operator and the peers must prove themselves with certificates it issued.
    #[arg(long, env = "BLOODRAVEN_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// A file with `username=` and `password=` lines for the backup account (`RELOAD,
    /// PROCESS, LOCK TABLES, BINLOG MONITOR, SLAVE MONITOR`): lets the group's operator ask
    /// this site for backups (POST /backups). Needs --mysql (TCP) and `mariadb-backup`, `zstd`.
    #[arg(long, env = "BLOODRAVEN_BACKUP_CREDENTIALS_FILE", value_name = "PATH")]
    backup_credentials_file: Option<PathBuf>,
    /// The server's data directory as this host sees it, when it differs from the server's
    /// own `@@datadir` (e.g. the data volume mounted read-only elsewhere in a container).
    #[arg(long, env = "BLOODRAVEN_BACKUP_DATADIR", value_name = "PATH")]
    backup_datadir: Option<PathBuf>,
    /// Where the server listens, over TLS (client certificates optional): /health, /status,
    /// /primary, /replica, /read-only, /metrics for anyone; /peer/* for verified peers;
    /// /backups for the group's operator.
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
        mysql_tls_mode: args.mysql_tls_mode,
        mysql_tls_ca: args.mysql_tls_ca,
        lease_timeout: Some(args.lease_timeout),
        peer_check_interval: Some(args.peer_check_interval),
        listen: Some(args.listen),
        operator_public_keys: args.operator_public_keys,
        pin_timings: args.pin_timings,
        replica_max_lag: Some(args.replica_max_lag),
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_ca: args.tls_ca,
        backup_credentials_file: args.backup_credentials_file,
        backup_datadir: args.backup_datadir,
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
