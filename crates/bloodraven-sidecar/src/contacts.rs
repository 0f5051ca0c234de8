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
//! real one ([`crate::http1`]: short per-request timeouts, bounded bodies, one kept-alive
//! connection per party, a party's two questions of a tick sent in one write), and the
//! monitor's tests use in-memory fakes. Every request carries `namespace` and `group`, so a
//! sidecar or operator serving another group answers `404` instead of lending its view.
//! This module decides nothing: answers are reported as they came.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::names::check_dns1123_label;
use bloodraven_core::wire::ActiveSite;
use url::{Position, Url};

use crate::config::limits;
use crate::http1::{Answer, Client, HttpError, Request};
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
    /// A tick's questions to the operators: [`Contacts::operator_healthz`] into
    /// `round`'s first answer and [`Contacts::operator_active_site`] into its second, each
    /// recorded the moment it is known. The default asks them apart; the real contacts ask
    /// the operator that led last both in one write. A round is bounded by its caller (the
    /// tick's one deadline), which keeps whatever it recorded before then.
    fn operator_round<'a>(
        &'a self,
        round: &'a Round<(), ActiveSite>,
    ) -> impl Future<Output = ()> + Send + 'a {
        async move {
            futures::join!(
                async { round.first(self.operator_healthz().await) },
                async { round.second(self.operator_active_site().await) },
            );
        }
    }
    /// A tick's questions to one peer: [`Contacts::peer_ping`] into `round`'s first answer
    /// and [`Contacts::peer_active_site`] into its second, as
    /// [`Contacts::operator_round`] does for the operators.
    fn peer_round<'a>(
        &'a self,
        peer: usize,
        round: &'a Round<(), Option<ActiveSite>>,
    ) -> impl Future<Output = ()> + Send + 'a {
        async move {
            futures::join!(async { round.first(self.peer_ping(peer).await) }, async {
                round.second(self.peer_active_site(peer).await);
            },);
        }
    }
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

/// A party's two answers of a tick, each kept the moment it is known: a round its caller cuts
/// short still counts the answer it had (a peer that answered `/peer/ping` and hangs on
/// `/peer/active-site` has answered).
#[derive(Debug)]
pub struct Round<A, B> {
    first: Mutex<Option<Result<A, ContactError>>>,
    second: Mutex<Option<Result<B, ContactError>>>,
}

impl<A, B> Default for Round<A, B> {
    fn default() -> Self {
        Round {
            first: Mutex::new(None),
            second: Mutex::new(None),
        }
    }
}

impl<A, B> Round<A, B> {
    /// Records the first answer (the first one recorded stays).
    pub fn first(&self, answer: Result<A, ContactError>) {
        lock(&self.first).get_or_insert(answer);
    }

    /// Records the second answer (the first one recorded stays).
    pub fn second(&self, answer: Result<B, ContactError>) {
        lock(&self.second).get_or_insert(answer);
    }

    fn has_first(&self) -> bool {
        lock(&self.first).is_some()
    }

    fn has_second(&self) -> bool {
        lock(&self.second).is_some()
    }

    /// Both answers; one never recorded timed out after `limit`.
    pub fn into_answers(
        self,
        limit: Duration,
    ) -> (Result<A, ContactError>, Result<B, ContactError>) {
        (
            into_inner(self.first).unwrap_or(Err(ContactError::TimedOut(limit))),
            into_inner(self.second).unwrap_or(Err(ContactError::TimedOut(limit))),
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn into_inner<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// How long a watch request may wait for the operator's answer: past the operator's own wait
/// (30 s, then `204`).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(40);

/// The real contacts, over HTTP ([`crate::http1`]: one kept-alive connection per party, a
/// party's two questions of a tick in one write).
#[derive(Debug)]
pub struct HttpContacts {
    timeout: Duration,
    operators: Vec<OperatorParty>,
    /// The operator that last answered as the leader (asked first next time).
    leader: AtomicUsize,
    peers: Vec<PeerParty>,
}

#[derive(Debug)]
struct OperatorParty {
    client: Client,
    /// For the long-polled watch: its requests outlive `timeout` by design, so they have a
    /// connection of their own.
    watch: Client,
    readyz: Request,
    active_site: Request,
    /// `/active-site?…` as a path and query, for the watch's `after=`.
    active_site_path: String,
}

#[derive(Debug)]
struct PeerParty {
    base: String,
    client: Client,
    ping: Request,
    active_site: Request,
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

/// The path and query of `url`, as a request line names them.
fn path_and_query(url: &Url) -> &str {
    &url[Position::BeforePath..]
}

impl From<HttpError> for ContactError {
    fn from(e: HttpError) -> Self {
        match e {
            HttpError::TimedOut(d) => ContactError::TimedOut(d),
            HttpError::TooLarge { limit, .. } => {
                ContactError::BadBody(format!("larger than {limit} bytes"))
            }
            other => ContactError::Request(other.to_string()),
        }
    }
}

/// The TLS configuration for `https://` parties: the platform's trust roots (built only when
/// a party speaks TLS: loading them is most of a plain sidecar's start-up work).
fn platform_tls() -> Result<Arc<rustls::ClientConfig>, ContactError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    bloodraven_runtime::tls::install_crypto_provider();
    let config = rustls::ClientConfig::builder()
        .with_platform_verifier()
        .map_err(|e| ContactError::Request(format!("cannot load the TLS trust roots: {e}")))?
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl HttpContacts {
    /// Contacts for `identity`'s group: the operators at `operators`, peers at `peers` (base
    /// URLs). Every request is bounded by `timeout`; `https://` parties are checked against
    /// the platform's trust roots.
    pub fn new(
        identity: &Identity,
        operators: &[String],
        peers: &[String],
        timeout: Duration,
    ) -> Result<Self, ContactError> {
        let any_tls = operators.iter().chain(peers).any(|u| {
            u.get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        });
        let tls = if any_tls { Some(platform_tls()?) } else { None };
        Self::with_tls(identity, operators, peers, timeout, tls.as_ref())
    }

    /// Like [`HttpContacts::new`], with `tls` for `https://` parties (e.g. one that trusts a
    /// private CA).
    pub fn with_tls(
        identity: &Identity,
        operators: &[String],
        peers: &[String],
        timeout: Duration,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Self, ContactError> {
        // A party's client and its two questions of a tick, rendered once.
        let party = |base: &str, paths: [&str; 2]| -> Result<(Client, [Url; 2]), ContactError> {
            let [first, second] = paths.map(|path| endpoint(base, path, Some(identity)));
            let urls = [first?, second?];
            let client = Client::new(&urls[0], tls.cloned(), timeout, limits::MAX_BODY_BYTES)?;
            Ok((client, urls))
        };
        let peers = peers
            .iter()
            .map(|p| {
                let (client, [ping, active_site]) = party(p, ["/peer/ping", "/peer/active-site"])?;
                Ok(PeerParty {
                    base: p.clone(),
                    ping: client.request(path_and_query(&ping)),
                    active_site: client.request(path_and_query(&active_site)),
                    client,
                })
            })
            .collect::<Result<_, ContactError>>()?;
        let operators = operators
            .iter()
            .map(|o| {
                let (client, [readyz, active_site]) = party(o, ["/readyz", "/active-site"])?;
                Ok(OperatorParty {
                    readyz: client.request(path_and_query(&readyz)),
                    active_site: client.request(path_and_query(&active_site)),
                    active_site_path: path_and_query(&active_site).to_string(),
                    watch: Client::new(&readyz, tls.cloned(), timeout, limits::MAX_BODY_BYTES)?,
                    client,
                })
            })
            .collect::<Result<_, ContactError>>()?;
        Ok(HttpContacts {
            timeout,
            operators,
            leader: AtomicUsize::new(0),
            peers,
        })
    }

    /// The operators, the last leader first.
    fn operators_leader_first(&self) -> impl Iterator<Item = (usize, &OperatorParty)> {
        let first = self.leader.load(Ordering::Relaxed);
        let n = self.operators.len();
        (0..n).map(move |k| {
            let i = (first + k) % n.max(1);
            (i, &self.operators[i])
        })
    }

    fn peer(&self, peer: usize) -> Result<&PeerParty, ContactError> {
        self.peers
            .get(peer)
            .ok_or_else(|| ContactError::Request(format!("no peer with index {peer}")))
    }

    /// Whether one of the operators' `/readyz` answers (leader first) says it leads; the
    /// one that does is asked first next time.
    fn leading(
        &self,
        answers: impl IntoIterator<Item = (usize, Result<Answer, HttpError>)>,
    ) -> Result<(), ContactError> {
        let mut last = ContactError::Request("no operator configured".into());
        for (i, a) in answers {
            match a {
                Ok(a) if leads(&a.body) => {
                    self.leader.store(i, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(a) => last = ContactError::NotLeader(a.status),
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }

    /// The view in operator `i`'s `/active-site` answer, when it serves one (`200`).
    fn served_view(
        &self,
        i: usize,
        answer: Result<Answer, HttpError>,
    ) -> Result<ActiveSite, ContactError> {
        match answer {
            Ok(a) if a.status == 200 => {
                self.leader.store(i, Ordering::Relaxed);
                parse_view(&a.body)
            }
            Ok(a) => Err(ContactError::Status(a.status)),
            Err(e) => Err(e.into()),
        }
    }

    /// `/active-site` of each operator in turn (leader first, skipping `skip`), until one
    /// serves a view.
    async fn view_in_turn(
        &self,
        skip: Option<usize>,
        mut last: ContactError,
    ) -> Result<ActiveSite, ContactError> {
        for (i, o) in self.operators_leader_first() {
            if Some(i) == skip {
                continue;
            }
            match self.served_view(i, o.client.get(&o.active_site, self.timeout).await) {
                Ok(v) => return Ok(v),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Whether a `/readyz` body says the operator leads (`"leader": true`, a JSON boolean).
fn leads(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Readyz {
        #[serde(default)]
        leader: bool,
    }
    serde_json::from_slice::<Readyz>(body).is_ok_and(|r| r.leader)
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

/// A peer's `/peer/ping` answer.
fn pinged(answer: Result<Answer, HttpError>) -> Result<(), ContactError> {
    match answer? {
        a if a.status == 200 => Ok(()),
        a => Err(ContactError::Status(a.status)),
    }
}

/// A peer's `/peer/active-site` answer (or the watch's): a view, or none on `204`.
fn relayed_view(answer: Result<Answer, HttpError>) -> Result<Option<ActiveSite>, ContactError> {
    match answer? {
        a if a.status == 200 => parse_view(&a.body).map(Some),
        a if a.status == 204 => Ok(None),
        a => Err(ContactError::Status(a.status)),
    }
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
                .map(|(i, o)| async move { (i, o.client.get(&o.readyz, self.timeout).await) }),
        )
        .await;
        self.leading(answers)
    }

    async fn operator_active_site(&self) -> Result<ActiveSite, ContactError> {
        self.view_in_turn(None, ContactError::Request("no operator configured".into()))
            .await
    }

    async fn operator_round(&self, round: &Round<(), ActiveSite>) {
        // The operator that led last is asked both questions in one write; the others only
        // whether they lead, all at once. The first that says it leads answers for the
        // operator at once. Only when the first does not serve a view are the others asked
        // for one, in turn (a follower answers `503` at once).
        let first = self.operators_leader_first().next().map(|(i, _)| i);
        let refusals: Vec<Mutex<Option<ContactError>>> =
            self.operators.iter().map(|_| Mutex::new(None)).collect();
        let view_refused = Mutex::new(None);
        futures::future::join_all(self.operators_leader_first().map(|(i, o)| {
            let (refusals, view_refused) = (&refusals, &view_refused);
            async move {
                let asked: &[&Request] = if Some(i) == first {
                    &[&o.readyz, &o.active_site]
                } else {
                    &[&o.readyz]
                };
                o.client
                    .ask_each(asked, |k, answer| {
                        if k == 0 {
                            match self.leading([(i, answer)]) {
                                Ok(()) => round.first(Ok(())),
                                Err(e) => *lock(&refusals[i]) = Some(e),
                            }
                        } else {
                            match self.served_view(i, answer) {
                                Ok(v) => round.second(Ok(v)),
                                Err(e) => *lock(view_refused) = Some(e),
                            }
                        }
                    })
                    .await;
            }
        }))
        .await;
        if !round.has_first() {
            // Nobody leads: say why, as the leader-first order last saw it.
            let why = self
                .operators_leader_first()
                .filter_map(|(i, _)| lock(&refusals[i]).take())
                .last()
                .unwrap_or_else(|| ContactError::Request("no operator configured".into()));
            round.first(Err(why));
        }
        if !round.has_second() {
            let refused = into_inner(view_refused)
                .unwrap_or_else(|| ContactError::Request("no operator configured".into()));
            round.second(if self.operators.len() > 1 {
                self.view_in_turn(first, refused).await
            } else {
                Err(refused)
            });
        }
    }

    async fn peer_ping(&self, peer: usize) -> Result<(), ContactError> {
        let p = self.peer(peer)?;
        pinged(p.client.get(&p.ping, self.timeout).await)
    }

    async fn peer_active_site(&self, peer: usize) -> Result<Option<ActiveSite>, ContactError> {
        let p = self.peer(peer)?;
        relayed_view(p.client.get(&p.active_site, self.timeout).await)
    }

    async fn peer_round(&self, peer: usize, round: &Round<(), Option<ActiveSite>>) {
        let p = match self.peer(peer) {
            Ok(p) => p,
            Err(e) => {
                round.first(Err(e.clone()));
                return round.second(Err(e));
            }
        };
        p.client
            .ask_each(&[&p.ping, &p.active_site], |k, answer| {
                if k == 0 {
                    round.first(pinged(answer));
                } else {
                    round.second(relayed_view(answer));
                }
            })
            .await;
    }

    async fn operator_view_after(&self, after: u64) -> Result<Option<ActiveSite>, ContactError> {
        // The operator that last answered as the leader (a follower answers 503 at once, and
        // the watch asks again after a peer-check interval, by then of the new leader).
        let Some((_, o)) = self.operators_leader_first().next() else {
            return Err(ContactError::Request("no operator configured".into()));
        };
        let request = o
            .watch
            .request(&format!("{}&after={after}", o.active_site_path));
        relayed_view(o.watch.get(&request, WATCH_TIMEOUT).await)
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
        assert_eq!(c.operators[0].client.party(), "op:8082");
        assert_eq!(
            c.operators[0].readyz.target(),
            "/readyz?namespace=default&group=playground&from=iad"
        );
        assert_eq!(c.operators[1].client.party(), "op-2:8082");
        assert_eq!(
            c.operators[1].active_site.target(),
            "/active-site?namespace=default&group=playground&from=iad"
        );
        assert_eq!(c.peers[0].client.party(), "10.0.0.2:8080");
        assert_eq!(
            c.peers[0].ping.target(),
            "/pdx/peer/ping?namespace=default&group=playground&from=iad"
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
        crate::testing::serve(app).await
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
        // The same in one round: the follower is asked first (it led last), so the view comes
        // from the leader after the follower's 503, and the leader is asked first next time.
        both.leader.store(0, Ordering::Relaxed);
        let round = Round::default();
        both.operator_round(&round).await;
        let (healthz, view) = round.into_answers(Duration::from_secs(1));
        assert_eq!(healthz, Ok(()));
        assert_eq!(view.unwrap().active_site, "pdx");
        assert_eq!(both.leader.load(Ordering::Relaxed), 1);
        // A follower alone is not the operator: its answer suppresses nothing.
        let alone = HttpContacts::new(&id(), &[follower], &[], Duration::from_secs(1)).unwrap();
        let round = Round::default();
        alone.operator_round(&round).await;
        assert_eq!(
            round.into_answers(Duration::from_secs(1)),
            (
                Err(ContactError::NotLeader(200)),
                Err(ContactError::Status(503))
            )
        );
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

    #[tokio::test]
    async fn a_peer_round_cut_short_keeps_the_ping_it_was_answered() {
        use axum::routing::get;
        let app = axum::Router::new()
            .route("/peer/ping", get(|| async { "pong" }))
            .route(
                "/peer/active-site",
                get(std::future::pending::<&'static str>),
            );
        let peer = crate::testing::serve(app).await;
        let c = HttpContacts::new(&id(), &[], &[peer], Duration::from_secs(5)).unwrap();
        let round = Round::default();
        let limit = Duration::from_millis(300);
        assert!(
            tokio::time::timeout(limit, c.peer_round(0, &round))
                .await
                .is_err()
        );
        assert_eq!(
            round.into_answers(limit),
            (Ok(()), Err(ContactError::TimedOut(limit)))
        );
        // A peer that is not configured answers nothing, at once.
        let round = Round::default();
        c.peer_round(7, &round).await;
        assert!(matches!(
            round.into_answers(limit),
            (Err(ContactError::Request(_)), Err(ContactError::Request(_)))
        ));
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
