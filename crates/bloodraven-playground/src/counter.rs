//! The counter app: a tiny application that increments a counter on the primary, with no
//! retry, and counts what each increment's answer proves (acknowledged, failed, ambiguous).
//! The point is to see what a failover does to writes. It reaches the primary through a
//! router (the playground's HAProxy, which follows the sidecars' `/primary`) and tells which
//! site a connection landed on by the server's own port; without a router it connects to the
//! site the operator's `/active-site` names.
//!
//! `GET /api/counter` → `{value, updatedAt, dbHost, site, readOnly, acknowledged, failed,
//! ambiguous}`; `POST /api/increment` → one `UPDATE`, never retried.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Mutex, RwLock};

/// What kept the app from its database (shown on the dashboard and in the timeline).
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("no active site known yet")]
    NoActiveSite,
    #[error("no connection to {0} within 1 s")]
    ConnectTimedOut(String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, mysql_async::Error),
    #[error("no answer {0} {1} within 1 s")]
    Silent(&'static str, String),
    #[error("{0} answered: {1}")]
    Query(String, mysql_async::Error),
    #[error("{0}")]
    Read(mysql_async::Error),
    #[error("no connection")]
    NoConnection,
}

/// The table the counter lives in (created on the primary by the playground).
pub const COUNTER_DDL: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS app.counter (id INT PRIMARY KEY, value BIGINT NOT NULL, updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
    "INSERT IGNORE INTO app.counter (id, value) VALUES (1, 0)",
];

/// One site the app may connect to.
#[derive(Clone, Debug)]
pub struct AppSite {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub opts: Opts,
}

/// Counts of increment outcomes.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Tally {
    pub acknowledged: u64,
    pub failed: u64,
    pub ambiguous: u64,
}

/// How many seconds of increments the timeline keeps.
pub const TIMELINE_SECONDS: u64 = 120;

/// Increments in one second of the app's life, and the site they went to.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Second {
    /// Seconds since the app started.
    pub second: u64,
    pub acknowledged: u32,
    pub failed: u32,
    pub ambiguous: u32,
    /// The site the last increment of this second went to.
    pub site: String,
}

/// The last [`TIMELINE_SECONDS`] seconds of increments, for the dashboard's live timeline.
#[derive(Debug, Default)]
pub struct Timeline {
    seconds: std::collections::VecDeque<Second>,
}

impl Timeline {
    /// Counts one increment's `outcome` (`acknowledged`, `failed`, `ambiguous`) on `site` in
    /// second `second`.
    pub fn record(&mut self, second: u64, site: &str, outcome: &str) {
        if self.seconds.back().is_none_or(|s| s.second != second) {
            self.seconds.push_back(Second {
                second,
                ..Second::default()
            });
        }
        let Some(s) = self.seconds.back_mut() else {
            return;
        };
        match outcome {
            "acknowledged" => s.acknowledged += 1,
            "ambiguous" => s.ambiguous += 1,
            _ => s.failed += 1,
        }
        site.clone_into(&mut s.site);
        while self
            .seconds
            .front()
            .is_some_and(|f| f.second + TIMELINE_SECONDS <= second)
        {
            self.seconds.pop_front();
        }
    }

    pub fn seconds(&self) -> Vec<Second> {
        self.seconds.iter().cloned().collect()
    }
}

/// The app's connection: to `key` (a site, or the router), landed on site `landed`.
#[derive(Debug)]
struct Slot {
    key: String,
    conn: Conn,
    landed: String,
    /// The session's TLS cipher (`Ssl_cipher`; empty in clear text).
    cipher: String,
}

/// The app's state.
#[derive(Debug)]
pub struct CounterApp {
    sites: Vec<AppSite>,
    /// Where writes go when set: a router's address.
    router: Option<AppSite>,
    operator: String,
    namespace: String,
    group: String,
    active: RwLock<String>,
    conn: Mutex<Option<Slot>>,
    tally: Mutex<Tally>,
    timeline: Mutex<Timeline>,
    started: tokio::time::Instant,
    /// Whether the app writes by itself (20 increments a second).
    writing: std::sync::atomic::AtomicBool,
    http: reqwest::Client,
}

/// What `GET /api/counter` answers.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterView {
    pub value: Option<i64>,
    pub updated_at: Option<String>,
    pub db_host: String,
    /// The site the app's connection is on.
    pub site: String,
    /// `router` when the app writes through the router, `direct` otherwise.
    pub route: String,
    pub read_only: Option<bool>,
    pub acknowledged: u64,
    pub failed: u64,
    pub ambiguous: u64,
    pub error: Option<String>,
    /// The last seconds of increments (oldest first).
    pub timeline: Vec<Second>,
    /// Whether the app writes by itself.
    pub writing: bool,
    /// The TLS cipher of the app's session (`Ssl_cipher`), empty in clear text.
    pub tls_cipher: String,
}

/// What `POST /api/increment` answers.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IncrementResult {
    /// `acknowledged`, `failed` (the server refused: nothing was written) or `ambiguous` (the
    /// connection broke: it may or may not have been written).
    pub outcome: String,
    pub site: String,
    pub error: Option<String>,
}

impl CounterApp {
    /// An app writing through `router` when given, else to the site `operator`'s
    /// `/active-site` names for `namespace/group` (followed either way, for the dashboard).
    pub fn new(
        sites: Vec<AppSite>,
        router: Option<AppSite>,
        operator: &str,
        namespace: &str,
        group: &str,
    ) -> Arc<CounterApp> {
        let http =
            bloodraven_runtime::tls::http_client(None, Duration::from_secs(1)).unwrap_or_default();
        Arc::new(CounterApp {
            sites,
            router,
            operator: operator.trim_end_matches('/').to_string(),
            namespace: namespace.to_string(),
            group: group.to_string(),
            active: RwLock::new(String::new()),
            conn: Mutex::new(None),
            tally: Mutex::new(Tally::default()),
            timeline: Mutex::new(Timeline::default()),
            started: tokio::time::Instant::now(),
            writing: std::sync::atomic::AtomicBool::new(false),
            http,
        })
    }

    /// While [`Self::set_writing`] says so, increments 20 times a second (runs until the task
    /// is aborted): the load the dashboard's timeline shows through a failover.
    pub async fn write_continuously(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.writing.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = self.increment().await;
            }
        }
    }

    pub fn set_writing(&self, on: bool) {
        self.writing.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    async fn record(&self, r: &IncrementResult) {
        let second = self.started.elapsed().as_secs();
        self.timeline
            .lock()
            .await
            .record(second, &r.site, &r.outcome);
    }

    /// Follows the operator's `/active-site` every 500 ms (runs until the task is aborted).
    pub async fn follow(self: Arc<Self>) {
        let url = format!(
            "{}/active-site?namespace={}&group={}",
            self.operator, self.namespace, self.group
        );
        loop {
            if let Ok(r) = self.http.get(&url).send().await
                && r.status().is_success()
                && let Ok(v) = r.json::<serde_json::Value>().await
                && let Some(site) = v.get("activeSite").and_then(|s| s.as_str())
            {
                let mut a = self.active.write().await;
                if *a != site {
                    if a.is_empty() {
                        tracing::info!(site, "counter app: writing to the active site");
                    } else {
                        tracing::info!(from = %a, to = site, "counter app: following the active site");
                    }
                    *a = site.to_string();
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub async fn active_site(&self) -> String {
        self.active.read().await.clone()
    }

    pub async fn tally(&self) -> Tally {
        *self.tally.lock().await
    }

    fn site(&self, name: &str) -> Option<&AppSite> {
        self.sites.iter().find(|s| s.name == name)
    }

    /// Where the app connects now: the router, or the active site.
    async fn target(&self) -> Result<AppSite, AppError> {
        if let Some(r) = &self.router {
            return Ok(r.clone());
        }
        let name = self.active_site().await;
        self.site(&name).cloned().ok_or(AppError::NoActiveSite)
    }

    /// A connection to `site` (opened on first use; reopened after a change), and the site
    /// it landed on.
    async fn conn<'a>(
        &self,
        slot: &'a mut Option<Slot>,
        site: &AppSite,
    ) -> Result<&'a mut Slot, AppError> {
        if slot.as_ref().is_none_or(|s| s.key != site.name) {
            let mut c = tokio::time::timeout(
                Duration::from_secs(1),
                Conn::new(bloodraven_mysql::site::renewed(&site.opts)),
            )
            .await
            .map_err(|_| AppError::ConnectTimedOut(site.name.clone()))?
            .map_err(|e| AppError::Connect(site.name.clone(), e))?;
            let landed = if self.router.is_some() {
                let port: Option<u16> =
                    tokio::time::timeout(Duration::from_secs(1), c.query_first("SELECT @@port"))
                        .await
                        .map_err(|_| AppError::Silent("through", site.name.clone()))?
                        .map_err(|e| AppError::Query(site.name.clone(), e))?;
                self.sites
                    .iter()
                    .find(|s| Some(s.port) == port)
                    .map_or_else(|| "?".to_string(), |s| s.name.clone())
            } else {
                site.name.clone()
            };
            let cipher: Option<(String, String)> = tokio::time::timeout(
                Duration::from_secs(1),
                c.query_first("SHOW SESSION STATUS LIKE 'Ssl\\_cipher'"),
            )
            .await
            .map_err(|_| AppError::Silent("from", site.name.clone()))?
            .map_err(|e| AppError::Query(site.name.clone(), e))?;
            *slot = Some(Slot {
                key: site.name.clone(),
                conn: c,
                landed,
                cipher: cipher.map(|(_, c)| c).unwrap_or_default(),
            });
        }
        slot.as_mut().ok_or(AppError::NoConnection)
    }

    /// One increment on the active site; never retried. Counted in the timeline.
    pub async fn increment(&self) -> IncrementResult {
        let r = self.increment_once().await;
        self.record(&r).await;
        r
    }

    async fn increment_once(&self) -> IncrementResult {
        let site = match self.target().await {
            Ok(s) => s,
            Err(e) => {
                let mut t = self.tally.lock().await;
                t.failed += 1;
                return IncrementResult {
                    outcome: "failed".into(),
                    site: String::new(),
                    error: Some(e.to_string()),
                };
            }
        };
        let mut slot = self.conn.lock().await;
        let mut name = site.name.clone();
        let result = match self.conn(&mut slot, &site).await {
            Err(e) => Err((false, e.to_string())),
            Ok(s) => {
                name.clone_from(&s.landed);
                tokio::time::timeout(
                    Duration::from_secs(5),
                    s.conn.query_drop("UPDATE app.counter SET value = value + 1, updated_at = CURRENT_TIMESTAMP(6) WHERE id = 1"),
                )
            .await
            .map_err(|_| (true, "no answer within 5 s".to_string()))
            .and_then(|r| {
                r.map_err(|e| match e {
                    mysql_async::Error::Server(se) => (false, format!("server error {}: {}", se.code, se.message)),
                    other => (true, other.to_string()),
                })
            })
            }
        };
        let mut t = self.tally.lock().await;
        match result {
            Ok(()) => {
                t.acknowledged += 1;
                IncrementResult {
                    outcome: "acknowledged".into(),
                    site: name,
                    error: None,
                }
            }
            Err((ambiguous, e)) => {
                if ambiguous {
                    t.ambiguous += 1;
                    *slot = None;
                } else {
                    t.failed += 1;
                    // Through a router a refusal (read-only) means the connection is on a
                    // site that is no longer the primary: the next write connects again.
                    if self.router.is_some() {
                        *slot = None;
                    }
                }
                IncrementResult {
                    outcome: if ambiguous { "ambiguous" } else { "failed" }.into(),
                    site: name,
                    error: Some(e),
                }
            }
        }
    }

    /// Reads the counter where the app writes.
    pub async fn view(&self) -> CounterView {
        let tally = self.tally().await;
        let mut v = CounterView {
            value: None,
            updated_at: None,
            db_host: String::new(),
            site: String::new(),
            route: if self.router.is_some() {
                "router"
            } else {
                "direct"
            }
            .into(),
            read_only: None,
            acknowledged: tally.acknowledged,
            failed: tally.failed,
            ambiguous: tally.ambiguous,
            error: None,
            timeline: self.timeline.lock().await.seconds(),
            writing: self.writing.load(std::sync::atomic::Ordering::Relaxed),
            tls_cipher: String::new(),
        };
        let site = match self.target().await {
            Ok(s) => s,
            Err(e) => {
                v.error = Some(e.to_string());
                return v;
            }
        };
        v.db_host = format!("{}:{}", site.host, site.port);
        let mut slot = self.conn.lock().await;
        let read = async {
            let s = self.conn(&mut slot, &site).await?;
            let row: Option<(i64, String, i64)> = s
                .conn
                .query_first("SELECT value, CAST(updated_at AS CHAR), @@read_only FROM app.counter WHERE id = 1")
                .await
                .map_err(AppError::Read)?;
            Ok::<_, AppError>((row, s.landed.clone(), s.cipher.clone()))
        };
        match tokio::time::timeout(Duration::from_secs(2), read).await {
            Ok(Ok((None, _, _))) => v.error = Some("the counter row is missing".into()),
            Ok(Ok((Some((value, at, ro)), landed, cipher))) => {
                v.site = landed;
                v.tls_cipher = cipher;
                v.value = Some(value);
                v.updated_at = Some(at);
                v.read_only = Some(ro != 0);
            }
            Ok(Err(e)) => {
                v.error = Some(e.to_string());
                *slot = None;
            }
            Err(_) => {
                v.error = Some("no answer within 2 s".into());
                *slot = None;
            }
        }
        v
    }

    /// `GET /api/counter` and `POST /api/increment`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/api/counter", get(get_counter))
            .route("/api/increment", post(post_increment))
            .route("/api/write", post(post_write))
            .route("/", get(index))
            .with_state(self)
    }
}

async fn get_counter(State(app): State<Arc<CounterApp>>) -> Response {
    axum::Json(app.view().await).into_response()
}

async fn post_increment(State(app): State<Arc<CounterApp>>) -> Response {
    let r = app.increment().await;
    let status = if r.outcome == "acknowledged" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(json!(r))).into_response()
}

#[derive(serde::Deserialize)]
struct WriteQuery {
    on: bool,
}

/// `POST /api/write?on=true|false`: write continuously, or stop.
async fn post_write(
    State(app): State<Arc<CounterApp>>,
    axum::extract::Query(q): axum::extract::Query<WriteQuery>,
) -> Response {
    app.set_writing(q.on);
    axum::Json(json!({"writing": q.on})).into_response()
}

async fn index() -> Response {
    (
        [("content-type", "text/plain; charset=utf-8")],
        "counter app: GET /api/counter, POST /api/increment, POST /api/write?on=true|false\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_counts_per_second_and_keeps_two_minutes() {
        let mut t = Timeline::default();
        t.record(0, "iad", "acknowledged");
        t.record(0, "iad", "acknowledged");
        t.record(1, "iad", "failed");
        t.record(1, "pdx", "ambiguous");
        t.record(3, "pdx", "acknowledged");
        let s = t.seconds();
        assert_eq!(s.len(), 3);
        assert_eq!(
            (s[0].second, s[0].acknowledged, s[0].site.as_str()),
            (0, 2, "iad")
        );
        assert_eq!(
            (s[1].failed, s[1].ambiguous, s[1].site.as_str()),
            (1, 1, "pdx")
        );
        t.record(TIMELINE_SECONDS + 1, "pdx", "acknowledged");
        let s = t.seconds();
        assert_eq!(
            s.first().map(|x| x.second),
            Some(3),
            "older seconds are dropped"
        );
        assert_eq!(s.len(), 2);
    }
}
