//! The sidecar's server (`--listen`, TLS with client certificates optional): `/health`,
//! `/status`, the routers' checks (`/primary`, `/replica`, `/read-only`: `200` or `503`, as
//! [`bloodraven_core::routing`] decides) and `/metrics`, open to load balancers and probes;
//! `/peer/ping` and `/peer/active-site` only for a verified peer; `/backups` only for the
//! group's operator ([`crate::backups`]).
//!
//! **Peers prove who they are.** A `/peer/*` caller must present a certificate of the
//! component CA naming a site of this sidecar's group (docs/security.md). Without a verified
//! certificate the answer is `401`, with another party's `403`, each with a JSON `reason`, and
//! nothing is recorded. The caller's site is its certificate's, never a parameter: what the
//! sidecar records of it (when it answered it, the view it said it holds: strict fencing's
//! facts) is what that site's own sidecar said. Peers also send `namespace` and `group`; a
//! sidecar of another group answers `404`, so a misconfigured peer list cannot lend a view (or
//! a lease) across groups. Nothing here holds a secret: `/status` shows the server's state,
//! the cached view and contact times, never credentials.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path as UrlPath, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bloodraven_core::duration::HumanDuration;
use bloodraven_core::fencing::ViewSource;
use bloodraven_core::wire::{
    SidecarMysql, SidecarPeer, SidecarReplication, SidecarStatus, SidecarTopology,
};
use bloodraven_mysql::{MysqlError, Probe};
use serde::Deserialize;
use serde_json::json;
use tokio::time::{Instant, timeout};

use bloodraven_core::identity::Expected;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_runtime::mtls::{ComponentTls, Refusal};
use bloodraven_runtime::serve::PeerCertificates;

use crate::backups::Refused;
use crate::contacts::Claim;
use crate::database::Database;
use crate::metrics::Metrics;
use crate::state::Shared;

/// The server's state.
#[derive(Debug)]
pub struct App<D> {
    pub shared: Arc<Shared>,
    /// Backups the operator asks for ([`crate::backups`]).
    pub backups: Arc<crate::backups::Backups>,
    pub db: Arc<D>,
    pub metrics: Arc<Metrics>,
    /// This sidecar's certificate and the CA bundle its peers are checked against.
    pub tls: Arc<ComponentTls>,
    /// When a peer's certificate is judged.
    pub clock: SharedClock,
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
        .route("/backups", post(backup_start::<D>))
        .route(
            "/backups/{id}",
            get(backup_report::<D>).delete(backup_abandon::<D>),
        )
        .with_state(app)
}

/// The note `/status` carries while surviving sessions may serve stale reads.
pub const STALE_READS_NOTE: &str = "client writes are refused, but fencing does not close connections: sessions that survived it may serve stale reads until this site is next promoted or demoted";

#[derive(Debug, Deserialize)]
struct GroupQuery {
    namespace: Option<String>,
    group: Option<String>,
    /// The generation of the view the caller holds ([`Claim::held`]).
    held: Option<u64>,
    /// Its server's `read_only` under that view ([`Claim::read_only`]).
    #[serde(rename = "readOnly")]
    read_only: Option<bool>,
}

impl GroupQuery {
    fn claim(&self) -> Claim {
        Claim {
            held: self.held,
            read_only: self.read_only,
        }
    }
}

/// The verified site calling `/peer/*`, or the refusal: `401` without a verified certificate,
/// `403` for a certificate of another party than a site of this group.
fn peer_site<D>(app: &App<D>, peer: Option<&PeerCertificates>) -> Result<String, Box<Response>> {
    let id = &app.shared.identity;
    let expected = Expected::AnySiteOf {
        namespace: id.namespace.clone(),
        group: id.group.clone(),
    };
    let chain = peer.and_then(PeerCertificates::chain);
    app.tls
        .authorize(chain, app.clock.now(), &expected)
        .map(|c| c.site_name().unwrap_or_default().to_string())
        .map_err(|r| Box::new(refusal(&r)))
}

/// A refused caller's answer: `{"error": …, "reason": …}`.
pub fn refusal(r: &Refusal) -> Response {
    let code = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::UNAUTHORIZED);
    (
        code,
        axum::Json(json!({"error": r.code(), "reason": r.to_string()})),
    )
        .into_response()
}

/// A malformed query's answer, naming the parameters and their rules.
fn bad_peer_query() -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({
            "error": "invalid_request",
            "reason": "query parameters: namespace and group (names), held (a topologyGeneration, a whole number), readOnly (true or false)",
        })),
    )
        .into_response()
}

type PeerQuery = Result<Query<GroupQuery>, axum::extract::rejection::QueryRejection>;

/// The checks every `/peer/*` request passes, in order: who calls (nothing else is read
/// before), a well-formed query, this group. Returns the caller's site and what it said.
fn admit_peer<D>(
    app: &App<D>,
    peer: Option<&PeerCertificates>,
    q: PeerQuery,
) -> Result<(String, Claim), Box<Response>> {
    let site = peer_site(app, peer)?;
    let Ok(Query(q)) = q else {
        return Err(Box::new(bad_peer_query()));
    };
    if let Some(r) = wrong_group(&app.shared, &q) {
        return Err(Box::new(r));
    }
    Ok((site, q.claim()))
}

/// A `/peer/*` caller that passed [`admit_peer`] and is recorded as heard, with what it said
/// ([`Shared::heard`]), before its handler runs. A refused one gets the refusal instead.
struct HeardPeer;

impl<D: Database> FromRequestParts<Arc<App<D>>> for HeardPeer {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App<D>>,
    ) -> Result<Self, Self::Rejection> {
        let q = Query::<GroupQuery>::from_request_parts(parts, app).await;
        let peer = parts.extensions.get::<PeerCertificates>();
        let (site, claim) = admit_peer(app, peer, q).map_err(|r| *r)?;
        app.shared.heard(&site, claim);
        Ok(HeardPeer)
    }
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

async fn peer_ping<D: Database>(State(app): State<Arc<App<D>>>, _: HeardPeer) -> Response {
    let id = &app.shared.identity;
    axum::Json(json!({"site": id.site, "group": id.group, "namespace": id.namespace}))
        .into_response()
}

async fn peer_active_site<D: Database>(State(app): State<Arc<App<D>>>, _: HeardPeer) -> Response {
    let view = app.shared.peer_view();
    match view {
        Some(v) => axum::Json(v).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// The operator of this sidecar's group, proven by its certificate: `401` without a verified
/// certificate, `403` for another party (a peer sidecar included).
struct TheOperator;

impl<D: Database> FromRequestParts<Arc<App<D>>> for TheOperator {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &Arc<App<D>>,
    ) -> Result<Self, Self::Rejection> {
        let id = &app.shared.identity;
        let expected = Expected::OperatorOf {
            namespace: id.namespace.clone(),
            group: id.group.clone(),
        };
        let chain = parts
            .extensions
            .get::<PeerCertificates>()
            .and_then(PeerCertificates::chain);
        app.tls
            .authorize(chain, app.clock.now(), &expected)
            .map(|_| TheOperator)
            .map_err(|r| refusal(&r))
    }
}

/// A refused backup request's answer: `{"error", "reason"}`, and `field` for a bad one.
fn backup_refused(r: &Refused) -> Response {
    let (status, code) = r.status_and_code();
    let mut body = json!({"error": code, "reason": r.to_string()});
    if let Refused::Invalid { field, rule } = r {
        body["field"] = json!(field);
        body["reason"] = json!(rule);
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body)).into_response()
}

async fn backup_start<D: Database>(
    State(app): State<Arc<App<D>>>,
    _: TheOperator,
    body: axum::body::Bytes,
) -> Response {
    let id = &app.shared.identity;
    let source = crate::backups::Source {
        group: id.group.clone(),
        site: id.site.clone(),
    };
    match app.backups.start(&body, &source, &app.clock) {
        Ok(r) => (StatusCode::ACCEPTED, axum::Json(r)).into_response(),
        Err(r) => backup_refused(&r),
    }
}

async fn backup_report<D: Database>(
    State(app): State<Arc<App<D>>>,
    _: TheOperator,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match app.backups.get(&id) {
        Ok(r) => axum::Json(r).into_response(),
        Err(r) => backup_refused(&r),
    }
}

async fn backup_abandon<D: Database>(
    State(app): State<Arc<App<D>>>,
    _: TheOperator,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match app.backups.delete(&id).await {
        Ok(r) => axum::Json(r).into_response(),
        Err(r) => backup_refused(&r),
    }
}

async fn metrics<D: Database>(State(app): State<Arc<App<D>>>, headers: HeaderMap) -> Response {
    let (op, peers) = app.shared.contact_ages(Instant::now());
    app.metrics.contact_ages(op, peers);
    app.metrics.certificate_expiry(app.tls.current().not_after);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) =
        bloodraven_runtime::exposition::negotiate(accept, app.metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Why the status has no probe of the server.
#[derive(Debug, thiserror::Error)]
enum ProbeFailed {
    #[error("{0}")]
    Answered(#[from] MysqlError),
    #[error("no answer within {} ms", .0.as_millis())]
    Silent(std::time::Duration),
}

fn mysql_status(probe: Result<Probe, ProbeFailed>) -> (SidecarMysql, &'static str) {
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
                error: Some(error.to_string()),
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
        Ok(Err(e)) => Err(ProbeFailed::Answered(e)),
        Err(_) => Err(ProbeFailed::Silent(limit)),
    };
    let (mysql, role) = mysql_status(probe);
    let tls = app.tls.current().status();
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
                            held_generation: h.holds.map(|x| x.generation),
                            held_seconds_ago: h
                                .holds
                                .map(|x| at.saturating_duration_since(x.since).as_secs_f64()),
                            held_read_only: h.holds.and_then(|x| x.read_only),
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
        tls: Some(tls),
    };
    drop(g);
    axum::Json(body).into_response()
}
