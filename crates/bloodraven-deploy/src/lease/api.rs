//! The `/deploy/v1` API as a client sees it: one call per endpoint, each answer mapped to a
//! typed outcome. [`HttpLeaseApi`] talks HTTPS to an operator (trusting only the given CA and
//! re-reading the bearer token from its file on every request, because projected tokens
//! rotate); tests use their own [`LeaseApi`] implementations.
//!
//! A request that was sent but whose answer never came is [`ApiError::AnswerLost`]: its effect is
//! unknown, and the caller must not treat it as "nothing happened".

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use bloodraven_core::lease::{Holder, LeaseKind};
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::deploy::{ErrorBody, GrantAnswer, GrantBody, RenewAnswer, RenewBody};
use serde_json::Value;

/// A new or re-granted lease.
#[derive(Clone, PartialEq, Eq)]
pub struct Granted {
    pub token: String,
    pub expires_at: Timestamp,
    pub topology_generation: u64,
    /// `true` for a same-operation re-grant (200).
    pub regranted: bool,
}

impl fmt::Debug for Granted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Granted")
            .field("token", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .field("topology_generation", &self.topology_generation)
            .field("regranted", &self.regranted)
            .finish()
    }
}

/// A confirmed renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    pub expires_at: Timestamp,
    pub topology_generation: u64,
}

pub use bloodraven_core::wire::deploy::{HealthView as ObservedHealth, Observation};

/// Every answer other than success.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("the migration lease is held by {} (instance {}) until {}", holder.operation_id, holder.instance, holder.expires_at)]
    Held { holder: Holder },
    #[error("the group is between confirmed states ({reason}); retry in {retry_after_seconds}s")]
    Unstable {
        reason: String,
        retry_after_seconds: u32,
    },
    #[error("the lease was revoked ({reason}); topologyGeneration is now {topology_generation}")]
    Revoked {
        reason: String,
        topology_generation: u64,
    },
    #[error("no such lease (expired, released or never granted)")]
    NotFound,
    #[error("the lease token does not match (rotated by a re-grant, or wrong)")]
    TokenMismatch,
    #[error("forbidden: {message}")]
    Forbidden { message: String },
    #[error("unauthorized: {message}")]
    Unauthorized { message: String },
    #[error("the operator answering is not the leader")]
    NotLeader,
    #[error("the operator is unavailable: {message}")]
    Unavailable { message: String },
    #[error("the request was refused as invalid: {message}")]
    Invalid { message: String },
    #[error("no connection to the operator (nothing was sent): {detail}")]
    NotSent { detail: String },
    #[error("the request was sent but its answer was lost (its effect is unknown): {detail}")]
    AnswerLost { detail: String },
    #[error("cannot read the bearer token file {path}: {detail}")]
    TokenFile { path: String, detail: String },
    #[error("unexpected answer {status}: {detail}")]
    Unexpected { status: u16, detail: String },
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// The four calls of the deploy API.
pub trait LeaseApi: Send + Sync + fmt::Debug {
    fn observe(&self) -> Fut<'_, Observation>;
    fn grant<'a>(
        &'a self,
        kind: LeaseKind,
        operation_id: &'a str,
        instance: &'a str,
        ttl_seconds: u32,
    ) -> Fut<'a, Granted>;
    fn renew<'a>(
        &'a self,
        kind: LeaseKind,
        operation_id: &'a str,
        token: &'a str,
        ttl_seconds: Option<u32>,
    ) -> Fut<'a, Renewed>;
    fn release<'a>(&'a self, kind: LeaseKind, operation_id: &'a str, token: &'a str)
    -> Fut<'a, ()>;
}

/// The deploy API over HTTPS, on one operator or several (the etcd platform: whichever leads
/// answers; the others answer `503 not_leader`).
#[derive(Clone)]
pub struct HttpLeaseApi {
    bases: Vec<String>,
    /// The operator that answered last (asked first).
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    group: String,
    token_file: PathBuf,
    http: reqwest::Client,
}

impl fmt::Debug for HttpLeaseApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpLeaseApi")
            .field("bases", &self.bases)
            .field("group", &self.group)
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

/// The client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientSetupError {
    #[error(
        "--api must be an https:// URL, or several separated by commas (the deploy API is served only over TLS), got {0:?}"
    )]
    NotHttps(String),
    #[error(transparent)]
    Tls(#[from] bloodraven_runtime::tls::TlsError),
}

impl HttpLeaseApi {
    /// A client for `group` at `api` (`https://host:8443`, or several separated by commas),
    /// trusting only the CA in `ca_file`.
    pub fn new(
        api: &str,
        ca_file: &Path,
        token_file: &Path,
        group: &str,
        request_timeout: Duration,
    ) -> Result<Self, ClientSetupError> {
        let mut bases = Vec::new();
        for a in api.split(',').map(str::trim) {
            let base = a.trim_end_matches('/').to_string();
            if !base.starts_with("https://") {
                return Err(ClientSetupError::NotHttps(a.to_string()));
            }
            bases.push(base);
        }
        let http = bloodraven_runtime::tls::http_client(Some(ca_file), request_timeout)?;
        Ok(HttpLeaseApi {
            bases,
            current: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            group: group.to_string(),
            token_file: token_file.to_path_buf(),
            http,
        })
    }

    fn bearer(&self) -> Result<String, ApiError> {
        std::fs::read_to_string(&self.token_file)
            .map(|t| t.trim().to_string())
            .map_err(|e| ApiError::TokenFile {
                path: self.token_file.display().to_string(),
                detail: e.kind().to_string(),
            })
    }

    /// Sends the request `make` builds for an operator's base URL: to the operator that
    /// answered last, then to the next one when a request was not sent (no connection) or
    /// the operator does not lead (`503 not_leader`; a follower applies nothing). A request
    /// whose answer was lost is never sent again; the next one starts at the next operator.
    async fn send(
        &self,
        make: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<(u16, Value), ApiError> {
        use std::sync::atomic::Ordering;
        let bearer = self.bearer()?;
        let first = self.current.load(Ordering::Relaxed);
        let n = self.bases.len();
        let mut last = ApiError::NotSent {
            detail: "no deploy API address".into(),
        };
        for k in 0..n {
            let i = (first + k) % n;
            match self
                .send_one(make(&self.bases[i]).bearer_auth(&bearer))
                .await
            {
                Ok((503, body)) if matches!(error_of(503, &body), ApiError::NotLeader) => {
                    last = ApiError::NotLeader;
                }
                Err(e @ ApiError::NotSent { .. }) => last = e,
                other => {
                    // An answer lost is not sent again, but the next request starts at the
                    // next operator: the one that lost it may be paused or cut off, and a
                    // client that kept asking it first would wait out every timeout on it.
                    let next = if matches!(other, Err(ApiError::AnswerLost { .. })) {
                        (i + 1) % n
                    } else {
                        i
                    };
                    self.current.store(next, Ordering::Relaxed);
                    return other;
                }
            }
        }
        match last {
            ApiError::NotLeader => Ok((503, serde_json::json!({"error": "not_leader"}))),
            e => Err(e),
        }
    }

    async fn send_one(&self, req: reqwest::RequestBuilder) -> Result<(u16, Value), ApiError> {
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Err(ApiError::NotSent {
                    detail: e.to_string(),
                });
            }
            Err(e) => {
                return Err(ApiError::AnswerLost {
                    detail: e.to_string(),
                });
            }
        };
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ApiError::AnswerLost {
            detail: e.to_string(),
        })?;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|e| ApiError::Unexpected {
                status,
                detail: format!("not JSON: {e}"),
            })?
        };
        Ok((status, body))
    }

    fn leases_url(&self, base: &str) -> String {
        format!("{base}/deploy/v1/groups/{}/leases", self.group)
    }
}

/// Maps a non-success answer to its error.
pub fn error_of(status: u16, body: &Value) -> ApiError {
    let e: ErrorBody = serde_json::from_value(body.clone()).unwrap_or_default();
    let message = e.message.clone();
    match (status, e.error.as_str()) {
        (409, "held") => match e.holder {
            Some(holder) => ApiError::Held { holder },
            None => ApiError::Unexpected {
                status,
                detail: "held without a holder".into(),
            },
        },
        (409, "revoked") => ApiError::Revoked {
            reason: e.reason.unwrap_or_default(),
            topology_generation: e.topology_generation.unwrap_or(0),
        },
        (423, _) => ApiError::Unstable {
            reason: e.reason.unwrap_or_default(),
            retry_after_seconds: e.retry_after_seconds.unwrap_or(1),
        },
        (404, _) => ApiError::NotFound,
        (403, "token_mismatch") => ApiError::TokenMismatch,
        (403, _) => ApiError::Forbidden { message },
        (401, _) => ApiError::Unauthorized { message },
        (503, "not_leader") => ApiError::NotLeader,
        (503, _) => ApiError::Unavailable { message },
        (400 | 405 | 413, _) => ApiError::Invalid { message },
        _ => ApiError::Unexpected {
            status,
            detail: format!("{}: {message}", e.error),
        },
    }
}

/// Reads a success body as `T`; a body that does not parse is an unexpected answer.
fn answer<T: serde::de::DeserializeOwned>(
    status: u16,
    v: Value,
    what: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::Unexpected {
        status,
        detail: format!("{what}: {e}"),
    })
}

impl LeaseApi for HttpLeaseApi {
    fn observe(&self) -> Fut<'_, Observation> {
        Box::pin(async move {
            let (status, body) = self
                .send(|b| {
                    self.http
                        .get(format!("{b}/deploy/v1/groups/{}", self.group))
                })
                .await?;
            if status != 200 {
                return Err(error_of(status, &body));
            }
            answer(status, body, "observation")
        })
    }

    fn grant<'a>(
        &'a self,
        kind: LeaseKind,
        operation_id: &'a str,
        instance: &'a str,
        ttl_seconds: u32,
    ) -> Fut<'a, Granted> {
        Box::pin(async move {
            let body = GrantBody {
                kind: kind.as_str().to_string(),
                operation_id: operation_id.to_string(),
                instance: instance.to_string(),
                ttl_seconds: Some(i64::from(ttl_seconds)),
            };
            let (status, v) = self
                .send(|b| self.http.post(self.leases_url(b)).json(&body))
                .await?;
            if status != 200 && status != 201 {
                return Err(error_of(status, &v));
            }
            let g: GrantAnswer = answer(status, v, "grant")?;
            Ok(Granted {
                token: g.token,
                expires_at: g.expires_at,
                topology_generation: g.topology_generation,
                regranted: status == 200,
            })
        })
    }

    fn renew<'a>(
        &'a self,
        kind: LeaseKind,
        operation_id: &'a str,
        token: &'a str,
        ttl_seconds: Option<u32>,
    ) -> Fut<'a, Renewed> {
        Box::pin(async move {
            let body = RenewBody {
                token: token.to_string(),
                ttl_seconds: ttl_seconds.map(i64::from),
            };
            let (status, v) = self
                .send(|b| {
                    let url = format!("{}/{}/{}", self.leases_url(b), kind.as_str(), operation_id);
                    self.http.put(url).json(&body)
                })
                .await?;
            if status != 200 {
                return Err(error_of(status, &v));
            }
            let r: RenewAnswer = answer(status, v, "renewal")?;
            Ok(Renewed {
                expires_at: r.expires_at,
                topology_generation: r.topology_generation,
            })
        })
    }

    fn release<'a>(
        &'a self,
        kind: LeaseKind,
        operation_id: &'a str,
        token: &'a str,
    ) -> Fut<'a, ()> {
        Box::pin(async move {
            let (status, v) = self
                .send(|b| {
                    let url = format!("{}/{}/{}", self.leases_url(b), kind.as_str(), operation_id);
                    self.http.delete(url).header("x-lease-token", token)
                })
                .await?;
            if status != 204 {
                return Err(error_of(status, &v));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_success_answer_missing_a_field_is_unexpected_not_defaulted() {
        // A grant answer without its generation must not become generation 0.
        let partial = json!({"kind":"migration","operationId":"a","token":"t","expiresAt":"2026-11-30T10:00:30Z"});
        let got = answer::<GrantAnswer>(201, partial, "grant");
        assert!(
            matches!(&got, Err(ApiError::Unexpected { status: 201, detail }) if detail.contains("topologyGeneration")),
            "{got:?}"
        );
    }

    #[test]
    fn answers_map_to_their_errors() {
        let held = json!({"error":"held","message":"m","holder":{"operationId":"a","instance":"db","expiresAt":"2026-11-30T10:00:30Z"}});
        assert!(
            matches!(error_of(409, &held), ApiError::Held { holder } if holder.operation_id == "a")
        );
        assert_eq!(
            error_of(
                409,
                &json!({"error":"revoked","reason":"TopologyChanged","topologyGeneration":18})
            ),
            ApiError::Revoked {
                reason: "TopologyChanged".into(),
                topology_generation: 18
            }
        );
        assert_eq!(
            error_of(
                423,
                &json!({"error":"unstable","reason":"TopologyChangePending","retryAfterSeconds":2})
            ),
            ApiError::Unstable {
                reason: "TopologyChangePending".into(),
                retry_after_seconds: 2
            }
        );
        assert_eq!(error_of(404, &json!({})), ApiError::NotFound);
        assert_eq!(
            error_of(403, &json!({"error":"token_mismatch"})),
            ApiError::TokenMismatch
        );
        assert!(matches!(
            error_of(403, &json!({"error":"forbidden"})),
            ApiError::Forbidden { .. }
        ));
        assert_eq!(
            error_of(503, &json!({"error":"not_leader"})),
            ApiError::NotLeader
        );
        assert!(matches!(
            error_of(413, &json!({})),
            ApiError::Invalid { .. }
        ));
        assert!(matches!(
            error_of(500, &json!({})),
            ApiError::Unexpected { .. }
        ));
    }

    #[test]
    fn a_granted_token_never_prints() {
        let g = Granted {
            token: "secret-token-value".into(),
            expires_at: Timestamp::EPOCH,
            topology_generation: 1,
            regranted: false,
        };
        assert!(!format!("{g:?}").contains("secret-token-value"));
    }
}
