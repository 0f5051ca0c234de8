//! After a rollout succeeds: which image digest the nodes actually pulled, so a later rollback
//! releases exactly those bytes (seed 03: "a rollback takes a successful release record's image
//! digest").
//!
//! The new `ReplicaSet` is the one owned by the Deployment whose Pod template carries this
//! release's annotation (`devopspad.io/release: <plan-id>`); its Pods are those with its
//! `pod-template-hash` label and it as owner. Each Pod's `status.containerStatuses[].imageID`
//! of the released container gives the digest. Recorded only when every Pod names the same
//! pullable `repository@sha256:…`; otherwise nothing is recorded and the reason is.

use std::collections::BTreeSet;

use bloodraven_core::release::{RELEASE_ANNOTATION, image_digest};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

/// What the read found: a digest, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PulledDigest {
    /// `sha256:<64 hex>`, when every Pod of the new `ReplicaSet` reported the same pullable one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Why no digest was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl PulledDigest {
    fn none(note: impl Into<String>) -> Self {
        PulledDigest {
            digest: None,
            note: Some(note.into()),
        }
    }
}

/// Why a container status's `imageID` names nothing a registry serves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotPullable {
    #[error("imageID {0:?} carries no sha256 digest")]
    NoDigest(String),
    #[error("imageID {0:?} has no repository (a node-local image): not pullable")]
    NoRepository(String),
}

/// The digest in a container status's `imageID`: `repository@sha256:…` (after an optional
/// `docker-pullable://` or `docker://` scheme). A bare `sha256:…` names a local image
/// configuration, not something a registry serves: `Err` says so.
pub fn digest_of_image_id(image_id: &str) -> Result<String, NotPullable> {
    let id = image_id
        .strip_prefix("docker-pullable://")
        .or_else(|| image_id.strip_prefix("docker://"))
        .unwrap_or(image_id);
    match id.rsplit_once('@') {
        Some((repository, _)) if !repository.is_empty() => image_digest(id)
            .map(str::to_owned)
            .ok_or_else(|| NotPullable::NoDigest(image_id.to_string())),
        _ => Err(NotPullable::NoRepository(image_id.to_string())),
    }
}

/// Reads what the Pods of the release `plan_id`'s `ReplicaSet` of Deployment `uid` pulled for
/// `container`. Never fails: a refused or broken read becomes a note.
pub async fn read(
    client: &Client,
    namespace: &str,
    uid: &str,
    plan_id: &str,
    container: &str,
) -> PulledDigest {
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let list = match sets.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => return PulledDigest::none(refused("ReplicaSets", namespace, &e)),
    };
    let Some(rs) = list.items.iter().find(|rs| {
        let owned = rs
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        let ours = rs
            .spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(RELEASE_ANNOTATION))
            .is_some_and(|v| v == plan_id);
        owned && ours
    }) else {
        return PulledDigest::none(
            "no ReplicaSet of the Deployment carries this release's template",
        );
    };
    let Some(hash) = rs
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"))
    else {
        return PulledDigest::none("the new ReplicaSet has no pod-template-hash label");
    };
    let rs_uid = rs.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = match pods
        .list(&ListParams::default().labels(&format!("pod-template-hash={hash}")))
        .await
    {
        Ok(l) => l,
        Err(e) => return PulledDigest::none(refused("Pods", namespace, &e)),
    };
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for pod in list.items.iter().filter(|p| {
        p.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == rs_uid)
    }) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let id = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == container))
            .map(|c| c.image_id.clone())
            .filter(|id| !id.is_empty());
        match id.as_deref().map(digest_of_image_id) {
            Some(Ok(d)) => {
                seen.insert(d);
            }
            Some(Err(why)) => problems.push(format!("{name}: {why}")),
            None => problems.push(format!("{name}: no imageID for container {container} yet")),
        }
    }
    if let Some(p) = problems.first() {
        return PulledDigest::none(p.clone());
    }
    match seen.len() {
        0 => PulledDigest::none("the new ReplicaSet has no Pods"),
        1 => PulledDigest {
            digest: seen.into_iter().next(),
            note: None,
        },
        _ => PulledDigest::none(format!(
            "the Pods of the new ReplicaSet report different digests ({})",
            seen.into_iter().collect::<Vec<_>>().join(", ")
        )),
    }
}

fn refused(what: &str, namespace: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "not allowed to list {what} in {namespace} ({}): grant list on replicasets and pods to record the digest the nodes pulled",
            s.message
        ),
        other => format!("could not list {what} in {namespace}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_with_and_without_a_repository() {
        let d = format!("sha256:{}", "ab".repeat(32));
        for id in [
            format!("registry.example/web@{d}"),
            format!("docker-pullable://registry.example/web@{d}"),
            format!("docker.io/library/nginx@{d}"),
        ] {
            assert_eq!(digest_of_image_id(&id).as_deref(), Ok(d.as_str()), "{id}");
        }
        assert!(
            digest_of_image_id(&d)
                .unwrap_err()
                .to_string()
                .contains("has no repository")
        );
        assert!(digest_of_image_id("registry.example/web@sha256:short").is_err());
        assert!(digest_of_image_id("").is_err());
    }
}
