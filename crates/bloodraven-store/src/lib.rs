//! Bloodraven's storage interface, with Kubernetes semantics, and its embedded back-end.
//!
//! Objects are Kubernetes-shaped (`apiVersion`, `kind`, `metadata`, body). The contract is the
//! one a Kubernetes API server keeps, so that every back-end (the embedded SQLite store here,
//! the Kubernetes API in `bloodraven-operator::kube_store`) can keep it, and the code above
//! relies on nothing more:
//!
//! - **`resourceVersion` is opaque.** Writes are compare-and-swap on it; callers compare
//!   versions for equality only, never order or parse them.
//! - **Order is per object.** Changes to one object are seen in the order they were made (from
//!   the watch, or from a compare-and-swap that failed); nothing orders changes to different
//!   objects.
//! - **A batch is applied in order and may stop part-way.** [`Store::apply`] writes its ops one
//!   after the other; when one fails, the ones before it may have been applied and the ones
//!   after it were not. Callers order writes so that any prefix is safe (tombstones before the
//!   leases they replace). A back-end whose batches are transactions says so
//!   ([`Store::transactional`]: the embedded one) and takes [`WriteOp::Require`], a check that
//!   another object is unchanged, inside the same transaction.
//! - **Status is written separately** for the kinds of
//!   [`bloodraven_core::resources::STATUS_SUBRESOURCE_KINDS`]: [`WriteOp::Replace`] keeps the
//!   stored status, [`WriteOp::ReplaceStatus`] changes nothing but the status, and a create
//!   ignores the status it carries. `metadata.generation` counts changes to anything but
//!   metadata and status.
//! - **A watch can ask for a re-list.** [`WatchEvent::Resync`] means changes were missed (the
//!   watcher fell behind, or the API server answered `410 Gone`): re-read what you hold.
//! - **An answer can be lost.** A write whose outcome is unknown fails with
//!   [`StoreError::Unconfirmed`]; it may have been applied. It is never retried blindly.
//!
//! [`sqlite::SqliteStore`] is the embedded back-end (one SQLite file, WAL, synchronous
//! commits: an acknowledged write survives `kill -9` and, with [`Durability::Full`], power
//! loss). Several processes may open the same file: the CLI writes annotations while the
//! operator runs, and the operator's watch picks them up.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use bloodraven_core::resources::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod interpose;
pub mod semantics;
pub mod sqlite;

pub use interpose::{Interposed, Interposer};
pub use sqlite::{Durability, SqliteStore};

/// Identifies an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// A stored object: `apiVersion`, `kind`, `metadata`, and the rest of its fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(flatten)]
    pub body: Map<String, Value>,
}

impl RawObject {
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(&self.kind, &self.metadata.namespace, &self.metadata.name)
    }

    /// Builds an object from a typed body (which must serialise to a JSON object).
    pub fn from_body<T: Serialize>(
        api_version: &str,
        kind: &str,
        metadata: ObjectMeta,
        body: &T,
    ) -> Result<Self, StoreError> {
        match serde_json::to_value(body) {
            Ok(Value::Object(map)) => Ok(RawObject {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                metadata,
                body: map,
            }),
            Ok(_) => Err(StoreError::Invalid {
                reason: format!("the body of a {kind} must be a JSON object"),
            }),
            Err(e) => Err(StoreError::Invalid {
                reason: format!("cannot encode a {kind}: {e}"),
            }),
        }
    }

    /// Decodes the body as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, StoreError> {
        serde_json::from_value(Value::Object(self.body.clone())).map_err(|e| StoreError::Invalid {
            reason: format!("stored {} does not decode: {e}", self.key()),
        })
    }
}

/// One write of [`Store::apply`].
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOp {
    /// Fails with `AlreadyExists` when the object exists.
    Create(RawObject),
    /// Compare-and-swap: fails with `Conflict` unless `metadata.resourceVersion` is current.
    /// Keeps the stored status of a kind whose status is a subresource.
    Replace(RawObject),
    /// Compare-and-swap of the status alone (kinds whose status is a subresource): everything
    /// but `status` is taken from the stored object.
    ReplaceStatus(RawObject),
    /// Fails with `NotFound`; with `resource_version`, also with `Conflict`.
    Delete {
        key: ObjectKey,
        resource_version: Option<String>,
    },
    /// Deletes when present; never fails for a missing object.
    DeleteIfExists { key: ObjectKey },
    /// Writes nothing: fails with `Conflict` (or `NotFound`) unless the object is stored at
    /// `resource_version`. Only back-ends whose batches are transactions
    /// ([`Store::transactional`]) take it; there the rest of the batch is applied only while the
    /// object is unchanged, in the same transaction.
    Require {
        key: ObjectKey,
        resource_version: String,
    },
}

impl WriteOp {
    /// The object the op writes (or requires).
    pub fn key(&self) -> ObjectKey {
        match self {
            WriteOp::Create(o) | WriteOp::Replace(o) | WriteOp::ReplaceStatus(o) => o.key(),
            WriteOp::Delete { key, .. }
            | WriteOp::DeleteIfExists { key }
            | WriteOp::Require { key, .. } => key.clone(),
        }
    }
}

/// A change seen by a watcher.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    /// Created or replaced.
    Put(RawObject),
    /// Deleted; the object as it was, with the deletion's resource version.
    Deleted(RawObject),
    /// The watcher fell behind and missed changes: re-list what you care about.
    Resync,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{key} not found")]
    NotFound { key: ObjectKey },
    #[error("{key} already exists")]
    AlreadyExists { key: ObjectKey },
    #[error("{key} changed since it was read (resourceVersion {expected}, now {actual})")]
    Conflict {
        key: ObjectKey,
        expected: String,
        actual: String,
    },
    #[error("invalid object: {reason}")]
    Invalid { reason: String },
    #[error("store failed to {operation}: {detail}")]
    Backend {
        operation: &'static str,
        detail: String,
    },
    /// The write was sent but its answer was lost: it may or may not have been applied.
    #[error("store did not confirm {operation} (it may have been applied): {detail}")]
    Unconfirmed {
        operation: &'static str,
        detail: String,
    },
}

/// A boxed future, so [`Store`] can be used as a trait object.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The storage interface.
pub trait Store: Send + Sync + fmt::Debug {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>>;

    /// Every object of `kind`, in `namespace` or in all namespaces.
    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>>;

    /// Applies `ops` (see the crate docs for atomicity). Returns, per op, the object as
    /// written (`None` for deletes and requirements).
    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>>;

    /// Whether a batch is one transaction: all of it applies or none of it, and
    /// [`WriteOp::Require`] is checked inside it. `false` (the Kubernetes API): a batch may
    /// stop part-way and `Require` is refused.
    fn transactional(&self) -> bool {
        false
    }

    /// A stream of every change from now on.
    fn watch(&self) -> tokio::sync::broadcast::Receiver<WatchEvent>;
}

/// Single-object helpers over [`Store::apply`].
pub trait StoreExt: Store {
    fn create(&self, obj: RawObject) -> StoreFuture<'_, RawObject> {
        Box::pin(async move { first(self.apply(vec![WriteOp::Create(obj)]).await?) })
    }

    fn replace(&self, obj: RawObject) -> StoreFuture<'_, RawObject> {
        Box::pin(async move { first(self.apply(vec![WriteOp::Replace(obj)]).await?) })
    }

    fn delete(&self, key: ObjectKey, resource_version: Option<String>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.apply(vec![WriteOp::Delete {
                key,
                resource_version,
            }])
            .await
            .map(|_| ())
        })
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// How many compare-and-swap attempts [`set_annotation`] makes before giving up.
pub const ANNOTATE_ATTEMPTS: u32 = 20;

/// Sets one annotation on a stored object by read-modify-write with compare-and-swap, and
/// returns the written object.
///
/// Another writer (the operator rewrites a group's status every poll) can win the race
/// between the read and the write: the object is re-read and the write retried, with a short
/// pause, up to [`ANNOTATE_ATTEMPTS`] times. On exhaustion the error is a `Conflict`: nothing
/// was written, which callers report as such — a request that was not stored is never
/// announced as made.
pub async fn set_annotation<S: Store + ?Sized>(
    store: &S,
    key: &ObjectKey,
    name: &str,
    value: &str,
) -> Result<RawObject, StoreError> {
    let mut last = None;
    for attempt in 1..=ANNOTATE_ATTEMPTS {
        let Some(mut obj) = store.get(key).await? else {
            return Err(StoreError::NotFound { key: key.clone() });
        };
        obj.metadata
            .annotations
            .insert(name.to_string(), value.to_string());
        match store.replace(obj).await {
            Ok(written) => return Ok(written),
            Err(e @ StoreError::Conflict { .. }) => {
                last = Some(e);
                if attempt < ANNOTATE_ATTEMPTS {
                    tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::Conflict {
        key: key.clone(),
        expected: String::new(),
        actual: "changing concurrently".into(),
    }))
}

fn first(mut v: Vec<Option<RawObject>>) -> Result<RawObject, StoreError> {
    v.pop().flatten().ok_or_else(|| StoreError::Backend {
        operation: "write",
        detail: "the write returned no object".into(),
    })
}

/// Labels to select objects by, e.g. the deploy leases of one group.
pub fn has_labels(obj: &RawObject, want: &BTreeMap<String, String>) -> bool {
    want.iter()
        .all(|(k, v)| obj.metadata.labels.get(k) == Some(v))
}
