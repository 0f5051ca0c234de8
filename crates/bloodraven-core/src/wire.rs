//! Every JSON body that crosses a process boundary, defined once and used by the server and
//! the client alike, with each field's wire name exactly as documented:
//!
//! | body | server | clients |
//! |---|---|---|
//! | [`ActiveSite`] (`/active-site`, `/peer/active-site`) | operator, sidecars | sidecars |
//! | [`deploy`] (`/deploy/v1`: requests, answers, errors, the observation) | operator | deploy client, CLI, playground |
//! | [`SidecarStatus`] (sidecar `/status`, `snake_case` as documented) | sidecar | operator, dashboard |
//! | [`OperatorStatus`] (operator `/status`) | operator | `bloodraven status`, playground |

use std::collections::BTreeMap;

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
    /// `spec.emergencyFailover.fencing` when it is `strict` (the primary's sidecar then keeps
    /// a deadline inside its server); absent for `fast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<crate::config::FencingMode>,
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
    /// Absent (not `null`) for `fast`, so views signed before the field existed verify.
    #[serde(skip_serializing_if = "Option::is_none")]
    fencing: Option<crate::config::FencingMode>,
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
            fencing: None,
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
            fencing: self.fencing,
        })
        .unwrap_or_default()
    }
}

/// The deploy API's bodies (SPEC §3).
pub mod deploy {
    use std::fmt;

    use serde::{Deserialize, Serialize};

    use crate::lease::{Holder, LeaseKind, LeaseView};
    use crate::time::Timestamp;

    /// `POST /deploy/v1/groups/{group}/leases`. Unknown fields are refused (`400`).
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct GrantBody {
        /// Parsed by the server into a [`LeaseKind`], so a bad kind gets its own message.
        pub kind: String,
        pub operation_id: String,
        pub instance: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ttl_seconds: Option<i64>,
    }

    /// `PUT /deploy/v1/groups/{group}/leases/{kind}/{operationId}`.
    #[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct RenewBody {
        pub token: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ttl_seconds: Option<i64>,
    }

    impl fmt::Debug for RenewBody {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RenewBody")
                .field("token", &"<redacted>")
                .field("ttl_seconds", &self.ttl_seconds)
                .finish()
        }
    }

    /// `201`/`200` to a grant. The only body that carries a lease token.
    #[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct GrantAnswer {
        pub kind: LeaseKind,
        pub operation_id: String,
        pub token: String,
        pub expires_at: Timestamp,
        pub topology_generation: u64,
    }

    impl fmt::Debug for GrantAnswer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("GrantAnswer")
                .field("kind", &self.kind)
                .field("operation_id", &self.operation_id)
                .field("token", &"<redacted>")
                .field("expires_at", &self.expires_at)
                .field("topology_generation", &self.topology_generation)
                .finish()
        }
    }

    /// `200` to a renewal.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RenewAnswer {
        pub expires_at: Timestamp,
        pub topology_generation: u64,
    }

    /// Every error answer: `{"error": code, "message": sentence, ...}`; the extra fields
    /// appear with the codes that carry them.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ErrorBody {
        pub error: String,
        #[serde(default)]
        pub message: String,
        /// `409 held`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub holder: Option<Holder>,
        /// `423 unstable`, `409 revoked`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub reason: Option<String>,
        /// `423 unstable`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub retry_after_seconds: Option<u32>,
        /// `409 revoked`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub topology_generation: Option<u64>,
    }

    impl ErrorBody {
        pub fn new(error: &str, message: &str) -> Self {
            ErrorBody {
                error: error.to_string(),
                message: message.to_string(),
                ..ErrorBody::default()
            }
        }
    }

    /// `GET /deploy/v1/groups/{group}` (SPEC §3.3).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Observation {
        pub group: String,
        pub namespace: String,
        pub active_site: String,
        pub topology_generation: u64,
        pub health: HealthView,
        #[serde(default)]
        pub operations: Operations,
        pub stable: bool,
        #[serde(default)]
        pub unstable_reason: String,
        #[serde(default)]
        pub leases: Vec<LeaseView>,
    }

    /// `health` of the observation.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct HealthView {
        pub ready: bool,
        #[serde(default)]
        pub degraded_reason: String,
        pub replication_running: bool,
        pub replication_lag_seconds: Option<f64>,
        pub recovery_pending: bool,
    }

    /// `operations` of the observation: every in-flight operation.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Operations {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub planned_failover: Option<PlannedFailoverView>,
        /// The ordered update in flight; its own switchover shows here, not as
        /// `plannedFailover`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ordered_update: Option<OrderedUpdateView>,
        /// The restore-in-place in flight.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub restore_in_place: Option<RestoreInPlaceView>,
    }

    /// `operations.restoreInPlace`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RestoreInPlaceView {
        pub phase: String,
        pub target_site: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub admission: Option<crate::planned::Admission>,
    }

    /// `operations.orderedUpdate`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct OrderedUpdateView {
        pub phase: String,
        /// The site in progress (the switchover's target while failing over).
        #[serde(default)]
        pub site: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub admission: Option<crate::planned::Admission>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PlannedFailoverView {
        pub phase: String,
        pub target: String,
        #[serde(default)]
        pub admission: crate::planned::Admission,
    }
}

/// The sidecar's `/status` (documented in docs/sidecar.md; `snake_case` but for
/// `signedTopology`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SidecarStatus {
    pub site: String,
    pub group: String,
    pub namespace: String,
    /// `primary`, `replica`, `fenced` or `unknown`.
    pub role: String,
    pub mysql: SidecarMysql,
    pub self_fenced: bool,
    pub topology: Option<SidecarTopology>,
    pub topology_floor: Option<Timestamp>,
    pub last_operator_contact: Option<Timestamp>,
    pub last_peer_contact: Option<Timestamp>,
    pub peers: Vec<SidecarPeer>,
    /// Per calling site, as its verified certificate names it: when this sidecar last
    /// answered that site's sidecar (`/peer/ping`, `/peer/active-site`), and the newest view
    /// that sidecar said it holds (its receipt), as ages by this sidecar's clock when it
    /// answered (strict fencing's facts, docs/failover.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub heard_from: BTreeMap<String, HeardFrom>,
    /// Seconds since this sidecar started (it heard nobody before).
    #[serde(default)]
    pub up_seconds: f64,
    pub silent_for_seconds: f64,
    /// The effective timings, as durations (`20s`).
    pub lease_timeout: String,
    pub peer_check_interval: String,
    /// `flags`, `operator` or `pinned`.
    pub timings_source: String,
    #[serde(rename = "signedTopology")]
    pub signed_topology: bool,
    pub last_tick: Option<Timestamp>,
    /// Application sessions this sidecar killed after its fences, since it started.
    pub sessions_killed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The component certificate and CA bundle in use (they reload without a restart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ComponentTlsStatus>,
}

/// A component's certificate and CA bundle as in use now (sidecar and operator `/status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ComponentTlsStatus {
    /// The identities its certificate names (`spiffe://bloodraven/…`).
    pub identities: Vec<String>,
    /// When its certificate stops being valid.
    pub not_after: Timestamp,
    /// The SHA-256 fingerprint (hex) of its certificate.
    pub fingerprint: String,
    /// SHA-256 fingerprints (hex) of the CA certificates it trusts.
    pub trusted_cas: Vec<String>,
}
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SidecarMysql {
    pub reachable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub flavor: Option<String>,
    pub read_only: Option<bool>,
    /// `null` on MariaDB, which has no `super_read_only`.
    pub super_read_only: Option<bool>,
    pub gtid: Option<String>,
    /// `null` when the server is not a replica.
    pub replication: Option<SidecarReplication>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SidecarReplication {
    pub io_running: bool,
    pub sql_running: bool,
    pub seconds_behind: Option<u64>,
    pub source: String,
    pub last_io_error: String,
    pub last_sql_error: String,
}

/// `topology` of the sidecar's `/status`: the cached view and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarTopology {
    #[serde(flatten)]
    pub view: ActiveSite,
    /// `operator`, or the base URL of the peer that relayed it.
    pub source: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SidecarPeer {
    pub url: String,
    pub answering: Option<bool>,
    pub last_contact: Option<Timestamp>,
}

/// One entry of a sidecar's `heardFrom`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeardFrom {
    pub answered_seconds_ago: f64,
    /// The newest `topologyGeneration` the caller said it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_generation: Option<u64>,
    /// How long ago it first said it holds that generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_seconds_ago: Option<f64>,
    /// Its server's `read_only` as it said it read it while holding that generation (once
    /// `true`, it stays: the sidecar never unfences on its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_read_only: Option<bool>,
}

/// The operator's `/status`: every group (or one, with `?group=`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorStatus {
    pub groups: BTreeMap<String, GroupReport>,
    /// The control plane as this operator sees it, on a platform where several operators
    /// elect one (etcd); absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlPlane>,
    /// The component listener's certificate and CA bundle in use (`componentTLS`).
    #[serde(
        default,
        rename = "componentTls",
        skip_serializing_if = "Option::is_none"
    )]
    pub component_tls: Option<ComponentTlsStatus>,
}

/// Who leads the operators, as one of them sees it (`/status`, `/readyz`, `bloodraven status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    /// `etcd`.
    pub platform: String,
    /// This operator's identity (`host/pid@listen`).
    pub identity: String,
    /// The identity in the leader key at the last answer (`None`: nobody leads, or it is not
    /// known).
    pub leader: Option<String>,
    /// Whether this operator leads and may act now.
    pub leading: bool,
    /// Why the platform's store does not answer (no etcd quorum); absent while it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// One group of the operator's `/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupReport {
    pub namespace: String,
    pub spec: crate::config::FailoverGroupSpec,
    pub status: crate::status::GroupStatus,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The deploy API's observation of the group.
    pub deploy: deploy::Observation,
    /// The most recent events, newest first.
    #[serde(default)]
    pub events: Vec<crate::resources::EventBody>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_carry_only_their_fields() {
        let e = deploy::ErrorBody::new("not_found", "no such lease");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":"not_found","message":"no such lease"}"#
        );
        let e = deploy::ErrorBody {
            reason: Some("TopologyChanged".into()),
            topology_generation: Some(18),
            ..deploy::ErrorBody::new("revoked", "m")
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":"revoked","message":"m","reason":"TopologyChanged","topologyGeneration":18}"#
        );
        let g = deploy::GrantAnswer {
            kind: crate::lease::LeaseKind::Migration,
            operation_id: "op".into(),
            token: "secret-value".into(),
            expires_at: Timestamp::from_unix_seconds(0),
            topology_generation: 1,
        };
        assert!(!format!("{g:?}").contains("secret-value"));
        let r = deploy::RenewBody {
            token: "secret-value".into(),
            ttl_seconds: None,
        };
        assert!(!format!("{r:?}").contains("secret-value"));
        assert!(
            serde_json::from_str::<deploy::GrantBody>(
                r#"{"kind":"migration","operationId":"a","instance":"b","x":1}"#
            )
            .is_err()
        );
    }

    #[test]
    fn a_sidecar_status_reads_back_with_its_documented_names() {
        let s = SidecarStatus {
            self_fenced: true,
            signed_topology: true,
            lease_timeout: "20s".into(),
            ..SidecarStatus::default()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["self_fenced"], true);
        assert_eq!(v["signedTopology"], true);
        assert_eq!(v["lease_timeout"], "20s");
        let back: SidecarStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        // Tolerant of what it does not know.
        let old: SidecarStatus =
            serde_json::from_str(r#"{"self_fenced":false,"extra":1}"#).unwrap();
        assert!(!old.self_fenced);
    }

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
        // Strict fencing is signed too (a relaying peer cannot drop it); absent for fast, so
        // the bytes above (and every view signed before the field) stay as they were.
        let mut strict = v.clone();
        strict.fencing = Some(crate::config::FencingMode::Strict);
        assert!(
            String::from_utf8(strict.signed_bytes())
                .unwrap()
                .ends_with(r#""peerCheckIntervalSeconds":5,"fencing":"strict"}"#)
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
