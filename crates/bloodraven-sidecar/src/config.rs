//! The sidecar's configuration: raw flag values in, a validated [`Settings`] out, and the
//! timings derived from it ([`Timing`]).
//!
//! Validation happens once, at the edge, and collects every problem; each names the flag (e.g.
//! `--lease-timeout`) and the rule. The three timing rules are the CRD's own
//! ([`bloodraven_core::config::check_sidecar_timing`]). The credentials file is read here, so a
//! missing or malformed file is a configuration error; its contents never appear in a message.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bloodraven_core::config::{FieldError, ValidationErrors, check_sidecar_timing};
use bloodraven_core::defaults;

use crate::identity::Identity;
use bloodraven_core::duration::parse_duration;
use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_mysql::{Credentials, Endpoint, Timeouts};

/// `--mysql-tls-mode` and `--mysql-tls-ca`, as `spec.sites[].mysql.tls` reads them: a CA
/// alone means `verify-identity`; `verify-identity` needs the CA, and the CA must be a file.
fn mysql_tls(e: &mut Errors, raw: &RawSettings) -> bloodraven_core::config::MysqlTls {
    use bloodraven_core::config::{MysqlTls, TlsMode};
    let ca = raw
        .mysql_tls_ca
        .clone()
        .filter(|p| !p.as_os_str().is_empty());
    let mode = match raw.mysql_tls_mode.as_deref().map(str::trim) {
        None | Some("") => {
            if ca.is_some() {
                TlsMode::VerifyIdentity
            } else {
                TlsMode::Disabled
            }
        }
        Some(m) => match m.parse::<TlsMode>() {
            Ok(m) => m,
            Err(rule) => {
                e.push(flags::MYSQL_TLS_MODE, rule.to_string());
                TlsMode::Disabled
            }
        },
    };
    if mode == TlsMode::VerifyIdentity && ca.is_none() {
        e.push(
            flags::MYSQL_TLS_CA,
            "is needed with --mysql-tls-mode verify-identity (the CA the server's certificate must chain to)",
        );
    }
    if let Some(p) = &ca
        && !p.is_file()
    {
        e.push(
            flags::MYSQL_TLS_CA,
            format!("file {} does not exist", p.display()),
        );
    }
    MysqlTls {
        mode,
        ca_file: ca.map(|p| p.display().to_string()),
        server_name: None,
    }
}

/// Flag names, as errors print them.
pub mod flags {
    pub const SITE: &str = "--site";
    pub const GROUP: &str = "--group";
    pub const NAMESPACE: &str = "--namespace";
    pub const OPERATOR: &str = "--operator";
    pub const PEER: &str = "--peer";
    pub const MYSQL: &str = "--mysql";
    pub const MYSQL_SOCKET: &str = "--mysql-socket";
    pub const MYSQL_CREDENTIALS_FILE: &str = "--mysql-credentials-file";
    pub const MYSQL_TLS_MODE: &str = "--mysql-tls-mode";
    pub const MYSQL_TLS_CA: &str = "--mysql-tls-ca";
    pub const LEASE_TIMEOUT: &str = "--lease-timeout";
    pub const PEER_CHECK_INTERVAL: &str = "--peer-check-interval";
    pub const LISTEN: &str = "--listen";
    pub const OPERATOR_PUBLIC_KEY: &str = "--operator-public-key";
    pub const PIN_TIMINGS: &str = "--pin-timings";
    pub const REPLICA_MAX_LAG: &str = "--replica-max-lag";
    pub const TLS_CERT: &str = "--tls-cert";
    pub const TLS_KEY: &str = "--tls-key";
    pub const TLS_CA: &str = "--tls-ca";
    pub const BACKUP_CREDENTIALS_FILE: &str = "--backup-credentials-file";
    pub const BACKUP_DATADIR: &str = "--backup-datadir";
}

/// Bounds derived from `peerCheckInterval`, in one place.
pub mod limits {
    use std::time::Duration;
    /// Upper bound of one HTTP request to the operator or a peer.
    pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
    /// Upper bound of one fence statement.
    pub const MAX_FENCE_BOUND: Duration = Duration::from_secs(5);
    /// Upper bound of one ordinary MySQL statement (reading the fence, probing).
    pub const MAX_STATEMENT: Duration = Duration::from_secs(5);
    /// Largest HTTP body the sidecar reads from the operator or a peer.
    pub const MAX_BODY_BYTES: usize = 64 * 1024;
    /// The default listen address.
    pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
    /// `GET /replica`'s lag bound when the request names none (`--replica-max-lag`).
    pub const DEFAULT_REPLICA_MAX_LAG: Duration = Duration::from_secs(10);
}

/// Flag values as given (command line or environment), before validation.
#[derive(Clone, Debug, Default)]
pub struct RawSettings {
    pub site: Option<String>,
    pub group: Option<String>,
    pub namespace: Option<String>,
    pub operator: Option<String>,
    pub peers: Vec<String>,
    pub mysql: Option<String>,
    pub mysql_socket: Option<PathBuf>,
    pub mysql_credentials_file: Option<PathBuf>,
    /// `disabled`, `required` or `verify-identity` (default: `verify-identity` with a CA,
    /// else `disabled`).
    pub mysql_tls_mode: Option<String>,
    /// The CA the server's certificate must chain to.
    pub mysql_tls_ca: Option<PathBuf>,
    pub lease_timeout: Option<String>,
    pub peer_check_interval: Option<String>,
    pub listen: Option<String>,
    /// The operator's topology public key files (several during a rotation).
    pub operator_public_keys: Vec<PathBuf>,
    pub pin_timings: bool,
    /// `--replica-max-lag` (default 10s).
    pub replica_max_lag: Option<String>,
    /// This sidecar's component certificate, its key, and the component CA bundle.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    /// The backup account's credentials file: backups are enabled with it.
    pub backup_credentials_file: Option<PathBuf>,
    /// The data directory as this host sees it, when it differs from `@@datadir`.
    pub backup_datadir: Option<PathBuf>,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub identity: Identity,
    /// The operators' component-listener base URLs (`https://`), without a trailing `/`
    /// (several on the etcd platform: whichever leads is the operator).
    pub operators: Vec<String>,
    /// Every peer sidecar's base URL (`https://`), without a trailing `/`.
    pub peers: Vec<String>,
    /// This sidecar's component certificate, key and CA bundle (checked: they load, and the
    /// certificate names this site).
    pub tls: bloodraven_runtime::mtls::TlsFiles,
    pub mysql: Endpoint,
    pub credentials: Credentials,
    pub lease_timeout: Duration,
    pub peer_check_interval: Duration,
    pub listen: SocketAddr,
    /// Which views to trust, and whether the flags' timings win over the group's spec.
    pub trust: crate::trust::Trust,
    /// `GET /replica`'s default lag bound.
    pub replica_max_lag: Duration,
    /// Backups the operator may ask for (`--backup-credentials-file`); `None`: disabled.
    pub backup: Option<crate::backups::BackupSettings>,
}

impl Settings {
    pub fn timing(&self) -> Timing {
        Timing::new(self.lease_timeout, self.peer_check_interval)
    }
}

/// The sidecar's timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub lease_timeout: Duration,
    pub peer_check_interval: Duration,
    /// Bound of each HTTP request: half a tick, at most [`limits::MAX_REQUEST_TIMEOUT`], so all
    /// of a tick's requests (sent concurrently) end well before the next tick.
    pub request_timeout: Duration,
    /// Bound of one fence statement: one tick, at most [`limits::MAX_FENCE_BOUND`].
    pub fence_bound: Duration,
}

impl Timing {
    pub fn new(lease_timeout: Duration, peer_check_interval: Duration) -> Self {
        Timing {
            lease_timeout,
            peer_check_interval,
            request_timeout: (peer_check_interval / 2).min(limits::MAX_REQUEST_TIMEOUT),
            fence_bound: peer_check_interval.min(limits::MAX_FENCE_BOUND),
        }
    }

    /// The MySQL client's bounds: connecting like an HTTP request, statements within a tick.
    pub fn mysql_timeouts(&self) -> Timeouts {
        Timeouts {
            connect: self.request_timeout,
            statement: self.peer_check_interval.min(limits::MAX_STATEMENT),
        }
    }
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: &str, rule: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_string(),
            rule: rule.into(),
        });
    }
}

fn required<'a>(e: &mut Errors, flag: &str, v: Option<&'a String>) -> Option<&'a str> {
    match v.map(|s| s.trim()) {
        Some(s) if !s.is_empty() => Some(s),
        _ => {
            e.push(flag, "is required");
            None
        }
    }
}

/// Checks a base URL: `https://` (every party is called over mutual TLS), a host, no
/// credentials, no query or fragment. Returns it without a trailing `/`.
pub fn check_base_url(url: &str) -> Result<String, &'static str> {
    let parsed = url::Url::parse(url).map_err(|_| "must be an https:// URL")?;
    if parsed.scheme() != "https" {
        return Err(
            "must be an https:// URL: the operator's component listener and the peers are called over mutual TLS",
        );
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("must name a host");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not carry credentials (user:password@)");
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("must not have a query or fragment");
    }
    Ok(parsed.as_str().trim_end_matches('/').to_string())
}

/// Parses `HOST:PORT` (`[v6]:PORT` for IPv6).
fn parse_host_port(s: &str) -> Result<Endpoint, &'static str> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or("must be HOST:PORT, e.g. 127.0.0.1:3306")?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must be HOST:PORT with a host name or address");
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("must be HOST:PORT with a port between 1 and 65535")?;
    Ok(Endpoint::tcp(host, port))
}

fn duration(e: &mut Errors, flag: &str, v: Option<&String>, default: Duration) -> Duration {
    match v {
        None => default,
        Some(raw) => match parse_duration(raw) {
            Ok(d) => d,
            Err(err) => {
                e.push(flag, err.to_string());
                default
            }
        },
    }
}

/// The three TLS flags: each given, and together a component identity of this site (loaded
/// once here, so a bad file is a configuration error naming its flag).
fn check_tls(
    e: &mut Errors,
    raw: &RawSettings,
    site: &str,
    group: &str,
    namespace: &str,
) -> Option<bloodraven_runtime::mtls::TlsFiles> {
    use bloodraven_runtime::mtls::{Material, MtlsError, TlsFiles};
    let why = "is required: the sidecar calls and answers the operator and its peers over mutual TLS (bloodraven tls issue --site S writes the files)";
    let mut given = |flag: &str, v: &Option<PathBuf>| {
        let p = v.clone().filter(|p| !p.as_os_str().is_empty());
        if p.is_none() {
            e.push(flag, why);
        }
        p
    };
    // Every missing one is named, not only the first.
    let (cert, key, ca) = (
        given(flags::TLS_CERT, &raw.tls_cert),
        given(flags::TLS_KEY, &raw.tls_key),
        given(flags::TLS_CA, &raw.tls_ca),
    );
    let files = TlsFiles {
        cert: cert?,
        key: key?,
        ca: ca?,
    };
    let flag_of = |path: &str| {
        if path == files.ca.display().to_string() {
            flags::TLS_CA
        } else if path == files.key.display().to_string() {
            flags::TLS_KEY
        } else {
            flags::TLS_CERT
        }
    };
    match Material::load(&files, 0) {
        Err(err) => {
            let flag = match &err {
                MtlsError::Read { path, .. } | MtlsError::Empty { path, .. } => flag_of(path),
                MtlsError::KeyMismatch { .. } => flags::TLS_KEY,
                MtlsError::NotIssuedByCa { .. } => flags::TLS_CA,
                MtlsError::NoIdentity { .. } | MtlsError::Config(_) => flags::TLS_CERT,
            };
            e.push(flag, err.to_string());
            None
        }
        Ok(m) => {
            if site.is_empty() || group.is_empty() {
                return Some(files);
            }
            let me = bloodraven_core::identity::ComponentId::site(namespace, group, site);
            if m.identities.contains(&me) {
                Some(files)
            } else {
                e.push(
                    flags::TLS_CERT,
                    format!(
                        "names {} but this sidecar is {me}",
                        m.identities
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                None
            }
        }
    }
}

/// `--operator`: one URL, or several separated by commas (every operator of the etcd
/// platform), each listed once.
fn operator_urls(e: &mut Errors, raw: &RawSettings) -> Vec<String> {
    let mut operators: Vec<String> = Vec::new();
    if let Some(list) = required(e, flags::OPERATOR, raw.operator.as_ref()) {
        for u in list.split(',').map(str::trim) {
            match check_base_url(u) {
                Ok(u) if operators.contains(&u) => {
                    e.push(flags::OPERATOR, format!("lists {u} twice"));
                }
                Ok(u) => operators.push(u),
                Err(rule) => e.push(flags::OPERATOR, rule),
            }
        }
    }
    operators
}

/// `--peer`: each peer sidecar's base URL, each listed once.
fn peer_urls(e: &mut Errors, raw: &RawSettings) -> Vec<String> {
    let mut peers: Vec<String> = Vec::new();
    for p in raw.peers.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        match check_base_url(p) {
            Ok(u) if peers.contains(&u) => e.push(flags::PEER, format!("lists {u} twice")),
            Ok(u) => peers.push(u),
            Err(rule) => e.push(flags::PEER, format!("{rule} (got {p:?})")),
        }
    }
    peers
}

/// Where this site's MySQL listens (`--mysql` or `--mysql-socket`, exactly one), with its TLS.
fn mysql_endpoint(e: &mut Errors, raw: &RawSettings) -> Option<Endpoint> {
    let mysql = match (
        raw.mysql
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty()),
        raw.mysql_socket.as_ref(),
    ) {
        (Some(_), Some(_)) => {
            e.push(
                flags::MYSQL,
                "give either --mysql HOST:PORT or --mysql-socket PATH, not both",
            );
            None
        }
        (None, None) => {
            e.push(
                flags::MYSQL,
                "is required (or --mysql-socket PATH): where this site's MySQL listens",
            );
            None
        }
        (Some(hp), None) => parse_host_port(hp)
            .map_err(|rule| e.push(flags::MYSQL, rule))
            .ok(),
        (None, Some(path)) if path.as_os_str().is_empty() => {
            e.push(flags::MYSQL_SOCKET, "must not be empty");
            None
        }
        (None, Some(path)) => Some(Endpoint::unix(path)),
    };
    mysql.map(|ep| ep.with_tls(mysql_tls(e, raw)))
}

/// The MySQL account's credentials, read from `--mysql-credentials-file`.
fn credentials_file(e: &mut Errors, raw: &RawSettings) -> Option<Credentials> {
    match &raw.mysql_credentials_file {
        None => {
            e.push(
                flags::MYSQL_CREDENTIALS_FILE,
                "is required: a file with username= and password= lines",
            );
            None
        }
        Some(path) => Credentials::load(path)
            .map_err(|err| e.push(flags::MYSQL_CREDENTIALS_FILE, err.to_string()))
            .ok(),
    }
}

/// `--lease-timeout` and `--peer-check-interval`, checked together as the group's
/// `spec.sidecar` timings are.
fn lease_timings(e: &mut Errors, raw: &RawSettings) -> (Duration, Duration) {
    let lease_timeout = duration(
        e,
        flags::LEASE_TIMEOUT,
        raw.lease_timeout.as_ref(),
        defaults::LEASE_TIMEOUT,
    );
    let peer_check_interval = duration(
        e,
        flags::PEER_CHECK_INTERVAL,
        raw.peer_check_interval.as_ref(),
        defaults::PEER_CHECK_INTERVAL,
    );
    if let Err(errs) = check_sidecar_timing("sidecar", lease_timeout, peer_check_interval) {
        for fe in errs.0 {
            let flag = if fe.field.ends_with("peerCheckInterval") {
                flags::PEER_CHECK_INTERVAL
            } else {
                flags::LEASE_TIMEOUT
            };
            e.push(flag, fe.rule);
        }
    }
    (lease_timeout, peer_check_interval)
}

/// `--listen`: the address the sidecar serves on.
fn listen_addr(e: &mut Errors, raw: &RawSettings) -> Option<SocketAddr> {
    let listen_raw = raw
        .listen
        .as_deref()
        .unwrap_or(limits::DEFAULT_LISTEN)
        .trim();
    listen_raw
        .parse::<SocketAddr>()
        .map_err(|_| {
            e.push(
                flags::LISTEN,
                format!("must be ADDRESS:PORT, e.g. 0.0.0.0:8080 (got {listen_raw:?})"),
            );
        })
        .ok()
}

/// `--backup-credentials-file` and `--backup-datadir`: the backup settings, when enabled.
/// `mariadb-backup` connects over TCP like any client, so `--mysql` must be given.
fn backup_settings(
    e: &mut Errors,
    raw: &RawSettings,
    mysql: Option<&Endpoint>,
) -> Option<crate::backups::BackupSettings> {
    let Some(path) = &raw.backup_credentials_file else {
        if raw.backup_datadir.is_some() {
            e.push(
                flags::BACKUP_DATADIR,
                "is used only with --backup-credentials-file (backups are disabled without it)",
            );
        }
        return None;
    };
    let credentials = Credentials::load(path)
        .map_err(|err| e.push(flags::BACKUP_CREDENTIALS_FILE, err.to_string()))
        .ok();
    if let Some(d) = &raw.backup_datadir
        && !(d.is_absolute() && d.is_dir())
    {
        e.push(
            flags::BACKUP_DATADIR,
            format!(
                "must be an absolute path to a directory (got {})",
                d.display()
            ),
        );
    }
    let mysql = mysql?;
    if mysql.socket.is_some() {
        e.push(
            flags::BACKUP_CREDENTIALS_FILE,
            "needs --mysql HOST:PORT: mariadb-backup connects to the server over TCP",
        );
        return None;
    }
    Some(crate::backups::BackupSettings {
        host: mysql.host.clone(),
        port: mysql.port,
        credentials: credentials?,
        tls: mysql.tls.clone(),
        datadir: raw.backup_datadir.clone(),
    })
}

/// Validates raw flag values into [`Settings`], reading the credentials file.
pub fn validate(raw: &RawSettings) -> Result<Settings, ValidationErrors> {
    let mut e = Errors::default();
    let site = required(&mut e, flags::SITE, raw.site.as_ref()).unwrap_or_default();
    if !site.is_empty()
        && let Err(rule) = check_dns1123_label(site)
    {
        e.push(flags::SITE, rule);
    }
    let group = required(&mut e, flags::GROUP, raw.group.as_ref()).unwrap_or_default();
    if !group.is_empty()
        && let Err(rule) = check_dns1123_subdomain(group)
    {
        e.push(flags::GROUP, rule);
    }
    let namespace = raw.namespace.as_deref().unwrap_or("default").trim();
    if let Err(rule) = check_dns1123_label(namespace) {
        e.push(flags::NAMESPACE, rule);
    }
    let operators = operator_urls(&mut e, raw);
    let peers = peer_urls(&mut e, raw);
    let mysql = mysql_endpoint(&mut e, raw);
    let credentials = credentials_file(&mut e, raw);
    let backup = backup_settings(&mut e, raw, mysql.as_ref());
    let (lease_timeout, peer_check_interval) = lease_timings(&mut e, raw);
    let replica_max_lag = duration(
        &mut e,
        flags::REPLICA_MAX_LAG,
        raw.replica_max_lag.as_ref(),
        limits::DEFAULT_REPLICA_MAX_LAG,
    );
    let listen = listen_addr(&mut e, raw);
    let tls = check_tls(&mut e, raw, site, group, namespace);
    let verifier = if raw.operator_public_keys.is_empty() {
        None
    } else {
        bloodraven_runtime::topology::Verifier::load(&raw.operator_public_keys)
            .map_err(|err| e.push(flags::OPERATOR_PUBLIC_KEY, err.to_string()))
            .ok()
    };
    match (e.0.is_empty(), mysql, credentials, listen, tls) {
        (true, Some(mysql), Some(credentials), Some(listen), Some(tls)) => Ok(Settings {
            identity: Identity {
                site: site.to_string(),
                group: group.to_string(),
                namespace: namespace.to_string(),
            },
            operators,
            peers,
            tls,
            mysql,
            credentials,
            lease_timeout,
            peer_check_interval,
            listen,
            trust: crate::trust::Trust {
                verifier,
                pin_timings: raw.pin_timings,
            },
            replica_max_lag,
            backup,
        }),
        _ => Err(ValidationErrors(e.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    type Mutation = fn(&mut RawSettings);

    fn creds_file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    /// One component PKI for the module's tests (iad, pdx, reader, the operator).
    fn pki() -> &'static bloodraven_runtime::mtls::local::GroupPki {
        static PKI: std::sync::OnceLock<(
            tempfile::TempDir,
            bloodraven_runtime::mtls::local::GroupPki,
        )> = std::sync::OnceLock::new();
        &PKI.get_or_init(crate::testing::pki).1
    }

    fn good(creds: &tempfile::NamedTempFile) -> RawSettings {
        let files = pki().files("iad");
        RawSettings {
            site: Some("iad".into()),
            group: Some("playground".into()),
            namespace: None,
            operator: Some("https://127.0.0.1:8082/".into()),
            peers: vec![
                "https://10.0.0.2:8080".into(),
                "https://10.0.0.3:8080/".into(),
            ],
            tls_cert: Some(files.cert),
            tls_key: Some(files.key),
            tls_ca: Some(files.ca),
            mysql: Some("127.0.0.1:3307".into()),
            mysql_socket: None,
            mysql_credentials_file: Some(creds.path().to_path_buf()),
            mysql_tls_mode: None,
            mysql_tls_ca: None,
            lease_timeout: None,
            peer_check_interval: None,
            listen: None,
            operator_public_keys: Vec::new(),
            pin_timings: false,
            replica_max_lag: None,
            backup_credentials_file: None,
            backup_datadir: None,
        }
    }

    #[test]
    fn backups_are_enabled_by_their_credentials_over_tcp_and_bad_flags_are_named() {
        let creds = creds_file("username=u\npassword=p\n");
        let backup = creds_file("username=backup\npassword=b4ckup\n");
        assert!(validate(&good(&creds)).unwrap().backup.is_none());
        let data = tempfile::tempdir().unwrap();
        let mut r = good(&creds);
        r.backup_credentials_file = Some(backup.path().to_path_buf());
        r.backup_datadir = Some(data.path().to_path_buf());
        let b = validate(&r).unwrap().backup.expect("enabled");
        assert_eq!((b.host.as_str(), b.port), ("127.0.0.1", 3307));
        assert_eq!(b.credentials.user, "backup");
        assert_eq!(b.datadir.as_deref(), Some(data.path()));

        let cases: [(Mutation, &str); 4] = [
            (
                |r| r.backup_credentials_file = Some("/nonexistent/backup".into()),
                "--backup-credentials-file",
            ),
            (
                |r| {
                    r.backup_credentials_file = None;
                    r.backup_datadir = Some("/var/lib/mysql".into());
                },
                "--backup-datadir",
            ),
            (
                |r| r.backup_datadir = Some("relative/data".into()),
                "--backup-datadir",
            ),
            (
                |r| {
                    r.mysql = None;
                    r.mysql_socket = Some("/run/mysqld/mysqld.sock".into());
                },
                "--backup-credentials-file",
            ),
        ];
        for (mutate, flag) in cases {
            let mut raw = r.clone();
            mutate(&mut raw);
            let err = validate(&raw).unwrap_err();
            assert!(err.has(flag), "{flag}: {err}");
            assert!(!err.to_string().contains("b4ckup"), "{err}");
        }
    }

    #[test]
    fn the_mysql_tls_flags_read_as_the_spec_does_and_name_the_flag() {
        use bloodraven_core::config::TlsMode;
        let creds = creds_file("username=u\npassword=p\n");
        let ca = pki().files("iad").ca;
        let with = |mode: Option<&str>, ca: Option<PathBuf>| {
            let mut r = good(&creds);
            r.mysql_tls_mode = mode.map(Into::into);
            r.mysql_tls_ca = ca;
            validate(&r)
        };
        assert_eq!(with(None, None).unwrap().mysql.tls.mode, TlsMode::Disabled);
        let s = with(None, Some(ca.clone())).unwrap();
        assert_eq!(s.mysql.tls.mode, TlsMode::VerifyIdentity);
        assert_eq!(s.mysql.tls.ca_file.as_deref(), Some(ca.to_str().unwrap()));
        assert_eq!(
            with(Some("required"), None).unwrap().mysql.tls.mode,
            TlsMode::Required
        );
        for (mode, file, flag) in [
            (Some("verify-identity"), None, "--mysql-tls-ca"),
            (Some("strict"), None, "--mysql-tls-mode"),
            (
                None,
                Some(PathBuf::from("/nonexistent/ca.crt")),
                "--mysql-tls-ca",
            ),
        ] {
            let err = with(mode, file).unwrap_err();
            assert!(err.has(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn defaults_and_normalisation() {
        let f = creds_file("username=bloodraven\npassword=s3cret\n");
        let s = validate(&good(&f)).unwrap();
        assert_eq!(s.identity.namespace, "default");
        assert_eq!(s.operators, ["https://127.0.0.1:8082"]);
        let mut several = good(&f);
        several.operator = Some("https://10.0.0.1:8082/, https://10.0.0.9:8082".into());
        assert_eq!(
            validate(&several).unwrap().operators,
            ["https://10.0.0.1:8082", "https://10.0.0.9:8082"]
        );
        assert_eq!(
            s.peers,
            vec!["https://10.0.0.2:8080", "https://10.0.0.3:8080"]
        );
        assert_eq!(s.tls, pki().files("iad"));
        assert_eq!(s.lease_timeout, Duration::from_secs(20));
        assert_eq!(s.peer_check_interval, Duration::from_secs(5));
        assert_eq!(s.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(s.mysql, Endpoint::tcp("127.0.0.1", 3307));
        assert_eq!(s.credentials.user, "bloodraven");
        assert!(!format!("{s:?}").contains("s3cret"));
        let t = s.timing();
        assert_eq!(t.request_timeout, Duration::from_secs(2));
        assert_eq!(t.fence_bound, Duration::from_secs(5));
        let t = Timing::new(Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(t.request_timeout, Duration::from_millis(500));
        assert_eq!(t.fence_bound, Duration::from_secs(1));
        assert_eq!(t.mysql_timeouts().statement, Duration::from_secs(1));
    }

    #[test]
    fn raising_peer_check_interval_alone_names_lease_timeout() {
        let f = creds_file("username=u\npassword=p\n");
        let raw = RawSettings {
            peer_check_interval: Some("10s".into()),
            ..good(&f)
        };
        let err = validate(&raw).unwrap_err();
        assert!(err.has("--lease-timeout"), "{err}");
        assert!(
            err.to_string()
                .contains("rule: leaseTimeout >= 3 × peerCheckInterval"),
            "{err}"
        );
        let raw = RawSettings {
            peer_check_interval: Some("10s".into()),
            lease_timeout: Some("30s".into()),
            ..good(&f)
        };
        assert!(validate(&raw).is_ok());
    }

    #[test]
    fn every_bad_value_is_named() {
        let f = creds_file("username=u\npassword=p\n");
        let cases: Vec<(Mutation, &str)> = vec![
            (|r| r.site = Some("Bad_Site".into()), "--site"),
            (|r| r.site = None, "--site"),
            (|r| r.group = Some(String::new()), "--group"),
            (|r| r.namespace = Some("Nope".into()), "--namespace"),
            (|r| r.operator = Some("ftp://x".into()), "--operator"),
            (
                |r| r.operator = Some("https://admin:hunter2@op:8082".into()),
                "--operator",
            ),
            (
                |r| r.operator = Some("https://op:8082,https://op:8082/".into()),
                "--operator",
            ),
            (
                |r| r.operator = Some("https://op:8082,".into()),
                "--operator",
            ),
            // Plain HTTP: nobody could prove to be the operator there.
            (|r| r.operator = Some("http://op:8082".into()), "--operator"),
            (|r| r.peers.push("not a url".into()), "--peer"),
            (|r| r.peers.push("https://10.0.0.2:8080/".into()), "--peer"),
            (|r| r.peers.push("http://10.0.0.4:8080".into()), "--peer"),
            (|r| r.tls_cert = None, "--tls-cert"),
            (|r| r.tls_key = None, "--tls-key"),
            (|r| r.tls_ca = None, "--tls-ca"),
            (
                |r| r.tls_ca = Some("/nonexistent/ca.crt".into()),
                "--tls-ca",
            ),
            // The key of another certificate.
            (|r| r.tls_key = Some(pki().files("pdx").key), "--tls-key"),
            // The certificate of another site.
            (
                |r| {
                    let pdx = pki().files("pdx");
                    r.tls_cert = Some(pdx.cert);
                    r.tls_key = Some(pdx.key);
                },
                "--tls-cert",
            ),
            (|r| r.mysql = Some("127.0.0.1".into()), "--mysql"),
            (|r| r.mysql = Some("127.0.0.1:0".into()), "--mysql"),
            (|r| r.mysql = None, "--mysql"),
            (
                |r| r.mysql_socket = Some("/run/mysqld/mysqld.sock".into()),
                "--mysql",
            ),
            (
                |r| r.mysql_credentials_file = Some("/nonexistent/creds".into()),
                "--mysql-credentials-file",
            ),
            (
                |r| r.mysql_credentials_file = None,
                "--mysql-credentials-file",
            ),
            (|r| r.lease_timeout = Some("20 s".into()), "--lease-timeout"),
            (|r| r.lease_timeout = Some("2s".into()), "--lease-timeout"),
            (
                |r| r.peer_check_interval = Some("500ms".into()),
                "--peer-check-interval",
            ),
            (|r| r.listen = Some("8080".into()), "--listen"),
        ];
        for (mutate, flag) in cases {
            let mut raw = good(&f);
            mutate(&mut raw);
            let err = validate(&raw).unwrap_err();
            assert!(err.has(flag), "{flag}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn the_replica_lag_bound_defaults_and_a_bad_one_is_named() {
        let f = creds_file("username=u\npassword=p\n");
        assert_eq!(
            validate(&good(&f)).unwrap().replica_max_lag,
            Duration::from_secs(10)
        );
        let s = validate(&RawSettings {
            replica_max_lag: Some("30s".into()),
            ..good(&f)
        })
        .unwrap();
        assert_eq!(s.replica_max_lag, Duration::from_secs(30));
        let err = validate(&RawSettings {
            replica_max_lag: Some("soon".into()),
            ..good(&f)
        })
        .unwrap_err();
        assert!(err.to_string().contains("--replica-max-lag"), "{err}");
    }

    #[test]
    fn operator_public_keys_are_read_and_a_bad_one_is_named() {
        let f = creds_file("username=u\npassword=p\n");
        let dir = tempfile::tempdir().unwrap();
        let public = dir.path().join("op.pub");
        bloodraven_runtime::topology::SigningKey::generate(&dir.path().join("op.key"), &public)
            .unwrap();
        let s = validate(&RawSettings {
            operator_public_keys: vec![public],
            pin_timings: true,
            ..good(&f)
        })
        .unwrap();
        assert!(s.trust.signed() && s.trust.pin_timings);
        assert!(!validate(&good(&f)).unwrap().trust.signed());
        let bad = dir.path().join("bad.pub");
        std::fs::write(&bad, "not a key").unwrap();
        let err = validate(&RawSettings {
            operator_public_keys: vec![bad],
            ..good(&f)
        })
        .unwrap_err();
        assert!(
            err.0
                .iter()
                .any(|e| e.field == flags::OPERATOR_PUBLIC_KEY && e.rule.contains("bad.pub")),
            "{err:?}"
        );
    }

    #[test]
    fn a_malformed_credentials_file_never_echoes_its_contents() {
        let f = creds_file("hunter2-password-line\n");
        let err = validate(&good(&f)).unwrap_err();
        assert!(err.has("--mysql-credentials-file"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn socket_and_ipv6() {
        let f = creds_file("username=u\npassword=p\n");
        let raw = RawSettings {
            mysql: None,
            mysql_socket: Some("/run/mysqld/mysqld.sock".into()),
            ..good(&f)
        };
        let s = validate(&raw).unwrap();
        assert_eq!(s.mysql, Endpoint::unix("/run/mysqld/mysqld.sock"));
        let raw = RawSettings {
            mysql: Some("[::1]:3306".into()),
            ..good(&f)
        };
        assert_eq!(validate(&raw).unwrap().mysql, Endpoint::tcp("::1", 3306));
        let raw = RawSettings {
            peers: vec![],
            ..good(&f)
        };
        assert!(
            validate(&raw).unwrap().peers.is_empty(),
            "no peers is allowed"
        );
    }
}
