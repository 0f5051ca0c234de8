//! The embedded back-end: one SQLite file in WAL mode.
//!
//! Tables: `objects` (current state, keyed by kind/namespace/name), `changes` (one row per
//! write, keyed by the store-wide resource version: the watch feed), `meta` (schema version and
//! the resource-version counter). Every [`Store::apply`] call is all or nothing. Watchers are
//! fed by a poller that reads `changes` after every local write and every 100 ms, so writes
//! made by another process on the same file are seen too.
//!
//! Group commit: batches that arrive while a commit is being made durable wait together, and
//! the next writer to take the connection applies all of them in one transaction, each inside
//! a savepoint of its own. A batch that fails (a conflict) rolls back to its savepoint alone
//! and gets its error; the others commit. One `fsync` then makes all of them durable, and only
//! then is any of them answered. Order is arrival order, so a batch sees every batch that was
//! answered before it was sent.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{Notify, broadcast};

use crate::{ObjectKey, RawObject, Store, StoreError, StoreFuture, WatchEvent, WriteOp, semantics};

const SCHEMA_VERSION: i64 = 1;
/// Change rows kept for watchers that reconnect; older rows are compacted away.
const CHANGES_KEPT: i64 = 10_000;

/// How hard a commit is pushed to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: a commit survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: survives a crash of the process (`kill -9`), not power loss.
    Normal,
    /// `synchronous=OFF`: for benchmarks only; an acknowledged write can be lost on power loss.
    Off,
}

/// A batch waiting for the next group commit, and where its result goes.
struct Queued {
    ops: Vec<WriteOp>,
    answer: tokio::sync::oneshot::Sender<Result<Vec<Option<RawObject>>, StoreError>>,
}

/// The most batches one transaction commits together.
const MAX_GROUP: usize = 256;

struct Inner {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Batches waiting for the connection (see the module's group commit).
    queued: Mutex<std::collections::VecDeque<Queued>>,
    /// Transactions committed by this handle's writes.
    commits: std::sync::atomic::AtomicU64,
    events: broadcast::Sender<WatchEvent>,
    /// The newest resource version already broadcast.
    seen: Mutex<i64>,
    wake: Notify,
}

/// The embedded store. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

fn backend(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError::Backend {
        operation,
        detail: e.to_string(),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`. Must be called inside a tokio runtime
    /// (the watch poller runs on it).
    pub fn open(path: &Path, durability: Durability) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Backend {
                operation: "create the data directory",
                detail: format!("{}: {e}", dir.display()),
            })?;
        }
        let conn = Connection::open(path).map_err(backend("open the database"))?;
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
            Durability::Off => "OFF",
        };
        conn.execute_batch(&format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA busy_timeout=10000;
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS objects (
               kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
               rv INTEGER NOT NULL, data TEXT NOT NULL,
               PRIMARY KEY (kind, namespace, name));
             CREATE TABLE IF NOT EXISTS changes (
               rv INTEGER PRIMARY KEY, kind TEXT NOT NULL, namespace TEXT NOT NULL,
               name TEXT NOT NULL, op TEXT NOT NULL, data TEXT NOT NULL);
             INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', {SCHEMA_VERSION});
             INSERT OR IGNORE INTO meta (key, value) VALUES ('rv', 0);"
        ))
        .map_err(backend("initialise the database"))?;
        let schema: i64 = conn
            .query_row("SELECT value FROM meta WHERE key='schema'", [], |r| {
                r.get(0)
            })
            .map_err(backend("read the schema version"))?;
        if schema != SCHEMA_VERSION {
            return Err(StoreError::Backend {
                operation: "open the database",
                detail: format!(
                    "{} has schema version {schema}, this build reads {SCHEMA_VERSION}",
                    path.display()
                ),
            });
        }
        let current: i64 = conn
            .query_row("SELECT value FROM meta WHERE key='rv'", [], |r| r.get(0))
            .map_err(backend("read the resource version"))?;
        let (events, _) = broadcast::channel(4096);
        let inner = Arc::new(Inner {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            queued: Mutex::new(std::collections::VecDeque::new()),
            commits: std::sync::atomic::AtomicU64::new(0),
            events,
            seen: Mutex::new(current),
            wake: Notify::new(),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(poll_changes(weak));
        Ok(SqliteStore { inner })
    }

    /// How many transactions this handle's writes have committed (batches committed
    /// together count once): with the number of batches, how much group commit joined.
    pub fn commits(&self) -> u64 {
        self.inner
            .commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Empties the change log: every watcher misses what it had not yet seen and is told to
    /// re-list ([`WatchEvent::Resync`]), as after an API server's compaction. The objects
    /// stay; only the history of their changes goes.
    pub async fn compact_change_log(&self) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        blocking(move || {
            let conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            // A version with no change row: watchers behind it see a gap, whatever they had
            // already read.
            conn.execute_batch(
                "BEGIN IMMEDIATE; DELETE FROM changes; UPDATE meta SET value = value + 1 WHERE key='rv'; COMMIT;",
            )
            .map_err(backend("compact the change log"))
        })
        .await?;
        self.inner.wake.notify_one();
        Ok(())
    }

    /// The store-wide resource version of the newest write.
    pub async fn resource_version(&self) -> Result<i64, StoreError> {
        let inner = self.inner.clone();
        blocking(move || {
            let conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            conn.query_row("SELECT value FROM meta WHERE key='rv'", [], |r| r.get(0))
                .map_err(backend("read the resource version"))
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend {
            operation: "run a database task",
            detail: e.to_string(),
        })?
}

fn decode_row(data: &str) -> Result<RawObject, StoreError> {
    serde_json::from_str(data).map_err(|e| StoreError::Backend {
        operation: "decode a stored object",
        detail: e.to_string(),
    })
}

fn encode(obj: &RawObject) -> Result<String, StoreError> {
    serde_json::to_string(obj).map_err(|e| StoreError::Invalid {
        reason: e.to_string(),
    })
}

fn load(tx: &Connection, key: &ObjectKey) -> Result<Option<RawObject>, StoreError> {
    let data: Option<String> = tx
        .query_row(
            "SELECT data FROM objects WHERE kind=?1 AND namespace=?2 AND name=?3",
            params![key.kind, key.namespace, key.name],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend("read an object"))?;
    data.as_deref().map(decode_row).transpose()
}

fn next_rv(tx: &Connection) -> Result<i64, StoreError> {
    tx.query_row(
        "UPDATE meta SET value = value + 1 WHERE key='rv' RETURNING value",
        [],
        |r| r.get(0),
    )
    .map_err(backend("allocate a resource version"))
}

fn record(tx: &Connection, rv: i64, obj: &RawObject, op: &str) -> Result<(), StoreError> {
    let data = encode(obj)?;
    let key = obj.key();
    tx.execute(
        "INSERT INTO changes (rv, kind, namespace, name, op, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![rv, key.kind, key.namespace, key.name, op, data],
    )
    .map_err(backend("record a change"))?;
    if op == "put" {
        tx.execute(
            "INSERT INTO objects (kind, namespace, name, rv, data) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (kind, namespace, name) DO UPDATE SET rv = excluded.rv, data = excluded.data",
            params![key.kind, key.namespace, key.name, rv, data],
        )
        .map_err(backend("write an object"))?;
    } else {
        tx.execute(
            "DELETE FROM objects WHERE kind=?1 AND namespace=?2 AND name=?3",
            params![key.kind, key.namespace, key.name],
        )
        .map_err(backend("delete an object"))?;
    }
    if rv % 1000 == 0 {
        tx.execute(
            "DELETE FROM changes WHERE rv < ?1",
            params![rv - CHANGES_KEPT],
        )
        .map_err(backend("compact the change log"))?;
    }
    Ok(())
}

/// Takes the connection, then commits every queued batch (up to [`MAX_GROUP`]) in one
/// transaction, each in its own savepoint, and answers them once the commit is durable. An
/// empty queue means another caller committed this caller's batch already.
fn commit_queued(inner: &Inner) {
    let mut conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
    let batch: Vec<Queued> = {
        let mut q = inner.queued.lock().unwrap_or_else(PoisonError::into_inner);
        let n = q.len().min(MAX_GROUP);
        q.drain(..n).collect()
    };
    if batch.is_empty() {
        return;
    }
    let (ops, answers): (Vec<_>, Vec<_>) = batch.into_iter().map(|q| (q.ops, q.answer)).unzip();
    let group = apply_group(&mut conn, ops);
    if group.is_ok() {
        inner
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let results = match group {
        Ok(results) => results,
        Err(e) => answers.iter().map(|_| Err(e.clone())).collect(),
    };
    for (r, a) in results.into_iter().zip(answers) {
        // The caller may have gone away; the batch is committed either way.
        let _ = a.send(r);
    }
}

type Applied = Result<Vec<Option<RawObject>>, StoreError>;

/// One transaction over every batch, a result per batch; the transaction's own failure
/// (begin or commit) fails all of them.
fn apply_group(
    conn: &mut Connection,
    batches: Vec<Vec<WriteOp>>,
) -> Result<Vec<Applied>, StoreError> {
    let mut tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend("begin a transaction"))?;
    let results = batches
        .into_iter()
        .map(|ops| apply_savepoint(&mut tx, ops))
        .collect();
    tx.commit().map_err(backend("commit"))?;
    Ok(results)
}

/// One batch inside the group's transaction: all of it, or (rolled back to its savepoint)
/// none of it.
fn apply_savepoint(
    tx: &mut rusqlite::Transaction<'_>,
    ops: Vec<WriteOp>,
) -> Result<Vec<Option<RawObject>>, StoreError> {
    let sp = tx.savepoint().map_err(backend("begin a savepoint"))?;
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        // Dropping the savepoint on an error rolls the batch back.
        out.push(apply_op(&sp, op)?);
    }
    sp.commit().map_err(backend("release a savepoint"))?;
    Ok(out)
}

/// The stored object at `key`, which a replace or a status write expects at
/// `resource_version`: `NotFound` without one, `Conflict` when it has moved on.
fn load_at(
    tx: &Connection,
    key: ObjectKey,
    resource_version: &str,
) -> Result<RawObject, StoreError> {
    let Some(current) = load(tx, &key)? else {
        return Err(StoreError::NotFound { key });
    };
    if resource_version != current.metadata.resource_version {
        return Err(StoreError::Conflict {
            key,
            expected: resource_version.to_string(),
            actual: current.metadata.resource_version,
        });
    }
    Ok(current)
}

fn apply_op(tx: &Connection, op: WriteOp) -> Result<Option<RawObject>, StoreError> {
    match op {
        WriteOp::Create(mut obj) => {
            semantics::validate(&obj)?;
            let key = obj.key();
            if load(tx, &key)?.is_some() {
                return Err(StoreError::AlreadyExists { key });
            }
            let rv = next_rv(tx)?;
            obj.metadata.resource_version = rv.to_string();
            semantics::on_create(&mut obj);
            record(tx, rv, &obj, "put")?;
            Ok(Some(obj))
        }
        WriteOp::Replace(mut obj) => {
            semantics::validate(&obj)?;
            let current = load_at(tx, obj.key(), &obj.metadata.resource_version)?;
            let rv = next_rv(tx)?;
            obj.metadata.resource_version = rv.to_string();
            semantics::on_replace(&mut obj, &current);
            record(tx, rv, &obj, "put")?;
            Ok(Some(obj))
        }
        WriteOp::ReplaceStatus(obj) => {
            let key = obj.key();
            semantics::check_status_write(&key)?;
            let mut current = load_at(tx, key, &obj.metadata.resource_version)?;
            let rv = next_rv(tx)?;
            current.metadata.resource_version = rv.to_string();
            semantics::on_status_write(&mut current, &obj);
            record(tx, rv, &current, "put")?;
            Ok(Some(current))
        }
        WriteOp::Delete {
            key,
            resource_version,
        } => {
            let Some(mut current) = load(tx, &key)? else {
                return Err(StoreError::NotFound { key });
            };
            if let Some(expected) = resource_version
                && expected != current.metadata.resource_version
            {
                return Err(StoreError::Conflict {
                    key,
                    expected,
                    actual: current.metadata.resource_version,
                });
            }
            let rv = next_rv(tx)?;
            current.metadata.resource_version = rv.to_string();
            record(tx, rv, &current, "delete")?;
            Ok(None)
        }
        WriteOp::DeleteIfExists { key } => {
            if let Some(mut current) = load(tx, &key)? {
                let rv = next_rv(tx)?;
                current.metadata.resource_version = rv.to_string();
                record(tx, rv, &current, "delete")?;
            }
            Ok(None)
        }
        WriteOp::Require {
            key,
            resource_version,
        } => {
            let Some(current) = load(tx, &key)? else {
                return Err(StoreError::NotFound { key });
            };
            if current.metadata.resource_version != resource_version {
                return Err(StoreError::Conflict {
                    key,
                    expected: resource_version,
                    actual: current.metadata.resource_version,
                });
            }
            Ok(None)
        }
    }
}

/// Change rows `(rv, op, data)` after a position, the oldest rv still in the log, and the
/// store's current rv.
type ChangeBatch = (Vec<(i64, String, String)>, i64, i64);

/// Feeds watchers from the change log: after local writes (woken) and every 100 ms (writes by
/// other processes). Ends when the store is dropped.
async fn poll_changes(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let _ = tokio::time::timeout(Duration::from_millis(100), inner.wake.notified()).await;
        if inner.events.receiver_count() == 0 {
            // Nobody listens: just remember where the log is.
            let inner2 = inner.clone();
            if let Ok(Ok(rv)) = tokio::task::spawn_blocking(move || {
                let conn = inner2.conn.lock().unwrap_or_else(PoisonError::into_inner);
                conn.query_row("SELECT value FROM meta WHERE key='rv'", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .await
            {
                *inner.seen.lock().unwrap_or_else(PoisonError::into_inner) = rv;
            }
            continue;
        }
        let since = *inner.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let inner2 = inner.clone();
        let rows = tokio::task::spawn_blocking(move || -> Result<ChangeBatch, rusqlite::Error> {
            let conn = inner2.conn.lock().unwrap_or_else(PoisonError::into_inner);
            let oldest: Option<i64> =
                conn.query_row("SELECT MIN(rv) FROM changes", [], |r| r.get(0))?;
            let mut stmt = conn.prepare_cached(
                "SELECT rv, op, data FROM changes WHERE rv > ?1 ORDER BY rv LIMIT 1000",
            )?;
            let rows = stmt
                .query_map(params![since], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            let current: i64 =
                conn.query_row("SELECT value FROM meta WHERE key='rv'", [], |r| r.get(0))?;
            Ok((rows, oldest.unwrap_or(0), current))
        })
        .await;
        let Ok(Ok((rows, oldest, current))) = rows else {
            continue;
        };
        let mut last = since;
        // Changes after our position are gone from the log (compacted): watchers re-list.
        let gap = (oldest > since + 1) || (oldest == 0 && rows.is_empty() && current > since);
        if gap {
            let _ = inner.events.send(WatchEvent::Resync);
            if rows.is_empty() {
                last = current;
            }
        }
        for (rv, op, data) in rows {
            last = rv;
            let Ok(obj) = decode_row(&data) else { continue };
            let ev = if op == "put" {
                WatchEvent::Put(obj)
            } else {
                WatchEvent::Deleted(obj)
            };
            let _ = inner.events.send(ev);
        }
        *inner.seen.lock().unwrap_or_else(PoisonError::into_inner) = last;
    }
}

impl Store for SqliteStore {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
        let inner = self.inner.clone();
        let key = key.clone();
        Box::pin(blocking(move || {
            let conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            load(&conn, &key)
        }))
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>> {
        let inner = self.inner.clone();
        let kind = kind.to_string();
        let namespace = namespace.map(str::to_string);
        Box::pin(blocking(move || {
            let conn = inner.conn.lock().unwrap_or_else(PoisonError::into_inner);
            let mut out = Vec::new();
            let mut push = |data: String| -> Result<(), StoreError> {
                out.push(decode_row(&data)?);
                Ok(())
            };
            if let Some(ns) = namespace {
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT data FROM objects WHERE kind=?1 AND namespace=?2 ORDER BY name",
                    )
                    .map_err(backend("list objects"))?;
                let rows = stmt
                    .query_map(params![kind, ns], |r| r.get::<_, String>(0))
                    .map_err(backend("list objects"))?;
                for r in rows {
                    push(r.map_err(backend("list objects"))?)?;
                }
            } else {
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT data FROM objects WHERE kind=?1 ORDER BY namespace, name",
                    )
                    .map_err(backend("list objects"))?;
                let rows = stmt
                    .query_map(params![kind], |r| r.get::<_, String>(0))
                    .map_err(backend("list objects"))?;
                for r in rows {
                    push(r.map_err(backend("list objects"))?)?;
                }
            }
            Ok(out)
        }))
    }

    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (answer, rx) = tokio::sync::oneshot::channel();
            inner
                .queued
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_back(Queued { ops, answer });
            // Whoever takes the connection next commits what is queued, this batch among it;
            // the task runs to its end even if this future is dropped.
            let committer = inner.clone();
            blocking(move || {
                commit_queued(&committer);
                Ok(())
            })
            .await?;
            let out = rx.await.unwrap_or_else(|_| {
                Err(StoreError::Unconfirmed {
                    operation: "commit a batch",
                    detail: "the task committing it stopped before answering".into(),
                })
            })?;
            inner.wake.notify_one();
            Ok(out)
        })
    }

    /// Each batch is all of it or nothing (its own savepoint in a `BEGIN IMMEDIATE`
    /// transaction).
    fn transactional(&self) -> bool {
        true
    }

    fn watch(&self) -> broadcast::Receiver<WatchEvent> {
        let rx = self.inner.events.subscribe();
        self.inner.wake.notify_one();
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreExt as _;
    use bloodraven_core::resources::ObjectMeta;

    fn object(name: &str) -> RawObject {
        RawObject::from_body(
            "v1",
            "ConfigMap",
            ObjectMeta::named("default", name),
            &serde_json::json!({"data": {"n": name}}),
        )
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_queued_behind_a_commit_share_one_transaction_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db"), Durability::Full).unwrap();
        let existing = store.create(object("taken")).await.unwrap();
        let before = store.commits();
        // A commit in flight: the connection is held (by a thread of its own).
        let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let inner = store.inner.clone();
        let holder = tokio::task::spawn_blocking(move || {
            let _held = inner.conn.lock().unwrap();
            locked_tx.send(()).unwrap();
            release_rx.recv().ok();
        });
        locked_rx.await.unwrap();
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    // Batch 7 conflicts (creates what exists) and must fail alone, its other
                    // write rolled back with it.
                    let ops = if i == 7 {
                        vec![
                            WriteOp::Create(object("from-the-failed-batch")),
                            WriteOp::Create(object("taken")),
                        ]
                    } else {
                        vec![WriteOp::Create(object(&format!("o{i}")))]
                    };
                    store.apply(ops).await
                })
            })
            .collect();
        while store.inner.queued.lock().unwrap().len() < 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        release_tx.send(()).unwrap();
        holder.await.unwrap();
        for (i, t) in tasks.into_iter().enumerate() {
            let r = t.await.unwrap();
            if i == 7 {
                assert!(matches!(r, Err(StoreError::AlreadyExists { .. })), "{r:?}");
            } else {
                assert_eq!(r.unwrap().len(), 1);
            }
        }
        assert_eq!(
            store.commits() - before,
            1,
            "twenty batches, one transaction"
        );
        let names: Vec<String> = store
            .list("ConfigMap", Some("default"))
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.metadata.name)
            .collect();
        assert_eq!(names.len(), 20, "{names:?}");
        assert!(!names.contains(&"from-the-failed-batch".to_string()));
        let taken = store
            .get(&ObjectKey::new("ConfigMap", "default", "taken"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            taken.metadata.resource_version,
            existing.metadata.resource_version
        );
        // Durable: another handle on the file reads all of them.
        let reopened = SqliteStore::open(&dir.path().join("s.db"), Durability::Full).unwrap();
        assert_eq!(reopened.list("ConfigMap", None).await.unwrap().len(), 20);
    }
}
