//! The fault-injecting store does what each rule says, to the calls it picks and no others.

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::resources::ObjectMeta;
use bloodraven_store::{
    Durability, ObjectKey, RawObject, SqliteStore, Store, StoreError, StoreExt, WriteOp,
};
use bloodraven_testkit::faults::{Fault, Faults, When};
use serde_json::json;

fn obj(kind: &str, name: &str, value: i64) -> RawObject {
    let mut o = RawObject::from_body(
        "example.io/v1",
        kind,
        ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..ObjectMeta::default()
        },
        &json!({"spec": {"value": value}}),
    )
    .unwrap();
    o.metadata.resource_version.clear();
    o
}

fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&dir.path().join("s.db"), Durability::Full).unwrap())
}

/// A SQLite store behind faults (no rule yet) holding one object, Thing `a` of value 1.
async fn thing_a_stored() -> (tempfile::TempDir, Arc<Faults>, Arc<dyn Store>, RawObject) {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::new();
    let store = faults.over(sqlite(&dir));
    let created = store.create(obj("Thing", "a", 1)).await.unwrap();
    (dir, faults, store, created)
}

#[tokio::test]
async fn a_gate_holds_the_writes_it_picks_until_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::new();
    let (gate, fault) = Fault::gate();
    faults.on(When::kind("Held"), fault);
    let store = faults.over(sqlite(&dir));
    gate.send_replace(true);
    // Another kind passes.
    store.create(obj("Free", "a", 1)).await.unwrap();
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.create(obj("Held", "b", 1)).await })
    };
    for _ in 0..200 {
        if faults.held() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(faults.held(), 1);
    assert!(!held.is_finished());
    assert!(
        store
            .get(&ObjectKey::new("Held", "default", "b"))
            .await
            .unwrap()
            .is_none()
    );
    gate.send_replace(false);
    held.await.unwrap().unwrap();
    let kinds: Vec<String> = faults.written().into_iter().map(|o| o.kind).collect();
    assert_eq!(kinds, ["Free", "Held"], "every write is recorded, in order");
}

#[tokio::test(start_paused = true)]
async fn a_delay_waits_and_a_stall_never_returns() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::new();
    faults.on(When::kind("Slow"), Fault::Delay(Duration::from_secs(2)));
    faults.on(When::kind("Stuck"), Fault::Stall);
    let store = faults.over(sqlite(&dir));
    let started = tokio::time::Instant::now();
    store.create(obj("Slow", "a", 1)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    let stuck = tokio::time::timeout(
        Duration::from_secs(3600),
        store.create(obj("Stuck", "b", 1)),
    );
    assert!(stuck.await.is_err(), "a stalled write never completes");
    assert_eq!(faults.held(), 2);
}

#[tokio::test]
async fn a_counted_race_makes_exactly_that_many_writes_conflict() {
    let (_dir, faults, store, created) = thing_a_stored().await;
    faults.first(
        2,
        When::write(|op| matches!(op, WriteOp::Replace(_))),
        Fault::RaceFirst(Arc::new(|o: &mut RawObject| {
            o.body.insert("spec".into(), json!({"value": 99}));
        })),
    );
    let mut mine = created.clone();
    mine.body.insert("spec".into(), json!({"value": 2}));
    for _ in 0..2 {
        let err = store.replace(mine.clone()).await.unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
        mine = store.get(&created.key()).await.unwrap().unwrap();
        assert_eq!(mine.body["spec"]["value"], 99, "the other writer won");
        mine.body.insert("spec".into(), json!({"value": 2}));
    }
    let written = store.replace(mine).await.unwrap();
    assert_eq!(
        written.body["spec"]["value"], 2,
        "the third write is not raced"
    );
}

#[tokio::test]
async fn a_rule_can_judge_a_write_against_the_stored_object_and_a_list_can_be_gated() {
    let (_dir, faults, store, created) = thing_a_stored().await;
    // Only a write that lowers the value is stalled.
    faults.on(
        When::against_stored(|w| match (w.op, w.stored) {
            (WriteOp::Replace(o), Some(s)) => o.body["spec"]["value"]
                .as_i64()
                .zip(s.body["spec"]["value"].as_i64())
                .is_some_and(|(new, old)| new < old),
            _ => false,
        }),
        Fault::Stall,
    );
    let mut up = created.clone();
    up.body.insert("spec".into(), json!({"value": 5}));
    let up = store.replace(up).await.unwrap();
    let mut down = up.clone();
    down.body.insert("spec".into(), json!({"value": 0}));
    let lowered = tokio::time::timeout(Duration::from_millis(300), store.replace(down)).await;
    assert!(lowered.is_err(), "the lowering write is stalled");
    let (gate, fault) = Fault::gate();
    faults.clear();
    faults.on(When::list("Thing"), fault);
    gate.send_replace(true);
    let listed = tokio::time::timeout(Duration::from_millis(300), store.list("Thing", None)).await;
    assert!(listed.is_err(), "the list waits at the gate");
    assert_eq!(store.list("Other", None).await.unwrap().len(), 0);
    gate.send_replace(false);
    assert_eq!(store.list("Thing", None).await.unwrap().len(), 1);
}
