//! The operator's HTTP surface: the deploy API (`deploy`, TLS only), the plain status
//! endpoints (`plain`), and the component listener (`component`, mutual TLS: what sidecars
//! and routers call). All read the same [`AppState`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bloodraven_core::wire::deploy::ErrorBody;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::Store;
use tokio::sync::RwLock;

use crate::group::GroupRuntime;
use crate::metrics::Metrics;

pub mod component;
pub mod databases;
pub mod deploy;
pub mod plain;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub clock: SharedClock,
    pub metrics: Metrics,
    /// Whether this process leads (and may act now).
    pub leadership: crate::leader::Leadership,
    /// Groups by name; filled once this process leads.
    pub groups: Arc<RwLock<BTreeMap<String, Arc<GroupRuntime>>>>,
    /// Set once the leader has loaded every group it found (there may be none); watched by
    /// the Pod label, which names this replica the leader only once it serves.
    pub loaded: Arc<tokio::sync::watch::Sender<bool>>,
    /// Checks the deploy API's bearer tokens (when the API is enabled): the operator's own
    /// HMAC tokens, or TokenReview in Kubernetes mode.
    pub authenticator: Option<Arc<dyn crate::auth::Authenticator>>,
    pub audience: String,
    /// Signs every active-site view served (when configured); reloaded when it changes.
    pub topology_key: crate::secrets::KeyCell,
    /// Where named secrets live (MySQL credentials): the platform's.
    pub secrets: Arc<dyn crate::secrets::SecretStore>,
    /// The sites' workloads (Pods in Kubernetes mode): labelled with their role.
    pub workloads: Arc<dyn crate::platform::SiteWorkloads>,
    /// The `MysqlDatabase` objects, from the store's watch while this process leads: what
    /// the deploy API authorizes against.
    pub databases: Arc<databases::Databases>,
    /// The component listener's certificate and CA bundle (`componentTLS`): who a caller
    /// there is, and how this operator proves itself to the sidecars it reads.
    pub component_tls: Option<Arc<bloodraven_runtime::mtls::ComponentTls>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

impl AppState {
    /// Whether this process leads *now*: elected, and (on a platform whose leadership is
    /// renewed) still covered by its last renewal. A leader that may have been replaced
    /// answers as a follower.
    pub fn is_leader(&self) -> bool {
        self.leadership.confirm()
    }

    /// Leading, with every group loaded.
    /// Readiness: a follower is ready once it serves (it answers `503 not_leader` and
    /// stands by); the leader once it has loaded its groups. Readiness never depends on
    /// leadership, so a rollout does not wait on which replica leads; Services reach the
    /// leader through its Pod label (`crate::pod_label`).
    pub fn is_ready(&self) -> bool {
        !self.is_leader() || self.is_loaded()
    }

    /// Whether the groups were loaded since this process last gained leadership.
    pub fn is_loaded(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Leading, with its groups loaded: what answers the deploy API and `/active-site`.
    pub fn is_serving_as_leader(&self) -> bool {
        self.is_leader() && self.is_loaded()
    }

    pub async fn group(&self, name: &str) -> Option<Arc<GroupRuntime>> {
        self.groups.read().await.get(name).cloned()
    }
}

/// How long a client should wait before asking a leader that is still loading its groups.
pub const LOADING_RETRY_AFTER_SECONDS: u32 = 1;

/// `503 {"error":"not_leader","reason":"loading"}` with `Retry-After`: this process leads but
/// has not loaded every group yet. Both listeners answer it for group requests in that window.
pub fn loading_response() -> Response {
    let mut r = error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        &ErrorBody {
            reason: Some("loading".into()),
            retry_after_seconds: Some(LOADING_RETRY_AFTER_SECONDS),
            ..ErrorBody::new(
                "not_leader",
                "this operator leads but has not loaded every group yet; retry shortly",
            )
        },
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(LOADING_RETRY_AFTER_SECONDS),
    );
    r
}

/// A JSON response with `Cache-Control: no-store`.
pub fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An error answer: `{"error": code, "message": sentence}`.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    error_body(status, &ErrorBody::new(code, message))
}

/// An error answer with its extra fields ([`ErrorBody`]).
pub fn error_body(status: StatusCode, body: &ErrorBody) -> Response {
    json_response(status, body)
}
