//! A failover group over local MariaDB servers (the harness): writes everything an operator
//! needs — a test PKI, a token signing key, the topology signing key pair, credential files for the control-plane and
//! replication accounts, and the configuration file. Used by the playground, the benchmarks
//! and the story tests, so all of them run the same configuration an operator reads in
//! production.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::mysql::Launcher;
use bloodraven_core::config::SiteRole;
use bloodraven_runtime::tls::{self, Pki};

use bloodraven_operator::auth::SigningKey;

/// What to write.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    pub group: String,
    pub namespace: String,
    /// Role per harness server, in order.
    pub roles: Vec<SiteRole>,
    /// Address of each site as the operator reaches it (default: the server's own port).
    /// The playground routes these through its link proxies.
    pub mysql_ports: Option<Vec<u16>>,
    /// Where replicas reach each site (`replicationAddress`, default its `mysql` address).
    /// The playground routes replication through links of its own.
    pub replication_ports: Option<Vec<u16>>,
    /// Sidecar base URL per site.
    pub sidecar_urls: Vec<String>,
    pub poll_interval: String,
    pub failure_threshold: u32,
    pub recovery_threshold: u32,
    pub failover_cooldown: String,
    pub drain_timeout: String,
    pub max_lag_wait: String,
    pub lease_timeout: String,
    pub peer_check_interval: String,
    pub http_listen: SocketAddr,
    pub https_listen: SocketAddr,
    pub deploy_api: bool,
    /// `(MysqlDatabase name, client namespace, client service account)`.
    pub databases: Vec<(String, String, String)>,
    /// More groups with the same sites layout are not supported; extra groups for load tests
    /// get their own databases: `(group name, database name)`.
    pub extra_groups: Vec<(String, String)>,
    /// `spec.bootstrapSite`.
    pub bootstrap_site: Option<String>,
    /// `spec.backup.target`: `file:///dir` or `s3://bucket/prefix` (no schedule: backups
    /// only when asked for).
    pub backup_target: Option<String>,
    /// `spec.backup.s3` of an `s3://` target: its endpoint and credentials file.
    pub backup_s3: Option<(Option<String>, PathBuf)>,
    /// `spec.backup.schedule` (none: only on request) and `retention.count`.
    pub backup_schedule: Option<String>,
    pub backup_retention_count: Option<u32>,
    /// `spec.replication.mode`.
    pub replication_mode: bloodraven_core::config::ReplicationMode,
    /// `spec.sites[].update` of every site: its command and timeout.
    pub update: Option<(Vec<String>, String)>,
    /// etcd members' client URLs: `store.backend: etcd` on them, with this `leaseTTL`
    /// (the embedded store when empty).
    pub etcd_endpoints: Vec<String>,
    pub etcd_lease_ttl: String,
    /// `spec.emergencyFailover.fencing`.
    pub fencing: bloodraven_core::config::FencingMode,
    /// `componentTLS`: the component listener's address and the operator's certificate, key
    /// and component CA (none: no component listener).
    pub component: Option<(SocketAddr, bloodraven_runtime::mtls::TlsFiles)>,
}

impl LocalOptions {
    /// Defaults for a three-site group `iad`, `pdx`, `reader`.
    pub fn new(group: &str, roles: Vec<SiteRole>) -> Self {
        let n = roles.len();
        LocalOptions {
            group: group.to_string(),
            namespace: "default".into(),
            roles,
            mysql_ports: None,
            replication_ports: None,
            sidecar_urls: vec!["http://127.0.0.1:9".to_string(); n],
            poll_interval: "2s".into(),
            failure_threshold: 3,
            recovery_threshold: 2,
            failover_cooldown: "0s".into(),
            drain_timeout: "5s".into(),
            max_lag_wait: "60s".into(),
            lease_timeout: "20s".into(),
            peer_check_interval: "5s".into(),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            https_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            deploy_api: true,
            databases: vec![("counter-app".into(), "ci".into(), "deployer".into())],
            extra_groups: Vec::new(),
            bootstrap_site: None,
            backup_target: None,
            backup_s3: None,
            backup_schedule: None,
            backup_retention_count: None,
            replication_mode: bloodraven_core::config::ReplicationMode::Async,
            update: None,
            etcd_endpoints: Vec::new(),
            etcd_lease_ttl: "10s".into(),
            fencing: bloodraven_core::config::FencingMode::Fast,
            component: None,
        }
    }
}

/// Where things were written.
#[derive(Clone, Debug)]
pub struct LocalFiles {
    pub config: PathBuf,
    pub pki: Pki,
    pub token_key: PathBuf,
    /// The topology signing key, and its public half for the sidecars' `--operator-public-key`.
    pub topology_key: PathBuf,
    pub topology_public_key: PathBuf,
    pub site_credentials: PathBuf,
    pub replication_credentials: PathBuf,
    pub clone_credentials: PathBuf,
    pub data_dir: PathBuf,
}

/// Writing the files failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error("no secure randomness for the token key: {0}")]
    Random(String),
    #[error(transparent)]
    TopologyKey(#[from] bloodraven_runtime::topology::KeyError),
}

fn write(path: &Path, text: &str) -> Result<(), LocalError> {
    bloodraven_runtime::files::write_private(path, text).map_err(|e| LocalError::Write {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// Writes the PKI, key, credentials and configuration for `harness` into `dir`. An existing
/// PKI and token key are kept (so tokens and `--cacert` stay valid across runs).
pub fn write_files(
    dir: &Path,
    harness: &Launcher,
    o: &LocalOptions,
) -> Result<LocalFiles, LocalError> {
    std::fs::create_dir_all(dir).map_err(|e| LocalError::Write {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let tls_dir = dir.join("tls");
    let pki = if tls_dir.join("ca.crt").is_file() && tls_dir.join("server.key").is_file() {
        Pki {
            ca_cert: tls_dir.join("ca.crt"),
            server_cert: tls_dir.join("server.crt"),
            server_key: tls_dir.join("server.key"),
        }
    } else {
        tls::generate_pki(&tls_dir, &["127.0.0.1", "localhost"])?
    };
    let token_key = dir.join("token.key");
    if !token_key.is_file() {
        let text = SigningKey::generate_text().map_err(|e| LocalError::Random(e.to_string()))?;
        write(&token_key, &text)?;
    }
    let topology_key = dir.join("topology.key");
    let topology_public_key = dir.join("topology.pub");
    if !topology_key.is_file() {
        let _ = std::fs::remove_file(&topology_public_key);
        bloodraven_runtime::topology::SigningKey::generate(&topology_key, &topology_public_key)?;
    }
    let a = harness.accounts();
    let site_credentials = dir.join("bloodraven.cred");
    let replication_credentials = dir.join("replication.cred");
    let clone_credentials = dir.join("clone.cred");
    for (path, account) in [
        (&site_credentials, &a.failover),
        (&replication_credentials, &a.replication),
        (&clone_credentials, &a.clone),
    ] {
        let text = account.file_text().ok_or_else(|| LocalError::Write {
            path: path.display().to_string(),
            detail: "a credentials file cannot hold this account (an empty name, or a line break)"
                .into(),
        })?;
        write(path, &text)?;
    }
    let data_dir = dir.join("data");
    let files = LocalFiles {
        config: dir.join("bloodraven.yaml"),
        pki,
        token_key,
        topology_key,
        topology_public_key,
        site_credentials,
        replication_credentials,
        clone_credentials,
        data_dir,
    };
    write(&files.config, &config_text(harness, o, &files))?;
    Ok(files)
}

/// Another operator of the same groups (etcd: operators on several machines): a
/// configuration in `dir` with its own data directory and the listen addresses of `o`, and
/// everything else shared with `first` (the TLS certificates, the token and topology keys,
/// the credentials), so tokens, `--cacert` and the sidecars' public key hold for both.
pub fn write_peer_files(
    dir: &Path,
    harness: &Launcher,
    o: &LocalOptions,
    first: &LocalFiles,
) -> Result<LocalFiles, LocalError> {
    std::fs::create_dir_all(dir).map_err(|e| LocalError::Write {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let files = LocalFiles {
        config: dir.join("bloodraven.yaml"),
        data_dir: dir.join("data"),
        ..first.clone()
    };
    write(&files.config, &config_text(harness, o, &files))?;
    Ok(files)
}

/// The configuration file: the operator's settings, then the groups and databases of `o`.
/// The group's `spec.backup` line: its target, an `s3://` target's endpoint and keys file,
/// the schedule and the retention's count.
fn backup_doc(target: &str, o: &LocalOptions) -> String {
    let schedule = o
        .backup_schedule
        .as_ref()
        .map(|s| format!(", schedule: \"{s}\""))
        .unwrap_or_default();
    let retention = o
        .backup_retention_count
        .map(|n| format!(", retention: {{count: {n}}}"))
        .unwrap_or_default();
    let s3 = o
        .backup_s3
        .as_ref()
        .map(|(endpoint, keys)| {
            let endpoint = endpoint
                .as_ref()
                .map(|e| format!("endpoint: \"{e}\", "))
                .unwrap_or_default();
            format!(
                ", s3: {{{endpoint}credentialsFile: \"{}\"}}",
                keys.display()
            )
        })
        .unwrap_or_default();
    format!("  backup: {{target: \"{target}\"{s3}{schedule}{retention}}}\n")
}

/// The operator's configuration file for the local group. Over 100 lines: one YAML
/// document written as a template, which reads best whole.
fn config_text(harness: &Launcher, o: &LocalOptions, files: &LocalFiles) -> String {
    let LocalFiles {
        pki,
        token_key,
        topology_key,
        site_credentials,
        replication_credentials,
        clone_credentials,
        data_dir,
        ..
    } = files;
    let mut sites = String::new();
    for (i, role) in o.roles.iter().enumerate() {
        let port = o
            .mysql_ports
            .as_ref()
            .and_then(|p| p.get(i).copied())
            .unwrap_or_else(|| harness.port(i));
        let sidecar = o
            .sidecar_urls
            .get(i)
            .cloned()
            .unwrap_or_else(|| "http://127.0.0.1:9".into());
        // Over verified TLS when the servers serve it (the CA the servers' certificate
        // chains to), and replication at its own address when one is given.
        let tls = harness
            .server_tls()
            .map(|t| format!(", tls: {{caFile: {}}}", t.ca.display()))
            .unwrap_or_default();
        let replication = o
            .replication_ports
            .as_ref()
            .and_then(|p| p.get(i))
            .map(|p| format!(", replicationAddress: \"127.0.0.1:{p}\""))
            .unwrap_or_default();
        let _ = write!(
            sites,
            "    - name: {}\n      role: {}\n      mysql: {{host: 127.0.0.1, port: {port}, credentials: {{file: {}}}{tls}{replication}}}\n      sidecar: {{url: \"{sidecar}\"}}\n",
            harness.name(i),
            role.as_str(),
            site_credentials.display()
        );
        if let Some((command, timeout)) = &o.update {
            // JSON strings are YAML flow scalars: the command's quoting survives.
            let command = serde_json::to_string(command).unwrap_or_default();
            let _ = writeln!(
                sites,
                "      update: {{command: {command}, timeout: {timeout}}}"
            );
        }
    }
    let mut text = format!(
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: {data}\nlisten: {{http: \"{http}\", https: \"{https}\"}}\ntopologySigningKeyFile: {topo}\n",
        data = data_dir.display(),
        http = o.http_listen,
        https = o.https_listen,
        topo = topology_key.display(),
    );
    if !o.etcd_endpoints.is_empty() {
        let endpoints = serde_json::to_string(&o.etcd_endpoints).unwrap_or_default();
        let _ = writeln!(
            text,
            "store: {{backend: etcd, etcd: {{endpoints: {endpoints}, leaseTTL: {}}}}}",
            o.etcd_lease_ttl
        );
    }
    if let Some((listen, files)) = &o.component {
        let _ = writeln!(
            text,
            "componentTLS: {{listen: \"{listen}\", certFile: {}, keyFile: {}, caFile: {}}}",
            files.cert.display(),
            files.key.display(),
            files.ca.display()
        );
    }
    if o.deploy_api {
        let _ = write!(
            text,
            "tls: {{certFile: {}, keyFile: {}}}\ntokenSigningKeyFile: {}\ndeployAPI: {{enabled: true}}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            token_key.display()
        );
    }
    let replication_tls = harness
        .server_tls()
        .map(|t| {
            format!(
                ", tls: {{mode: verify-identity, caFile: {}}}",
                t.ca.display()
            )
        })
        .unwrap_or_default();
    let group_doc = |name: &str| {
        format!(
            "---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlFailoverGroup\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  pollInterval: {poll}\n  failureThreshold: {ft}\n  recoveryThreshold: {rt}\n  failoverCooldown: {cd}\n  replication: {{mode: {mode}, credentials: {{file: {repl}}}{replication_tls}}}\n  clone: {{credentials: {{file: {clone}}}}}\n  plannedFailover: {{drainTimeout: {drain}, maxLagWait: {lag}}}\n  sidecar: {{leaseTimeout: {lt}, peerCheckInterval: {pci}}}\n  emergencyFailover: {{fencing: {fencing}}}\n  sites:\n{sites}",
            ns = o.namespace,
            poll = o.poll_interval,
            ft = o.failure_threshold,
            rt = o.recovery_threshold,
            cd = o.failover_cooldown,
            repl = replication_credentials.display(),
            clone = clone_credentials.display(),
            mode = o.replication_mode.as_str(),
            drain = o.drain_timeout,
            lag = o.max_lag_wait,
            lt = o.lease_timeout,
            pci = o.peer_check_interval,
            fencing = o.fencing.as_str(),
        ) + &o
            .bootstrap_site
            .as_ref()
            .map(|b| format!("  bootstrapSite: {b}\n"))
            .unwrap_or_default()
            + &o.backup_target
                .as_ref()
                .map(|t| backup_doc(t, o))
                .unwrap_or_default()
    };
    text.push_str(&group_doc(&o.group));
    for (g, _) in &o.extra_groups {
        text.push_str(&group_doc(g));
    }
    let mut dbs: Vec<(String, String, String, String)> = o
        .databases
        .iter()
        .map(|(d, ns, sa)| (d.clone(), o.group.clone(), ns.clone(), sa.clone()))
        .collect();
    for (g, d) in &o.extra_groups {
        let (ns, sa) = o
            .databases
            .first()
            .map_or(("ci".to_string(), "deployer".to_string()), |(_, ns, sa)| {
                (ns.clone(), sa.clone())
            });
        dbs.push((d.clone(), g.clone(), ns, sa));
    }
    for (db, group, ns, sa) in dbs {
        let _ = write!(
            text,
            "---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlDatabase\nmetadata: {{name: {db}, namespace: {}}}\nspec:\n  failoverGroupRef: {{name: {group}}}\n  deploymentClients: [{{namespace: {ns}, serviceAccount: {sa}}}]\n",
            o.namespace
        );
    }
    text
}
