//! Leader election on a real three-member etcd cluster: one of two candidates leads and keeps
//! leading past its TTL, the other follows and takes over when it resigns; a leader whose
//! lease is revoked, or that is cut off from etcd until its lease expires, stops leading
//! before the other starts, and its guarded writes are refused inside etcd.

use std::time::Duration;

use bloodraven_etcd::election::{self, Leadership};
use bloodraven_etcd::{ClientOptions, EtcdClient, EtcdStore};
use bloodraven_store::{Store, StoreError, StoreExt, WriteOp};
use bloodraven_testkit::etcd::EtcdCluster;
use bloodraven_testkit::link::Link;
use bloodraven_testkit::store_conformance::lease;
use tokio::sync::watch;
use tokio::time::Instant;

const PREFIX: &str = "/bloodraven/";
const LEADER_KEY: &str = "/bloodraven/leader";
/// Generous bounds for real processes on a shared machine.
const WITHIN: Duration = Duration::from_secs(20);

fn client(endpoints: Vec<String>) -> EtcdClient {
    EtcdClient::new(&ClientOptions::new(endpoints)).unwrap()
}

/// The leader key's record as `observer` reads it; there must be one.
async fn leader_record(observer: &EtcdClient) -> election::LeaderRecord {
    election::leader(observer, LEADER_KEY)
        .await
        .unwrap()
        .expect("a leader key")
}

struct Candidate {
    leadership: Leadership,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn candidate(c: EtcdClient, identity: &str, ttl: Duration) -> Candidate {
    let (shutdown, rx) = watch::channel(false);
    let (leadership, task) = election::campaign(c, LEADER_KEY, identity, ttl, rx);
    Candidate {
        leadership,
        shutdown,
        task,
    }
}

/// Waits until `l` says `leading`.
async fn until_leading(l: &Leadership, leading: bool) {
    let mut rx = l.watch();
    tokio::time::timeout(WITHIN, rx.wait_for(|v| *v == leading))
        .await
        .unwrap_or_else(|_| panic!("{} never turned leading={leading}", l.identity()))
        .unwrap();
}

/// Waits until one of `a`, `b` leads; returns (leader, follower).
async fn one_leads<'a>(a: &'a Candidate, b: &'a Candidate) -> (&'a Candidate, &'a Candidate) {
    let (mut ra, mut rb) = (a.leadership.watch(), b.leadership.watch());
    tokio::time::timeout(WITHIN, async {
        tokio::select! {
            r = ra.wait_for(|v| *v) => { r.unwrap(); }
            r = rb.wait_for(|v| *v) => { r.unwrap(); }
        }
    })
    .await
    .expect("someone leads");
    if a.leadership.is_leader() {
        (a, b)
    } else {
        (b, a)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_candidates_leads_past_its_ttl_and_the_other_takes_over_when_it_resigns() {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let ttl = Duration::from_secs(3);
    let a = candidate(client(cluster.endpoints()), "op-a", ttl);
    let b = candidate(client(cluster.endpoints()), "op-b", ttl);
    let (leader, follower) = one_leads(&a, &b).await;
    assert!(!follower.leadership.is_leader(), "exactly one leads");
    let observer = client(cluster.endpoints());
    let record = leader_record(&observer).await;
    assert_eq!(record.identity, leader.leadership.identity());
    let token = leader.leadership.fencing_token().expect("a term");
    assert_eq!(record.create_revision, token);
    assert!(leader.leadership.confirm());

    // Twice the TTL later, the same term holds: the keep-alives keep the lease.
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(leader.leadership.fencing_token(), Some(token));
    assert!(!follower.leadership.is_leader());
    let still = leader_record(&observer).await;
    assert_eq!(still.create_revision, token);

    // The leader resigns: it steps down, and once it is done its key is gone with its lease
    // (not left to expire); the follower leads.
    leader.shutdown.send(true).unwrap();
    until_leading(&leader.leadership, false).await;
    let deadline = Instant::now() + WITHIN;
    while !leader.task.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the resigning candidate never finished"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = election::leader(&observer, LEADER_KEY).await.unwrap();
    assert_ne!(
        after.map(|r| r.identity).as_deref(),
        Some(leader.leadership.identity()),
        "the resigned leader's key is revoked, not left to expire"
    );
    until_leading(&follower.leadership, true).await;
    let next = follower.leadership.fencing_token().unwrap();
    assert_ne!(next, token);
    let record = leader_record(&observer).await;
    assert_eq!(record.identity, follower.leadership.identity());
    assert_eq!(record.create_revision, next);
    follower.shutdown.send(true).unwrap();
    until_leading(&follower.leadership, false).await;
    for c in [a, b] {
        tokio::time::timeout(WITHIN, c.task).await.unwrap().unwrap();
    }
    assert!(
        election::leader(&observer, LEADER_KEY)
            .await
            .unwrap()
            .is_none(),
        "both resigned: no leader key"
    );
}

/// Creating lease `name` through `writer` (a leader's store whose term is over) is refused
/// before anything is written: `reader` does not find it.
async fn stale_create_refused(writer: &EtcdStore, reader: &EtcdStore, name: &str) {
    let r = writer
        .apply(vec![WriteOp::Create(lease("ns", name, "op-a"))])
        .await;
    assert!(refused_as_leader(&r), "{r:?}");
    let stored = reader.get(&lease("ns", name, "").key()).await.unwrap();
    assert!(stored.is_none(), "{stored:?}");
}

fn refused_as_leader<T: std::fmt::Debug>(r: &Result<T, StoreError>) -> bool {
    matches!(
        r,
        Err(StoreError::Backend {
            operation: "write as the leader",
            ..
        })
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_revoked_steps_down_and_its_guarded_writes_are_refused() {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let ttl = Duration::from_secs(2);
    let a = candidate(client(cluster.endpoints()), "op-a", ttl);
    until_leading(&a.leadership, true).await;
    let b = candidate(client(cluster.endpoints()), "op-b", ttl);
    let store = EtcdStore::connect(client(cluster.endpoints()), PREFIX)
        .await
        .unwrap();
    let as_a = store.guarded(LEADER_KEY, a.leadership.fencing_token().unwrap());
    as_a.create(lease("ns", "by-a", "op-a")).await.unwrap();

    // Someone revokes A's lease (an operator's mistake, an expiry A did not see).
    let observer = client(cluster.endpoints());
    let record = leader_record(&observer).await;
    assert_eq!(record.identity, "op-a");
    assert!(observer.lease_revoke(record.lease_id).await.unwrap());
    // Whatever A believes right now, etcd refuses its writes.
    let r = as_a
        .apply(vec![WriteOp::Create(lease("ns", "late", "op-a"))])
        .await;
    assert!(refused_as_leader(&r), "{r:?}");
    until_leading(&a.leadership, false).await;
    assert!(!a.leadership.confirm());
    // B (or A again, in a new term) leads; A's old term stays fenced.
    let (leader, _) = one_leads(&a, &b).await;
    let token = leader.leadership.fencing_token().unwrap();
    assert_ne!(token, record.create_revision);
    stale_create_refused(&as_a, &store, "late").await;
    assert_eq!(store.refused_guarded_writes(), 2);
    let fresh = store.guarded(LEADER_KEY, token);
    fresh.create(lease("ns", "late", "new-term")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_stops_leading_before_anyone_else_starts() {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let ttl = Duration::from_secs(2);
    let mut links = Vec::new();
    for i in 0..cluster.len() {
        links.push(
            Link::start(([127, 0, 0, 1], cluster.client_port(i)).into())
                .await
                .unwrap(),
        );
    }
    let through_links = client(
        links
            .iter()
            .map(|l| format!("http://{}", l.addr()))
            .collect(),
    );
    let a = candidate(through_links.clone(), "op-a", ttl);
    until_leading(&a.leadership, true).await;
    let token_a = a.leadership.fencing_token().unwrap();
    let store_a = EtcdStore::connect(through_links, PREFIX)
        .await
        .unwrap()
        .guarded(LEADER_KEY, token_a);
    store_a.create(lease("ns", "by-a", "op-a")).await.unwrap();
    let b = candidate(client(cluster.endpoints()), "op-b", ttl);

    // A's every path to etcd is cut: its keep-alives fail; its lease runs out in etcd.
    for l in &links {
        l.cut().await;
    }
    let mut rb = b.leadership.watch();
    tokio::time::timeout(WITHIN, rb.wait_for(|v| *v))
        .await
        .expect("B takes over once A's lease expired")
        .unwrap();
    // The moment B leads, A already confirms nothing: its validity ended a margin before
    // its lease could expire, and B's term began after that.
    assert!(!a.leadership.confirm(), "A acts no more once B leads");
    until_leading(&a.leadership, false).await;

    // Healed, A's writes in its old term are refused inside etcd; A follows B.
    for l in &links {
        l.heal();
    }
    stale_create_refused(&store_a, &store_a, "from-the-past").await;
    assert_eq!(store_a.refused_guarded_writes(), 1);
    let observer = client(cluster.endpoints());
    let record = leader_record(&observer).await;
    assert_eq!(record.identity, "op-b");
    assert_eq!(Some(record.create_revision), b.leadership.fencing_token());
    assert!(!a.leadership.is_leader());
}
