//! `/deploy/v1` (SPEC §3): served only on the TLS listener, only by the leader.
//!
//! Every request goes through the same steps, in this order: leader (`503 not_leader`, before
//! anything else) → bearer token (`401`) → body size (`413`) and shape (`400`) → authorization
//! by `MysqlDatabase.spec.deploymentClients`, re-read from the store on every request (`403`,
//! identical for unknown and forbidden groups) → the lease engine. Every answer is JSON with
//! `Cache-Control: no-store`, and every request logs exactly one `deploy api` line. Tokens
//! (bearer and lease) never reach a log line, a metric or an error.

// Handlers return `Result<_, Response>` so an early answer is one `?`-free match arm; a
// response is large, but it is built once per request and never on a hot inner loop.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use bloodraven_core::contract::logs::DEPLOY_API;
use bloodraven_core::lease::{
    GrantRequest, LeaseError, LeaseKind, Release, validate_instance, validate_operation_id,
};
use bloodraven_core::resources::{DatabaseBody, KIND_DATABASE};
use bloodraven_core::wire::deploy::{ErrorBody, GrantAnswer, GrantBody, RenewAnswer, RenewBody};
use serde::Deserialize;
use tokio::time::Instant;

use super::{AppState, error_body, error_response, json_response};
use crate::auth::{AuthError, Identity};
use crate::group::{GroupRuntime, LeaseRef, RequestError};
use crate::metrics::{Handler, HandlerCode};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4096;

const FORBIDDEN_MESSAGE: &str = "this service account may not coordinate deployments of that group";

/// The deploy API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/deploy/v1/groups/{group}", any(observe))
        .route("/deploy/v1/groups/{group}/leases", any(leases))
        .route(
            "/deploy/v1/groups/{group}/leases/{kind}/{operation}",
            any(lease),
        )
        .fallback(not_found)
        .with_state(state)
}

/// What the request log line says.
#[derive(Default)]
struct Log {
    handler: &'static str,
    group: String,
    instance: String,
    operation_id: String,
}

fn finish(state: &AppState, log: &Log, started: Instant, response: Response) -> Response {
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    tracing::info!(
        handler = log.handler,
        group = %log.group,
        instance = %log.instance,
        operationId = %log.operation_id,
        status,
        duration_ms = elapsed.as_secs_f64() * 1e3,
        "{}",
        DEPLOY_API
    );
    state
        .metrics
        .api_requests
        .get_or_create(&HandlerCode {
            handler: log.handler.to_string(),
            code: status.to_string(),
        })
        .inc();
    state
        .metrics
        .api_request_duration
        .get_or_create(&Handler {
            handler: log.handler.to_string(),
        })
        .observe(elapsed.as_secs_f64());
    response
}

fn not_leader() -> Response {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_leader",
        "this operator is not the leader; retry against the leader",
    )
}

/// The leader has not loaded every group yet: `503 not_leader` with `reason: loading` and
/// `Retry-After`, never a `403` or `404` for a group it simply has not read yet (a client
/// would take those for lost authority).
fn loading() -> Response {
    super::loading_response()
}

fn unauthorized(reason: &str) -> Response {
    let mut r = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &format!("authentication failed: {reason}"),
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"bloodraven-deploy\""),
    );
    r
}

fn forbidden() -> Response {
    error_response(StatusCode::FORBIDDEN, "forbidden", FORBIDDEN_MESSAGE)
}

fn invalid(message: &str) -> Response {
    error_response(StatusCode::BAD_REQUEST, "invalid_request", message)
}

fn method_not_allowed(allow: &'static str) -> Response {
    let mut r = error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("this resource allows {allow}"),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

fn unavailable(message: &str) -> Response {
    error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
}

async fn not_found(State(state): State<AppState>) -> Response {
    let started = Instant::now();
    let log = Log {
        handler: "unknown",
        ..Log::default()
    };
    let r = error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such deploy API resource",
    );
    finish(&state, &log, started, r)
}

/// Checks the bearer token. Never logs or echoes it.
/// The checks every deploy API request passes first, in the contract's order: a follower, or a
/// leader still loading its groups, answers `503` before anything else, then `405` for a method
/// the path does not take, then authentication.
async fn admit(
    state: &AppState,
    method: &Method,
    allowed: &[Method],
    allow_header: &'static str,
    headers: &HeaderMap,
) -> Result<Identity, Response> {
    if !state.is_leader() {
        return Err(not_leader());
    }
    if !state.is_loaded() {
        return Err(loading());
    }
    if !allowed.contains(method) {
        return Err(method_not_allowed(allow_header));
    }
    authenticate(state, headers).await
}

async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Identity, Response> {
    let Some(auth) = &state.authenticator else {
        return Err(unavailable(
            "the deploy API has no way to check tokens configured",
        ));
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or_default();
    match auth.authenticate(token).await {
        Ok(id) => Ok(id),
        Err(e @ AuthError::Unavailable(_)) => Err(unavailable(&e.to_string())),
        Err(e) => Err(unauthorized(&e.to_string())),
    }
}

/// Finds the group this identity may coordinate and the databases (lease instances) it may
/// act for, re-reading the databases from the store. An unknown group and a group the
/// identity may not coordinate get the same `403`.
async fn authorize_group(
    state: &AppState,
    group: &str,
    id: &Identity,
) -> Result<(Arc<GroupRuntime>, Vec<String>), Response> {
    let Some(runtime) = state.group(group).await else {
        return Err(forbidden());
    };
    let instances = match state.databases.authorized(
        &runtime.namespace,
        group,
        &id.namespace,
        &id.service_account,
    ) {
        Some(v) => v,
        // Not loaded yet (the term is starting): read the store.
        None => state
            .store
            .list(KIND_DATABASE, Some(&runtime.namespace))
            .await
            .map_err(|e| unavailable(&format!("cannot read MysqlDatabase objects: {e}")))?
            .iter()
            .filter(|o| {
                o.decode::<DatabaseBody>().is_ok_and(|body| {
                    body.spec
                        .authorizes(group, &id.namespace, &id.service_account)
                })
            })
            .map(|o| o.metadata.name.clone())
            .collect(),
    };
    if instances.is_empty() {
        return Err(forbidden());
    }
    Ok((runtime, instances))
}

/// [`authorize_group`], and the request's `instance` must be one of the identity's.
async fn authorize(
    state: &AppState,
    group: &str,
    id: &Identity,
    instance: Option<&str>,
) -> Result<Arc<GroupRuntime>, Response> {
    let (runtime, instances) = authorize_group(state, group, id).await?;
    match instance {
        Some(i) if !instances.iter().any(|mine| mine == i) => Err(forbidden()),
        _ => Ok(runtime),
    }
}

/// A body larger than this is not read to its end before the `413` goes out (see
/// [`read_body`]).
pub const MAX_DRAIN_BYTES: u64 = 8 * 1024 * 1024;
/// How long an oversized body is read (and thrown away) before the `413` goes out.
pub const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads the request body, at most [`MAX_BODY_BYTES`].
///
/// A body announced larger than that (`Content-Length`) is refused at once, without waiting
/// for it. A refused body that is on its way is read and thrown away first (up to
/// [`MAX_DRAIN_BYTES`], for at most [`DRAIN_TIME`]): closing a connection with unread data
/// makes the kernel reset it, and the client would lose the `413` it was sent.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, Response> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let limit = u64::try_from(MAX_BODY_BYTES).unwrap_or(u64::MAX);
    let too_large = || {
        let mut r = error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("the request body must be at most {MAX_BODY_BYTES} bytes"),
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    match announced {
        Some(n) if n > MAX_DRAIN_BYTES => return Err(too_large()),
        Some(n) if n > limit => {
            drain(body).await;
            return Err(too_large());
        }
        _ => {}
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let Ok(chunk) = chunk else {
            return Err(invalid("the request body could not be read"));
        };
        if buf.len() + chunk.len() > MAX_BODY_BYTES {
            drain_stream(stream).await;
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(axum::body::Bytes::from(buf))
}

async fn drain(body: Body) {
    drain_stream(body.into_data_stream()).await;
}

async fn drain_stream(mut stream: axum::body::BodyDataStream) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut seen: u64 = 0;
        while let Some(Ok(chunk)) = futures::StreamExt::next(&mut stream).await {
            seen += chunk.len() as u64;
            if seen > MAX_DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, Response> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." || path == "?" || path.is_empty() {
            invalid(&format!(
                "the body is not valid JSON for this request: {inner}"
            ))
        } else {
            invalid(&format!("field {path}: {inner}"))
        }
    })
}

fn lease_error(e: &LeaseError) -> Response {
    let body = |code: &str| ErrorBody::new(code, &e.to_string());
    match e {
        LeaseError::InvalidRequest { .. } => invalid(&e.to_string()),
        LeaseError::Held { holder } => error_body(
            StatusCode::CONFLICT,
            &ErrorBody {
                holder: Some(holder.clone()),
                ..body("held")
            },
        ),
        LeaseError::HoldRequiresMigration => error_body(StatusCode::FORBIDDEN, &body("forbidden")),
        LeaseError::Unstable {
            reason,
            retry_after_seconds,
        } => {
            let mut r = error_body(
                StatusCode::LOCKED,
                &ErrorBody {
                    reason: Some(reason.as_str().to_string()),
                    retry_after_seconds: Some(*retry_after_seconds),
                    ..body("unstable")
                },
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_seconds));
            r
        }
        LeaseError::Revoked {
            reason,
            topology_generation,
        } => error_body(
            StatusCode::CONFLICT,
            &ErrorBody {
                reason: Some(reason.as_str().to_string()),
                topology_generation: Some(*topology_generation),
                ..body("revoked")
            },
        ),
        LeaseError::NotFound => error_body(StatusCode::NOT_FOUND, &body("not_found")),
        LeaseError::TokenMismatch => error_body(StatusCode::FORBIDDEN, &body("token_mismatch")),
    }
}

fn request_error(e: &RequestError) -> Response {
    match e {
        RequestError::Lease(l) => lease_error(l),
        RequestError::Store(s) => {
            tracing::warn!(error = %s, "deploy API request could not be persisted");
            unavailable("the decision could not be persisted; nothing was granted or renewed")
        }
        RequestError::Random => unavailable("no secure randomness available for a lease token"),
    }
}

async fn observe(
    State(state): State<AppState>,
    method: Method,
    Path(group): Path<String>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let log = Log {
        handler: "observe",
        group: group.clone(),
        ..Log::default()
    };
    let r = async {
        let id = match admit(&state, &method, &[Method::GET], "GET", &headers).await {
            Ok(id) => id,
            Err(r) => return r,
        };
        let rt = match authorize(&state, &group, &id, None).await {
            Ok(rt) => rt,
            Err(r) => return r,
        };
        let obs = rt.observe().await;
        json_response(StatusCode::OK, &obs)
    }
    .await;
    finish(&state, &log, started, r)
}

async fn leases(
    State(state): State<AppState>,
    method: Method,
    Path(group): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let mut log = Log {
        handler: "grant",
        group: group.clone(),
        ..Log::default()
    };
    let r = async {
        let id = match admit(&state, &method, &[Method::POST], "POST", &headers).await {
            Ok(id) => id,
            Err(r) => return r,
        };
        let bytes = match read_body(&headers, body).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let b: GrantBody = match parse_json(&bytes) {
            Ok(b) => b,
            Err(r) => return r,
        };
        log.instance.clone_from(&b.instance);
        log.operation_id = loggable(&b.operation_id);
        let kind: LeaseKind = match b.kind.parse() {
            Ok(k) => k,
            Err(e) => return lease_error(&e),
        };
        if let Err(e) = validate_operation_id(&b.operation_id).and(validate_instance(&b.instance)) {
            return lease_error(&e);
        }
        let rt = match authorize(&state, &group, &id, Some(&b.instance)).await {
            Ok(rt) => rt,
            Err(r) => return r,
        };
        let req = GrantRequest {
            kind,
            operation_id: b.operation_id,
            instance: b.instance,
            ttl_seconds: b.ttl_seconds,
        };
        match rt.grant(req).await {
            Ok(g) => {
                let status = if g.regranted {
                    StatusCode::OK
                } else {
                    StatusCode::CREATED
                };
                json_response(
                    status,
                    &GrantAnswer {
                        kind: g.kind,
                        operation_id: g.operation_id,
                        token: g.token.expose().to_string(),
                        expires_at: g.expires_at,
                        topology_generation: g.topology_generation,
                    },
                )
            }
            Err(e) => request_error(&e),
        }
    }
    .await;
    finish(&state, &log, started, r)
}

fn lease_token(headers: &HeaderMap) -> &str {
    headers
        .get("x-lease-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn no_content() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An operation id as it may appear in a log line (bounded, printable).
fn loggable(op: &str) -> String {
    op.chars()
        .take(bloodraven_core::lease::MAX_OPERATION_ID_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `PUT` (renew) and `DELETE` (release) of one lease. Over 100 lines: every refusal of a
/// lease request in the order the API documents them, then the renewal or release, read as one.
async fn lease(
    State(state): State<AppState>,
    method: Method,
    Path((group, kind, operation)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let mut log = Log {
        handler: if method == Method::DELETE {
            "release"
        } else {
            "renew"
        },
        group: group.clone(),
        operation_id: loggable(&operation),
        ..Log::default()
    };
    let r = async {
        let id = match admit(
            &state,
            &method,
            &[Method::PUT, Method::DELETE],
            "PUT, DELETE",
            &headers,
        )
        .await
        {
            Ok(id) => id,
            Err(r) => return r,
        };
        let bytes = match read_body(&headers, body).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let kind: LeaseKind = match kind.parse() {
            Ok(k) => k,
            Err(e) => return lease_error(&e),
        };
        if let Err(e) = validate_operation_id(&operation) {
            return lease_error(&e);
        }
        let (rt, instances) = match authorize_group(&state, &group, &id).await {
            Ok(v) => v,
            Err(r) => return r,
        };
        // Someone else's operation (a lease or a tombstone of an instance this identity may
        // not act for) is answered exactly like an operation that does not exist: renewal
        // `404`, release `204` (nothing released), so operation ids do not leak across
        // instances.
        let known_instance = rt.instance_of(&operation);
        if let Some(i) = &known_instance {
            log.instance.clone_from(i);
        }
        let foreign = known_instance
            .as_ref()
            .is_some_and(|i| !instances.contains(i));
        if foreign {
            log.instance.clear();
            return if method == Method::PUT {
                match parse_json::<RenewBody>(&bytes) {
                    Ok(_) => lease_error(&LeaseError::NotFound),
                    Err(r) => r,
                }
            } else if !bytes.is_empty() {
                invalid("DELETE takes no body; send the lease token in X-Lease-Token")
            } else if lease_token(&headers).is_empty() {
                invalid("header X-Lease-Token is required")
            } else {
                no_content()
            };
        }
        if method == Method::PUT {
            let b: RenewBody = match parse_json(&bytes) {
                Ok(b) => b,
                Err(r) => return r,
            };
            let lease = LeaseRef {
                kind,
                operation_id: operation.clone(),
                token: b.token,
            };
            match rt.renew(lease, b.ttl_seconds).await {
                Ok(r) => json_response(
                    StatusCode::OK,
                    &RenewAnswer {
                        expires_at: r.expires_at,
                        topology_generation: r.topology_generation,
                    },
                ),
                Err(e) => request_error(&e),
            }
        } else {
            if !bytes.is_empty() {
                return invalid("DELETE takes no body; send the lease token in X-Lease-Token");
            }
            let token = lease_token(&headers);
            if token.is_empty() {
                return invalid("header X-Lease-Token is required");
            }
            let lease = LeaseRef {
                kind,
                operation_id: operation.clone(),
                token: token.to_string(),
            };
            match rt.release(lease).await {
                Ok(Release::Released | Release::NothingToRelease) => no_content(),
                Err(e) => request_error(&e),
            }
        }
    }
    .await;
    finish(&state, &log, started, r)
}

/// How long the deploy API waits for a request's headers before closing the connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
