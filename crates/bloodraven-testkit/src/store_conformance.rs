//! The store contract (see `bloodraven_store`), as cases every back-end must pass: the
//! embedded SQLite store and the Kubernetes back-end (on the fake API server, and on a real
//! cluster behind `KUBECONFIG`).
//!
//! A back-end's test file implements [`Backend`] and expands [`conformance_tests!`], which
//! makes one test per case. Every case works in its own namespace, so cases can share a
//! back-end.

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::resources::{
    API_VERSION, KIND_GROUP, KIND_LEASE, LEASE_API_VERSION, ObjectMeta,
};
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, WatchEvent, WriteOp};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

/// What a case needs from a back-end.
pub trait Backend: Send + Sync {
    fn store(&self) -> Arc<dyn Store>;
    /// Makes the store's watch miss changes, so that it must ask for a re-list.
    fn force_relist(&self) -> impl std::future::Future<Output = ()> + Send;
    /// A fresh namespace for one case.
    fn namespace(&self, case: &str) -> String;
}

/// A valid `MysqlFailoverGroup` named `name` (valid for the CRD's admission too).
pub fn group(namespace: &str, name: &str) -> RawObject {
    let body = json!({
        "spec": {
            "sites": [
                {"name": "iad", "mysql": {"host": "mysql-iad", "port": 3306,
                 "credentials": {"secretName": "mysql-control"}},
                 "sidecar": {"url": "http://mysql-iad:8080"}},
                {"name": "pdx", "mysql": {"host": "mysql-pdx", "port": 3306,
                 "credentials": {"secretName": "mysql-control"}},
                 "sidecar": {"url": "http://mysql-pdx:8080"}}
            ]
        }
    });
    RawObject::from_body(
        API_VERSION,
        KIND_GROUP,
        ObjectMeta::named(namespace, name),
        &body,
    )
    .expect("a group body")
}

/// A deploy-lease-shaped `Lease` (labelled as Bloodraven's own).
pub fn lease(namespace: &str, name: &str, holder: &str) -> RawObject {
    let mut meta = ObjectMeta::named(namespace, name);
    meta.labels.insert(
        "bloodraven.shipstream.io/deploy-lease".into(),
        "migration".into(),
    );
    meta.labels.insert(
        "bloodraven.shipstream.io/group".into(),
        "conformance".into(),
    );
    meta.annotations
        .insert("example.io/record".into(), "{\"a\":1}".into());
    let body = json!({"spec": {"holderIdentity": holder, "leaseDurationSeconds": 30,
                               "renewTime": "2026-11-30T10:00:30.250Z"}});
    RawObject::from_body(LEASE_API_VERSION, KIND_LEASE, meta, &body).expect("a lease body")
}

fn rv(o: &RawObject) -> String {
    o.metadata.resource_version.clone()
}

fn status_of(o: &RawObject) -> Value {
    o.body.get("status").cloned().unwrap_or(Value::Null)
}

async fn written(store: &Arc<dyn Store>, op: WriteOp) -> Result<RawObject, StoreError> {
    let mut out = store.apply(vec![op]).await?;
    Ok(out.pop().flatten().expect("a write returns the object"))
}

/// Create, read back, list; a second create of the name is `AlreadyExists`.
pub async fn create_get_list(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("create");
    let g = written(&s, WriteOp::Create(group(&ns, "g1")))
        .await
        .unwrap();
    assert!(!rv(&g).is_empty() && !g.metadata.uid.is_empty());
    let got = s.get(&g.key()).await.unwrap().expect("stored");
    assert_eq!(rv(&got), rv(&g));
    assert_eq!(got.body["spec"]["sites"][1]["name"], "pdx");
    let listed = s.list(KIND_GROUP, Some(&ns)).await.unwrap();
    assert_eq!(listed.len(), 1);
    let again = s.apply(vec![WriteOp::Create(group(&ns, "g1"))]).await;
    assert!(
        matches!(again, Err(StoreError::AlreadyExists { .. })),
        "{again:?}"
    );
    let missing = ObjectKey::new(KIND_GROUP, &ns, "nope");
    assert!(s.get(&missing).await.unwrap().is_none());
}

/// Replace is compare-and-swap; versions change on every write and are only compared.
pub async fn replace_is_compare_and_swap(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("cas");
    let g = written(&s, WriteOp::Create(group(&ns, "g"))).await.unwrap();
    let mut next = g.clone();
    next.metadata
        .annotations
        .insert("example.io/x".into(), "1".into());
    let n1 = written(&s, WriteOp::Replace(next.clone())).await.unwrap();
    assert_ne!(rv(&n1), rv(&g), "a write changes the version");
    assert_eq!(n1.metadata.annotations["example.io/x"], "1");
    // The same write again, from the old version: refused.
    let stale = s.apply(vec![WriteOp::Replace(next)]).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let mut gone = group(&ns, "nope");
    gone.metadata.resource_version = rv(&n1);
    let missing = s.apply(vec![WriteOp::Replace(gone)]).await;
    assert!(
        matches!(
            missing,
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. })
        ),
        "{missing:?}"
    );
}

/// The status is written on its own: a write of the object keeps it, a status write changes
/// nothing else, a create ignores it; `generation` counts spec changes only.
pub async fn status_is_written_separately(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("status");
    let mut with_status = group(&ns, "g");
    with_status.body.insert(
        "status".into(),
        json!({"activeSite": "iad", "topologyGeneration": 7}),
    );
    let g = written(&s, WriteOp::Create(with_status)).await.unwrap();
    assert_eq!(g.metadata.generation, 1);
    assert!(
        status_of(&g)
            .get("topologyGeneration")
            .is_none_or(|v| v != 7),
        "a create ignores the status: {}",
        status_of(&g)
    );
    let mut st = g.clone();
    st.body.insert(
        "status".into(),
        json!({"activeSite": "pdx", "topologyGeneration": 2}),
    );
    st.metadata
        .labels
        .insert("example.io/ignored".into(), "yes".into());
    let g2 = written(&s, WriteOp::ReplaceStatus(st)).await.unwrap();
    assert_eq!(status_of(&g2)["activeSite"], "pdx");
    assert!(
        !g2.metadata.labels.contains_key("example.io/ignored"),
        "a status write changes only the status"
    );
    assert_eq!(
        g2.metadata.generation, 1,
        "a status write is not a new generation"
    );
    let mut obj = g2.clone();
    obj.body
        .insert("status".into(), json!({"activeSite": "iad"}));
    obj.metadata
        .labels
        .insert("example.io/kept".into(), "yes".into());
    let g3 = written(&s, WriteOp::Replace(obj)).await.unwrap();
    assert_eq!(
        status_of(&g3)["activeSite"],
        "pdx",
        "a write of the object keeps the status"
    );
    assert_eq!(g3.metadata.labels["example.io/kept"], "yes");
    assert_eq!(
        g3.metadata.generation, 1,
        "metadata changes are not a new generation"
    );
    let mut spec = g3.clone();
    spec.body["spec"]["sites"][0]["priority"] = json!(5);
    let g4 = written(&s, WriteOp::Replace(spec)).await.unwrap();
    assert_eq!(g4.metadata.generation, 2, "a spec change is");
    let stale = s.apply(vec![WriteOp::ReplaceStatus(g3)]).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    let lease_status = s
        .apply(vec![WriteOp::ReplaceStatus(lease(&ns, "l", "x"))])
        .await;
    assert!(
        matches!(lease_status, Err(StoreError::Invalid { .. })),
        "{lease_status:?}"
    );
}

/// Deletes with and without a version precondition.
pub async fn deletes(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("delete");
    let l = written(&s, WriteOp::Create(lease(&ns, "l", "op-1")))
        .await
        .unwrap();
    let mut changed = l.clone();
    changed.body["spec"]["holderIdentity"] = json!("op-2");
    written(&s, WriteOp::Replace(changed)).await.unwrap();
    let stale = s
        .apply(vec![WriteOp::Delete {
            key: l.key(),
            resource_version: Some(rv(&l)),
        }])
        .await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    s.apply(vec![WriteOp::Delete {
        key: l.key(),
        resource_version: None,
    }])
    .await
    .unwrap();
    assert!(s.get(&l.key()).await.unwrap().is_none());
    let again = s
        .apply(vec![WriteOp::Delete {
            key: l.key(),
            resource_version: None,
        }])
        .await;
    assert!(
        matches!(again, Err(StoreError::NotFound { .. })),
        "{again:?}"
    );
    s.apply(vec![WriteOp::DeleteIfExists { key: l.key() }])
        .await
        .unwrap();
}

/// A batch stops at its first failure: nothing after it is applied; what came before may be.
pub async fn batches_stop_at_the_first_failure(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("batch");
    written(&s, WriteOp::Create(lease(&ns, "b", "op-b")))
        .await
        .unwrap();
    let r = s
        .apply(vec![
            WriteOp::Create(lease(&ns, "a", "op-a")),
            WriteOp::Create(lease(&ns, "b", "op-b")),
            WriteOp::Create(lease(&ns, "c", "op-c")),
        ])
        .await;
    match r {
        Err(StoreError::AlreadyExists { key }) => assert_eq!(key.name, "b"),
        other => panic!("{other:?}"),
    }
    let key = |n: &str| ObjectKey::new(KIND_LEASE, &ns, n);
    assert!(
        s.get(&key("c")).await.unwrap().is_none(),
        "nothing after the failure"
    );
    let a = s.get(&key("a")).await.unwrap();
    if s.transactional() {
        assert!(
            a.is_none(),
            "a transactional back-end applies nothing of a failed batch"
        );
    }
}

/// `Require`: on a transactional back-end, a batch applies only while the required object is
/// unchanged (a stale version fails with `Conflict` and applies nothing); elsewhere it is
/// refused, never pretended.
pub async fn requirements_hold_inside_a_transaction(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("require");
    let g = written(&s, WriteOp::Create(lease(&ns, "guard", "op-g")))
        .await
        .unwrap();
    let key = |n: &str| ObjectKey::new(KIND_LEASE, &ns, n);
    let require = |rv: String| WriteOp::Require {
        key: g.key(),
        resource_version: rv,
    };
    if !s.transactional() {
        let r = s
            .apply(vec![
                require(rv(&g)),
                WriteOp::Create(lease(&ns, "x", "op-x")),
            ])
            .await;
        assert!(matches!(r, Err(StoreError::Invalid { .. })), "{r:?}");
        assert!(s.get(&key("x")).await.unwrap().is_none());
        return;
    }
    let out = s
        .apply(vec![
            require(rv(&g)),
            WriteOp::Create(lease(&ns, "x", "op-x")),
        ])
        .await
        .unwrap();
    assert!(out[0].is_none(), "a requirement writes nothing");
    assert!(s.get(&key("x")).await.unwrap().is_some());
    let g2 = written(&s, WriteOp::Replace(g.clone())).await.unwrap();
    let r = s
        .apply(vec![
            require(rv(&g)),
            WriteOp::Create(lease(&ns, "y", "op-y")),
        ])
        .await;
    match r {
        Err(StoreError::Conflict { key: k, .. }) => assert_eq!(k, g.key()),
        other => panic!("{other:?}"),
    }
    assert!(s.get(&key("y")).await.unwrap().is_none(), "nothing applied");
    assert_eq!(
        rv(&s.get(&g.key()).await.unwrap().unwrap()),
        rv(&g2),
        "the required object is untouched"
    );
    let r = s
        .apply(vec![
            WriteOp::Require {
                key: key("missing"),
                resource_version: "1".into(),
            },
            WriteOp::Create(lease(&ns, "z", "op-z")),
        ])
        .await;
    assert!(matches!(r, Err(StoreError::NotFound { .. })), "{r:?}");
    assert!(s.get(&key("z")).await.unwrap().is_none());
}

/// Objects keep what Bloodraven writes into them: labels, annotations, the body.
pub async fn objects_round_trip(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("roundtrip");
    let l = written(&s, WriteOp::Create(lease(&ns, "l", "op-1")))
        .await
        .unwrap();
    let got = s.get(&l.key()).await.unwrap().unwrap();
    assert_eq!(
        got.metadata.labels["bloodraven.shipstream.io/deploy-lease"],
        "migration"
    );
    assert_eq!(got.metadata.annotations["example.io/record"], "{\"a\":1}");
    assert_eq!(got.body["spec"]["holderIdentity"], "op-1");
    assert_eq!(got.body["spec"]["leaseDurationSeconds"], 30);
    // Re-written as read (with whatever metadata the back-end added): accepted.
    written(&s, WriteOp::Replace(got)).await.unwrap();
}

/// Waits for the next change of `key` (skipping others), within `limit`.
async fn next_change(
    rx: &mut tokio::sync::broadcast::Receiver<WatchEvent>,
    key: &ObjectKey,
    limit: Duration,
) -> Option<WatchEvent> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv()).await.ok()?;
        match ev {
            Ok(e @ (WatchEvent::Put(_) | WatchEvent::Deleted(_))) => {
                let o = match &e {
                    WatchEvent::Put(o) | WatchEvent::Deleted(o) => o,
                    WatchEvent::Resync => unreachable!(),
                };
                if o.key() == *key {
                    return Some(e);
                }
            }
            Ok(WatchEvent::Resync) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return None,
        }
    }
}

/// The watch shows each object's changes in the order they were made, with their versions.
pub async fn watch_shows_each_objects_changes_in_order(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("watch");
    let mut rx = s.watch();
    let mut versions = Vec::new();
    let l = written(&s, WriteOp::Create(lease(&ns, "w", "op-0")))
        .await
        .unwrap();
    versions.push(rv(&l));
    let mut cur = l;
    for i in 1..4 {
        let mut next = cur.clone();
        next.body["spec"]["holderIdentity"] = json!(format!("op-{i}"));
        cur = written(&s, WriteOp::Replace(next)).await.unwrap();
        versions.push(rv(&cur));
        // Interleave another object's changes.
        written(&s, WriteOp::Create(lease(&ns, &format!("other-{i}"), "x")))
            .await
            .unwrap();
    }
    s.apply(vec![WriteOp::DeleteIfExists { key: cur.key() }])
        .await
        .unwrap();
    for (i, want) in versions.iter().enumerate() {
        match next_change(&mut rx, &cur.key(), Duration::from_secs(10)).await {
            Some(WatchEvent::Put(o)) => {
                assert_eq!(&rv(&o), want, "change {i} out of order");
                assert_eq!(o.body["spec"]["holderIdentity"], format!("op-{i}"));
            }
            other => panic!("change {i}: {other:?}"),
        }
    }
    match next_change(&mut rx, &cur.key(), Duration::from_secs(10)).await {
        Some(WatchEvent::Deleted(o)) => assert_eq!(o.metadata.name, "w"),
        other => panic!("the deletion: {other:?}"),
    }
}

/// A watch that missed changes says so (a re-list), then goes on.
pub async fn a_watch_that_missed_changes_asks_for_a_relist(b: &impl Backend) {
    let s = b.store();
    let ns = b.namespace("relist");
    let mut rx = s.watch();
    b.force_relist().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut relist = false;
    while !relist {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(WatchEvent::Resync) | Err(RecvError::Lagged(_))) => relist = true,
            Ok(Ok(_)) => {}
            Ok(Err(RecvError::Closed)) | Err(_) => panic!("no re-list asked for"),
        }
    }
    // The watch resumes once the store has listed again (when, it does not say: a change
    // made before its re-list is in the list, not in the watch). Within 15 s, a new change is
    // seen.
    for i in 0..15 {
        let l = written(&s, WriteOp::Create(lease(&ns, &format!("after-{i}"), "op")))
            .await
            .unwrap();
        if let Some(WatchEvent::Put(_)) =
            next_change(&mut rx, &l.key(), Duration::from_secs(1)).await
        {
            return;
        }
    }
    panic!("no change seen after the re-list");
}

/// One `#[tokio::test]` per case, for a back-end built by `$make` (an async expression),
/// with extra attributes on every test if given (`#[ignore = "…"]`).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr $(, #[$attr:meta])*) => {
        $crate::conformance_tests!(@case $make, [$(#[$attr])*];
            create_get_list,
            replace_is_compare_and_swap,
            status_is_written_separately,
            deletes,
            batches_stop_at_the_first_failure,
            requirements_hold_inside_a_transaction,
            objects_round_trip,
            watch_shows_each_objects_changes_in_order,
            a_watch_that_missed_changes_asks_for_a_relist
        );
    };
    (@case $make:expr, [$($attr:tt)*]; $case:ident $(, $rest:ident)*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $($attr)*
        async fn $case() {
            let backend = $make.await;
            $crate::store_conformance::$case(&backend).await;
        }
        $crate::conformance_tests!(@case $make, [$($attr)*]; $($rest),*);
    };
    (@case $make:expr, [$($attr:tt)*];) => {};
}
