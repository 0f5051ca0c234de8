//! RBAC for one client of the fake: the requests of a chosen bearer are allowed only when a
//! rule grants their verb on their resource, in their namespace or cluster-wide, as the API
//! server's RBAC authorizer does (no aggregation, no `resourceNames`, no wildcards but `*`).
//! Every decision is recorded, so a test can show that a set of rules is enough (nothing
//! denied) and not more than needed (every rule used).

use hyper::Method;

/// One RBAC rule as a Role (namespace) or `ClusterRole` (cluster-wide) grants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `""` for the core group.
    pub api_group: String,
    /// The plural, or `plural/subresource` (`mysqlfailovergroups/status`).
    pub resource: String,
    pub verbs: Vec<String>,
    /// `None`: every namespace and cluster-scoped resources (a `ClusterRole` bound by a
    /// `ClusterRoleBinding`); `Some(ns)`: that namespace only (a Role).
    pub namespace: Option<String>,
}

/// The operator's rights ([`bloodraven_kube::rbac::RULES`]) as the install grants them: the
/// watched scope in `watched` (every namespace when `None`), the operator's scope in
/// `operator_namespace`, the cluster scope cluster-wide.
pub fn operator_rules(
    watched: Option<&str>,
    operator_namespace: &str,
    deploy_api: bool,
) -> Vec<Rule> {
    use bloodraven_kube::rbac::{RULES, Scope};
    RULES
        .iter()
        .filter(|r| deploy_api || !r.deploy_api_only)
        .map(|r| Rule {
            api_group: r.api_group.to_string(),
            resource: r.resource.to_string(),
            verbs: r.verbs.iter().map(|v| (*v).to_string()).collect(),
            namespace: match r.scope {
                Scope::Watched => watched.map(str::to_string),
                Scope::Operator => Some(operator_namespace.to_string()),
                Scope::Cluster => None,
            },
        })
        .collect()
}

/// What one request asks, in RBAC's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub namespace: Option<String>,
}

impl std::fmt::Display for Attributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe(
            &self.verb,
            &self.resource,
            &self.api_group,
            self.namespace.as_deref(),
        ))
    }
}

/// `verb resource.group in namespace`, as a denial or an unused rule is reported.
fn describe(verb: &str, resource: &str, api_group: &str, namespace: Option<&str>) -> String {
    let group = if api_group.is_empty() {
        "core"
    } else {
        api_group
    };
    format!(
        "{verb} {resource}.{group} in {}",
        namespace.unwrap_or("(cluster)")
    )
}

/// The attributes of a request, or `None` for a path RBAC does not cover.
pub fn attributes(method: &Method, path: &str, query: &str) -> Option<Attributes> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_group, rest): (&str, &[&str]) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
        rest => (None, rest),
    };
    let (resource, named) = match rest {
        [plural] => ((*plural).to_string(), false),
        [plural, _name] => ((*plural).to_string(), true),
        [plural, _name, sub] => (format!("{plural}/{sub}"), true),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return None,
    };
    Some(Attributes {
        verb: verb.to_string(),
        api_group: api_group.to_string(),
        resource,
        namespace,
    })
}

fn grants(rule: &Rule, a: &Attributes) -> bool {
    let scoped = match (&rule.namespace, &a.namespace) {
        (None, _) => true,
        (Some(r), Some(n)) => r == n,
        (Some(_), None) => false,
    };
    scoped
        && rule.api_group == a.api_group
        && (rule.resource == a.resource || rule.resource == "*")
        && rule.verbs.iter().any(|v| v == &a.verb || v == "*")
}

/// The rules of one bearer and what they decided.
#[derive(Debug, Default)]
pub struct Enforcer {
    pub bearer: String,
    pub rules: Vec<Rule>,
    /// Per rule, per verb: how many requests it allowed.
    pub used: Vec<Vec<usize>>,
    pub denied: Vec<Attributes>,
}

impl Enforcer {
    pub fn new(bearer: &str, rules: Vec<Rule>) -> Self {
        let used = rules.iter().map(|r| vec![0; r.verbs.len()]).collect();
        Enforcer {
            bearer: bearer.to_string(),
            rules,
            used,
            denied: Vec::new(),
        }
    }

    /// Whether `a` is allowed; records which rule allowed it, or the denial.
    pub fn check(&mut self, a: &Attributes) -> bool {
        for (i, rule) in self.rules.iter().enumerate() {
            if grants(rule, a) {
                if let Some(j) = rule.verbs.iter().position(|v| v == &a.verb || v == "*") {
                    self.used[i][j] += 1;
                }
                return true;
            }
        }
        self.denied.push(a.clone());
        false
    }

    /// Every (rule, verb) that allowed nothing, described.
    pub fn unused(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (rule, used) in self.rules.iter().zip(&self.used) {
            for (verb, n) in rule.verbs.iter().zip(used) {
                if *n == 0 {
                    out.push(describe(
                        verb,
                        &rule.resource,
                        &rule.api_group,
                        rule.namespace.as_deref(),
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_verbs_and_resources() {
        let a = |m: Method, p: &str, q: &str| attributes(&m, p, q).unwrap().to_string();
        assert_eq!(
            a(Method::GET, "/api/v1/namespaces/db/secrets/s", ""),
            "get secrets.core in db"
        );
        assert_eq!(
            a(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/db/leases",
                "watch=true&labelSelector=x"
            ),
            "watch leases.coordination.k8s.io in db"
        );
        assert_eq!(
            a(
                Method::GET,
                "/apis/bloodraven.shipstream.io/v1alpha1/mysqlfailovergroups",
                ""
            ),
            "list mysqlfailovergroups.bloodraven.shipstream.io in (cluster)"
        );
        assert_eq!(
            a(
                Method::PUT,
                "/apis/bloodraven.shipstream.io/v1alpha1/namespaces/db/mysqlfailovergroups/g/status",
                ""
            ),
            "update mysqlfailovergroups/status.bloodraven.shipstream.io in db"
        );
        assert_eq!(
            a(Method::PATCH, "/api/v1/namespaces/op/pods/p", ""),
            "patch pods.core in op"
        );
        assert_eq!(
            a(
                Method::POST,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                ""
            ),
            "create tokenreviews.authentication.k8s.io in (cluster)"
        );
    }

    #[test]
    fn a_role_grants_only_in_its_namespace_and_use_is_counted() {
        let mut e = Enforcer::new(
            "t",
            vec![Rule {
                api_group: String::new(),
                resource: "secrets".into(),
                verbs: vec!["get".into(), "list".into()],
                namespace: Some("op".into()),
            }],
        );
        let get = |ns: &str| {
            attributes(
                &Method::GET,
                &format!("/api/v1/namespaces/{ns}/secrets/s"),
                "",
            )
            .unwrap()
        };
        assert!(e.check(&get("op")));
        assert!(!e.check(&get("db")));
        assert_eq!(e.denied.len(), 1);
        assert_eq!(e.unused(), ["list secrets.core in op"]);
    }
}
