//! `bloodraven operator` (run the operator) and `bloodraven token` (deploy tokens).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use bloodraven_core::contract::DEPLOY_AUDIENCE;
use bloodraven_core::duration::parse_duration;
use bloodraven_operator::auth::{self, SigningKey};
use bloodraven_operator::config;
use bloodraven_runtime::clock::{self, Clock as _};
use bloodraven_runtime::logging;
use clap::{Args, Subcommand, ValueEnum};

/// Exit codes shared by the service commands.
pub mod exit {
    pub use crate::cli::exit::{ERROR, OK, USAGE};
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

impl From<LogFormat> for logging::Format {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Json => logging::Format::Json,
            LogFormat::Text => logging::Format::Text,
        }
    }
}

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// The configuration file (YAML: `OperatorConfig`, `MysqlFailoverGroup` and `MysqlDatabase` documents).
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: PathBuf,
    /// Log line format.
    #[arg(
        long,
        value_enum,
        default_value = "json",
        env = "BLOODRAVEN_LOG_FORMAT"
    )]
    log_format: LogFormat,
}

/// Runs the operator until SIGINT/SIGTERM.
pub fn run_operator(args: &OperatorArgs) -> i32 {
    logging::init(args.log_format.into());
    let cfg = match crate::cli::load_config(&args.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    crate::cli::run(crate::cli::Flavor::MultiThread, async move {
        let tasks = crate::controller_tasks();
        let handle = match bloodraven_operator::start(cfg, clock::system(), tasks).await {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ERROR;
            }
        };
        bloodraven_runtime::shutdown::signal().await;
        tracing::info!("shutting down");
        handle.stop().await;
        exit::OK
    })
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a deploy token for a service account (embedded mode).
    Issue {
        /// The service account's namespace.
        #[arg(long)]
        namespace: String,
        /// The service account's name.
        #[arg(long)]
        service_account: String,
        /// How long the token is valid, e.g. 1h, 30m (at most 30 days).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// The operator's token signing key file.
        #[arg(long, conflicts_with = "config")]
        key_file: Option<PathBuf>,
        /// Read the key file (and audience) from the operator's configuration instead.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The audience (default bloodraven-deploy).
        #[arg(long)]
        audience: Option<String>,
    },
    /// Write a new random token signing key to a file (refuses to overwrite one).
    Keygen {
        /// Where to write the key.
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run_token(args: TokenArgs) -> i32 {
    match args.command {
        TokenCommand::Issue {
            namespace,
            service_account,
            ttl,
            key_file,
            config,
            audience,
        } => {
            let ttl = match parse_duration(&ttl) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: --ttl: {e}");
                    return exit::USAGE;
                }
            };
            let (key_path, cfg_audience) = match signing_key_of(key_file, config) {
                Ok(found) => found,
                Err(code) => return code,
            };
            let key = match SigningKey::load(&key_path) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit::USAGE;
                }
            };
            let audience = audience
                .or(cfg_audience)
                .unwrap_or_else(|| DEPLOY_AUDIENCE.to_string());
            match auth::issue(
                &key,
                &audience,
                &auth::Identity::new(&namespace, &service_account),
                ttl,
                clock::SystemClock.now(),
            ) {
                Ok(token) => {
                    println!("{token}");
                    exit::OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::USAGE
                }
            }
        }
        TokenCommand::Keygen { out } => keygen(&out),
    }
}

/// The signing key's file and the configuration's audience, from `--key-file` or `--config`;
/// the exit code after saying why otherwise.
fn signing_key_of(
    key_file: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<(PathBuf, Option<String>), i32> {
    match (key_file, config) {
        (Some(k), _) => Ok((k, None)),
        (None, Some(c)) => {
            let cfg = config::load(&c).map_err(|e| {
                eprintln!("error: {e}");
                exit::USAGE
            })?;
            let Some(d) = cfg.settings.deploy_api else {
                eprintln!("error: --config: {} has deployAPI disabled", c.display());
                return Err(exit::USAGE);
            };
            let Some(k) = d.token_key_file else {
                eprintln!(
                    "error: --config: {} uses the kubernetes backend: deploy tokens are projected ServiceAccount tokens (audience {}), not issued by bloodraven",
                    c.display(),
                    d.audience
                );
                return Err(exit::USAGE);
            };
            Ok((k, Some(d.audience)))
        }
        (None, None) => {
            eprintln!("error: give --key-file or --config");
            Err(exit::USAGE)
        }
    }
}

/// `bloodraven token keygen --out FILE`: a new signing key, owner-only from the moment it
/// exists, never over an existing file.
fn keygen(out: &Path) -> i32 {
    let text = match SigningKey::generate_text() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: no secure randomness available: {e}");
            return exit::ERROR;
        }
    };
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(out)
    };
    match file {
        Ok(mut f) => {
            if let Err(e) = writeln!(f, "{text}") {
                eprintln!("error: cannot write {}: {e}", out.display());
                return exit::ERROR;
            }
            eprintln!("wrote a new token signing key to {}", out.display());
            exit::OK
        }
        Err(e) => {
            eprintln!(
                "error: --out {}: {e} (an existing key is never overwritten)",
                out.display()
            );
            exit::USAGE
        }
    }
}

#[derive(Debug, Args)]
pub struct TopologyArgs {
    #[command(subcommand)]
    command: TopologyCommand,
}

#[derive(Debug, Subcommand)]
enum TopologyCommand {
    /// Create the operator's Ed25519 topology signing key pair: the private key at --out (for
    /// the operator's `topologySigningKeyFile`) and the public key at --out with `.pub` (for
    /// every sidecar's `--operator-public-key`). Never overwrites a key.
    Keygen {
        /// Where to write the private key.
        #[arg(long)]
        out: PathBuf,
        /// Where to write the public key (default: --out with the extension `.pub`).
        #[arg(long)]
        public_out: Option<PathBuf>,
    },
}

pub fn run_topology(args: TopologyArgs) -> i32 {
    match args.command {
        TopologyCommand::Keygen { out, public_out } => {
            let public = public_out.unwrap_or_else(|| out.with_extension("pub"));
            match bloodraven_runtime::topology::SigningKey::generate(&out, &public) {
                Ok(k) => {
                    eprintln!(
                        "wrote a topology signing key (key id {}) to {} and its public key to {}",
                        k.key_id(),
                        out.display(),
                        public.display()
                    );
                    exit::OK
                }
                Err(e @ bloodraven_runtime::topology::KeyError::Exists { .. }) => {
                    eprintln!("error: {e}");
                    exit::USAGE
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::ERROR
                }
            }
        }
    }
}
