//! Who a component is: the identity a component certificate carries as its URI SAN.
//!
//! Every call between Bloodraven's components (sidecar ↔ sidecar, sidecar → operator,
//! operator → sidecar, router → operator) is mutual TLS with certificates from the
//! installation's component CA. The caller is the identity in its *verified* certificate,
//! never a query parameter or a header it chose. The identity names the party and its group:
//!
//! | party | URI SAN |
//! |---|---|
//! | a site's sidecar | `spiffe://bloodraven/<namespace>/<group>/<site>` |
//! | the operator | `spiffe://bloodraven/<namespace>/<group>/operator` |
//! | a router | `spiffe://bloodraven/<namespace>/<group>/router/<name>` |
//!
//! An operator that runs several groups holds one URI SAN per group in one certificate.
//! This module parses and renders those names and says whether one is the party a caller
//! expects ([`Expected`]); checking the chain is the runtime's (`bloodraven_runtime::mtls`).

use std::fmt;

use crate::names::{check_dns1123_label, check_dns1123_subdomain};

/// The trust domain of every component identity.
pub const TRUST_DOMAIN: &str = "bloodraven";
/// The URI scheme of a component identity.
pub const SCHEME: &str = "spiffe://";
/// The path segment that names the operator (so no site may be called that).
pub const OPERATOR_SEGMENT: &str = "operator";
/// The path segment that starts a router's name.
pub const ROUTER_SEGMENT: &str = "router";

/// Which party of a group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A site's sidecar.
    Site(String),
    /// The operator.
    Operator,
    /// A router, by name.
    Router(String),
}

/// A component's identity: a party of one group in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComponentId {
    pub namespace: String,
    pub group: String,
    pub role: Role,
}

/// Why a URI is not a component identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("{0:?} is not a spiffe://bloodraven/… identity")]
    NotOurs(String),
    #[error("{uri:?}: {part} {rule}")]
    BadPart {
        uri: String,
        part: &'static str,
        rule: String,
    },
    #[error(
        "{0:?} has the wrong shape: expected spiffe://bloodraven/<namespace>/<group>/<site>, …/operator or …/router/<name>"
    )]
    Shape(String),
}

impl ComponentId {
    pub fn site(namespace: &str, group: &str, site: &str) -> Self {
        ComponentId {
            namespace: namespace.to_string(),
            group: group.to_string(),
            role: Role::Site(site.to_string()),
        }
    }

    pub fn operator(namespace: &str, group: &str) -> Self {
        ComponentId {
            namespace: namespace.to_string(),
            group: group.to_string(),
            role: Role::Operator,
        }
    }

    pub fn router(namespace: &str, group: &str, name: &str) -> Self {
        ComponentId {
            namespace: namespace.to_string(),
            group: group.to_string(),
            role: Role::Router(name.to_string()),
        }
    }

    /// Checks every part against the rules its name must follow.
    pub fn check(&self) -> Result<(), IdentityError> {
        let uri = self.to_string();
        let bad = |part: &'static str, rule: &str| IdentityError::BadPart {
            uri: uri.clone(),
            part,
            rule: rule.to_string(),
        };
        check_dns1123_label(&self.namespace).map_err(|r| bad("namespace", r))?;
        check_dns1123_subdomain(&self.group).map_err(|r| bad("group", r))?;
        match &self.role {
            Role::Site(s) => {
                check_dns1123_label(s).map_err(|r| bad("site", r))?;
                if s == OPERATOR_SEGMENT || s == ROUTER_SEGMENT {
                    return Err(bad(
                        "site",
                        "must not be \"operator\" or \"router\" (they name the other parties)",
                    ));
                }
            }
            Role::Router(n) => check_dns1123_label(n).map_err(|r| bad("router name", r))?,
            Role::Operator => {}
        }
        Ok(())
    }

    /// Parses a URI SAN; anything that is not exactly one of the three shapes, with names
    /// that follow their rules, is refused.
    pub fn parse(uri: &str) -> Result<ComponentId, IdentityError> {
        let rest = uri
            .strip_prefix(SCHEME)
            .and_then(|r| r.strip_prefix(TRUST_DOMAIN))
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| IdentityError::NotOurs(uri.to_string()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let id = match parts.as_slice() {
            [ns, group, last] if *last == OPERATOR_SEGMENT => ComponentId::operator(ns, group),
            [ns, group, site] => ComponentId::site(ns, group, site),
            [ns, group, r, name] if *r == ROUTER_SEGMENT => ComponentId::router(ns, group, name),
            _ => return Err(IdentityError::Shape(uri.to_string())),
        };
        id.check()?;
        Ok(id)
    }

    /// The site's name, for a sidecar.
    pub fn site_name(&self) -> Option<&str> {
        match &self.role {
            Role::Site(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this identity belongs to `group` in `namespace`.
    pub fn in_group(&self, namespace: &str, group: &str) -> bool {
        self.namespace == namespace && self.group == group
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{TRUST_DOMAIN}/{}/{}/",
            self.namespace, self.group
        )?;
        match &self.role {
            Role::Site(s) => write!(f, "{s}"),
            Role::Operator => write!(f, "{OPERATOR_SEGMENT}"),
            Role::Router(n) => write!(f, "{ROUTER_SEGMENT}/{n}"),
        }
    }
}

/// Which party a caller or a server must be, for a connection to count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Exactly this party.
    Exactly(ComponentId),
    /// Any site's sidecar of this group (a peer: the sidecar knows its peers by address).
    AnySiteOf { namespace: String, group: String },
    /// The operator of this group.
    OperatorOf { namespace: String, group: String },
}

/// Why a verified identity is not the expected party.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{found} is not {wanted}")]
pub struct WrongParty {
    pub found: String,
    pub wanted: String,
}

impl Expected {
    /// The first of `ids` (a certificate's URI SANs, parsed) that is the expected party.
    pub fn pick<'a>(&self, ids: &'a [ComponentId]) -> Result<&'a ComponentId, WrongParty> {
        ids.iter()
            .find(|id| self.admits(id))
            .ok_or_else(|| WrongParty {
                found: if ids.is_empty() {
                    "a certificate without a spiffe://bloodraven/ identity".to_string()
                } else {
                    ids.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                wanted: self.to_string(),
            })
    }

    pub fn admits(&self, id: &ComponentId) -> bool {
        match self {
            Expected::Exactly(want) => id == want,
            Expected::AnySiteOf { namespace, group } => {
                id.in_group(namespace, group) && matches!(id.role, Role::Site(_))
            }
            Expected::OperatorOf { namespace, group } => {
                id.in_group(namespace, group) && id.role == Role::Operator
            }
        }
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Exactly(id) => write!(f, "{id}"),
            Expected::AnySiteOf { namespace, group } => {
                write!(f, "a site of group {group} in namespace {namespace}")
            }
            Expected::OperatorOf { namespace, group } => {
                write!(f, "the operator of group {group} in namespace {namespace}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_shapes_round_trip() {
        for id in [
            ComponentId::site("default", "playground", "iad"),
            ComponentId::operator("prod", "orders.eu"),
            ComponentId::router("default", "playground", "edge-1"),
        ] {
            let uri = id.to_string();
            assert_eq!(ComponentId::parse(&uri), Ok(id), "{uri}");
        }
        assert_eq!(
            ComponentId::site("default", "playground", "iad").to_string(),
            "spiffe://bloodraven/default/playground/iad"
        );
        assert_eq!(
            ComponentId::router("default", "playground", "edge-1").to_string(),
            "spiffe://bloodraven/default/playground/router/edge-1"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "https://bloodraven/default/playground/iad",
            "spiffe://other/default/playground/iad",
            "spiffe://bloodraven/default/playground",
            "spiffe://bloodraven/default/playground/iad/extra",
            "spiffe://bloodraven/default/playground/router",
            "spiffe://bloodraven/default/playground/router/a/b",
            "spiffe://bloodraven/Default/playground/iad",
            "spiffe://bloodraven/default/playground/IAD",
            "spiffe://bloodraven/default//iad",
            "spiffe://bloodraven/default/playground/router/Not_A_Name",
            "spiffe://bloodravenx/default/playground/iad",
        ] {
            assert!(ComponentId::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let long = format!("spiffe://bloodraven/default/playground/{}", "a".repeat(64));
        assert!(ComponentId::parse(&long).is_err());
        assert!(
            ComponentId::site("default", "g", "operator")
                .check()
                .is_err(),
            "a site may not be called operator"
        );
    }

    #[test]
    fn expectations_admit_only_their_party() {
        let iad = ComponentId::site("default", "playground", "iad");
        let other_group = ComponentId::site("default", "other", "iad");
        let op = ComponentId::operator("default", "playground");
        let router = ComponentId::router("default", "playground", "r");
        let peers = Expected::AnySiteOf {
            namespace: "default".into(),
            group: "playground".into(),
        };
        assert!(peers.admits(&iad));
        assert!(!peers.admits(&other_group));
        assert!(!peers.admits(&op));
        assert!(!peers.admits(&router));
        let ops = Expected::OperatorOf {
            namespace: "default".into(),
            group: "playground".into(),
        };
        assert!(ops.admits(&op) && !ops.admits(&iad));
        assert!(!ops.admits(&ComponentId::operator("prod", "playground")));
        // An operator's certificate names every group it runs: the one asked for is picked.
        let many = [ComponentId::operator("default", "a"), op.clone()];
        assert_eq!(ops.pick(&many), Ok(&op));
        let err = ops.pick(std::slice::from_ref(&iad)).unwrap_err();
        assert!(
            err.to_string()
                .contains("spiffe://bloodraven/default/playground/iad")
        );
        assert!(ops.pick(&[]).unwrap_err().found.contains("without"));
        assert!(Expected::Exactly(iad.clone()).admits(&iad));
        assert!(!Expected::Exactly(iad).admits(&other_group));
    }
}
