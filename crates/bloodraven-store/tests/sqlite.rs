//! The embedded store: Kubernetes semantics over SQLite.

use std::time::Duration;

use bloodraven_core::resources::ObjectMeta;
use bloodraven_store::{
    Durability, ObjectKey, RawObject, SqliteStore, Store, StoreError, StoreExt, WatchEvent, WriteOp,
};
use bloodraven_testkit::faults::{Fault, Faults, When};
use serde_json::json;

fn obj(name: &str, value: i64) -> RawObject {
    RawObject::from_body(
        "v1",
        "Thing",
        ObjectMeta::named("default", name),
        &json!({"spec": {"value": value}, "status": {"seen": 0}}),
    )
    .unwrap()
}

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("store.db"), Durability::Full).unwrap()
}

#[tokio::test]
async fn create_get_list_replace_delete() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let a = s.create(obj("a", 1)).await.unwrap();
    assert!(!a.metadata.uid.is_empty());
    assert_eq!(a.metadata.generation, 1);
    let rv1: i64 = a.metadata.resource_version.parse().unwrap();
    assert!(matches!(
        s.create(obj("a", 2)).await,
        Err(StoreError::AlreadyExists { .. })
    ));
    s.create(obj("b", 1)).await.unwrap();
    let got = s.get(&a.key()).await.unwrap().unwrap();
    assert_eq!(got, a);
    assert_eq!(s.list("Thing", Some("default")).await.unwrap().len(), 2);
    assert_eq!(s.list("Thing", None).await.unwrap().len(), 2);
    assert!(s.list("Thing", Some("other")).await.unwrap().is_empty());

    // Status-only change keeps the generation; a spec change bumps it.
    let mut b = got.clone();
    b.body.insert("status".into(), json!({"seen": 5}));
    let b = s.replace(b).await.unwrap();
    assert_eq!(b.metadata.generation, 1);
    assert!(b.metadata.resource_version.parse::<i64>().unwrap() > rv1);
    assert_eq!(b.metadata.uid, a.metadata.uid);
    let mut c = b.clone();
    c.body.insert("spec".into(), json!({"value": 9}));
    let c = s.replace(c).await.unwrap();
    assert_eq!(c.metadata.generation, 2);

    // Compare-and-swap: a stale resourceVersion is refused and changes nothing.
    let err = s.replace(b.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert_eq!(s.get(&a.key()).await.unwrap().unwrap(), c);
    let err = s
        .delete(a.key(), Some(b.metadata.resource_version.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }));
    s.delete(a.key(), Some(c.metadata.resource_version.clone()))
        .await
        .unwrap();
    assert!(s.get(&a.key()).await.unwrap().is_none());
    assert!(matches!(
        s.delete(a.key(), None).await,
        Err(StoreError::NotFound { .. })
    ));
    s.apply(vec![WriteOp::DeleteIfExists { key: a.key() }])
        .await
        .unwrap();
}

#[tokio::test]
async fn apply_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.create(obj("exists", 1)).await.unwrap();
    let err = s
        .apply(vec![
            WriteOp::Create(obj("new", 1)),
            WriteOp::Create(obj("exists", 2)),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }));
    assert!(
        s.get(&ObjectKey::new("Thing", "default", "new"))
            .await
            .unwrap()
            .is_none()
    );
    let out = s
        .apply(vec![
            WriteOp::Create(obj("new", 1)),
            WriteOp::Delete {
                key: ObjectKey::new("Thing", "default", "exists"),
                resource_version: None,
            },
        ])
        .await
        .unwrap();
    assert!(out[0].is_some() && out[1].is_none());
    assert_eq!(s.list("Thing", None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn acknowledged_writes_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let s = open(&dir);
        let mut last = None;
        for i in 0..50 {
            last = Some(s.create(obj(&format!("o{i}"), i)).await.unwrap());
        }
        last.unwrap()
    };
    let s = open(&dir);
    assert_eq!(s.list("Thing", None).await.unwrap().len(), 50);
    assert_eq!(s.get(&written.key()).await.unwrap().unwrap(), written);
    // Resource versions keep increasing after a reopen.
    let next = s.create(obj("after", 0)).await.unwrap();
    assert!(
        next.metadata.resource_version.parse::<i64>().unwrap()
            > written.metadata.resource_version.parse::<i64>().unwrap()
    );
}

async fn next_event(rx: &mut tokio::sync::broadcast::Receiver<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("event in time")
        .unwrap()
}

#[tokio::test]
async fn watch_sees_every_change_in_order_including_other_handles() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let mut rx = s.watch();
    let a = s.create(obj("a", 1)).await.unwrap();
    match next_event(&mut rx).await {
        WatchEvent::Put(o) => assert_eq!(o, a),
        other => panic!("{other:?}"),
    }
    // A second handle on the same file (as the CLI is, in another process) writes.
    let other = open(&dir);
    let mut a2 = other.get(&a.key()).await.unwrap().unwrap();
    a2.metadata.annotations.insert("x".into(), "y".into());
    let a2 = other.replace(a2).await.unwrap();
    match next_event(&mut rx).await {
        WatchEvent::Put(o) => assert_eq!(
            o.metadata.annotations.get("x").map(String::as_str),
            Some("y")
        ),
        other => panic!("{other:?}"),
    }
    other.delete(a.key(), None).await.unwrap();
    match next_event(&mut rx).await {
        WatchEvent::Deleted(o) => {
            assert_eq!(o.key(), a.key());
            assert!(
                o.metadata.resource_version.parse::<i64>().unwrap()
                    > a2.metadata.resource_version.parse::<i64>().unwrap()
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn invalid_objects_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let mut o = obj("x", 1);
    o.metadata.name.clear();
    assert!(matches!(s.create(o).await, Err(StoreError::Invalid { .. })));
    assert!(matches!(
        s.replace(obj("missing", 1)).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// `inner`, whose first `races` replaces each lose a race: before it applies, another writer
/// bumps the same object (as the operator's status writes do).
fn racing(inner: SqliteStore, races: usize) -> std::sync::Arc<dyn Store> {
    let faults = Faults::new();
    faults.first(
        races,
        When::write(|op| matches!(op, WriteOp::Replace(_))),
        Fault::RaceFirst(std::sync::Arc::new(|theirs: &mut RawObject| {
            let seen = theirs.body["status"]["seen"].as_i64().unwrap();
            theirs
                .body
                .insert("status".into(), json!({"seen": seen + 1}));
        })),
    );
    faults.over(std::sync::Arc::new(inner))
}

#[tokio::test]
async fn set_annotation_retries_lost_races_and_keeps_the_other_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = racing(open(&dir), 3);
    s.create(obj("g", 1)).await.unwrap();
    let key = ObjectKey::new("Thing", "default", "g");
    let written = bloodraven_store::set_annotation(&*s, &key, "example.io/request", "now")
        .await
        .unwrap();
    assert_eq!(written.metadata.annotations["example.io/request"], "now");
    assert_eq!(
        written.body["status"]["seen"], 3,
        "the racing writes survive"
    );
    let stored = s.get(&key).await.unwrap().unwrap();
    assert_eq!(stored, written);
}

#[tokio::test]
async fn set_annotation_that_always_loses_writes_nothing_and_says_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let s = racing(open(&dir), usize::MAX);
    s.create(obj("g", 1)).await.unwrap();
    let key = ObjectKey::new("Thing", "default", "g");
    let err = bloodraven_store::set_annotation(&*s, &key, "example.io/request", "now")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    let stored = s.get(&key).await.unwrap().unwrap();
    assert!(stored.metadata.annotations.is_empty());
    assert_eq!(
        stored.body["status"]["seen"],
        i64::from(bloodraven_store::ANNOTATE_ATTEMPTS)
    );
    let missing = ObjectKey::new("Thing", "default", "absent");
    assert!(matches!(
        bloodraven_store::set_annotation(&*s, &missing, "example.io/request", "now").await,
        Err(StoreError::NotFound { .. })
    ));
}
