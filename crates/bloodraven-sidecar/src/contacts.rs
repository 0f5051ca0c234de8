//! The gather step's outside world: the operators' `/readyz` and `/active-site`, every peer's
//! `/peer/ping` and `/peer/active-site`.
//!
//! **The operator answered** (what suppresses rule #2 with the peers) means: an operator
//! answered `/readyz` saying it leads now. With several operators (the etcd platform) each is
//! asked, and a follower's answer never counts: a follower does nothing, so its being reachable
//! proves nothing about the group, and a follower cut off from etcd must not keep a primary
//! writable. A leader leads only while its term is confirmed (its last renewal still covers
//! it), so an old leader that may have been replaced does not count either. The view is the
//! first `/active-site` a leader serves (followers answer `503 not_leader`).
//!
//! [`Contacts`] is the boundary the monitor and the safety net talk to; [`HttpContacts`] is the
//! real one (reqwest, short per-request timeouts, bounded bodies, connections reused), and the
//! monitor's tests use in-memory fakes. Every request carries `namespace` and `group`, so a
//! sidecar or operator serving another group answers `404` instead of lending its view.
//! This module decides nothing: answers are reported as they came.

use std::future::Future;
use std::time::Duration;

use bloodraven_core::names::check_dns1123_label;
use bloodraven_core::wire::ActiveSite;
use reqwest::{StatusCode, Url};

use crate::config::limits;
use crate::identity::Identity;

/// Why a contact did not give a usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContactError {
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error("request failed: {0}")]
    Request(String),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("answered HTTP {0} and does not lead")]
    NotLeader(u16),
    #[error("answered a body that is not an active-site view: {0}")]
    BadBody(String),
}

/// The parties a sidecar probes each tick. Peers are numbered `0..peer_count()`.
pub trait Contacts: Send + Sync + 'static {
    fn peer_count(&self) -> usize;
    /// A peer's name for logs and `/status` (its base URL).
    fn peer_name(&self, peer: usize) -> String;
    /// `GET /readyz` on the operators: `Ok` when one says it leads.
    fn operator_healthz(&self) -> impl Future<Output = Result<(), ContactError>> + Send;
    /// `GET /active-site` on the operator: the authoritative view.
    fn operator_active_site(&self)
    -> impl Future<Output = Result<ActiveSite, ContactError>> + Send;
    /// `GET /peer/ping` on a peer: `Ok` on `200`.
    fn peer_ping(&self, peer: usize) -> impl Future<Output = Result<(), ContactError>> + Send;
    /// `GET /peer/active-site` on a peer: its cached view, `None` when it has none (`204`).
    fn peer_active_site(
        &self,
        peer: usize,
    ) -> impl Future<Output = Result<Option<ActiveSite>, ContactError>> + Send;
    /// `GET /active-site?after=N` on the operator: waits until it serves a view newer than
    /// generation `after` and returns it, or `None` when it answered `204` (nothing newer
    /// within its wait). The default has no watch: it never answers.
    fn operator_view_after(
        &self,
        after: u64,
    ) -> impl Future<Output = Result<Option<ActiveSite>, ContactError>> + Send {
        let _ = after;
        std::future::pending()
    }
}

/// How long a watch request may wait for the operator's answer: past the operator's own wait
/// (30 s, then `204`).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(40);

/// The real contacts, over HTTP.
#[derive(Debug, Clone)]
pub struct HttpContacts {
    client: reqwest::Client,
    /// For the long-polled watch: its requests outlive `timeout` by design.
    watch_client: reqwest::Client,
    timeout: Duration,
    operators: Vec<OperatorUrls>,
    /// The operator that last answered as the leader (asked first next time).
    leader: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    peers: Vec<PeerUrls>,
}

#[derive(Debug, Clone)]
struct OperatorUrls {
    readyz: Url,
    active_site: Url,
}

#[derive(Debug, Clone)]
struct PeerUrls {
    base: String,
    ping: Url,
    active_site: Url,
}

/// `base` + `path` with the group's `namespace` and `group` as query parameters.
fn endpoint(base: &str, path: &str, id: Option<&Identity>) -> Result<Url, ContactError> {
    let mut url = Url::parse(&format!("{}{path}", base.trim_end_matches('/')))
        .map_err(|e| ContactError::Request(format!("bad URL {base}{path}: {e}")))?;
    if let Some(id) = id {
        // `from`: who asks, so the answering party can say when it last answered this site
        // (strict fencing's facts, docs/failover.md).
        url.query_pairs_mut()
            .append_pair("namespace", &id.namespace)
            .append_pair("group", &id.group)
            .append_pair("from", &id.site);
    }
    Ok(url)
}

impl HttpContacts {
    /// Contacts for `identity`'s group: the operators at `operators`, peers at `peers` (base
    /// URLs). Every request is bounded by `timeout`.
    pub fn new(
        identity: &Identity,
        operators: &[String],
        peers: &[String],
        timeout: Duration,
    ) -> Result<Self, ContactError> {
        bloodraven_runtime::tls::install_crypto_provider();
        let build = |request_timeout: Duration, idle: usize| {
            reqwest::Client::builder()
                .timeout(request_timeout)
                .connect_timeout(timeout)
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .pool_max_idle_per_host(idle)
                .build()
                .map_err(|e| ContactError::Request(format!("cannot build the HTTP client: {e}")))
        };
        let client = build(timeout, 2)?;
        let watch_client = build(WATCH_TIMEOUT, 1)?;
        let peers = peers
            .iter()
            .map(|p| {
                Ok(PeerUrls {
                    base: p.clone(),
                    ping: endpoint(p, "/peer/ping", Some(identity))?,
                    active_site: endpoint(p, "/peer/active-site", Some(identity))?,
                })
            })
            .collect::<Result<_, ContactError>>()?;
        Ok(HttpContacts {
            client,
            watch_client,
            timeout,
            operators: operators
                .iter()
                .map(|o| {
                    Ok(OperatorUrls {
                        readyz: endpoint(o, "/readyz", Some(identity))?,
                        active_site: endpoint(o, "/active-site", Some(identity))?,
                    })
                })
                .collect::<Result<_, ContactError>>()?,
            leader: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            peers,
        })
    }

    async fn get(&self, url: &Url) -> Result<(StatusCode, Vec<u8>), ContactError> {
        self.get_with(&self.client, self.timeout, url).await
    }

    async fn get_with(
        &self,
        client: &reqwest::Client,
        timeout: Duration,
        url: &Url,
    ) -> Result<(StatusCode, Vec<u8>), ContactError> {
        let request_error = |e: reqwest::Error| {
            if e.is_timeout() {
                ContactError::TimedOut(timeout)
            } else {
                ContactError::Request(e.to_string())
            }
        };
        let mut resp = client
            .get(url.clone())
            .send()
            .await
            .map_err(request_error)?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(request_error)? {
            if body.len() + chunk.len() > limits::MAX_BODY_BYTES {
                return Err(ContactError::BadBody(format!(
                    "larger than {} bytes",
                    limits::MAX_BODY_BYTES
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    /// The operators, the last leader first.
    fn operators_leader_first(&self) -> impl Iterator<Item = (usize, &OperatorUrls)> {
        let first = self.leader.load(std::sync::atomic::Ordering::Relaxed);
        let n = self.operators.len();
        (0..n).map(move |k| {
            let i = (first + k) % n.max(1);
            (i, &self.operators[i])
        })
    }

    fn peer(&self, peer: usize) -> Result<&PeerUrls, ContactError> {
        self.peers
            .get(peer)
            .ok_or_else(|| ContactError::Request(format!("no peer with index {peer}")))
    }
}

/// Whether a `/readyz` body says the operator leads.
fn leads(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["leader"] == true)
}

/// Parses and checks an active-site body: the site is empty or a DNS-1123 label.
pub fn parse_view(body: &[u8]) -> Result<ActiveSite, ContactError> {
    let v: ActiveSite =
        serde_json::from_slice(body).map_err(|e| ContactError::BadBody(e.to_string()))?;
    if !v.active_site.is_empty()
        && let Err(rule) = check_dns1123_label(&v.active_site)
    {
        return Err(ContactError::BadBody(format!("activeSite {rule}")));
    }
    Ok(v)
}

impl Contacts for HttpContacts {
    fn peer_count(&self) -> usize {
        self.peers.len()
    }

    fn peer_name(&self, peer: usize) -> String {
        self.peers
            .get(peer)
            .map_or_else(|| format!("peer {peer}"), |p| p.base.clone())
    }

    async fn operator_healthz(&self) -> Result<(), ContactError> {
        // Every operator at once: a follower's answer is not the leader's, and waiting for
        // each in turn would spend the tick's bound on the ones that do not lead.
        let answers = futures::future::join_all(
            self.operators_leader_first()
                .map(|(i, o)| async move { (i, self.get(&o.readyz).await) }),
        )
        .await;
        let mut last = ContactError::Request("no operator configured".into());
        for (i, a) in answers {
            match a {
                Ok((_, body)) if leads(&body) => {
                    self.leader.store(i, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
                Ok((s, _)) => last = ContactError::NotLeader(s.as_u16()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn operator_active_site(&self) -> Result<ActiveSite, ContactError> {
        let mut last = ContactError::Request("no operator configured".into());
        for (i, o) in self.operators_leader_first() {
            match self.get(&o.active_site).await {
                Ok((StatusCode::OK, body)) => {
                    self.leader.store(i, std::sync::atomic::Ordering::Relaxed);
                    return parse_view(&body);
                }
                Ok((s, _)) => last = ContactError::Status(s.as_u16()),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn peer_ping(&self, peer: usize) -> Result<(), ContactError> {
        let url = &self.peer(peer)?.ping;
        match self.get(url).await? {
            (StatusCode::OK, _) => Ok(()),
            (s, _) => Err(ContactError::Status(s.as_u16())),
        }
    }

    async fn operator_view_after(&self, after: u64) -> Result<Option<ActiveSite>, ContactError> {
        // The operator that last answered as the leader (a follower answers 503 at once, and
        // the watch asks again after a peer-check interval, by then of the new leader).
        let Some((_, o)) = self.operators_leader_first().next() else {
            return Err(ContactError::Request("no operator configured".into()));
        };
        let mut url = o.active_site.clone();
        url.query_pairs_mut()
            .append_pair("after", &after.to_string());
        match self
            .get_with(&self.watch_client, WATCH_TIMEOUT, &url)
            .await?
        {
            (StatusCode::OK, body) => parse_view(&body).map(Some),
            (StatusCode::NO_CONTENT, _) => Ok(None),
            (s, _) => Err(ContactError::Status(s.as_u16())),
        }
    }

    async fn peer_active_site(&self, peer: usize) -> Result<Option<ActiveSite>, ContactError> {
        let url = &self.peer(peer)?.active_site;
        match self.get(url).await? {
            (StatusCode::OK, body) => parse_view(&body).map(Some),
            (StatusCode::NO_CONTENT, _) => Ok(None),
            (s, _) => Err(ContactError::Status(s.as_u16())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            site: "iad".into(),
            group: "playground".into(),
            namespace: "default".into(),
        }
    }

    #[test]
    fn urls_carry_the_group() {
        let c = HttpContacts::new(
            &id(),
            &["http://op:8082".into(), "http://op-2:8082".into()],
            &["http://10.0.0.2:8080/pdx".into()],
            Duration::from_secs(1),
        )
        .unwrap();
        // `from`: who asks (strict fencing's facts: whom each party answered).
        assert_eq!(
            c.operators[0].readyz.as_str(),
            "http://op:8082/readyz?namespace=default&group=playground&from=iad"
        );
        assert_eq!(
            c.operators[1].active_site.as_str(),
            "http://op-2:8082/active-site?namespace=default&group=playground&from=iad"
        );
        assert_eq!(
            c.peers[0].ping.as_str(),
            "http://10.0.0.2:8080/pdx/peer/ping?namespace=default&group=playground&from=iad"
        );
        assert_eq!(c.peer_name(0), "http://10.0.0.2:8080/pdx");
        assert_eq!(c.peer_count(), 1);
    }

    /// An operator on loopback that says whether it leads; a leader serves `view`.
    async fn operator(leads: bool, view: &'static str) -> String {
        use axum::routing::get;
        let app = axum::Router::new()
            .route(
                "/readyz",
                get(move || async move {
                    axum::Json(serde_json::json!({"ready": true, "leader": leads, "loaded": leads}))
                }),
            )
            .route(
                "/active-site",
                get(move || async move {
                    if leads {
                        (axum::http::StatusCode::OK, view)
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            r#"{"error":"not_leader"}"#,
                        )
                    }
                }),
            );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn only_an_operator_that_leads_counts_and_serves_the_view() {
        let view =
            r#"{"activeSite":"pdx","topologyGeneration":4,"observedAt":"2026-11-30T10:00:30Z"}"#;
        let follower = operator(false, view).await;
        let leader = operator(true, view).await;
        let both = HttpContacts::new(
            &id(),
            &[follower.clone(), leader],
            &[],
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(both.operator_healthz().await, Ok(()));
        assert_eq!(
            both.operator_active_site().await.unwrap().active_site,
            "pdx"
        );
        assert_eq!(
            both.leader.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "the leader is asked first next time"
        );
        // A follower alone is not the operator: its answer suppresses nothing.
        let alone = HttpContacts::new(&id(), &[follower], &[], Duration::from_secs(1)).unwrap();
        assert_eq!(
            alone.operator_healthz().await,
            Err(ContactError::NotLeader(200))
        );
        assert_eq!(
            alone.operator_active_site().await,
            Err(ContactError::Status(503))
        );
        assert!(
            !leads(b"<html>") && !leads(br#"{"leader":"true"}"#) && leads(br#"{"leader":true}"#)
        );
    }

    #[test]
    fn views_are_checked() {
        let ok =
            br#"{"activeSite":"iad","topologyGeneration":17,"observedAt":"2026-11-30T10:00:30Z"}"#;
        assert_eq!(parse_view(ok).unwrap().active_site, "iad");
        let none =
            br#"{"activeSite":"","topologyGeneration":0,"observedAt":"2026-11-30T10:00:30Z"}"#;
        assert_eq!(parse_view(none).unwrap().active_site, "");
        for bad in [
            &br#"{"activeSite":"Not A Site","topologyGeneration":1,"observedAt":"2026-11-30T10:00:30Z"}"#[..],
            br#"{"activeSite":"iad","topologyGeneration":1,"observedAt":"yesterday"}"#,
            br#"{"activeSite":"iad"}"#,
            b"<html>",
        ] {
            assert!(
                matches!(parse_view(bad), Err(ContactError::BadBody(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
