//! Events on a group, stored as `Event` objects (Kubernetes Events in the Kubernetes back-end).
//! Recording is best effort: a failure is logged and never fails the action it describes.
//! The newest [`KEEP_PER_GROUP`] events of a group are kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bloodraven_core::resources::{
    EVENT_API_VERSION, EventBody, KIND_EVENT, KIND_GROUP, ObjectMeta,
};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{ObjectKey, RawObject, Store, WriteOp};

use crate::lease_objects::LABEL_GROUP;

/// Events kept per group; older ones are pruned.
pub const KEEP_PER_GROUP: usize = 200;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Records an event about `namespace/group`.
pub async fn record(
    store: &Arc<dyn Store>,
    namespace: &str,
    group: &str,
    type_: EventType,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut meta = ObjectMeta::named(
        namespace,
        &format!("{group}.{:x}{:04x}", now.unix_millis(), seq & 0xffff),
    );
    meta.labels
        .insert(LABEL_GROUP.to_string(), group.to_string());
    meta.creation_timestamp = Some(now);
    let body = EventBody {
        involved_object: format!("{KIND_GROUP}/{namespace}/{group}"),
        type_: type_.as_str().to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        event_time: now,
    };
    tracing::info!(
        group,
        namespace,
        reason,
        event_type = type_.as_str(),
        message,
        "event"
    );
    let obj = match RawObject::from_body(EVENT_API_VERSION, KIND_EVENT, meta, &body) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(group, reason, error = %e, "could not build event");
            return;
        }
    };
    if let Err(e) = store.apply(vec![WriteOp::Create(obj)]).await {
        tracing::warn!(group, reason, error = %e, "could not record event");
        return;
    }
    if seq.is_multiple_of(20) {
        prune(store, namespace, group).await;
    }
}

async fn prune(store: &Arc<dyn Store>, namespace: &str, group: &str) {
    let Ok(mut all) = list(store, namespace, group).await else {
        return;
    };
    if all.len() <= KEEP_PER_GROUP {
        return;
    }
    all.sort_by_key(|(_, e)| e.event_time);
    let extra = all.len() - KEEP_PER_GROUP;
    let ops = all
        .into_iter()
        .take(extra)
        .map(|(o, _)| WriteOp::DeleteIfExists {
            key: ObjectKey::new(KIND_EVENT, &o.metadata.namespace, &o.metadata.name),
        })
        .collect();
    let _ = store.apply(ops).await;
}

/// The group's events, oldest first.
pub async fn list(
    store: &Arc<dyn Store>,
    namespace: &str,
    group: &str,
) -> Result<Vec<(RawObject, EventBody)>, bloodraven_store::StoreError> {
    let mut out: Vec<(RawObject, EventBody)> = store
        .list(KIND_EVENT, Some(namespace))
        .await?
        .into_iter()
        .filter(|o| o.metadata.labels.get(LABEL_GROUP).map(String::as_str) == Some(group))
        .filter_map(|o| o.decode::<EventBody>().ok().map(|e| (o, e)))
        .collect();
    out.sort_by_key(|(_, e)| e.event_time);
    Ok(out)
}
