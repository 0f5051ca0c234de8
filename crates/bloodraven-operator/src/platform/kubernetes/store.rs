//! The Kubernetes back-end of the store: groups and databases as the custom resources
//! `MysqlFailoverGroup` and `MysqlDatabase`, deploy leases and their tombstones as
//! `coordination.k8s.io/v1` Leases (labelled `bloodraven.shipstream.io/deploy-lease`, owned by
//! their group), events as `events.k8s.io/v1` Events.
//!
//! It keeps the store contract (see `bloodraven_store`) the way an API server lets a client:
//! every write is one request, compare-and-swap on `resourceVersion`; a batch is sent op by op
//! and stops at the first failure; the status of a group is written through its status
//! subresource. kube's automatic retries are off (the client comes from
//! `bloodraven_kube::cluster`): a write whose answer was lost is [`StoreError::Unconfirmed`],
//! never sent again. One watch per kind, from the version of a list, with bookmarks; a watch
//! that expires (`410 Gone`) or fails is listed again and announced as [`WatchEvent::Resync`].
//!
//! Only Lease and Event objects Bloodraven writes are seen: their lists and watches select
//! Bloodraven's labels, so other controllers' Leases (leader election among them) are never
//! read as deploy leases.

use std::time::Duration;

use bloodraven_core::resources::{
    API_VERSION, KIND_DATABASE, KIND_EVENT, KIND_GROUP, KIND_LEASE, has_status_subresource,
};
use bloodraven_kube::cluster::WriteFailure;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, StoreFuture, WatchEvent, WriteOp};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::lease_objects::{LABEL_DEPLOY_LEASE, LABEL_GROUP};

/// Which namespaces the store reads and watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (needs cluster-wide list and watch rights).
    AllNamespaces,
}

/// How long one watch request may stay open before it is renewed from its last version.
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// A pause before listing again after a failed list or watch.
const RELIST_BACKOFF: Duration = Duration::from_millis(500);

/// The store on a Kubernetes API server.
pub struct KubeStore {
    client: kube::Client,
    scope: Scope,
    events: broadcast::Sender<WatchEvent>,
    watchers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        for w in &self.watchers {
            w.abort();
        }
    }
}

/// The Kubernetes resource behind one of the store's kinds.
fn resource(kind: &str) -> Option<ApiResource> {
    let (group, version, plural) = match kind {
        KIND_GROUP => (
            bloodraven_kube::crd::GROUP,
            bloodraven_kube::crd::VERSION,
            "mysqlfailovergroups",
        ),
        KIND_DATABASE => (
            bloodraven_kube::crd::GROUP,
            bloodraven_kube::crd::VERSION,
            "mysqldatabases",
        ),
        KIND_LEASE => ("coordination.k8s.io", "v1", "leases"),
        KIND_EVENT => ("events.k8s.io", "v1", "events"),
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// The label selector of a kind's lists and watches: Bloodraven's own Leases and Events only.
fn selector(kind: &str) -> Option<&'static str> {
    match kind {
        KIND_LEASE => Some(LABEL_DEPLOY_LEASE),
        KIND_EVENT => Some(LABEL_GROUP),
        _ => None,
    }
}

fn unknown_kind(kind: &str) -> StoreError {
    StoreError::Invalid {
        reason: format!("the Kubernetes store does not hold {kind} objects"),
    }
}

fn read_failed(operation: &'static str, e: &kube::Error) -> StoreError {
    StoreError::Backend {
        operation,
        detail: e.to_string(),
    }
}

/// What a failed write proves, in the store's terms.
fn write_failed(
    operation: &'static str,
    key: &ObjectKey,
    sent_rv: &str,
    e: kube::Error,
) -> StoreError {
    match WriteFailure::classify(e) {
        WriteFailure::Conflict {
            reason, message, ..
        } => {
            if reason == "AlreadyExists" {
                StoreError::AlreadyExists { key: key.clone() }
            } else {
                StoreError::Conflict {
                    key: key.clone(),
                    expected: sent_rv.to_string(),
                    actual: message,
                }
            }
        }
        WriteFailure::Rejected { code: 404, .. } => StoreError::NotFound { key: key.clone() },
        WriteFailure::Rejected {
            code,
            reason,
            message,
        } => StoreError::Invalid {
            reason: format!("{key}: {code} {reason}: {message}"),
        },
        WriteFailure::NotSent { detail } => StoreError::Backend { operation, detail },
        WriteFailure::Unconfirmed { detail } => StoreError::Unconfirmed { operation, detail },
    }
}

/// `2026-11-30T10:00:30.123Z` → `2026-11-30T10:00:30.123000Z`: Lease times are `MicroTime`,
/// which the API server parses with exactly six fractional digits.
fn micro_time(t: &str) -> String {
    let Some(core) = t.strip_suffix('Z') else {
        return t.to_string();
    };
    let (secs, frac) = core.split_once('.').unwrap_or((core, ""));
    format!("{secs}.{:0<6}Z", &frac[..frac.len().min(6)])
}

/// `reportingController` of every event the operator writes.
pub const REPORTING_CONTROLLER: &str = "bloodraven.shipstream.io/operator";
/// `reportingInstance` of every event the operator writes.
pub const REPORTING_INSTANCE: &str = "bloodraven-operator";
/// The API server's limit on an event's `note`.
const NOTE_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A stored object as the API server wants it.
fn encode(obj: &RawObject) -> Result<DynamicObject, StoreError> {
    let mut v = serde_json::to_value(obj).map_err(|e| StoreError::Invalid {
        reason: e.to_string(),
    })?;
    match obj.kind.as_str() {
        KIND_LEASE => {
            for field in ["acquireTime", "renewTime"] {
                if let Some(Value::String(t)) = v.pointer_mut(&format!("/spec/{field}")) {
                    *t = micro_time(t);
                }
            }
        }
        KIND_EVENT => {
            // Bloodraven's event body → an events.k8s.io/v1 Event.
            let involved = v["involvedObject"].as_str().unwrap_or_default().to_string();
            let mut parts = involved.splitn(3, '/');
            let (kind, namespace, name) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let at = micro_time(v["eventTime"].as_str().unwrap_or_default());
            let note = truncate(v["message"].as_str().unwrap_or_default(), NOTE_BYTES).to_string();
            let reason = v["reason"].clone();
            if let Some(o) = v.as_object_mut() {
                for k in ["involvedObject", "message", "eventTime"] {
                    o.remove(k);
                }
            }
            v["regarding"] = json!({
                "apiVersion": API_VERSION, "kind": kind, "namespace": namespace, "name": name,
            });
            v["note"] = json!(note);
            v["action"] = reason;
            v["eventTime"] = json!(at);
            v["reportingController"] = json!(REPORTING_CONTROLLER);
            v["reportingInstance"] = json!(REPORTING_INSTANCE);
            if let Some(Value::String(t)) = v.pointer_mut("/series/lastObservedTime") {
                *t = micro_time(t);
            }
        }
        _ => {}
    }
    serde_json::from_value(v).map_err(|e| StoreError::Invalid {
        reason: e.to_string(),
    })
}

/// An object from the API server, in the store's shape.
fn decode(kind: &str, obj: DynamicObject) -> Result<RawObject, StoreError> {
    let mut v = serde_json::to_value(obj).map_err(|e| StoreError::Backend {
        operation: "decode an object",
        detail: e.to_string(),
    })?;
    let api_version = resource(kind).map(|r| r.api_version).unwrap_or_default();
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    if kind == KIND_EVENT {
        let r = &v["regarding"];
        let involved = format!(
            "{}/{}/{}",
            r["kind"].as_str().unwrap_or_default(),
            r["namespace"].as_str().unwrap_or_default(),
            r["name"].as_str().unwrap_or_default()
        );
        let note = v["note"].clone();
        if let Some(o) = v.as_object_mut() {
            for k in [
                "regarding",
                "related",
                "note",
                "action",
                "reportingController",
                "reportingInstance",
                "deprecatedSource",
                "deprecatedFirstTimestamp",
                "deprecatedLastTimestamp",
                "deprecatedCount",
            ] {
                o.remove(k);
            }
            o.insert("involvedObject".into(), json!(involved));
            o.insert("message".into(), note);
        }
    }
    serde_json::from_value(v).map_err(|e| StoreError::Backend {
        operation: "decode an object",
        detail: e.to_string(),
    })
}

impl KubeStore {
    /// A store on `client` (which must have retries off: see `bloodraven_kube::cluster`),
    /// reading and watching `scope`. Starts one watch per kind at once.
    pub fn new(client: kube::Client, scope: Scope) -> KubeStore {
        let (events, _) = broadcast::channel(4096);
        let mut store = KubeStore {
            client,
            scope,
            events,
            watchers: Vec::new(),
        };
        for kind in [KIND_GROUP, KIND_DATABASE, KIND_LEASE] {
            let api = store.scoped(kind, None);
            if let Some(api) = api {
                store
                    .watchers
                    .push(tokio::spawn(watch_kind(api, kind, store.events.clone())));
            }
        }
        store
    }

    /// The API for `kind` in `namespace`, or in the store's scope.
    fn scoped(&self, kind: &str, namespace: Option<&str>) -> Option<Api<DynamicObject>> {
        let ar = resource(kind)?;
        Some(match (namespace, &self.scope) {
            (Some(ns), _) => Api::namespaced_with(self.client.clone(), ns, &ar),
            (None, Scope::Namespace(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            (None, Scope::AllNamespaces) => Api::all_with(self.client.clone(), &ar),
        })
    }

    fn api(&self, key: &ObjectKey) -> Result<Api<DynamicObject>, StoreError> {
        self.scoped(&key.kind, Some(&key.namespace))
            .ok_or_else(|| unknown_kind(&key.kind))
    }

    async fn apply_one(&self, op: WriteOp) -> Result<Option<RawObject>, StoreError> {
        let pp = PostParams::default();
        match op {
            WriteOp::Create(obj) => {
                let key = obj.key();
                let api = self.api(&key)?;
                let written = api
                    .create(&pp, &encode(&obj)?)
                    .await
                    .map_err(|e| write_failed("create an object", &key, "", e))?;
                decode(&key.kind, written).map(Some)
            }
            WriteOp::Replace(obj) => {
                let key = obj.key();
                let api = self.api(&key)?;
                let rv = obj.metadata.resource_version.clone();
                let written = api
                    .replace(&key.name, &pp, &encode(&obj)?)
                    .await
                    .map_err(|e| write_failed("replace an object", &key, &rv, e))?;
                decode(&key.kind, written).map(Some)
            }
            WriteOp::ReplaceStatus(obj) => {
                let key = obj.key();
                if !has_status_subresource(&key.kind) {
                    return Err(StoreError::Invalid {
                        reason: format!("{} has no status subresource", key.kind),
                    });
                }
                let api = self.api(&key)?;
                let rv = obj.metadata.resource_version.clone();
                let written = api
                    .replace_status(&key.name, &pp, &encode(&obj)?)
                    .await
                    .map_err(|e| write_failed("replace a status", &key, &rv, e))?;
                decode(&key.kind, written).map(Some)
            }
            WriteOp::Delete {
                key,
                resource_version,
            } => {
                let api = self.api(&key)?;
                let dp = DeleteParams {
                    preconditions: resource_version.clone().map(|rv| Preconditions {
                        resource_version: Some(rv),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                let sent = resource_version.unwrap_or_default();
                api.delete(&key.name, &dp)
                    .await
                    .map_err(|e| write_failed("delete an object", &key, &sent, e))?;
                Ok(None)
            }
            WriteOp::DeleteIfExists { key } => {
                let api = self.api(&key)?;
                match api.delete(&key.name, &DeleteParams::default()).await {
                    Ok(_) => Ok(None),
                    Err(e) => match write_failed("delete an object", &key, "", e) {
                        StoreError::NotFound { .. } => Ok(None),
                        other => Err(other),
                    },
                }
            }
            // No transaction spans two objects in the Kubernetes API: a check here would be
            // stale by the next write, so it is refused rather than pretended.
            WriteOp::Require { key, .. } => Err(StoreError::Invalid {
                reason: format!(
                    "the Kubernetes API has no multi-object transactions: cannot require {key} unchanged within a batch"
                ),
            }),
        }
    }
}

impl Store for KubeStore {
    fn get<'a>(&'a self, key: &'a ObjectKey) -> StoreFuture<'a, Option<RawObject>> {
        Box::pin(async move {
            let api = self.api(key)?;
            match api.get_opt(&key.name).await {
                Ok(Some(o)) => decode(&key.kind, o).map(Some),
                Ok(None) => Ok(None),
                Err(e) => Err(read_failed("read an object", &e)),
            }
        })
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> StoreFuture<'a, Vec<RawObject>> {
        Box::pin(async move {
            let api = self
                .scoped(kind, namespace)
                .ok_or_else(|| unknown_kind(kind))?;
            let mut lp = ListParams::default();
            if let Some(s) = selector(kind) {
                lp = lp.labels(s);
            }
            let list = api
                .list(&lp)
                .await
                .map_err(|e| read_failed("list objects", &e))?;
            list.items.into_iter().map(|o| decode(kind, o)).collect()
        })
    }

    fn apply(&self, ops: Vec<WriteOp>) -> StoreFuture<'_, Vec<Option<RawObject>>> {
        Box::pin(async move {
            // In order, one request each; the first failure ends the batch (see the contract).
            let mut out = Vec::with_capacity(ops.len());
            for op in ops {
                out.push(self.apply_one(op).await?);
            }
            Ok(out)
        })
    }

    fn watch(&self) -> broadcast::Receiver<WatchEvent> {
        self.events.subscribe()
    }
}

/// Feeds `events` with the changes of one kind: list, then watch from the list's version;
/// renew the watch from the last version seen; on `410 Gone` or any failure, list again and
/// announce a [`WatchEvent::Resync`]. Runs until aborted.
async fn watch_kind(
    api: Api<DynamicObject>,
    kind: &'static str,
    events: broadcast::Sender<WatchEvent>,
) {
    let mut wp = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
    if let Some(s) = selector(kind) {
        wp = wp.labels(s);
    }
    let mut lp = ListParams::default();
    if let Some(s) = selector(kind) {
        lp = lp.labels(s);
    }
    let mut first = true;
    loop {
        let version = match api.list(&lp).await {
            Ok(list) => list.metadata.resource_version.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(kind, error = %e, "listing for the watch failed; retrying");
                tokio::time::sleep(RELIST_BACKOFF).await;
                continue;
            }
        };
        if !first {
            let _ = events.send(WatchEvent::Resync);
        }
        first = false;
        let mut version = version;
        'watching: loop {
            let stream = match api.watch(&wp, &version).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(kind, error = %e, "starting a watch failed; listing again");
                    break 'watching;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(kube::core::WatchEvent::Added(o) | kube::core::WatchEvent::Modified(o)) => {
                        if let Some(v) = o.metadata.resource_version.clone() {
                            version = v;
                        }
                        if let Ok(raw) = decode(kind, o) {
                            let _ = events.send(WatchEvent::Put(raw));
                        }
                    }
                    Ok(kube::core::WatchEvent::Deleted(o)) => {
                        if let Some(v) = o.metadata.resource_version.clone() {
                            version = v;
                        }
                        if let Ok(raw) = decode(kind, o) {
                            let _ = events.send(WatchEvent::Deleted(raw));
                        }
                    }
                    Ok(kube::core::WatchEvent::Bookmark(b)) => {
                        version = b.metadata.resource_version;
                    }
                    Ok(kube::core::WatchEvent::Error(status)) => {
                        tracing::info!(kind, code = status.code, reason = %status.reason, "the watch ended; listing again");
                        break 'watching;
                    }
                    Err(e) => {
                        tracing::warn!(kind, error = %e, "the watch failed; listing again");
                        break 'watching;
                    }
                }
            }
            // The watch request timed out: renew it from the last version seen.
        }
        tokio::time::sleep(RELIST_BACKOFF).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_and_event_times_in_the_api_servers_formats() {
        assert_eq!(
            micro_time("2026-11-30T10:00:30Z"),
            "2026-11-30T10:00:30.000000Z"
        );
        assert_eq!(
            micro_time("2026-11-30T10:00:30.12Z"),
            "2026-11-30T10:00:30.120000Z"
        );
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn events_round_trip_through_the_events_k8s_io_shape() {
        let raw: RawObject = serde_json::from_value(json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "g.1", "namespace": "db", "labels": {LABEL_GROUP: "g"}},
            "involvedObject": "MysqlFailoverGroup/db/g", "type": "Normal",
            "reason": "ActiveSiteBootstrapped", "message": "m",
            "eventTime": "2026-11-30T10:00:30.500Z",
            "series": {"count": 3, "lastObservedTime": "2026-11-30T10:01:00Z"}
        }))
        .unwrap();
        let k = encode(&raw).unwrap();
        let v = serde_json::to_value(&k).unwrap();
        assert_eq!(v["regarding"]["name"], "g");
        assert_eq!(v["note"], "m");
        assert_eq!(v["action"], "ActiveSiteBootstrapped");
        assert_eq!(v["eventTime"], "2026-11-30T10:00:30.500000Z");
        assert_eq!(
            v["series"]["lastObservedTime"],
            "2026-11-30T10:01:00.000000Z"
        );
        serde_json::from_value::<k8s_openapi::api::events::v1::Event>(v).unwrap();
        let back = decode(KIND_EVENT, k).unwrap();
        assert_eq!(back.body["involvedObject"], "MysqlFailoverGroup/db/g");
        assert_eq!(back.body["message"], "m");
        let body: bloodraven_core::resources::EventBody = back.decode().unwrap();
        assert_eq!(body.series.unwrap().count, 3);
        assert_eq!(body.event_time.to_rfc3339(), "2026-11-30T10:00:30.5Z");
    }
}
