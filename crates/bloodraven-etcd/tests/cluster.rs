//! The etcd store and client on real clusters: the leader guard, the watch across a broken
//! link and a compaction, members stopped (one: the store goes on; a majority: writes and
//! reads fail, never a false success), an endpoint list whose first member is down, TLS with a
//! client certificate, and authentication whose password and token never show.

use std::time::Duration;

use bloodraven_core::resources::KIND_LEASE;
use bloodraven_etcd::client::{Compare, Failure, RangeRequest, TxnOp, TxnRequest};
use bloodraven_etcd::{ClientOptions, EtcdClient, EtcdError, EtcdStore};
use bloodraven_runtime::tls::generate_pki_with_client;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, StoreExt, WatchEvent, WriteOp};
use bloodraven_testkit::etcd::{EtcdCluster, EtcdTls};
use bloodraven_testkit::link::Link;
use bloodraven_testkit::store_conformance::lease;
use serde_json::json;
use tokio::sync::broadcast;

const PREFIX: &str = "/bloodraven/";
const LEADER_KEY: &str = "/bloodraven/leader";

async fn store(endpoints: Vec<String>) -> EtcdStore {
    store_with(&ClientOptions::new(endpoints)).await
}

async fn store_with(opts: &ClientOptions) -> EtcdStore {
    EtcdStore::connect(EtcdClient::new(opts).unwrap(), PREFIX)
        .await
        .unwrap()
}

/// Creates lease `name` (held by `holder`) through `s`, and waits (up to 10 s) until a watch
/// opened just before sees it: the object created, and that watch.
async fn create_seen(
    s: &EtcdStore,
    name: &str,
    holder: &str,
) -> (RawObject, broadcast::Receiver<WatchEvent>) {
    let mut rx = s.watch();
    let created = s.create(lease("ns", name, holder)).await.unwrap();
    assert!(
        next_of(&mut rx, name, Duration::from_secs(10))
            .await
            .is_some(),
        "the watch never saw {name}"
    );
    (created, rx)
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(KIND_LEASE, "ns", name)
}

/// Creates the leader key as `holder` when absent; returns the revision that created it.
async fn take_leader_key(c: &EtcdClient, holder: &str) -> i64 {
    let r = c
        .txn(&TxnRequest {
            compare: vec![Compare::absent(LEADER_KEY)],
            success: vec![TxnOp::Put {
                key: LEADER_KEY.into(),
                value: holder.into(),
                lease: 0,
            }],
            failure: Vec::new(),
        })
        .await
        .unwrap();
    assert!(r.succeeded, "the leader key was free");
    r.revision
}

fn refused_as_leader(r: &Result<Vec<Option<RawObject>>, StoreError>) -> bool {
    matches!(r, Err(StoreError::Backend { operation: "write as the leader", detail }) if detail.contains("nothing was written"))
}

/// The next Put or Deleted of `name` on `rx`, skipping other events, within `limit`.
async fn next_of(
    rx: &mut broadcast::Receiver<WatchEvent>,
    name: &str,
    limit: Duration,
) -> Option<WatchEvent> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(e @ (WatchEvent::Put(_) | WatchEvent::Deleted(_)))) => {
                let (WatchEvent::Put(o) | WatchEvent::Deleted(o)) = &e else {
                    unreachable!()
                };
                if o.metadata.name == name {
                    return Some(e);
                }
            }
            Ok(Ok(WatchEvent::Resync) | Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_guarded_by_a_stale_leader_revision_are_refused_inside_etcd_and_apply_nothing() {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let s = store(cluster.endpoints()).await;
    let c = s.client().clone();
    let first = take_leader_key(&c, "op-1").await;
    let as_first = s.guarded(LEADER_KEY, first);
    let l = as_first.create(lease("ns", "l", "op-1")).await.unwrap();

    // Another operator takes over: the key is deleted and created again.
    c.delete_range(LEADER_KEY.as_bytes(), &[]).await.unwrap();
    let second = take_leader_key(&c, "op-2").await;
    assert_ne!(first, second);

    let stale = as_first
        .apply(vec![WriteOp::Create(lease("ns", "x", "op-1"))])
        .await;
    assert!(refused_as_leader(&stale), "{stale:?}");
    assert!(s.get(&key("x")).await.unwrap().is_none(), "nothing applied");
    let mut changed = l.clone();
    changed.body["spec"]["holderIdentity"] = json!("op-1-again");
    let stale = as_first
        .apply(vec![
            WriteOp::Replace(changed.clone()),
            WriteOp::DeleteIfExists { key: key("other") },
        ])
        .await;
    assert!(refused_as_leader(&stale), "{stale:?}");
    let kept = s.get(&l.key()).await.unwrap().unwrap();
    assert_eq!(kept.metadata.resource_version, l.metadata.resource_version);
    assert_eq!(s.refused_guarded_writes(), 2);

    // The new term's token passes; its own failures are the ops' errors, not the guard's.
    let as_second = s.guarded(LEADER_KEY, second);
    let written = as_second.replace(changed.clone()).await.unwrap();
    assert_eq!(written.body["spec"]["holderIdentity"], "op-1-again");
    let conflict = as_second.replace(changed).await;
    assert!(
        matches!(conflict, Err(StoreError::Conflict { .. })),
        "{conflict:?}"
    );
    assert_eq!(s.refused_guarded_writes(), 2);

    // No leader key at all: refused too; the unguarded store still writes.
    c.delete_range(LEADER_KEY.as_bytes(), &[]).await.unwrap();
    let orphan = as_second
        .apply(vec![WriteOp::Create(lease("ns", "y", "op-2"))])
        .await;
    assert!(refused_as_leader(&orphan), "{orphan:?}");
    assert!(s.get(&key("y")).await.unwrap().is_none());
    s.create(lease("ns", "y", "tool")).await.unwrap();
}

/// A view guarded by whatever term holds (an operator's store across its terms): the token is
/// read when each write is sent; with no term nothing is sent, and a term that has ended is
/// refused by etcd even while the process still names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_guarded_by_the_current_term_follow_it_and_are_not_sent_without_one() {
    use std::sync::{Arc, Mutex};
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let s = store(cluster.endpoints()).await;
    let c = s.client().clone();
    let term: Arc<Mutex<Option<i64>>> = Arc::new(Mutex::new(None));
    let current = term.clone();
    let guarded = s.guarded_by(LEADER_KEY, Arc::new(move || *current.lock().unwrap()));
    // No term: refused before anything is sent (the key need not even exist).
    let none = guarded
        .apply(vec![WriteOp::Create(lease("ns", "a", "op-1"))])
        .await;
    assert!(refused_as_leader(&none), "{none:?}");
    assert!(s.get(&key("a")).await.unwrap().is_none());
    assert_eq!(s.refused_guarded_writes(), 0, "nothing reached etcd");
    // A term: writes pass while its key stands.
    let first = take_leader_key(&c, "op-1").await;
    *term.lock().unwrap() = Some(first);
    guarded.create(lease("ns", "a", "op-1")).await.unwrap();
    // Another process takes the key; this one still names its old term: etcd refuses.
    c.delete_range(LEADER_KEY.as_bytes(), &[]).await.unwrap();
    let second = take_leader_key(&c, "op-2").await;
    let stale = guarded
        .apply(vec![WriteOp::Create(lease("ns", "b", "op-1"))])
        .await;
    assert!(refused_as_leader(&stale), "{stale:?}");
    assert!(s.get(&key("b")).await.unwrap().is_none());
    assert_eq!(s.refused_guarded_writes(), 1);
    // The same view follows a new term without being rebuilt.
    *term.lock().unwrap() = Some(second);
    guarded.create(lease("ns", "b", "op-2")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_fell_below_a_compaction_asks_for_a_relist_and_one_that_did_not_resumes() {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let link = Link::start(([127, 0, 0, 1], cluster.client_port(0)).into())
        .await
        .unwrap();
    let watched = store(vec![format!("http://{}", link.addr())]).await;
    let direct = store(cluster.endpoints()).await;
    let mut rx = watched.watch();
    direct.create(lease("ns", "before", "x")).await.unwrap();
    assert!(matches!(
        next_of(&mut rx, "before", Duration::from_secs(10)).await,
        Some(WatchEvent::Put(_))
    ));

    // Cut and healed with nothing compacted: the watch resumes where it stopped, and the
    // change made meanwhile arrives with no re-list.
    link.cut().await;
    let during = direct.create(lease("ns", "during", "x")).await.unwrap();
    link.heal();
    loop {
        match tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
            Ok(Ok(WatchEvent::Put(o))) if o.metadata.name == "during" => {
                assert_eq!(
                    o.metadata.resource_version,
                    during.metadata.resource_version
                );
                break;
            }
            Ok(Ok(WatchEvent::Resync)) => panic!("nothing was missed: no re-list"),
            Ok(Ok(_)) => {}
            other => panic!("the change made during the cut: {other:?}"),
        }
    }

    // Cut, two changes and a compaction past the first: the watch cannot resume.
    link.cut().await;
    direct.create(lease("ns", "gone-1", "x")).await.unwrap();
    direct.create(lease("ns", "gone-2", "x")).await.unwrap();
    // The store's newest revision, from etcd itself (a resourceVersion is opaque).
    let revision = direct
        .client()
        .range(&RangeRequest::key(b"/".to_vec()))
        .await
        .unwrap()
        .revision;
    direct.client().compact(revision).await.unwrap();
    link.heal();
    let mut saw_resync = false;
    while !saw_resync {
        match tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
            Ok(Ok(WatchEvent::Resync)) => saw_resync = true,
            Ok(Ok(WatchEvent::Put(o))) if o.metadata.name == "gone-1" => {
                panic!("the compacted change was delivered")
            }
            Ok(Ok(_)) => {}
            other => panic!("no re-list: {other:?}"),
        }
    }
    // The re-list has what the watch missed; the watch goes on after it.
    let listed = watched.list(KIND_LEASE, Some("ns")).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|o| o.metadata.name.as_str()).collect();
    assert_eq!(names, ["before", "during", "gone-1", "gone-2"]);
    direct.create(lease("ns", "after", "x")).await.unwrap();
    assert!(matches!(
        next_of(&mut rx, "after", Duration::from_secs(10)).await,
        Some(WatchEvent::Put(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_member_stopped_the_store_keeps_working_on_the_quorum() {
    let mut cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let s = store(cluster.endpoints()).await;
    let (l, mut rx) = create_seen(&s, "l", "op-1").await;
    // The member the client and the watch use, and etcd's leader if it is another one.
    assert_eq!(s.client().current_endpoint(), cluster.endpoint(0));
    cluster.stop(0).await;
    let mut next = l.clone();
    next.body["spec"]["holderIdentity"] = json!("op-2");
    let n = s.replace(next).await.unwrap();
    assert_ne!(n.metadata.resource_version, l.metadata.resource_version);
    assert_eq!(
        s.get(&l.key()).await.unwrap().unwrap().body["spec"]["holderIdentity"],
        "op-2"
    );
    assert_eq!(s.list(KIND_LEASE, None).await.unwrap().len(), 1);
    match next_of(&mut rx, "l", Duration::from_secs(20)).await {
        Some(WatchEvent::Put(o)) => {
            assert_eq!(o.metadata.resource_version, n.metadata.resource_version);
        }
        other => panic!("the watch moved to another member: {other:?}"),
    }
    let leader = cluster.wait_for_leader().await.expect("a leader among two");
    assert_ne!(leader, 0);
    cluster.restart(0).await.unwrap();
    s.create(lease("ns", "m", "op-1")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_majority_stopped_writes_and_reads_fail_and_never_falsely_succeed() {
    let mut cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let mut opts = ClientOptions::new(cluster.endpoints());
    opts.request_timeout = Duration::from_secs(2);
    let s = store_with(&opts).await;
    let l = s.create(lease("ns", "l", "op-1")).await.unwrap();
    cluster.kill(1).await;
    cluster.kill(2).await;
    let mut outcomes = Vec::new();
    for i in 0..3 {
        let r = s.create(lease("ns", &format!("w{i}"), "op-1")).await;
        match &r {
            Err(StoreError::Unconfirmed { .. }) => outcomes.push((i, true)),
            Err(StoreError::Backend { detail, .. }) => {
                assert!(
                    detail.contains("no endpoint answered") || detail.contains("refused"),
                    "{detail}"
                );
                outcomes.push((i, false));
            }
            other => panic!("a write without a quorum: {other:?}"),
        }
    }
    let read = s.get(&l.key()).await;
    match read {
        Err(StoreError::Backend { operation, detail }) => {
            assert_eq!(operation, "read an object");
            assert!(detail.contains("etcd range failed"), "{detail}");
        }
        other => panic!("a read without a quorum: {other:?}"),
    }
    let listed = s.list(KIND_LEASE, None).await;
    assert!(
        matches!(listed, Err(StoreError::Backend { .. })),
        "{listed:?}"
    );
    // Once the quorum is back, a write that was refused is not there.
    cluster.restart(1).await.unwrap();
    cluster.restart(2).await.unwrap();
    for (i, unconfirmed) in outcomes {
        let got = s.get(&key(&format!("w{i}"))).await.unwrap();
        if !unconfirmed {
            assert!(got.is_none(), "w{i} was refused, yet stored");
        }
    }
    s.create(lease("ns", "after", "op-1")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_list_whose_first_members_are_down_still_works() {
    let mut cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    cluster.stop(0).await;
    let nothing = format!(
        "http://127.0.0.1:{}",
        bloodraven_testkit::etcd::free_port().unwrap()
    );
    let mut endpoints = vec![nothing.clone()];
    endpoints.extend(cluster.endpoints());
    let s = store(endpoints).await;
    assert_eq!(
        s.client().current_endpoint(),
        cluster.endpoint(1),
        "sticks to the one that answered"
    );
    s.create(lease("ns", "l", "op-1")).await.unwrap();
    assert!(s.get(&key("l")).await.unwrap().is_some());
    create_seen(&s, "m", "op-1").await;
    let status = s.client().cluster_status().await.unwrap();
    assert!(status.quorum, "two of three answer");
    assert_eq!(status.members.len(), 3);
    assert!(status.leader.is_some());
    let down: Vec<_> = status.statuses.iter().filter(|(_, r)| r.is_err()).collect();
    assert_eq!(down.len(), 1, "the stopped member does not answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_and_only_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, identity) =
        generate_pki_with_client(dir.path(), &["127.0.0.1", "localhost"], "bloodraven").unwrap();
    let tls = EtcdTls {
        ca_file: pki.ca_cert.clone(),
        cert_file: pki.server_cert.clone(),
        key_file: pki.server_key.clone(),
        client: Some(identity.clone()),
    };
    let cluster = EtcdCluster::start_with(1, Some(tls))
        .await
        .expect("an etcd member with TLS");
    assert!(cluster.endpoint(0).starts_with("https://"));
    let mut opts = ClientOptions::new(cluster.endpoints());
    opts.ca_file = Some(pki.ca_cert.clone());
    opts.identity = Some(identity);
    let s = store_with(&opts).await;
    create_seen(&s, "l", "op-1").await;
    // Without the client certificate the member refuses the connection.
    opts.identity = None;
    opts.request_timeout = Duration::from_secs(2);
    let anonymous = EtcdClient::new(&opts).unwrap();
    let r = anonymous.range(&RangeRequest::key("/")).await;
    assert!(
        matches!(r, Err(EtcdError::Range(Failure::Unreachable { .. }))),
        "{r:?}"
    );
    // A CA that did not sign the member's certificate: no connection either.
    let other = tempfile::tempdir().unwrap();
    let (other_pki, other_id) =
        generate_pki_with_client(other.path(), &["127.0.0.1"], "stranger").unwrap();
    opts.ca_file = Some(other_pki.ca_cert);
    opts.identity = Some(other_id);
    let stranger = EtcdClient::new(&opts).unwrap();
    let r = stranger.range(&RangeRequest::key("/")).await;
    assert!(
        matches!(r, Err(EtcdError::Range(Failure::Unreachable { .. }))),
        "{r:?}"
    );
    // Plain HTTP to a TLS endpoint is a configuration error, before anything is sent.
    let plain = EtcdClient::new(&ClientOptions::new(cluster.endpoints()));
    assert!(matches!(plain, Err(EtcdError::Config(_))), "{plain:?}");
}

/// One member's JSON gateway, called raw: for what the client does not do (managing users) or
/// must not be trusted to show (the token).
struct Gateway {
    http: reqwest::Client,
    base: String,
}

impl Gateway {
    fn new(base: String) -> Gateway {
        let http = bloodraven_runtime::tls::http_client(None, Duration::from_secs(5)).unwrap();
        Gateway { http, base }
    }

    /// `POST path` with `body`, as `token` if any: the status and the JSON answer.
    async fn call(
        &self,
        path: &str,
        body: &serde_json::Value,
        token: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = token {
            req = req.header("Authorization", t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }

    /// [`Gateway::call`] without a token, asserted `200`: its answer.
    async fn ok(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let (status, answer) = self.call(path, body, None).await;
        assert_eq!(status, 200, "{path}: {answer}");
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_renews_its_token_and_neither_password_nor_token_ever_shows() {
    let cluster = EtcdCluster::start_with_args(
        1,
        None,
        &["--auth-token", "simple", "--auth-token-ttl", "1"],
    )
    .await
    .expect("an etcd member");
    let gateway = Gateway::new(cluster.endpoint(0));
    let password = "Pa55-w0rd-that-must-not-leak";
    let root = json!({"name": "root", "password": password});
    gateway.ok("/v3/auth/user/add", &root).await;
    let grant = json!({"user": "root", "role": "root"});
    gateway.ok("/v3/auth/user/grant", &grant).await;
    gateway.ok("/v3/auth/enable", &json!({})).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let mut opts = ClientOptions::new(cluster.endpoints());
    opts.username = Some("root".into());
    opts.password_file = Some(file.clone());
    let s = store_with(&opts).await;
    create_seen(&s, "l", "op-1").await;

    // A token of etcd's, to see what one looks like and when it expires.
    let auth = gateway.ok("/v3/auth/authenticate", &root).await;
    let token = auth["token"].as_str().unwrap().to_string();
    let token_shape = regex::Regex::new(r"[A-Za-z]{16}\.\d+").unwrap();
    assert!(token_shape.is_match(&token), "{token}");
    // A range of "/", as the token's holder.
    let range = json!({"key": "Lw=="});
    let (st, _) = gateway.call("/v3/kv/range", &range, Some(&token)).await;
    assert_eq!(st, 200);
    // Idle past the token TTL (1 s, checked every second): etcd forgets both tokens.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (st, body) = gateway.call("/v3/kv/range", &range, Some(&token)).await;
    assert_eq!(st, 401, "the token expired: {body}");
    // The store's client gets a new one and goes on.
    s.create(lease("ns", "m", "op-1")).await.unwrap();
    assert!(s.get(&key("m")).await.unwrap().is_some());

    let printed = format!("{s:?} {:?}", s.client());
    assert!(!printed.contains(password), "{printed}");
    assert!(
        !token_shape.is_match(&printed),
        "no token in Debug: {printed}"
    );
    assert!(printed.contains("authenticated: true"), "{printed}");

    // A wrong password: refused, and the error names the user, not the password.
    std::fs::write(&file, "wrong-password-not-shown").unwrap();
    let wrong = EtcdClient::new(&opts).unwrap();
    let err = wrong.range(&RangeRequest::key("/")).await.unwrap_err();
    assert!(
        matches!(err, EtcdError::Authenticate(Failure::Refused { .. })),
        "{err:?}"
    );
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("root") && !text.contains("wrong-password-not-shown"),
        "{text}"
    );
    assert!(!token_shape.is_match(&text));
    // No credentials at all: etcd refuses, and says why.
    let anonymous = EtcdClient::new(&ClientOptions::new(cluster.endpoints())).unwrap();
    let err = anonymous.range(&RangeRequest::key("/")).await.unwrap_err();
    assert!(
        matches!(err, EtcdError::Range(Failure::Refused { .. })),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_is_left_for_the_others_after_one_unconfirmed_write() {
    let mut cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let leader = cluster.wait_for_leader().await.expect("a leader");
    // A follower first in the list: pausing it leaves the quorum and its leader alone.
    let paused = (leader + 1) % 3;
    let mut endpoints = vec![cluster.endpoint(paused)];
    endpoints.extend((0..3).filter(|i| *i != paused).map(|i| cluster.endpoint(i)));
    let mut opts = ClientOptions::new(endpoints);
    opts.request_timeout = Duration::from_secs(1);
    let s = store_with(&opts).await;
    let (_, mut rx) = create_seen(&s, "before", "x").await;

    cluster.pause(paused);
    // Sent to a member that takes the bytes and says nothing: the outcome is unknown.
    let first = s.create(lease("ns", "w1", "x")).await;
    assert!(
        matches!(first, Err(StoreError::Unconfirmed { .. })),
        "{first:?}"
    );
    // The next write goes to the next member.
    let second = s.create(lease("ns", "w2", "x")).await.unwrap();
    assert_ne!(s.client().current_endpoint(), cluster.endpoint(paused));
    assert!(s.get(&key("w2")).await.unwrap().is_some());
    // The watch, quiet on the paused member, asks it whether it serves, and moves on.
    match next_of(&mut rx, "w2", Duration::from_secs(30)).await {
        Some(WatchEvent::Put(o)) => {
            assert_eq!(
                o.metadata.resource_version,
                second.metadata.resource_version
            );
        }
        other => panic!("the watch left the paused member: {other:?}"),
    }
    cluster.resume(paused);
}
