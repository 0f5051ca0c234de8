//! The counter app: a tiny application that increments a counter on whichever site the
//! operator says is active, with no retry, and counts what each increment's answer proves
//! (acknowledged, failed, ambiguous). The point is to see what a failover does to writes.
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

/// The app's state.
#[derive(Debug)]
pub struct CounterApp {
    sites: Vec<AppSite>,
    operator: String,
    namespace: String,
    group: String,
    active: RwLock<String>,
    conn: Mutex<Option<(String, Conn)>>,
    tally: Mutex<Tally>,
    http: reqwest::Client,
}

/// What `GET /api/counter` answers.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterView {
    pub value: Option<i64>,
    pub updated_at: Option<String>,
    pub db_host: String,
    pub site: String,
    pub read_only: Option<bool>,
    pub acknowledged: u64,
    pub failed: u64,
    pub ambiguous: u64,
    pub error: Option<String>,
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
    /// An app following `operator`'s `/active-site` for `namespace/group`.
    pub fn new(
        sites: Vec<AppSite>,
        operator: &str,
        namespace: &str,
        group: &str,
    ) -> Arc<CounterApp> {
        let http =
            bloodraven_runtime::tls::http_client(None, Duration::from_secs(1)).unwrap_or_default();
        Arc::new(CounterApp {
            sites,
            operator: operator.trim_end_matches('/').to_string(),
            namespace: namespace.to_string(),
            group: group.to_string(),
            active: RwLock::new(String::new()),
            conn: Mutex::new(None),
            tally: Mutex::new(Tally::default()),
            http,
        })
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

    /// A connection to the active site (opened on first use; reopened after a change).
    async fn conn<'a>(
        &self,
        slot: &'a mut Option<(String, Conn)>,
        site: &AppSite,
    ) -> Result<&'a mut Conn, String> {
        if slot.as_ref().is_none_or(|(n, _)| *n != site.name) {
            let c = tokio::time::timeout(Duration::from_secs(1), Conn::new(site.opts.clone()))
                .await
                .map_err(|_| format!("no connection to {} within 1 s", site.name))?
                .map_err(|e| format!("cannot connect to {}: {e}", site.name))?;
            *slot = Some((site.name.clone(), c));
        }
        slot.as_mut()
            .map(|(_, c)| c)
            .ok_or_else(|| "no connection".to_string())
    }

    /// One increment on the active site; never retried.
    pub async fn increment(&self) -> IncrementResult {
        let name = self.active_site().await;
        let Some(site) = self.site(&name).cloned() else {
            let mut t = self.tally.lock().await;
            t.failed += 1;
            return IncrementResult {
                outcome: "failed".into(),
                site: name,
                error: Some("no active site known yet".into()),
            };
        };
        let mut slot = self.conn.lock().await;
        let result = match self.conn(&mut slot, &site).await {
            Err(e) => Err((false, e)),
            Ok(c) => tokio::time::timeout(
                Duration::from_secs(5),
                c.query_drop("UPDATE app.counter SET value = value + 1, updated_at = CURRENT_TIMESTAMP(6) WHERE id = 1"),
            )
            .await
            .map_err(|_| (true, "no answer within 5 s".to_string()))
            .and_then(|r| {
                r.map_err(|e| match e {
                    mysql_async::Error::Server(se) => (false, format!("server error {}: {}", se.code, se.message)),
                    other => (true, other.to_string()),
                })
            }),
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
                }
                IncrementResult {
                    outcome: if ambiguous { "ambiguous" } else { "failed" }.into(),
                    site: name,
                    error: Some(e),
                }
            }
        }
    }

    /// Reads the counter from the active site.
    pub async fn view(&self) -> CounterView {
        let name = self.active_site().await;
        let tally = self.tally().await;
        let mut v = CounterView {
            value: None,
            updated_at: None,
            db_host: String::new(),
            site: name.clone(),
            read_only: None,
            acknowledged: tally.acknowledged,
            failed: tally.failed,
            ambiguous: tally.ambiguous,
            error: None,
        };
        let Some(site) = self.site(&name).cloned() else {
            v.error = Some("no active site known yet".into());
            return v;
        };
        v.db_host = format!("{}:{}", site.host, site.port);
        let mut slot = self.conn.lock().await;
        let read = async {
            let c = self.conn(&mut slot, &site).await?;
            let row: Option<(i64, String, i64)> = c
                .query_first("SELECT value, CAST(updated_at AS CHAR), @@read_only FROM app.counter WHERE id = 1")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(row)
        };
        match tokio::time::timeout(Duration::from_secs(2), read).await {
            Ok(Ok(Some((value, at, ro)))) => {
                v.value = Some(value);
                v.updated_at = Some(at);
                v.read_only = Some(ro != 0);
            }
            Ok(Ok(None)) => v.error = Some("the counter row is missing".into()),
            Ok(Err(e)) => {
                v.error = Some(e);
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

async fn index() -> Response {
    (
        [("content-type", "text/plain; charset=utf-8")],
        "counter app: GET /api/counter, POST /api/increment\n",
    )
        .into_response()
}
