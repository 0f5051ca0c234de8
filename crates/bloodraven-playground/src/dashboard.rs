//! The dashboard: one self-contained web page (no external assets) fed by server-sent events,
//! and the chaos API its buttons (and `bloodraven playground chaos`) call.
//!
//! `GET /` the page; `GET /api/state` one snapshot; `GET /api/events` a snapshot every 700 ms
//! (SSE); `POST /api/chaos/{action}?site=NAME` one action (`&writable=true` for
//! `restart-site`), answering `{ok, message}`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use bloodraven_core::config::ReplicationMode;
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::playground::{GROUP, Playground, SITES};

const PAGE: &str = include_str!("../assets/dashboard.html");

/// The dashboard's routes.
pub fn router(pg: Arc<Playground>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/state", get(state))
        .route("/api/events", get(events))
        .route("/api/chaos/{action}", post(chaos))
        .with_state(pg)
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn get_json(http: &reqwest::Client, url: String) -> Option<Value> {
    let r = http.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// One snapshot of everything the page shows.
pub async fn snapshot(pg: &Playground) -> Value {
    // The sidecars answer over TLS with certificates of the component CA.
    let http =
        bloodraven_runtime::tls::http_client(Some(&pg.pki.ca.cert), Duration::from_millis(800))
            .unwrap_or_default();
    let status_url = format!(
        "http://127.0.0.1:{}/status?group={GROUP}",
        pg.opts.operator_port
    );
    let sidecar_urls: Vec<String> = pg
        .sidecar_ports
        .iter()
        .map(|p| format!("https://127.0.0.1:{p}/status"))
        .collect();
    let (status, sidecars, counter, running, operator_running, lease, router, control) = tokio::join!(
        get_json(&http, status_url),
        futures::future::join_all(sidecar_urls.into_iter().map(|u| get_json(&http, u))),
        pg.counter.view(),
        pg.servers_running(),
        pg.operator_running(),
        pg.lease_state(),
        pg.router_view(),
        pg.control_view(),
    );
    let group = status
        .as_ref()
        .and_then(|s| s["groups"][GROUP].as_object().cloned());
    let st = group.as_ref().map_or(Value::Null, |g| g["status"].clone());
    let sites: Vec<Value> = SITES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let s = st["sites"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == *name))
                .cloned()
                .unwrap_or(Value::Null);
            let sc = sidecars.get(i).cloned().flatten().unwrap_or(Value::Null);
            json!({
                "name": name,
                "role": s["role"],
                "state": s["state"],
                "gtid": s["gtidExecuted"],
                "replicating": s["replicating"],
                "lag": s["secondsBehindSource"],
                "recoveryState": s["recoveryState"],
                "divergentGtidSet": s["divergentGtidSet"],
                "divergentTransactionCount": s["divergentTransactionCount"],
                "reclone": s["reclone"],
                "readOnly": sc["mysql"]["read_only"],
                "sidecar": {
                    "up": !sc.is_null(),
                    "selfFenced": sc["self_fenced"],
                    "role": sc["role"],
                    "cachedActiveSite": sc["topology"]["activeSite"],
                    "silentForSeconds": sc["silent_for_seconds"],
                },
                "mysqlRunning": running.get(i).copied().unwrap_or(false),
                "isolated": pg.isolated(i),
            })
        })
        .collect();
    let replication = replication_view(pg.opts.replication, &st["conditions"]);
    json!({
        "replication": replication,
        "operatorRunning": operator_running,
        "control": control,
        "operatorAnswering": group.is_some(),
        "group": GROUP,
        "activeSite": st["activeSite"],
        "topologyGeneration": st["topologyGeneration"],
        "observedAt": st["observedAt"],
        "conditions": st["conditions"],
        "plannedFailover": st["plannedFailover"],
        "updatePhase": st["updatePhase"],
        "restoreInPlace": st["restoreInPlace"],
        "backups": st["backups"],
        "binlogArchive": st["binlogArchive"],
        "lastFailoverTarget": st["lastFailoverTarget"],
        "deploy": group.as_ref().map(|g| g["deploy"].clone()),
        "events": group.as_ref().map(|g| g["events"].clone()),
        "sites": sites,
        "counter": counter,
        "router": router,
        "lease": lease.map(|(op, lost)| json!({"operationId": op, "lost": lost})),
        "urls": {
            "app": format!("http://{}", pg.app_addr),
            "operator": format!("http://127.0.0.1:{}", pg.opts.operator_port),
            "deployApi": pg.deploy_url(),
            // The CA the sidecars' certificates chain to (`curl --cacert`).
            "componentCa": pg.pki.ca.cert.display().to_string(),
            // What a Prometheus scrapes (docs/runbook.md): the operator and every sidecar
            // (the sidecars over TLS, verified against `componentCa`).
            "metrics": {
                "operator": format!("127.0.0.1:{}", pg.opts.operator_port),
                "sidecars": pg.sidecar_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>(),
            },
        },
    })
}

/// The group's replication mode and, in `semi-sync`, whether the lossless guarantee holds right
/// now, read from the `Degraded` condition the operator reports.
fn replication_view(mode: ReplicationMode, conditions: &Value) -> Value {
    use bloodraven_core::reason::ConditionReason;
    let degraded = conditions.as_array().and_then(|cs| {
        cs.iter()
            .find(|c| c["type"] == "Degraded" && c["status"] == "True")
    });
    let reason = ConditionReason::parse(degraded.and_then(|c| c["reason"].as_str()).unwrap_or(""));
    let message = degraded.map_or(Value::Null, |c| c["message"].clone());
    let (guarantee, message) = match mode {
        ReplicationMode::Async => (
            "none: an emergency failover can lose what the old primary acknowledged but had not shipped",
            Value::Null,
        ),
        ReplicationMode::SemiSync if reason == ConditionReason::SemiSyncFallback => {
            ("does not hold", message)
        }
        ReplicationMode::SemiSync if reason == ConditionReason::SemiSyncWritesWait => {
            ("holds; writes wait for a replica", message)
        }
        ReplicationMode::SemiSync => (
            "holds: every acknowledged write is on a replica",
            Value::Null,
        ),
    };
    json!({"mode": mode.as_str(), "guarantee": guarantee, "message": message})
}

async fn state(State(pg): State<Arc<Playground>>) -> Response {
    axum::Json(snapshot(&pg).await).into_response()
}

async fn events(
    State(pg): State<Arc<Playground>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::unfold(pg, |pg| async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let s = snapshot(&pg).await;
        Some((Ok(Event::default().data(s.to_string())), pg))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(Deserialize)]
struct SiteQuery {
    site: Option<String>,
    /// `restart-site` only: start the server writable (the crash case).
    #[serde(default)]
    writable: bool,
}

async fn chaos(
    State(pg): State<Arc<Playground>>,
    Path(action): Path<String>,
    Query(q): Query<SiteQuery>,
) -> Response {
    tracing::info!(action = %action, site = ?q.site, "chaos");
    match pg.chaos_with(&action, q.site.as_deref(), q.writable).await {
        Ok(message) => axum::Json(json!({"ok": true, "message": message})).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"ok": false, "message": e.to_string()})),
        )
            .into_response(),
    }
}
