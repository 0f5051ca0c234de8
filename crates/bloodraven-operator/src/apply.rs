//! `bloodraven apply -f FILE`: where the store is the truth (etcd), groups and databases are
//! created and changed here, as a difference against the store, never by an operator because
//! of its own file.
//!
//! # Invariants
//! - Nothing is deleted (a group or database the file lacks stays; its leases, tombstones and
//!   events with it).
//! - A change replaces only what a user configures: the request blocks commands write into a
//!   group's spec (`spec.restoreInPlace`), its status and its annotations are kept.
//! - Every replace is a compare-and-swap on the version read (or the file's
//!   `metadata.resourceVersion`, when it gives one): a change made meanwhile is never
//!   overwritten; the whole plan is refused instead, naming the object.

use bloodraven_core::resources::{
    API_VERSION, DatabaseBody, FailoverGroupBody, KIND_DATABASE, KIND_GROUP,
};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, WriteOp};
use serde_json::Value;

use crate::config::Documents;
use crate::platform::stored::differences;

/// What applying one document does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Create,
    /// The fields that change (`spec.failoverCooldown`, `metadata.labels.team`).
    Update(Vec<String>),
    Unchanged,
}

/// One document's change, and the write that makes it.
#[derive(Clone, Debug)]
pub struct Planned {
    pub kind: &'static str,
    pub key: ObjectKey,
    pub change: Change,
    write: Option<WriteOp>,
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = format!("{} {}/{}", self.kind, self.key.namespace, self.key.name);
        match &self.change {
            Change::Create => write!(f, "{what}: created"),
            Change::Update(fields) => write!(f, "{what}: changed ({})", fields.join(", ")),
            Change::Unchanged => write!(f, "{what}: unchanged"),
        }
    }
}

/// Why a plan cannot be made or applied; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("cannot read the store: {0}")]
    Read(#[source] Box<StoreError>),
    #[error(
        "{kind} {namespace}/{name}: metadata.resourceVersion is {given:?} but the store holds {stored:?} (it changed since; read it again); nothing was applied"
    )]
    Stale {
        kind: &'static str,
        namespace: String,
        name: String,
        given: String,
        stored: String,
    },
    #[error(
        "{kind} {namespace}/{name}: metadata.resourceVersion is given but the store has no such object; nothing was applied"
    )]
    Missing {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: String,
        #[source]
        source: Box<StoreError>,
    },
    /// The batch was refused (a compare failed: someone changed an object meanwhile).
    #[error("the store refused the change (an object changed meanwhile? run apply again): {0}")]
    Write(#[source] Box<StoreError>),
}

/// The most writes sent in one batch (etcd refuses more than 128 operations per transaction
/// by default).
const BATCH: usize = 50;

/// The changes `docs` make to `store`, nothing written. Over 100 lines: one validation per
/// kind and rule, each refusal naming its field, in the order `apply` reports them.
pub async fn plan(
    store: &dyn Store,
    docs: &Documents,
    now: Timestamp,
) -> Result<Vec<Planned>, ApplyError> {
    let mut out = Vec::new();
    for g in &docs.groups {
        let key = ObjectKey::new(KIND_GROUP, &g.metadata.namespace, &g.metadata.name);
        let stored = store
            .get(&key)
            .await
            .map_err(|e| ApplyError::Read(Box::new(e)))?;
        check_version(
            KIND_GROUP,
            &key,
            &g.metadata.resource_version,
            stored.as_ref(),
        )?;
        let encode = |source| ApplyError::Encode {
            what: format!("{KIND_GROUP} {}/{}", key.namespace, key.name),
            source: Box::new(source),
        };
        let planned = match stored {
            None => {
                let mut meta = g.metadata.clone();
                meta.resource_version.clear();
                meta.creation_timestamp = Some(now);
                let body = FailoverGroupBody {
                    spec: g.spec.clone(),
                    status: bloodraven_core::status::GroupStatus::default(),
                };
                let obj = crate::objects::new_group_object(meta, &body).map_err(encode)?;
                Planned {
                    kind: KIND_GROUP,
                    key,
                    change: Change::Create,
                    write: Some(WriteOp::Create(obj)),
                }
            }
            Some(o) => {
                let body: FailoverGroupBody = o.decode().map_err(encode)?;
                // The request blocks a command wrote stay; the rest is the file's.
                let mut spec = g.spec.configured();
                spec.restore_in_place
                    .clone_from(&body.spec.restore_in_place);
                let before = serde_json::to_value(body.spec.configured()).unwrap_or(Value::Null);
                let after = serde_json::to_value(spec.configured()).unwrap_or(Value::Null);
                let mut fields = Vec::new();
                differences(&before, &after, "spec", &mut fields);
                let mut next = o.clone();
                label_changes(&mut next, &g.metadata.labels, &mut fields);
                if fields.is_empty() {
                    unchanged(KIND_GROUP, key)
                } else {
                    let spec = serde_json::to_value(&spec).map_err(|e| {
                        encode(StoreError::Invalid {
                            reason: e.to_string(),
                        })
                    })?;
                    next.body.insert("spec".into(), spec);
                    Planned {
                        kind: KIND_GROUP,
                        key,
                        change: Change::Update(fields),
                        write: Some(WriteOp::Replace(next)),
                    }
                }
            }
        };
        out.push(planned);
    }
    for d in &docs.databases {
        let key = ObjectKey::new(KIND_DATABASE, &d.metadata.namespace, &d.metadata.name);
        let stored = store
            .get(&key)
            .await
            .map_err(|e| ApplyError::Read(Box::new(e)))?;
        check_version(
            KIND_DATABASE,
            &key,
            &d.metadata.resource_version,
            stored.as_ref(),
        )?;
        let mut meta = d.metadata.clone();
        meta.resource_version.clear();
        let obj = RawObject::from_body(
            API_VERSION,
            KIND_DATABASE,
            meta,
            &DatabaseBody {
                spec: d.spec.clone(),
            },
        )
        .map_err(|source| ApplyError::Encode {
            what: format!("{KIND_DATABASE} {}/{}", key.namespace, key.name),
            source: Box::new(source),
        })?;
        let planned = match stored {
            None => Planned {
                kind: KIND_DATABASE,
                key,
                change: Change::Create,
                write: Some(WriteOp::Create(obj)),
            },
            Some(o) => {
                let mut fields = Vec::new();
                differences(
                    o.body.get("spec").unwrap_or(&Value::Null),
                    obj.body.get("spec").unwrap_or(&Value::Null),
                    "spec",
                    &mut fields,
                );
                let mut next = o.clone();
                label_changes(&mut next, &d.metadata.labels, &mut fields);
                if fields.is_empty() {
                    unchanged(KIND_DATABASE, key)
                } else {
                    next.body = obj.body;
                    Planned {
                        kind: KIND_DATABASE,
                        key,
                        change: Change::Update(fields),
                        write: Some(WriteOp::Replace(next)),
                    }
                }
            }
        };
        out.push(planned);
    }
    Ok(out)
}

fn unchanged(kind: &'static str, key: ObjectKey) -> Planned {
    Planned {
        kind,
        key,
        change: Change::Unchanged,
        write: None,
    }
}

/// The file's labels onto `obj` (added or changed; labels the file does not name stay),
/// naming each change in `fields`.
fn label_changes(
    obj: &mut RawObject,
    labels: &std::collections::BTreeMap<String, String>,
    fields: &mut Vec<String>,
) {
    for (k, v) in labels {
        if obj.metadata.labels.get(k) != Some(v) {
            fields.push(format!("metadata.labels.{k}"));
            obj.metadata.labels.insert(k.clone(), v.clone());
        }
    }
}

fn check_version(
    kind: &'static str,
    key: &ObjectKey,
    given: &str,
    stored: Option<&RawObject>,
) -> Result<(), ApplyError> {
    if given.is_empty() {
        return Ok(());
    }
    match stored {
        None => Err(ApplyError::Missing {
            kind,
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        }),
        Some(o) if o.metadata.resource_version != given => Err(ApplyError::Stale {
            kind,
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            given: given.to_string(),
            stored: o.metadata.resource_version.clone(),
        }),
        Some(_) => Ok(()),
    }
}

/// Writes what `planned` changes: creates fail if the object appeared meanwhile, replaces if
/// it changed since it was read. In batches of at most 50 writes (each batch is one
/// transaction where the store has them).
pub async fn apply(store: &dyn Store, planned: &[Planned]) -> Result<usize, ApplyError> {
    let ops: Vec<WriteOp> = planned.iter().filter_map(|p| p.write.clone()).collect();
    let n = ops.len();
    for chunk in ops.chunks(BATCH) {
        store
            .apply(chunk.to_vec())
            .await
            .map_err(|e| ApplyError::Write(Box::new(e)))?;
    }
    Ok(n)
}
