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
        let h = operator::start(self.config(), Arc::new(self.clock.clone()), Vec::new())
            .await
            .unwrap();
        assert!(
            h.wait_leading(Duration::from_secs(10)).await,
            "operator did not become ready"
        );
        h
    }

    pub async fn start_with_store(&self, store: Arc<dyn Store>) -> OperatorHandle {
        let h = operator::start_with_store(
            self.config(),
            store,
            Arc::new(self.clock.clone()),
            Vec::new(),
        )
        .await
        .unwrap();
        assert!(
            h.wait_leading(Duration::from_secs(10)).await,
            "operator did not become ready"
        );
        h
    }

    /// Starts the operator on the real store behind a gate and bootstraps the group: closing
    /// the gate (`gate.send_replace(true)`) holds the group's writes in flight.
    pub async fn start_gated(&self) -> (OperatorHandle, Gated, Arc<GroupRuntime>) {
        let (gate, fault) = Fault::gate();
        let faults = Faults::new();
        faults.on(When::group_write(), fault);
        let op = self
            .start_with_store(faults.over(Arc::new(self.open_store())))
            .await;
        let rt = op.group(GROUP).await.unwrap();
        bootstrap(&rt, self.clock.now()).await;
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

pub fn config_text(dir: &Path) -> String {
    format!(
        r#"apiVersion: bloodraven.shipstream.io/v1alpha1
kind: OperatorConfig
dataDir: {data}
listen: {{http: "127.0.0.1:0", https: "127.0.0.1:0"}}
tls: {{certFile: tls/server.crt, keyFile: tls/server.key}}
tokenSigningKeyFile: token.key
deployAPI: {{enabled: true}}
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlFailoverGroup
metadata: {{name: playground, namespace: default}}
spec:
  sites:
    - name: iad
      mysql: {{host: 127.0.0.1, port: 1, credentials: {{file: site.cred}}}}
      sidecar: {{url: "http://127.0.0.1:1"}}
    - name: pdx
      mysql: {{host: 127.0.0.1, port: 2, credentials: {{file: site.cred}}}}
      sidecar: {{url: "http://127.0.0.1:2"}}
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlFailoverGroup
metadata: {{name: second, namespace: default}}
spec:
  sites:
    - name: a
      mysql: {{host: 127.0.0.1, port: 3, credentials: {{file: site.cred}}}}
      sidecar: {{url: "http://127.0.0.1:3"}}
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlDatabase
metadata: {{name: counter-app, namespace: default}}
spec:
  failoverGroupRef: {{name: playground}}
  deploymentClients: [{{namespace: ci, serviceAccount: deployer}}]
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlDatabase
metadata: {{name: billing, namespace: default}}
spec:
  failoverGroupRef: {{name: playground}}
  deploymentClients: [{{namespace: ci, serviceAccount: billing}}]
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlDatabase
metadata: {{name: other-db, namespace: default}}
spec:
  failoverGroupRef: {{name: second}}
  deploymentClients: [{{namespace: ci, serviceAccount: other}}]
"#,
        data = dir.join("data").display()
    )
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

    /// [`Client::grant`] as a pipeline calls it: a `423` says the group is between confirmed
    /// states (a replica re-pointed after a failover can report a lag spike for a poll or
    /// two, and the group is honestly `Degraded` then), so it waits the `retryAfterSeconds`
    /// the answer names and asks again, for at most 30 s. Any other answer is returned.
    pub async fn grant_when_stable(
        &self,
        token: &str,
        kind: &str,
        op: &str,
        instance: &str,
        ttl: i64,
    ) -> Answer {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let a = self.grant(token, kind, op, instance, ttl).await;
            if a.status != StatusCode::LOCKED || tokio::time::Instant::now() > deadline {
                return a;
            }
            let wait = a.body["retryAfterSeconds"].as_u64().unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
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
    pub harness: bloodraven_mysql::launcher::Launcher,
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
        tweak: impl FnOnce(&mut bloodraven_operator::local::LocalOptions),
    ) -> Live {
        use bloodraven_core::config::SiteRole;
        let harness = bloodraven_mysql::launcher::Launcher::start_group(&["iad", "pdx", "reader"])
            .await
            .unwrap();
        ledger::set_up_primary(
            &harness,
            &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut o = bloodraven_operator::local::LocalOptions::new(
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
        let files = bloodraven_operator::local::write_files(dir.path(), &harness, &o).unwrap();
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
        let h = operator::start(
            self.config(),
            bloodraven_runtime::clock::system(),
            vec![Arc::new(bloodraven_operator::controller::ControllerTask)],
        )
        .await
        .unwrap();
        assert!(h.wait_leading(Duration::from_secs(10)).await);
        h
    }

    pub async fn operator_on(&self, store: Arc<dyn Store>) -> OperatorHandle {
        let h = operator::start_with_store(
            self.config(),
            store,
            bloodraven_runtime::clock::system(),
            vec![Arc::new(bloodraven_operator::controller::ControllerTask)],
        )
        .await
        .unwrap();
        assert!(h.wait_leading(Duration::from_secs(15)).await);
        h
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

/// Whether the group's planned failover is in `phase`.
pub fn planned_in(phase: PlannedFailoverPhase) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.planned_failover
            .as_ref()
            .is_some_and(|p| p.phase == phase)
    }
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
    wait_status(&op, Duration::from_secs(20), "replication running", |s| {
        s.replication_running()
    })
    .await;
    op
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

/// The story of a returning old primary with divergent transactions, up to its return:
/// replication cut on pdx and the reader, two rows written on iad only (9001, 9002), iad
/// killed, the failover to pdx, and five rows written on pdx (9100-9104), so pdx's position
/// is numerically ahead of iad's. The caller restarts iad as its story needs.
pub async fn diverge_and_fail_over(live: &mut Live, op: &OperatorHandle) {
    use mysql_async::prelude::Queryable as _;
    wait_status(op, Duration::from_secs(10), "replication running", |s| {
        s.replication_running()
    })
    .await;
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
    wait_status(op, Duration::from_secs(20), "failover to pdx", |s| {
        s.active_site == "pdx"
    })
    .await;
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
