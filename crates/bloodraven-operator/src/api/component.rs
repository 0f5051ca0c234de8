//! The component listener (`componentTLS.listen`, mutual TLS): what the sidecars call
//! (`/readyz`, `/active-site` with its watch and long poll) and `/healthz`.
//!
//! A sidecar counts this operator as answering (its rule #2) only from a `/readyz` that says
//! it leads, over TLS that proved the operator. In turn, this operator records that it
//! answered a sidecar (strict fencing's facts: whom it kept from fencing, and the view that
//! sidecar said it holds) only when the caller's certificate proves it is that site's
//! sidecar: a `/readyz` that names a group is answered with `401`/`403` (and no `leader`)
//! to anyone else, so a sidecar never counts an answer this operator did not record.

use axum::Router;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use bloodraven_core::identity::{Expected, WrongParty};
use bloodraven_runtime::mtls::Refusal;
use bloodraven_runtime::serve::PeerCertificates;
use serde::Deserialize;
use serde_json::json;

use super::{AppState, json_response};

/// The component listener's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(super::plain::healthz))
        .route("/readyz", get(readyz))
        .route("/active-site", get(super::plain::active_site))
        .fallback(super::plain::fallback)
        .with_state(state)
}

/// `/readyz`'s query on this listener: the group the calling sidecar belongs to, and what it
/// says of itself (the view it holds, its server's `read_only` under it).
#[derive(Deserialize)]
struct ReadyzQuery {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    held: Option<u64>,
    #[serde(default, rename = "readOnly")]
    read_only: Option<bool>,
}

fn refused(r: &Refusal) -> Response {
    let code = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::UNAUTHORIZED);
    json_response(code, &json!({"error": r.code(), "reason": r.to_string()}))
}

async fn readyz(
    State(state): State<AppState>,
    peer: Option<Extension<PeerCertificates>>,
    q: Result<Query<ReadyzQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({
                "error": "invalid_request",
                "reason": "query parameters: namespace and group (names), held (a topologyGeneration, a whole number), readOnly (true or false)",
            }),
        );
    };
    // Leadership is read once: the answer says `leader: true` only if the contact was
    // recorded under that same reading.
    let leader = state.is_leader();
    if let Some(group) = q.group.as_deref() {
        let namespace = q.namespace.as_deref().unwrap_or("default");
        let Some(tls) = &state.component_tls else {
            return refused(&Refusal::NoCertificate);
        };
        let chain = peer.as_deref().and_then(PeerCertificates::chain);
        let expected = Expected::AnySiteOf {
            namespace: namespace.to_string(),
            group: group.to_string(),
        };
        let caller = match tls.authorize(chain, state.clock.now(), &expected) {
            Ok(id) => id,
            Err(r) => return refused(&r),
        };
        let site = caller.site_name().unwrap_or_default();
        if leader {
            let Some(rt) = state
                .group(group)
                .await
                .filter(|rt| rt.namespace == namespace)
            else {
                return refused(&Refusal::WrongParty(WrongParty {
                    found: caller.to_string(),
                    wanted: format!(
                        "a site of a group this operator runs ({namespace}/{group} is not one)"
                    ),
                }));
            };
            if rt.config.site(site).is_none() {
                return refused(&Refusal::WrongParty(WrongParty {
                    found: caller.to_string(),
                    wanted: format!("a site of group {group} ({site} is not in its spec)"),
                }));
            }
            rt.answered_sidecar(
                site,
                crate::group::Claim {
                    held: q.held,
                    read_only: q.read_only,
                },
            );
        }
    }
    super::plain::readiness(&state, leader)
}
