//! The operator's rights in a cluster: every verb on every resource, each with the call that
//! needs it. The Helm chart's `Role`s and `ClusterRole`s, `bloodraven manifests` and the
//! Kubernetes-mode stories (whose fake API server grants exactly these rules and records what
//! it denied and what went unused) all read this one list, so a right cannot be added to the
//! install without a reason, nor be missing from it.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// Where a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// The namespaces whose groups the operator manages: one namespace (a `Role` there) or all
    /// of them (a `ClusterRole`).
    Watched,
    /// The operator's own namespace (a `Role`): its leader Lease, its Pod, its Secrets.
    Operator,
    /// Cluster-scoped resources (a `ClusterRole`).
    Cluster,
}

/// One right and why the operator needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `""` for the core group.
    pub api_group: &'static str,
    /// The plural, or `plural/subresource`.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// Needed only when the deploy API is on.
    pub deploy_api_only: bool,
    /// The calls that need it.
    pub reason: &'static str,
}

const GROUP: &str = crate::crd::GROUP;

/// Every right the operator needs, and no other.
pub const RULES: &[Rule] = &[
    Rule {
        api_group: GROUP,
        resource: "mysqlfailovergroups",
        verbs: &["get", "list", "watch", "update"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "read and watch the groups it manages; update removes a handled request annotation (planned failover, lease revocation) with a compare-and-swap",
    },
    Rule {
        api_group: GROUP,
        resource: "mysqlfailovergroups/status",
        verbs: &["update"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "write each group's status (active site, generation, sites, conditions, planned failover) with a compare-and-swap",
    },
    Rule {
        api_group: GROUP,
        resource: "mysqldatabases",
        verbs: &["get", "list", "watch"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "read the databases the deploy API's migration leases name",
    },
    Rule {
        api_group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update", "delete"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "deploy leases and revocation tombstones are Lease objects next to their group: granted (create), renewed (update), released or expired (delete), listed and watched to rebuild the in-memory state",
    },
    Rule {
        api_group: "events.k8s.io",
        resource: "events",
        verbs: &["get", "list", "create", "update", "delete"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "record events about a group (create), join a repeat to its series (get, update), prune the oldest beyond the group's budget (list, delete); never watched",
    },
    Rule {
        api_group: "",
        resource: "secrets",
        verbs: &["get"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "read the MySQL credentials a group names by Secret (username, password), again every 10 s so a rotation takes effect",
    },
    Rule {
        api_group: "",
        resource: "pods",
        verbs: &["list", "patch", "delete"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "find each site's MySQL Pods by spec.sites[].selector or its workload's selector (list), label them bloodraven.shipstream.io/role primary, replica or reader (patch), so a -primary Service follows the primary, and replace a drifted Pod in an ordered update (delete; its OnDelete StatefulSet starts it again at the update revision)",
    },
    Rule {
        api_group: "apps",
        resource: "statefulsets",
        verbs: &["get"],
        scope: Scope::Watched,
        deploy_api_only: false,
        reason: "read a site's workload (spec.sites[].workload): its Pod selector, its updateStrategy and status.updateRevision, to tell a drifted Pod in an ordered update",
    },
    Rule {
        api_group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::Operator,
        deploy_api_only: false,
        reason: "leader election: read, create and renew (or take over) the leader Lease",
    },
    Rule {
        api_group: "",
        resource: "pods",
        verbs: &["patch"],
        scope: Scope::Operator,
        deploy_api_only: false,
        reason: "label its own Pod bloodraven.shipstream.io/leader=true or false, so the Services route to the leader",
    },
    Rule {
        api_group: "",
        resource: "secrets",
        verbs: &["get"],
        scope: Scope::Operator,
        deploy_api_only: false,
        reason: "read the topology signing key and the deploy API's TLS certificate, again every 10 s so a rotation takes effect",
    },
    Rule {
        api_group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        scope: Scope::Cluster,
        deploy_api_only: true,
        reason: "check a deploy API caller's ServiceAccount token (audience bloodraven-deploy) with a TokenReview",
    },
];

/// The rules of `scope`, with or without the deploy API's.
pub fn rules(scope: Scope, deploy_api: bool) -> impl Iterator<Item = &'static Rule> {
    RULES
        .iter()
        .filter(move |r| r.scope == scope && (deploy_api || !r.deploy_api_only))
}

/// The rules of `scope` as RBAC `PolicyRule`s, one per rule, in [`RULES`]' order.
pub fn policy_rules(scope: Scope, deploy_api: bool) -> Vec<PolicyRule> {
    rules(scope, deploy_api)
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.api_group.to_string()]),
            resources: Some(vec![r.resource.to_string()]),
            verbs: r.verbs.iter().map(|v| (*v).to_string()).collect(),
            ..PolicyRule::default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_a_reason_known_verbs_and_no_wildcard() {
        let known = [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        for r in RULES {
            assert!(r.reason.len() > 20, "{r:?}");
            assert!(!r.resource.contains('*') && !r.api_group.contains('*'));
            assert!(r.verbs.iter().all(|v| known.contains(v)), "{r:?}");
        }
    }

    #[test]
    fn the_deploy_api_adds_only_the_token_review() {
        assert!(policy_rules(Scope::Cluster, false).is_empty());
        let c = policy_rules(Scope::Cluster, true);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0].resources.as_deref(),
            Some(&["tokenreviews".to_string()][..])
        );
        assert_eq!(
            policy_rules(Scope::Watched, false).len(),
            policy_rules(Scope::Watched, true).len()
        );
    }
}
