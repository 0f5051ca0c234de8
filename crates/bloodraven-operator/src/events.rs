//! Events on a group, stored as `Event` objects (`events.k8s.io/v1` Events in the Kubernetes
//! back-end). Recording is best effort: a failure is logged and never fails the action it
//! describes. The newest [`KEEP_PER_GROUP`] events of a group are kept.
//!
//! Aggregated as Kubernetes expects, so a flapping site cannot flood the API: the same event
//! (group, reason, message) within [`SERIES_WINDOW`] updates the first one's `series` (count,
//! last seen) instead of creating another, and each group may create at most [`BURST`] events
//! at once, then one per [`REFILL`] (a token bucket, like client-go's spam filter); an event
//! over the budget is logged and dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{
    EVENT_API_VERSION, EventBody, EventSeries, KIND_EVENT, KIND_GROUP, ObjectMeta,
};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{ObjectKey, RawObject, Store, WriteOp};
use serde_json::Value;

use crate::lease_objects::LABEL_GROUP;

/// Events kept per group; older ones are pruned.
pub const KEEP_PER_GROUP: usize = 200;
/// A repeat of an event within this window joins its series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(600);
/// Events a group may create at once.
pub const BURST: f64 = 25.0;
/// One more event per this interval.
pub const REFILL: Duration = Duration::from_secs(5);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Recent events by (namespace, group, reason, message), and each group's token bucket.
#[derive(Default)]
struct Recent {
    series: HashMap<(String, String, String, String), (String, Timestamp)>,
    buckets: HashMap<(String, String), (f64, Timestamp)>,
}

static RECENT: Mutex<Option<Recent>> = Mutex::new(None);

/// What to do with a new event.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Create it.
    Create,
    /// Add it to the series of the event named so.
    Join(String),
    /// Over the group's budget: drop it.
    Drop,
}

fn plan(namespace: &str, group: &str, reason: &str, message: &str, now: Timestamp) -> Plan {
    let mut guard = RECENT.lock().unwrap_or_else(PoisonError::into_inner);
    let recent = guard.get_or_insert_with(Recent::default);
    let key = (
        namespace.to_string(),
        group.to_string(),
        reason.to_string(),
        message.to_string(),
    );
    if let Some((name, first)) = recent.series.get(&key)
        && now.since(*first) < SERIES_WINDOW
    {
        return Plan::Join(name.clone());
    }
    let bucket = recent
        .buckets
        .entry((namespace.to_string(), group.to_string()))
        .or_insert((BURST, now));
    let refilled = now.since(bucket.1).as_secs_f64() / REFILL.as_secs_f64();
    bucket.0 = (bucket.0 + refilled).min(BURST);
    bucket.1 = now;
    if bucket.0 < 1.0 {
        return Plan::Drop;
    }
    bucket.0 -= 1.0;
    recent
        .series
        .retain(|_, (_, first)| now.since(*first) < SERIES_WINDOW);
    Plan::Create
}

fn remember(namespace: &str, group: &str, reason: &str, message: &str, name: &str, now: Timestamp) {
    let mut guard = RECENT.lock().unwrap_or_else(PoisonError::into_inner);
    let recent = guard.get_or_insert_with(Recent::default);
    recent.series.insert(
        (
            namespace.to_string(),
            group.to_string(),
            reason.to_string(),
            message.to_string(),
        ),
        (name.to_string(), now),
    );
}

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
    reason: EventReason,
    message: &str,
    now: Timestamp,
) {
    let reason = reason.as_str();
    tracing::info!(
        group,
        namespace,
        reason,
        event_type = type_.as_str(),
        message,
        "event"
    );
    match plan(namespace, group, reason, message, now) {
        Plan::Join(name) => {
            if join_series(store, namespace, &name, now).await {
                return;
            }
            // The first of the series is gone (pruned, or deleted): start a new one.
        }
        Plan::Drop => {
            tracing::warn!(
                group,
                namespace,
                reason,
                "event not recorded: the group's event budget is spent (a burst of 25, then one per 5 s)"
            );
            return;
        }
        Plan::Create => {}
    }
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!("{group}.{:x}{:04x}", now.unix_millis(), seq & 0xffff);
    let mut meta = ObjectMeta::named(namespace, &name);
    meta.labels
        .insert(LABEL_GROUP.to_string(), group.to_string());
    meta.creation_timestamp = Some(now);
    let body = EventBody {
        involved_object: format!("{KIND_GROUP}/{namespace}/{group}"),
        type_: type_.as_str().to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        event_time: now,
        series: None,
    };
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
    remember(namespace, group, reason, message, &name, now);
    if seq.is_multiple_of(20) {
        prune(store, namespace, group).await;
    }
}

/// Counts one more occurrence in the series of event `name`; false when it is gone.
async fn join_series(store: &Arc<dyn Store>, namespace: &str, name: &str, now: Timestamp) -> bool {
    let key = ObjectKey::new(KIND_EVENT, namespace, name);
    for _ in 0..3 {
        let Ok(Some(mut obj)) = store.get(&key).await else {
            return false;
        };
        let Ok(mut body) = obj.decode::<EventBody>() else {
            return false;
        };
        let count = body.series.map_or(1, |s| s.count) + 1;
        body.series = Some(EventSeries {
            count,
            last_observed_time: now,
        });
        let Ok(Value::Object(map)) = serde_json::to_value(&body) else {
            return false;
        };
        obj.body = map;
        match store.apply(vec![WriteOp::Replace(obj)]).await {
            Ok(_) => return true,
            Err(bloodraven_store::StoreError::Conflict { .. }) => {}
            Err(e) => {
                tracing::warn!(event = name, error = %e, "could not count a repeated event");
                return true;
            }
        }
    }
    true
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_unix_seconds(1_796_000_000 + s)
    }

    #[test]
    fn repeats_join_a_series_within_the_window() {
        assert_eq!(
            plan("ns", "series-g", "SiteFenced", "m", t(0)),
            Plan::Create
        );
        remember("ns", "series-g", "SiteFenced", "m", "series-g.1", t(0));
        assert_eq!(
            plan("ns", "series-g", "SiteFenced", "m", t(599)),
            Plan::Join("series-g.1".into())
        );
        assert_eq!(
            plan("ns", "series-g", "SiteFenced", "other", t(1)),
            Plan::Create
        );
        assert_eq!(
            plan("ns", "series-g", "SiteFenced", "m", t(600)),
            Plan::Create
        );
    }

    #[test]
    fn a_group_gets_a_burst_then_one_event_per_refill() {
        for i in 0..25 {
            assert_eq!(
                plan("ns", "burst-g", "R", &format!("m{i}"), t(0)),
                Plan::Create,
                "{i}"
            );
        }
        assert_eq!(plan("ns", "burst-g", "R", "m25", t(0)), Plan::Drop);
        assert_eq!(plan("ns", "burst-g", "R", "m26", t(4)), Plan::Drop);
        assert_eq!(plan("ns", "burst-g", "R", "m27", t(5)), Plan::Create);
        // Another group has its own budget.
        assert_eq!(plan("ns", "burst-other", "R", "m", t(5)), Plan::Create);
    }
}
