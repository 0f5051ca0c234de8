//! The adapter: one [`SiteClient`] per MySQL/MariaDB server.
//!
//! It owns every statement Bloodraven runs against a server: flavour detection, `probe`,
//! `fence`/`unfence`, `kill_application_sessions`, `wait_for_gtid`, `promote`, `repoint` and the
//! account audit. Every call is bounded by a timeout. A call whose answer is lost reports
//! [`Cause::TimedOut`] or [`Cause::Driver`] ("effect unknown"), never "did not happen"; the
//! fence resolves that uncertainty itself by re-reading the variables.
//!
//! Connections: one idle control connection is cached and reused (a switchover is a handful of
//! round trips, so connection setup would dominate); a connection that timed out or broke is
//! dropped, never reused. The fence and GTID waits use a fresh connection of their own, because
//! they may block for their whole timeout.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::config::{MysqlTls, TlsMode};
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::semisync::{SemiSyncState, Settings};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Row};
use serde::Serialize;
use tokio::time::{Instant, timeout};

use crate::creds::Credentials;
use crate::error::{Cause, MysqlError, Op, cause_of};
use crate::sql::{Flavor, ReplicaStatus, Session, is_application_session};

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// A Unix socket to use instead of TCP (same-host sidecars, the harness's admin account).
    pub socket: Option<PathBuf>,
    /// TLS over TCP (`spec.sites[].mysql.tls`); ignored on a Unix socket.
    pub tls: MysqlTls,
}

impl Endpoint {
    pub fn tcp(host: impl Into<String>, port: u16) -> Self {
        Endpoint {
            host: host.into(),
            port,
            socket: None,
            tls: MysqlTls::default(),
        }
    }

    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Endpoint {
            host: "localhost".into(),
            port: 0,
            socket: Some(path.into()),
            tls: MysqlTls::default(),
        }
    }

    /// The same endpoint, reached over TLS as `tls` says.
    #[must_use]
    pub fn with_tls(mut self, tls: MysqlTls) -> Self {
        self.tls = tls;
        self
    }
}

/// `opts` with a TLS configuration of its own, built (and the CA files read) at its first
/// connection: `mysql_async` builds one per options value and its clones share it, so a
/// client that keeps one `Opts` would never see a rotated CA bundle. Connect with
/// `Conn::new(renewed(&opts))`; without TLS, `opts` as it is.
pub fn renewed(opts: &mysql_async::Opts) -> mysql_async::Opts {
    match opts.ssl_opts() {
        Some(ssl) => OptsBuilder::from_opts(opts.clone())
            .ssl_opts(Some(ssl.clone()))
            .into(),
        None => opts.clone(),
    }
}

/// Whether a driver error is the TLS handshake failing (a certificate not verified, a name
/// that does not match).
fn is_tls_failure(d: &str) -> bool {
    let d = d.to_ascii_lowercase();
    d.contains("tls") || d.contains("certificate") || d.contains("ssl")
}

/// `mysql_async`'s TLS options for `tls`: `None` when disabled. The CA is read from its file
/// at every new connection, so a new bundle is taken without a restart; the platform's own
/// roots are never trusted for a database.
pub fn ssl_opts(tls: &MysqlTls) -> Option<mysql_async::SslOpts> {
    match tls.mode {
        TlsMode::Disabled => None,
        TlsMode::Required => Some(
            mysql_async::SslOpts::default()
                .with_disable_built_in_roots(true)
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
        ),
        TlsMode::VerifyIdentity => {
            let roots = tls
                .ca_file
                .iter()
                .map(|p| PathBuf::from(p).into())
                .collect();
            Some(
                mysql_async::SslOpts::default()
                    .with_disable_built_in_roots(true)
                    .with_root_certs(roots)
                    .with_danger_tls_hostname_override(tls.server_name.clone()),
            )
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.socket {
            Some(p) => write!(f, "unix:{}", p.display()),
            None => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// Bounds of the adapter's calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing a connection (TCP + handshake + authentication).
    pub connect: Duration,
    /// One ordinary statement (probe, kill, promote steps, re-point).
    pub statement: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            statement: Duration::from_secs(5),
        }
    }
}

/// What a probe sees on one server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    pub flavor: Flavor,
    pub server_id: u32,
    pub read_only: bool,
    /// `None` on MariaDB, which has no `super_read_only`.
    pub super_read_only: Option<bool>,
    /// `gtid_current_pos` (MariaDB) or `gtid_executed` (MySQL).
    #[serde(serialize_with = "ser_display")]
    pub gtid: GtidSet,
    /// `None` when the server is not configured as a replica.
    pub replica: Option<ReplicaStatus>,
    /// Its semi-synchronous replication, read by [`SiteClient::probe_with_semi_sync`] only
    /// (`available: false` on a server without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semi_sync: Option<SemiSyncState>,
    /// `require_secure_transport`, read by [`SiteClient::probe_with_semi_sync`] only (`None`:
    /// not read, or a server without the variable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_secure_transport: Option<bool>,
}

impl Probe {
    /// Whether client writes are blocked for accounts without the bypass privilege.
    pub fn fenced(&self) -> bool {
        match self.flavor.kind {
            crate::sql::FlavorKind::MariaDb => self.read_only,
            crate::sql::FlavorKind::MySql => self.super_read_only.unwrap_or(false),
        }
    }
}

fn ser_display<S: serde::Serializer, T: fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// The outcome of a fence. `Unknown` is not an error: it says the state could not be read,
/// and the caller must look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The fence variables read back set.
    Fenced,
    /// The variables read back unset: the statement did not take effect (it timed out or
    /// was refused, and its wait was cancelled).
    NotFenced { reason: String },
    /// The statement's outcome could not be established (the server could not be read).
    Unknown { reason: String },
}

/// What [`SiteClient::kill_application_sessions`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KillReport {
    /// Connection ids killed (or already gone when the kill arrived).
    pub killed: Vec<u64>,
    /// Connection ids that could not be killed, with the server's reason.
    pub failed: Vec<(u64, String)>,
}

/// One reading of the fence, with who answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceReading {
    /// Client writes are refused (`read_only` on MariaDB, `super_read_only` on MySQL).
    pub fenced: bool,
    /// `@@server_id`.
    pub server_id: u32,
    /// How long the server has been up (whole seconds, as the server counts them).
    pub uptime: Duration,
}

/// How [`SiteClient::catch_up`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaughtUp {
    /// The server held the target already; it was not re-pointed.
    AlreadyHeld,
    /// It replicated from the source until it held the target.
    Replicated,
    /// It did not hold the target within the bound.
    TimedOut,
}

/// What a promotion recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    /// The promoted server's GTID set at the moment replication was reset, before it took
    /// its first write: the promotion point a returning primary is compared with.
    pub gtid: GtidSet,
}

/// How to reach the new source of a re-pointed replica.
#[derive(Clone, Debug)]
pub struct SourceSpec {
    pub host: String,
    pub port: u16,
    pub credentials: Credentials,
    /// `spec.replication.tls`: what the `CHANGE MASTER` sets.
    pub tls: bloodraven_core::config::ReplicationTls,
}

/// The result of an account audit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccountAudit {
    pub account: String,
    /// Global privileges that let the account write through the fence or lift it.
    pub bypass_privileges: Vec<String>,
}

impl AccountAudit {
    pub fn can_bypass_fence(&self) -> bool {
        !self.bypass_privileges.is_empty()
    }
}

/// `(name, value)` rows of `SHOW GLOBAL VARIABLES` / `SHOW GLOBAL STATUS`.
type NameValues = Vec<(String, String)>;

/// `(read_only, super_read_only, gtid set, server_id)` as the variables query returns them.
type Vars = (i64, Option<i64>, Option<String>, u32);

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, mysql_async::Error>> + Send + 'a>>;

struct Inner {
    label: String,
    endpoint: Endpoint,
    credentials: Credentials,
    timeouts: Timeouts,
    /// Accounts whose sessions a fence never kills (the control plane's own).
    spare_users: Vec<String>,
    idle: Mutex<Option<Conn>>,
    flavor: Mutex<Option<Flavor>>,
}

/// A handle on one server. Cheap to clone; clones share the cached connection.
#[derive(Clone)]
pub struct SiteClient {
    inner: Arc<Inner>,
}

impl fmt::Debug for SiteClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SiteClient")
            .field("label", &self.inner.label)
            .field("endpoint", &self.inner.endpoint)
            .field("user", &self.inner.credentials.user)
            .finish_non_exhaustive()
    }
}

impl SiteClient {
    /// A client for the server at `endpoint`, named `label` in errors and logs (the site name).
    pub fn new(
        label: impl Into<String>,
        endpoint: Endpoint,
        credentials: Credentials,
        timeouts: Timeouts,
    ) -> Self {
        let spare_users = vec![credentials.user.clone()];
        SiteClient {
            inner: Arc::new(Inner {
                label: label.into(),
                endpoint,
                credentials,
                timeouts,
                spare_users,
                idle: Mutex::new(None),
                flavor: Mutex::new(None),
            }),
        }
    }

    /// Adds accounts whose sessions fencing must never kill (e.g. the operator's account when
    /// this client belongs to a sidecar with a different one).
    #[must_use]
    pub fn with_spare_users(self, users: &[&str]) -> Self {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|arc| Inner {
            label: arc.label.clone(),
            endpoint: arc.endpoint.clone(),
            credentials: arc.credentials.clone(),
            timeouts: arc.timeouts,
            spare_users: arc.spare_users.clone(),
            idle: Mutex::new(None),
            flavor: Mutex::new(None),
        });
        for u in users {
            if !inner.spare_users.iter().any(|s| s == u) {
                inner.spare_users.push((*u).to_string());
            }
        }
        SiteClient {
            inner: Arc::new(inner),
        }
    }

    pub fn label(&self) -> &str {
        &self.inner.label
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    pub fn timeouts(&self) -> Timeouts {
        self.inner.timeouts
    }

    fn opts(&self) -> OptsBuilder {
        let ep = &self.inner.endpoint;
        let mut b = OptsBuilder::default()
            .user(Some(self.inner.credentials.user.clone()))
            .pass(Some(self.inner.credentials.password.expose().to_string()))
            // Never switch to a Unix socket behind our back: the TCP path is the one that is
            // monitored (and, in the playground, the one that can be cut).
            .prefer_socket(false)
            .tcp_nodelay(true)
            .stmt_cache_size(0)
            // Quoting in `sql::quote` assumes backslash escapes are on.
            .init(vec![
                "SET SESSION sql_mode = REPLACE(@@SESSION.sql_mode, 'NO_BACKSLASH_ESCAPES', '')",
            ]);
        b = match &ep.socket {
            Some(p) => b.socket(Some(p.display().to_string())),
            None => b
                .ip_or_hostname(ep.host.clone())
                .tcp_port(ep.port)
                .ssl_opts(ssl_opts(&ep.tls)),
        };
        b
    }

    async fn connect(&self, op: Op) -> Result<Conn, MysqlError> {
        let t = self.inner.timeouts.connect;
        match timeout(t, Conn::new(self.opts())).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => {
                let mode = self.inner.endpoint.tls.mode;
                let cause = match cause_of(&e, false) {
                    // Never on to clear text: a server without TLS where it is asked for is
                    // refused, and said so.
                    _ if matches!(
                        e,
                        mysql_async::Error::Driver(
                            mysql_async::DriverError::NoClientSslFlagFromServer
                        )
                    ) =>
                    {
                        Cause::Connect(format!(
                            "the server does not offer TLS, and spec.sites[].mysql.tls.mode is {}: not connecting in clear text",
                            mode.as_str()
                        ))
                    }
                    Cause::Driver(d) | Cause::Unexpected(d) | Cause::Connect(d)
                        if mode.encrypts() && is_tls_failure(&d) =>
                    {
                        Cause::Connect(format!(
                            "TLS to the server failed (spec.sites[].mysql.tls.mode {}): {d}",
                            mode.as_str()
                        ))
                    }
                    Cause::Server { code, message } => {
                        Cause::Connect(format!("server error {code}: {message}"))
                    }
                    Cause::Driver(d) | Cause::Unexpected(d) | Cause::Connect(d) => {
                        Cause::Connect(d)
                    }
                    Cause::TimedOut(d) => Cause::TimedOut(d),
                };
                Err(op.error(&self.inner.label, cause))
            }
            Err(_) => Err(op.error(
                &self.inner.label,
                Cause::Connect(format!("no handshake within {} ms", t.as_millis())),
            )),
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn put_idle(&self, conn: Conn) {
        let mut slot = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(conn);
        }
    }

    /// Drops the cached connection (e.g. after the server restarted).
    pub fn reset_connection(&self) {
        drop(self.take_idle());
    }

    /// Runs `f` on the cached control connection (or a new one) within `bound`. The connection
    /// goes back to the cache only when the statement completed or the server refused it;
    /// after a timeout or a broken connection it is dropped.
    async fn run<T: Send>(
        &self,
        op: Op,
        bound: Duration,
        secret: bool,
        f: impl for<'c> FnOnce(&'c mut Conn) -> BoxFut<'c, T> + Send,
    ) -> Result<T, MysqlError> {
        let mut conn = match self.take_idle() {
            Some(c) => c,
            None => self.connect(op).await?,
        };
        match timeout(bound, f(&mut conn)).await {
            Ok(Ok(v)) => {
                self.put_idle(conn);
                Ok(v)
            }
            Ok(Err(e)) => {
                let cause = cause_of(&e, secret);
                if matches!(cause, Cause::Server { .. }) {
                    self.put_idle(conn);
                } else {
                    // A cached sibling may be broken the same way (the server restarted).
                    self.reset_connection();
                }
                Err(op.error(&self.inner.label, cause))
            }
            Err(_) => Err(op.error(&self.inner.label, Cause::TimedOut(bound))),
        }
    }

    /// Same as [`SiteClient::run`], retrying once on a fresh connection when the cached one
    /// turns out to be dead before the statement was sent (server restarted, idle timeout).
    /// Only for statements that are safe to send twice (reads).
    async fn run_read<T: Send>(
        &self,
        op: Op,
        f: impl for<'c> Fn(&'c mut Conn) -> BoxFut<'c, T> + Send + Sync,
    ) -> Result<T, MysqlError> {
        let bound = self.inner.timeouts.statement;
        match self.run(op, bound, false, &f).await {
            Err(e) if matches!(e.cause(), Cause::Driver(_)) => {
                self.reset_connection();
                self.run(op, bound, false, &f).await
            }
            other => other,
        }
    }

    /// The server's flavour and version, detected once and cached.
    pub async fn flavor(&self) -> Result<Flavor, MysqlError> {
        if let Some(f) = *self
            .inner
            .flavor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return Ok(f);
        }
        let version: Option<String> = self
            .run_read(Op::DetectFlavor, |c| {
                Box::pin(c.query_first::<String, _>("SELECT VERSION()"))
            })
            .await?;
        let version = version.unwrap_or_default();
        let f = Flavor::from_version(&version).ok_or_else(|| {
            Op::DetectFlavor.error(
                &self.inner.label,
                Cause::Unexpected(format!("unrecognised version string {version:?}")),
            )
        })?;
        *self
            .inner
            .flavor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(f);
        Ok(f)
    }

    /// Reads `(read_only, super_read_only, gtid, server_id)`.
    async fn read_variables(
        &self,
        op: Op,
    ) -> Result<(Flavor, bool, Option<bool>, GtidSet, u32), MysqlError> {
        let flavor = self.flavor().await?;
        let q = flavor.variables_query();
        let row: Option<Vars> = self
            .run_read(op, move |c| Box::pin(c.query_first::<Vars, _>(q)))
            .await?;
        let (ro, sro, gtid, server_id) = row.ok_or_else(|| {
            op.error(
                &self.inner.label,
                Cause::Unexpected("no row for the variables query".into()),
            )
        })?;
        let gtid_text = gtid.unwrap_or_default();
        let gtid = GtidSet::parse(flavor.gtid_flavor(), &gtid_text)
            .map_err(|e| op.error(&self.inner.label, Cause::Unexpected(e.to_string())))?;
        Ok((flavor, ro != 0, sro.map(|v| v != 0), gtid, server_id))
    }

    /// Reads the replica status, `None` when the server is not a replica.
    async fn replica_status(
        &self,
        flavor: Flavor,
        op: Op,
    ) -> Result<Option<ReplicaStatus>, MysqlError> {
        let q = flavor.replica_status_query();
        let rows: Vec<Row> = self
            .run_read(op, move |c| Box::pin(c.query::<Row, _>(q)))
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| ReplicaStatus::from_columns(&row_map(row))))
    }

    /// Reads everything the operator and the sidecar decide on.
    pub async fn probe(&self) -> Result<Probe, MysqlError> {
        let (flavor, read_only, super_read_only, gtid, server_id) =
            self.read_variables(Op::Probe).await?;
        let replica = self.replica_status(flavor, Op::Probe).await?;
        Ok(Probe {
            flavor,
            server_id,
            read_only,
            super_read_only,
            gtid,
            replica,
            semi_sync: None,
            require_secure_transport: None,
        })
    }

    /// [`Self::probe`] and the server's semi-synchronous replication: what the operator reads
    /// every poll (the sidecar's tick does not need it).
    pub async fn probe_with_semi_sync(&self) -> Result<Probe, MysqlError> {
        let mut p = self.probe().await?;
        p.semi_sync = Some(self.read_semi_sync(Op::Probe).await?);
        p.require_secure_transport = self.read_secure_transport().await?;
        Ok(p)
    }

    /// Whether the server refuses clear-text logins over TCP (`require_secure_transport`);
    /// `None` on a server without the variable.
    async fn read_secure_transport(&self) -> Result<Option<bool>, MysqlError> {
        let rows: NameValues = self
            .run_read(Op::Probe, |c| {
                Box::pin(async move {
                    c.query("SHOW GLOBAL VARIABLES LIKE 'require\\_secure\\_transport'")
                        .await
                })
            })
            .await?;
        Ok(rows
            .first()
            .map(|(_, v)| v.eq_ignore_ascii_case("ON") || v == "1"))
    }

    /// Reads the server's semi-synchronous replication settings and state.
    pub async fn semi_sync_state(&self) -> Result<SemiSyncState, MysqlError> {
        self.read_semi_sync(Op::Probe).await
    }

    async fn read_semi_sync(&self, op: Op) -> Result<SemiSyncState, MysqlError> {
        let (variables, status): (NameValues, NameValues) = self
            .run_read(op, |c| {
                Box::pin(async move {
                    let v = c.query(crate::sql::SEMI_SYNC_VARIABLES).await?;
                    let s = c.query(crate::sql::SEMI_SYNC_STATUS).await?;
                    Ok((v, s))
                })
            })
            .await?;
        Ok(crate::sql::semi_sync_state(&variables, &status))
    }

    /// Gives the server the semi-synchronous `settings` (see
    /// [`Flavor::semi_sync_statements`]). Fails, naming the server, when it has no
    /// semi-synchronous replication and `settings` asks for some.
    pub async fn configure_semi_sync(&self, settings: Settings) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        let state = self.read_semi_sync(Op::ConfigureSemiSync).await?;
        if !state.available {
            if settings.source || settings.replica {
                return Err(Op::ConfigureSemiSync.error(
                    &self.inner.label,
                    Cause::Unexpected(
                        "the server has no semi-synchronous replication (MySQL: install the rpl_semi_sync_source and rpl_semi_sync_replica plugins)"
                            .into(),
                    ),
                ));
            }
            return Ok(());
        }
        let replica_running = self
            .replica_status(flavor, Op::ConfigureSemiSync)
            .await?
            .is_some_and(|r| r.io_running || r.io_connecting);
        let statements = flavor.semi_sync_statements(
            settings,
            state.replica_enabled != settings.replica,
            replica_running,
        );
        self.run(
            Op::ConfigureSemiSync,
            self.inner.timeouts.statement,
            false,
            move |c| {
                Box::pin(async move {
                    for s in &statements {
                        c.query_drop(s.as_str()).await?;
                    }
                    Ok(())
                })
            },
        )
        .await
    }

    /// Whether the fence variables are set, and which server answered (its `server_id` and
    /// uptime), in one statement: what the sidecar reads every tick.
    pub async fn fence_reading(&self) -> Result<FenceReading, MysqlError> {
        type Row = (i64, Option<i64>, u32, String);
        let flavor = self.flavor().await?;
        let q = flavor.fence_reading_query();
        let row: Option<Row> = self
            .run_read(Op::Probe, move |c| Box::pin(c.query_first::<Row, _>(q)))
            .await?;
        let (ro, sro, server_id, uptime) = row.ok_or_else(|| {
            Op::Probe.error(
                &self.inner.label,
                Cause::Unexpected("no row for the fence reading".into()),
            )
        })?;
        let uptime: u64 = uptime.trim().parse().map_err(|_| {
            Op::Probe.error(
                &self.inner.label,
                Cause::Unexpected(format!("uptime {uptime:?} is not a number")),
            )
        })?;
        let fenced = if flavor.has_super_read_only() {
            sro.is_some_and(|v| v != 0)
        } else {
            ro != 0
        };
        Ok(FenceReading {
            fenced,
            server_id,
            uptime: Duration::from_secs(uptime),
        })
    }

    /// Whether the fence variables are set.
    pub async fn is_fenced(&self) -> Result<bool, MysqlError> {
        let (flavor, ro, sro, _, _) = self.read_variables(Op::Probe).await?;
        Ok(if flavor.has_super_read_only() {
            sro.unwrap_or(false)
        } else {
            ro
        })
    }

    /// Sets the fence (`read_only` on MariaDB, `super_read_only` on MySQL), bounded by `bound`.
    ///
    /// The statement can wait behind running statements, commits and `LOCK TABLES … WRITE`,
    /// so the session's `lock_wait_timeout` is lowered first (its default is a day). If the
    /// statement errors or does not answer in time, its wait is cancelled (`KILL QUERY`) and
    /// the variables are read back: an error is not proof that nothing happened.
    pub async fn fence(&self, bound: Duration) -> FenceOutcome {
        let flavor = match self.flavor().await {
            Ok(f) => f,
            Err(e) => {
                return FenceOutcome::Unknown {
                    reason: e.to_string(),
                };
            }
        };
        let started = Instant::now();
        let lock_wait = bound.as_secs().max(1);
        let attempt = async {
            let mut conn = self.connect(Op::Fence).await?;
            let id = u64::from(conn.id());
            let res = timeout(bound.saturating_sub(started.elapsed()), async {
                conn.query_drop(format!("SET SESSION lock_wait_timeout = {lock_wait}"))
                    .await?;
                conn.query_drop(flavor.fence_statement()).await
            })
            .await;
            Ok::<_, MysqlError>((id, res, conn))
        };
        let failure = match attempt.await {
            Ok((_, Ok(Ok(())), conn)) => {
                drop(conn);
                None
            }
            Ok((id, Ok(Err(e)), conn)) => {
                drop(conn);
                Some((Some(id), cause_of(&e, false).to_string()))
            }
            Ok((id, Err(_), conn)) => {
                // Close the waiting connection and cancel the statement server-side, so a late
                // landing cannot surprise a caller that moved on.
                drop(conn);
                Some((
                    Some(id),
                    format!("no answer within {} ms", bound.as_millis()),
                ))
            }
            Err(e) => Some((None, e.to_string())),
        };
        if let Some((Some(id), _)) = &failure {
            let id = *id;
            let _ = self
                .run(Op::Fence, self.inner.timeouts.statement, false, move |c| {
                    Box::pin(c.query_drop(format!("KILL QUERY {id}")))
                })
                .await;
        }
        match self.is_fenced().await {
            Ok(true) => FenceOutcome::Fenced,
            Ok(false) => FenceOutcome::NotFenced {
                reason: failure.map_or_else(
                    || {
                        "the fence statement succeeded but the variable reads back unset"
                            .to_string()
                    },
                    |(_, r)| r,
                ),
            },
            Err(e) => FenceOutcome::Unknown {
                reason: match failure {
                    Some((_, r)) => format!("{r}; then could not read the variables back: {e}"),
                    None => format!("could not read the variables back: {e}"),
                },
            },
        }
    }

    /// Clears the fence and confirms the server is writable.
    pub async fn unfence(&self) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        let stmts = flavor.unfence_statements();
        self.run(
            Op::Unfence,
            self.inner.timeouts.statement,
            false,
            move |c| {
                Box::pin(async move {
                    for s in stmts {
                        c.query_drop(*s).await?;
                    }
                    Ok(())
                })
            },
        )
        .await?;
        let (_, ro, _, _, _) = self.read_variables(Op::Unfence).await?;
        if ro {
            return Err(Op::Unfence.error(
                &self.inner.label,
                Cause::Unexpected("read_only still reads 1 after clearing it".into()),
            ));
        }
        Ok(())
    }

    /// Lists the server's sessions (needs `PROCESS` to see other accounts').
    pub async fn sessions(&self) -> Result<(u64, Vec<Session>), MysqlError> {
        type R = (u64, String, String, String, u64);
        let (own, rows): (Option<u64>, Vec<R>) = self
            .run_read(Op::KillSessions, |c| {
                Box::pin(async move {
                    let own: Option<u64> = c.query_first("SELECT CONNECTION_ID()").await?;
                    // Never INFO: a statement's text can hold data, and is never logged.
                    let rows: Vec<R> = c
                        .query("SELECT ID, IFNULL(USER, ''), IFNULL(HOST, ''), IFNULL(COMMAND, ''), IFNULL(TIME, 0) FROM information_schema.PROCESSLIST")
                        .await?;
                    Ok((own, rows))
                })
            })
            .await?;
        let sessions = rows
            .into_iter()
            .map(|(id, user, host, command, seconds)| Session {
                id,
                user,
                host,
                command,
                seconds,
            })
            .collect();
        Ok((own.unwrap_or(0), sessions))
    }

    /// The application sessions: never replication threads, server threads, this client's
    /// own connection, or the control-plane accounts (`spare_users`).
    pub async fn application_sessions(&self) -> Result<Vec<Session>, MysqlError> {
        let (own, sessions) = self.sessions().await?;
        let spare: Vec<&str> = self.inner.spare_users.iter().map(String::as_str).collect();
        Ok(sessions
            .into_iter()
            .filter(|s| is_application_session(s, own, &spare))
            .collect())
    }

    /// Kills the application sessions that can keep a fence from landing, and returns them:
    /// those running a statement (or committing), and — when none does, or when `with_idle`
    /// says killing the busy ones already did not let the fence land — the idle ones too, one
    /// of which holds the `LOCK TABLES … WRITE` the fence waits behind (an idle open
    /// transaction does not block a fence: its later `COMMIT` is refused). The server does not
    /// say which idle session holds a table lock without optional plugins, and a statement
    /// queued behind that lock is busy, so busy sessions alone may never unblock the fence.
    /// Each killed session loses only what it had not committed.
    pub async fn kill_fence_blockers(
        &self,
        with_idle: bool,
    ) -> Result<(Vec<Session>, KillReport), MysqlError> {
        let sessions = self.application_sessions().await?;
        let busy: Vec<Session> = sessions.iter().filter(|s| s.is_busy()).cloned().collect();
        let targets = if with_idle || busy.is_empty() {
            sessions
        } else {
            busy
        };
        let report = self
            .kill_sessions(targets.iter().map(|s| s.id).collect())
            .await?;
        Ok((targets, report))
    }

    /// Kills every application session: never replication threads, server threads, this
    /// client's own connection, or the control-plane accounts (`spare_users`).
    pub async fn kill_application_sessions(&self) -> Result<KillReport, MysqlError> {
        let targets: Vec<u64> = self
            .application_sessions()
            .await?
            .iter()
            .map(|s| s.id)
            .collect();
        self.kill_sessions(targets).await
    }

    async fn kill_sessions(&self, targets: Vec<u64>) -> Result<KillReport, MysqlError> {
        if targets.is_empty() {
            return Ok(KillReport::default());
        }
        let report = self
            .run(
                Op::KillSessions,
                self.inner.timeouts.statement,
                false,
                move |c| {
                    Box::pin(async move {
                        let mut report = KillReport::default();
                        for id in targets {
                            match c.query_drop(format!("KILL CONNECTION {id}")).await {
                                Ok(()) => report.killed.push(id),
                                // 1094: unknown thread id, it ended on its own.
                                Err(mysql_async::Error::Server(se)) if se.code == 1094 => {
                                    report.killed.push(id);
                                }
                                Err(mysql_async::Error::Server(se)) => {
                                    report
                                        .failed
                                        .push((id, format!("error {}: {}", se.code, se.message)));
                                }
                                Err(other) => return Err(other),
                            }
                        }
                        Ok(report)
                    })
                },
            )
            .await?;
        Ok(report)
    }

    /// Waits until the server has applied every transaction of `target`, up to `bound`.
    /// Returns `Ok(true)` when it has, `Ok(false)` on timeout.
    pub async fn wait_for_gtid(
        &self,
        target: &GtidSet,
        bound: Duration,
    ) -> Result<bool, MysqlError> {
        let (flavor, _, _, have, _) = self.read_variables(Op::WaitForGtid).await?;
        if have.contains(target) {
            return Ok(true);
        }
        let sql = flavor.wait_for_gtid(&target.to_string(), bound.as_secs_f64());
        // A fresh connection: the wait blocks it for up to `bound`.
        let mut conn = self.connect(Op::WaitForGtid).await?;
        let grace = bound + self.inner.timeouts.statement;
        let res: Result<Option<i64>, _> =
            match timeout(grace, conn.query_first::<Option<i64>, _>(sql)).await {
                Ok(r) => r.map(Option::flatten),
                Err(_) => {
                    return Err(Op::WaitForGtid.error(&self.inner.label, Cause::TimedOut(grace)));
                }
            };
        match res {
            Ok(Some(0)) => Ok(true),
            Ok(Some(_) | None) => {
                // Timed out server-side (MariaDB -1, MySQL 1), or NULL (not a replica):
                // confirm by reading what the server has.
                let (_, _, _, have, _) = self.read_variables(Op::WaitForGtid).await?;
                Ok(have.contains(target))
            }
            Err(e) => Err(Op::WaitForGtid.error(&self.inner.label, cause_of(&e, false))),
        }
    }

    /// Waits until the replica's SQL thread has applied everything its IO thread received
    /// (the relay log is drained), up to `bound`. Returns `Ok(true)` when drained, `Ok(false)`
    /// on timeout or when there is nothing to drain from (not a replica).
    pub async fn drain_relay_log(&self, bound: Duration) -> Result<bool, MysqlError> {
        let flavor = self.flavor().await?;
        let Some(status) = self.replica_status(flavor, Op::WaitForGtid).await? else {
            return Ok(false);
        };
        if !flavor.is_mariadb() || status.gtid_io_pos.is_empty() {
            // MySQL: the received set is Retrieved_Gtid_Set; waiting on gtid_executed to reach
            // it is the same wait. Without a position there is nothing to wait for.
            return Ok(true);
        }
        let received = GtidSet::parse(flavor.gtid_flavor(), &status.gtid_io_pos).map_err(|e| {
            Op::WaitForGtid.error(&self.inner.label, Cause::Unexpected(e.to_string()))
        })?;
        self.wait_for_gtid(&received, bound).await
    }

    /// Promotes the server in one go: [`Self::prepare_promotion`], then clears the fence and
    /// confirms it is writable. Only for a server that nobody else must learn about first
    /// (tests, tools): the operator announces a new active site between the two halves
    /// ("announce, then promote"), so it calls them separately.
    pub async fn promote(&self) -> Result<Promotion, MysqlError> {
        let promotion = self.prepare_promotion(None).await?;
        self.unfence()
            .await
            .map_err(|e| Op::Promote.error(&self.inner.label, e.cause().clone()))?;
        Ok(promotion)
    }

    /// The first half of a promotion, which leaves the server fenced: gives it the
    /// semi-synchronous `settings` of a primary (so the first write it takes already waits for
    /// an acknowledgement in `semi-sync` mode), stops and resets replication, and records its
    /// GTID set (the promotion point a returning primary is compared with).
    ///
    /// The server takes no client write until [`Self::unfence`]: the operator persists and
    /// serves the new active site in between, so no sidecar can see this server writable while
    /// the newest view names another site. Calling it again on a prepared server is harmless
    /// (there is no replication left to stop; the GTID set is the same).
    pub async fn prepare_promotion(
        &self,
        semi_sync: Option<Settings>,
    ) -> Result<Promotion, MysqlError> {
        if let Some(settings) = semi_sync {
            self.configure_semi_sync(settings)
                .await
                .map_err(|e| Op::Promote.error(&self.inner.label, e.cause().clone()))?;
        }
        let flavor = self.flavor().await?;
        let stop = flavor.stop_replica();
        let reset = flavor.reset_replica_all();
        let vars = flavor.variables_query();
        let gtid_text = self
            .run(
                Op::Promote,
                self.inner.timeouts.statement,
                false,
                move |c| {
                    Box::pin(async move {
                        c.query_drop(stop).await?;
                        c.query_drop(reset).await?;
                        let before: Option<Vars> = c.query_first(vars).await?;
                        Ok(before.and_then(|v| v.2).unwrap_or_default())
                    })
                },
            )
            .await?;
        let gtid = GtidSet::parse(flavor.gtid_flavor(), &gtid_text)
            .map_err(|e| Op::Promote.error(&self.inner.label, Cause::Unexpected(e.to_string())))?;
        Ok(Promotion { gtid })
    }

    /// Makes the server a fenced replica of `source` with GTID auto-positioning.
    pub async fn repoint(&self, source: &SourceSpec) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        let change = flavor.change_source(
            &source.host,
            source.port,
            &source.credentials.user,
            source.credentials.password.expose(),
            &source.tls,
        );
        let fence = flavor.fence_statement();
        let stop = flavor.stop_replica();
        let prepare = flavor.prepare_replica_position();
        let start = flavor.start_replica();
        // The first statements carry no secret; run them with messages kept.
        self.run(
            Op::Repoint,
            self.inner.timeouts.statement,
            false,
            move |c| {
                Box::pin(async move {
                    c.query_drop("SET SESSION lock_wait_timeout = 5").await?;
                    c.query_drop(fence).await?;
                    c.query_drop(stop).await?;
                    if let Some(p) = prepare {
                        c.query_drop(p).await?;
                    }
                    Ok(())
                })
            },
        )
        .await?;
        self.run(Op::Repoint, self.inner.timeouts.statement, true, move |c| {
            Box::pin(c.query_drop(change))
        })
        .await?;
        self.run(
            Op::Repoint,
            self.inner.timeouts.statement,
            false,
            move |c| Box::pin(c.query_drop(start)),
        )
        .await
    }

    /// Catches the server up from `source`, a more advanced site: unless it already holds
    /// `target` (the source's GTID set; a drained relay log may have brought it all), makes it
    /// a replica of `source` and waits, up to `bound`, until it has applied `target`.
    pub async fn catch_up(
        &self,
        source: &SourceSpec,
        target: &GtidSet,
        bound: Duration,
    ) -> Result<CaughtUp, MysqlError> {
        if self.probe().await.is_ok_and(|p| p.gtid.contains(target)) {
            return Ok(CaughtUp::AlreadyHeld);
        }
        self.repoint(source).await?;
        Ok(if self.wait_for_gtid(target, bound).await? {
            CaughtUp::Replicated
        } else {
            CaughtUp::TimedOut
        })
    }

    /// Strict fencing: sets the dead man's switch `after` from now (whole seconds, at least
    /// one), with binary logging off. Needs `EVENT` on `mysql.*`, `BINLOG ADMIN` and
    /// `event_scheduler=ON` (without it the event never fires: [`Self::event_scheduler_on`]).
    pub async fn arm_fence_deadline(&self, after: Duration) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        self.execute_unlogged(flavor.arm_deadline_statements(after.as_secs()))
            .await
    }

    /// Drops the dead man's switch, with binary logging off.
    pub async fn disarm_fence_deadline(&self) -> Result<(), MysqlError> {
        self.execute_unlogged(vec![crate::sql::DISARM_DEADLINE.to_string()])
            .await
    }

    /// Whether the server runs its event scheduler (`@@event_scheduler` is `ON`).
    pub async fn event_scheduler_on(&self) -> Result<bool, MysqlError> {
        let v = self.query_string("SELECT @@GLOBAL.event_scheduler").await?;
        Ok(v.is_some_and(|v| v.eq_ignore_ascii_case("ON")))
    }

    /// Runs `statements` on this server only, with binary logging off for them
    /// (`SET SESSION sql_log_bin = 0`): nothing they do reaches the binary log or a replica,
    /// and no GTID is allocated. For accounts (`CREATE USER … IDENTIFIED BY`), so that no
    /// password is written into a binary log that every site keeps and replicates. Runs on a
    /// connection of its own, closed afterwards (never returned to the cache with binary
    /// logging off). Needs `SUPER` or `BINLOG ADMIN`. The statements are not logged, and an
    /// error does not quote them.
    pub async fn execute_unlogged(&self, statements: Vec<String>) -> Result<(), MysqlError> {
        let mut conn = self.connect(Op::Admin).await?;
        let res = timeout(self.inner.timeouts.statement, async {
            conn.query_drop("SET SESSION sql_log_bin = 0").await?;
            for s in &statements {
                conn.query_drop(s.as_str()).await?;
            }
            Ok::<_, mysql_async::Error>(())
        })
        .await;
        drop(conn);
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Op::Admin.error(&self.inner.label, cause_of(&e, true))),
            Err(_) => Err(Op::Admin.error(
                &self.inner.label,
                Cause::TimedOut(self.inner.timeouts.statement),
            )),
        }
    }

    /// The connections of account `user` (any host), other than this client's own.
    pub async fn sessions_of(&self, user: &str) -> Result<Vec<u64>, MysqlError> {
        let (own, sessions) = self.sessions().await?;
        Ok(sessions
            .into_iter()
            .filter(|s| s.user == user && s.id != own)
            .map(|s| s.id)
            .collect())
    }

    /// What a new leader ends before it resumes operations: every connection of the clone
    /// account `clone_user` (a load or copy of an earlier leader), and the connections of
    /// this client's own account (the failover account) that have been busy with a statement
    /// for at least `busy_for` (an earlier leader's wait or catch-up; the short statements of
    /// sidecars sharing the account are left alone). Never this client's own connection.
    pub async fn end_previous_sessions(
        &self,
        clone_user: Option<&str>,
        busy_for: Duration,
    ) -> Result<KillReport, MysqlError> {
        let (own, sessions) = self.sessions().await?;
        let me = self.inner.credentials.user.as_str();
        let ids = sessions
            .into_iter()
            .filter(|s| s.id != own)
            .filter(|s| {
                clone_user.is_some_and(|u| u == s.user)
                    || (s.user == me
                        && !s.command.eq_ignore_ascii_case("Sleep")
                        && !s.command.starts_with("Binlog Dump")
                        && s.seconds >= busy_for.as_secs())
            })
            .map(|s| s.id)
            .collect();
        self.kill_sessions(ids).await
    }

    /// Kills every connection of account `user` (a copy's dump or load left behind by an
    /// operator that died mid-copy).
    pub async fn kill_sessions_of(&self, user: &str) -> Result<KillReport, MysqlError> {
        let ids = self.sessions_of(user).await?;
        self.kill_sessions(ids).await
    }

    /// The server's databases other than the system ones (`mysql`, `information_schema`,
    /// `performance_schema`, `sys`): what a reclone copies (or drops).
    pub async fn application_databases(&self) -> Result<Vec<String>, MysqlError> {
        self.run(Op::Admin, self.inner.timeouts.statement, false, move |c| {
            Box::pin(async move {
                c.query(
                    "SELECT schema_name FROM information_schema.schemata WHERE schema_name NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys') ORDER BY schema_name",
                )
                .await
            })
        })
        .await
    }

    /// Readies a reclone's target for its load (MariaDB): fenced (the caller fences first;
    /// this sets it again), replication stopped and forgotten, its binary logs and GTID
    /// positions reset — the divergent transactions it held are gone from them from here on.
    pub async fn prepare_clone_target(&self) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        if !flavor.is_mariadb() {
            return Err(Op::Admin.error(
                &self.inner.label,
                Cause::Unexpected(format!("a reclone needs MariaDB; the server is {flavor}")),
            ));
        }
        self.run(Op::Admin, self.inner.timeouts.statement, false, move |c| {
            Box::pin(async move {
                c.query_drop("SET SESSION lock_wait_timeout = 5").await?;
                c.query_drop(flavor.fence_statement()).await?;
                c.query_drop(flavor.stop_replica()).await?;
                c.query_drop("RESET SLAVE ALL").await?;
                c.query_drop("RESET MASTER").await?;
                c.query_drop("SET GLOBAL gtid_slave_pos = ''").await
            })
        })
        .await
    }

    /// After a reclone's load (MariaDB, binary log empty): makes `position` — the copy's — the
    /// server's own GTID position, so re-pointing it (which starts from its binary-log
    /// position) resumes right after the copy, in every domain.
    pub async fn seed_gtid_position(&self, position: &GtidSet) -> Result<(), MysqlError> {
        let sql = format!(
            "SET GLOBAL gtid_binlog_state = {}",
            crate::sql::quote(&position.to_string())
        );
        self.run(Op::Admin, self.inner.timeouts.statement, false, move |c| {
            Box::pin(c.query_drop(sql))
        })
        .await
    }

    /// Starts replication's threads (a donor replica whose applier a dump stopped, when the
    /// dump died before it could start it again). Threads already running stay as they are.
    pub async fn start_replication(&self) -> Result<(), MysqlError> {
        let flavor = self.flavor().await?;
        let start = flavor.start_replica();
        self.run(Op::Admin, self.inner.timeouts.statement, false, move |c| {
            Box::pin(c.query_drop(start))
        })
        .await
    }

    /// Runs an administrative statement (harness setup, tests). The statement is not logged.
    pub async fn execute(&self, sql: impl Into<String>) -> Result<(), MysqlError> {
        let sql = sql.into();
        self.run(Op::Admin, self.inner.timeouts.statement, true, move |c| {
            Box::pin(c.query_drop(sql))
        })
        .await
    }

    /// Runs a query returning one string column, first row.
    pub async fn query_string(&self, sql: impl Into<String>) -> Result<Option<String>, MysqlError> {
        let sql = sql.into();
        self.run(Op::Admin, self.inner.timeouts.statement, false, move |c| {
            Box::pin(async move {
                let v: Option<Option<String>> = c.query_first(sql).await?;
                Ok(v.flatten())
            })
        })
        .await
    }

    /// Audits an account's global privileges for ways around the fence
    /// (`SHOW GRANTS FOR`, which needs `SELECT` on the `mysql` schema).
    pub async fn audit_account(&self, user: &str, host: &str) -> Result<AccountAudit, MysqlError> {
        let flavor = self.flavor().await?;
        let sql = format!(
            "SHOW GRANTS FOR {}@{}",
            crate::sql::quote(user),
            crate::sql::quote(host)
        );
        let grants: Vec<String> = self
            .run(Op::Audit, self.inner.timeouts.statement, false, move |c| {
                Box::pin(c.query::<String, _>(sql))
            })
            .await?;
        Ok(AccountAudit {
            account: format!("'{user}'@'{host}'"),
            bypass_privileges: flavor.fence_bypass_privileges(&grants),
        })
    }

    /// Audits the account this client connects as (`SHOW GRANTS`, no privilege needed).
    pub async fn audit_self(&self) -> Result<AccountAudit, MysqlError> {
        let flavor = self.flavor().await?;
        let grants: Vec<String> = self
            .run(Op::Audit, self.inner.timeouts.statement, false, |c| {
                Box::pin(c.query::<String, _>("SHOW GRANTS"))
            })
            .await?;
        Ok(AccountAudit {
            account: self.inner.credentials.user.clone(),
            bypass_privileges: flavor.fence_bypass_privileges(&grants),
        })
    }
}

/// A row as column name → text value (`None` for SQL NULL).
fn row_map(row: Row) -> BTreeMap<String, Option<String>> {
    let names: Vec<String> = row
        .columns_ref()
        .iter()
        .map(|c| c.name_str().into_owned())
        .collect();
    let values = row.unwrap();
    names
        .into_iter()
        .zip(values)
        .map(|(n, v)| {
            let s = match v {
                mysql_async::Value::NULL => None,
                mysql_async::Value::Bytes(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                other => Some(other.as_sql(true).trim_matches('\'').to_string()),
            };
            (n, s)
        })
        .collect()
}
