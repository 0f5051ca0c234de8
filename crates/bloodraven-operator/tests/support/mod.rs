//! Test support: an operator started in-process with a test PKI, a signing key, a manual
//! clock, and an HTTPS client that trusts only the test CA.

#![allow(dead_code)]

pub mod kube;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::reason::ConditionType;
use bloodraven_core::status::{GroupStatus, SiteState, SiteStatus};
use bloodraven_core::time::{Clock, ManualClock};
use bloodraven_operator::auth::{self, SigningKey};
use bloodraven_operator::config;
use bloodraven_operator::group::GroupRuntime;
use bloodraven_operator::operator::{self, OperatorHandle};
use bloodraven_operator::platform::embedded::EmbeddedPlatform;
use bloodraven_runtime::clock::SystemClock;
use bloodraven_store::{Durability, SqliteStore, Store};
use bloodraven_testkit::faults::{Fault, Faults, When};
use bloodraven_testkit::ledger;
use reqwest::{Method, StatusCode};
use serde_json::Value;

pub const GROUP: &str = "playground";

pub struct Env {
    pub dir: tempfile::TempDir,
    pub clock: ManualClock,
    pub key: SigningKey,
    pub config_path: PathBuf,
    pub ca: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let pki = bloodraven_runtime::tls::generate_pki(
            &dir.path().join("tls"),
            &["127.0.0.1", "localhost"],
        )
        .unwrap();
        let key_path = dir.path().join("token.key");
        std::fs::write(&key_path, SigningKey::generate_text().unwrap()).unwrap();
        std::fs::write(
            dir.path().join("site.cred"),
            "username=bloodraven\npassword=unused\n",
        )
        .unwrap();
        let config_path = dir.path().join("bloodraven.yaml");
        std::fs::write(&config_path, config_text(dir.path())).unwrap();
        Env {
            clock: ManualClock::new(SystemClock.now()),
            key: SigningKey::load(&key_path).unwrap(),
            config_path,
            ca: pki.ca_cert,
            dir,
        }
    }

    pub fn config(&self) -> config::LoadedConfig {
        config::load(&self.config_path).unwrap()
    }

    pub fn token(&self, namespace: &str, sa: &str) -> String {
        auth::issue(
            &self.key,
            "bloodraven-deploy",
            &auth::Identity::new(namespace, sa),
            Duration::from_secs(3600),
            self.clock.now(),
        )
        .unwrap()
    }

    pub async fn start(&self) -> OperatorHandle {
        let clock = Arc::new(self.clock.clone());
        leading(operator::start(self.config(), clock, Vec::new()), 10).await
    }

    pub async fn start_with_store(&self, store: Arc<dyn Store>) -> OperatorHandle {
        let clock = Arc::new(self.clock.clone());
        let cfg = self.config();
        let platform = EmbeddedPlatform::over(&cfg, store);
        let started = operator::start_on(cfg, platform, clock, Vec::new());
        leading(started, 10).await
    }

    /// [`Env::start_with_store`] on the real store with `faults` injected.
    pub async fn start_under(&self, faults: &Arc<Faults>) -> OperatorHandle {
        self.start_with_store(faults.over(Arc::new(self.open_store())))
            .await
    }

    /// Makes `op`'s group healthy with `iad` active (see [`bootstrap`]), at the env's clock.
    pub async fn bootstrap(&self, op: &OperatorHandle) -> Arc<GroupRuntime> {
        let rt = op.group(GROUP).await.unwrap();
        bootstrap(&rt, self.clock.now()).await;
        rt
    }

    /// A client of `op`'s deploy API, trusting the test CA.
    pub fn client(&self, op: &OperatorHandle) -> Client {
        Client::new(&self.ca, op.https_addr.unwrap())
    }

    /// Starts the operator on the real store behind a gate and bootstraps the group: closing
    /// the gate (`gate.send_replace(true)`) holds the group's writes in flight.
    pub async fn start_gated(&self) -> (OperatorHandle, Gated, Arc<GroupRuntime>) {
        let (gate, fault) = Fault::gate();
        let faults = Faults::new();
        faults.on(When::group_write(), fault);
        let op = self.start_under(&faults).await;
        let rt = self.bootstrap(&op).await;
        (op, Gated { gate, faults }, rt)
    }

    pub fn open_store(&self) -> SqliteStore {
        SqliteStore::open(
            &self.dir.path().join("data").join(operator::STORE_FILE),
            Durability::Full,
        )
        .unwrap()
    }
}

/// The in-process operator's configuration (`bloodraven.yaml` next to this file), its data in
/// `dir/data`.
pub fn config_text(dir: &Path) -> String {
    let data = dir.join("data");
    include_str!("bloodraven.yaml").replace("DATA_DIR", &data.display().to_string())
}

/// A healthy status: the active site writable, the other replicating.
pub fn healthy(s: &mut GroupStatus, now: bloodraven_core::time::Timestamp) {
    s.sites = ["iad", "pdx"]
        .into_iter()
        .map(|name| {
            let active = s.active_site == name;
            SiteStatus {
                name: name.into(),
                state: if active {
                    SiteState::Writable
                } else {
                    SiteState::ReadOnly
                },
                replicating: !active,
                seconds_behind_source: (!active).then_some(0),
                ..SiteStatus::default()
            }
        })
        .collect();
    s.observed_at = Some(now);
}

/// Moves the group to `pdx`, healthy at `now` (generation +1, as the controller would): the
/// generation written. Spawn it to hold the change in flight behind a gated store.
pub async fn change_to_pdx(
    rt: Arc<GroupRuntime>,
    now: bloodraven_core::time::Timestamp,
) -> Result<u64, bloodraven_store::StoreError> {
    rt.change_active_site("pdx", |s| healthy(s, now)).await
}

/// Makes the group healthy with `iad` active (generation +1, as the controller would).
pub async fn bootstrap(rt: &Arc<GroupRuntime>, now: bloodraven_core::time::Timestamp) -> u64 {
    let g = rt
        .change_active_site("iad", |s| healthy(s, now))
        .await
        .unwrap();
    wait_leases_synced(rt).await;
    g
}

/// Waits until the background revocation after a topology change is persisted.
pub async fn wait_leases_synced(rt: &Arc<GroupRuntime>) {
    for _ in 0..500 {
        if !rt.flags().topology_change_pending {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("leases never synced to the new generation");
}

pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Answer {
    /// The lease token a grant answered with.
    pub fn lease_token(&self) -> &str {
        self.body["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no lease token in {}", self.text))
    }
}

impl Client {
    pub fn new(ca: &Path, addr: std::net::SocketAddr) -> Client {
        Client {
            http: bloodraven_runtime::tls::http_client(Some(ca), Duration::from_secs(30)).unwrap(),
            base: format!("https://{addr}"),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let resp = r.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
            text,
        }
    }

    pub async fn grant(
        &self,
        token: &str,
        kind: &str,
        op: &str,
        instance: &str,
        ttl: i64,
    ) -> Answer {
        let body = format!(
            r#"{{"kind":"{kind}","operationId":"{op}","instance":"{instance}","ttlSeconds":{ttl}}}"#
        );
        self.call(
            Method::POST,
            &format!("/deploy/v1/groups/{GROUP}/leases"),
            Some(token),
            Some(&body),
            &[],
        )
        .await
    }

    /// [`Client::grant`] of `kind` for `op` on `counter-app` (60 s) as a pipeline calls it,
    /// asserted granted (`201`): a `423` says the group is between confirmed states (a
    /// replica re-pointed after a failover can report a lag spike for a poll or two, and the
    /// group is honestly `Degraded` then), so it waits the `retryAfterSeconds` the answer
    /// names and asks again, for at most 30 s.
    pub async fn grant_when_stable(&self, token: &str, kind: &str, op: &str) -> Answer {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let a = self.grant(token, kind, op, "counter-app", 60).await;
            if a.status != StatusCode::LOCKED || tokio::time::Instant::now() > deadline {
                assert_eq!(a.status, StatusCode::CREATED, "{kind} {op}: {}", a.text);
                return a;
            }
            let wait = a.body["retryAfterSeconds"].as_u64().unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }

    /// A migration lease for `op` on `counter-app` for `ttl` seconds, asserted granted (`201`):
    /// its lease token.
    pub async fn granted_migration(&self, token: &str, op: &str, ttl: i64) -> String {
        let g = self.grant(token, "migration", op, "counter-app", ttl).await;
        assert_eq!(g.status, StatusCode::CREATED, "migration: {}", g.text);
        g.lease_token().to_string()
    }

    /// A migration lease for `op` on `counter-app` and its failover-hold, as a pipeline takes
    /// them before a migration, each asserted granted (`201`). Returns (migration, hold).
    pub async fn migration_with_hold(&self, token: &str, op: &str, ttl: i64) -> (Answer, Answer) {
        let m = self.grant(token, "migration", op, "counter-app", ttl).await;
        assert_eq!(m.status, StatusCode::CREATED, "migration: {}", m.text);
        let h = self
            .grant(token, "failover-hold", op, "counter-app", ttl)
            .await;
        assert_eq!(h.status, StatusCode::CREATED, "failover-hold: {}", h.text);
        (m, h)
    }

    pub async fn renew(&self, token: &str, kind: &str, op: &str, lease_token: &str) -> Answer {
        let body = format!(r#"{{"token":"{lease_token}"}}"#);
        self.call(
            Method::PUT,
            &format!("/deploy/v1/groups/{GROUP}/leases/{kind}/{op}"),
            Some(token),
            Some(&body),
            &[],
        )
        .await
    }

    /// Renews lease `kind`/`op` (every 20 ms, for at most 5 s) until `done` holds for the
    /// answer, and returns the last answer: the revocation a test caused has landed.
    pub async fn renew_until(
        &self,
        token: &str,
        kind: &str,
        op: &str,
        lease_token: &str,
        done: impl Fn(&Answer) -> bool,
    ) -> Answer {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let r = self.renew(token, kind, op, lease_token).await;
            if done(&r) || tokio::time::Instant::now() > deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn release(&self, token: &str, kind: &str, op: &str, lease_token: &str) -> Answer {
        self.call(
            Method::DELETE,
            &format!("/deploy/v1/groups/{GROUP}/leases/{kind}/{op}"),
            Some(token),
            None,
            &[("x-lease-token", lease_token)],
        )
        .await
    }

    pub async fn observe(&self, token: &str, group: &str) -> Answer {
        self.call(
            Method::GET,
            &format!("/deploy/v1/groups/{group}"),
            Some(token),
            None,
            &[],
        )
        .await
    }
}

/// A group of real MariaDB servers (`iad`, `pdx`, `reader`) and an operator controlling it.
pub struct Live {
    pub harness: bloodraven_launch::mysql::Launcher,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub ca: PathBuf,
    pub key: SigningKey,
}

/// Timings of a live group (short, for tests).
#[derive(Clone, Copy)]
pub struct Timings {
    pub poll: &'static str,
    pub cooldown: &'static str,
    pub drain: &'static str,
    pub max_lag_wait: &'static str,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            poll: "300ms",
            cooldown: "0s",
            drain: "2s",
            max_lag_wait: "20s",
        }
    }
}

impl Live {
    /// Every site's name and application connection, for a `Writer` (`iad`, `pdx`, `reader`).
    pub fn writer_targets(&self) -> Vec<(String, mysql_async::Opts)> {
        ledger::sites(&self.harness)
    }

    /// The same for a `Probe`.
    pub fn probe_targets(&self) -> Vec<ledger::Target> {
        ledger::targets(&self.writer_targets())
    }

    pub async fn start(t: Timings) -> Live {
        Live::start_with(t, |_| {}).await
    }

    /// [`Live::start`] with the group's options adjusted by `tweak` before they are written.
    pub async fn start_with(
        t: Timings,
        tweak: impl FnOnce(&mut bloodraven_launch::local::LocalOptions),
    ) -> Live {
        use bloodraven_core::config::SiteRole;
        let harness = bloodraven_launch::mysql::Launcher::start_group(&["iad", "pdx", "reader"])
            .await
            .unwrap();
        ledger::set_up_primary(
            &harness,
            &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut o = bloodraven_launch::local::LocalOptions::new(
            GROUP,
            vec![
                SiteRole::PrimaryCandidate,
                SiteRole::PrimaryCandidate,
                SiteRole::ReadOnly,
            ],
        );
        o.poll_interval = t.poll.into();
        o.failover_cooldown = t.cooldown.into();
        o.drain_timeout = t.drain.into();
        o.max_lag_wait = t.max_lag_wait.into();
        tweak(&mut o);
        let files = bloodraven_launch::local::write_files(dir.path(), &harness, &o).unwrap();
        Live {
            harness,
            key: SigningKey::load(&files.token_key).unwrap(),
            config_path: files.config,
            ca: files.pki.ca_cert,
            dir,
        }
    }

    pub fn config(&self) -> config::LoadedConfig {
        config::load(&self.config_path).unwrap()
    }

    pub async fn operator(&self) -> OperatorHandle {
        self.operator_reading(bloodraven_runtime::clock::system())
            .await
    }

    /// [`Live::operator`], reading wall time from `clock`.
    pub async fn operator_reading(
        &self,
        clock: bloodraven_runtime::clock::SharedClock,
    ) -> OperatorHandle {
        leading(operator::start(self.config(), clock, controller()), 10).await
    }

    /// Starts the operator on the group's own store with `faults` injected, and waits until it
    /// has bootstrapped the group onto iad with every replica replicating.
    pub async fn bootstrapped_under(&self, faults: &Arc<Faults>) -> OperatorHandle {
        let store = SqliteStore::open(&self.store_path(), Durability::Full).unwrap();
        let cfg = self.config();
        let platform = EmbeddedPlatform::over(&cfg, faults.over(Arc::new(store)));
        let started = operator::start_on(
            cfg,
            platform,
            bloodraven_runtime::clock::system(),
            controller(),
        );
        let h = leading(started, 15).await;
        wait_status(&h, Duration::from_secs(15), "bootstrap", |s| {
            s.active_site == "iad" && s.replication_running()
        })
        .await;
        h
    }

    /// [`Live::bootstrapped_under`] a store on which the writes `when` picks never complete,
    /// as if the operator stopped just before them.
    pub async fn bootstrapped_stalling(&self, when: When) -> OperatorHandle {
        let faults = Faults::new();
        faults.on(when, Fault::Stall);
        self.bootstrapped_under(&faults).await
    }

    /// The ids in `app.writes` on site `i` that match the SQL condition `filter`, in order.
    pub async fn write_ids(&self, i: usize, filter: &str) -> Vec<u64> {
        use mysql_async::prelude::Queryable as _;
        let mut c = mysql_async::Conn::new(self.harness.app_opts(i))
            .await
            .unwrap();
        c.query(format!(
            "SELECT id FROM app.writes WHERE {filter} ORDER BY id"
        ))
        .await
        .unwrap()
    }

    /// Sets `read_only` on site `i`'s server behind the operator's back, as an administrator.
    pub async fn set_read_only(&self, i: usize, on: bool) {
        let value = if on { "ON" } else { "OFF" };
        self.harness
            .admin(i)
            .unwrap()
            .execute(format!("SET GLOBAL read_only = {value}"))
            .await
            .unwrap();
    }

    /// An application session on iad that holds `LOCK TABLES app.locked WRITE` (idle), and one
    /// whose insert waits behind it (running).
    pub async fn hold_a_long_lock(&self) -> (mysql_async::Conn, tokio::task::JoinHandle<bool>) {
        use mysql_async::prelude::Queryable as _;
        let mut holder = mysql_async::Conn::new(self.harness.app_opts(0))
            .await
            .unwrap();
        holder
            .query_drop("LOCK TABLES app.locked WRITE")
            .await
            .unwrap();
        let opts = self.harness.app_opts(0);
        let queued = tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(opts).await.unwrap();
            c.query_drop("SET SESSION lock_wait_timeout = 40")
                .await
                .unwrap();
            c.query_drop("INSERT INTO app.locked VALUES (1)")
                .await
                .is_ok()
        });
        if !self
            .harness
            .wait_app_statement_running(0, "INSERT INTO app.locked", Duration::from_secs(10))
            .await
        {
            // Say what the server was doing, for diagnosis.
            let mut admin = mysql_async::Conn::new(self.harness.app_opts(0)).await;
            let sessions: Vec<(u64, String, String, Option<String>)> = match admin.as_mut() {
                Ok(c) => c
                    .query("SELECT ID, USER, COMMAND, STATE FROM information_schema.PROCESSLIST")
                    .await
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            panic!(
                "the queued insert never ran (its task finished: {}; the holder answers: {}); sessions: {sessions:?}",
                queued.is_finished(),
                holder.query_drop("SELECT 1").await.is_ok()
            );
        }
        (holder, queued)
    }

    /// Waits two seconds (several polls), then checks that site `i`'s server is still
    /// read-only and replicates from nobody: the operator left `what` fenced and did not
    /// re-point it.
    pub async fn stays_fenced_unreplicated(&self, i: usize, what: &str) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let p = self.harness.failover_client(i).probe().await.unwrap();
        assert!(p.read_only, "{what} is writable: {p:?}");
        assert!(p.replica.is_none(), "{what} must not be re-pointed: {p:?}");
    }

    /// Site `i`'s `@@max_connections`.
    pub async fn max_connections(&self, i: usize) -> u64 {
        use mysql_async::prelude::Queryable as _;
        let mut c = mysql_async::Conn::new(self.harness.app_opts(i))
            .await
            .unwrap();
        c.query_first("SELECT @@max_connections")
            .await
            .unwrap()
            .unwrap()
    }

    /// Whether site `i`'s server is read-only now.
    pub async fn read_only(&self, i: usize) -> bool {
        let probe = self.harness.failover_client(i).probe().await;
        probe.expect("probe").read_only
    }

    pub fn store_path(&self) -> PathBuf {
        self.dir.path().join("data").join(operator::STORE_FILE)
    }

    /// A deploy token for `ci:deployer`, valid for an hour.
    pub fn token(&self) -> String {
        let who = auth::Identity::new("ci", "deployer");
        let hour = Duration::from_secs(3600);
        auth::issue(
            &self.key,
            "bloodraven-deploy",
            &who,
            hour,
            SystemClock.now(),
        )
        .unwrap()
    }
}

/// `GET path` on the operator's plain HTTP listener (`/metrics`, `/status`, `/active-site?…`).
pub async fn plain_get(op: &OperatorHandle, path: &str) -> reqwest::Response {
    reqwest::get(format!("http://{}{path}", op.http_addr))
        .await
        .unwrap()
}

/// The body of [`plain_get`].
pub async fn plain_text(op: &OperatorHandle, path: &str) -> String {
    plain_get(op, path).await.text().await.unwrap()
}

/// The JSON body of [`plain_get`].
pub async fn plain_json(op: &OperatorHandle, path: &str) -> Value {
    plain_get(op, path).await.json().await.unwrap()
}

/// The operator `started` (an `operator::start…` call), once it leads (within `limit_secs`).
pub async fn leading(
    started: impl std::future::Future<Output = Result<OperatorHandle, operator::StartError>>,
    limit_secs: u64,
) -> OperatorHandle {
    let h = started.await.unwrap();
    assert!(
        h.wait_leading(Duration::from_secs(limit_secs)).await,
        "operator did not lead within {limit_secs} s"
    );
    h
}

/// The group tasks of a live group's operator: the failover controller.
pub fn controller() -> Vec<Arc<dyn operator::GroupTask>> {
    vec![Arc::new(bloodraven_operator::controller::ControllerTask)]
}

/// Requests a planned failover of the group to `to`, as `bloodraven failover` does.
pub async fn request_failover(op: &OperatorHandle, to: &str) {
    let rt = op.group(GROUP).await.unwrap();
    rt.annotate(PLANNED_FAILOVER, to).await.unwrap();
}

/// The group's events, oldest first, as (reason, message).
pub async fn events(op: &OperatorHandle) -> Vec<(String, String)> {
    let rt = op.group(GROUP).await.unwrap();
    bloodraven_operator::events::list(rt.store(), "default", GROUP)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, e)| (e.reason, e.message))
        .collect()
}

/// The messages of the group's events with `reason`, oldest first.
pub async fn event_messages(op: &OperatorHandle, reason: &str) -> Vec<String> {
    let all = events(op).await;
    all.into_iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, m)| m)
        .collect()
}

/// Waits (up to 15 s) until the group has `count` events with `reason`.
pub async fn wait_event(op: &OperatorHandle, reason: &str, count: usize) {
    for _ in 0..300 {
        if event_messages(op, reason).await.len() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {count}th {reason} event: {:?}", events(op).await);
}

/// Whether the group is Ready on `site` at generation 1 with replication running: a fresh
/// group's bootstrap is over.
pub fn bootstrapped_on(site: &'static str) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.active_site == site
            && s.topology_generation == 1
            && s.condition(&ConditionType::Ready)
                .is_some_and(bloodraven_core::status::Condition::is_true)
            && s.replication_running()
    }
}

/// Waits (up to `limit`) until the group fails over to `site`.
pub async fn wait_failover_to(op: &OperatorHandle, site: &str, limit: Duration) -> GroupStatus {
    let what = format!("failover to {site}");
    wait_status(op, limit, &what, |s| s.active_site == site).await
}

/// Whether `site` replicates and has no recovery state: it follows the active site.
pub fn follows(site: &'static str) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.site(site)
            .is_some_and(|x| x.replicating && x.recovery_state.is_none())
    }
}

/// Waits (up to 20 s) until `site` follows the active site again.
pub async fn wait_follows(op: &OperatorHandle, site: &'static str) -> GroupStatus {
    let what = format!("{site} following the active site");
    wait_status(op, Duration::from_secs(20), &what, follows(site)).await
}

/// Whether the group's planned failover is in `phase`.
pub fn planned_in(phase: PlannedFailoverPhase) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.planned_failover
            .as_ref()
            .is_some_and(|p| p.phase == phase)
    }
}

/// Waits (up to `limit`) until the group's planned failover is in `phase`.
pub async fn wait_planned(
    op: &OperatorHandle,
    limit: Duration,
    phase: PlannedFailoverPhase,
) -> GroupStatus {
    let what = format!("planned failover {phase:?}");
    wait_status(op, limit, &what, planned_in(phase)).await
}

/// Whether the group's planned failover has ended (succeeded or failed).
pub fn planned_ended(s: &GroupStatus) -> bool {
    s.planned_failover
        .as_ref()
        .is_some_and(|p| p.phase.is_terminal())
}

/// Starts the operator and waits until it has bootstrapped the group onto `iad`.
pub async fn bootstrapped(live: &Live) -> OperatorHandle {
    let op = live.operator().await;
    wait_status(
        &op,
        Duration::from_secs(20),
        "bootstrap",
        bootstrapped_on("iad"),
    )
    .await;
    op
}

/// [`bootstrapped`], then waits until every replica replicates from iad.
pub async fn replicating(live: &Live) -> OperatorHandle {
    let op = bootstrapped(live).await;
    wait_replicating(&op, Duration::from_secs(20)).await;
    op
}

/// Waits (up to `limit`) until every replica replicates from the active site.
pub async fn wait_replicating(op: &OperatorHandle, limit: Duration) -> GroupStatus {
    wait_status(
        op,
        limit,
        "replication running",
        GroupStatus::replication_running,
    )
    .await
}

/// Waits until `pred` holds for the group's status (or panics after `limit`).
pub async fn wait_status(
    op: &OperatorHandle,
    limit: Duration,
    what: &str,
    pred: impl Fn(&GroupStatus) -> bool,
) -> GroupStatus {
    let rt = op.group(GROUP).await.unwrap();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let s = rt.snapshot().status().clone();
        if pred(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() <= deadline,
            "timed out waiting for {what}; status: {}",
            serde_json::to_string_pretty(&s).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `serve` (one round of what restarts the servers an ordered update asks for: the update
/// desk, or a kubelet for the fake's Pods) until `pred` holds for the group's status, within
/// `limit`. Returns that status and everything `serve` answered, in order.
pub async fn serve_update_until<T: std::fmt::Debug>(
    op: &OperatorHandle,
    limit: Duration,
    what: &str,
    mut serve: impl AsyncFnMut() -> Vec<T>,
    pred: impl Fn(&GroupStatus) -> bool,
) -> (GroupStatus, Vec<T>) {
    let rt = op.group(GROUP).await.unwrap();
    let deadline = tokio::time::Instant::now() + limit;
    let mut served = Vec::new();
    loop {
        served.extend(serve().await);
        let s = rt.snapshot().status().clone();
        if pred(&s) {
            return (s, served);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}; served {served:?}; update: {:?}",
            s.update_phase
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the group's ordered update has ended (succeeded or failed).
pub fn update_ended(s: &GroupStatus) -> bool {
    s.update_phase
        .as_ref()
        .is_some_and(|u| u.phase.is_terminal())
}

/// What the application saw of an ordered update that made pdx the primary: once iad
/// replicates again and the writer found pdx, `writer` and `probe` stop; pdx holds every
/// acknowledged write (over a hundred), no probe round found two writable sites, and every
/// server runs the updated `max_connections` (222).
pub async fn judge_update(
    live: &Live,
    op: &OperatorHandle,
    writer: ledger::Writer,
    probe: ledger::Probe,
    story: &str,
) {
    wait_status(op, Duration::from_secs(20), "iad replicates again", |s| {
        s.site("iad").is_some_and(|i| i.replicating) && s.replication_running()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wlog = writer.stop().await;
    let plog = probe.stop().await;
    let report = ledger::check(&live.harness.app_opts(1), &wlog, Some(&plog))
        .await
        .unwrap();
    eprintln!("{story}: {}", report.summary());
    assert!(report.acknowledged > 100, "{}", report.summary());
    assert!(report.lost.is_empty(), "{}", report.summary());
    assert_eq!(report.two_writable_rounds, 0, "{}", report.summary());
    for i in 0..live.harness.len() {
        let site = live.harness.name(i);
        assert_eq!(live.max_connections(i).await, 222, "{site}");
    }
}

/// The story of a returning old primary with divergent transactions, up to its return:
/// replication cut on pdx and the reader, two rows written on iad only (9001, 9002), iad
/// killed, the failover to pdx, and five rows written on pdx (9100-9104), so pdx's position
/// is numerically ahead of iad's. The caller restarts iad as its story needs.
pub async fn diverge_and_fail_over(live: &mut Live, op: &OperatorHandle) {
    use mysql_async::prelude::Queryable as _;
    wait_replicating(op, Duration::from_secs(10)).await;
    for i in [1, 2] {
        let admin = live.harness.admin(i).unwrap();
        admin.execute("STOP SLAVE").await.unwrap();
    }
    let mut c = mysql_async::Conn::new(live.harness.app_opts(0))
        .await
        .unwrap();
    c.query_drop("INSERT INTO app.writes (id, site) VALUES (9001, 'iad-only'), (9002, 'iad-only')")
        .await
        .unwrap();
    drop(c);
    live.harness.kill(0).unwrap();
    wait_failover_to(op, "pdx", Duration::from_secs(20)).await;
    let mut c = mysql_async::Conn::new(live.harness.app_opts(1))
        .await
        .unwrap();
    for id in 9100..9105 {
        let row = format!("INSERT INTO app.writes (id, site) VALUES ({id}, 'pdx')");
        c.query_drop(row).await.unwrap();
    }
}

/// The group's writes, held while `gate` says `true` (see [`Env::start_gated`]).
#[derive(Debug)]
pub struct Gated {
    pub gate: tokio::sync::watch::Sender<bool>,
    pub faults: Arc<Faults>,
}
