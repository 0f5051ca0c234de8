//! Group commit of deploy lease decisions, over real TLS on the embedded store: requests that
//! arrive while a commit is in flight are decided together and stored as one batch, answered
//! only once it is stored, and a request whose client went away is decided all the same.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::resources::KIND_LEASE;
use bloodraven_testkit::faults::{Fault, Faults, When};
use reqwest::{Method, StatusCode};
use support::{Client, Env, GROUP};
use tokio::time::Instant;

const QUEUED: usize = 31;

/// A renewal in flight: the TTL it asked for and, once answered, the answer.
type Renewing = tokio::task::JoinHandle<(u32, support::Answer)>;

struct Fixture {
    env: Env,
    op: bloodraven_operator::OperatorHandle,
    faults: Arc<Faults>,
    gate: tokio::sync::watch::Sender<bool>,
    client: Arc<Client>,
    token: String,
}

/// The operator on SQLite behind a gate on lease writes (open), the group bootstrapped.
async fn fixture() -> Fixture {
    let env = Env::new();
    let (gate, fault) = Fault::gate();
    let faults = Faults::new();
    faults.on(When::kind(KIND_LEASE), fault);
    let op = env.start_under(&faults).await;
    env.bootstrap(&op).await;
    let client = Arc::new(env.client(&op));
    let token = env.token("ci", "deployer");
    Fixture {
        env,
        op,
        faults,
        gate,
        client,
        token,
    }
}

impl Fixture {
    /// A renewal asking for `ttl`, so every decision changes the stored record.
    fn renew(&self, lease_token: &str, ttl: u32) -> Renewing {
        let (client, token) = (self.client.clone(), self.token.clone());
        let body = format!(r#"{{"token":"{lease_token}","ttlSeconds":{ttl}}}"#);
        tokio::spawn(async move {
            let a = client
                .call(
                    Method::PUT,
                    &format!("/deploy/v1/groups/{GROUP}/leases/migration/op-1"),
                    Some(&token),
                    Some(&body),
                    &[],
                )
                .await;
            (ttl, a)
        })
    }

    /// The lease batches stored so far.
    fn lease_batches(&self) -> usize {
        self.faults
            .batches()
            .iter()
            .filter(|b| b.iter().any(|o| o.kind == KIND_LEASE))
            .count()
    }

    async fn wait_queued(&self, n: usize) {
        let rt = self.op.group(GROUP).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while rt.queued_lease_requests() < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} requests queued",
                rt.queued_lease_requests()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_held(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.faults.held() == 0 {
            assert!(Instant::now() < deadline, "no lease write reached the gate");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The first renewal's commit stalls at the (closed) gate, holding the lease lock, and
    /// [`QUEUED`] more renewals queue behind it, each asking for another TTL.
    async fn queue_behind_a_stalled_commit(&self, lease_token: &str) -> (Renewing, Vec<Renewing>) {
        self.gate.send_replace(true);
        self.env.clock.advance(Duration::from_secs(1));
        let first = self.renew(lease_token, 40);
        self.wait_held().await;
        self.env.clock.advance(Duration::from_secs(1));
        let queued: Vec<_> = (0..QUEUED)
            .map(|i| self.renew(lease_token, 41 + u32::try_from(i).unwrap()))
            .collect();
        self.wait_queued(QUEUED).await;
        (first, queued)
    }

    /// Grants `op-1`'s migration lease and returns its token.
    async fn grant(&self) -> String {
        self.client.granted_migration(&self.token, "op-1", 30).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_queued_behind_a_commit_are_stored_in_one_batch_and_answered_after_it() {
    let f = fixture().await;
    let lease_token = f.grant().await;
    let before = f.lease_batches();

    let (first, queued) = f.queue_behind_a_stalled_commit(&lease_token).await;
    // Nothing is answered before its batch is stored.
    assert!(!first.is_finished());
    assert!(queued.iter().all(|h| !h.is_finished()));

    f.gate.send_replace(false);
    let (ttl, a) = first.await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "ttl {ttl}: {}", a.text);
    let answers: Vec<(u32, support::Answer)> = futures::future::join_all(queued)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (ttl, a) in &answers {
        assert_eq!(a.status, StatusCode::OK, "ttl {ttl}: {}", a.text);
    }
    // One batch for the first renewal, one for the 31 decided together (without group
    // commit: one each, 32).
    assert_eq!(f.lease_batches() - before, 2);
    // The stored record is the last decision's, which is one of the answers, and memory
    // matches the store.
    let rt = f.op.group(GROUP).await.unwrap();
    rt.check_lease_state().await.unwrap();
    let stored = f.env.open_store();
    let leases = bloodraven_store::Store::list(&stored, KIND_LEASE, Some("default"))
        .await
        .unwrap();
    let record: serde_json::Value = serde_json::from_str(
        leases[0]
            .metadata
            .annotations
            .get(bloodraven_core::contract::annotations::LEASE_RECORD)
            .unwrap(),
    )
    .unwrap();
    let stored_ttl = u32::try_from(record["ttlSeconds"].as_u64().unwrap()).unwrap();
    assert!(
        answers.iter().any(|(ttl, _)| *ttl == stored_ttl),
        "stored ttl {stored_ttl}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_whose_clients_went_away_is_decided_and_stored_whole() {
    let f = fixture().await;
    let lease_token = f.grant().await;
    let (first, queued) = f.queue_behind_a_stalled_commit(&lease_token).await;
    // Every other client gives up: its connection closes and the server drops its handler.
    let mut kept = Vec::new();
    for (i, h) in queued.into_iter().enumerate() {
        if i % 2 == 0 {
            h.abort();
        } else {
            kept.push(h);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    f.gate.send_replace(false);
    assert_eq!(first.await.unwrap().1.status, StatusCode::OK);
    for h in kept {
        let (ttl, a) = h.await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "ttl {ttl}: {}", a.text);
    }
    let rt = f.op.group(GROUP).await.unwrap();
    rt.check_lease_state().await.unwrap();
    assert_eq!(rt.queued_lease_requests(), 0);
    // The lease still answers as one: a renewal with its token is accepted, a release ends it.
    let r = f
        .client
        .renew(&f.token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let d = f
        .client
        .release(&f.token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT, "{}", d.text);
    let gone = f
        .client
        .renew(&f.token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.text);
    rt.check_lease_state().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contenders_for_the_migration_lease_never_both_believe_they_hold_it() {
    let f = fixture().await;
    let token_file = f.env.dir.path().join("deploy.token");
    std::fs::write(&token_file, &f.token).unwrap();
    let bases = format!("https://{}", f.op.https_addr.unwrap());
    let contention = bloodraven_testkit::contention::Contention::start(
        &bloodraven_testkit::contention::Target {
            bases: &bases,
            ca: &f.env.ca,
            token_file: &token_file,
            group: GROUP,
            instance: "counter-app",
        },
        32,
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120);
    while contention.granted_after(started) < 40 {
        assert!(Instant::now() < deadline, "too few grants");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (held, lost) = contention.stop().await;
    assert_eq!(lost, 0, "answers lost on a healthy loopback");
    let twice = bloodraven_testkit::contention::overlapping(held);
    assert!(
        twice.is_empty(),
        "two clients held the migration lease at once: {twice:?}"
    );
    let rt = f.op.group(GROUP).await.unwrap();
    rt.check_lease_state().await.unwrap();
}
