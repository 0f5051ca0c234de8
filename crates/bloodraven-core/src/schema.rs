//! The JSON schemas of the resource types (feature `schema`): the bounds, patterns, defaults
//! and CEL rules a Kubernetes API server applies to `MysqlFailoverGroup` and `MysqlDatabase`.
//!
//! Each rule here restates one of [`crate::config`]'s (or [`crate::resources`]') checks in the
//! API server's terms, so a spec the cluster accepts is one the operator accepts, and the other
//! way round (`bloodraven-kube`'s tests hold both to the same cases). Rules that need no CEL
//! are schema keywords (`pattern`, `maxLength`, `minimum`, list types); the rest are
//! `x-kubernetes-validations` with the message the operator would give and the field it names.
//! Every list and string has a bound, so the API server's CEL cost estimate stays within
//! budget.
//!
//! The types opt in with `#[schemars(transform = …)]`; the functions below edit the schema
//! schemars derived for the type. They never read a clock or do IO.

use std::time::Duration;

use schemars::Schema;
use serde_json::{Map, Value, json};

use crate::defaults;

/// A DNS-1123 label (`names::check_dns1123_label`).
pub const DNS1123_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS-1123 subdomain (`names::check_dns1123_subdomain`).
pub const DNS1123_SUBDOMAIN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A duration as `duration::parse_duration` reads it, which is also what CEL's `duration()`
/// reads: one or more number–unit pairs.
pub const DURATION: &str = "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$";
/// An `http://` or `https://` URL with a host.
pub const URL: &str = "^https?://[^/\\s][^\\s]*$";

/// The most sites a group may list.
pub const MAX_SITES: u64 = 16;
/// The most deployment clients a database may list.
pub const MAX_DEPLOYMENT_CLIENTS: u64 = 64;

/// `duration` in the form CEL and [`crate::duration::parse_duration`] both read (`20s`, `5m`,
/// `1500ms`).
pub fn duration_literal(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}

/// One `x-kubernetes-validations` entry.
fn rule(rule: &str, message: &str, field_path: Option<&str>) -> Value {
    let mut r = json!({ "rule": rule, "message": message });
    if let Some(p) = field_path {
        r["fieldPath"] = json!(p);
    }
    r
}

fn add_rules(schema: &mut Schema, rules: Vec<Value>) {
    let obj = schema.ensure_object();
    let list = obj
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(l) = list {
        l.extend(rules);
    }
}

/// Applies `edit` to the schema of property `name`. The derive emits every property as an
/// object; were one missing, the edit is skipped and `bloodraven-kube`'s tests, which look for
/// every bound in the generated CRDs, fail.
fn with_property(schema: &mut Schema, name: &str, edit: impl FnOnce(&mut Map<String, Value>)) {
    if let Some(Value::Object(p)) = schema
        .ensure_object()
        .get_mut("properties")
        .and_then(|props| props.get_mut(name))
    {
        edit(p);
    }
}

/// Sets keywords on property `name`.
fn set(schema: &mut Schema, name: &str, pairs: &[(&str, Value)]) {
    with_property(schema, name, |p| {
        for (k, v) in pairs {
            p.insert((*k).to_string(), v.clone());
        }
    });
}

fn string_keywords(max: u64, pattern: Option<&str>) -> Vec<(&'static str, Value)> {
    let mut k = vec![("maxLength", json!(max))];
    if let Some(pat) = pattern {
        k.push(("pattern", json!(pat)));
    }
    k
}

/// A string property with a length bound and, optionally, a pattern.
fn string(schema: &mut Schema, name: &str, max: u64, pattern: Option<&str>) {
    set(schema, name, &string_keywords(max, pattern));
}

/// A duration field: the pattern, a bound, and (with `min`) a CEL floor.
fn duration_property(schema: &mut Schema, name: &str, min: Option<Duration>) {
    string(schema, name, 32, Some(DURATION));
    if let Some(min) = min {
        let lit = duration_literal(min);
        let floor = rule(
            &format!("duration(self) >= duration('{lit}')"),
            &format!("must be at least {lit}"),
            None,
        );
        set(
            schema,
            name,
            &[("x-kubernetes-validations", json!([floor]))],
        );
    }
}

/// A whole number of seconds (sidecar timings travel in seconds in the signed view).
fn whole_seconds(field: &str) -> Value {
    rule(
        &format!(
            "!has(self.{field}) || duration(self.{field}) == duration(string(duration(self.{field}).getSeconds()) + 's')"
        ),
        "must be a whole number of seconds",
        Some(&format!(".{field}")),
    )
}

/// `MysqlFailoverGroup.spec`.
pub fn failover_group_spec(schema: &mut Schema) {
    set(
        schema,
        "sites",
        &[
            ("minItems", json!(1)),
            ("maxItems", json!(MAX_SITES)),
            ("x-kubernetes-list-type", json!("map")),
            ("x-kubernetes-list-map-keys", json!(["name"])),
        ],
    );
    duration_property(schema, "pollInterval", Some(Duration::from_millis(100)));
    duration_property(schema, "failoverCooldown", None);
    let poll = duration_literal(defaults::POLL_INTERVAL);
    let cooldown = duration_literal(defaults::FAILOVER_COOLDOWN);
    set(schema, "pollInterval", &[("default", json!(poll))]);
    set(schema, "failoverCooldown", &[("default", json!(cooldown))]);
    for (name, default) in [
        ("failureThreshold", defaults::FAILURE_THRESHOLD),
        ("recoveryThreshold", defaults::RECOVERY_THRESHOLD),
    ] {
        let keywords = [
            ("minimum", json!(1)),
            ("maximum", json!(1000)),
            ("default", json!(default)),
        ];
        set(schema, name, &keywords);
    }
    string(schema, "bootstrapSite", 63, Some(DNS1123_LABEL));
    let candidate = "(!has(s.role) || s.role == 'primary-candidate')";
    add_rules(
        schema,
        vec![
            rule(
                &format!("self.sites.exists(s, {candidate})"),
                "must contain at least one site with role primary-candidate",
                Some(".sites"),
            ),
            rule(
                &format!(
                    "!has(self.bootstrapSite) || self.sites.exists(s, s.name == self.bootstrapSite && {candidate})"
                ),
                "must name a primary-candidate site of spec.sites",
                Some(".bootstrapSite"),
            ),
            rule(
                "!has(self.splitBrainPolicy) || !has(self.splitBrainPolicy.sitePriorities) || self.splitBrainPolicy.sitePriorities.all(p, self.sites.exists(s, s.name == p))",
                "names a site that is not in spec.sites",
                Some(".splitBrainPolicy.sitePriorities"),
            ),
        ],
    );
}

/// `spec.sites[]`.
pub fn site_spec(schema: &mut Schema) {
    string(schema, "name", 63, Some(DNS1123_LABEL));
    let priority = [
        ("minimum", json!(-1000)),
        ("maximum", json!(1000)),
        ("default", json!(0)),
    ];
    set(schema, "priority", &priority);
    set(schema, "role", &[("default", json!("primary-candidate"))]);
    string(schema, "selector", 1024, None);
    set(schema, "selector", &[("minLength", json!(1))]);
}

/// `spec.sites[].workload`.
pub fn workload_spec(schema: &mut Schema) {
    string(schema, "name", 253, Some(DNS1123_SUBDOMAIN));
}

/// `spec.sites[].mysql`.
pub fn mysql_endpoint_spec(schema: &mut Schema) {
    string(schema, "host", 253, Some("^[^\\s]+$"));
    set(schema, "host", &[("minLength", json!(1))]);
    set(
        schema,
        "port",
        &[("minimum", json!(1)), ("maximum", json!(65535))],
    );
}

/// A reference to credentials: a Secret (Kubernetes) or a file (embedded mode), never both.
pub fn credentials_ref(schema: &mut Schema) {
    string(schema, "secretName", 253, Some(DNS1123_SUBDOMAIN));
    string(schema, "file", 4096, None);
    set(schema, "file", &[("minLength", json!(1))]);
    add_rules(
        schema,
        vec![rule(
            "has(self.secretName) != has(self.file)",
            "must set exactly one of secretName and file",
            None,
        )],
    );
}

/// `spec.sites[].sidecar`.
pub fn sidecar_endpoint_spec(schema: &mut Schema) {
    string(schema, "url", 2048, Some(URL));
}

/// `spec.replication`.
pub fn replication_spec(schema: &mut Schema) {
    let lag = [("minimum", json!(0)), ("maximum", json!(31_536_000))];
    set(schema, "maxLagSeconds", &lag);
}

/// `spec.plannedFailover`.
pub fn planned_failover_spec(schema: &mut Schema) {
    duration_property(schema, "maxLagWait", Some(Duration::from_secs(1)));
    duration_property(schema, "drainTimeout", None);
}

/// `spec.operationTimeouts`: durations of at least 10 s.
pub fn operation_timeouts_spec(schema: &mut Schema) {
    for name in [
        "plannedFailover",
        "orderedUpdate",
        "restoreInPlace",
        "reclone",
    ] {
        duration_property(schema, name, Some(defaults::MIN_OPERATION_TIMEOUT));
    }
}

/// `spec.backup`: the target's scheme, the source's values, a schedule's length.
pub fn backup_spec(schema: &mut Schema) {
    string(schema, "target", 1024, Some("^(file:///|s3://)"));
    string(schema, "schedule", 128, None);
}

/// `spec.backup.retention`: at least one backup kept, an age as a duration.
pub fn backup_retention_spec(schema: &mut Schema) {
    set(schema, "count", &[("minimum", json!(1))]);
    duration_property(schema, "maxAge", Some(Duration::from_secs(3600)));
}

/// `spec.sidecar`: the seed's three rules, on effective values (an absent field counts with
/// its default), and whole seconds.
pub fn sidecar_spec(schema: &mut Schema) {
    duration_property(schema, "leaseTimeout", None);
    duration_property(schema, "peerCheckInterval", None);
    let lease = defaults::LEASE_TIMEOUT.as_secs();
    let interval = defaults::PEER_CHECK_INTERVAL.as_secs();
    add_rules(
        schema,
        vec![
            rule(
                "!has(self.peerCheckInterval) || duration(self.peerCheckInterval) >= duration('1s')",
                "must be >= 1s (rule: peerCheckInterval >= 1s)",
                Some(".peerCheckInterval"),
            ),
            rule(
                "!has(self.leaseTimeout) || duration(self.leaseTimeout) >= duration('3s')",
                "must be >= 3s (rule: leaseTimeout >= 3s)",
                Some(".leaseTimeout"),
            ),
            rule(
                &format!(
                    "(has(self.leaseTimeout) ? duration(self.leaseTimeout).getSeconds() : {lease}) >= 3 * (has(self.peerCheckInterval) ? duration(self.peerCheckInterval).getSeconds() : {interval})"
                ),
                &format!(
                    "must be >= 3 × peerCheckInterval (rule: leaseTimeout >= 3 × peerCheckInterval, on effective values; defaults {lease}s and {interval}s); raise leaseTimeout together with peerCheckInterval"
                ),
                Some(".leaseTimeout"),
            ),
            whole_seconds("leaseTimeout"),
            whole_seconds("peerCheckInterval"),
        ],
    );
}

/// `spec.splitBrainPolicy`.
pub fn split_brain_policy(schema: &mut Schema) {
    with_property(schema, "sitePriorities", |p| {
        p.insert("maxItems".into(), json!(MAX_SITES));
        p.insert("x-kubernetes-list-type".into(), json!("set"));
        if let Some(Value::Object(items)) = p.get_mut("items") {
            for (k, v) in string_keywords(63, Some(DNS1123_LABEL)) {
                items.insert(k.into(), v);
            }
        }
    });
}

/// `MysqlDatabase.spec`.
pub fn database_spec(schema: &mut Schema) {
    set(
        schema,
        "deploymentClients",
        &[
            ("maxItems", json!(MAX_DEPLOYMENT_CLIENTS)),
            ("x-kubernetes-list-type", json!("map")),
            ("x-kubernetes-list-map-keys", json!(["namespace"])),
        ],
    );
    string(schema, "schema", 64, None);
}

/// `MysqlDatabase.spec.failoverGroupRef`.
pub fn group_ref(schema: &mut Schema) {
    string(schema, "name", 253, Some(DNS1123_SUBDOMAIN));
}

/// `MysqlDatabase.spec.deploymentClients[]`.
pub fn deployment_client(schema: &mut Schema) {
    string(schema, "namespace", 63, Some(DNS1123_LABEL));
    string(schema, "serviceAccount", 253, Some(DNS1123_SUBDOMAIN));
}

/// GTID sets in status can be long (one interval per server UUID or domain).
fn gtid_strings(schema: &mut Schema, names: &[&str]) {
    for n in names {
        set(schema, n, &[("maxLength", json!(65_536))]);
    }
}

/// `status.sites[]`.
pub fn site_status(schema: &mut Schema) {
    gtid_strings(schema, &["gtidExecuted", "divergentGtidSet"]);
}

/// `status`.
pub fn group_status(schema: &mut Schema) {
    gtid_strings(schema, &["promotionGtidExecuted"]);
    set(schema, "sites", &[("maxItems", json!(MAX_SITES))]);
}

/// `status.plannedFailover`.
pub fn planned_failover_status(schema: &mut Schema) {
    gtid_strings(schema, &["sourceGtidExecuted"]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::parse_duration;

    #[test]
    fn duration_literals_read_back_and_match_the_pattern() {
        let pattern = DURATION;
        for d in [
            Duration::from_secs(20),
            Duration::from_secs(300),
            Duration::from_secs(7200),
            Duration::from_millis(100),
            Duration::from_millis(1500),
            Duration::from_secs(90),
        ] {
            let lit = duration_literal(d);
            assert_eq!(parse_duration(&lit).unwrap(), d, "{lit}");
            // The pattern's alphabet: digits, a dot and the units.
            assert!(
                lit.chars()
                    .all(|c| c.is_ascii_digit() || "nsumh.".contains(c)),
                "{lit} vs {pattern}"
            );
        }
        assert_eq!(duration_literal(Duration::from_secs(300)), "5m");
        assert_eq!(duration_literal(Duration::from_secs(90)), "90s");
    }
}
