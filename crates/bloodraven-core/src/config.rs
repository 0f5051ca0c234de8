//! Failover-group configuration: the `MysqlFailoverGroup.spec` shape (the embedded config file
//! uses the same fields) and its validation into a typed [`GroupConfig`].
//!
//! Validation is done once, at the edge. It collects every problem, each naming the field (as a
//! path such as `spec.sites[1].name`) and the rule it broke, so a user fixes a file in one pass.
//! The three sidecar timing rules are the CRD's CEL rules (SPEC §2.1), applied to effective
//! values (defaults filled in); [`check_sidecar_timing`] is shared with the sidecar's own flags.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{HumanDuration, parse_duration};
use crate::names::{check_dns1123_label, check_dns1123_subdomain};

/// One problem in a configuration: the field's path and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub rule: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

/// Every problem found in one configuration object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    /// Whether some error names `field` (exactly).
    pub fn has(&self, field: &str) -> bool {
        self.0.iter().any(|e| e.field == field)
    }
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, rule: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            rule: rule.into(),
        });
    }
}

/// The role a site plays in its group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SiteRole {
    /// May be promoted, automatically or on request.
    #[default]
    PrimaryCandidate,
    /// A reader: never promoted.
    ReadOnly,
    /// Disaster recovery: promoted only on explicit request, never automatically.
    DrOnly,
}

impl SiteRole {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteRole::PrimaryCandidate => "primary-candidate",
            SiteRole::ReadOnly => "read-only",
            SiteRole::DrOnly => "dr-only",
        }
    }
}

/// Where a site's MySQL credentials come from. Never the credentials themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::credentials_ref)
)]
pub struct CredentialsRef {
    /// Kubernetes: a Secret in the group's namespace with keys `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Embedded mode: a file with `username=` and `password=` lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::mysql_endpoint_spec)
)]
pub struct MysqlEndpointSpec {
    pub host: String,
    pub port: u32,
    pub credentials: CredentialsRef,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::sidecar_endpoint_spec)
)]
pub struct SidecarEndpointSpec {
    /// Base URL of the site's sidecar, e.g. `http://10.0.0.5:8080`.
    pub url: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::site_spec)
)]
pub struct SiteSpec {
    pub name: String,
    #[serde(default)]
    pub role: SiteRole,
    pub mysql: MysqlEndpointSpec,
    pub sidecar: SidecarEndpointSpec,
    /// Higher wins among equally advanced candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// How the ordered update updates this site (embedded mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<SiteUpdateSpec>,
    /// Kubernetes mode: a label selector (`app=mysql,site=iad`) for the site's MySQL Pods in
    /// the group's namespace. The operator labels them `bloodraven.shipstream.io/role:
    /// primary | replica | reader`, so a `-primary` Service follows the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Kubernetes mode: the workload that runs the site's server (a `StatefulSet` with
    /// `updateStrategy: OnDelete`). The ordered update replaces its Pod when the Pod's
    /// `controller-revision-hash` is not the StatefulSet's `status.updateRevision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadSpec>,
}

/// The kinds of workload a site can name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum WorkloadKind {
    /// An `apps/v1` StatefulSet (one Pod per site), with `updateStrategy: OnDelete`.
    #[default]
    StatefulSet,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::StatefulSet => "StatefulSet",
        }
    }
}

/// `spec.sites[].workload`: what runs the site in Kubernetes mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::workload_spec)
)]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    /// The StatefulSet's name, in the group's namespace.
    pub name: String,
}

/// `spec.updateStrategy`: whether the operator starts an ordered update on its own when a
/// site's workload has drifted (Kubernetes mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum UpdateStrategy {
    /// A site whose Pod is not at its StatefulSet's update revision starts an ordered update
    /// (once per set of revisions).
    #[default]
    Ordered,
    /// Only `bloodraven update` (the `ordered-update` annotation) starts one.
    Manual,
}

impl UpdateStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStrategy::Ordered => "Ordered",
            UpdateStrategy::Manual => "Manual",
        }
    }
}

/// `spec.sites[].update`: the command that updates a site in embedded mode (restarts its
/// server with a new version or setting). It must be idempotent: an operator that restarts
/// mid-update runs the command in progress again. A site with a `workload` may give only the
/// `timeout`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SiteUpdateSpec {
    /// The program and its arguments (no shell), run with `BLOODRAVEN_GROUP`,
    /// `BLOODRAVEN_SITE`, `BLOODRAVEN_MYSQL_HOST` and `BLOODRAVEN_MYSQL_PORT` in its
    /// environment. Not needed on a site with a `workload`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Bounds the command, and then the site's coming back as a caught-up replica (default
    /// `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// `async` (the default) or `semi-sync`: the primary acknowledges a commit only once a replica
/// has received it (lossless `AFTER_SYNC`, never falling back to asynchronous), so an
/// emergency failover loses no acknowledged write; its writers wait while no replica can
/// acknowledge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ReplicationMode {
    /// Asynchronous replication: an emergency failover can lose what the old primary
    /// acknowledged but had not shipped yet.
    #[default]
    Async,
    /// Semi-synchronous replication, lossless (`AFTER_SYNC`), never falling back to
    /// asynchronous: no acknowledged write is lost in an emergency, and writes wait while no
    /// replica can acknowledge them.
    SemiSync,
}

impl ReplicationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicationMode::Async => "async",
            ReplicationMode::SemiSync => "semi-sync",
        }
    }
}

/// `spec.emergencyFailover.fencing`: when an emergency promotion may let the new primary take
/// writes (docs/failover.md, Fencing modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum FencingMode {
    /// Promote once the old primary is unreachable for the detection budget: an isolated old
    /// primary keeps taking writes until its sidecar fences it (`leaseTimeout`).
    #[default]
    Fast,
    /// Announce the new view, then promote only when facts prove the old primary fenced or
    /// bound to be (its fence landed, a peer served it the new view, or nobody answered its
    /// sidecar for longer than its lease); the primary's sidecar keeps a deadline inside the
    /// server that fences it by itself.
    Strict,
}

impl FencingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FencingMode::Fast => "fast",
            FencingMode::Strict => "strict",
        }
    }
}

/// `spec.emergencyFailover`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EmergencyFailoverSpec {
    /// `fast` (the default) or `strict`: never two writable sites, at the cost of a later
    /// promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingMode>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::replication_spec)
)]
pub struct ReplicationSpec {
    /// `async` (the default) or `semi-sync`: the primary acknowledges a commit only once a
    /// replica has received it (lossless, `AFTER_SYNC`), and blocks its writers while no
    /// replica can acknowledge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ReplicationMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lag_seconds: Option<u64>,
    /// The account replicas use to connect to their source (`REPLICATION SLAVE`), needed to
    /// re-point replicas after a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsRef>,
}

/// `spec.clone`: how a site is rebuilt from the group (`bloodraven site reclone`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CloneSpec {
    /// The account that takes the copy on the donor and loads it into the target, on every
    /// site: the dump's and the load's rights (docs/reclone.md), never the application's or
    /// the failover account's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::planned_failover_spec)
)]
pub struct PlannedFailoverSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lag_wait: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::sidecar_spec)
)]
pub struct SidecarSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_check_interval: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::split_brain_policy)
)]
pub struct SplitBrainPolicy {
    /// Which site wins a split brain without failover history, most preferred first.
    #[serde(default)]
    pub site_priorities: Vec<String>,
}

/// `MysqlFailoverGroup.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::failover_group_spec)
)]
pub struct FailoverGroupSpec {
    pub sites: Vec<SiteSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_threshold: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_cooldown: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_failover: Option<PlannedFailoverSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<SidecarSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_brain_policy: Option<SplitBrainPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneSpec>,
    /// The first primary of a group whose sites all boot read-only. Without it the operator
    /// promotes the most advanced candidate once every site answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_site: Option<String>,
    /// A restore-in-place request: load a dump into the live group (docs/restore-in-place.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_in_place: Option<RestoreInPlaceSpec>,
    /// `Ordered` (the default): a drifted workload starts an ordered update on its own;
    /// `Manual`: only a request does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// How an emergency promotion fences the old primary (`fencing: fast | strict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emergency_failover: Option<EmergencyFailoverSpec>,
}

/// `spec.restoreInPlace`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestoreInPlaceSpec {
    /// An RFC 3339 timestamp, strictly later than `status.restoreInPlace.confirmTokenUsed`:
    /// a stale or replayed request never runs again.
    pub confirm: String,
    /// The `mariadb-dump` file, a path the operator reads.
    pub source: String,
    /// The site that becomes the primary (default: the active site).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// A validated site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteConfig {
    pub name: String,
    pub role: SiteRole,
    pub mysql_host: String,
    pub mysql_port: u16,
    pub credentials: CredentialsRef,
    pub sidecar_url: String,
    pub priority: i32,
    /// `spec.sites[].update`, validated.
    pub update: Option<SiteUpdate>,
    /// `spec.sites[].selector`, validated.
    pub selector: Option<String>,
    /// `spec.sites[].workload`, validated.
    pub workload: Option<WorkloadSpec>,
}

impl SiteConfig {
    /// The site's update command, when it has one (embedded mode).
    pub fn update_command(&self) -> Option<&[String]> {
        self.update
            .as_ref()
            .map(|u| u.command.as_slice())
            .filter(|c| !c.is_empty())
    }

    /// How long the site's update, and its coming back, may take.
    pub fn update_timeout(&self) -> Duration {
        self.update
            .as_ref()
            .map_or(crate::defaults::UPDATE_TIMEOUT, |u| u.timeout)
    }
}

/// Checks a label selector of equality terms (`key=value`, comma separated), as Kubernetes
/// reads one: keys are an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters; values at most 63 characters; names and values start and end alphanumeric and
/// hold `-`, `_` and `.` between.
pub fn check_label_selector(sel: &str) -> Result<(), String> {
    fn name_ok(n: &str, may_be_empty: bool) -> bool {
        if n.is_empty() {
            return may_be_empty;
        }
        n.len() <= 63
            && n.starts_with(|c: char| c.is_ascii_alphanumeric())
            && n.ends_with(|c: char| c.is_ascii_alphanumeric())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    }
    if sel.trim().is_empty() {
        return Err("must not be empty (leave it out to label nothing)".into());
    }
    for term in sel.split(',') {
        let Some((key, value)) = term.split_once('=') else {
            return Err(format!(
                "{term:?} is not key=value (only equality terms are supported)"
            ));
        };
        let (key, value) = (key.trim(), value.trim().trim_start_matches('='));
        let name = match key.rsplit_once('/') {
            Some((prefix, name)) => {
                if check_dns1123_subdomain(prefix).is_err() {
                    return Err(format!("the prefix of {key:?} must be a DNS subdomain"));
                }
                name
            }
            None => key,
        };
        if !name_ok(name, false) {
            return Err(format!(
                "{key:?} is not a label key (at most 63 characters: alphanumeric first and last, - _ . between)"
            ));
        }
        if !name_ok(value, true) || value.starts_with('!') {
            return Err(format!(
                "{value:?} is not a label value (at most 63 characters: alphanumeric first and last, - _ . between)"
            ));
        }
    }
    Ok(())
}

/// A validated `spec.sites[].update`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteUpdate {
    pub command: Vec<String>,
    pub timeout: Duration,
}

/// A validated failover group: every value effective (defaults applied) and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupConfig {
    pub name: String,
    pub namespace: String,
    pub sites: Vec<SiteConfig>,
    pub poll_interval: Duration,
    pub failure_threshold: u32,
    pub recovery_threshold: u32,
    pub failover_cooldown: Duration,
    pub max_lag_seconds: u64,
    pub max_lag_wait: Duration,
    pub drain_timeout: Duration,
    pub lease_timeout: Duration,
    pub peer_check_interval: Duration,
    pub site_priorities: Vec<String>,
    /// `spec.bootstrapSite`.
    pub bootstrap_site: Option<String>,
    /// Where the replication account's credentials come from, if configured.
    pub replication_credentials: Option<CredentialsRef>,
    /// Where the clone account's credentials come from (`spec.clone.credentials`), if
    /// configured.
    pub clone_credentials: Option<CredentialsRef>,
    /// `spec.replication.mode`.
    pub replication_mode: ReplicationMode,
    /// `spec.updateStrategy`.
    pub update_strategy: UpdateStrategy,
    /// `spec.emergencyFailover.fencing`.
    pub fencing: FencingMode,
}

impl GroupConfig {
    pub fn site(&self, name: &str) -> Option<&SiteConfig> {
        self.sites.iter().find(|s| s.name == name)
    }

    /// The detection budget: `pollInterval × failureThreshold`.
    pub fn detection_budget(&self) -> Duration {
        self.poll_interval * self.failure_threshold
    }
}

/// The three CEL rules of `spec.sidecar`, on effective values. Each violation names the field
/// under `prefix` (e.g. `spec.sidecar`) and the rule.
pub fn check_sidecar_timing(
    prefix: &str,
    lease_timeout: Duration,
    peer_check_interval: Duration,
) -> Result<(), ValidationErrors> {
    let mut e = Errors::default();
    if peer_check_interval < Duration::from_secs(1) {
        e.push(
            format!("{prefix}.peerCheckInterval"),
            format!(
                "must be >= 1s (rule: peerCheckInterval >= 1s), got {}",
                HumanDuration(peer_check_interval)
            ),
        );
    }
    if lease_timeout < Duration::from_secs(3) {
        e.push(
            format!("{prefix}.leaseTimeout"),
            format!(
                "must be >= 3s (rule: leaseTimeout >= 3s), got {}",
                HumanDuration(lease_timeout)
            ),
        );
    }
    if lease_timeout < peer_check_interval * 3 {
        e.push(
            format!("{prefix}.leaseTimeout"),
            format!(
                "must be >= 3 × peerCheckInterval (rule: leaseTimeout >= 3 × peerCheckInterval; effective values {} < 3 × {} = {}); raise leaseTimeout together with peerCheckInterval",
                HumanDuration(lease_timeout),
                HumanDuration(peer_check_interval),
                HumanDuration(peer_check_interval * 3)
            ),
        );
    }
    if e.0.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(e.0))
    }
}

fn duration_field(
    e: &mut Errors,
    field: &str,
    value: Option<&String>,
    default: Duration,
    min: Duration,
) -> Duration {
    let Some(raw) = value else { return default };
    match parse_duration(raw) {
        Ok(d) if d < min => {
            e.push(
                field,
                format!(
                    "must be at least {}, got {}",
                    HumanDuration(min),
                    HumanDuration(d)
                ),
            );
            default
        }
        Ok(d) => d,
        Err(err) => {
            e.push(field, err.to_string());
            default
        }
    }
}

fn check_url(e: &mut Errors, field: &str, url: &str) {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        None => e.push(field, "must be an http:// or https:// URL"),
        Some(r) if r.is_empty() || r.starts_with('/') => e.push(field, "must name a host"),
        Some(r) if r.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            e.push(field, "must not contain whitespace");
        }
        Some(_) => {}
    }
}

/// Validates a group spec into a [`GroupConfig`]. `name` and `namespace` come from the
/// object's metadata.
pub fn validate_group(
    name: &str,
    namespace: &str,
    spec: &FailoverGroupSpec,
) -> Result<GroupConfig, ValidationErrors> {
    let mut e = Errors::default();
    if let Err(rule) = check_dns1123_subdomain(name) {
        e.push("metadata.name", rule);
    }
    if let Err(rule) = check_dns1123_label(namespace) {
        e.push("metadata.namespace", rule);
    }
    if spec.sites.is_empty() {
        e.push("spec.sites", "must list at least one site");
    }
    let mut seen = BTreeSet::new();
    let mut sites = Vec::with_capacity(spec.sites.len());
    for (i, s) in spec.sites.iter().enumerate() {
        let f = |x: &str| format!("spec.sites[{i}].{x}");
        if let Err(rule) = check_dns1123_label(&s.name) {
            e.push(f("name"), rule);
        } else if !seen.insert(s.name.clone()) {
            e.push(f("name"), format!("duplicate site name {:?}", s.name));
        }
        if s.mysql.host.trim().is_empty() {
            e.push(f("mysql.host"), "must not be empty");
        }
        let port = u16::try_from(s.mysql.port).ok().filter(|p| *p != 0);
        if port.is_none() {
            e.push(f("mysql.port"), "must be between 1 and 65535");
        }
        match (&s.mysql.credentials.secret_name, &s.mysql.credentials.file) {
            (None, None) => e.push(
                f("mysql.credentials"),
                "must name a secretName (Kubernetes) or a file (embedded mode); credentials are never inline",
            ),
            (Some(_), Some(_)) => e.push(
                f("mysql.credentials"),
                "must set exactly one of secretName and file",
            ),
            (Some(n), None) => {
                if let Err(rule) = check_dns1123_subdomain(n) {
                    e.push(f("mysql.credentials.secretName"), rule);
                }
            }
            (None, Some(p)) => {
                if p.trim().is_empty() {
                    e.push(f("mysql.credentials.file"), "must not be empty");
                }
            }
        }
        check_url(&mut e, &f("sidecar.url"), &s.sidecar.url);
        if let Some(w) = &s.workload
            && let Err(rule) = check_dns1123_subdomain(&w.name)
        {
            e.push(f("workload.name"), rule);
        }
        let update = s.update.as_ref().map(|u| {
            let no_program = u.command.first().is_none_or(|p| p.trim().is_empty());
            if no_program && (s.workload.is_none() || !u.command.is_empty()) {
                e.push(
                    f("update.command"),
                    "must name a program (its first element) and may add arguments (a site with a workload may leave the command out)",
                );
            }
            SiteUpdate {
                command: u.command.clone(),
                timeout: duration_field(
                    &mut e,
                    &f("update.timeout"),
                    u.timeout.as_ref(),
                    crate::defaults::UPDATE_TIMEOUT,
                    Duration::from_secs(1),
                ),
            }
        });
        sites.push(SiteConfig {
            name: s.name.clone(),
            role: s.role,
            mysql_host: s.mysql.host.clone(),
            mysql_port: port.unwrap_or(0),
            credentials: s.mysql.credentials.clone(),
            sidecar_url: s.sidecar.url.trim_end_matches('/').to_string(),
            priority: s.priority.unwrap_or(0),
            update,
            selector: s.selector.clone().filter(|sel| {
                if let Err(rule) = check_label_selector(sel) {
                    e.push(f("selector"), &rule);
                    false
                } else {
                    true
                }
            }),
            workload: s.workload.clone(),
        });
    }
    if !spec.sites.is_empty()
        && !spec
            .sites
            .iter()
            .any(|s| s.role == SiteRole::PrimaryCandidate)
    {
        e.push(
            "spec.sites",
            "must contain at least one site with role primary-candidate",
        );
    }

    let zero = Duration::ZERO;
    let poll_interval = duration_field(
        &mut e,
        "spec.pollInterval",
        spec.poll_interval.as_ref(),
        crate::defaults::POLL_INTERVAL,
        Duration::from_millis(100),
    );
    let failure_threshold = spec
        .failure_threshold
        .unwrap_or(crate::defaults::FAILURE_THRESHOLD);
    if failure_threshold == 0 {
        e.push("spec.failureThreshold", "must be at least 1");
    }
    let recovery_threshold = spec
        .recovery_threshold
        .unwrap_or(crate::defaults::RECOVERY_THRESHOLD);
    if recovery_threshold == 0 {
        e.push("spec.recoveryThreshold", "must be at least 1");
    }
    let failover_cooldown = duration_field(
        &mut e,
        "spec.failoverCooldown",
        spec.failover_cooldown.as_ref(),
        crate::defaults::FAILOVER_COOLDOWN,
        zero,
    );
    let max_lag_seconds = spec
        .replication
        .as_ref()
        .and_then(|r| r.max_lag_seconds)
        .unwrap_or(crate::defaults::MAX_LAG_SECONDS);
    let replication_credentials = spec
        .replication
        .as_ref()
        .and_then(|r| r.credentials.clone());
    if let Some(c) = &replication_credentials
        && c.secret_name.is_some() == c.file.is_some()
    {
        e.push(
            "spec.replication.credentials",
            "must set exactly one of secretName and file",
        );
    }
    let clone_credentials = spec.clone.as_ref().and_then(|c| c.credentials.clone());
    if let Some(c) = &clone_credentials
        && c.secret_name.is_some() == c.file.is_some()
    {
        e.push(
            "spec.clone.credentials",
            "must set exactly one of secretName and file",
        );
    }
    if let Some(r) = &spec.restore_in_place {
        if crate::time::Timestamp::parse_rfc3339(&r.confirm).is_err() {
            e.push(
                "spec.restoreInPlace.confirm",
                format!("must be an RFC 3339 timestamp, got {:?}", r.confirm),
            );
        }
        if r.source.trim().is_empty() {
            e.push("spec.restoreInPlace.source", "must name the dump's file");
        }
        if let Some(t) = &r.target
            && !spec.sites.iter().any(|s| &s.name == t)
        {
            e.push(
                "spec.restoreInPlace.target",
                format!("{t:?} is not a site of the group"),
            );
        }
    }
    let pf = spec.planned_failover.clone().unwrap_or_default();
    let max_lag_wait = duration_field(
        &mut e,
        "spec.plannedFailover.maxLagWait",
        pf.max_lag_wait.as_ref(),
        crate::defaults::MAX_LAG_WAIT,
        Duration::from_secs(1),
    );
    let drain_timeout = duration_field(
        &mut e,
        "spec.plannedFailover.drainTimeout",
        pf.drain_timeout.as_ref(),
        crate::defaults::DRAIN_TIMEOUT,
        zero,
    );
    let sc = spec.sidecar.clone().unwrap_or_default();
    let lease_timeout = duration_field(
        &mut e,
        "spec.sidecar.leaseTimeout",
        sc.lease_timeout.as_ref(),
        crate::defaults::LEASE_TIMEOUT,
        zero,
    );
    let peer_check_interval = duration_field(
        &mut e,
        "spec.sidecar.peerCheckInterval",
        sc.peer_check_interval.as_ref(),
        crate::defaults::PEER_CHECK_INTERVAL,
        zero,
    );
    for (field, d) in [
        ("spec.sidecar.leaseTimeout", lease_timeout),
        ("spec.sidecar.peerCheckInterval", peer_check_interval),
    ] {
        if d.subsec_nanos() != 0 {
            e.push(
                field,
                "must be a whole number of seconds (sidecars receive it in seconds, in the operator's signed topology view)",
            );
        }
    }
    if let Err(errs) = check_sidecar_timing("spec.sidecar", lease_timeout, peer_check_interval) {
        e.0.extend(errs.0);
    }

    let site_priorities = spec
        .split_brain_policy
        .as_ref()
        .map(|p| p.site_priorities.clone())
        .unwrap_or_default();
    let mut prio_seen = BTreeSet::new();
    for (i, p) in site_priorities.iter().enumerate() {
        if !seen.contains(p) {
            e.push(
                format!("spec.splitBrainPolicy.sitePriorities[{i}]"),
                format!("names unknown site {p:?}"),
            );
        } else if !prio_seen.insert(p) {
            e.push(
                format!("spec.splitBrainPolicy.sitePriorities[{i}]"),
                format!("lists site {p:?} twice"),
            );
        }
    }

    if let Some(b) = &spec.bootstrap_site {
        match spec.sites.iter().find(|s| &s.name == b) {
            None => e.push("spec.bootstrapSite", format!("names unknown site {b:?}")),
            Some(s) if s.role != SiteRole::PrimaryCandidate => e.push(
                "spec.bootstrapSite",
                format!(
                    "must name a primary-candidate site; {b:?} is {}",
                    s.role.as_str()
                ),
            ),
            Some(_) => {}
        }
    }

    if !e.0.is_empty() {
        return Err(ValidationErrors(e.0));
    }
    Ok(GroupConfig {
        name: name.to_string(),
        namespace: namespace.to_string(),
        sites,
        poll_interval,
        failure_threshold,
        recovery_threshold,
        failover_cooldown,
        max_lag_seconds,
        max_lag_wait,
        drain_timeout,
        lease_timeout,
        peer_check_interval,
        site_priorities,
        bootstrap_site: spec.bootstrap_site.clone(),
        replication_credentials,
        clone_credentials,
        replication_mode: spec
            .replication
            .as_ref()
            .and_then(|r| r.mode)
            .unwrap_or_default(),
        update_strategy: spec.update_strategy.unwrap_or_default(),
        fencing: spec
            .emergency_failover
            .as_ref()
            .and_then(|e| e.fencing)
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, role: SiteRole) -> SiteSpec {
        SiteSpec {
            name: name.into(),
            role,
            mysql: MysqlEndpointSpec {
                host: "127.0.0.1".into(),
                port: 3307,
                credentials: CredentialsRef {
                    secret_name: None,
                    file: Some("/etc/bloodraven/cred".into()),
                },
            },
            sidecar: SidecarEndpointSpec {
                url: format!("http://127.0.0.1:8080/{name}"),
            },
            priority: None,
            update: None,
            selector: None,
            workload: None,
        }
    }

    fn spec() -> FailoverGroupSpec {
        FailoverGroupSpec {
            sites: vec![
                site("iad", SiteRole::PrimaryCandidate),
                site("pdx", SiteRole::PrimaryCandidate),
                site("reader", SiteRole::ReadOnly),
            ],
            ..FailoverGroupSpec::default()
        }
    }

    fn with_sidecar(lease: Option<&str>, peer: Option<&str>) -> FailoverGroupSpec {
        FailoverGroupSpec {
            sidecar: Some(SidecarSpec {
                lease_timeout: lease.map(Into::into),
                peer_check_interval: peer.map(Into::into),
            }),
            ..spec()
        }
    }

    #[test]
    fn defaults_apply() {
        let c = validate_group("playground", "default", &spec()).unwrap();
        assert_eq!(c.poll_interval, Duration::from_secs(2));
        assert_eq!(c.failure_threshold, 3);
        assert_eq!(c.recovery_threshold, 2);
        assert_eq!(c.failover_cooldown, Duration::from_secs(300));
        assert_eq!(c.max_lag_seconds, 300);
        assert_eq!(c.max_lag_wait, Duration::from_secs(300));
        assert_eq!(c.drain_timeout, Duration::from_secs(30));
        assert_eq!(c.lease_timeout, Duration::from_secs(20));
        assert_eq!(c.peer_check_interval, Duration::from_secs(5));
        assert_eq!(c.detection_budget(), Duration::from_secs(6));
        assert_eq!(c.site("reader").unwrap().role, SiteRole::ReadOnly);
    }

    #[test]
    fn the_clone_account_names_one_source() {
        let both = FailoverGroupSpec {
            clone: Some(CloneSpec {
                credentials: Some(CredentialsRef {
                    secret_name: Some("clone".into()),
                    file: Some("/etc/bloodraven/clone".into()),
                }),
            }),
            ..spec()
        };
        let err = validate_group("g", "default", &both).unwrap_err();
        assert!(err.has("spec.clone.credentials"), "{err}");
        let one = FailoverGroupSpec {
            clone: Some(CloneSpec {
                credentials: Some(CredentialsRef {
                    secret_name: Some("clone".into()),
                    file: None,
                }),
            }),
            ..spec()
        };
        let c = validate_group("g", "default", &one).unwrap();
        assert_eq!(
            c.clone_credentials.and_then(|c| c.secret_name).as_deref(),
            Some("clone")
        );
        assert_eq!(
            validate_group("g", "default", &spec())
                .unwrap()
                .clone_credentials,
            None
        );
    }

    #[test]
    fn a_site_selector_is_a_label_selector_of_equality_terms() {
        let with = |sel: &str| {
            let mut s = spec();
            s.sites[0].selector = Some(sel.to_string());
            validate_group("g", "default", &s)
        };
        for ok in [
            "app=mysql",
            "app=mysql,site=iad",
            "app.kubernetes.io/name=mysql, site = iad",
            "tier==db",
            "empty=",
        ] {
            let c = with(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(c.sites[0].selector.as_deref(), Some(ok));
        }
        for (bad, says) in [
            ("", "must not be empty"),
            ("app", "is not key=value"),
            ("app!=mysql", "is not a label key"),
            ("app in (a,b)", "is not key=value"),
            ("-app=x", "is not a label key"),
            ("Not_A_Domain!/app=x", "must be a DNS subdomain"),
            ("app=my sql", "is not a label value"),
        ] {
            let err = with(bad).unwrap_err();
            assert!(err.has("spec.sites[0].selector"), "{bad}: {err}");
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
        assert_eq!(
            validate_group("g", "default", &spec()).unwrap().sites[0].selector,
            None
        );
    }

    #[test]
    fn a_site_workload_names_a_statefulset_and_may_leave_the_update_command_out() {
        let with = |name: &str, update: Option<SiteUpdateSpec>| {
            let mut s = spec();
            s.sites[0].workload = Some(WorkloadSpec {
                kind: WorkloadKind::StatefulSet,
                name: name.into(),
            });
            s.sites[0].update = update;
            validate_group("g", "default", &s)
        };
        let c = with("mysql-iad", None).unwrap();
        assert_eq!(c.sites[0].workload.as_ref().unwrap().name, "mysql-iad");
        assert_eq!(c.sites[0].update_command(), None);
        assert_eq!(c.sites[0].update_timeout(), crate::defaults::UPDATE_TIMEOUT);
        assert_eq!(c.update_strategy, UpdateStrategy::Ordered);
        let timed = SiteUpdateSpec {
            command: Vec::new(),
            timeout: Some("15m".into()),
        };
        let c = with("mysql-iad", Some(timed.clone())).unwrap();
        assert_eq!(c.sites[0].update_timeout(), Duration::from_secs(900));
        let err = with("Mysql_IAD", None).unwrap_err();
        assert!(err.has("spec.sites[0].workload.name"), "{err}");
        // Without a workload, an update without a command is refused, naming the field.
        let mut s = spec();
        s.sites[0].update = Some(timed);
        let err = validate_group("g", "default", &s).unwrap_err();
        assert!(err.has("spec.sites[0].update.command"), "{err}");
        // The kind and the strategy are closed sets.
        let bad: Result<WorkloadSpec, _> =
            serde_json::from_value(serde_json::json!({"kind": "Deployment", "name": "x"}));
        assert!(bad.is_err());
        let manual: FailoverGroupSpec = serde_json::from_value(serde_json::json!({
            "sites": [], "updateStrategy": "Manual"
        }))
        .unwrap();
        assert_eq!(manual.update_strategy, Some(UpdateStrategy::Manual));
    }

    #[test]
    fn a_site_update_names_a_program_and_a_bounded_timeout() {
        let with = |command: Vec<&str>, timeout: Option<&str>| {
            let mut s = spec();
            s.sites[1].update = Some(SiteUpdateSpec {
                command: command.into_iter().map(String::from).collect(),
                timeout: timeout.map(String::from),
            });
            validate_group("g", "default", &s)
        };
        let c = with(vec!["/usr/local/bin/update-site", "--fast"], None).unwrap();
        let u = c.site("pdx").unwrap().update.clone().unwrap();
        assert_eq!(u.command, ["/usr/local/bin/update-site", "--fast"]);
        assert_eq!(u.timeout, Duration::from_secs(600));
        assert_eq!(c.site("iad").unwrap().update, None);
        for (command, timeout, field, rule) in [
            (
                vec![],
                None,
                "spec.sites[1].update.command",
                "must name a program",
            ),
            (
                vec![" "],
                None,
                "spec.sites[1].update.command",
                "must name a program",
            ),
            (
                vec!["x"],
                Some("500ms"),
                "spec.sites[1].update.timeout",
                "at least 1s",
            ),
            (vec!["x"], Some("soon"), "spec.sites[1].update.timeout", ""),
        ] {
            let err = with(command, timeout).unwrap_err();
            assert!(err.has(field), "{err}");
            assert!(err.to_string().contains(rule), "{err}");
        }
    }

    #[test]
    fn raising_peer_check_interval_alone_is_rejected() {
        let err = validate_group("g", "default", &with_sidecar(None, Some("10s"))).unwrap_err();
        assert!(err.has("spec.sidecar.leaseTimeout"), "{err}");
        assert!(err.to_string().contains("3 × peerCheckInterval"), "{err}");
        assert!(err.to_string().contains("20s < 3 × 10s = 30s"), "{err}");
        // Moving both is fine.
        assert!(validate_group("g", "default", &with_sidecar(Some("30s"), Some("10s"))).is_ok());
    }

    #[test]
    fn the_three_cel_rules() {
        let err =
            validate_group("g", "default", &with_sidecar(Some("20s"), Some("500ms"))).unwrap_err();
        assert!(err.has("spec.sidecar.peerCheckInterval"), "{err}");
        assert!(err.to_string().contains("peerCheckInterval >= 1s"));
        let err =
            validate_group("g", "default", &with_sidecar(Some("2s"), Some("1s"))).unwrap_err();
        assert!(err.to_string().contains("leaseTimeout >= 3s"), "{err}");
        // Exactly on the floor is allowed: 15s = 3 × 5s, and the shipped 20s/5s pair.
        assert!(validate_group("g", "default", &with_sidecar(Some("15s"), Some("5s"))).is_ok());
        assert!(validate_group("g", "default", &with_sidecar(Some("3s"), Some("1s"))).is_ok());
        assert!(check_sidecar_timing("x", Duration::from_secs(20), Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn bad_durations_name_the_field() {
        let s = FailoverGroupSpec {
            poll_interval: Some("2 seconds".into()),
            failover_cooldown: Some("-1s".into()),
            ..spec()
        };
        let err = validate_group("g", "default", &s).unwrap_err();
        assert!(err.has("spec.pollInterval"));
        assert!(err.has("spec.failoverCooldown"));
    }

    #[test]
    fn site_rules() {
        let mut s = spec();
        s.sites[1].name = "iad".into();
        s.sites[2].name = "Bad_Name".into();
        s.sites[0].mysql.port = 70000;
        s.sites[0].mysql.credentials = CredentialsRef::default();
        s.sites[1].sidecar.url = "ftp://x".into();
        let err = validate_group("g", "default", &s).unwrap_err();
        for field in [
            "spec.sites[1].name",
            "spec.sites[2].name",
            "spec.sites[0].mysql.port",
            "spec.sites[0].mysql.credentials",
            "spec.sites[1].sidecar.url",
        ] {
            assert!(err.has(field), "{field} missing in {err}");
        }
        assert!(err.to_string().contains("duplicate site name"));
    }

    #[test]
    fn needs_a_candidate_and_known_priorities() {
        let s = FailoverGroupSpec {
            sites: vec![site("reader", SiteRole::ReadOnly)],
            ..FailoverGroupSpec::default()
        };
        let err = validate_group("g", "default", &s).unwrap_err();
        assert!(err.has("spec.sites"));
        let s = FailoverGroupSpec {
            split_brain_policy: Some(SplitBrainPolicy {
                site_priorities: vec!["iad".into(), "nope".into(), "iad".into()],
            }),
            ..spec()
        };
        let err = validate_group("g", "default", &s).unwrap_err();
        assert!(err.has("spec.splitBrainPolicy.sitePriorities[1]"));
        assert!(err.has("spec.splitBrainPolicy.sitePriorities[2]"));
        let err = validate_group("", "Bad", &spec()).unwrap_err();
        assert!(err.has("metadata.name") && err.has("metadata.namespace"));
        for (b, rule) in [("nope", "unknown site"), ("reader", "primary-candidate")] {
            let s = FailoverGroupSpec {
                bootstrap_site: Some(b.into()),
                ..spec()
            };
            let err = validate_group("g", "default", &s).unwrap_err();
            assert!(
                err.0
                    .iter()
                    .any(|e| e.field == "spec.bootstrapSite" && e.rule.contains(rule)),
                "{err:?}"
            );
        }
        let err =
            validate_group("g", "default", &with_sidecar(Some("20s"), Some("1500ms"))).unwrap_err();
        assert!(err.has("spec.sidecar.peerCheckInterval"), "{err:?}");
        let s = FailoverGroupSpec {
            bootstrap_site: Some("pdx".into()),
            ..spec()
        };
        assert_eq!(
            validate_group("g", "default", &s).unwrap().bootstrap_site,
            Some("pdx".to_string())
        );
    }

    #[test]
    fn unknown_fields_are_rejected_by_the_shape() {
        let json = r#"{"sites":[],"pollIntervall":"2s"}"#;
        let err = serde_json::from_str::<FailoverGroupSpec>(json).unwrap_err();
        assert!(err.to_string().contains("pollIntervall"), "{err}");
    }
}
