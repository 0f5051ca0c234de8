//! The objects Bloodraven stores, shaped like Kubernetes objects: `metadata` plus a body.
//! The embedded store and the Kubernetes back-end hold the same shapes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{FailoverGroupSpec, FieldError, ValidationErrors};
use crate::names::{check_dns1123_label, check_dns1123_subdomain};
use crate::status::GroupStatus;
use crate::time::Timestamp;

/// `apiVersion` of Bloodraven's resources.
pub const API_VERSION: &str = "bloodraven.shipstream.io/v1alpha1";
pub const KIND_GROUP: &str = "MysqlFailoverGroup";
pub const KIND_DATABASE: &str = "MysqlDatabase";
pub const KIND_LEASE: &str = "Lease";
pub const KIND_EVENT: &str = "Event";
pub const LEASE_API_VERSION: &str = "coordination.k8s.io/v1";
pub const EVENT_API_VERSION: &str = "events.k8s.io/v1";

/// Kinds whose `status` is a subresource: written only by a status write, never by a write of
/// the object (which keeps the stored status), and ignored on create. As in Kubernetes.
pub const STATUS_SUBRESOURCE_KINDS: &[&str] = &[KIND_GROUP];

/// Whether `kind`'s status is a subresource (see [`STATUS_SUBRESOURCE_KINDS`]).
pub fn has_status_subresource(kind: &str) -> bool {
    STATUS_SUBRESOURCE_KINDS.contains(&kind)
}

/// `metadata.ownerReferences[]`: the object is deleted with its owner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
}

/// `metadata` of a stored object. Fields Bloodraven does not use (finalizers, managed fields,
/// …) are kept in `other` and written back as they were read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Opaque to clients; the store's compare-and-swap token.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl ObjectMeta {
    pub fn named(namespace: &str, name: &str) -> Self {
        ObjectMeta {
            name: name.to_string(),
            namespace: namespace.to_string(),
            ..ObjectMeta::default()
        }
    }
}

/// The body of a `MysqlFailoverGroup`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailoverGroupBody {
    pub spec: FailoverGroupSpec,
    #[serde(default)]
    pub status: GroupStatus,
}

/// `MysqlDatabase.spec.failoverGroupRef`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::group_ref)
)]
pub struct GroupRef {
    pub name: String,
}

/// One entry of `MysqlDatabase.spec.deploymentClients`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::deployment_client)
)]
pub struct DeploymentClient {
    pub namespace: String,
    pub service_account: String,
}

/// `MysqlDatabase.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::database_spec)
)]
pub struct DatabaseSpec {
    pub failover_group_ref: GroupRef,
    #[serde(default)]
    pub deployment_clients: Vec<DeploymentClient>,
    /// The SQL schema, for humans; leases name the resource, not the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
}

/// The body of a `MysqlDatabase`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatabaseBody {
    pub spec: DatabaseSpec,
}

impl DatabaseSpec {
    /// Whether `namespace:service_account` may coordinate deployments of `group`.
    pub fn authorizes(&self, group: &str, namespace: &str, service_account: &str) -> bool {
        self.failover_group_ref.name == group
            && self
                .deployment_clients
                .iter()
                .any(|c| c.namespace == namespace && c.service_account == service_account)
    }

    /// Checks names and the one-pair-per-namespace rule. `name` is the resource name.
    pub fn validate(&self, name: &str, namespace: &str) -> Result<(), ValidationErrors> {
        let mut e = Vec::new();
        let mut push = |field: String, rule: String| e.push(FieldError { field, rule });
        if let Err(r) = check_dns1123_subdomain(name) {
            push("metadata.name".into(), r.into());
        }
        if let Err(r) = check_dns1123_label(namespace) {
            push("metadata.namespace".into(), r.into());
        }
        if let Err(r) = check_dns1123_subdomain(&self.failover_group_ref.name) {
            push("spec.failoverGroupRef.name".into(), r.into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in self.deployment_clients.iter().enumerate() {
            if let Err(r) = check_dns1123_label(&c.namespace) {
                push(format!("spec.deploymentClients[{i}].namespace"), r.into());
            } else if !seen.insert(c.namespace.clone()) {
                push(
                    format!("spec.deploymentClients[{i}].namespace"),
                    format!(
                        "lists namespace {:?} twice (one serviceAccount per namespace)",
                        c.namespace
                    ),
                );
            }
            if let Err(r) = check_dns1123_subdomain(&c.service_account) {
                push(
                    format!("spec.deploymentClients[{i}].serviceAccount"),
                    r.into(),
                );
            }
        }
        if e.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(e))
        }
    }
}

/// An event on an object (a `v1` Event's essentials).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventBody {
    /// `kind/namespace/name` of the object the event is about.
    pub involved_object: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub event_time: Timestamp,
    /// The same event seen again: how often, and when last (Kubernetes' event series).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<EventSeries>,
}

/// `series` of a repeated event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventSeries {
    pub count: u32,
    pub last_observed_time: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DatabaseSpec {
        DatabaseSpec {
            failover_group_ref: GroupRef {
                name: "playground".into(),
            },
            deployment_clients: vec![DeploymentClient {
                namespace: "ci".into(),
                service_account: "deployer".into(),
            }],
            schema: None,
        }
    }

    #[test]
    fn authorization_needs_group_and_pair() {
        let s = spec();
        assert!(s.authorizes("playground", "ci", "deployer"));
        assert!(!s.authorizes("other", "ci", "deployer"));
        assert!(!s.authorizes("playground", "ci", "someone"));
        assert!(!s.authorizes("playground", "prod", "deployer"));
    }

    #[test]
    fn one_pair_per_namespace() {
        let mut s = spec();
        s.deployment_clients.push(DeploymentClient {
            namespace: "ci".into(),
            service_account: "other".into(),
        });
        let err = s.validate("counter-app", "default").unwrap_err();
        assert!(err.has("spec.deploymentClients[1].namespace"), "{err}");
        assert!(spec().validate("counter-app", "default").is_ok());
        assert!(
            spec()
                .validate("Counter", "default")
                .unwrap_err()
                .has("metadata.name")
        );
    }

    #[test]
    fn unknown_fields_rejected() {
        let err = serde_json::from_str::<DatabaseBody>(
            r#"{"spec":{"failoverGroupRef":{"name":"g"},"deploymentClient":[]}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("deploymentClient"), "{err}");
    }
}
