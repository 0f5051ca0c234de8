//! [`EtcdStore`]: the store contract of `bloodraven_store` on etcd v3, kept exactly as the
//! embedded SQLite back-end keeps it.
//!
//! - **Keys**: an object is the JSON of its [`RawObject`] at `<prefix><kind>/<namespace>/<name>`
//!   (none of the three may contain `/`), so the objects of a kind in a namespace, and of a
//!   kind in every namespace, are each one prefix: one range read.
//! - **`resourceVersion`** is the key's `mod_revision`, as a decimal string. It is not stored in
//!   the value; reads and watch events set it from the key.
//! - **A batch is one transaction.** Its ops are first played against what the store holds
//!   (read in one consistent range of the keys it touches, only when a replace needs the
//!   stored object), exactly as SQLite applies them; the transaction then compares every
//!   key the batch read (`create_revision == 0` for a create, `mod_revision == rv` for a
//!   compare-and-swap, a requirement or a delete with a version, `create_revision > 0` for a
//!   delete without one) and writes each key's final state. When a compare fails, nothing is
//!   applied; the failure branch reads the keys in the same transaction and the batch is
//!   played again against them: the first op that fails there is the error, as SQLite would
//!   report it.
//! - **Guarded** ([`EtcdStore::guarded`]): every write transaction also compares the leader
//!   key's `create_revision` with the fencing token of the term it was given, so a leader
//!   that lost its key (paused, cut off, replaced) has its writes refused inside etcd.
//! - **Watch**: one etcd watch on the prefix from the store's revision at connect, with deletions
//!   carrying the object as it was. A broken stream is re-established from the next revision
//!   (nothing is missed, so no re-list is asked for); a start revision below etcd's compaction
//!   makes the store emit [`WatchEvent::Resync`] and watch on from the current revision.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bloodraven_store::{
    ObjectKey, RawObject, Store, StoreError, StoreFuture, WatchEvent, WriteOp, semantics,
};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::client::{
    Compare, EtcdClient, EtcdError, Failure, KeyValue, RangeRequest, TxnOp, TxnOpResponse,
    TxnRequest, WatchRequest, WatchStream, WatchedEvent,
};

/// Events kept for a watcher that is slow to read (then it lags and re-lists).
const WATCH_BUFFER: usize = 4096;
/// A watch that has said nothing for this long has its member asked whether it still serves
/// (a paused member keeps the connection open and says nothing).
const WATCH_IDLE: Duration = Duration::from_secs(5);
/// The bound on that question.
const WATCH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pauses between attempts to re-establish a watch: from the first to the last, doubling.
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_LAST: Duration = Duration::from_secs(2);
/// How many times a batch is played again after its transaction's compares failed while the
/// objects read back satisfied them (a key changed and changed back between the two).
const APPLY_ATTEMPTS: usize = 3;

/// The leader key and the revision that created it: writes pass only while it is unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub leader_key: String,
    pub create_revision: i64,
}

struct Shared {
    client: EtcdClient,
    prefix: String,
    events: broadcast::Sender<WatchEvent>,
    refused_guarded: AtomicU64,
    watcher: JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Where a guarded view's fencing token comes from.
#[derive(Clone)]
enum GuardSource {
    /// One term's token ([`EtcdStore::guarded`]).
    Fixed(Guard),
    /// The token of whatever term holds now ([`EtcdStore::guarded_by`]); `None`: no term.
    Current {
        leader_key: String,
        token: Arc<dyn Fn() -> Option<i64> + Send + Sync>,
    },
}

impl fmt::Debug for GuardSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardSource::Fixed(g) => g.fmt(f),
            GuardSource::Current { leader_key, .. } => f
                .debug_struct("Current")
                .field("leader_key", leader_key)
                .finish_non_exhaustive(),
        }
    }
}

/// The store on etcd. Cheap to clone; clones (and guarded views) share one watch.
#[derive(Clone)]
pub struct EtcdStore {
    shared: Arc<Shared>,
    guard: Option<GuardSource>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.shared.prefix)
            .field("client", &self.shared.client)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

fn backend(operation: &'static str) -> impl Fn(EtcdError) -> StoreError {
    move |e| StoreError::Backend {
        operation,
        detail: e.to_string(),
    }
}

/// A write's error: a lost answer stays a lost answer.
#[allow(clippy::needless_pass_by_value)] // used as `map_err(write_error)`
fn write_error(e: EtcdError) -> StoreError {
    if e.is_unconfirmed() {
        StoreError::Unconfirmed {
            operation: "apply a batch",
            detail: e.to_string(),
        }
    } else {
        StoreError::Backend {
            operation: "apply a batch",
            detail: e.to_string(),
        }
    }
}

/// What a key holds: the object, with its `resourceVersion` set from the key.
#[derive(Clone, Debug)]
struct Stored {
    obj: RawObject,
    mod_revision: i64,
}

fn decode(kv: &KeyValue) -> Result<Stored, StoreError> {
    let mut obj: RawObject =
        serde_json::from_slice(&kv.value).map_err(|e| StoreError::Backend {
            operation: "decode a stored object",
            detail: format!("{}: {e}", String::from_utf8_lossy(&kv.key)),
        })?;
    obj.metadata.resource_version = kv.mod_revision.to_string();
    Ok(Stored {
        obj,
        mod_revision: kv.mod_revision,
    })
}

fn encode(obj: &RawObject) -> Result<Vec<u8>, StoreError> {
    let mut stored = obj.clone();
    // The version is the key's; it is never part of the value.
    stored.metadata.resource_version.clear();
    serde_json::to_vec(&stored).map_err(|e| StoreError::Invalid {
        reason: e.to_string(),
    })
}

fn check_key(key: &ObjectKey) -> Result<(), StoreError> {
    if key.kind.is_empty() || key.name.is_empty() {
        return Err(StoreError::Invalid {
            reason: format!("{key}: an object needs a kind and a name"),
        });
    }
    if [&key.kind, &key.namespace, &key.name]
        .iter()
        .any(|s| s.contains('/'))
    {
        return Err(StoreError::Invalid {
            reason: format!("{key}: a kind, namespace or name with '/' has no etcd key"),
        });
    }
    Ok(())
}

/// The rv a caller passes, as a revision: an rv this store never wrote matches nothing.
fn revision_of(rv: &str) -> Option<i64> {
    rv.parse().ok().filter(|r| *r > 0)
}

/// What a batch does once its compares hold.
#[derive(Debug)]
struct Plan {
    compares: Vec<Compare>,
    /// Each key's final state: `Some(value)` written, `None` deleted.
    writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Per op, the object as written (without its version, which is the transaction's).
    outputs: Vec<Option<RawObject>>,
}

/// Why a batch cannot be planned.
#[derive(Debug)]
enum Unplanned {
    /// The op that fails, as SQLite reports it.
    Fails(StoreError),
    /// An op needs what the store holds: read the keys first.
    NeedsRead,
}

impl From<StoreError> for Unplanned {
    fn from(e: StoreError) -> Self {
        Unplanned::Fails(e)
    }
}

/// What an op sees of its key.
enum View<'a> {
    /// Not read: the op's precondition is assumed and compared in the transaction.
    Assumed,
    /// As read, before the batch: what the op relies on is compared in the transaction.
    Read(Option<&'a Stored>),
    /// As an earlier op of the batch left it.
    Batch(Option<&'a RawObject>),
}

/// Plays `ops` in order against `read` (every key the batch touches, when given) or against
/// their assumed preconditions, as the embedded back-end applies a batch.
fn plan(
    prefix: &str,
    ops: &[WriteOp],
    read: Option<&BTreeMap<String, Option<Stored>>>,
) -> Result<Plan, Unplanned> {
    let mut compares = Vec::new();
    let mut batch: BTreeMap<String, Option<RawObject>> = BTreeMap::new();
    let mut outputs = Vec::with_capacity(ops.len());
    for op in ops {
        let key = op.key();
        check_key(&key)?;
        let k = object_key(prefix, &key);
        let view = match (batch.get(&k), read) {
            (Some(b), _) => View::Batch(b.as_ref()),
            (None, Some(r)) => View::Read(r.get(&k).and_then(Option::as_ref)),
            (None, None) => View::Assumed,
        };
        match op {
            WriteOp::Create(obj) => {
                semantics::validate(obj)?;
                match view {
                    View::Read(Some(_)) | View::Batch(Some(_)) => {
                        return Err(StoreError::AlreadyExists { key }.into());
                    }
                    View::Assumed | View::Read(None) => compares.push(Compare::absent(k.clone())),
                    View::Batch(None) => {}
                }
                let mut obj = obj.clone();
                obj.metadata.resource_version.clear();
                semantics::on_create(&mut obj);
                batch.insert(k, Some(obj.clone()));
                outputs.push(Some(obj));
            }
            WriteOp::Replace(obj) => {
                semantics::validate(obj)?;
                let rv = &obj.metadata.resource_version;
                let current = current_for_swap(&view, &key, rv, &k, &mut compares)?;
                let mut obj = obj.clone();
                obj.metadata.resource_version.clear();
                semantics::on_replace(&mut obj, &current);
                batch.insert(k, Some(obj.clone()));
                outputs.push(Some(obj));
            }
            WriteOp::ReplaceStatus(obj) => {
                semantics::check_status_write(&key)?;
                let rv = &obj.metadata.resource_version;
                let mut current = current_for_swap(&view, &key, rv, &k, &mut compares)?;
                current.metadata.resource_version.clear();
                semantics::on_status_write(&mut current, obj);
                batch.insert(k, Some(current.clone()));
                outputs.push(Some(current));
            }
            WriteOp::Delete {
                resource_version, ..
            } => {
                delete_compares(view, key, resource_version.as_deref(), &k, &mut compares)?;
                batch.insert(k, None);
                outputs.push(None);
            }
            WriteOp::DeleteIfExists { .. } => {
                batch.insert(k, None);
                outputs.push(None);
            }
            WriteOp::Require {
                resource_version, ..
            } => {
                delete_compares(view, key, Some(resource_version), &k, &mut compares)?;
                outputs.push(None);
            }
        }
    }
    let writes = batch
        .into_iter()
        .map(|(k, v)| Ok((k, v.as_ref().map(encode).transpose()?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(Plan {
        compares,
        writes,
        outputs,
    })
}

/// The transaction's write of one key: its encoded object, or its deletion.
fn write_op(k: &str, v: Option<&[u8]>) -> TxnOp {
    match v {
        Some(value) => TxnOp::Put {
            key: k.as_bytes().to_vec(),
            value: value.to_vec(),
            lease: 0,
        },
        None => TxnOp::Delete {
            key: k.as_bytes().to_vec(),
            range_end: Vec::new(),
        },
    }
}

/// The batch's outputs, each at the transaction's revision.
fn at_revision(outputs: Vec<Option<RawObject>>, revision: i64) -> Vec<Option<RawObject>> {
    let rv = revision.to_string();
    outputs
        .into_iter()
        .map(|o| {
            o.map(|mut o| {
                o.metadata.resource_version.clone_from(&rv);
                o
            })
        })
        .collect()
}

/// What a delete (or a `Require`, which is a delete's precondition without the delete) of
/// `key` at version `rv` (any version: `None`) compares in the transaction; refused when the
/// view shows it cannot hold.
fn delete_compares(
    view: View<'_>,
    key: ObjectKey,
    rv: Option<&str>,
    k: &str,
    compares: &mut Vec<Compare>,
) -> Result<(), Unplanned> {
    match (view, rv) {
        (View::Read(None) | View::Batch(None), _) => Err(StoreError::NotFound { key }.into()),
        (View::Assumed | View::Read(Some(_)), None) => {
            compares.push(Compare::present(k.to_string()));
            Ok(())
        }
        (View::Assumed, Some(rv)) => assumed_at(rv, k, compares),
        (View::Read(Some(s)), Some(rv)) => read_at(s, &key, rv, k, compares),
        (View::Batch(Some(_)), None) => Ok(()),
        (View::Batch(Some(_)), Some(rv)) => Err(written_in_batch(key, rv).into()),
    }
}

/// A version can never match an object written earlier in the same batch (its version is
/// the batch's, which no caller holds yet).
fn written_in_batch(key: ObjectKey, expected: &str) -> StoreError {
    StoreError::Conflict {
        key,
        expected: expected.to_string(),
        actual: "(written earlier in this batch)".into(),
    }
}

/// A write at `rv` of an object read in this batch: it holds only if the object is still
/// at the revision read (its compare recorded); a different `rv` is a conflict at once.
fn read_at(
    s: &Stored,
    key: &ObjectKey,
    rv: &str,
    k: &str,
    compares: &mut Vec<Compare>,
) -> Result<(), Unplanned> {
    if rv != s.obj.metadata.resource_version {
        return Err(StoreError::Conflict {
            key: key.clone(),
            expected: rv.to_string(),
            actual: s.obj.metadata.resource_version.clone(),
        }
        .into());
    }
    compares.push(Compare::modified_at(k.to_string(), s.mod_revision));
    Ok(())
}

/// A write at `rv` of an object not read: its compare is `rv` itself, when `rv` is a revision
/// (otherwise the object must be read first).
fn assumed_at(rv: &str, k: &str, compares: &mut Vec<Compare>) -> Result<(), Unplanned> {
    let r = revision_of(rv).ok_or(Unplanned::NeedsRead)?;
    compares.push(Compare::modified_at(k.to_string(), r));
    Ok(())
}

/// The stored object a compare-and-swap at `rv` replaces, recording its compare.
fn current_for_swap(
    view: &View<'_>,
    key: &ObjectKey,
    rv: &str,
    k: &str,
    compares: &mut Vec<Compare>,
) -> Result<RawObject, Unplanned> {
    match *view {
        View::Assumed => Err(Unplanned::NeedsRead),
        View::Read(None) | View::Batch(None) => {
            Err(StoreError::NotFound { key: key.clone() }.into())
        }
        View::Read(Some(s)) => {
            read_at(s, key, rv, k, compares)?;
            Ok(s.obj.clone())
        }
        View::Batch(Some(_)) => Err(written_in_batch(key.clone(), rv).into()),
    }
}

/// `<prefix><kind>/<namespace>/<name>`.
fn object_key(prefix: &str, key: &ObjectKey) -> String {
    format!("{prefix}{}/{}/{}", key.kind, key.namespace, key.name)
}

/// The object key an etcd key stands for; `None` for keys under the prefix that are not
/// objects (the leader key).
fn parse_key(prefix: &str, key: &[u8]) -> Option<ObjectKey> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
    let mut parts = rest.split('/');
    let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || kind.is_empty() || name.is_empty() {
        return None;
    }
    Some(ObjectKey::new(kind, namespace, name))
}

impl EtcdStore {
    /// The store under `prefix` (which must end with `/`), watching from its current
    /// revision. Must be called inside a tokio runtime (the watch runs on it).
    pub async fn connect(client: EtcdClient, prefix: &str) -> Result<EtcdStore, StoreError> {
        if !prefix.ends_with('/') {
            return Err(StoreError::Invalid {
                reason: format!("the etcd prefix {prefix:?} must end with '/'"),
            });
        }
        let head = client
            .range(&RangeRequest {
                count_only: true,
                ..RangeRequest::prefix(prefix)
            })
            .await
            .map_err(backend("read the store's revision"))?;
        let (events, _) = broadcast::channel(WATCH_BUFFER);
        let watcher = tokio::spawn(watch_loop(
            client.clone(),
            prefix.to_string(),
            events.clone(),
            head.revision + 1,
        ));
        Ok(EtcdStore {
            shared: Arc::new(Shared {
                client,
                prefix: prefix.to_string(),
                events,
                refused_guarded: AtomicU64::new(0),
                watcher,
            }),
            guard: None,
        })
    }

    /// The same store, whose every write also requires `leader_key` to be the key created at
    /// `create_revision` (the fencing token of a leadership term). A write refused for that
    /// fails with `StoreError::Backend { operation: "write as the leader", .. }` and applies
    /// nothing.
    #[must_use]
    pub fn guarded(&self, leader_key: &str, create_revision: i64) -> EtcdStore {
        EtcdStore {
            shared: self.shared.clone(),
            guard: Some(GuardSource::Fixed(Guard {
                leader_key: leader_key.to_string(),
                create_revision,
            })),
        }
    }

    /// The same store, whose every write requires `leader_key` to be the key of the term
    /// `token` names when the write is sent (a process's leadership, term after term). While
    /// `token` names none, writes fail with `StoreError::Backend { operation: "write as the
    /// leader", .. }` and nothing is sent.
    #[must_use]
    pub fn guarded_by(
        &self,
        leader_key: &str,
        token: Arc<dyn Fn() -> Option<i64> + Send + Sync>,
    ) -> EtcdStore {
        EtcdStore {
            shared: self.shared.clone(),
            guard: Some(GuardSource::Current {
                leader_key: leader_key.to_string(),
                token,
            }),
        }
    }

    /// The guard a write sent now carries; `Err` when the view is guarded by a term and none
    /// holds.
    pub fn guard(&self) -> Result<Option<Guard>, StoreError> {
        match &self.guard {
            None => Ok(None),
            Some(GuardSource::Fixed(g)) => Ok(Some(g.clone())),
            Some(GuardSource::Current { leader_key, token }) => match token() {
                Some(create_revision) => Ok(Some(Guard {
                    leader_key: leader_key.clone(),
                    create_revision,
                })),
                None => Err(StoreError::Backend {
                    operation: "write as the leader",
                    detail: format!(
                        "this process holds no term of {leader_key} now; nothing was written"
                    ),
                }),
            },
        }
    }

    /// Guarded writes etcd refused because the leader key had changed (every view of this
    /// store counts into one counter).
    pub fn refused_guarded_writes(&self) -> u64 {
        self.shared.refused_guarded.load(Ordering::Relaxed)
    }

    pub fn client(&self) -> &EtcdClient {
        &self.shared.client
    }

    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The etcd key of an object.
    pub fn key_of(&self, key: &ObjectKey) -> String {
        object_key(&self.shared.prefix, key)
    }

    /// Reads every key of `keys` in one transaction (one consistent revision).
    async fn read(&self, keys: &[String]) -> Result<BTreeMap<String, Option<Stored>>, StoreError> {
        let txn = TxnRequest {
            compare: Vec::new(),
            success: keys
                .iter()
                .map(|k| TxnOp::Range(RangeRequest::key(k.as_bytes())))
                .collect(),
            failure: Vec::new(),
        };
        let resp = self
            .shared
            .client
            .txn(&txn)
            .await
            .map_err(backend("read the objects of a batch"))?;
        read_back(keys, &resp.responses)
    }

    fn guard_error(&self, guard: &Guard, found: Option<&KeyValue>) -> StoreError {
        self.shared.refused_guarded.fetch_add(1, Ordering::Relaxed);
        let now = match found {
            Some(kv) => format!(
                "created at revision {}, held by {:?}",
                kv.create_revision,
                String::from_utf8_lossy(&kv.value)
            ),
            None => "absent".into(),
        };
        tracing::warn!(leader_key = %guard.leader_key, token = guard.create_revision, now = %now, "a write as the leader was refused: the leader key changed");
        StoreError::Backend {
            operation: "write as the leader",
            detail: format!(
                "{} is no longer the key created at revision {} (now {now}): this process \
                 no longer leads; nothing was written",
                guard.leader_key, guard.create_revision
            ),
        }
    }

    async fn apply_batch(&self, ops: Vec<WriteOp>) -> Result<Vec<Option<RawObject>>, StoreError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let prefix = &self.shared.prefix;
        let mut keys: Vec<String> = Vec::new();
        for op in &ops {
            let key = op.key();
            check_key(&key)?;
            let k = object_key(prefix, &key);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let guard = self.guard()?;
        let mut read = None;
        for _ in 0..APPLY_ATTEMPTS {
            let plan = match plan(prefix, &ops, read.as_ref()) {
                Ok(p) => p,
                Err(Unplanned::Fails(e)) => return Err(e),
                Err(Unplanned::NeedsRead) if read.is_none() => {
                    read = Some(self.read(&keys).await?);
                    continue;
                }
                Err(Unplanned::NeedsRead) => {
                    return Err(StoreError::Backend {
                        operation: "apply a batch",
                        detail: "the batch could not be planned on the objects read".into(),
                    });
                }
            };
            let mut compare = Vec::with_capacity(plan.compares.len() + 1);
            if let Some(g) = &guard {
                compare.push(Compare::created_at(
                    g.leader_key.as_bytes(),
                    g.create_revision,
                ));
            }
            compare.extend(plan.compares);
            let success = plan
                .writes
                .iter()
                .map(|(k, v)| write_op(k, v.as_deref()))
                .collect();
            let mut failure: Vec<TxnOp> = keys
                .iter()
                .map(|k| TxnOp::Range(RangeRequest::key(k.as_bytes())))
                .collect();
            if let Some(g) = &guard {
                failure.push(TxnOp::Range(RangeRequest::key(g.leader_key.as_bytes())));
            }
            let resp = self
                .shared
                .client
                .txn(&TxnRequest {
                    compare,
                    success,
                    failure,
                })
                .await
                .map_err(write_error)?;
            if resp.succeeded {
                return Ok(at_revision(plan.outputs, resp.revision));
            }
            // Nothing was applied. Why: the guard first, then the first op that fails on the
            // objects as the transaction saw them.
            if let Some(g) = &guard {
                let leader = match resp.responses.get(keys.len()) {
                    Some(TxnOpResponse::Range(r)) => r.kvs.first(),
                    _ => None,
                };
                if leader.is_none_or(|kv| kv.create_revision != g.create_revision) {
                    return Err(self.guard_error(g, leader));
                }
            }
            read = Some(read_back(&keys, &resp.responses)?);
        }
        Err(StoreError::Backend {
            operation: "apply a batch",
            detail: format!(
                "the transaction's compares failed {APPLY_ATTEMPTS} times while the objects \
                 read back satisfied them"
            ),
        })
    }
}

/// The objects of `keys` from the range answers of a transaction (in the same order).
fn read_back(
    keys: &[String],
    responses: &[TxnOpResponse],
) -> Result<BTreeMap<String, Option<Stored>>, StoreError> {
    let mut out = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        let Some(TxnOpResponse::Range(r)) = responses.get(i) else {
            return Err(StoreError::Backend {
                operation: "read the objects of a batch",
                detail: format!("the transaction's answer has no read of {k}"),
            });
        };
        out.insert(k.clone(), r.kvs.first().map(decode).transpose()?);
    }
    Ok(out)
}

impl Store for EtcdStore {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
        Box::pin(async move {
            let r = self
                .shared
                .client
                .range(&RangeRequest::key(self.key_of(key)))
                .await
                .map_err(backend("read an object"))?;
            Ok(r.kvs.first().map(decode).transpose()?.map(|s| s.obj))
        })
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>> {
        Box::pin(async move {
            let prefix = match namespace {
                Some(ns) => format!("{}{kind}/{ns}/", self.shared.prefix),
                None => format!("{}{kind}/", self.shared.prefix),
            };
            let r = self
                .shared
                .client
                .range(&RangeRequest::prefix(prefix))
                .await
                .map_err(backend("list objects"))?;
            let mut out = Vec::with_capacity(r.kvs.len());
            for kv in &r.kvs {
                if parse_key(&self.shared.prefix, &kv.key).is_some() {
                    out.push(decode(kv)?.obj);
                }
            }
            // The embedded store's order: by namespace, then name ('-' sorts before '/' in
            // the keys, so the keys' order can differ).
            out.sort_by(|a, b| {
                (&a.metadata.namespace, &a.metadata.name)
                    .cmp(&(&b.metadata.namespace, &b.metadata.name))
            });
            Ok(out)
        })
    }

    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
        Box::pin(self.apply_batch(ops))
    }

    /// One etcd transaction per batch: all of it or nothing.
    fn transactional(&self) -> bool {
        true
    }

    fn watch(&self) -> broadcast::Receiver<WatchEvent> {
        self.shared.events.subscribe()
    }
}

/// The store's event for one etcd event; `Err(())` when it cannot be told (a deletion whose
/// previous value etcd no longer has): the watchers must re-list.
fn to_event(prefix: &str, ev: &WatchedEvent) -> Result<Option<WatchEvent>, ()> {
    match ev {
        WatchedEvent::Put { kv } => {
            if parse_key(prefix, &kv.key).is_none() {
                return Ok(None);
            }
            match decode(kv) {
                Ok(s) => Ok(Some(WatchEvent::Put(s.obj))),
                Err(e) => {
                    tracing::warn!(error = %e, "skipping a watched object that does not decode");
                    Ok(None)
                }
            }
        }
        WatchedEvent::Delete { kv, prev } => {
            if parse_key(prefix, &kv.key).is_none() {
                return Ok(None);
            }
            let Some(prev) = prev else { return Err(()) };
            match decode(prev) {
                Ok(mut s) => {
                    s.obj.metadata.resource_version = kv.mod_revision.to_string();
                    Ok(Some(WatchEvent::Deleted(s.obj)))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "skipping a watched deletion that does not decode");
                    Ok(None)
                }
            }
        }
    }
}

fn mod_revision(ev: &WatchedEvent) -> i64 {
    match ev {
        WatchedEvent::Put { kv } | WatchedEvent::Delete { kv, .. } => kv.mod_revision,
    }
}

/// Whether the member serving `stream` still answers and has a leader.
async fn serving(client: &EtcdClient, stream: &WatchStream) -> bool {
    matches!(
        tokio::time::timeout(WATCH_PROBE_TIMEOUT, client.status_of(stream.endpoint())).await,
        Ok(Ok(s)) if s.leader.is_some()
    )
}

/// The current revision, once etcd answers (retrying); then `Resync` for the watchers.
async fn resync(client: &EtcdClient, prefix: &str, events: &broadcast::Sender<WatchEvent>) -> i64 {
    let mut pause = WATCH_RETRY_FIRST;
    loop {
        let head = client
            .range(&RangeRequest {
                count_only: true,
                ..RangeRequest::prefix(prefix)
            })
            .await;
        match head {
            Ok(r) => {
                let _ = events.send(WatchEvent::Resync);
                return r.revision + 1;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the revision to watch from; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WATCH_RETRY_LAST);
            }
        }
    }
}

/// Feeds the store's watchers from one etcd watch on the prefix, from `next` on.
async fn watch_loop(
    client: EtcdClient,
    prefix: String,
    events: broadcast::Sender<WatchEvent>,
    mut next: i64,
) {
    let mut pause = WATCH_RETRY_FIRST;
    loop {
        let mut stream = match client
            .watch(&WatchRequest::prefix(prefix.as_bytes(), next))
            .await
        {
            Ok(s) => s,
            Err(EtcdError::Watch(Failure::Compacted {
                compact_revision, ..
            })) => {
                tracing::info!(
                    from = next,
                    compact_revision,
                    "the store's watch fell below etcd's compaction: watchers re-list"
                );
                next = resync(&client, &prefix, &events).await;
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch the store; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(WATCH_RETRY_LAST);
                continue;
            }
        };
        pause = WATCH_RETRY_FIRST;
        loop {
            match tokio::time::timeout(WATCH_IDLE, stream.next()).await {
                Err(_) => {
                    if serving(&client, &stream).await {
                        continue;
                    }
                    tracing::debug!(
                        endpoint = stream.endpoint(),
                        "the store's watch went quiet and its member does not serve; watching elsewhere"
                    );
                    break;
                }
                Ok(Ok(Some(batch))) => {
                    for ev in &batch.events {
                        match to_event(&prefix, ev) {
                            Ok(Some(e)) => {
                                let _ = events.send(e);
                            }
                            Ok(None) => {}
                            Err(()) => {
                                let _ = events.send(WatchEvent::Resync);
                            }
                        }
                        next = next.max(mod_revision(ev) + 1);
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(EtcdError::Watch(Failure::Compacted { .. }))) => {
                    next = resync(&client, &prefix, &events).await;
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the store's watch broke; re-establishing it");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::resources::{KIND_GROUP, KIND_LEASE, ObjectMeta};
    use serde_json::json;

    const P: &str = "/br/";

    fn obj(kind: &str, name: &str, rv: &str) -> RawObject {
        let mut meta = ObjectMeta::named("ns", name);
        meta.resource_version = rv.into();
        let mut o = RawObject::from_body("v1", kind, meta, &json!({"spec": {"a": 1}})).unwrap();
        o.body.insert("status".into(), json!({"s": 1}));
        o
    }

    fn stored(o: &RawObject, rev: i64) -> Stored {
        let mut o = o.clone();
        o.metadata.resource_version = rev.to_string();
        Stored {
            obj: o,
            mod_revision: rev,
        }
    }

    fn fails(r: Result<Plan, Unplanned>) -> StoreError {
        match r {
            Err(Unplanned::Fails(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keys_are_kind_namespace_name_under_the_prefix() {
        let k = ObjectKey::new("Lease", "ns", "l");
        assert_eq!(object_key(P, &k), "/br/Lease/ns/l");
        assert_eq!(parse_key(P, b"/br/Lease/ns/l"), Some(k));
        assert_eq!(
            parse_key(P, b"/br/leader"),
            None,
            "the leader key is no object"
        );
        assert_eq!(parse_key(P, b"/br/Lease/ns/l/x"), None);
        assert_eq!(parse_key(P, b"/other/Lease/ns/l"), None);
        assert!(check_key(&ObjectKey::new("Lease", "a/b", "l")).is_err());
    }

    #[test]
    fn a_batch_without_replaces_compares_its_preconditions_unread() {
        let ops = vec![
            WriteOp::Create(obj(KIND_LEASE, "a", "")),
            WriteOp::Delete {
                key: ObjectKey::new(KIND_LEASE, "ns", "b"),
                resource_version: Some("7".into()),
            },
            WriteOp::Delete {
                key: ObjectKey::new(KIND_LEASE, "ns", "c"),
                resource_version: None,
            },
            WriteOp::DeleteIfExists {
                key: ObjectKey::new(KIND_LEASE, "ns", "d"),
            },
            WriteOp::Require {
                key: ObjectKey::new(KIND_GROUP, "ns", "g"),
                resource_version: "5".into(),
            },
        ];
        let p = plan(P, &ops, None).unwrap();
        assert_eq!(
            p.compares,
            vec![
                Compare::absent("/br/Lease/ns/a"),
                Compare::modified_at("/br/Lease/ns/b", 7),
                Compare::present("/br/Lease/ns/c"),
                Compare::modified_at("/br/MysqlFailoverGroup/ns/g", 5),
            ]
        );
        assert_eq!(
            p.writes.len(),
            4,
            "one write per key; a requirement writes nothing"
        );
        assert!(p.writes["/br/Lease/ns/a"].is_some());
        assert!(p.writes["/br/Lease/ns/d"].is_none());
        let created = p.outputs[0].as_ref().unwrap();
        assert_eq!(created.metadata.generation, 1);
        assert!(!created.metadata.uid.is_empty());
        assert!(
            created.body.contains_key("status"),
            "a Lease keeps its status"
        );
        assert!(matches!(
            plan(P, &[WriteOp::Replace(obj(KIND_LEASE, "a", "3"))], None),
            Err(Unplanned::NeedsRead)
        ));
        assert!(
            matches!(
                plan(
                    P,
                    &[WriteOp::Require {
                        key: ObjectKey::new(KIND_LEASE, "ns", "a"),
                        resource_version: "not-ours".into()
                    }],
                    None
                ),
                Err(Unplanned::NeedsRead)
            ),
            "a version this store never wrote: read, to say NotFound or Conflict"
        );
    }

    #[test]
    fn a_replace_plays_against_what_is_stored_as_sqlite_does() {
        let g = obj(KIND_GROUP, "g", "");
        let mut read = BTreeMap::new();
        read.insert(
            "/br/MysqlFailoverGroup/ns/g".to_string(),
            Some(stored(&g, 9)),
        );
        let mut next = obj(KIND_GROUP, "g", "9");
        next.body.insert("status".into(), json!({"s": 2}));
        next.metadata.uid = "forged".into();
        let p = plan(P, &[WriteOp::Replace(next.clone())], Some(&read)).unwrap();
        assert_eq!(
            p.compares,
            vec![Compare::modified_at("/br/MysqlFailoverGroup/ns/g", 9)]
        );
        let out = p.outputs[0].as_ref().unwrap();
        assert_eq!(
            out.body["status"],
            json!({"s": 1}),
            "the stored status stays"
        );
        assert_eq!(out.metadata.uid, g.metadata.uid);
        assert_eq!(
            out.metadata.generation, g.metadata.generation,
            "no spec change"
        );
        let stored_json: serde_json::Value =
            serde_json::from_slice(p.writes["/br/MysqlFailoverGroup/ns/g"].as_ref().unwrap())
                .unwrap();
        assert!(
            stored_json["metadata"].get("resourceVersion").is_none(),
            "the version is the key's, not the value's"
        );
        next.body["spec"]["a"] = json!(2);
        let p = plan(P, &[WriteOp::Replace(next.clone())], Some(&read)).unwrap();
        assert_eq!(
            p.outputs[0].as_ref().unwrap().metadata.generation,
            g.metadata.generation + 1
        );
        next.metadata.resource_version = "8".into();
        assert!(matches!(
            fails(plan(P, &[WriteOp::Replace(next)], Some(&read))),
            StoreError::Conflict { expected, actual, .. } if expected == "8" && actual == "9"
        ));
    }

    #[test]
    fn the_first_op_that_fails_is_the_error_and_later_ops_see_earlier_ones() {
        let mut read = BTreeMap::new();
        read.insert(
            "/br/Lease/ns/b".to_string(),
            Some(stored(&obj(KIND_LEASE, "b", ""), 4)),
        );
        let ops = vec![
            WriteOp::Create(obj(KIND_LEASE, "a", "")),
            WriteOp::Create(obj(KIND_LEASE, "b", "")),
            WriteOp::Replace(obj(KIND_LEASE, "zzz", "1")),
        ];
        match fails(plan(P, &ops, Some(&read))) {
            StoreError::AlreadyExists { key } => assert_eq!(key.name, "b"),
            other => panic!("{other:?}"),
        }
        let ops = vec![
            WriteOp::DeleteIfExists {
                key: ObjectKey::new(KIND_LEASE, "ns", "b"),
            },
            WriteOp::Create(obj(KIND_LEASE, "b", "")),
        ];
        let p = plan(P, &ops, Some(&read)).unwrap();
        assert!(
            p.compares.is_empty(),
            "the create relies on the delete before it"
        );
        assert!(p.writes["/br/Lease/ns/b"].is_some());
        let ops = vec![
            WriteOp::Create(obj(KIND_LEASE, "n", "")),
            WriteOp::Replace(obj(KIND_LEASE, "n", "1")),
        ];
        assert!(matches!(
            fails(plan(P, &ops, Some(&BTreeMap::new()))),
            StoreError::Conflict { .. }
        ));
        let status_of_lease = vec![WriteOp::ReplaceStatus(obj(KIND_LEASE, "b", "4"))];
        assert!(matches!(
            fails(plan(P, &status_of_lease, Some(&read))),
            StoreError::Invalid { .. }
        ));
        let missing = vec![WriteOp::Delete {
            key: ObjectKey::new(KIND_LEASE, "ns", "nope"),
            resource_version: None,
        }];
        assert!(matches!(
            fails(plan(P, &missing, Some(&read))),
            StoreError::NotFound { .. }
        ));
    }

    #[test]
    fn watch_events_carry_the_keys_revision_and_deletions_the_object_as_it_was() {
        let value = encode(&obj(KIND_LEASE, "l", "")).unwrap();
        let kv = |key: &str, rev: i64, value: Vec<u8>| KeyValue {
            key: key.as_bytes().to_vec(),
            value,
            create_revision: 2,
            mod_revision: rev,
            version: 1,
            lease: 0,
        };
        match to_event(
            P,
            &WatchedEvent::Put {
                kv: kv("/br/Lease/ns/l", 5, value.clone()),
            },
        ) {
            Ok(Some(WatchEvent::Put(o))) => assert_eq!(o.metadata.resource_version, "5"),
            other => panic!("{other:?}"),
        }
        let del = WatchedEvent::Delete {
            kv: kv("/br/Lease/ns/l", 6, Vec::new()),
            prev: Some(kv("/br/Lease/ns/l", 5, value)),
        };
        match to_event(P, &del) {
            Ok(Some(WatchEvent::Deleted(o))) => {
                assert_eq!(o.metadata.resource_version, "6");
                assert_eq!(o.metadata.name, "l");
            }
            other => panic!("{other:?}"),
        }
        let blind = WatchedEvent::Delete {
            kv: kv("/br/Lease/ns/l", 6, Vec::new()),
            prev: None,
        };
        assert_eq!(
            to_event(P, &blind),
            Err(()),
            "a deletion that cannot be told: re-list"
        );
        let leader = WatchedEvent::Put {
            kv: kv("/br/leader", 7, b"op-1".to_vec()),
        };
        assert_eq!(to_event(P, &leader), Ok(None));
    }
}
