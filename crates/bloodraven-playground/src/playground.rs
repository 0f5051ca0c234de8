//! The playground: three MariaDB servers (`iad` primary, `pdx` primary-candidate, `reader`
//! read-only) with GTID replication, the operator (a child process, embedded store, deploy API
//! on TLS; or with `--store etcd` two operators on three etcd members, see
//! [`crate::control`]), one sidecar per site (child processes), the counter app and the
//! dashboard, with every network link between them running through a [`LinkProxy`] that can
//! be cut.
//!
//! It stops exactly what it started: its own child processes and servers, by pid.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::SiteRole;
use bloodraven_core::contract::DEPLOY_AUDIENCE;
use bloodraven_core::contract::annotations::{PLANNED_FAILOVER, REVOKE_DEPLOYMENT_LEASES};
use bloodraven_core::lease::LeaseKind;
use bloodraven_core::resources::KIND_GROUP;
use bloodraven_core::time::Clock as _;
use bloodraven_deploy::lease::{HttpLeaseApi, LeaseApi, LeaseSession, SessionConfig};
use bloodraven_launch::local::{LocalFiles, LocalOptions, write_files, write_peer_files};
use bloodraven_launch::mysql::{Accounts, Launcher, LauncherOptions, ServerTls};
use bloodraven_launch::update_desk::UpdateDesk;
use bloodraven_mysql::Credentials;
use bloodraven_operator::auth::{self, SigningKey};
use bloodraven_runtime::clock::SystemClock;
use bloodraven_store::{Durability, ObjectKey, SqliteStore, Store};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::control::{Fronts, OperatorProc, SharedEtcd, StoreChoice};
use crate::counter::{AppSite, COUNTER_DDL, CounterApp};
use crate::proxy::LinkProxy;

/// The group and its sites.
pub const GROUP: &str = "playground";
pub const NAMESPACE: &str = "default";
pub const SITES: [&str; 3] = ["iad", "pdx", "reader"];
const ROLES: [SiteRole; 3] = [
    SiteRole::PrimaryCandidate,
    SiteRole::PrimaryCandidate,
    SiteRole::ReadOnly,
];

/// How to start.
#[derive(Clone, Debug)]
pub struct PlaygroundOptions {
    /// Keep state here between runs; `None`: a temporary directory removed at the end.
    pub dir: Option<PathBuf>,
    /// Remove `dir` first.
    pub reset: bool,
    pub app_port: u16,
    pub dashboard_port: u16,
    pub operator_port: u16,
    pub deploy_port: u16,
    /// The router's primary port (HAProxy; the counter app writes through it) and its
    /// replica port.
    pub router_port: u16,
    pub router_replica_port: u16,
    /// The `bloodraven` binary (the operator and the sidecars run as its subcommands).
    pub exe: PathBuf,
    /// `spec.replication.mode` of the group; `semi-sync` also starts the servers with the
    /// semi-synchronous recovery flags (docs/mysql.md).
    pub replication: bloodraven_core::config::ReplicationMode,
    /// Where the operators keep the group: one operator on SQLite, or two on three etcd
    /// members.
    pub store: StoreChoice,
    /// `spec.emergencyFailover.fencing` of the group.
    pub fencing: bloodraven_core::config::FencingMode,
    /// Backups into a bucket of an S3-compatible service instead of `<dir>/backups/`.
    pub backup_s3: Option<S3Backups>,
    /// `spec.backup.schedule` (cron, UTC); none: backups only when asked for.
    pub backup_schedule: Option<String>,
    /// `spec.backup.retention.count`.
    pub backup_retention_count: Option<u32>,
    /// Tests only: the file of test failpoints every operator reads
    /// (`BLOODRAVEN_TEST_FAILPOINTS`, see `bloodraven_operator::failpoints`). `None` in the
    /// `playground` command.
    pub failpoints: Option<PathBuf>,
}

impl PlaygroundOptions {
    /// A playground of `exe` on free ports, in a temporary directory, asynchronous, on the
    /// embedded store (what tests and benchmarks start).
    pub fn on_free_ports(exe: PathBuf) -> Self {
        PlaygroundOptions {
            dir: None,
            reset: true,
            app_port: 0,
            dashboard_port: 0,
            operator_port: 0,
            deploy_port: 0,
            router_port: 0,
            router_replica_port: 0,
            exe,
            replication: bloodraven_core::config::ReplicationMode::Async,
            store: StoreChoice::Embedded,
            fencing: bloodraven_core::config::FencingMode::Fast,
            failpoints: None,
            backup_s3: None,
            backup_schedule: None,
            backup_retention_count: None,
        }
    }
}

/// The playground's backups in a bucket (`--backup-target s3://…`).
#[derive(Clone, Debug)]
pub struct S3Backups {
    /// `s3://bucket/prefix`.
    pub target: String,
    /// The service's URL (`http://127.0.0.1:9000`); AWS's own without it.
    pub endpoint: Option<String>,
    /// A file of `accessKeyId=` and `secretAccessKey=` lines.
    pub credentials_file: PathBuf,
}

pub use crate::errors::PlaygroundError;
use crate::errors::{io, open_log};

/// Saved between runs (with `--dir`): the servers' ports and the accounts' passwords.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Saved {
    mysql_ports: Vec<u16>,
    failover: (String, String),
    replication: (String, String),
    app: (String, String),
    /// Absent in a directory saved before reclones: a new account is made then.
    #[serde(default)]
    clone: Option<(String, String)>,
    /// The store the directory ran with (absent: embedded, as before `--store`).
    #[serde(default)]
    store: StoreChoice,
    /// With etcd: each member's client and peer port.
    #[serde(default)]
    etcd_ports: Option<Vec<(u16, u16)>>,
    /// The database servers' TLS: `ca`, the absolute path of the CA bundle a client verifies
    /// them against.
    #[serde(default)]
    tls: Option<SavedTls>,
}

/// `playground.json`'s `tls`.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct SavedTls {
    ca: PathBuf,
}

/// The links of one site.
#[derive(Debug)]
pub struct SiteLinks {
    /// The operators (and the clone account's tools) → this site's MySQL: the site's
    /// `mysql` address in the spec. Its connections are TLS, so accounts cannot be told apart
    /// on it: the replicas come through a link of their own.
    pub mysql: LinkProxy,
    /// The other sites' replicas → this site's MySQL: its `replicationAddress`.
    pub replication: LinkProxy,
    /// Operator → this site's sidecar.
    pub sidecar: LinkProxy,
    /// This site's sidecar → each operator (one with the embedded store, two with etcd), by
    /// the operator's index.
    pub to_operators: Vec<LinkProxy>,
    /// This site's sidecar → each peer's sidecar, by the peer's index. One link per direction
    /// of every pair, so isolating a site cuts what it sends as well as what it receives.
    pub to_peers: Vec<(usize, LinkProxy)>,
}

impl SiteLinks {
    fn all(&self) -> impl Iterator<Item = &LinkProxy> {
        [&self.mysql, &self.replication, &self.sidecar]
            .into_iter()
            .chain(self.to_operators.iter())
            .chain(self.to_peers.iter().map(|(_, l)| l))
    }
}

/// The running playground.
pub struct Playground {
    pub dir: PathBuf,
    keep: bool,
    pub files: LocalFiles,
    /// The component PKI (`<dir>/pki/`): the CA every component trusts and each one's
    /// certificate.
    pub pki: bloodraven_runtime::mtls::local::GroupPki,
    pub harness: Mutex<Launcher>,
    pub links: Vec<SiteLinks>,
    pub sidecar_ports: Vec<u16>,
    /// The operator processes: one, or two with etcd.
    operators: Mutex<Vec<OperatorProc>>,
    /// With etcd: the members, and the printed ports in front of the operators.
    pub etcd: Option<SharedEtcd>,
    fronts: Option<Arc<Fronts>>,
    etcd_urls: Vec<String>,
    operator_addrs: Vec<(String, String)>,
    sidecars: Mutex<Vec<Option<Child>>>,
    pub counter: Arc<CounterApp>,
    /// HAProxy in front of the servers (the counter app's way to the primary).
    pub router: Mutex<Option<crate::router::Router>>,
    /// The app account through the router's primary port.
    pub router_opts: mysql_async::Opts,
    /// The store as a CLI writes requests to it (`bloodraven failover`): the platform's.
    pub store: Arc<dyn Store>,
    key: SigningKey,
    lease: Mutex<Option<LeaseSession>>,
    pub opts: PlaygroundOptions,
    pub app_addr: SocketAddr,
    pub dashboard_addr: SocketAddr,
    /// Where the sites' update command asks this process to restart a server.
    pub desk: UpdateDesk,
    /// Updates served so far: each brings the next setting (`--max-connections`).
    updates_served: std::sync::atomic::AtomicU32,
}

/// `max_connections` before any update; each update served raises it by one, so each
/// restart visibly changes a setting.
pub const FIRST_MAX_CONNECTIONS: u32 = 151;

impl std::fmt::Debug for Playground {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Playground")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn check_port(port: u16, what: &'static str, flag: &'static str) -> Result<(), PlaygroundError> {
    if port == 0 {
        return Ok(());
    }
    TcpListener::bind(("127.0.0.1", port))
        .map(drop)
        .map_err(|_| PlaygroundError::PortInUse { port, what, flag })
}

fn free_port() -> Result<u16, PlaygroundError> {
    bloodraven_launch::mysql::free_port().map_err(io("pick a free port"))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Where a playground keeps its files, and what a kept one saved last time.
struct Workdir {
    dir: PathBuf,
    keep: bool,
    saved_path: PathBuf,
    saved: Option<Saved>,
}

impl Workdir {
    /// `--dir` (kept across runs unless `--reset`) or a fresh temporary directory.
    fn prepare(opts: &PlaygroundOptions) -> Result<Workdir, PlaygroundError> {
        let (dir, keep) = match &opts.dir {
            Some(d) => (d.clone(), true),
            None => (
                std::env::temp_dir().join(format!("bloodraven-playground-{}", std::process::id())),
                false,
            ),
        };
        if opts.reset || !keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(io(format!("create {}", dir.display())))?;
        let saved_path = dir.join("playground.json");
        let saved: Option<Saved> = std::fs::read_to_string(&saved_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        Ok(Workdir {
            dir,
            keep,
            saved_path,
            saved,
        })
    }
}

/// Starts the three MariaDB servers, read-only: a fresh set wired (iad → pdx, reader) with
/// the accounts and the counter table, a kept one with the stored active site made writable
/// again. Saves the ports and accounts for the next run.
async fn start_servers(
    w: &Workdir,
    opts: &PlaygroundOptions,
    stored_active: Option<String>,
    etcd_ports: Option<Vec<(u16, u16)>>,
    tls: ServerTls,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Launcher, PlaygroundError> {
    progress(
        "starting MariaDB servers iad, pdx, reader (TLS with certificates of pki/, require_secure_transport=ON)",
    );
    let mut hopts = LauncherOptions::new(SITES);
    hopts.tls = Some(tls);
    hopts.dir = Some(w.dir.join("mysql"));
    hopts.graceful_shutdown = true;
    hopts.buffer_pool = "64M".into();
    if let Some(s) = &w.saved {
        hopts.ports = Some(s.mysql_ports.clone());
        hopts.accounts = Some(Accounts {
            admin: Credentials::new("root", ""),
            failover: Credentials::new(s.failover.0.clone(), s.failover.1.clone()),
            replication: Credentials::new(s.replication.0.clone(), s.replication.1.clone()),
            app: Credentials::new(s.app.0.clone(), s.app.1.clone()),
            clone: s.clone.clone().map_or_else(
                || Credentials::new("clone", bloodraven_launch::mysql::random_password()),
                |(u, p)| Credentials::new(u, p),
            ),
        });
    }
    // A kept playground restarts its servers read-only, then restores the site the stored
    // status (`stored_active`) names as active (a fresh one is wired from scratch below).
    // Every server boots read-only (`read_only=ON`), as docs/mysql.md recommends: a
    // restarted server takes no write before the operator decides it may.
    hopts.read_only_at_start = true;
    hopts.semi_sync_recovery =
        opts.replication == bloodraven_core::config::ReplicationMode::SemiSync;
    let mut harness = Launcher::start(hopts).await?;
    let fresh = !harness.was_initialised(0);
    if !fresh
        && let Some(active) = &stored_active
        && let Some(i) = SITES.iter().position(|s| s == active)
    {
        progress(&format!(
            "restoring {active} (the active site of the previous run) as writable"
        ));
        harness.admin(i)?.unfence().await?;
    }
    if fresh {
        wire_fresh(&mut harness, progress).await?;
    } else {
        progress("reusing the servers' data from the previous run");
        harness.create_accounts().await?;
    }
    let a = harness.accounts().clone();
    let saved = Saved {
        mysql_ports: (0..SITES.len()).map(|i| harness.port(i)).collect(),
        failover: (
            a.failover.user.clone(),
            a.failover.password.expose().to_string(),
        ),
        replication: (
            a.replication.user.clone(),
            a.replication.password.expose().to_string(),
        ),
        app: (a.app.user.clone(), a.app.password.expose().to_string()),
        clone: Some((a.clone.user.clone(), a.clone.password.expose().to_string())),
        store: opts.store,
        etcd_ports,
        tls: harness.server_tls().map(|t| SavedTls {
            ca: std::path::absolute(&t.ca).unwrap_or_else(|_| t.ca.clone()),
        }),
    };
    write_private(
        &w.saved_path,
        &serde_json::to_string_pretty(&saved).unwrap_or_default(),
    )?;
    Ok(harness)
}

/// A fresh set of servers: replication iad → pdx, reader, the accounts and the counter
/// table; then iad back to read-only, so the operator chooses and promotes the first primary.
async fn wire_fresh(
    harness: &mut Launcher,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(), PlaygroundError> {
    progress("wiring GTID replication iad → pdx, reader; creating accounts and the counter table");
    harness.wire(0).await?;
    let admin = harness.admin(0)?;
    for stmt in COUNTER_DDL {
        admin.execute(stmt).await?;
    }
    harness
        .wait_replicas_caught_up(0, Duration::from_secs(30))
        .await?;
    // Back to read-only: the operator chooses and promotes the first primary (every site
    // read-only, no active site yet: the most advanced candidate, iad).
    let outcome = harness.admin(0)?.fence(Duration::from_secs(5)).await;
    if outcome != bloodraven_mysql::FenceOutcome::Fenced {
        return Err(PlaygroundError::Other(format!(
            "could not set iad read-only before the operator's bootstrap: {outcome:?}"
        )));
    }
    progress("every site is read-only; the operator promotes the first primary");
    Ok(())
}

/// One loopback proxy per path that a scenario can cut: each site's MySQL, its sidecar, its
/// way to the operators' component listeners (`operator_ports`) and to each peer's sidecar.
async fn start_links(
    harness: &Launcher,
    operator_ports: &[u16],
    sidecar_ports: &[u16],
) -> Result<Vec<SiteLinks>, PlaygroundError> {
    let any = loopback(0);
    let proxy = async |name: String, to: u16| {
        LinkProxy::start(&name, any, loopback(to))
            .await
            .map_err(io("start a link proxy"))
    };
    let mut links = Vec::new();
    for (i, name) in SITES.iter().enumerate() {
        let mut to_peers = Vec::new();
        for (j, peer) in SITES.iter().enumerate() {
            if j != i {
                to_peers.push((
                    j,
                    proxy(format!("{name}-to-{peer}-sidecar"), sidecar_ports[j]).await?,
                ));
            }
        }
        let mut to_operators = Vec::new();
        for (j, port) in operator_ports.iter().enumerate() {
            to_operators.push(proxy(format!("{name}-operator-{}", j + 1), *port).await?);
        }
        links.push(SiteLinks {
            to_peers,
            to_operators,
            mysql: proxy(format!("{name}-mysql"), harness.port(i)).await?,
            replication: proxy(format!("{name}-replication"), harness.port(i)).await?,
            sidecar: proxy(format!("{name}-sidecar"), sidecar_ports[i]).await?,
        });
    }
    Ok(links)
}

/// The operator's options: the group on the links' ports, the playground's short timings.
fn operator_options(
    links: &[SiteLinks],
    opts: &PlaygroundOptions,
    operator_port: u16,
    deploy_port: u16,
    desk: &UpdateDesk,
) -> LocalOptions {
    let mut lo = LocalOptions::new(GROUP, ROLES.to_vec());
    lo.update = Some((desk.command(), "2m".into()));
    lo.namespace = NAMESPACE.into();
    lo.mysql_ports = Some(links.iter().map(|l| l.mysql.port()).collect());
    lo.replication_ports = Some(links.iter().map(|l| l.replication.port()).collect());
    lo.sidecar_urls = links
        .iter()
        .map(|l| format!("https://127.0.0.1:{}", l.sidecar.port()))
        .collect();
    lo.poll_interval = "1s".into();
    lo.failure_threshold = 3;
    lo.failover_cooldown = "5s".into();
    lo.drain_timeout = "5s".into();
    lo.max_lag_wait = "30s".into();
    lo.lease_timeout = "6s".into();
    lo.peer_check_interval = "2s".into();
    lo.replication_mode = opts.replication;
    lo.fencing = opts.fencing;
    lo.http_listen = loopback(operator_port);
    lo.https_listen = loopback(deploy_port);
    lo
}

/// The app account on loopback `port` (a server's, or the router's).
fn app_opts(harness: &Launcher, port: u16) -> mysql_async::Opts {
    let a = harness.accounts();
    mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .prefer_socket(false)
        .user(Some(a.app.user.clone()))
        .pass(Some(a.app.password.expose().to_string()))
        .db_name(Some("app"))
        // Over TLS, verified against the playground's CA (every connection reads it again:
        // `bloodraven_mysql::site::renewed`).
        .ssl_opts(bloodraven_mysql::site::ssl_opts(&harness.client_tls()))
        .into()
}

/// The counter app, writing through the app account and the router's primary port (the
/// servers' own ports tell which site a connection landed on).
fn counter_app(harness: &Launcher, operator_port: u16, router_port: u16) -> Arc<CounterApp> {
    let site = |name: &str, port: u16| AppSite {
        name: name.to_string(),
        host: "127.0.0.1".into(),
        port,
        opts: app_opts(harness, port),
    };
    let app_sites = (0..SITES.len())
        .map(|i| site(SITES[i], harness.port(i)))
        .collect();
    CounterApp::new(
        app_sites,
        Some(site("router", router_port)),
        &format!("http://127.0.0.1:{operator_port}"),
        NAMESPACE,
        GROUP,
    )
}

/// The component PKI in `dir` (`ca.crt`, `ca.key`, a certificate per site and the
/// operator's): the one a kept playground made before, or a new one.
fn component_pki(dir: &Path) -> Result<bloodraven_runtime::mtls::local::GroupPki, PlaygroundError> {
    use bloodraven_runtime::mtls::local::GroupPki;
    let pki_err = |e: bloodraven_runtime::pki::PkiError| {
        PlaygroundError::Other(format!("component PKI: {e}"))
    };
    let kept = dir.join(bloodraven_runtime::pki::CA_KEY).is_file()
        && SITES.iter().chain([&"operator", &MARIADB_CERT]).all(|s| {
            dir.join(format!("{s}.crt")).is_file() && dir.join(format!("{s}.key")).is_file()
        });
    if kept {
        return Ok(GroupPki {
            dir: dir.to_path_buf(),
            ca: bloodraven_runtime::pki::CaFiles::of(dir),
            namespace: NAMESPACE.into(),
            group: GROUP.into(),
        });
    }
    let _ = std::fs::remove_dir_all(dir);
    let pki =
        GroupPki::create(dir, NAMESPACE, GROUP, &SITES, SystemClock.now()).map_err(pki_err)?;
    // The MariaDB servers' certificate (`bloodraven tls issue --server --ip 127.0.0.1`).
    pki.issue_server(MARIADB_CERT, SystemClock.now())
        .map_err(pki_err)?;
    Ok(pki)
}

/// The stem of the MariaDB servers' certificate in `<dir>/pki/` (`mariadb.crt`, `.key`).
pub const MARIADB_CERT: &str = "mariadb";

/// What the playground's servers serve: the certificate of [`MARIADB_CERT`], and the component
/// CA bundle every client (and every replica) verifies it against.
fn server_tls(pki: &bloodraven_runtime::mtls::local::GroupPki) -> ServerTls {
    let f = pki.files(MARIADB_CERT);
    ServerTls {
        ca: f.ca,
        cert: f.cert,
        key: f.key,
    }
}

/// `port`, or a free one when it is 0.
fn port_or_free(port: u16) -> Result<u16, PlaygroundError> {
    if port == 0 { free_port() } else { Ok(port) }
}

impl Workdir {
    /// Checks that the printed ports are free and prepares the work directory, refusing a
    /// kept one that ran with the other store.
    fn for_start(opts: &PlaygroundOptions) -> Result<Workdir, PlaygroundError> {
        // The app's and the dashboard's ports are the caller's (`crate::run` holds them).
        for (port, what, flag) in [
            (opts.operator_port, "operator", "--operator-port"),
            (opts.deploy_port, "deploy API", "--deploy-port"),
            (opts.router_port, "router (HAProxy)", "--router-port"),
            (
                opts.router_replica_port,
                "router's replica port",
                "--router-replica-port",
            ),
        ] {
            check_port(port, what, flag)?;
        }
        let w = Workdir::prepare(opts)?;
        if let Some(saved) = &w.saved
            && saved.store != opts.store
        {
            return Err(PlaygroundError::Other(format!(
                "{} ran with --store {}; start it with --store {} again, or add --reset to start over",
                w.dir.display(),
                saved.store.as_str(),
                saved.store.as_str()
            )));
        }
        Ok(w)
    }
}

/// Starts the etcd members when the store is etcd, and reads the active site the store kept
/// from a previous run.
async fn start_control(
    w: &Workdir,
    opts: &PlaygroundOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(Option<bloodraven_launch::etcd::EtcdCluster>, Option<String>), PlaygroundError> {
    let etcd = match opts.store {
        StoreChoice::Embedded => None,
        StoreChoice::Etcd => {
            progress(&format!(
                "starting {} etcd members (Debian's etcd, private loopback ports)",
                crate::control::ETCD_MEMBERS
            ));
            let saved_ports = w.saved.as_ref().and_then(|s| s.etcd_ports.clone());
            Some(crate::control::start_etcd(&w.dir.join("etcd"), saved_ports).await?)
        }
    };
    let stored_active = match &etcd {
        Some(c) => stored_active_in_etcd(c.endpoints()).await,
        None => stored_active_site(&w.dir.join("operator/data")).await,
    };
    Ok((etcd, stored_active))
}

/// The loopback ports picked for one start.
struct ListenerPorts {
    /// Each operator's own HTTP and HTTPS ports.
    own: Vec<(u16, u16)>,
    /// Each site's sidecar.
    sidecar: Vec<u16>,
    /// Each operator's component listener.
    component: Vec<u16>,
}

impl ListenerPorts {
    /// Picks the ports, in this order: with one operator its own ports are the printed ones.
    fn pick(etcd: bool, operator_port: u16, deploy_port: u16) -> Result<Self, PlaygroundError> {
        // Each operator's own ports: the printed ones with one operator; private ones behind
        // the fronts with etcd.
        let own_ports: Vec<(u16, u16)> = if etcd {
            (0..2)
                .map(|_| Ok((free_port()?, free_port()?)))
                .collect::<Result<_, PlaygroundError>>()?
        } else {
            vec![(operator_port, deploy_port)]
        };
        let sidecar_ports: Vec<u16> = (0..SITES.len())
            .map(|_| free_port())
            .collect::<Result<_, _>>()?;
        // Each operator's component listener (mutual TLS): what the sidecars call.
        let component_ports: Vec<u16> = own_ports
            .iter()
            .map(|_| free_port())
            .collect::<Result<_, _>>()?;
        Ok(ListenerPorts {
            own: own_ports,
            sidecar: sidecar_ports,
            component: component_ports,
        })
    }
}

/// Creates the update desk and writes each operator's configuration, TLS files and token key;
/// returns the desk, the first operator's files and every operator's process (not yet
/// started).
fn operator_procs(
    w: &Workdir,
    opts: &PlaygroundOptions,
    harness: &Launcher,
    links: &[SiteLinks],
    pki: &bloodraven_runtime::mtls::local::GroupPki,
    etcd: Option<&bloodraven_launch::etcd::EtcdCluster>,
    ports: &ListenerPorts,
) -> Result<(UpdateDesk, LocalFiles, Vec<OperatorProc>), PlaygroundError> {
    let desk = UpdateDesk::new(&w.dir.join("update-desk")).map_err(io("create the update desk"))?;
    let own_ports = &ports.own;
    let component_ports = &ports.component;
    let mut lo = operator_options(links, opts, own_ports[0].0, own_ports[0].1, &desk);
    lo.component = Some((loopback(component_ports[0]), pki.files("operator")));
    // Backups go to `<dir>/backups/` (or the bucket asked for), taken only when asked for
    // (`bloodraven backup now`, chaos `backup`): the playground's start stays light.
    lo.backup_schedule.clone_from(&opts.backup_schedule);
    lo.backup_retention_count = opts.backup_retention_count;
    if let Some(s3) = &opts.backup_s3 {
        lo.backup_target = Some(s3.target.clone());
        lo.backup_s3 = Some((s3.endpoint.clone(), s3.credentials_file.clone()));
    } else {
        let backups = w.dir.join("backups");
        std::fs::create_dir_all(&backups).map_err(io("create the backups directory"))?;
        lo.backup_target = Some(format!("file://{}", backups.display()));
    }
    if let Some(c) = etcd {
        lo.etcd_endpoints = c.endpoints();
        lo.etcd_lease_ttl = crate::control::ETCD_LEASE_TTL.into();
    }
    let files = write_files(&w.dir.join("operator"), harness, &lo)?;
    let mut operators = vec![
        OperatorProc::new(
            "operator-1",
            files.clone(),
            own_ports[0].0,
            own_ports[0].1,
            w.dir.join("logs/operator.log"),
        )
        .with_failpoints(opts.failpoints.clone()),
    ];
    for (i, &(http, https)) in own_ports.iter().enumerate().skip(1) {
        let name = format!("operator-{}", i + 1);
        lo.http_listen = loopback(http);
        lo.https_listen = loopback(https);
        lo.component = Some((loopback(component_ports[i]), pki.files("operator")));
        let peer = write_peer_files(&w.dir.join(&name), harness, &lo, &files)?;
        let log = w.dir.join(format!("logs/{name}.log"));
        operators.push(
            OperatorProc::new(&name, peer, http, https, log)
                .with_failpoints(opts.failpoints.clone()),
        );
    }
    Ok((desk, files, operators))
}

/// Starts HAProxy in front of the sites' servers, checking `/primary` on every sidecar.
async fn start_router(
    w: &Workdir,
    harness: &Launcher,
    sidecar_ports: &[u16],
    pki: &bloodraven_runtime::mtls::local::GroupPki,
    router_port: u16,
    router_replica_port: u16,
) -> Result<crate::router::Router, PlaygroundError> {
    let routed: Vec<crate::router::RoutedSite> = SITES
        .iter()
        .enumerate()
        .map(|(i, name)| crate::router::RoutedSite {
            name: (*name).to_string(),
            mysql_port: harness.port(i),
            sidecar_port: sidecar_ports[i],
            reader: ROLES[i] == SiteRole::ReadOnly,
        })
        .collect();
    let router = crate::router::Router::start(
        &w.dir,
        &routed,
        router_port,
        router_replica_port,
        &pki.ca.cert,
        open_log(&w.dir.join("logs/haproxy.log"))?,
    )
    .await?;
    Ok(router)
}

impl Playground {
    /// Starts everything, reporting progress through `progress`: the servers, the links, the
    /// operator (which bootstraps the group), the sidecars, then the counter app once the
    /// deploy API calls the group stable.
    pub async fn start(
        opts: PlaygroundOptions,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Arc<Playground>, PlaygroundError> {
        let w = Workdir::for_start(&opts)?;
        let (etcd, stored_active) = start_control(&w, &opts, progress).await?;
        let etcd_ports = etcd.as_ref().map(crate::control::member_ports);
        progress("writing the component CA and certificates (pki/)");
        let pki = component_pki(&w.dir.join("pki"))?;
        let harness = start_servers(
            &w,
            &opts,
            stored_active,
            etcd_ports,
            server_tls(&pki),
            progress,
        )
        .await?;

        progress("starting the network links (loopback proxies that can be cut)");
        let operator_port = port_or_free(opts.operator_port)?;
        let deploy_port = port_or_free(opts.deploy_port)?;
        let ports = ListenerPorts::pick(etcd.is_some(), operator_port, deploy_port)?;
        let links = start_links(&harness, &ports.component, &ports.sidecar).await?;

        progress("writing the operator's configuration, TLS certificates and token key");
        let (desk, files, operators) =
            operator_procs(&w, &opts, &harness, &links, &pki, etcd.as_ref(), &ports)?;
        let own_ports = ports.own;
        let sidecar_ports = ports.sidecar;
        let fronts = match &etcd {
            Some(_) => Some(Arc::new(
                Fronts::start(operator_port, deploy_port, own_ports.clone()).await?,
            )),
            None => None,
        };
        let key = SigningKey::load(&files.token_key)
            .map_err(|e| PlaygroundError::Other(e.to_string()))?;
        let store = open_store(&files.config).await?;
        progress("starting the router (HAProxy: /primary checked on every sidecar every 100 ms)");
        let router_port = port_or_free(opts.router_port)?;
        let router_replica_port = port_or_free(opts.router_replica_port)?;
        let router = start_router(
            &w,
            &harness,
            &sidecar_ports,
            &pki,
            router_port,
            router_replica_port,
        )
        .await?;
        let counter = counter_app(&harness, operator_port, router_port);
        let router_opts = app_opts(&harness, router_port);

        let pg = Arc::new(Playground {
            dir: w.dir.clone(),
            keep: w.keep,
            files,
            pki,
            harness: Mutex::new(harness),
            desk,
            updates_served: std::sync::atomic::AtomicU32::new(0),
            links,
            sidecar_ports,
            operator_addrs: operators
                .iter()
                .map(|o| (o.name.clone(), format!("127.0.0.1:{}", o.http)))
                .collect(),
            operators: Mutex::new(operators),
            etcd_urls: etcd
                .as_ref()
                .map(bloodraven_launch::etcd::EtcdCluster::endpoints)
                .unwrap_or_default(),
            etcd: etcd.map(|c| Arc::new(Mutex::new(c))),
            fronts,
            sidecars: Mutex::new((0..SITES.len()).map(|_| None).collect()),
            counter,
            router: Mutex::new(Some(router)),
            router_opts,
            store,
            key,
            lease: Mutex::new(None),
            app_addr: loopback(opts.app_port),
            dashboard_addr: loopback(opts.dashboard_port),
            opts: PlaygroundOptions {
                operator_port,
                deploy_port,
                router_port,
                router_replica_port,
                ..opts
            },
        });
        pg.bring_up(progress).await?;
        Ok(pg)
    }

    /// `bloodraven apply` of the first operator's file: the group and its database into the
    /// store (a restarted playground finds them unchanged).
    async fn apply_documents(
        &self,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<(), PlaygroundError> {
        let docs = bloodraven_operator::config::load_documents(&self.files.config)
            .map_err(|e| PlaygroundError::Other(format!("apply: {e}")))?;
        let now = bloodraven_runtime::clock::system().now();
        let planned = bloodraven_operator::apply::plan(&*self.store, &docs, now)
            .await
            .map_err(|e| PlaygroundError::Other(format!("apply: {e}")))?;
        for p in &planned {
            progress(&format!("  {p}"));
        }
        bloodraven_operator::apply::apply(&*self.store, &planned)
            .await
            .map_err(|e| PlaygroundError::Other(format!("apply: {e}")))?;
        Ok(())
    }

    /// The operator, then the sidecars, then the counter app (once the group is stable).
    async fn bring_up(
        self: &Arc<Self>,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<(), PlaygroundError> {
        if let Some(f) = &self.fronts {
            // The store is the truth with etcd: the group and its database are applied once,
            // as `bloodraven apply -f operator/bloodraven.yaml` would (both files name them).
            progress("applying the group and its database to etcd (bloodraven apply)");
            self.apply_documents(progress).await?;
            tokio::spawn(Fronts::keep_following(Arc::downgrade(f)));
            progress("starting two operators on etcd (the printed ports follow whichever leads)");
        } else {
            progress("starting the operator");
        }
        self.start_operator().await?;
        progress("waiting for the operator to confirm the active site");
        let active = self.wait_active(Duration::from_secs(60)).await?;
        progress("waiting for the replicas to replicate through the links");
        self.wait_linked(&active, Duration::from_secs(30)).await?;
        progress("starting one sidecar per site");
        for i in 0..SITES.len() {
            self.start_sidecar(i).await?;
        }
        progress("waiting for the deploy API to call the group stable");
        self.wait_stable(Duration::from_secs(60)).await?;
        tokio::spawn(self.counter.clone().follow());
        tokio::spawn(self.counter.clone().write_continuously());
        tokio::spawn(Self::serve_updates(Arc::downgrade(self)));
        Ok(())
    }

    /// Answers the sites' update command (an ordered update's): restarts the server asked
    /// for with the next setting, until the playground is gone.
    async fn serve_updates(pg: std::sync::Weak<Playground>) {
        loop {
            let Some(p) = pg.upgrade() else { return };
            if !p.desk.pending().is_empty() {
                let mut h = p.harness.lock().await;
                let served = p
                    .desk
                    .serve(&mut h, |_| {
                        let n = p
                            .updates_served
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        vec![format!(
                            "--max-connections={}",
                            FIRST_MAX_CONNECTIONS + n + 1
                        )]
                    })
                    .await;
                drop(h);
                for site in served {
                    tracing::info!(site = %site, "playground: restarted for its update");
                }
            }
            drop(p);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Requests an ordered update of the group (as `bloodraven update` does), refused here
    /// by the operator's own rules when another operation runs.
    pub async fn ordered_update(&self) -> Result<String, PlaygroundError> {
        let status = self.stored_status().await?;
        let id = format!("playground-{}", SystemClock.now().unix_millis());
        let updatable: Vec<bloodraven_core::update::Updatable> = SITES
            .iter()
            .map(|s| bloodraven_core::update::Updatable {
                site: (*s).to_string(),
                timeout: Duration::from_secs(120),
            })
            .collect();
        if let bloodraven_core::update::Request::Reject(n) =
            bloodraven_core::update::request(&id, &status, &updatable, SystemClock.now())
        {
            return Err(PlaygroundError::Other(format!("refused: {}", n.message)));
        }
        self.annotate(bloodraven_core::contract::annotations::ORDERED_UPDATE, &id)
            .await?;
        Ok(format!("requested ordered update {id}"))
    }

    /// The group's stored status.
    pub async fn stored_status(
        &self,
    ) -> Result<bloodraven_core::status::GroupStatus, PlaygroundError> {
        let k = ObjectKey::new(KIND_GROUP, NAMESPACE, GROUP);
        match self.store.get(&k).await {
            Ok(Some(o)) => Ok(o
                .decode::<bloodraven_core::resources::FailoverGroupBody>()
                .map_err(|e| PlaygroundError::Other(e.to_string()))?
                .status),
            Ok(None) => Err(PlaygroundError::Other(
                "the group is not in the store yet".into(),
            )),
            Err(e) => Err(PlaygroundError::Other(e.to_string())),
        }
    }

    /// The group's stored status as JSON, `Null` while the group is not stored (or cannot be
    /// read): what stories and benches poll for a phase, in the wire's own field names.
    pub async fn status_value(&self) -> serde_json::Value {
        self.store
            .get(&ObjectKey::new(KIND_GROUP, NAMESPACE, GROUP))
            .await
            .ok()
            .flatten()
            .and_then(|o| o.body.get("status").cloned())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Polls [`Playground::status_value`] every 20 ms until `pred` holds (`Ok` with that
    /// status) or `limit` passes (`Err` with the last status seen).
    pub async fn wait_status(
        &self,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value, serde_json::Value> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let s = self.status_value().await;
            if pred(&s) {
                return Ok(s);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(s);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the deploy API's observation of the group says `stable` (what a
    /// `bloodraven deploy migrate` started from the printed lines checks first), so the
    /// playground says it is ready only when a pipeline would be admitted.
    async fn wait_stable(&self, limit: Duration) -> Result<(), PlaygroundError> {
        let token_path = self.dir.join("operator/playground.token");
        write_private(&token_path, &self.token()?)?;
        let api = HttpLeaseApi::new(
            &self.deploy_url(),
            &self.files.pki.ca_cert,
            &token_path,
            GROUP,
            Duration::from_secs(5),
        )
        .map_err(|e| PlaygroundError::Other(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + limit;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            match api.observe().await {
                Ok(o) if o.stable => return Ok(()),
                Ok(o) => last = format!("unstable: {}", o.unstable_reason),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(PlaygroundError::Other(format!(
            "the deploy API did not call the group stable within {} s ({last})",
            limit.as_secs()
        )))
    }

    fn operator_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.opts.operator_port)
    }

    pub fn deploy_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.opts.deploy_port)
    }

    /// Starts (or restarts) the operator processes that do not run, and waits until one
    /// leads with its groups loaded (with etcd, the fronts then send to it).
    pub async fn start_operator(&self) -> Result<(), PlaygroundError> {
        let mut ops = self.operators.lock().await;
        for op in ops.iter_mut() {
            op.spawn(&self.opts.exe)?;
        }
        let ports: Vec<u16> = ops.iter().map(|o| o.http).collect();
        let logs: Vec<String> = ops.iter().map(|o| o.log.display().to_string()).collect();
        drop(ops);
        let http = crate::control::check_client();
        for _ in 0..300 {
            for (i, port) in ports.iter().enumerate() {
                if crate::control::leads(&http, *port).await {
                    if let Some(f) = &self.fronts {
                        f.follow(i);
                    }
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ends = logs
            .iter()
            .map(|l| {
                format!(
                    "{l}:\n{}",
                    bloodraven_runtime::files::tail(Path::new(l), 15)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        Err(PlaygroundError::OperatorNotReady(30, logs.join(", "), ends))
    }

    /// Stops every operator process (SIGTERM).
    pub async fn stop_operator(&self) {
        for op in self.operators.lock().await.iter_mut() {
            op.stop().await;
        }
    }

    /// The leading operator's index: the one the fronts follow (etcd), else the one operator.
    fn leading_index(&self) -> usize {
        self.fronts.as_ref().and_then(|f| f.followed()).unwrap_or(0)
    }

    /// The leading operator process's pid, while it runs (for fault injection: pause, kill);
    /// with etcd, the one the printed ports follow.
    pub async fn operator_pid(&self) -> Option<u32> {
        let i = self.leading_index();
        self.operators
            .lock()
            .await
            .get_mut(i)
            .and_then(OperatorProc::pid)
    }

    /// SIGKILLs the leading operator process and reaps it: a crash mid-operation, for the
    /// restart stories. Returns its pid; `None` when it does not run.
    pub async fn kill_operator(&self) -> Option<u32> {
        let i = self.leading_index();
        let mut ops = self.operators.lock().await;
        let op = ops.get_mut(i)?;
        let pid = op.pid()?;
        op.kill().await;
        Some(pid)
    }

    /// SIGKILLs the operator process named `name` (`operator-2`) and reaps it, leading or
    /// not. Returns its pid; `None` when it does not run.
    pub async fn kill_operator_named(&self, name: &str) -> Option<u32> {
        let mut ops = self.operators.lock().await;
        let op = ops.iter_mut().find(|o| o.name == name)?;
        let pid = op.pid()?;
        op.kill().await;
        Some(pid)
    }

    /// The configuration file of the operator process named `name`.
    pub async fn operator_config(&self, name: &str) -> Option<PathBuf> {
        self.operators
            .lock()
            .await
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.files.config.clone())
    }

    /// The plain-HTTP port of the operator process named `name`.
    pub async fn operator_http_port(&self, name: &str) -> Option<u16> {
        self.operators
            .lock()
            .await
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.http)
    }

    /// The name of the operator process that leads now (`--store etcd`), if one does.
    pub async fn leading_operator(&self) -> Option<String> {
        let http = crate::control::check_client();
        let ops: Vec<(String, u16)> = self
            .operators
            .lock()
            .await
            .iter()
            .map(|o| (o.name.clone(), o.http))
            .collect();
        for (name, port) in ops {
            if crate::control::leads(&http, port).await {
                return Some(name);
            }
        }
        None
    }

    /// SIGKILLs the operator that leads (`--store etcd`): the standby takes the group over
    /// once the leader's etcd lease runs out.
    pub async fn kill_leading_operator(&self) -> Result<String, PlaygroundError> {
        if self.fronts.is_none() {
            return Err(PlaygroundError::Other(
                "kill-leading-operator needs a playground started with --store etcd (the embedded store has one operator: stop-operator stops it)".into(),
            ));
        }
        let http = crate::control::check_client();
        let mut ops = self.operators.lock().await;
        for op in ops.iter_mut() {
            if op.running() && crate::control::leads(&http, op.http).await {
                let pid = op.pid().unwrap_or_default();
                op.kill().await;
                return Ok(format!(
                    "killed {} (the leader, pid {pid}) with SIGKILL: the other operator leads once its etcd lease ({}) runs out",
                    op.name,
                    crate::control::ETCD_LEASE_TTL
                ));
            }
        }
        Err(PlaygroundError::Other("no operator leads right now".into()))
    }

    /// Site `i`'s sidecar process's pid, while it runs.
    pub async fn sidecar_pid(&self, i: usize) -> Option<u32> {
        self.sidecars
            .lock()
            .await
            .get(i)
            .and_then(Option::as_ref)
            .and_then(Child::id)
    }

    /// Whether any operator process runs.
    pub async fn operator_running(&self) -> bool {
        self.operators
            .lock()
            .await
            .iter_mut()
            .any(OperatorProc::running)
    }

    /// The etcd members, or the error a chaos action on them gets without etcd.
    fn etcd(&self, action: &str) -> Result<&SharedEtcd, PlaygroundError> {
        self.etcd.as_ref().ok_or_else(|| {
            PlaygroundError::Other(format!(
                "{action} needs a playground started with --store etcd"
            ))
        })
    }

    /// Stops one etcd member (`SIGTERM`): `which` (`m0`, `m1`, `m2`), else a running one that
    /// does not lead. The operators work on while a quorum (two of three) runs.
    pub async fn stop_etcd_member(&self, which: Option<&str>) -> Result<String, PlaygroundError> {
        let mut c = self.etcd("stop-etcd-member")?.lock().await;
        let leader = c.leader().await;
        let i = match which {
            Some(name) => (0..c.len()).find(|&i| c.name(i) == name).ok_or_else(|| {
                PlaygroundError::Other(format!(
                    "no etcd member {name:?} (members: {})",
                    (0..c.len())
                        .map(|i| c.name(i).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
            None => (0..c.len())
                .find(|&i| c.running(i) && Some(i) != leader)
                .or_else(|| (0..c.len()).find(|&i| c.running(i)))
                .ok_or_else(|| PlaygroundError::Other("no etcd member runs".into()))?,
        };
        Ok(stop_member(&mut c, i, leader).await)
    }

    /// Stops the member the others follow.
    pub async fn stop_etcd_leader(&self) -> Result<String, PlaygroundError> {
        let mut c = self.etcd("stop-etcd-leader")?.lock().await;
        let Some(leader) = c.leader().await else {
            return Err(PlaygroundError::Other(
                "the etcd members follow no leader right now (no quorum?)".into(),
            ));
        };
        Ok(stop_member(&mut c, leader, Some(leader)).await)
    }

    /// Starts every stopped etcd member again, on its data.
    pub async fn start_etcd_members(&self) -> Result<String, PlaygroundError> {
        let mut c = self.etcd("start-etcd")?.lock().await;
        let started = c
            .start_stopped()
            .await
            .map_err(|e| PlaygroundError::Etcd(e.to_string()))?;
        if started.is_empty() {
            return Ok("every etcd member runs already".into());
        }
        let names: Vec<String> = started.iter().map(|&i| c.name(i).to_string()).collect();
        Ok(format!("started etcd member(s) {}", names.join(", ")))
    }

    /// With etcd: the members' client URLs.
    pub fn etcd_endpoints(&self) -> Option<&[String]> {
        self.etcd.as_ref().map(|_| self.etcd_urls.as_slice())
    }

    /// Every operator's name and own plain-HTTP address.
    pub fn operator_addresses(&self) -> &[(String, String)] {
        &self.operator_addrs
    }

    /// The control plane for the dashboard: the store, every operator (running, leading) and
    /// the etcd members (running, the one the others follow).
    pub async fn control_view(&self) -> serde_json::Value {
        let leading = self.leading_index();
        let running: Vec<(String, u16, bool)> = {
            let mut ops = self.operators.lock().await;
            ops.iter_mut()
                .map(|o| (o.name.clone(), o.http, o.running()))
                .collect()
        };
        // What each operator says of its control plane (`/readyz`: the leader it sees, and
        // why it cannot lead, e.g. no etcd quorum).
        let http = crate::control::check_client();
        let said = futures::future::join_all(running.iter().map(|(_, port, up)| {
            let http = http.clone();
            let url = format!("http://127.0.0.1:{port}/readyz");
            async move {
                if !*up {
                    return serde_json::Value::Null;
                }
                match http.get(url).send().await {
                    Ok(r) => r.json::<serde_json::Value>().await.unwrap_or_default(),
                    Err(_) => serde_json::Value::Null,
                }
            }
        }))
        .await;
        let operators: Vec<serde_json::Value> = running
            .iter()
            .zip(said)
            .enumerate()
            .map(|(i, ((name, port, up), said))| {
                serde_json::json!({
                    "name": name,
                    "http": format!("127.0.0.1:{port}"),
                    "running": up,
                    "leading": said["leader"] == true && said["loaded"] == true,
                    "followedByTheFronts": self.fronts.is_some() && i == leading,
                    "problem": said["control"]["problem"],
                })
            })
            .collect();
        let members: Vec<serde_json::Value> = match &self.etcd {
            None => Vec::new(),
            Some(e) => {
                let mut c = e.lock().await;
                let leader = c.leader().await;
                (0..c.len())
                    .map(|i| {
                        serde_json::json!({
                            "name": c.name(i),
                            "endpoint": c.endpoint(i),
                            "running": c.running(i),
                            "leader": leader == Some(i),
                        })
                    })
                    .collect()
            }
        };
        let quorum = members.iter().filter(|m| m["running"] == true).count() * 2 > members.len();
        serde_json::json!({
            "store": self.opts.store.as_str(),
            "operators": operators,
            "etcd": members,
            "etcdQuorum": self.etcd.is_some().then_some(quorum),
        })
    }

    async fn wait_active(&self, limit: Duration) -> Result<String, PlaygroundError> {
        let url = format!(
            "{}/active-site?namespace={NAMESPACE}&group={GROUP}",
            self.operator_url()
        );
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
                && let Ok(v) = r.json::<serde_json::Value>().await
                && let Some(site) = v["activeSite"].as_str().filter(|s| !s.is_empty())
            {
                return Ok(site.to_string());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(PlaygroundError::Other(
            "the operator confirmed no active site in time".into(),
        ))
    }

    /// Waits until every other site replicates from `active` through its link (the operator
    /// re-points the replicas wired directly at setup on its first polls): until then, cutting
    /// the active site's link would not cut its replication.
    async fn wait_linked(&self, active: &str, limit: Duration) -> Result<(), PlaygroundError> {
        let a = Self::site_index(active)?;
        let port = self.links[a].replication.port();
        let clients: Vec<_> = {
            let h = self.harness.lock().await;
            (0..SITES.len())
                .filter(|&i| i != a)
                .map(|i| h.failover_client(i))
                .collect()
        };
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let mut linked = true;
            for c in &clients {
                let ok = c.probe().await.is_ok_and(|p| {
                    p.replica
                        .is_some_and(|r| r.source_port == port && (r.io_running || r.io_connecting))
                });
                linked &= ok;
            }
            if linked {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PlaygroundError::Other(format!(
                    "the replicas did not replicate from {active} through its link within {} s",
                    limit.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts site `i`'s sidecar process.
    pub async fn start_sidecar(&self, i: usize) -> Result<(), PlaygroundError> {
        let mut slots = self.sidecars.lock().await;
        if slots[i]
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
        {
            return Ok(());
        }
        let port = self.harness.lock().await.port(i);
        let log = open_log(&self.dir.join(format!("logs/sidecar-{}.log", SITES[i])))?;
        let mut cmd = Command::new(&self.opts.exe);
        cmd.args([
            "sidecar",
            "--site",
            SITES[i],
            "--group",
            GROUP,
            "--namespace",
            NAMESPACE,
        ])
        .arg("--operator")
        .arg(
            self.links[i]
                .to_operators
                .iter()
                .map(|l| format!("https://127.0.0.1:{}", l.port()))
                .collect::<Vec<_>>()
                .join(","),
        )
        .arg("--mysql")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--mysql-credentials-file")
        .arg(&self.files.site_credentials)
        // Backups with the clone account (it holds RELOAD, PROCESS, LOCK TABLES,
        // BINLOG MONITOR and SLAVE MONITOR).
        .arg("--backup-credentials-file")
        .arg(&self.files.clone_credentials)
        // Its server over TLS, verified against the playground's CA.
        .arg("--mysql-tls-ca")
        .arg(&self.pki.ca.cert)
        .args(["--lease-timeout", "6s", "--peer-check-interval", "2s"])
        .arg("--operator-public-key")
        .arg(&self.files.topology_public_key)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", self.sidecar_ports[i]))
        .env("BLOODRAVEN_LOG_FORMAT", "json");
        let tls = self.pki.files(SITES[i]);
        cmd.arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key)
            .arg("--tls-ca")
            .arg(&tls.ca);
        for (_, l) in &self.links[i].to_peers {
            cmd.arg("--peer")
                .arg(format!("https://127.0.0.1:{}", l.port()));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(io("start a sidecar"))?;
        slots[i] = Some(child);
        Ok(())
    }

    pub fn site_index(name: &str) -> Result<usize, PlaygroundError> {
        SITES.iter().position(|s| *s == name).ok_or_else(|| {
            PlaygroundError::Other(format!("no site {name:?} (sites: {})", SITES.join(", ")))
        })
    }

    /// SIGKILLs a site's `mariadbd`.
    pub async fn kill_site(&self, name: &str) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        self.harness.lock().await.kill(i)?;
        Ok(format!("killed {name}'s mariadbd (SIGKILL)"))
    }

    /// Starts a killed site's `mariadbd` again: read-only, as every playground server boots
    /// (the operator re-points it, or blocks it if it holds transactions the group lacks), or
    /// with `writable`, as a server without `read_only=ON` in its configuration would (the
    /// crash case: watch the operator and its sidecar fence it).
    pub async fn restart_site(
        &self,
        name: &str,
        writable: bool,
    ) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        let mut h = self.harness.lock().await;
        if h.is_running(i) {
            return Ok(format!("{name}'s mariadbd is already running"));
        }
        if writable {
            h.restart_writable(i).await?;
            Ok(format!(
                "restarted {name}'s mariadbd writable (read_only=OFF): it is fenced as soon as it is seen"
            ))
        } else {
            h.restart(i).await?;
            Ok(format!("restarted {name}'s mariadbd read-only"))
        }
    }

    /// The links with site `i` at one end: its own, and every peer's link to it.
    fn links_of(&self, i: usize) -> impl Iterator<Item = &LinkProxy> {
        self.links[i].all().chain(
            self.links
                .iter()
                .flat_map(|l| l.to_peers.iter())
                .filter(move |(j, _)| *j == i)
                .map(|(_, l)| l),
        )
    }

    /// Cuts every link of a site, both directions: the operator ↔ its MySQL and its sidecar,
    /// its sidecar ↔ every peer's sidecar, and replication to and from its MySQL.
    pub fn isolate_site(&self, name: &str) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        for l in self.links_of(i) {
            l.cut();
        }
        Ok(format!(
            "isolated {name}: every link to and from the operator and its peers is cut"
        ))
    }

    /// Heals every link of a site, and whatever [`Self::isolate_site_from_operator`] and
    /// [`Self::isolate_site_from_peers`] cut.
    pub fn heal_site(&self, name: &str) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        for l in self.links_of(i) {
            l.heal();
        }
        Ok(format!("healed {name}'s links"))
    }

    /// Cuts a site from the operator only: the operator's connections to its MySQL, the
    /// operator ↔ its sidecar. Its peers' sidecars and the replicas still reach it, as in a
    /// partition between the operator's network and the site's.
    pub fn isolate_site_from_operator(&self, name: &str) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        let l = &self.links[i];
        l.sidecar.cut();
        for o in &l.to_operators {
            o.cut();
        }
        l.mysql.cut();
        Ok(format!(
            "isolated {name} from the operator: its peers and the replicas still reach it"
        ))
    }

    /// Cuts a site from its peers only: its sidecar ↔ every peer's sidecar, and the replicas'
    /// replication connections to its MySQL. The operator still reaches it.
    pub fn isolate_site_from_peers(&self, name: &str) -> Result<String, PlaygroundError> {
        let i = Self::site_index(name)?;
        let outgoing = self.links[i].to_peers.iter().map(|(_, l)| l);
        let incoming = self
            .links
            .iter()
            .flat_map(|s| s.to_peers.iter())
            .filter(|(j, _)| *j == i)
            .map(|(_, l)| l);
        for l in outgoing.chain(incoming) {
            l.cut();
        }
        // And the replicas' way to its server (its replication link).
        self.links[i].replication.cut();
        Ok(format!(
            "isolated {name} from its peers: no sidecar of another site and no replica reaches it; the operator still does"
        ))
    }

    /// Cuts the operator from every site: its connections to every MySQL, the operator ↔ every
    /// sidecar. The sites still reach each other.
    pub fn isolate_operator(&self) -> String {
        self.operator_links(true);
        "isolated the operator: it reaches no site, and no sidecar reaches it".into()
    }

    /// Heals what [`Self::isolate_operator`] cut.
    pub fn heal_operator(&self) -> String {
        self.operator_links(false);
        "healed the operator's links".into()
    }

    /// Cuts or heals every link between the operator and the sites: each sidecar's, the
    /// operator's from each sidecar, and the operator's MySQL account.
    fn operator_links(&self, cut: bool) {
        for l in &self.links {
            for p in [&l.sidecar, &l.mysql].into_iter().chain(&l.to_operators) {
                if cut { p.cut() } else { p.heal() }
            }
        }
    }

    /// Whether any of site `i`'s links is cut, wholly or for the operator or the replicas.
    pub fn isolated(&self, i: usize) -> bool {
        let l = &self.links[i];
        l.mysql.is_cut()
            || l.replication.is_cut()
            || l.sidecar.is_cut()
            || l.to_peers.iter().any(|(_, p)| p.is_cut())
    }

    async fn annotate(&self, key: &str, value: &str) -> Result<(), PlaygroundError> {
        let k = ObjectKey::new(KIND_GROUP, NAMESPACE, GROUP);
        match bloodraven_store::set_annotation(self.store.as_ref(), &k, key, value).await {
            Ok(_) => Ok(()),
            Err(bloodraven_store::StoreError::NotFound { .. }) => Err(PlaygroundError::Other(
                "the group is not in the store yet".into(),
            )),
            Err(e) => Err(PlaygroundError::Other(e.to_string())),
        }
    }

    /// Requests a planned failover (as `bloodraven failover` does).
    pub async fn planned_failover(&self, to: &str) -> Result<String, PlaygroundError> {
        Self::site_index(to)?;
        self.annotate(PLANNED_FAILOVER, to).await?;
        Ok(format!("requested a planned failover to {to}"))
    }

    /// Measures a planned switchover to `to` (default: the other primary candidate) as an
    /// application behind the router sees it ([`crate::measure`]).
    pub async fn measure_switchover(
        &self,
        to: Option<&str>,
    ) -> Result<crate::measure::SwitchoverGap, PlaygroundError> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let other = |e: String| PlaygroundError::Other(format!("measure-switchover: {e}"));
        let from = self.stored_status().await?.active_site;
        let to = match to {
            Some(t) => t.to_string(),
            None => SITES
                .iter()
                .zip(ROLES)
                .find(|(s, r)| **s != from && *r == SiteRole::PrimaryCandidate)
                .map(|(s, _)| (*s).to_string())
                .ok_or_else(|| other("no other primary candidate".into()))?,
        };
        Self::site_index(&to)?;
        if to == from {
            return Err(other(format!("{to} is the active site already")));
        }
        let first = crate::measure::next_first_id(&self.router_opts)
            .await
            .map_err(|e| other(e.to_string()))?;
        let halt = Arc::new(AtomicBool::new(false));
        let writer = crate::measure::spawn_writer(self.router_opts.clone(), first, halt.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let asked = tokio::time::Instant::now();
        self.planned_failover(&to).await?;
        let deadline = asked + Duration::from_secs(60);
        let outcome = loop {
            let s = self.stored_status().await?;
            if let Some(p) = s.planned_failover.as_ref().filter(|p| p.target == to)
                && p.phase.is_terminal()
            {
                break (p.phase, p.message.clone());
            }
            if tokio::time::Instant::now() > deadline {
                break (
                    bloodraven_core::status::PlannedFailoverPhase::Failed,
                    "not finished within 60 s".into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Writes go on for a second after, so the gap includes the router's move.
        tokio::time::sleep(Duration::from_secs(1)).await;
        halt.store(true, Ordering::Relaxed);
        let acked = writer.await.map_err(|e| other(e.to_string()))?;
        if outcome.0 != bloodraven_core::status::PlannedFailoverPhase::Succeeded {
            return Err(other(format!(
                "the switchover to {to} ended {}: {}",
                outcome.0.as_str(),
                outcome.1
            )));
        }
        let lost = crate::measure::lost(&self.router_opts, &acked)
            .await
            .map_err(|e| other(e.to_string()))?;
        Ok(crate::measure::SwitchoverGap {
            from,
            to,
            gap: crate::measure::longest_pause(&acked, asked).unwrap_or(Duration::MAX),
            acknowledged: acked.len(),
            lost,
        })
    }

    /// Requests a reclone of `name` (as `bloodraven site reclone` does), confirmed with what
    /// the stored status shows it would discard (the dashboard's button on a blocked site).
    pub async fn reclone_site(&self, name: &str) -> Result<String, PlaygroundError> {
        Self::site_index(name)?;
        let status = self.stored_status().await?;
        let shown = status.site(name).cloned().unwrap_or_default();
        let confirm = bloodraven_core::reclone::Confirmation::of(&shown).shortest();
        let confirm = if confirm.is_empty() {
            name.to_string()
        } else {
            confirm
        };
        let sites: Vec<String> = SITES.iter().map(|s| (*s).to_string()).collect();
        bloodraven_core::reclone::admit(name, &confirm, &status, &sites)
            .map_err(|r| PlaygroundError::Other(format!("refused: {r}")))?;
        self.annotate(
            bloodraven_core::contract::annotations::RECLONE_SITE,
            &bloodraven_core::reclone::request_value(name, &confirm),
        )
        .await?;
        Ok(format!(
            "requested a reclone of {name} (confirmed with {confirm:?})"
        ))
    }

    /// Asks for a backup now (as `bloodraven backup now` does): the operator takes it on the
    /// healthiest replica, into the group's target (`<dir>/backups/` by default).
    pub async fn backup(&self) -> Result<String, PlaygroundError> {
        let status = self.stored_status().await?;
        if let Some(b) = status
            .backups
            .as_ref()
            .and_then(bloodraven_core::status::BackupsStatus::running)
        {
            return Err(PlaygroundError::Other(format!(
                "refused: backup {} is running on {} (one at a time)",
                b.id, b.site
            )));
        }
        let id = bloodraven_core::backup::backup_id(GROUP, SystemClock.now());
        self.annotate(bloodraven_core::contract::annotations::BACKUP_NOW, &id)
            .await?;
        Ok(format!("requested backup {id}"))
    }

    /// Revokes every deploy lease (as `bloodraven deploy revoke-all` does).
    pub async fn revoke_all(&self) -> Result<String, PlaygroundError> {
        self.annotate(REVOKE_DEPLOYMENT_LEASES, &SystemClock.now().to_rfc3339())
            .await?;
        Ok("requested revocation of every deploy lease".into())
    }

    /// A deploy token for `ci/deployer` (valid one hour).
    pub fn token(&self) -> Result<String, PlaygroundError> {
        let who = auth::Identity::new("ci", "deployer");
        let hour = Duration::from_secs(3600);
        auth::issue(&self.key, DEPLOY_AUDIENCE, &who, hour, SystemClock.now())
            .map_err(|e| PlaygroundError::Other(e.to_string()))
    }

    /// Takes the migration lease and the failover-hold for `counter-app`, heartbeating them
    /// until released or lost.
    pub async fn take_lease(&self) -> Result<String, PlaygroundError> {
        let mut slot = self.lease.lock().await;
        if let Some(s) = slot.as_ref()
            && s.lost().borrow().is_none()
        {
            return Ok(format!("already holding {}", s.config().operation_id));
        }
        // As a pipeline does (`bloodraven deploy migrate`): wait until the deploy API calls
        // the group stable, e.g. for the first poll of an operator that just took over.
        self.wait_stable(Duration::from_secs(10)).await?;
        let token_path = self.dir.join("operator/playground.token");
        let api: Arc<dyn LeaseApi> = Arc::new(
            HttpLeaseApi::new(
                &self.deploy_url(),
                &self.files.pki.ca_cert,
                &token_path,
                GROUP,
                Duration::from_secs(5),
            )
            .map_err(|e| PlaygroundError::Other(e.to_string()))?,
        );
        let op = format!("playground-{}", SystemClock.now().unix_millis());
        let s = LeaseSession::acquire(
            api,
            SessionConfig {
                operation_id: op.clone(),
                instance: "counter-app".into(),
                ttl_seconds: 30,
            },
        )
        .await
        .map_err(|e| PlaygroundError::Other(e.to_string()))?;
        *slot = Some(s);
        Ok(format!(
            "holding the migration lease and the failover-hold as {op} (instance counter-app)"
        ))
    }

    /// Releases the playground's leases (hold first, then the mutex).
    pub async fn release_lease(&self) -> Result<String, PlaygroundError> {
        let Some(s) = self.lease.lock().await.take() else {
            return Ok("no lease held".into());
        };
        s.stop_heartbeat().await;
        let _ = s.release(LeaseKind::FailoverHold).await;
        let _ = s.release(LeaseKind::Migration).await;
        Ok(format!("released {}", s.config().operation_id))
    }

    /// The playground's own lease, if any: operation ID and whether authority was lost.
    pub async fn lease_state(&self) -> Option<(String, Option<String>)> {
        let slot = self.lease.lock().await;
        slot.as_ref().map(|s| {
            (
                s.config().operation_id.clone(),
                s.lost().borrow().as_ref().map(ToString::to_string),
            )
        })
    }

    /// Whether each site's `mariadbd` runs.
    pub async fn servers_running(&self) -> Vec<bool> {
        let mut h = self.harness.lock().await;
        (0..SITES.len()).map(|i| h.is_running(i)).collect()
    }

    /// Runs a chaos action by name (the dashboard's buttons and `playground chaos`).
    pub async fn chaos(&self, action: &str, site: Option<&str>) -> Result<String, PlaygroundError> {
        self.chaos_with(action, site, false).await
    }

    /// [`Self::chaos`] with options: `writable` for `restart-site`.
    pub async fn chaos_with(
        &self,
        action: &str,
        site: Option<&str>,
        writable: bool,
    ) -> Result<String, PlaygroundError> {
        let missing = || PlaygroundError::Other(format!("{action} needs a site"));
        match action {
            "increment" => {
                let r = self.counter.increment().await;
                Ok(format!(
                    "increment on {}: {}{}",
                    r.site,
                    r.outcome,
                    r.error.map(|e| format!(" ({e})")).unwrap_or_default()
                ))
            }
            "failover" => self.planned_failover(site.ok_or_else(missing)?).await,
            "kill-site" => self.kill_site(site.ok_or_else(missing)?).await,
            "restart-site" => self.restart_site(site.ok_or_else(missing)?, writable).await,
            "isolate-site" => self.isolate_site(site.ok_or_else(missing)?),
            "isolate-site-from-operator" => {
                self.isolate_site_from_operator(site.ok_or_else(missing)?)
            }
            "isolate-site-from-peers" => self.isolate_site_from_peers(site.ok_or_else(missing)?),
            "heal-site" => self.heal_site(site.ok_or_else(missing)?),
            "isolate-operator" => Ok(self.isolate_operator()),
            "heal-operator" => Ok(self.heal_operator()),
            "stop-operator" => {
                self.stop_operator().await;
                Ok(if self.fronts.is_some() {
                    "stopped both operators".into()
                } else {
                    "stopped the operator".into()
                })
            }
            "kill-leading-operator" => self.kill_leading_operator().await,
            "stop-etcd-member" => self.stop_etcd_member(site).await,
            "stop-etcd-leader" => self.stop_etcd_leader().await,
            "start-etcd" => self.start_etcd_members().await,
            "start-operator" => {
                self.start_operator().await?;
                Ok("started the operator".into())
            }
            "start-writing" => {
                self.counter.set_writing(true);
                Ok("the counter app increments 20 times a second".into())
            }
            "stop-writing" => {
                self.counter.set_writing(false);
                Ok("the counter app stopped writing by itself".into())
            }
            "take-lease" => self.take_lease().await,
            "release-lease" => self.release_lease().await,
            "revoke-all" => self.revoke_all().await,
            "reclone-site" => self.reclone_site(site.ok_or_else(missing)?).await,
            "backup" => self.backup().await,
            "update" => self.ordered_update().await,
            "measure-switchover" => Ok(self.measure_switchover(site).await?.to_string()),
            "rotate-certificates" => self.rotate_certificates().await,
            other => Err(PlaygroundError::Other(format!(
                "unknown action {other:?} (increment, start-writing, stop-writing, failover, measure-switchover, kill-site, restart-site, isolate-site, isolate-site-from-operator, isolate-site-from-peers, heal-site, reclone-site, backup, update, isolate-operator, heal-operator, stop-operator, start-operator, kill-leading-operator, stop-etcd-member, stop-etcd-leader, start-etcd, take-lease, release-lease, revoke-all, rotate-certificates)"
            ))),
        }
    }

    /// What the sidecars and the leading operator report of their component TLS (`/status`'s
    /// `tls` and `componentTls`), `None` for one that does not answer.
    async fn tls_in_use(&self) -> Vec<Option<bloodraven_core::wire::ComponentTlsStatus>> {
        let http =
            bloodraven_runtime::tls::http_client(Some(&self.pki.ca.cert), Duration::from_secs(2))
                .unwrap_or_default();
        let mut out = Vec::new();
        for port in &self.sidecar_ports {
            let s = async {
                let r = http
                    .get(format!("https://127.0.0.1:{port}/status"))
                    .send()
                    .await
                    .ok()?;
                r.json::<bloodraven_core::wire::SidecarStatus>()
                    .await
                    .ok()?
                    .tls
            };
            out.push(s.await);
        }
        let op = async {
            let r = http
                .get(format!("{}/status", self.operator_url()))
                .send()
                .await
                .ok()?;
            r.json::<bloodraven_core::wire::OperatorStatus>()
                .await
                .ok()?
                .component_tls
        };
        out.push(op.await);
        out
    }

    /// Waits until every sidecar and the leading operator report `done` of their TLS in use
    /// (each asked again every 200 ms; asking makes it look at its files), and at least two
    /// reload checks passed, so a component nobody asked (a following operator) takes the files
    /// at its next connection.
    async fn wait_tls(
        &self,
        what: &str,
        done: impl Fn(&bloodraven_core::wire::ComponentTlsStatus) -> bool,
    ) -> Result<(), PlaygroundError> {
        let floor = tokio::time::Instant::now() + bloodraven_runtime::mtls::RECHECK * 2;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self.tls_in_use().await;
            if seen.iter().all(|s| s.as_ref().is_some_and(&done)) {
                tokio::time::sleep_until(floor).await;
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PlaygroundError::Other(format!(
                    "rotate-certificates: not every component {what} within 30 s (sidecars, then the operator: {:?})",
                    seen.iter().map(Option::is_some).collect::<Vec<_>>()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reloads HAProxy so that its checks read the CA bundle again.
    async fn reload_haproxy(&self) -> Result<(), PlaygroundError> {
        if let Some(r) = self.router.lock().await.as_mut() {
            let log = open_log(&self.dir.join("logs/haproxy.log"))?;
            r.reload(log).await.map_err(|e| {
                PlaygroundError::Other(format!("rotate-certificates: reload HAProxy: {e}"))
            })?;
        }
        Ok(())
    }

    /// `rotate-certificates`: a new component CA, trusted beside the old one by every
    /// component; then every component certificate issued from it; then the old CA removed
    /// (docs/security.md, "Flow: rotating"). Each step waits until every component took it.
    /// Bloodraven's components restart nothing; HAProxy, which reads its checks' CA bundle
    /// only at start, is reloaded after each change of the bundle.
    pub async fn rotate_certificates(&self) -> Result<String, PlaygroundError> {
        use bloodraven_runtime::pki;
        let p = &self.pki;
        let err = |e: pki::PkiError| PlaygroundError::Other(format!("rotate-certificates: {e}"));
        let sha = |pem: &str| -> Result<String, PlaygroundError> {
            use sha2::Digest as _;
            let der = pki::pem_certificates(pem.as_bytes(), "the new CA").map_err(err)?;
            Ok(hex::encode(sha2::Sha256::digest(&der[0])))
        };
        let now = SystemClock.now();
        // 1. A new CA, beside the old one.
        let next = p.dir.join("ca-next");
        let _ = std::fs::remove_dir_all(&next);
        let next_ca =
            pki::create_ca(&next, &format!("Bloodraven component CA ({now})"), now).map_err(err)?;
        let old_pem = std::fs::read_to_string(&p.ca.cert).map_err(io("read the CA bundle"))?;
        let new_pem = std::fs::read_to_string(&next_ca.cert).map_err(io("read the new CA"))?;
        let new_fp = sha(&new_pem)?;
        // 2. Trusted together.
        let both = format!("{}\n{}", old_pem.trim_end(), new_pem);
        pki::replace_file(&p.ca.cert, &both).map_err(err)?;
        self.reload_haproxy().await?;
        self.wait_tls("trusts the new CA", |t| t.trusted_cas.contains(&new_fp))
            .await?;
        // 3. Every certificate from the new CA.
        let mut issued = Vec::new();
        for stem in SITES.iter().copied().chain(std::iter::once("operator")) {
            let id = if stem == "operator" {
                bloodraven_core::identity::ComponentId::operator(NAMESPACE, GROUP)
            } else {
                bloodraven_core::identity::ComponentId::site(NAMESPACE, GROUP, stem)
            };
            let cert = pki::issue(
                &next_ca,
                &pki::IssueRequest {
                    subject: pki::Subject::Component(vec![id]),
                    ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                    dns: vec!["localhost".into()],
                    not_before: now,
                    valid_for: pki::DEFAULT_VALIDITY,
                },
            )
            .map_err(err)?;
            pki::write_issued(&cert, &p.dir, stem).map_err(err)?;
            let der = pki::pem_certificates(cert.cert_pem.as_bytes(), stem).map_err(err)?;
            issued.push(pki::inspect(&der[0], stem).map_err(err)?.fingerprint);
        }
        self.wait_tls("presents its new certificate", |t| {
            issued.contains(&t.fingerprint)
        })
        .await?;
        // 3b. The database servers' certificate too, taken by each server with `FLUSH LOCAL
        // SSL` (LOCAL: kept out of the binary log, so no replica runs it, or holds a GTID of
        // its own); open connections keep their session, new ones see the new certificate.
        let server = pki::issue(
            &next_ca,
            &pki::IssueRequest {
                subject: pki::Subject::Server,
                ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                dns: vec!["localhost".into()],
                not_before: now,
                valid_for: pki::DEFAULT_VALIDITY,
            },
        )
        .map_err(err)?;
        pki::write_issued(&server, &p.dir, MARIADB_CERT).map_err(err)?;
        let flushed = self.flush_ssl().await;
        // 4. The old CA removed: the new one issues from now on.
        pki::replace_file(&p.ca.cert, &new_pem).map_err(err)?;
        let key = std::fs::read_to_string(&next_ca.key).map_err(io("read the new CA's key"))?;
        bloodraven_runtime::files::write_private(&p.ca.key, &key)
            .map_err(io("write the CA's key"))?;
        let _ = std::fs::remove_dir_all(&next);
        self.reload_haproxy().await?;
        self.wait_tls("trusts only the new CA", |t| {
            t.trusted_cas == [new_fp.clone()]
        })
        .await?;
        Ok(format!(
            "rotated the component CA (now {}…), every component certificate and the database servers' certificate ({flushed}): both CAs trusted, new certificates, old CA removed; no component or server restarted (HAProxy, which reads its checks' CA only at start, was reloaded)",
            &new_fp[..16]
        ))
    }

    /// `FLUSH LOCAL SSL` on every running server, as root over its socket: what it says of
    /// each (a server that does not run is left; it reads the files when it starts).
    async fn flush_ssl(&self) -> String {
        let h = self.harness.lock().await;
        let mut said = Vec::new();
        for (i, site) in SITES.iter().enumerate() {
            let r = match h.admin(i) {
                Ok(c) => c
                    .execute("FLUSH LOCAL SSL")
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            said.push(match r {
                Ok(()) => format!("{site} reloaded"),
                Err(e) => {
                    tracing::warn!(site, error = %e, "rotate-certificates: FLUSH LOCAL SSL");
                    format!("{site} not reloaded")
                }
            });
        }
        said.join(", ")
    }

    /// HAProxy's view of its backends, beside its ports, for the dashboard.
    pub async fn router_view(&self) -> serde_json::Value {
        let r = self.router.lock().await;
        let Some(r) = r.as_ref() else {
            return serde_json::json!({"running": false});
        };
        let (backends, error) = match r.backends().await {
            Ok(b) => (b, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        // The site HAProxy sends writes to: the primary backend's one server UP.
        let up: Vec<&str> = backends
            .iter()
            .filter(|b| b.backend == "primary" && b.status == "UP")
            .map(|b| b.site.as_str())
            .collect();
        serde_json::json!({
            "running": true,
            "primaryPort": r.primary_port,
            "replicaPort": r.replica_port,
            "writesTo": up,
            "backends": backends,
            "error": error,
            "config": r.config_path,
        })
    }

    /// Stops everything this playground started.
    pub async fn shutdown(&self) {
        let _ = self.release_lease().await;
        for c in self.sidecars.lock().await.iter_mut().flatten() {
            crate::control::terminate(c).await;
        }
        self.stop_operator().await;
        if let Some(r) = self.router.lock().await.take() {
            r.stop().await;
        }
        // The harness stops its servers (SIGTERM) when dropped with the playground; make it
        // explicit here so a kept directory is clean before we return.
        let mut h = self.harness.lock().await;
        for i in 0..SITES.len() {
            if h.is_running(i) {
                let _ = h.stop(i).await;
            }
        }
        if let Some(e) = &self.etcd {
            e.lock().await.shutdown().await;
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Every log file, by component.
    pub fn logs(&self) -> BTreeMap<String, PathBuf> {
        let mut m = BTreeMap::new();
        m.insert("operator".into(), self.dir.join("logs/operator.log"));
        m.insert("haproxy".into(), self.dir.join("logs/haproxy.log"));
        if self.etcd.is_some() {
            m.insert("operator-2".into(), self.dir.join("logs/operator-2.log"));
            for i in 0..crate::control::ETCD_MEMBERS {
                m.insert(
                    format!("etcd-m{i}"),
                    self.dir.join(format!("etcd/m{i}.log")),
                );
            }
        }
        for s in SITES {
            m.insert(
                format!("sidecar-{s}"),
                self.dir.join(format!("logs/sidecar-{s}.log")),
            );
        }
        m
    }
}

/// The active site recorded in a kept operator store, if any.
async fn stored_active_site(data_dir: &Path) -> Option<String> {
    let path = data_dir.join(bloodraven_operator::operator::STORE_FILE);
    if !path.is_file() {
        return None;
    }
    let store = SqliteStore::open(&path, Durability::Full).ok()?;
    active_in(&store).await
}

/// The active site recorded in kept etcd members, if any.
async fn stored_active_in_etcd(endpoints: Vec<String>) -> Option<String> {
    let client =
        bloodraven_etcd::EtcdClient::new(&bloodraven_etcd::ClientOptions::new(endpoints)).ok()?;
    let store = bloodraven_etcd::EtcdStore::connect(client, bloodraven_etcd::DEFAULT_PREFIX)
        .await
        .ok()?;
    active_in(&store).await
}

async fn active_in(store: &dyn Store) -> Option<String> {
    let obj = store
        .get(&ObjectKey::new(KIND_GROUP, NAMESPACE, GROUP))
        .await
        .ok()??;
    let body: bloodraven_core::resources::FailoverGroupBody = obj.decode().ok()?;
    Some(body.status.active_site).filter(|s| !s.is_empty())
}

/// The store of the platform the operator's configuration names, as the CLI opens it.
async fn open_store(config: &Path) -> Result<Arc<dyn Store>, PlaygroundError> {
    let cfg = bloodraven_operator::config::load(config)
        .map_err(|e| PlaygroundError::Store(e.to_string()))?;
    let platform = bloodraven_operator::platform::open(&cfg)
        .await
        .map_err(|e| PlaygroundError::Store(e.to_string()))?;
    Ok(platform.store())
}

/// Stops etcd member `i` and says what is left.
async fn stop_member(
    c: &mut bloodraven_launch::etcd::EtcdCluster,
    i: usize,
    leader: Option<usize>,
) -> String {
    c.stop(i).await;
    let running = (0..c.len()).filter(|&j| c.running(j)).count();
    let what = if leader == Some(i) {
        " (the etcd leader)"
    } else {
        ""
    };
    let quorum = if running * 2 > c.len() {
        "a quorum remains: the operators work on"
    } else {
        "no quorum: the operators act on nothing until a member comes back (start-etcd)"
    };
    format!(
        "stopped etcd member {}{what}; {running} of {} run, {quorum}",
        c.name(i),
        c.len()
    )
}

fn write_private(path: &Path, text: &str) -> Result<(), PlaygroundError> {
    bloodraven_runtime::files::write_private(path, text)
        .map_err(io(format!("write {}", path.display())))
}
