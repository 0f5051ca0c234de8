//! `bloodraven playground`: a whole failover group on this machine, with a counter app and a
//! live dashboard; `playground chaos ACTION [SITE]` and `playground scenario NAME` drive a
//! running one.

use std::path::PathBuf;

use bloodraven_core::config::{FencingMode, ReplicationMode};
use bloodraven_playground::control::StoreChoice;
use bloodraven_playground::playground::PlaygroundOptions;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PlaygroundArgs {
    #[command(subcommand)]
    command: Option<PlaygroundCommand>,
    /// Keep the state (servers' data, operator store, certificates) here between runs.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Start from scratch (removes --dir first).
    #[arg(long)]
    reset: bool,
    /// The counter app's port.
    #[arg(long, default_value_t = 8090)]
    app_port: u16,
    /// The dashboard's port.
    #[arg(long, default_value_t = 8091)]
    dashboard_port: u16,
    /// The operator's plain HTTP port.
    #[arg(long, default_value_t = 8082)]
    operator_port: u16,
    /// The deploy API's TLS port.
    #[arg(long, default_value_t = 8443)]
    deploy_port: u16,
    /// The router's (HAProxy's) port to the primary: the counter app writes through it.
    #[arg(long, default_value_t = 6033)]
    router_port: u16,
    /// The router's port to the replicas.
    #[arg(long, default_value_t = 6034)]
    router_replica_port: u16,
    /// The group's `spec.replication.mode`: `async`, or `semi-sync` (lossless: no acknowledged
    /// write is lost in an emergency; writes wait while no replica acknowledges).
    #[arg(long, value_enum, default_value_t = ReplicationArg::Async)]
    replication: ReplicationArg,
    /// Where the operators keep the group: `embedded` (one operator, SQLite), or `etcd`
    /// (three etcd members on private ports and two operators; the printed operator and
    /// deploy addresses follow whichever leads).
    #[arg(long, value_enum, default_value_t = StoreArg::Embedded)]
    store: StoreArg,
    /// The group's `spec.emergencyFailover.fencing`: `fast`, or `strict` (never two writable
    /// sites: an emergency promotion waits until the old primary is proven fenced).
    #[arg(long, value_enum, default_value_t = FencingArg::Fast)]
    fencing: FencingArg,
    /// Keep backups in a bucket of an S3-compatible service (`s3://bucket/prefix`) instead
    /// of `<dir>/backups/`; needs --backup-s3-credentials-file.
    #[arg(long, value_parser = s3_target, requires = "backup_s3_credentials_file")]
    backup_s3_target: Option<String>,
    /// The S3-compatible service's URL (e.g. `http://127.0.0.1:9000`); AWS's own without it.
    #[arg(long, requires = "backup_s3_target")]
    backup_s3_endpoint: Option<String>,
    /// A file of `accessKeyId=` and `secretAccessKey=` lines for the bucket.
    #[arg(long, requires = "backup_s3_target")]
    backup_s3_credentials_file: Option<PathBuf>,
    /// Take backups on a schedule (`spec.backup.schedule`: cron, UTC, e.g. `0 3 * * *`);
    /// without it, only when asked for.
    #[arg(long, value_parser = cron_schedule)]
    backup_schedule: Option<String>,
    /// Keep at most this many good backups (`spec.backup.retention.count`, at least 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    backup_retention_count: Option<u32>,
}

/// `--backup-schedule`: a schedule `spec.backup.schedule` accepts.
fn cron_schedule(text: &str) -> Result<String, bloodraven_core::cron::ScheduleError> {
    bloodraven_core::cron::Schedule::parse(text).map(|_| text.to_string())
}

/// `--backup-s3-target`: an `s3://bucket/prefix` URL.
fn s3_target(text: &str) -> Result<String, &'static str> {
    bloodraven_core::config::S3Target::parse_url(text).map(|_| text.to_string())
}

/// `--fencing`: the mode's name as `spec.emergencyFailover.fencing` spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum FencingArg {
    Fast,
    Strict,
}

impl From<FencingArg> for FencingMode {
    fn from(a: FencingArg) -> Self {
        match a {
            FencingArg::Fast => FencingMode::Fast,
            FencingArg::Strict => FencingMode::Strict,
        }
    }
}

/// `--replication`: the mode's name as `spec.replication.mode` spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ReplicationArg {
    Async,
    SemiSync,
}

impl From<ReplicationArg> for ReplicationMode {
    fn from(a: ReplicationArg) -> Self {
        match a {
            ReplicationArg::Async => ReplicationMode::Async,
            ReplicationArg::SemiSync => ReplicationMode::SemiSync,
        }
    }
}

/// `--store`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum StoreArg {
    Embedded,
    Etcd,
}

impl From<StoreArg> for StoreChoice {
    fn from(a: StoreArg) -> Self {
        match a {
            StoreArg::Embedded => StoreChoice::Embedded,
            StoreArg::Etcd => StoreChoice::Etcd,
        }
    }
}

#[derive(Debug, Subcommand)]
enum PlaygroundCommand {
    /// Run one chaos action against a running playground (the dashboard's buttons).
    Chaos {
        /// increment, failover, kill-site, restart-site, isolate-site,
        /// isolate-site-from-operator, isolate-site-from-peers, heal-site, reclone-site, backup, update, isolate-operator,
        /// heal-operator, stop-operator, start-operator, start-writing, stop-writing, take-lease, release-lease,
        /// revoke-all; with --store etcd also kill-leading-operator, stop-etcd-member [MEMBER],
        /// stop-etcd-leader, start-etcd.
        action: String,
        /// The site, for the actions that take one (stop-etcd-member: the member, m0, m1 or m2).
        site: Option<String>,
        /// restart-site only: start the server writable (`read_only=OFF`), the crash case; by
        /// default it boots read-only as every playground server does.
        #[arg(long)]
        writable: bool,
        /// The running playground's dashboard.
        #[arg(long, default_value = "http://127.0.0.1:8091")]
        dashboard: String,
    },
    /// Run one of the seeds' scenarios against a running playground; exits non-zero when the
    /// expected outcome does not happen.
    Scenario {
        /// operator-down, deferred-failover, kill-primary or isolate-primary.
        name: String,
        /// The running playground's dashboard.
        #[arg(long, default_value = "http://127.0.0.1:8091")]
        dashboard: String,
    },
}

pub fn run(args: PlaygroundArgs) -> i32 {
    match args.command {
        Some(PlaygroundCommand::Chaos {
            action,
            site,
            writable,
            dashboard,
        }) => crate::cli::run(crate::cli::Flavor::MultiThread, async move {
            if writable && action != "restart-site" {
                eprintln!("error: --writable applies to restart-site only");
                return crate::cli::exit::USAGE;
            }
            let base = format!("{}/api/chaos/{action}", dashboard.trim_end_matches('/'));
            let mut query = Vec::new();
            if let Some(s) = &site {
                query.push(format!("site={s}"));
            }
            if writable {
                query.push("writable=true".to_string());
            }
            let url = if query.is_empty() {
                base
            } else {
                format!("{base}?{}", query.join("&"))
            };
            let client = reqwest::Client::new();
            match client.post(&url).send().await {
                Ok(r) => {
                    let v: serde_json::Value = r.json().await.unwrap_or_default();
                    let message = v["message"].as_str().unwrap_or_default();
                    if v["ok"] == true {
                        println!("{message}");
                        0
                    } else {
                        eprintln!("error: {message}");
                        2
                    }
                }
                Err(e) => {
                    eprintln!("error: no playground answers at {dashboard}: {e}");
                    1
                }
            }
        }),
        Some(PlaygroundCommand::Scenario { name, dashboard }) => {
            crate::cli::run(crate::cli::Flavor::MultiThread, async move {
                match bloodraven_playground::scenario::run(&name, &dashboard).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("error: {e}");
                        1
                    }
                }
            })
        }
        None => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("error: cannot find the bloodraven binary: {e}");
                    return 1;
                }
            };
            bloodraven_runtime::logging::init(bloodraven_runtime::logging::Format::Text);
            crate::cli::run(
                crate::cli::Flavor::MultiThread,
                bloodraven_playground::run(PlaygroundOptions {
                    dir: args.dir,
                    reset: args.reset,
                    app_port: args.app_port,
                    dashboard_port: args.dashboard_port,
                    operator_port: args.operator_port,
                    deploy_port: args.deploy_port,
                    router_port: args.router_port,
                    router_replica_port: args.router_replica_port,
                    exe,
                    replication: args.replication.into(),
                    store: args.store.into(),
                    fencing: args.fencing.into(),
                    failpoints: None,
                    backup_schedule: args.backup_schedule,
                    backup_retention_count: args.backup_retention_count,
                    backup_s3: args.backup_s3_target.map(|target| {
                        bloodraven_playground::playground::S3Backups {
                            target,
                            endpoint: args.backup_s3_endpoint,
                            credentials_file: args.backup_s3_credentials_file.unwrap_or_default(),
                        }
                    }),
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PlaygroundArgs,
    }

    #[test]
    fn the_modes_read_as_the_spec_spells_them_and_others_are_refused() {
        let cli = Cli::try_parse_from([
            "playground",
            "--fencing",
            "strict",
            "--replication",
            "semi-sync",
            "--store",
            "etcd",
        ])
        .unwrap();
        assert_eq!(FencingMode::from(cli.args.fencing), FencingMode::Strict);
        assert_eq!(
            ReplicationMode::from(cli.args.replication),
            ReplicationMode::SemiSync
        );
        assert_eq!(StoreChoice::from(cli.args.store), StoreChoice::Etcd);
        let defaults = Cli::try_parse_from(["playground"]).unwrap();
        assert_eq!(FencingMode::from(defaults.args.fencing), FencingMode::Fast);
        assert_eq!(
            StoreChoice::from(defaults.args.store),
            StoreChoice::Embedded
        );
        for (flag, bad) in [
            ("--fencing", "safe"),
            ("--replication", "sync"),
            ("--store", "sqlite"),
        ] {
            let err = Cli::try_parse_from(["playground", flag, bad])
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(flag) && err.contains("possible values"),
                "{err}"
            );
        }
    }
}
