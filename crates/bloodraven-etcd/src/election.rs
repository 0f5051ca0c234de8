//! Leader election on `<prefix>leader`, with the key's `create_revision` as the fencing token.
//!
//! - **Campaign**: a candidate that finds the key absent grants a lease of `ttl` and creates
//!   the key with its identity as the value, attached to the lease, in a transaction that
//!   requires the key to be absent (`create_revision == 0`). Exactly one candidate wins; the
//!   revision that created the key is its term's fencing token.
//! - **Lead**: the lease is kept alive every `ttl / 3` and the key read back (still created at
//!   the token's revision). Leadership is valid until the last answered keep-alive's *send*
//!   time plus `ttl` minus a margin (`ttl / 4`): etcd cannot expire the lease before its send
//!   time plus `ttl`, so the leader stops before any follower can take over — even when it is
//!   paused and wakes up late, since [`Leadership::confirm`] reads the clock, not the loop.
//!   Writes are fenced besides: a store made with [`crate::EtcdStore::guarded`] and the token
//!   has every write compare the key's `create_revision` inside etcd.
//! - **Follow**: a candidate that finds the key held watches it and campaigns again once it is
//!   deleted (the leader resigned, or its lease expired), or after `ttl` without news.
//! - **Resign**: on shutdown the leader steps down first, then revokes its lease, which
//!   deletes the key: a follower takes over at once instead of after `ttl`.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{
    Compare, EtcdClient, EtcdError, RangeRequest, TxnOp, TxnRequest, WatchRequest, WatchedEvent,
};

/// The log prefix of an operator that cannot reach an etcd quorum (alerts and runbooks grep
/// for it).
pub const NO_QUORUM: &str = "ETCD-UNREACHABLE:";

/// The lease TTL when the configuration gives none (`store.etcd.leaseTTL`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// The timings that follow from a lease TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub ttl: Duration,
    /// Between keep-alives while leading.
    pub keep_alive_every: Duration,
    /// Between attempts after a failed keep-alive.
    pub retry_every: Duration,
    /// How long before the lease could expire leadership already ends.
    pub margin: Duration,
}

impl Timings {
    pub fn for_ttl(ttl: Duration) -> Timings {
        Timings {
            ttl,
            keep_alive_every: ttl / 3,
            retry_every: ttl / 12,
            margin: ttl / 4,
        }
    }

    /// Until when a keep-alive (or the grant) sent at `sent`, once answered, covers leading:
    /// etcd renews the lease after it receives the request, so it expires no earlier than
    /// `sent + ttl`.
    pub fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.ttl.saturating_sub(self.margin)
    }
}

/// What one keep-alive came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlive {
    /// etcd renewed the lease; the request was sent at `sent`.
    Renewed { sent: Instant },
    /// etcd answered that the lease is gone (expired or revoked).
    LeaseGone,
    /// No answer (unreachable, timed out, refused).
    Failed,
}

/// The validity of leadership after a keep-alive's outcome, at `now`; `None`: leadership is
/// lost. A renewal extends from its send time, never shortens; a failure keeps the validity
/// already earned, until it runs out.
pub fn after_keep_alive(
    t: &Timings,
    valid_until: Instant,
    outcome: KeepAlive,
    now: Instant,
) -> Option<Instant> {
    let until = match outcome {
        KeepAlive::Renewed { sent } => valid_until.max(t.valid_until(sent)),
        KeepAlive::LeaseGone => return None,
        KeepAlive::Failed => valid_until,
    };
    (now < until).then_some(until)
}

/// One term of leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The revision that created the leader key: the fencing token.
    pub create_revision: i64,
    pub lease_id: i64,
    /// Leadership ends at this instant unless a keep-alive extends it.
    pub valid_until: Instant,
}

/// Who holds the leader key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRecord {
    /// The value of the key: the leader's identity.
    pub identity: String,
    /// The fencing token of its term.
    pub create_revision: i64,
    pub lease_id: i64,
}

/// Who holds `leader_key`, if anyone (for a status command).
pub async fn leader(
    client: &EtcdClient,
    leader_key: &str,
) -> Result<Option<LeaderRecord>, EtcdError> {
    let r = client.range(&RangeRequest::key(leader_key)).await?;
    Ok(r.kvs.first().map(|kv| LeaderRecord {
        identity: String::from_utf8_lossy(&kv.value).into_owned(),
        create_revision: kv.create_revision,
        lease_id: kv.lease,
    }))
}

/// What the election last learned from etcd: who holds the leader key, and whether etcd
/// answers at all. For status and readiness, never for deciding to act (that is
/// [`Leadership::confirm`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The identity in the leader key at the last answered read (`None`: nobody holds it, or
    /// it is not known since leadership was lost).
    pub leader: Option<String>,
    /// Why etcd did not answer the election's last request (no quorum, no member reachable);
    /// `None` once it answers again.
    pub problem: Option<String>,
}

/// Whether this process leads, with the term's fencing token and validity.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    term: Arc<Mutex<Option<Term>>>,
    observed: Arc<Mutex<Observed>>,
    leader_key: String,
    identity: String,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("leader_key", &self.leader_key)
            .field("identity", &self.identity)
            .field("leading", &self.is_leader())
            .field("term", &self.term())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// Whether the election says this process leads (see [`Leadership::confirm`] before
    /// acting).
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Turns `true` on winning, `false` on losing or resigning.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// The current term, while leading.
    pub fn term(&self) -> Option<Term> {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fencing token of the current term (for `EtcdStore::guarded`).
    pub fn fencing_token(&self) -> Option<i64> {
        self.term().map(|t| t.create_revision)
    }

    pub fn valid_until(&self) -> Option<Instant> {
        self.term().map(|t| t.valid_until)
    }

    /// Whether this process may act now: it leads and its last keep-alive still covers it.
    /// False from the moment the validity runs out, whether or not the election has run since.
    pub fn confirm(&self) -> bool {
        self.is_leader() && self.term().is_some_and(|t| Instant::now() < t.valid_until)
    }

    pub fn leader_key(&self) -> &str {
        &self.leader_key
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// What the election last learned from etcd.
    pub fn observed(&self) -> Observed {
        self.observed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Election {
    client: EtcdClient,
    key: String,
    identity: String,
    timings: Timings,
    tx: watch::Sender<bool>,
    term: Arc<Mutex<Option<Term>>>,
    observed: Arc<Mutex<Observed>>,
    shutdown: watch::Receiver<bool>,
}

/// How the leader key turned out to be no longer ours.
#[derive(Debug, thiserror::Error)]
enum KeyLost {
    #[error("the leader key was created again at revision {revision} by {holder:?}")]
    CreatedAgain { revision: i64, holder: String },
    #[error("the leader key is gone")]
    Gone,
}

/// Why a term ended.
enum Ended {
    Lost(String),
    Shutdown,
}

impl Election {
    fn set_term(&self, term: Option<Term>) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = term;
    }

    /// Records who holds the key (etcd answered).
    fn answered(&self, leader: Option<String>) {
        let mut o = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(was) = o.problem.take() {
            tracing::info!(leader_key = %self.key, previously = %was, "etcd answers again");
        }
        o.leader = leader;
    }

    /// Records that etcd did not answer. Logged once per outage: a follower retrying every
    /// second would otherwise fill the log.
    fn unanswered(&self, why: &EtcdError) {
        let mut o = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        if o.problem.is_none() {
            tracing::error!(
                leader_key = %self.key,
                error = %why,
                "{} etcd does not answer (no quorum, or no member reachable): this operator neither leads nor acts until it does",
                NO_QUORUM
            );
        }
        o.problem = Some(why.to_string());
    }

    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Waits `d`, or less when shutdown is asked; `true` when it was.
    async fn sleep_or_shutdown(&mut self, d: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => self.stopping(),
            r = self.shutdown.changed() => r.is_err() || self.stopping(),
        }
    }

    async fn run(mut self) {
        tracing::info!(leader_key = %self.key, identity = %self.identity, ttl = ?self.timings.ttl, "campaigning for the etcd leader key");
        while !self.stopping() {
            match self.campaign().await {
                Ok(Some(term)) => match self.lead(term).await {
                    Ended::Shutdown => break,
                    Ended::Lost(why) => {
                        tracing::warn!(leader_key = %self.key, identity = %self.identity, reason = %why, "stepping down: no longer the leader");
                    }
                },
                Ok(None) => {
                    if self.follow().await {
                        break;
                    }
                }
                Err(e) => {
                    self.unanswered(&e);
                    if self.sleep_or_shutdown(self.timings.retry_every).await {
                        break;
                    }
                }
            }
        }
        let _ = self.tx.send(false);
    }

    /// One attempt: `Some(term)` when won, `None` when the key is held.
    async fn campaign(&mut self) -> Result<Option<Term>, EtcdError> {
        let held = self
            .client
            .range(&RangeRequest::key(self.key.as_bytes()))
            .await?;
        if let Some(kv) = held.kvs.first() {
            self.answered(Some(String::from_utf8_lossy(&kv.value).into_owned()));
            return Ok(None);
        }
        let sent = Instant::now();
        let lease = self.client.lease_grant(self.timings.ttl).await?;
        let txn = TxnRequest {
            compare: vec![Compare::absent(self.key.as_bytes())],
            success: vec![TxnOp::Put {
                key: self.key.as_bytes().to_vec(),
                value: self.identity.as_bytes().to_vec(),
                lease: lease.id,
            }],
            failure: Vec::new(),
        };
        let won = match self.client.txn(&txn).await {
            Ok(r) if r.succeeded => Some(r.revision),
            Ok(_) => None,
            Err(e) => {
                // Whether the key was created is unknown: the lease is revoked, which deletes
                // the key if it was, and the campaign starts over.
                let _ = self.client.lease_revoke(lease.id).await;
                return Err(e);
            }
        };
        let Some(create_revision) = won else {
            let _ = self.client.lease_revoke(lease.id).await;
            return Ok(None);
        };
        let valid_until = self.timings.valid_until(sent);
        if Instant::now() >= valid_until {
            // Won, but too slowly to act on it: resign at once.
            let _ = self.client.lease_revoke(lease.id).await;
            return Ok(None);
        }
        Ok(Some(Term {
            create_revision,
            lease_id: lease.id,
            valid_until,
        }))
    }

    async fn lead(&mut self, mut term: Term) -> Ended {
        self.answered(Some(self.identity.clone()));
        self.set_term(Some(term));
        let _ = self.tx.send(true);
        tracing::info!(leader_key = %self.key, identity = %self.identity, fencing_token = term.create_revision, "leading: created the etcd leader key");
        let ended = self.keep_leading(&mut term).await;
        // Step down before anything else: from here on nothing is confirmed.
        self.set_term(None);
        let _ = self.tx.send(false);
        self.observed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leader = None;
        // Resigning (or tidying a lost term): the key goes with the lease, if it is still ours.
        match tokio::time::timeout(
            self.client.request_timeout(),
            self.client.lease_revoke(term.lease_id),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "revoking the leader lease failed; it expires on its own");
            }
            Err(_) => tracing::debug!("revoking the leader lease timed out; it expires on its own"),
        }
        if matches!(ended, Ended::Shutdown) {
            tracing::info!(leader_key = %self.key, identity = %self.identity, "resigned the etcd leader key");
        }
        ended
    }

    async fn keep_leading(&mut self, term: &mut Term) -> Ended {
        let mut next = Instant::now() + self.timings.keep_alive_every;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = tokio::time::sleep_until(term.valid_until) => {
                    return Ended::Lost("no keep-alive was answered in time".into());
                }
                r = self.shutdown.changed() => {
                    if r.is_err() || self.stopping() {
                        return Ended::Shutdown;
                    }
                    continue;
                }
            }
            let sent = Instant::now();
            let outcome = tokio::select! {
                o = self.keep_alive(term) => o,
                () = tokio::time::sleep_until(term.valid_until) => KeepAlive::Failed,
            };
            let Some(until) =
                after_keep_alive(&self.timings, term.valid_until, outcome, Instant::now())
            else {
                return Ended::Lost(match outcome {
                    KeepAlive::LeaseGone => "etcd says the lease is gone".into(),
                    _ => "no keep-alive was answered in time".into(),
                });
            };
            if outcome == KeepAlive::Failed {
                next = Instant::now() + self.timings.retry_every;
            } else {
                next = sent + self.timings.keep_alive_every;
            }
            if let Err(why) = self.still_ours(term).await {
                return Ended::Lost(why.to_string());
            }
            term.valid_until = until;
            self.set_term(Some(*term));
        }
    }

    async fn keep_alive(&self, term: &Term) -> KeepAlive {
        let sent = Instant::now();
        // Bounded by a margin per member: one that does not answer (paused) leaves time to
        // ask the next before leadership runs out.
        let client = self
            .client
            .with_request_timeout(self.client.request_timeout().min(self.timings.margin));
        match client.lease_keep_alive(term.lease_id).await {
            Ok(Some(_)) => {
                self.answered(Some(self.identity.clone()));
                KeepAlive::Renewed { sent }
            }
            Ok(None) => KeepAlive::LeaseGone,
            Err(e) => {
                tracing::warn!(error = %e, "keeping the leader lease alive failed");
                self.unanswered(&e);
                KeepAlive::Failed
            }
        }
    }

    /// `Err` when the key is known to be someone else's (or gone); an unanswered read is no
    /// news (the keep-alive decides).
    async fn still_ours(&self, term: &Term) -> Result<(), KeyLost> {
        let read = tokio::time::timeout_at(
            term.valid_until,
            self.client.range(&RangeRequest::key(self.key.as_bytes())),
        )
        .await;
        match read {
            Ok(Ok(r)) => match r.kvs.first() {
                Some(kv) if kv.create_revision == term.create_revision => Ok(()),
                Some(kv) => Err(KeyLost::CreatedAgain {
                    revision: kv.create_revision,
                    holder: String::from_utf8_lossy(&kv.value).into_owned(),
                }),
                None => Err(KeyLost::Gone),
            },
            Ok(Err(_)) | Err(_) => Ok(()),
        }
    }

    /// Waits while the key is held: until it is deleted, or for at most `ttl`. `true` on
    /// shutdown.
    async fn follow(&mut self) -> bool {
        let held = match self
            .client
            .range(&RangeRequest::key(self.key.as_bytes()))
            .await
        {
            Ok(held) => held,
            Err(e) => {
                self.unanswered(&e);
                return self.sleep_or_shutdown(self.timings.retry_every).await;
            }
        };
        let Some(kv) = held.kvs.first() else {
            self.answered(None);
            return false;
        };
        self.answered(Some(String::from_utf8_lossy(&kv.value).into_owned()));
        let watch = WatchRequest {
            key: self.key.as_bytes().to_vec(),
            range_end: Vec::new(),
            start_revision: held.revision + 1,
            prev_kv: false,
        };
        let Ok(mut stream) = self.client.watch(&watch).await else {
            return self.sleep_or_shutdown(self.timings.retry_every).await;
        };
        let deadline = Instant::now() + self.timings.ttl;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return false,
                r = self.shutdown.changed() => {
                    if r.is_err() || self.stopping() {
                        return true;
                    }
                }
                next = stream.next() => match next {
                    Ok(Some(batch)) => {
                        if batch.events.iter().any(|e| matches!(e, WatchedEvent::Delete { .. })) {
                            return false;
                        }
                    }
                    Ok(None) | Err(_) => return false,
                },
            }
        }
    }
}

/// Campaigns for `leader_key` as `identity` with leases of `ttl`, for as long as the process
/// runs; resigns (revoking the lease) when `shutdown` turns true.
pub fn campaign(
    client: EtcdClient,
    leader_key: &str,
    identity: &str,
    ttl: Duration,
    shutdown: watch::Receiver<bool>,
) -> (Leadership, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let term = Arc::new(Mutex::new(None));
    let observed = Arc::new(Mutex::new(Observed::default()));
    let leadership = Leadership {
        rx,
        term: term.clone(),
        observed: observed.clone(),
        leader_key: leader_key.to_string(),
        identity: identity.to_string(),
    };
    let election = Election {
        client,
        key: leader_key.to_string(),
        identity: identity.to_string(),
        timings: Timings::for_ttl(ttl),
        tx,
        term,
        observed,
        shutdown,
    };
    (leadership, tokio::spawn(election.run()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t10() -> Timings {
        Timings::for_ttl(Duration::from_secs(10))
    }

    #[test]
    fn timings_follow_the_ttl() {
        let t = t10();
        assert_eq!(
            t.keep_alive_every,
            Duration::from_millis(3333) + Duration::from_nanos(333_333)
        );
        assert_eq!(t.margin, Duration::from_millis(2500));
        assert!(
            t.ttl.saturating_sub(t.margin) > t.keep_alive_every * 2,
            "two keep-alives may be lost before leadership is"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn validity_counts_from_a_keep_alives_send_time_not_its_answer() {
        let t = t10();
        let granted = Instant::now();
        let until = t.valid_until(granted);
        assert_eq!(until - granted, Duration::from_millis(7500));
        tokio::time::advance(Duration::from_secs(3)).await;
        let sent = Instant::now();
        // The answer comes 4 s later: the lease was renewed when etcd got the request, at the
        // latest at the answer; only the send time is safe.
        tokio::time::advance(Duration::from_secs(4)).await;
        let renewed = after_keep_alive(&t, until, KeepAlive::Renewed { sent }, Instant::now());
        assert_eq!(renewed, Some(sent + Duration::from_millis(7500)));
        // An answer to an older keep-alive never shortens what a newer one earned.
        let older = after_keep_alive(
            &t,
            renewed.unwrap(),
            KeepAlive::Renewed { sent: granted },
            Instant::now(),
        );
        assert_eq!(older, renewed);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_keep_alives_keep_leadership_only_until_it_runs_out() {
        let t = t10();
        let until = t.valid_until(Instant::now());
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(
            after_keep_alive(&t, until, KeepAlive::Failed, Instant::now()),
            Some(until)
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(
            after_keep_alive(&t, until, KeepAlive::Failed, Instant::now()),
            None,
            "7.5 s after the last answered keep-alive was sent, leadership is lost"
        );
        assert_eq!(
            after_keep_alive(&t, until, KeepAlive::LeaseGone, Instant::now()),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_answered_after_its_validity_does_not_revive_leadership() {
        let t = t10();
        let sent = Instant::now();
        let until = t.valid_until(sent);
        // The process was paused for 9 s after sending: the answer, when it comes, is too old.
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(
            after_keep_alive(&t, until, KeepAlive::Renewed { sent }, Instant::now()),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_leader_confirms_nothing_once_its_validity_passed_before_its_loop_runs() {
        let (tx, rx) = watch::channel(true);
        let t = t10();
        let term = Arc::new(Mutex::new(Some(Term {
            create_revision: 42,
            lease_id: 7,
            valid_until: t.valid_until(Instant::now()),
        })));
        let l = Leadership {
            rx,
            term,
            observed: Arc::default(),
            leader_key: "/bloodraven/leader".into(),
            identity: "op-1".into(),
        };
        assert!(l.confirm());
        assert_eq!(l.fencing_token(), Some(42));
        tokio::time::advance(Duration::from_millis(7499)).await;
        assert!(l.confirm());
        // Nothing ran in between (the election loop is not even started): the clock decides.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(l.is_leader(), "the loop has not stepped down yet");
        assert!(!l.confirm(), "but nothing is confirmed past the validity");
        drop(tx);
    }
}
