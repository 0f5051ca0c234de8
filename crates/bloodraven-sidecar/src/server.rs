//! The sidecar's plain-HTTP server (`:8080`): `/health`, `/status`, the routers' checks
//! (`/primary`, `/replica`, `/read-only`: `200` or `503`, as [`bloodraven_core::routing`]
//! decides), `/peer/ping`, `/peer/active-site`, `/metrics`.
//!
//! Peers call `/peer/ping` and `/peer/active-site` with `namespace` and `group` query
//! parameters; a sidecar of another group answers `404`, so a misconfigured peer list cannot
//! lend a view (or a lease) across groups. Nothing here holds a secret: `/status` shows the
//! server's state, the cached view and contact times, never credentials.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bloodraven_core::duration::HumanDuration;
use bloodraven_core::fencing::ViewSource;
use bloodraven_core::wire::{
    SidecarMysql, SidecarPeer, SidecarReplication, SidecarStatus, SidecarTopology,
};
use bloodraven_mysql::Probe;
use serde::Deserialize;
use serde_json::json;
use tokio::time::{Instant, timeout};

use crate::database::Database;
use crate::metrics::Metrics;
use crate::state::Shared;

/// The server's state.
#[derive(Debug)]
pub struct App<D> {
    pub shared: Arc<Shared>,
    pub db: Arc<D>,
    pub metrics: Arc<Metrics>,
}

/// The routes.
pub fn router<D: Database>(app: Arc<App<D>>) -> Router {
    Router::new()
        .route("/health", get(health::<D>))
        .route("/status", get(status::<D>))
        .route("/primary", get(check_primary::<D>))
        .route("/replica", get(check_replica::<D>))
        .route("/read-only", get(check_read_only::<D>))
        .route("/peer/ping", get(peer_ping::<D>))
        .route("/peer/active-site", get(peer_active_site::<D>))
        .route("/metrics", get(metrics::<D>))
        .with_state(app)
}

/// The note `/status` carries while surviving sessions may serve stale reads.
pub const STALE_READS_NOTE: &str = "client writes are refused, but fencing does not close connections: sessions that survived it may serve stale reads until this site is next promoted or demoted";

#[derive(Debug, Deserialize)]
struct GroupQuery {
    namespace: Option<String>,
    group: Option<String>,
    /// The calling sidecar's site (recorded for strict fencing's facts).
    from: Option<String>,
}

/// `Some(404)` when the query names another group or namespace.
fn wrong_group(shared: &Shared, q: &GroupQuery) -> Option<Response> {
    let id = &shared.identity;
    let mismatch = |given: &Option<String>, ours: &str| given.as_deref().is_some_and(|g| g != ours);
    if mismatch(&q.namespace, &id.namespace) || mismatch(&q.group, &id.group) {
        return Some(
            (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "error": "unknown_group",
                "message": format!("this sidecar belongs to group {} in namespace {}", id.group, id.namespace),
            })),
        )
            .into_response(),
        );
    }
    None
}

async fn health<D: Database>(State(app): State<Arc<App<D>>>) -> Response {
    let limit = app.shared.timing().mysql_timeouts().statement;
    match timeout(limit, app.db.fence_reading()).await {
        Ok(Ok(r)) => (
            StatusCode::OK,
            axum::Json(json!({"mysql": "reachable", "read_only": r.fenced})),
        )
            .into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"mysql": "unreachable", "error": e.to_string()})),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"mysql": "unreachable", "error": format!("no answer within {} ms", limit.as_millis())})),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct LagQuery {
    /// Seconds.
    lag: Option<String>,
}

/// Which check.
#[derive(Clone, Copy)]
enum Check {
    Primary,
    Replica,
    ReadOnly,
}

async fn check_primary<D: Database>(State(app): State<Arc<App<D>>>) -> Response {
    routing_check(&app, Check::Primary, None).await
}

async fn check_replica<D: Database>(
    State(app): State<Arc<App<D>>>,
    q: Result<Query<LagQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match lag_of(q) {
        Some(lag) => routing_check(&app, Check::Replica, lag).await,
        None => bad_lag(),
    }
}

async fn check_read_only<D: Database>(
    State(app): State<Arc<App<D>>>,
    q: Result<Query<LagQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match lag_of(q) {
        Some(lag) => routing_check(&app, Check::ReadOnly, lag).await,
        None => bad_lag(),
    }
}

fn bad_lag() -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({
            "error": "invalid_request",
            "message": "query parameter lag: whole seconds from 0 to 86400",
        })),
    )
        .into_response()
}

/// `?lag=S`: whole seconds, 0 to 86400 (`Some(None)`: not given; `None`: malformed).
#[allow(clippy::option_option)] // absent and malformed are different answers
fn lag_of(
    q: Result<Query<LagQuery>, axum::extract::rejection::QueryRejection>,
) -> Option<Option<u64>> {
    let Ok(Query(q)) = q else { return None };
    match q.lag {
        None => Some(None),
        Some(l) => match l.parse::<u64>() {
            Ok(n) if n <= 86_400 => Some(Some(n)),
            _ => None,
        },
    }
}

async fn routing_check<D: Database>(app: &App<D>, check: Check, lag: Option<u64>) -> Response {
    use bloodraven_core::routing::{self, Facts, Replication};
    let limit = app.shared.timing().mysql_timeouts().statement;
    let probe = timeout(limit, app.db.probe())
        .await
        .ok()
        .and_then(Result::ok);
    let max_lag = lag.unwrap_or_else(|| {
        app.shared
            .replica_max_lag_ms
            .load(std::sync::atomic::Ordering::Relaxed)
            / 1000
    });
    let g = app.shared.lock();
    let view = g.monitor.cache().get().cloned();
    let self_fenced = g.monitor.self_fenced();
    drop(g);
    let facts = Facts {
        site: &app.shared.identity.site,
        view: view.as_ref(),
        reachable: probe.is_some(),
        writable: probe.as_ref().is_some_and(|p| !p.fenced()),
        replication: probe
            .as_ref()
            .and_then(|p| p.replica.as_ref())
            .map(|r| Replication {
                running: r.io_running && r.sql_running,
                seconds_behind: r.seconds_behind,
            }),
        self_fenced,
    };
    let v = match check {
        Check::Primary => routing::primary(&facts),
        Check::Replica => routing::replica(&facts, max_lag),
        Check::ReadOnly => routing::read_only(&facts, max_lag),
    };
    let code = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        axum::Json(json!({
            "site": app.shared.identity.site,
            "role": v.role,
            "reason": v.reason,
            "activeSite": view.as_ref().map(|v| v.active_site.clone()),
            "topologyGeneration": view.as_ref().map(|v| v.topology_generation),
        })),
    )
        .into_response()
}

async fn peer_ping<D: Database>(
    State(app): State<Arc<App<D>>>,
    Query(q): Query<GroupQuery>,
) -> Response {
    if let Some(r) = wrong_group(&app.shared, &q) {
        return r;
    }
    if let Some(from) = &q.from {
        app.shared.heard(from, None);
    }
    let id = &app.shared.identity;
    axum::Json(json!({"site": id.site, "group": id.group, "namespace": id.namespace}))
        .into_response()
}

async fn peer_active_site<D: Database>(
    State(app): State<Arc<App<D>>>,
    Query(q): Query<GroupQuery>,
) -> Response {
    if let Some(r) = wrong_group(&app.shared, &q) {
        return r;
    }
    let view = app.shared.peer_view();
    if let Some(from) = &q.from {
        app.shared
            .heard(from, view.as_ref().map(|v| v.topology_generation));
    }
    match view {
        Some(v) => axum::Json(v).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn metrics<D: Database>(State(app): State<Arc<App<D>>>, headers: HeaderMap) -> Response {
    let (op, peers) = app.shared.contact_ages(Instant::now());
    app.metrics.contact_ages(op, peers);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) =
        bloodraven_runtime::exposition::negotiate(accept, app.metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn mysql_status(probe: Result<Probe, String>) -> (SidecarMysql, &'static str) {
    match probe {
        Ok(p) => {
            let fenced = p.fenced();
            let role = match (fenced, &p.replica) {
                (false, _) => "primary",
                (true, Some(_)) => "replica",
                (true, None) => "fenced",
            };
            let replication = p.replica.map(|r| SidecarReplication {
                io_running: r.io_running,
                sql_running: r.sql_running,
                seconds_behind: r.seconds_behind,
                source: format!("{}:{}", r.source_host, r.source_port),
                last_io_error: r.last_io_error,
                last_sql_error: r.last_sql_error,
            });
            (
                SidecarMysql {
                    reachable: true,
                    error: None,
                    flavor: Some(p.flavor.to_string()),
                    read_only: Some(p.read_only),
                    super_read_only: p.super_read_only,
                    gtid: Some(p.gtid.to_string()),
                    replication,
                },
                role,
            )
        }
        Err(error) => (
            SidecarMysql {
                reachable: false,
                error: Some(error),
                flavor: None,
                read_only: None,
                super_read_only: None,
                gtid: None,
                replication: None,
            },
            "unknown",
        ),
    }
}

async fn status<D: Database>(State(app): State<Arc<App<D>>>) -> Response {
    let limit = app.shared.timing().mysql_timeouts().statement * 2;
    let probe = match timeout(limit, app.db.probe()).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
    };
    let (mysql, role) = mysql_status(probe);
    let shared = &app.shared;
    let now = shared.mono(Instant::now());
    let g = shared.lock();
    let cache = g.monitor.cache();
    let topology = cache.get().map(|v| SidecarTopology {
        view: v.clone(),
        source: match cache.source() {
            Some(ViewSource::Peer(p)) => shared
                .peers
                .get(p)
                .cloned()
                .unwrap_or_else(|| format!("peer {p}")),
            Some(ViewSource::Operator) | None => "operator".to_string(),
        },
    });
    let self_fenced = g.monitor.self_fenced();
    let body = SidecarStatus {
        site: shared.identity.site.clone(),
        group: shared.identity.group.clone(),
        namespace: shared.identity.namespace.clone(),
        role: role.to_string(),
        mysql,
        self_fenced,
        topology,
        topology_floor: cache.floor(),
        last_operator_contact: g.operator_contact,
        last_peer_contact: g.peer_contact.iter().flatten().max().copied(),
        peers: shared
            .peers
            .iter()
            .enumerate()
            .map(|(i, url)| SidecarPeer {
                url: url.clone(),
                answering: g.peer_up.get(i).copied().flatten(),
                last_contact: g.peer_contact.get(i).copied().flatten(),
            })
            .collect(),
        heard_from: {
            let at = Instant::now();
            g.heard_from
                .iter()
                .map(|(site, h)| {
                    (
                        site.clone(),
                        bloodraven_core::wire::HeardFrom {
                            answered_seconds_ago: at
                                .saturating_duration_since(h.answered)
                                .as_secs_f64(),
                            served_generation: h.served.map(|(g, _)| g),
                            served_seconds_ago: h
                                .served
                                .map(|(_, t)| at.saturating_duration_since(t).as_secs_f64()),
                        },
                    )
                })
                .collect()
        },
        up_seconds: shared.up_for(Instant::now()).as_secs_f64(),
        silent_for_seconds: g.monitor.lease().silent_for(now).as_secs_f64(),
        lease_timeout: HumanDuration(g.timing.lease_timeout).to_string(),
        peer_check_interval: HumanDuration(g.timing.peer_check_interval).to_string(),
        timings_source: g.timings_source.as_str().to_string(),
        signed_topology: shared.trust.signed(),
        last_tick: g.last_tick,
        sessions_killed: g.sessions_killed,
        note: (self_fenced || role == "fenced").then(|| STALE_READS_NOTE.to_string()),
    };
    drop(g);
    axum::Json(body).into_response()
}
