//! The gather step's outside world: the operators' `/readyz` and `/active-site`, every peer's
//! `/peer/ping` and `/peer/active-site`.
//!
//! **Every party is a component, over mutual TLS.** A sidecar calls the operator's component
//! listener and its peers only over `https://`, presenting its own certificate and accepting
//! only a party that proves, by a certificate of the component CA, to be the operator of its
//! group or a site of its group ([`bloodraven_runtime::mtls`]). An answer from anything else
//! (a proxy, a stranger on the address, a plain-HTTP listener) is a failed contact, so it never
//! suppresses rule #2.
//!
//! **The operator answered** (what suppresses rule #2 with the peers) means: an operator
//! answered `/readyz` saying it leads now. With several operators (the etcd platform) each is
//! asked, and a follower's answer never counts: a follower does nothing, so its being reachable
//! proves nothing about the group, and a follower cut off from etcd must not keep a primary
//! writable. A leader leads only while its term is confirmed (its last renewal still covers
//! it), so an old leader that may have been replaced does not count either. The view is the
//! first `/active-site` a leader serves (followers answer `503 not_leader`).
//!
//! **The receipt.** Every call carries this sidecar's [`Claim`]: the `topologyGeneration` of
//! the view it holds (`held`) and its server's `read_only` as it read it while holding that
//! view (`readOnly`). The party records it under the caller's verified identity; that is the
//! proof strict fencing takes (docs/failover.md): the old primary's own sidecar said it holds
//! the new view, not that somebody served it one.
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

use bloodraven_core::identity::Expected;
use bloodraven_runtime::mtls::ComponentTls;

use crate::config::limits;
use crate::http1::{Answer, Client, HttpError, Request, TlsSource};
use crate::identity::Identity;

/// What this sidecar says of itself with every call: the view it holds and its server's
/// `read_only` read while holding it (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// The `topologyGeneration` of the cached view (`None`: it holds none).
    pub held: Option<u64>,
    /// Its server's `read_only`, read while holding that view (`None`: unreadable).
    pub read_only: Option<bool>,
}

impl Claim {
    /// The query parameters that carry it (each starting with `&`).
    pub fn query(&self) -> String {
        use std::fmt::Write as _;
        let mut q = String::new();
        if let Some(g) = self.held {
            // Writing into a String cannot fail.
            let _ = write!(q, "&held={g}");
            if let Some(ro) = self.read_only {
                let _ = write!(q, "&readOnly={ro}");
            }
        }
        q
    }
}

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
    /// Sets what the next calls say of this sidecar ([`Claim`]). The default keeps nothing.
    fn claim(&self, claim: Claim) {
        let _ = claim;
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
    /// What the calls say of this sidecar now.
    claim: Mutex<Claim>,
}

/// A party's two questions of a tick, rendered again only when the claim they carry changes.
#[derive(Debug)]
struct Questions {
    /// Each question's path and query, without the claim.
    paths: [String; 2],
    rendered: Mutex<Option<(Claim, Arc<[Request; 2]>)>>,
}

impl Questions {
    fn new(urls: &[Url; 2]) -> Self {
        Questions {
            paths: [
                path_and_query(&urls[0]).to_string(),
                path_and_query(&urls[1]).to_string(),
            ],
            rendered: Mutex::new(None),
        }
    }

    fn get(&self, client: &Client, claim: Claim) -> Arc<[Request; 2]> {
        let mut r = lock(&self.rendered);
        if let Some((c, q)) = r.as_ref()
            && *c == claim
        {
            return q.clone();
        }
        let suffix = claim.query();
        let q = Arc::new([
            client.request(&format!("{}{suffix}", self.paths[0])),
            client.request(&format!("{}{suffix}", self.paths[1])),
        ]);
        *r = Some((claim, q.clone()));
        q
    }
}

#[derive(Debug)]
struct OperatorParty {
    client: Client,
    /// For the long-polled watch: its requests outlive `timeout` by design, so they have a
    /// connection of their own.
    watch: Client,
    /// `/readyz?…` and `/active-site?…`.
    questions: Questions,
}

#[derive(Debug)]
struct PeerParty {
    base: String,
    client: Client,
    /// `/peer/ping?…` and `/peer/active-site?…`.
    questions: Questions,
}

/// `base` + `path` with the group's `namespace` and `group` as query parameters.
fn endpoint(base: &str, path: &str, id: &Identity) -> Result<Url, ContactError> {
    let mut url = Url::parse(&format!("{}{path}", base.trim_end_matches('/')))
        .map_err(|e| ContactError::Request(format!("bad URL {base}{path}: {e}")))?;
    url.query_pairs_mut()
        .append_pair("namespace", &id.namespace)
        .append_pair("group", &id.group);
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

impl HttpContacts {
    /// Contacts for `identity`'s group: the operators at `operators`, peers at `peers` (base
    /// URLs, every one `https://`), called over mutual TLS with `tls`: an operator must prove
    /// to be the group's operator, a peer a site of the group. Every request is bounded by
    /// `timeout`.
    pub fn new(
        identity: &Identity,
        operators: &[String],
        peers: &[String],
        timeout: Duration,
        tls: &Arc<ComponentTls>,
    ) -> Result<Self, ContactError> {
        let expect_operator = tls.client(Expected::OperatorOf {
            namespace: identity.namespace.clone(),
            group: identity.group.clone(),
        });
        let expect_peer = tls.client(Expected::AnySiteOf {
            namespace: identity.namespace.clone(),
            group: identity.group.clone(),
        });
        // A party's client and its two questions of a tick.
        let party = |base: &str,
                     paths: [&str; 2],
                     source: &Arc<bloodraven_runtime::mtls::ClientTls>|
         -> Result<(Client, [Url; 2]), ContactError> {
            if !base
                .get(..8)
                .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
            {
                return Err(ContactError::Request(format!(
                    "{base}: every party is called over mutual TLS, so its URL must be https://"
                )));
            }
            let [first, second] = paths.map(|path| endpoint(base, path, identity));
            let urls = [first?, second?];
            let client = Client::new(
                &urls[0],
                Some(TlsSource::Component(source.clone())),
                timeout,
                limits::MAX_BODY_BYTES,
            )?;
            Ok((client, urls))
        };
        let peers = peers
            .iter()
            .map(|p| {
                let (client, urls) = party(p, ["/peer/ping", "/peer/active-site"], &expect_peer)?;
                Ok(PeerParty {
                    base: p.clone(),
                    questions: Questions::new(&urls),
                    client,
                })
            })
            .collect::<Result<_, ContactError>>()?;
        let operators = operators
            .iter()
            .map(|o| {
                let (client, urls) = party(o, ["/readyz", "/active-site"], &expect_operator)?;
                Ok(OperatorParty {
                    watch: Client::new(
                        &urls[0],
                        Some(TlsSource::Component(expect_operator.clone())),
                        timeout,
                        limits::MAX_BODY_BYTES,
                    )?,
                    questions: Questions::new(&urls),
                    client,
                })
            })
            .collect::<Result<_, ContactError>>()?;
        Ok(HttpContacts {
            timeout,
            operators,
            leader: AtomicUsize::new(0),
            peers,
            claim: Mutex::new(Claim::default()),
        })
    }

    fn current_claim(&self) -> Claim {
        *lock(&self.claim)
    }

    /// Operator `o`'s two questions, carrying the current claim.
    fn operator_questions(&self, o: &OperatorParty) -> Arc<[Request; 2]> {
        o.questions.get(&o.client, self.current_claim())
    }

    /// Peer `p`'s two questions, carrying the current claim.
    fn peer_questions(&self, p: &PeerParty) -> Arc<[Request; 2]> {
        p.questions.get(&p.client, self.current_claim())
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
            let q = self.operator_questions(o);
            match self.served_view(i, o.client.get(&q[1], self.timeout).await) {
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
        let answers = futures::future::join_all(self.operators_leader_first().map(|(i, o)| {
            let q = self.operator_questions(o);
            async move { (i, o.client.get(&q[0], self.timeout).await) }
        }))
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
            let q = self.operator_questions(o);
            async move {
                let asked: &[&Request] = if Some(i) == first {
                    &[&q[0], &q[1]]
                } else {
                    &[&q[0]]
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
        let q = self.peer_questions(p);
        pinged(p.client.get(&q[0], self.timeout).await)
    }

    async fn peer_active_site(&self, peer: usize) -> Result<Option<ActiveSite>, ContactError> {
        let p = self.peer(peer)?;
        let q = self.peer_questions(p);
        relayed_view(p.client.get(&q[1], self.timeout).await)
    }

    async fn peer_round(&self, peer: usize, round: &Round<(), Option<ActiveSite>>) {
        let p = match self.peer(peer) {
            Ok(p) => p,
            Err(e) => {
                round.first(Err(e.clone()));
                return round.second(Err(e));
            }
        };
        let q = self.peer_questions(p);
        p.client
            .ask_each(&[&q[0], &q[1]], |k, answer| {
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
            .request(&format!("{}&after={after}", o.questions.paths[1]));
        relayed_view(o.watch.get(&request, WATCH_TIMEOUT).await)
    }

    fn claim(&self, claim: Claim) {
        *lock(&self.claim) = claim;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn id() -> Identity {
        Identity {
            site: "iad".into(),
            group: "playground".into(),
            namespace: "default".into(),
        }
    }

    #[test]
    fn urls_carry_the_group_and_the_claim_never_a_name() {
        let (_dir, pki) = testing::pki();
        let tls = testing::tls(&pki, "iad");
        let c = HttpContacts::new(
            &id(),
            &["https://op:8444".into(), "https://op-2:8444".into()],
            &["https://10.0.0.2:8080/pdx".into()],
            Duration::from_secs(1),
            &tls,
        )
        .unwrap();
        assert_eq!(c.operators[0].client.party(), "op:8444");
        let q = c.operator_questions(&c.operators[0]);
        // Who asks is the certificate's business: no `from`.
        assert_eq!(q[0].target(), "/readyz?namespace=default&group=playground");
        assert_eq!(c.operators[1].client.party(), "op-2:8444");
        assert_eq!(
            c.operator_questions(&c.operators[1])[1].target(),
            "/active-site?namespace=default&group=playground"
        );
        assert_eq!(c.peers[0].client.party(), "10.0.0.2:8080");
        assert_eq!(
            c.peer_questions(&c.peers[0])[0].target(),
            "/pdx/peer/ping?namespace=default&group=playground"
        );
        // The claim rides on every question from the next tick on.
        c.claim(Claim {
            held: Some(4),
            read_only: Some(true),
        });
        assert_eq!(
            c.peer_questions(&c.peers[0])[1].target(),
            "/pdx/peer/active-site?namespace=default&group=playground&held=4&readOnly=true"
        );
        c.claim(Claim {
            held: Some(5),
            read_only: None,
        });
        assert_eq!(
            c.operator_questions(&c.operators[0])[0].target(),
            "/readyz?namespace=default&group=playground&held=5"
        );
        assert_eq!(c.peer_name(0), "https://10.0.0.2:8080/pdx");
        assert_eq!(c.peer_count(), 1);
        // A plain-HTTP party could be anybody: refused.
        let err = HttpContacts::new(
            &id(),
            &["http://op:8082".into()],
            &[],
            Duration::from_secs(1),
            &tls,
        )
        .unwrap_err();
        assert!(err.to_string().contains("https://"), "{err}");
    }

    /// An operator on loopback, over mutual TLS as `as_`, that says whether it leads; a
    /// leader serves `view`.
    async fn operator(
        pki: &bloodraven_runtime::mtls::local::GroupPki,
        as_: &str,
        leads: bool,
        view: &'static str,
    ) -> String {
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
        testing::serve(app, testing::tls(pki, as_)).await
    }

    const VIEW: &str =
        r#"{"activeSite":"pdx","topologyGeneration":4,"observedAt":"2026-11-30T10:00:30Z"}"#;

    #[tokio::test]
    async fn only_an_operator_that_leads_counts_and_serves_the_view() {
        let (_dir, pki) = testing::pki();
        let tls = testing::tls(&pki, "iad");
        let follower = operator(&pki, "operator", false, VIEW).await;
        let leader = operator(&pki, "operator", true, VIEW).await;
        let both = HttpContacts::new(
            &id(),
            &[follower.clone(), leader],
            &[],
            Duration::from_secs(1),
            &tls,
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
        let alone =
            HttpContacts::new(&id(), &[follower], &[], Duration::from_secs(1), &tls).unwrap();
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
    async fn a_party_that_cannot_prove_to_be_the_operator_is_not_the_operator() {
        let (_dir, pki) = testing::pki();
        let tls = testing::tls(&pki, "iad");
        // A leading "operator" that holds a site's certificate (a peer, or a stolen key of
        // one): it answers, but it is not the operator.
        let imposter = operator(&pki, "pdx", true, VIEW).await;
        // One whose certificate comes from another CA.
        let (_other_dir, other) = testing::pki();
        let foreign = operator(&other, "operator", true, VIEW).await;
        for url in [imposter, foreign] {
            let c = HttpContacts::new(&id(), &[url], &[], Duration::from_secs(1), &tls).unwrap();
            let err = c.operator_healthz().await.unwrap_err();
            assert!(
                matches!(&err, ContactError::Request(m) if m.contains("TLS handshake")),
                "{err}"
            );
            assert!(c.operator_active_site().await.is_err());
        }
        // And the operator's own certificate is no peer.
        let as_peer = operator(&pki, "operator", true, VIEW).await;
        let c = HttpContacts::new(&id(), &[], &[as_peer], Duration::from_secs(1), &tls).unwrap();
        assert!(c.peer_ping(0).await.is_err());
    }

    #[tokio::test]
    async fn a_peer_round_cut_short_keeps_the_ping_it_was_answered() {
        use axum::routing::get;
        let (_dir, pki) = testing::pki();
        let app = axum::Router::new()
            .route("/peer/ping", get(|| async { "pong" }))
            .route(
                "/peer/active-site",
                get(std::future::pending::<&'static str>),
            );
        let peer = testing::serve(app, testing::tls(&pki, "pdx")).await;
        let c = HttpContacts::new(
            &id(),
            &[],
            &[peer],
            Duration::from_secs(5),
            &testing::tls(&pki, "iad"),
        )
        .unwrap();
        let round = Round::default();
        let limit = Duration::from_millis(500);
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
