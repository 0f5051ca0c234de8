//! JSON bodies exchanged between Bloodraven's own processes (operator ↔ sidecars ↔ peers).
//! The deploy API's bodies live with the deploy API.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// `GET /active-site` on the operator (SPEC §2.5), and the value sidecars relay to each other
/// on `/peer/active-site`.
///
/// The operator signs every view it serves (SPEC §8): `signature` (Ed25519, base64url) and
/// `keyId` cover [`ActiveSite::signed_bytes`], which carries the group, its namespace and the
/// sidecar timings of `spec.sidecar` beside the active site, so a relayed view can be checked
/// by any sidecar holding the operator's public key and cannot be moved to another group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveSite {
    /// Empty when the group has no active site.
    pub active_site: String,
    pub topology_generation: u64,
    /// When the operator observed this value (its clock).
    pub observed_at: Timestamp,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `spec.sidecar.leaseTimeout`, whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_timeout_seconds: Option<u64>,
    /// `spec.sidecar.peerCheckInterval`, whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_check_interval_seconds: Option<u64>,
    /// Ed25519 over [`ActiveSite::signed_bytes`], base64url without padding; empty when the
    /// operator has no signing key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
    /// Which operator key signed it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_id: String,
}

/// The signed part of a view, in its fixed field order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Signed<'a> {
    group: &'a str,
    namespace: &'a str,
    active_site: &'a str,
    topology_generation: u64,
    observed_at: Timestamp,
    lease_timeout_seconds: Option<u64>,
    peer_check_interval_seconds: Option<u64>,
}

impl ActiveSite {
    /// A view without group, timings or signature (tests, and operators without a key).
    pub fn new(
        active_site: impl Into<String>,
        topology_generation: u64,
        observed_at: Timestamp,
    ) -> Self {
        ActiveSite {
            active_site: active_site.into(),
            topology_generation,
            observed_at,
            group: String::new(),
            namespace: String::new(),
            lease_timeout_seconds: None,
            peer_check_interval_seconds: None,
            signature: String::new(),
            key_id: String::new(),
        }
    }

    /// The bytes the signature covers: the compact JSON of `{group, namespace, activeSite,
    /// topologyGeneration, observedAt, leaseTimeoutSeconds, peerCheckIntervalSeconds}`, in
    /// that order (an absent timing is `null`).
    pub fn signed_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&Signed {
            group: &self.group,
            namespace: &self.namespace,
            active_site: &self.active_site,
            topology_generation: self.topology_generation,
            observed_at: self.observed_at,
            lease_timeout_seconds: self.lease_timeout_seconds,
            peer_check_interval_seconds: self.peer_check_interval_seconds,
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_bytes_are_the_compact_json_in_the_contract_order() {
        let mut v = ActiveSite::new(
            "iad",
            17,
            Timestamp::parse_rfc3339("2026-11-30T10:00:30Z").unwrap(),
        );
        v.group = "playground".into();
        v.namespace = "default".into();
        v.lease_timeout_seconds = Some(20);
        v.peer_check_interval_seconds = Some(5);
        v.signature = "ignored".into();
        assert_eq!(
            String::from_utf8(v.signed_bytes()).unwrap(),
            r#"{"group":"playground","namespace":"default","activeSite":"iad","topologyGeneration":17,"observedAt":"2026-11-30T10:00:30Z","leaseTimeoutSeconds":20,"peerCheckIntervalSeconds":5}"#
        );
        // Old clients that know only the three original fields still read it.
        let text = serde_json::to_string(&v).unwrap();
        let back: ActiveSite = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
        let minimal: ActiveSite = serde_json::from_str(
            r#"{"activeSite":"iad","topologyGeneration":1,"observedAt":"2026-11-30T10:00:30Z"}"#,
        )
        .unwrap();
        assert!(minimal.signature.is_empty() && minimal.group.is_empty());
    }
}
