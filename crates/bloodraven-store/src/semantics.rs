//! What every store does to the objects written into it, whichever back-end holds them: the
//! rules a Kubernetes API server applies to a create, a replace and a status write, so the
//! embedded (SQLite) and etcd stores answer exactly alike. The back-ends keep only what is
//! theirs: how a `resourceVersion` is made and how a write is made atomic.

use bloodraven_core::resources::has_status_subresource;
use serde_json::Value;

use crate::{ObjectKey, RawObject, StoreError};

/// A written object needs a kind and a name.
pub fn validate(obj: &RawObject) -> Result<(), StoreError> {
    if obj.metadata.name.is_empty() || obj.kind.is_empty() {
        return Err(StoreError::Invalid {
            reason: "an object needs a kind and metadata.name".into(),
        });
    }
    Ok(())
}

/// A status write needs a kind with a status subresource.
pub fn check_status_write(key: &ObjectKey) -> Result<(), StoreError> {
    if has_status_subresource(&key.kind) {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            reason: format!("{} has no status subresource", key.kind),
        })
    }
}

/// A new object's identity: a fresh uid, generation 1, and no status where the status is a
/// subresource (it is written only by a status write).
pub fn on_create(obj: &mut RawObject) {
    obj.metadata.uid = new_uid();
    obj.metadata.generation = 1;
    if has_status_subresource(&obj.kind) {
        obj.body.remove("status");
    }
}

/// A replace of `current` by `obj`: the identity (uid, creation time) is kept, so is the
/// status where it is a subresource, and the generation counts only changes outside the
/// status.
pub fn on_replace(obj: &mut RawObject, current: &RawObject) {
    obj.metadata.uid.clone_from(&current.metadata.uid);
    obj.metadata.creation_timestamp = current.metadata.creation_timestamp;
    if has_status_subresource(&obj.kind) {
        set_status(obj, current.body.get("status"));
    }
    obj.metadata.generation = if without_status(obj) == without_status(current) {
        current.metadata.generation
    } else {
        current.metadata.generation + 1
    };
}

/// A status write onto `current`: only its status changes, to `obj`'s (or none).
pub fn on_status_write(current: &mut RawObject, obj: &RawObject) {
    set_status(current, obj.body.get("status"));
}

fn set_status(obj: &mut RawObject, status: Option<&Value>) {
    match status {
        Some(st) => obj.body.insert("status".into(), st.clone()),
        None => obj.body.remove("status"),
    };
}

/// What `metadata.generation` counts: the body without the status.
fn without_status(obj: &RawObject) -> Vec<(&String, &Value)> {
    obj.body.iter().filter(|(k, _)| *k != "status").collect()
}

fn new_uid() -> String {
    let mut b = [0u8; 16];
    // The uid only has to be unique; without randomness from the OS it is all zeros but for
    // the version bits.
    let _ = getrandom::fill(&mut b);
    bloodraven_core::names::uuid_v4(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn group(spec: Value, status: Value) -> RawObject {
        let body = serde_json::Map::from_iter([("spec".into(), spec), ("status".into(), status)]);
        RawObject {
            api_version: "v1".into(),
            kind: bloodraven_core::resources::KIND_GROUP.into(),
            metadata: bloodraven_core::resources::ObjectMeta {
                name: "g".into(),
                namespace: "ns".into(),
                uid: "uid-1".into(),
                generation: 3,
                ..Default::default()
            },
            body,
        }
    }

    #[test]
    fn a_replace_keeps_identity_and_status_and_counts_only_spec_changes() {
        let current = group(json!({"a": 1}), json!({"activeSite": "iad"}));
        let mut same = group(json!({"a": 1}), json!({"activeSite": "pdx"}));
        same.metadata.uid = "other".into();
        on_replace(&mut same, &current);
        assert_eq!(same.metadata.uid, "uid-1");
        assert_eq!(
            same.metadata.generation, 3,
            "a status change is not a spec change"
        );
        assert_eq!(same.body["status"], json!({"activeSite": "iad"}));
        let mut changed = group(json!({"a": 2}), json!({}));
        on_replace(&mut changed, &current);
        assert_eq!(changed.metadata.generation, 4);
    }

    #[test]
    fn a_create_starts_at_generation_one_without_a_status_subresource() {
        let mut o = group(json!({}), json!({"activeSite": "iad"}));
        on_create(&mut o);
        assert_eq!(o.metadata.generation, 1);
        assert!(!o.body.contains_key("status"));
        assert_ne!(o.metadata.uid, "uid-1");
        let mut written = group(json!({"a": 1}), json!({}));
        on_status_write(&mut written, &group(json!({"a": 9}), json!({"x": 1})));
        assert_eq!(written.body["status"], json!({"x": 1}));
        assert_eq!(
            written.body["spec"],
            json!({"a": 1}),
            "only the status is written"
        );
    }
}
