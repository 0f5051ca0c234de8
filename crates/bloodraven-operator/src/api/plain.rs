//! The plain listener (`:8082`): liveness, readiness, `/active-site` (signed views, for
//! anyone who follows the primary), the groups' status, and metrics. It never serves
//! `/deploy/v1` (that answers `404`). Nobody is identified here: sidecars count the operator
//! only on the component listener ([`super::component`]).

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bloodraven_core::wire::ActiveSite;
use bloodraven_core::wire::{GroupReport, OperatorStatus};
use serde::Deserialize;
use serde_json::json;

use super::{AppState, error_response, json_response};

/// The plain listener's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/active-site", get(active_site))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .fallback(fallback)
        .with_state(state)
}

pub(super) async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> Response {
    let leader = state.is_leader();
    readiness(&state, leader)
}

/// The `/readyz` answer, with `leader` as read once by the caller.
pub(super) fn readiness(state: &AppState, leader: bool) -> Response {
    let ready = !leader || state.is_loaded();
    let mut body = json!({
        "ready": ready,
        "leader": leader,
        "loaded": state.is_loaded(),
    });
    if let Some(c) = state.leadership.control() {
        body["control"] = json!(c);
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(code, &body)
}

#[derive(Deserialize)]
pub(super) struct GroupQuery {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    group: Option<String>,
    /// `/active-site?watch=true`: server-sent events, one per new view.
    #[serde(default)]
    watch: Option<bool>,
    /// `/active-site?after=N`: answers once the generation is past `N` (long poll).
    #[serde(default)]
    after: Option<u64>,
}

/// How long `?after=` waits before answering `204` (the client asks again).
const LONG_POLL: std::time::Duration = std::time::Duration::from_secs(30);

/// How often a watch sends a keep-alive comment.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) async fn active_site(
    State(state): State<AppState>,
    q: Result<Query<GroupQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "query parameters: namespace, group, watch (true or false), after (a topologyGeneration, a whole number)",
        );
    };
    let Some(group) = q.group.filter(|g| !g.is_empty()) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "query parameter group is required",
        );
    };
    if !state.is_leader() {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            "this operator is not the leader",
        );
    }
    if !state.is_loaded() {
        return super::loading_response();
    }
    let namespace = q.namespace.clone().unwrap_or_else(|| "default".into());
    let Some(rt) = state
        .group(&group)
        .await
        .filter(|rt| rt.namespace == namespace)
    else {
        return error_response(StatusCode::NOT_FOUND, "not_found", "no such group");
    };
    if q.watch == Some(true) {
        return watch_views(state, rt);
    }
    if let Some(after) = q.after {
        let mut rx = rt.watch_views();
        let newer = tokio::time::timeout(LONG_POLL, rx.wait_for(|g| *g > after)).await;
        if !matches!(newer, Ok(Ok(_))) {
            return StatusCode::NO_CONTENT.into_response();
        }
    }
    match signed_view(&state, &rt) {
        Some(view) => json_response(StatusCode::OK, &view),
        None => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_observed",
            "the group has not been observed yet",
        ),
    }
}

/// The group's current view, signed when the operator has a topology key; `None` before the
/// group was first observed.
fn signed_view(
    state: &AppState,
    rt: &std::sync::Arc<crate::group::GroupRuntime>,
) -> Option<ActiveSite> {
    let snap = rt.snapshot();
    let s = rt.served_status(&snap);
    let observed_at = s.observed_at?;
    let mut view = ActiveSite::new(s.active_site.clone(), s.topology_generation, observed_at);
    view.group.clone_from(&rt.name);
    view.namespace.clone_from(&rt.namespace);
    view.lease_timeout_seconds = Some(rt.config.lease_timeout.as_secs());
    view.peer_check_interval_seconds = Some(rt.config.peer_check_interval.as_secs());
    if rt.config.fencing == bloodraven_core::config::FencingMode::Strict {
        view.fencing = Some(rt.config.fencing);
    }
    if let Some(k) = state.topology_key.get() {
        k.sign(&mut view);
    }
    Some(view)
}

/// `/active-site?watch=true`: the current view, then each new one as it is announced, as
/// server-sent events (`data:` lines of the view's JSON); keep-alive comments between. When
/// this operator stops leading, a last event `end` (`data: {"reason":"NotLeader"}`) ends the
/// stream: the client reconnects, to the new leader.
fn watch_views(state: AppState, rt: std::sync::Arc<crate::group::GroupRuntime>) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    /// Where a watch stands.
    enum At {
        First,
        Following,
        Ended,
    }
    let ended = || {
        Event::default()
            .event(WATCH_END_EVENT)
            .data(r#"{"reason":"NotLeader"}"#)
    };
    let rx = rt.watch_views();
    let lead = state.leadership.watch();
    let stream = futures::stream::unfold(
        (state, rt, rx, lead, At::First),
        move |(state, rt, mut rx, mut lead, at)| async move {
            match at {
                At::Ended => return None,
                At::First => {}
                At::Following => {
                    let next = tokio::select! {
                        r = rx.changed() => r.is_ok(),
                        _ = lead.wait_for(|l| !*l) => false,
                    };
                    if !next {
                        return Some((Ok(ended()), (state, rt, rx, lead, At::Ended)));
                    }
                }
            }
            if !state.is_leader() {
                return Some((Ok(ended()), (state, rt, rx, lead, At::Ended)));
            }
            rx.borrow_and_update();
            let event = match signed_view(&state, &rt) {
                Some(v) => Event::default()
                    .json_data(&v)
                    .unwrap_or_else(|_| Event::default().comment("unencodable view")),
                None => Event::default().comment("not observed yet"),
            };
            Some((
                Ok::<_, std::convert::Infallible>(event),
                (state, rt, rx, lead, At::Following),
            ))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// The event that ends a watch when its operator stops leading (SPEC: `event: end`).
pub const WATCH_END_EVENT: &str = "end";

async fn status(
    State(state): State<AppState>,
    q: Result<Query<GroupQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if !state.is_leader() {
        let mut body = json!({"error": "not_leader", "message": "this operator is not the leader"});
        // Says who is, where the platform knows (etcd): `bloodraven status` names it.
        if let Some(c) = state.leadership.control() {
            body["control"] = json!(c);
        }
        return json_response(StatusCode::SERVICE_UNAVAILABLE, &body);
    }
    if !state.is_loaded() {
        return super::loading_response();
    }
    let want = q.ok().and_then(|Query(q)| q.group);
    let groups = state.groups.read().await.clone();
    let mut out = BTreeMap::new();
    for (name, rt) in groups {
        if want.as_ref().is_some_and(|w| *w != name) {
            continue;
        }
        let snap = rt.snapshot();
        let obs = rt.observe().await;
        let events = crate::events::list(rt.store(), &rt.namespace, &name)
            .await
            .unwrap_or_default()
            .into_iter()
            .rev()
            .take(30)
            .map(|(_, e)| e)
            .collect::<Vec<_>>();
        out.insert(
            name,
            GroupReport {
                namespace: rt.namespace.clone(),
                spec: snap.body.spec.clone(),
                status: rt.served_status(&snap),
                annotations: snap.annotations.clone(),
                deploy: obs,
                events,
            },
        );
    }
    if let Some(w) = want
        && out.is_empty()
    {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no group {w:?}"),
        );
    }
    json_response(
        StatusCode::OK,
        &OperatorStatus {
            groups: out,
            control: state.leadership.control(),
            component_tls: state.component_tls.as_ref().map(|t| t.current().status()),
        },
    )
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(tls) = &state.component_tls {
        state.metrics.certificate_expiry(tls.current().not_after);
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) =
        bloodraven_runtime::exposition::negotiate(accept, state.metrics.render());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

pub(super) async fn fallback(uri: axum::http::Uri) -> Response {
    let message = if uri.path().starts_with("/deploy/") {
        "the deploy API is served only on the TLS listener"
    } else {
        "no such endpoint"
    };
    error_response(StatusCode::NOT_FOUND, "not_found", message)
}
