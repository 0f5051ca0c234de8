//! Deploy leases as stored objects: one `coordination.k8s.io/v1` Lease per live lease and
//! one per revocation tombstone, with the record (token hashes only) in an annotation.
//!
//! The lease engine's state is rebuilt from these objects at start-up ([`restore`]), and after
//! every decision the difference between the engine's state and the stored objects is written
//! back as one batch ([`plan_writes`]): tombstones first, then leases, then deletions, so a
//! back-end that applies a batch only partly never loses a revocation.

use std::collections::BTreeMap;

use bloodraven_core::contract::annotations::LEASE_RECORD;
use bloodraven_core::lease::{
    GroupLeases, LeaseKind, LeaseRecord, LeaseView, RestoreError, Tombstone,
};
use bloodraven_core::resources::{KIND_LEASE, LEASE_API_VERSION, ObjectMeta, OwnerReference};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{ObjectKey, RawObject, StoreError, WriteOp};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Label naming the group a deploy-lease object belongs to.
pub const LABEL_GROUP: &str = "bloodraven.shipstream.io/group";
/// Label saying what the object is: `migration`, `failover-hold` or `tombstone`.
pub const LABEL_DEPLOY_LEASE: &str = "bloodraven.shipstream.io/deploy-lease";
const TOMBSTONE: &str = "tombstone";

/// Object name of a group's live lease of `kind`.
pub fn lease_name(group: &str, kind: LeaseKind) -> String {
    format!("bloodraven-deploy-{group}-{kind}")
}

/// Object name of an operation's tombstone (operation ids are free text: hashed).
pub fn tombstone_name(group: &str, operation_id: &str) -> String {
    let h = Sha256::digest(operation_id.as_bytes());
    format!("bloodraven-revoked-{group}-{}", &hex::encode(h)[..20])
}

fn labels(group: &str, what: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_GROUP.to_string(), group.to_string()),
        (LABEL_DEPLOY_LEASE.to_string(), what.to_string()),
    ])
}

/// A lease object's metadata: named, labelled, owned by its group (so Kubernetes deletes it
/// with the group).
fn meta(
    namespace: &str,
    name: &str,
    group: &str,
    what: &str,
    owner: &OwnerReference,
) -> ObjectMeta {
    let mut meta = ObjectMeta::named(namespace, name);
    meta.labels = labels(group, what);
    if !owner.uid.is_empty() {
        meta.owner_references = vec![owner.clone()];
    }
    meta
}

fn lease_object(
    namespace: &str,
    group: &str,
    owner: &OwnerReference,
    rec: &LeaseRecord,
) -> Result<RawObject, StoreError> {
    let name = lease_name(group, rec.kind);
    let mut meta = meta(namespace, &name, group, rec.kind.as_str(), owner);
    meta.annotations
        .insert(LEASE_RECORD.to_string(), encode(rec)?);
    let spec = json!({
        "spec": {
            "holderIdentity": rec.operation_id,
            "leaseDurationSeconds": rec.ttl_seconds,
            "acquireTime": rec.granted_at,
            "renewTime": rec.renewed_at,
        }
    });
    RawObject::from_body(LEASE_API_VERSION, KIND_LEASE, meta, &spec)
}

fn tombstone_object(
    namespace: &str,
    group: &str,
    owner: &OwnerReference,
    t: &Tombstone,
) -> Result<RawObject, StoreError> {
    let name = tombstone_name(group, &t.operation_id);
    let mut meta = meta(namespace, &name, group, TOMBSTONE, owner);
    meta.annotations
        .insert(LEASE_RECORD.to_string(), encode(t)?);
    let spec = json!({ "spec": { "holderIdentity": t.operation_id } });
    RawObject::from_body(LEASE_API_VERSION, KIND_LEASE, meta, &spec)
}

fn encode<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid {
        reason: e.to_string(),
    })
}

/// The objects that represent `leases`, by object name.
pub fn desired(
    namespace: &str,
    group: &str,
    owner: &OwnerReference,
    leases: &GroupLeases,
) -> Result<BTreeMap<String, RawObject>, StoreError> {
    let mut out = BTreeMap::new();
    for rec in leases.records() {
        let o = lease_object(namespace, group, owner, rec)?;
        out.insert(o.metadata.name.clone(), o);
    }
    for t in leases.tombstones() {
        let o = tombstone_object(namespace, group, owner, t)?;
        out.insert(o.metadata.name.clone(), o);
    }
    Ok(out)
}

fn same_content(a: &RawObject, b: &RawObject) -> bool {
    a.body == b.body
        && a.metadata.annotations == b.metadata.annotations
        && a.metadata.labels == b.metadata.labels
}

/// The writes that turn `current` (stored objects by name) into `desired`: tombstone creations
/// first, then lease creations and replacements, then deletions.
pub fn plan_writes(
    current: &BTreeMap<String, RawObject>,
    desired: &BTreeMap<String, RawObject>,
) -> Vec<WriteOp> {
    let is_tombstone = |o: &RawObject| {
        o.metadata
            .labels
            .get(LABEL_DEPLOY_LEASE)
            .map(String::as_str)
            == Some(TOMBSTONE)
    };
    let mut tombstones = Vec::new();
    let mut leases = Vec::new();
    for (name, want) in desired {
        let op = match current.get(name) {
            None => Some(WriteOp::Create(want.clone())),
            Some(have) if !same_content(have, want) => {
                let mut w = want.clone();
                w.metadata
                    .resource_version
                    .clone_from(&have.metadata.resource_version);
                w.metadata.uid.clone_from(&have.metadata.uid);
                w.metadata.creation_timestamp = have.metadata.creation_timestamp;
                // What others keep on the object (finalizers, managed fields) stays.
                w.metadata.other.clone_from(&have.metadata.other);
                Some(WriteOp::Replace(w))
            }
            Some(_) => None,
        };
        if let Some(op) = op {
            if is_tombstone(want) {
                tombstones.push(op);
            } else {
                leases.push(op);
            }
        }
    }
    let deletes = current
        .iter()
        .filter(|(name, _)| !desired.contains_key(*name))
        .map(|(_, have)| WriteOp::Delete {
            key: ObjectKey::new(KIND_LEASE, &have.metadata.namespace, &have.metadata.name),
            resource_version: Some(have.metadata.resource_version.clone()),
        });
    tombstones
        .into_iter()
        .chain(leases)
        .chain(deletes)
        .collect()
}

/// Why stored lease objects could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("lease object {name} has no readable record: {detail}")]
    Record { name: String, detail: String },
    #[error(transparent)]
    Restore(#[from] RestoreError),
}

/// The live deploy leases among stored lease objects (any group's), with the group each
/// belongs to: what removing a group or database from a configuration would end. A record
/// that cannot be read counts as live (the refusal is the safe side).
pub fn live_leases(objects: &[RawObject], now: Timestamp) -> Vec<(String, LeaseView)> {
    objects
        .iter()
        .filter(|o| {
            o.metadata
                .labels
                .get(LABEL_DEPLOY_LEASE)
                .map(String::as_str)
                != Some(TOMBSTONE)
        })
        .filter_map(|o| {
            let group = o.metadata.labels.get(LABEL_GROUP)?.clone();
            let rec = o
                .metadata
                .annotations
                .get(LEASE_RECORD)
                .and_then(|t| serde_json::from_str::<LeaseRecord>(t).ok());
            match rec {
                Some(r) if !r.is_live(now) => None,
                Some(r) => Some((group, r.view())),
                None => Some((
                    group,
                    LeaseView {
                        kind: LeaseKind::Migration,
                        operation_id: format!("(unreadable record {})", o.metadata.name),
                        instance: String::new(),
                        expires_at: now,
                        topology_generation: 0,
                    },
                )),
            }
        })
        .collect()
}

/// Rebuilds the engine's state from a group's stored lease objects. When the records of a
/// live lease and a tombstone disagree (a batch applied only partly), the tombstone wins.
///
/// The state comes back at the generation its leases were stamped with (at most
/// `status_generation`); the caller then advances it to `status_generation`, which revokes
/// leases that a crash left behind a generation change.
pub fn restore(status_generation: u64, objects: &[RawObject]) -> Result<GroupLeases, LoadError> {
    let mut records = Vec::new();
    let mut tombstones: Vec<Tombstone> = Vec::new();
    for o in objects {
        let text = o
            .metadata
            .annotations
            .get(LEASE_RECORD)
            .ok_or_else(|| LoadError::Record {
                name: o.metadata.name.clone(),
                detail: format!("missing annotation {LEASE_RECORD}"),
            })?;
        let what = o
            .metadata
            .labels
            .get(LABEL_DEPLOY_LEASE)
            .map(String::as_str);
        let bad = |e: serde_json::Error| LoadError::Record {
            name: o.metadata.name.clone(),
            detail: e.to_string(),
        };
        if what == Some(TOMBSTONE) {
            tombstones.push(serde_json::from_str(text).map_err(bad)?);
        } else {
            records.push(serde_json::from_str::<LeaseRecord>(text).map_err(bad)?);
        }
    }
    records.retain(|r| !tombstones.iter().any(|t| t.operation_id == r.operation_id));
    let lease_generation = records
        .iter()
        .map(|r| r.topology_generation)
        .max()
        .unwrap_or(status_generation);
    if lease_generation > status_generation {
        return Err(LoadError::Restore(RestoreError::GenerationAhead {
            operation_id: records
                .iter()
                .find(|r| r.topology_generation == lease_generation)
                .map(|r| r.operation_id.clone())
                .unwrap_or_default(),
            lease: lease_generation,
            group: status_generation,
        }));
    }
    Ok(GroupLeases::restore(lease_generation, records, tombstones)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_core::health::{HealthInputs, assess};
    use bloodraven_core::lease::{GrantRequest, LeaseGate};
    use bloodraven_core::time::Timestamp;
    use bloodraven_core::token::SeededTokenSource;

    fn gate(g: u64) -> LeaseGate {
        LeaseGate {
            topology_generation: g,
            assessment: assess(&HealthInputs {
                replication_running: true,
                ..HealthInputs::default()
            }),
            retry_after_seconds: 1,
        }
    }

    fn stored(objs: BTreeMap<String, RawObject>) -> BTreeMap<String, RawObject> {
        objs.into_iter()
            .enumerate()
            .map(|(i, (n, mut o))| {
                o.metadata.resource_version = (i + 1).to_string();
                (n, o)
            })
            .collect()
    }

    #[test]
    fn objects_round_trip_and_never_hold_tokens() {
        let mut l = GroupLeases::new(3);
        let mut tokens = SeededTokenSource::new(1);
        let now = Timestamp::from_unix_seconds(1000);
        let req = |kind| GrantRequest {
            kind,
            operation_id: "op/1:with?any#chars".into(),
            instance: "counter-app".into(),
            ttl_seconds: Some(30),
        };
        let m = l
            .grant(&req(LeaseKind::Migration), &gate(3), now, &mut tokens)
            .unwrap();
        let h = l
            .grant(&req(LeaseKind::FailoverHold), &gate(3), now, &mut tokens)
            .unwrap();
        let objs = desired("default", "playground", &OwnerReference::default(), &l).unwrap();
        assert_eq!(objs.len(), 2);
        let text = serde_json::to_string(&objs).unwrap();
        assert!(!text.contains(m.token.expose()) && !text.contains(h.token.expose()));
        for o in objs.values() {
            assert!(bloodraven_core::names::check_dns1123_subdomain(&o.metadata.name).is_ok());
        }
        let back = restore(3, &objs.values().cloned().collect::<Vec<_>>()).unwrap();
        assert_eq!(back, l);

        // Revocation: the batch creates the tombstone before deleting the leases.
        l.revoke_all(now);
        let cur = stored(objs);
        let want = desired("default", "playground", &OwnerReference::default(), &l).unwrap();
        let ops = plan_writes(&cur, &want);
        assert!(
            matches!(&ops[0], WriteOp::Create(o) if o.metadata.name.starts_with("bloodraven-revoked-"))
        );
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, WriteOp::Delete { .. }))
                .count(),
            2
        );
        assert!(matches!(ops.last(), Some(WriteOp::Delete { .. })));
    }

    #[test]
    fn a_partly_applied_revocation_restores_as_revoked() {
        let mut l = GroupLeases::new(1);
        let mut tokens = SeededTokenSource::new(2);
        let now = Timestamp::from_unix_seconds(1000);
        l.grant(
            &GrantRequest {
                kind: LeaseKind::Migration,
                operation_id: "a".into(),
                instance: "db".into(),
                ttl_seconds: None,
            },
            &gate(1),
            now,
            &mut tokens,
        )
        .unwrap();
        let before = desired("default", "g", &OwnerReference::default(), &l).unwrap();
        l.revoke_all(now);
        let after = desired("default", "g", &OwnerReference::default(), &l).unwrap();
        // Only the tombstone creation landed: both objects exist.
        let mut both: Vec<RawObject> = before.values().cloned().collect();
        both.extend(after.values().cloned());
        let back = restore(1, &both).unwrap();
        assert!(back.live(now).is_empty());
        assert!(back.tombstone("a").is_some());
    }

    #[test]
    fn unchanged_objects_are_not_rewritten() {
        let l = GroupLeases::new(1);
        let want = desired("default", "g", &OwnerReference::default(), &l).unwrap();
        assert!(plan_writes(&stored(want.clone()), &want).is_empty());
    }
}
