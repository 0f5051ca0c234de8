//! Test support: a scriptable stand-in for the operator or a peer sidecar (axum on
//! `127.0.0.1:0`, over the component mutual TLS of [`bloodraven_testkit::pki`], with one
//! certificate that names both the operator and a site `fake`), and helpers to start a real
//! sidecar against a harness server.
//!
//! A [`FakeParty`] serves `/healthz`, `/readyz`, `/active-site`, `/peer/ping` and `/peer/active-site` and can
//! be switched between answering, `503`, silent (accepts, never answers) and down (not
//! listening: connections are refused). By default every response closes its connection, so
//! switching to down takes effect at once for every client; [`FakeParty::start_keep_alive`]
//! keeps connections open like a real server (for measurements, not for switching).

#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::ActiveSite;
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::SiteClient;
use bloodraven_runtime::logging::Captured;
use bloodraven_sidecar::Sidecar;
use bloodraven_sidecar::config::Timing;
use bloodraven_sidecar::contacts::HttpContacts;
use bloodraven_sidecar::identity::Identity;
use serde_json::{Map, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

/// What a fake party does with requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200 with the configured view.
    Answer,
    /// 503 to everything.
    Unavailable,
    /// Accepts and never answers.
    Silent,
    /// Not listening.
    Down,
}

#[derive(Debug)]
struct PartyState {
    mode: Mode,
    /// The view `/active-site` (operator) and `/peer/active-site` (peer, 204 when `None`) serve.
    view: Option<ActiveSite>,
    /// While set, `/active-site` waits for it before answering.
    hold: Option<Arc<Notify>>,
    active_site_requests: u64,
    /// When `/healthz` or `/peer/ping` last answered 200 (what the lease counts).
    last_answer: Option<Instant>,
    /// When `/active-site` or `/peer/active-site` first served each view (site, observedAt).
    served: Vec<(ActiveSite, Instant)>,
    /// Notified when the view changes: `/active-site?after=N` waits on it.
    changed: Arc<Notify>,
}

/// A stand-in for the operator or a peer sidecar.
#[derive(Debug)]
pub struct FakeParty {
    pub url: String,
    addr: SocketAddr,
    close: bool,
    state: Arc<Mutex<PartyState>>,
    server: Mutex<Option<JoinHandle<()>>>,
}

type Shared = Arc<Mutex<PartyState>>;

fn lock(s: &Mutex<PartyState>) -> std::sync::MutexGuard<'_, PartyState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits per the mode; `None` means "answer normally".
async fn gate(s: &Shared) -> Option<Response> {
    let mode = lock(s).mode;
    match mode {
        Mode::Answer => None,
        Mode::Unavailable | Mode::Down => Some(StatusCode::SERVICE_UNAVAILABLE.into_response()),
        Mode::Silent => std::future::pending().await,
    }
}

fn answered(s: &Shared) {
    lock(s).last_answer = Some(Instant::now());
}

fn serve_view(s: &Shared, v: &ActiveSite) {
    let mut g = lock(s);
    if !g.served.iter().any(|(x, _)| x == v) {
        g.served.push((v.clone(), Instant::now()));
    }
}

async fn healthz(State(s): State<Shared>) -> Response {
    if let Some(r) = gate(&s).await {
        return r;
    }
    answered(&s);
    "ok".into_response()
}

/// `/readyz` as a leading operator answers it (what a sidecar counts as the operator).
async fn readyz(State(s): State<Shared>) -> Response {
    if let Some(r) = gate(&s).await {
        return r;
    }
    answered(&s);
    axum::Json(serde_json::json!({"ready": true, "leader": true, "loaded": true})).into_response()
}

/// How long `/active-site?after=N` waits for a newer view before `204`, as the operator does.
const WATCH_WAIT: Duration = Duration::from_secs(30);

async fn active_site(
    State(s): State<Shared>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    if let Some(after) = q.get("after").and_then(|a| a.parse::<u64>().ok()) {
        return watch(&s, after).await;
    }
    let hold = {
        let mut g = lock(&s);
        g.active_site_requests += 1;
        g.hold.clone()
    };
    if let Some(n) = hold {
        n.notified().await;
    }
    if let Some(r) = gate(&s).await {
        return r;
    }
    view_or(&s, StatusCode::SERVICE_UNAVAILABLE)
}

/// The operator's watch: the view once its generation is past `after`, `204` after
/// [`WATCH_WAIT`].
async fn watch(s: &Shared, after: u64) -> Response {
    if let Some(r) = gate(s).await {
        return r;
    }
    let deadline = Instant::now() + WATCH_WAIT;
    loop {
        let changed = lock(s).changed.clone();
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let view = lock(s).view.clone();
        if let Some(v) = view.filter(|v| v.topology_generation > after) {
            serve_view(s, &v);
            return axum::Json(v).into_response();
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return StatusCode::NO_CONTENT.into_response();
        }
    }
}

async fn peer_ping(State(s): State<Shared>) -> Response {
    if let Some(r) = gate(&s).await {
        return r;
    }
    answered(&s);
    axum::Json(serde_json::json!({"site": "fake"})).into_response()
}

async fn peer_active_site(State(s): State<Shared>) -> Response {
    if let Some(r) = gate(&s).await {
        return r;
    }
    // A peer that holds no view yet answers 204, an operator 503.
    view_or(&s, StatusCode::NO_CONTENT)
}

fn view_or(s: &Shared, none: StatusCode) -> Response {
    let view = lock(s).view.clone();
    match view {
        Some(v) => {
            serve_view(s, &v);
            axum::Json(v).into_response()
        }
        None => none.into_response(),
    }
}

async fn close_connection(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn router(s: Shared, close: bool) -> Router {
    let r = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/active-site", get(active_site))
        .route("/peer/ping", get(peer_ping))
        .route("/peer/active-site", get(peer_active_site));
    let r = if close {
        r.layer(axum::middleware::map_response(close_connection))
    } else {
        r
    };
    r.with_state(s)
}

fn spawn_server(listener: TcpListener, s: Shared, close: bool) -> JoinHandle<()> {
    let tls = bloodraven_testkit::pki::pki().fake_tls();
    tokio::spawn(async move {
        // Never stopped by a signal: the task is aborted.
        let (_keep, rx) = tokio::sync::watch::channel(false);
        bloodraven_runtime::serve::serve(
            listener,
            bloodraven_runtime::serve::Transport::Component(tls),
            router(s, close),
            rx,
        )
        .await;
    })
}

impl FakeParty {
    /// Starts answering with `view`; every response closes its connection.
    pub async fn start(view: Option<ActiveSite>) -> Arc<FakeParty> {
        Self::start_with(view, true).await
    }

    /// Starts answering with `view`, keeping connections open between requests.
    pub async fn start_keep_alive(view: Option<ActiveSite>) -> Arc<FakeParty> {
        Self::start_with(view, false).await
    }

    async fn start_with(view: Option<ActiveSite>, close: bool) -> Arc<FakeParty> {
        // The tests ask with reqwest, which needs the process's TLS provider (the sidecar's
        // own client no longer installs it).
        bloodraven_runtime::tls::install_crypto_provider();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(PartyState {
            mode: Mode::Answer,
            view,
            hold: None,
            active_site_requests: 0,
            last_answer: None,
            served: Vec::new(),
            changed: Arc::new(Notify::new()),
        }));
        let server = spawn_server(listener, state.clone(), close);
        Arc::new(FakeParty {
            url: format!("https://{addr}"),
            addr,
            close,
            state,
            server: Mutex::new(Some(server)),
        })
    }

    pub async fn set_mode(&self, mode: Mode) {
        let was = {
            let mut g = lock(&self.state);
            std::mem::replace(&mut g.mode, mode)
        };
        let running = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if mode == Mode::Down {
            if let Some(h) = running {
                h.abort();
                // The listener is dropped with the task.
                let _ = h.await;
            }
            return;
        }
        let handle = match running {
            Some(h) if was != Mode::Down => h,
            _ => {
                // Listen on the same port again.
                let mut tries = 0;
                let listener = loop {
                    match TcpListener::bind(self.addr).await {
                        Ok(l) => break l,
                        Err(e) => {
                            tries += 1;
                            assert!(tries < 100, "cannot listen on {} again: {e}", self.addr);
                            sleep(Duration::from_millis(20)).await;
                        }
                    }
                };
                spawn_server(listener, self.state.clone(), self.close)
            }
        };
        *self.server.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
    }

    pub fn set_view(&self, view: Option<ActiveSite>) {
        let changed = {
            let mut g = lock(&self.state);
            g.view = view;
            g.changed.clone()
        };
        changed.notify_waiters();
    }

    /// Makes `/active-site` wait until the returned handle is notified.
    pub fn hold_active_site(&self) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        lock(&self.state).hold = Some(n.clone());
        n
    }

    pub fn release_active_site(&self, n: &Notify) {
        lock(&self.state).hold = None;
        n.notify_waiters();
    }

    pub fn active_site_requests(&self) -> u64 {
        lock(&self.state).active_site_requests
    }

    /// When `/healthz` or `/peer/ping` last answered 200.
    pub fn last_answer(&self) -> Option<Instant> {
        lock(&self.state).last_answer
    }

    /// When `view` was first served.
    pub fn first_served(&self, view: &ActiveSite) -> Option<Instant> {
        lock(&self.state)
            .served
            .iter()
            .find(|(v, _)| v == view)
            .map(|(_, t)| *t)
    }
}

impl Drop for FakeParty {
    fn drop(&mut self) {
        if let Some(h) = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            h.abort();
        }
    }
}

/// An active-site view.
pub fn view(site: &str, generation: u64, observed_at: Timestamp) -> ActiveSite {
    ActiveSite::new(site, generation, observed_at)
}

/// A timestamp `s` seconds after a fixed instant.
pub fn at(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_796_000_000 + s)
}

/// A loopback port nobody listens on (picked, then released; outside the ephemeral range).
pub fn free_port() -> u16 {
    bloodraven_launch::mysql::free_port().unwrap()
}

/// Small timings for tests: ticks every second, a 3 s lease (the floor of the CEL rules).
pub fn test_timing() -> Timing {
    Timing::new(Duration::from_secs(3), Duration::from_secs(1))
}

pub fn identity(site: &str) -> Identity {
    Identity {
        site: site.into(),
        group: "playground".into(),
        namespace: "default".into(),
    }
}

/// The sidecar's MySQL client for harness server `i`: the least-privilege control-plane
/// account over TCP, with the sidecar's bounds.
pub fn sidecar_client(h: &Launcher, i: usize, site: &str, timing: Timing) -> SiteClient {
    SiteClient::new(
        site,
        h.endpoint(i),
        h.accounts().failover.clone(),
        timing.mysql_timeouts(),
    )
}

/// A real sidecar for harness server `i` as `site`, talking to `operator` and `peers` over
/// HTTP, listening on `listen`: with the test timings and no signed topology unless
/// [`SidecarStart::timing`] and [`SidecarStart::trust`] say otherwise.
pub fn sidecar_for<'a>(
    h: &'a Launcher,
    i: usize,
    site: &'a str,
    operator: &'a str,
    peers: &'a [String],
    listen: SocketAddr,
) -> SidecarStart<'a> {
    SidecarStart {
        server: (h, i, site),
        parties: (operator, peers),
        listen,
        timing: test_timing(),
        trust: bloodraven_sidecar::trust::Trust::default(),
    }
}

/// What [`sidecar_for`] starts.
pub struct SidecarStart<'a> {
    /// The harness, the server's index in it, and the site it is.
    server: (&'a Launcher, usize, &'a str),
    /// The operator's and the peers' URLs.
    parties: (&'a str, &'a [String]),
    listen: SocketAddr,
    timing: Timing,
    trust: bloodraven_sidecar::trust::Trust,
}

impl SidecarStart<'_> {
    /// Other timings than the test timings.
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Trust settings (signed topology).
    pub fn trust(mut self, trust: bloodraven_sidecar::trust::Trust) -> Self {
        self.trust = trust;
        self
    }

    pub async fn start(self) -> Sidecar {
        let ((h, i, site), (operator, peers)) = (self.server, self.parties);
        let (id, timing) = (identity(site), self.timing);
        let operator = [operator.to_string()];
        let tls = bloodraven_testkit::pki::pki().site_tls(site);
        let contacts =
            HttpContacts::new(&id, &operator, peers, timing.request_timeout, &tls).unwrap();
        Sidecar::start(
            id,
            Arc::new(contacts),
            Arc::new(sidecar_client(h, i, site, timing)),
            timing,
            self.trust,
            self.listen,
            tls,
            bloodraven_runtime::clock::system(),
        )
        .await
        .expect("sidecar starts")
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns how long it took.
pub async fn wait_until<F, Fut>(limit: Duration, mut cond: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    loop {
        if cond().await {
            return Some(t.elapsed());
        }
        if t.elapsed() > limit {
            return None;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 10 s) until `site` has logged `SELF-FENCED:` and returns those lines.
///
/// `read_only` becomes visible to a prober the moment the fence lands, before the sidecar
/// has killed the application sessions and reported; a test that checks the whole effect
/// (sessions gone, the report line) waits for the report, not for the variable.
pub async fn reported_fenced(logs: &Captured, site: &str) -> Vec<Map<String, Value>> {
    let prefix = bloodraven_core::contract::logs::SELF_FENCED;
    wait_until(Duration::from_secs(10), || async {
        !records(logs, site, prefix).is_empty()
    })
    .await
    .unwrap_or_else(|| panic!("{site} never logged {prefix}"));
    records(logs, site, prefix)
}

/// Captured log records of `site` whose `msg` starts with `prefix`.
pub fn records(logs: &Captured, site: &str, prefix: &str) -> Vec<Map<String, Value>> {
    logs.records()
        .into_iter()
        .filter(|r| r.get("site").and_then(Value::as_str) == Some(site))
        .filter(|r| {
            r.get("msg")
                .and_then(Value::as_str)
                .is_some_and(|m| m.starts_with(prefix))
        })
        .collect()
}

/// The `msg` of a record.
pub fn msg(r: &Map<String, Value>) -> &str {
    r.get("msg").and_then(Value::as_str).unwrap_or_default()
}

/// `127.0.0.1:port`.
pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A client of the sidecars' open endpoints: it trusts the test CA and presents nothing.
pub fn client() -> reqwest::Client {
    bloodraven_testkit::pki::pki().client()
}

/// The sidecar's `/status` at `addr`.
pub async fn status(addr: SocketAddr) -> serde_json::Value {
    bloodraven_testkit::http::json_of(client().get(format!("https://{addr}/status"))).await
}
