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
    /// How the operator and the sidecars connect to this server: TLS, and what they verify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<MysqlTlsSpec>,
    /// `host:port` the replicas put in `MASTER_HOST`/`MASTER_PORT` when this site is their
    /// source (default: `host:port` above), e.g. a replication network's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_address: Option<String>,
}

/// A TLS mode of a database link: `disabled` (clear text), `required` (encrypted, the server's
/// certificate not checked), `verify-identity` (encrypted, the certificate chained to the CA
/// and naming the server).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum TlsMode {
    #[default]
    Disabled,
    Required,
    VerifyIdentity,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Required => "required",
            TlsMode::VerifyIdentity => "verify-identity",
        }
    }

    /// TLS is used at all.
    pub fn encrypts(self) -> bool {
        self != TlsMode::Disabled
    }
}

/// A TLS mode that is none of the three.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be disabled, required or verify-identity, got {0:?}")]
pub struct UnknownTlsMode(pub String);

impl std::str::FromStr for TlsMode {
    type Err = UnknownTlsMode;
    fn from_str(s: &str) -> Result<Self, UnknownTlsMode> {
        match s {
            "disabled" => Ok(TlsMode::Disabled),
            "required" => Ok(TlsMode::Required),
            "verify-identity" => Ok(TlsMode::VerifyIdentity),
            other => Err(UnknownTlsMode(other.to_string())),
        }
    }
}

/// `spec.sites[].mysql.tls`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MysqlTlsSpec {
    /// Default `verify-identity` once `caFile` is given, else `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TlsMode>,
    /// The CA bundle the server's certificate must chain to (read by the operator and the
    /// sidecars at every new connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The name the certificate must carry (default: `host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// `spec.replication.tls`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReplicationTlsSpec {
    /// Default `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TlsMode>,
    /// The CA bundle as the replica servers see it (`MASTER_SSL_CA` is read on the replica's
    /// own filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// A validated `spec.sites[].mysql.tls`: how a client reaches the server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MysqlTls {
    pub mode: TlsMode,
    pub ca_file: Option<String>,
    /// The name the certificate must carry; `None`: the host connected to.
    pub server_name: Option<String>,
}

/// A validated `spec.replication.tls`: what every `CHANGE MASTER` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationTls {
    pub mode: TlsMode,
    /// As the replicas see it.
    pub ca_file: Option<String>,
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
    /// Replication between the sites over TLS (every `CHANGE MASTER` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ReplicationTlsSpec>,
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
    /// The bound on each phase of each day-2 operation (`spec.operationTimeouts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_timeouts: Option<OperationTimeoutsSpec>,
    /// Scheduled physical backups (`spec.backup`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
}

impl FailoverGroupSpec {
    /// What a user configures: the spec without the request blocks that commands write into
    /// it (`spec.restoreInPlace`). What a configuration file is compared with.
    #[must_use]
    pub fn configured(&self) -> FailoverGroupSpec {
        FailoverGroupSpec {
            restore_in_place: None,
            ..self.clone()
        }
    }
}

/// `spec.backup`: scheduled physical backups of the group (docs/backup.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::backup_spec)
)]
pub struct BackupSpec {
    /// When backups run: cron (five fields, UTC) or `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`. Without it, backups run only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Which backups are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<BackupRetentionSpec>,
    /// Where backups are stored: `file:///absolute/path` (a directory every source site's
    /// sidecar reaches) or `s3://bucket/prefix`.
    pub target: String,
    /// The S3-compatible service of an `s3://` target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Spec>,
    /// `replica` (default): the healthiest replica, the primary only when none is healthy;
    /// `primary`: always the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourcePolicy>,
}

/// `spec.backup.retention`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::backup_retention_spec)
)]
pub struct BackupRetentionSpec {
    /// Keep at most this many good backups (the newest); at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Remove good backups older than this (a duration, e.g. `720h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

/// `spec.backup.s3`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct S3Spec {
    /// The service's URL (`https://…`); the provider's default without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Embedded mode: a file with `accessKeyId=` and `secretAccessKey=` lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<String>,
    /// Kubernetes: a Secret in the group's namespace with keys `accessKeyId` and
    /// `secretAccessKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
}

/// Where backups are stored, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum BackupTarget {
    /// A directory.
    File(std::path::PathBuf),
    /// A bucket of an S3-compatible service.
    S3(S3Target),
}

impl BackupTarget {
    /// The target as the spec writes it.
    pub fn url(&self) -> String {
        match self {
            BackupTarget::File(p) => format!("file://{}", p.display()),
            BackupTarget::S3(s) => s.url(),
        }
    }
}

/// An `s3://bucket/prefix` target with its service and where its keys are (never the keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct S3Target {
    pub bucket: String,
    /// Without leading or trailing `/`; empty: the bucket's top.
    pub prefix: String,
    /// The service's URL; `None`: AWS's own for the region.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub credentials: S3Credentials,
}

/// Where the operator reads an S3 target's keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum S3Credentials {
    /// A file of `accessKeyId=` and `secretAccessKey=` lines.
    File(std::path::PathBuf),
    /// A Secret in the group's namespace with keys `accessKeyId` and `secretAccessKey`.
    Secret(String),
}

impl S3Target {
    /// Reads `s3://bucket/prefix`: a bucket name of 3 to 63 lower-case letters, digits, `-`
    /// and `.`, and a prefix without empty, `.` or `..` parts (trailing `/` ignored).
    pub fn parse_url(url: &str) -> Result<(String, String), &'static str> {
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err("must be s3://bucket/prefix");
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_end_matches('/');
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(
                "the bucket must be 3 to 63 of lower-case letters, digits, - and . (s3://bucket/prefix)",
            );
        }
        if !prefix.is_empty()
            && prefix
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err("the prefix must not have empty, . or .. parts (s3://bucket/prefix)");
        }
        Ok((bucket.to_string(), prefix.to_string()))
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// `spec.backup`, validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupConfig {
    /// The schedule as written; `None`: only on request.
    #[serde(rename = "schedule")]
    pub schedule_text: Option<String>,
    /// The schedule, parsed.
    #[serde(skip)]
    pub schedule: Option<crate::cron::Schedule>,
    pub retention: Retention,
    pub target: BackupTarget,
    pub source: SourcePolicy,
}

/// `spec.operationTimeouts`: how long each phase of a day-2 operation may last (durations);
/// past it the operation ends in its documented state (event `OperationTimedOut`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = crate::schema::operation_timeouts_spec)
)]
pub struct OperationTimeoutsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_failover: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordered_update: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_in_place: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclone: Option<String>,
}

/// The effective per-phase bounds of `spec.operationTimeouts` (defaults applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationTimeouts {
    pub planned_failover: Duration,
    pub ordered_update: Duration,
    pub restore_in_place: Duration,
    pub reclone: Duration,
}

impl Default for OperationTimeouts {
    fn default() -> Self {
        OperationTimeouts {
            planned_failover: crate::defaults::PLANNED_FAILOVER_PHASE_TIMEOUT,
            ordered_update: crate::defaults::ORDERED_UPDATE_PHASE_TIMEOUT,
            restore_in_place: crate::defaults::RESTORE_IN_PLACE_PHASE_TIMEOUT,
            reclone: crate::defaults::RECLONE_PHASE_TIMEOUT,
        }
    }
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

/// `spec.backup.source`: which site a backup runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SourcePolicy {
    /// The healthiest replica; the primary only when no replica is healthy.
    #[default]
    Replica,
    /// Always the primary.
    Primary,
}

/// `spec.backup.retention`, validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Keep at most this many good backups (the newest).
    pub count: Option<u32>,
    /// Remove good backups that started longer ago than this.
    pub max_age: Option<Duration>,
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
    /// `spec.sites[].mysql.tls`, defaults applied.
    pub mysql_tls: MysqlTls,
    /// What replicas put in `MASTER_HOST`/`MASTER_PORT` (`replicationAddress`, default the
    /// site's own host and port).
    pub replication_host: String,
    pub replication_port: u16,
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

/// The rule a label selector breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelSelectorError {
    #[error("must not be empty (leave it out to label nothing)")]
    Empty,
    #[error("{0:?} is not key=value (only equality terms are supported)")]
    NotEquality(String),
    #[error("the prefix of {0:?} must be a DNS subdomain")]
    PrefixNotDnsSubdomain(String),
    #[error(
        "{0:?} is not a label key (at most 63 characters: alphanumeric first and last, - _ . between)"
    )]
    NotAKey(String),
    #[error(
        "{0:?} is not a label value (at most 63 characters: alphanumeric first and last, - _ . between)"
    )]
    NotAValue(String),
}

/// Checks a label selector of equality terms (`key=value`, comma separated), as Kubernetes
/// reads one: keys are an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters; values at most 63 characters; names and values start and end alphanumeric and
/// hold `-`, `_` and `.` between.
pub fn check_label_selector(sel: &str) -> Result<(), LabelSelectorError> {
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
        return Err(LabelSelectorError::Empty);
    }
    for term in sel.split(',') {
        let Some((key, value)) = term.split_once('=') else {
            return Err(LabelSelectorError::NotEquality(term.to_string()));
        };
        let (key, value) = (key.trim(), value.trim().trim_start_matches('='));
        let name = match key.rsplit_once('/') {
            Some((prefix, name)) => {
                if check_dns1123_subdomain(prefix).is_err() {
                    return Err(LabelSelectorError::PrefixNotDnsSubdomain(key.to_string()));
                }
                name
            }
            None => key,
        };
        if !name_ok(name, false) {
            return Err(LabelSelectorError::NotAKey(key.to_string()));
        }
        if !name_ok(value, true) || value.starts_with('!') {
            return Err(LabelSelectorError::NotAValue(value.to_string()));
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
    /// `spec.replication.tls`, defaults applied.
    pub replication_tls: ReplicationTls,
    /// `spec.updateStrategy`.
    pub update_strategy: UpdateStrategy,
    /// `spec.emergencyFailover.fencing`.
    pub fencing: FencingMode,
    /// `spec.operationTimeouts`, defaults applied.
    pub operation_timeouts: OperationTimeouts,
    /// `spec.backup`; `None`: the group takes no backups.
    pub backup: Option<BackupConfig>,
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
    let (sites, site_names) = validate_sites(&mut e, spec);
    let detection = validate_detection(&mut e, spec);
    let max_lag_seconds = spec
        .replication
        .as_ref()
        .and_then(|r| r.max_lag_seconds)
        .unwrap_or(crate::defaults::MAX_LAG_SECONDS);
    let replication_credentials = spec
        .replication
        .as_ref()
        .and_then(|r| r.credentials.clone());
    check_one_credentials_source(
        &mut e,
        "spec.replication.credentials",
        replication_credentials.as_ref(),
    );
    let clone_credentials = spec.clone.as_ref().and_then(|c| c.credentials.clone());
    check_one_credentials_source(&mut e, "spec.clone.credentials", clone_credentials.as_ref());
    check_restore_in_place(&mut e, spec);
    let (max_lag_wait, drain_timeout) = validate_planned_failover(&mut e, spec);
    let operation_timeouts = operation_timeouts(&mut e, spec, max_lag_wait);
    let replication_tls = replication_tls(
        &mut e,
        spec.replication.as_ref().and_then(|r| r.tls.as_ref()),
    );
    let (lease_timeout, peer_check_interval) = validate_sidecar(&mut e, spec);
    let site_priorities = validate_site_priorities(&mut e, spec, &site_names);
    check_bootstrap_site(&mut e, spec);
    let backup = spec
        .backup
        .as_ref()
        .and_then(|b| validate_backup(&mut e, b));

    if !e.0.is_empty() {
        return Err(ValidationErrors(e.0));
    }
    Ok(GroupConfig {
        name: name.to_string(),
        namespace: namespace.to_string(),
        sites,
        poll_interval: detection.poll_interval,
        failure_threshold: detection.failure_threshold,
        recovery_threshold: detection.recovery_threshold,
        failover_cooldown: detection.failover_cooldown,
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
        replication_tls,
        update_strategy: spec.update_strategy.unwrap_or_default(),
        fencing: spec
            .emergency_failover
            .as_ref()
            .and_then(|e| e.fencing)
            .unwrap_or_default(),
        operation_timeouts,
        backup,
    })
}

/// `spec.backup`: a schedule cron can read, a retention that keeps at least one backup, and a
/// target this version serves. `None` when anything is wrong (each error pushed).
fn validate_backup(e: &mut Errors, b: &BackupSpec) -> Option<BackupConfig> {
    let before = e.0.len();
    let schedule = b.schedule.as_deref().and_then(|text| {
        crate::cron::Schedule::parse(text)
            .map_err(|err| {
                let full = err.to_string();
                let rule = full
                    .trim_start_matches("spec.backup.schedule")
                    .trim_start_matches(':')
                    .trim();
                e.push("spec.backup.schedule", rule.to_string());
            })
            .ok()
    });
    let retention = b.retention.clone().unwrap_or_default();
    if retention.count == Some(0) {
        e.push(
            "spec.backup.retention.count",
            "must be at least 1: the newest good backup is always kept",
        );
    }
    let max_age = retention
        .max_age
        .as_deref()
        .and_then(|text| match parse_duration(text) {
            Ok(d) if d >= Duration::from_secs(3600) => Some(d),
            Ok(_) => {
                e.push("spec.backup.retention.maxAge", "must be at least 1h");
                None
            }
            Err(err) => {
                e.push("spec.backup.retention.maxAge", err.to_string());
                None
            }
        });
    let target = backup_target(e, b);
    if e.0.len() > before {
        return None;
    }
    Some(BackupConfig {
        schedule_text: b.schedule.as_ref().map(|t| t.trim().to_string()),
        schedule,
        retention: Retention {
            count: retention.count,
            max_age,
        },
        target: target?,
        source: b.source.unwrap_or_default(),
    })
}

/// `spec.backup.target`: `file:///absolute/path`, without `.` or `..` parts.
fn backup_target(e: &mut Errors, b: &BackupSpec) -> Option<BackupTarget> {
    const FIELD: &str = "spec.backup.target";
    let t = b.target.trim();
    if t.starts_with("s3://") {
        return s3_target(e, t, b.s3.as_ref());
    }
    if b.s3.is_some() {
        e.push("spec.backup.s3", "is used only with an s3:// target");
    }
    let Some(path) = t.strip_prefix("file://") else {
        e.push(FIELD, "must be file:///absolute/path or s3://bucket/prefix");
        return None;
    };
    if !path.starts_with('/') || path.split('/').any(|p| p == "." || p == "..") {
        e.push(
            FIELD,
            "must be file:///absolute/path, without . or .. parts",
        );
        return None;
    }
    Some(BackupTarget::File(std::path::PathBuf::from(path)))
}

/// An `s3://` target with its `spec.backup.s3`.
fn s3_target(e: &mut Errors, url: &str, s3: Option<&S3Spec>) -> Option<BackupTarget> {
    let parsed = S3Target::parse_url(url).map_err(|rule| e.push("spec.backup.target", rule));
    let Some(s3) = s3 else {
        e.push(
            "spec.backup.s3",
            "is required with an s3:// target: credentialsFile or credentialsSecret",
        );
        return None;
    };
    let credentials = match (&s3.credentials_file, &s3.credentials_secret) {
        (Some(f), None) if f.starts_with('/') => {
            Some(S3Credentials::File(std::path::PathBuf::from(f)))
        }
        (Some(_), None) => {
            e.push("spec.backup.s3.credentialsFile", "must be an absolute path");
            None
        }
        (None, Some(s)) if !s.trim().is_empty() => Some(S3Credentials::Secret(s.trim().into())),
        _ => {
            e.push(
                "spec.backup.s3",
                "must set exactly one of credentialsFile and credentialsSecret",
            );
            None
        }
    };
    let endpoint = s3.endpoint.as_deref().map(str::trim);
    if let Some(ep) = endpoint
        && !(ep.starts_with("https://") || ep.starts_with("http://"))
    {
        e.push(
            "spec.backup.s3.endpoint",
            "must be an http:// or https:// URL",
        );
        return None;
    }
    let (bucket, prefix) = parsed.ok()?;
    Some(BackupTarget::S3(S3Target {
        bucket,
        prefix,
        endpoint: endpoint.map(|s| s.trim_end_matches('/').to_string()),
        region: s3.region.as_ref().map(|r| r.trim().to_string()),
        credentials: credentials?,
    }))
}

/// `spec.sites`: every site (see [`validate_site`]), then the rules over all of them (at
/// least one site, at least one primary candidate). Returns the sites and the set of their
/// names.
fn validate_sites(e: &mut Errors, spec: &FailoverGroupSpec) -> (Vec<SiteConfig>, BTreeSet<String>) {
    if spec.sites.is_empty() {
        e.push("spec.sites", "must list at least one site");
    }
    let mut seen = BTreeSet::new();
    let mut sites = Vec::with_capacity(spec.sites.len());
    for (i, s) in spec.sites.iter().enumerate() {
        sites.push(validate_site(e, i, s, &mut seen));
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
    (sites, seen)
}

/// `spec.sites[i]`: its name (unique, not a component's), `MySQL` endpoint and credentials,
/// sidecar URL, workload, update, TLS, replication address and selector. `seen` collects the
/// site names so far.
fn validate_site(
    e: &mut Errors,
    i: usize,
    s: &SiteSpec,
    seen: &mut BTreeSet<String>,
) -> SiteConfig {
    let f = |x: &str| format!("spec.sites[{i}].{x}");
    if let Err(rule) = check_dns1123_label(&s.name) {
        e.push(f("name"), rule);
    } else if s.name == crate::identity::OPERATOR_SEGMENT
        || s.name == crate::identity::ROUTER_SEGMENT
    {
        e.push(
            f("name"),
            "must not be \"operator\" or \"router\": a component certificate names those parties",
        );
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
    check_site_credentials(e, &f, &s.mysql.credentials);
    check_url(e, &f("sidecar.url"), &s.sidecar.url);
    if let Some(w) = &s.workload
        && let Err(rule) = check_dns1123_subdomain(&w.name)
    {
        e.push(f("workload.name"), rule);
    }
    let update = s.update.as_ref().map(|u| site_update(e, &f, s, u));
    let mysql_tls = site_tls(e, &f("mysql.tls"), s.mysql.tls.as_ref());
    let (replication_host, replication_port) = match s.mysql.replication_address.as_deref() {
        None => (s.mysql.host.clone(), port.unwrap_or(0)),
        Some(a) => host_port(a).unwrap_or_else(|rule| {
            e.push(f("mysql.replicationAddress"), rule.to_string());
            (String::new(), 0)
        }),
    };
    SiteConfig {
        name: s.name.clone(),
        role: s.role,
        mysql_host: s.mysql.host.clone(),
        mysql_port: port.unwrap_or(0),
        credentials: s.mysql.credentials.clone(),
        mysql_tls,
        replication_host,
        replication_port,
        sidecar_url: s.sidecar.url.trim_end_matches('/').to_string(),
        priority: s.priority.unwrap_or(0),
        update,
        selector: s.selector.clone().filter(|sel| {
            if let Err(rule) = check_label_selector(sel) {
                e.push(f("selector"), rule.to_string());
                false
            } else {
                true
            }
        }),
        workload: s.workload.clone(),
    }
}

/// `spec.sites[i].mysql.credentials`: exactly one of a Secret's name and a file, never
/// inline. `f` names a field of the site.
fn check_site_credentials(e: &mut Errors, f: &impl Fn(&str) -> String, c: &CredentialsRef) {
    match (&c.secret_name, &c.file) {
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
}

/// `spec.sites[i].update`: a program to run (optional for a site with a workload) and its
/// timeout. `f` names a field of the site.
fn site_update(
    e: &mut Errors,
    f: &impl Fn(&str) -> String,
    s: &SiteSpec,
    u: &SiteUpdateSpec,
) -> SiteUpdate {
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
            e,
            &f("update.timeout"),
            u.timeout.as_ref(),
            crate::defaults::UPDATE_TIMEOUT,
            Duration::from_secs(1),
        ),
    }
}

/// How failures are detected and how often a failover may follow them.
struct Detection {
    poll_interval: Duration,
    failure_threshold: u32,
    recovery_threshold: u32,
    failover_cooldown: Duration,
}

/// `spec.pollInterval`, `spec.failureThreshold`, `spec.recoveryThreshold` and
/// `spec.failoverCooldown`, defaults applied.
fn validate_detection(e: &mut Errors, spec: &FailoverGroupSpec) -> Detection {
    let poll_interval = duration_field(
        e,
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
        e,
        "spec.failoverCooldown",
        spec.failover_cooldown.as_ref(),
        crate::defaults::FAILOVER_COOLDOWN,
        Duration::ZERO,
    );
    Detection {
        poll_interval,
        failure_threshold,
        recovery_threshold,
        failover_cooldown,
    }
}

/// A group-wide credentials reference (`spec.replication.credentials`,
/// `spec.clone.credentials`) sets exactly one of a Secret's name and a file.
fn check_one_credentials_source(e: &mut Errors, field: &str, c: Option<&CredentialsRef>) {
    if let Some(c) = c
        && c.secret_name.is_some() == c.file.is_some()
    {
        e.push(field, "must set exactly one of secretName and file");
    }
}

/// `spec.restoreInPlace`: an RFC 3339 confirmation, a dump file, and a target (when given)
/// that is a site of the group.
fn check_restore_in_place(e: &mut Errors, spec: &FailoverGroupSpec) {
    let Some(r) = &spec.restore_in_place else {
        return;
    };
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

/// `spec.plannedFailover`: returns `maxLagWait` and `drainTimeout`, defaults applied.
fn validate_planned_failover(e: &mut Errors, spec: &FailoverGroupSpec) -> (Duration, Duration) {
    let pf = spec.planned_failover.clone().unwrap_or_default();
    let max_lag_wait = duration_field(
        e,
        "spec.plannedFailover.maxLagWait",
        pf.max_lag_wait.as_ref(),
        crate::defaults::MAX_LAG_WAIT,
        Duration::from_secs(1),
    );
    let drain_timeout = duration_field(
        e,
        "spec.plannedFailover.drainTimeout",
        pf.drain_timeout.as_ref(),
        crate::defaults::DRAIN_TIMEOUT,
        Duration::ZERO,
    );
    (max_lag_wait, drain_timeout)
}

/// `spec.sidecar`: returns `leaseTimeout` and `peerCheckInterval`, defaults applied; both are
/// whole seconds (sidecars receive them in seconds) and follow the timing rules
/// ([`check_sidecar_timing`]).
fn validate_sidecar(e: &mut Errors, spec: &FailoverGroupSpec) -> (Duration, Duration) {
    let sc = spec.sidecar.clone().unwrap_or_default();
    let lease_timeout = duration_field(
        e,
        "spec.sidecar.leaseTimeout",
        sc.lease_timeout.as_ref(),
        crate::defaults::LEASE_TIMEOUT,
        Duration::ZERO,
    );
    let peer_check_interval = duration_field(
        e,
        "spec.sidecar.peerCheckInterval",
        sc.peer_check_interval.as_ref(),
        crate::defaults::PEER_CHECK_INTERVAL,
        Duration::ZERO,
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
    (lease_timeout, peer_check_interval)
}

/// `spec.splitBrainPolicy.sitePriorities`: each entry a known site (of `site_names`), none
/// twice.
fn validate_site_priorities(
    e: &mut Errors,
    spec: &FailoverGroupSpec,
    site_names: &BTreeSet<String>,
) -> Vec<String> {
    let site_priorities = spec
        .split_brain_policy
        .as_ref()
        .map(|p| p.site_priorities.clone())
        .unwrap_or_default();
    let mut prio_seen = BTreeSet::new();
    for (i, p) in site_priorities.iter().enumerate() {
        if !site_names.contains(p) {
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
    site_priorities
}

/// `spec.bootstrapSite`, when set, names a primary-candidate site of the group.
fn check_bootstrap_site(e: &mut Errors, spec: &FailoverGroupSpec) {
    let Some(b) = &spec.bootstrap_site else {
        return;
    };
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

/// The shortest bound `spec.operationTimeouts` accepts for a phase.
pub use crate::defaults::MIN_OPERATION_TIMEOUT;

/// `spec.sites[].mysql.tls`: `verify-identity` by default once a CA is given; a mode that
/// verifies needs the CA; a server name only means something when it is verified.
fn site_tls(e: &mut Errors, field: &str, t: Option<&MysqlTlsSpec>) -> MysqlTls {
    let Some(t) = t else {
        return MysqlTls::default();
    };
    let ca = t.ca_file.clone().filter(|c| !c.trim().is_empty());
    let mode = t.mode.unwrap_or(if ca.is_some() {
        TlsMode::VerifyIdentity
    } else {
        TlsMode::Disabled
    });
    if mode == TlsMode::VerifyIdentity && ca.is_none() {
        e.push(
            format!("{field}.caFile"),
            "is needed with mode verify-identity (the CA the server's certificate must chain to)",
        );
    }
    if t.server_name.is_some() && mode != TlsMode::VerifyIdentity {
        e.push(
            format!("{field}.serverName"),
            format!(
                "means something only with mode verify-identity (the mode is {})",
                mode.as_str()
            ),
        );
    }
    if let Some(n) = &t.server_name
        && (n.is_empty() || n.len() > 253 || n.chars().any(char::is_whitespace))
    {
        e.push(
            format!("{field}.serverName"),
            "must be a host name or an IP address (1 to 253 characters, no spaces)",
        );
    }
    MysqlTls {
        mode,
        ca_file: ca,
        server_name: t.server_name.clone(),
    }
}

/// `spec.replication.tls`: `disabled` by default; `verify-identity` needs the CA (the path as
/// the replicas see it).
fn replication_tls(e: &mut Errors, t: Option<&ReplicationTlsSpec>) -> ReplicationTls {
    let Some(t) = t else {
        return ReplicationTls::default();
    };
    let mode = t.mode.unwrap_or_default();
    let ca = t.ca_file.clone().filter(|c| !c.trim().is_empty());
    if mode == TlsMode::VerifyIdentity && ca.is_none() {
        e.push(
            "spec.replication.tls.caFile",
            "is needed with mode verify-identity (the CA bundle, as the replica servers see it)",
        );
    }
    if let Some(c) = &ca
        && (c.contains('\'') || c.contains('\\') || c.chars().any(char::is_control))
    {
        e.push(
            "spec.replication.tls.caFile",
            "must be a plain path (no quotes, backslashes or control characters)",
        );
    }
    ReplicationTls { mode, ca_file: ca }
}

/// An address that is not `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be host:port (an IPv6 address in brackets), got {0:?}")]
pub struct NotHostPort(pub String);

/// `host:port` (`[v6]:port` for an IPv6 address), the port 1–65535.
fn host_port(a: &str) -> Result<(String, u16), NotHostPort> {
    let rule = || NotHostPort(a.to_string());
    let (host, port) = a.rsplit_once(':').ok_or_else(rule)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port: u16 = port.parse().map_err(|_| rule())?;
    if host.is_empty() || port == 0 || host.chars().any(char::is_whitespace) {
        return Err(rule());
    }
    Ok((host.to_string(), port))
}

/// `spec.operationTimeouts`, each at least [`MIN_OPERATION_TIMEOUT`]; the planned failover's
/// also at least `maxLagWait` (its waiting for the target to catch up is one of its phases).
fn operation_timeouts(
    e: &mut Errors,
    spec: &FailoverGroupSpec,
    max_lag_wait: Duration,
) -> OperationTimeouts {
    let t = spec.operation_timeouts.clone().unwrap_or_default();
    let d = OperationTimeouts::default();
    let field = |e: &mut Errors, name: &str, v: Option<&String>, default: Duration| {
        duration_field(
            e,
            &format!("spec.operationTimeouts.{name}"),
            v,
            default,
            MIN_OPERATION_TIMEOUT,
        )
    };
    let out = OperationTimeouts {
        planned_failover: field(
            e,
            "plannedFailover",
            t.planned_failover.as_ref(),
            d.planned_failover.max(max_lag_wait),
        ),
        ordered_update: field(
            e,
            "orderedUpdate",
            t.ordered_update.as_ref(),
            d.ordered_update,
        ),
        restore_in_place: field(
            e,
            "restoreInPlace",
            t.restore_in_place.as_ref(),
            d.restore_in_place,
        ),
        reclone: field(e, "reclone", t.reclone.as_ref(), d.reclone),
    };
    if t.planned_failover.is_some() && out.planned_failover < max_lag_wait {
        e.push(
            "spec.operationTimeouts.plannedFailover",
            format!(
                "must be at least spec.plannedFailover.maxLagWait ({}): waiting for the target to catch up is one of its phases, got {}",
                HumanDuration(max_lag_wait),
                HumanDuration(out.planned_failover)
            ),
        );
    }
    out
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
                tls: None,
                replication_address: None,
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

    type BadBackup = fn(&mut BackupSpec);

    #[test]
    fn a_backup_spec_is_validated_and_every_bad_field_is_named() {
        let with = |b: BackupSpec| {
            validate_group(
                "g",
                "default",
                &FailoverGroupSpec {
                    backup: Some(b),
                    ..spec()
                },
            )
        };
        let good = BackupSpec {
            schedule: Some("0 3 * * *".into()),
            retention: Some(BackupRetentionSpec {
                count: Some(7),
                max_age: Some("720h".into()),
            }),
            target: "file:///var/backups/g".into(),
            s3: None,
            source: None,
        };
        let b = with(good.clone()).unwrap().backup.expect("configured");
        assert_eq!(b.target, BackupTarget::File("/var/backups/g".into()));
        assert_eq!(b.target.url(), "file:///var/backups/g");
        let s3 = with(BackupSpec {
            target: "s3://backups/prod/g/".into(),
            s3: Some(S3Spec {
                endpoint: Some("http://127.0.0.1:9000/".into()),
                region: Some("eu-west-1".into()),
                credentials_secret: Some("backup-keys".into()),
                credentials_file: None,
            }),
            ..good.clone()
        })
        .unwrap()
        .backup
        .unwrap();
        assert_eq!(
            s3.target,
            BackupTarget::S3(S3Target {
                bucket: "backups".into(),
                prefix: "prod/g".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: Some("eu-west-1".into()),
                credentials: S3Credentials::Secret("backup-keys".into()),
            })
        );
        assert_eq!(s3.target.url(), "s3://backups/prod/g");
        assert_eq!(b.source, SourcePolicy::Replica);
        assert_eq!(b.retention.count, Some(7));
        assert_eq!(b.retention.max_age, Some(Duration::from_secs(720 * 3600)));
        assert_eq!(b.schedule_text.as_deref(), Some("0 3 * * *"));
        assert!(b.schedule.is_some());
        assert!(
            validate_group("g", "default", &spec())
                .unwrap()
                .backup
                .is_none()
        );
        // Only on request: no schedule.
        let on_request = with(BackupSpec {
            schedule: None,
            ..good.clone()
        })
        .unwrap();
        assert!(on_request.backup.unwrap().schedule.is_none());

        let cases: [(BadBackup, &str, &str); 14] = [
            (
                |b| b.schedule = Some("0 25 * * *".into()),
                "spec.backup.schedule",
                "hour",
            ),
            (
                |b| b.schedule = Some("daily".into()),
                "spec.backup.schedule",
                "five fields",
            ),
            (
                |b| b.retention.as_mut().unwrap().count = Some(0),
                "spec.backup.retention.count",
                "at least 1",
            ),
            (
                |b| b.retention.as_mut().unwrap().max_age = Some("ten days".into()),
                "spec.backup.retention.maxAge",
                "",
            ),
            (
                |b| b.retention.as_mut().unwrap().max_age = Some("5m".into()),
                "spec.backup.retention.maxAge",
                "1h",
            ),
            (
                |b| b.target = "/var/backups".into(),
                "spec.backup.target",
                "file:///",
            ),
            (
                |b| b.target = "file:///a/../b".into(),
                "spec.backup.target",
                "..",
            ),
            (
                |b| b.target = "s3://bucket/prefix".into(),
                "spec.backup.s3",
                "is required",
            ),
            (
                |b| {
                    b.target = "s3://Bucket/x".into();
                    b.s3 = Some(S3Spec {
                        credentials_file: Some("/etc/s3".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.target",
                "lower-case",
            ),
            (
                |b| {
                    b.target = "s3://bucket/a/../b".into();
                    b.s3 = Some(S3Spec {
                        credentials_secret: Some("keys".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.target",
                "..",
            ),
            (
                |b| {
                    b.target = "s3://bucket/x".into();
                    b.s3 = Some(S3Spec {
                        credentials_file: Some("/etc/s3".into()),
                        credentials_secret: Some("keys".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.s3",
                "exactly one",
            ),
            (
                |b| {
                    b.target = "s3://bucket/x".into();
                    b.s3 = Some(S3Spec {
                        credentials_file: Some("relative/keys".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.s3.credentialsFile",
                "absolute",
            ),
            (
                |b| {
                    b.target = "s3://bucket/x".into();
                    b.s3 = Some(S3Spec {
                        endpoint: Some("minio:9000".into()),
                        credentials_file: Some("/etc/s3".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.s3.endpoint",
                "http",
            ),
            (
                |b| {
                    b.s3 = Some(S3Spec {
                        credentials_file: Some("/etc/s3".into()),
                        ..S3Spec::default()
                    });
                },
                "spec.backup.s3",
                "s3:// target",
            ),
        ];
        for (mutate, field, rule) in cases {
            let mut b = good.clone();
            mutate(&mut b);
            let err = with(b).unwrap_err();
            let text = err.to_string();
            assert!(err.has(field), "{field}: {text}");
            assert!(text.contains(rule), "{field} {rule}: {text}");
            assert!(
                !text.contains("spec.backup.schedule: spec.backup.schedule"),
                "{text}"
            );
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
    fn database_tls_defaults_and_rules_name_the_field() {
        let c = validate_group("g", "default", &spec()).unwrap();
        assert_eq!(c.sites[0].mysql_tls, MysqlTls::default());
        assert_eq!(c.replication_tls, ReplicationTls::default());
        assert_eq!(
            (
                c.sites[0].replication_host.as_str(),
                c.sites[0].replication_port
            ),
            ("127.0.0.1", 3307)
        );
        let with =
            |tls: Option<MysqlTlsSpec>, addr: Option<&str>, repl: Option<ReplicationTlsSpec>| {
                let mut s = spec();
                s.sites[0].mysql.tls = tls;
                s.sites[0].mysql.replication_address = addr.map(Into::into);
                s.replication = Some(ReplicationSpec {
                    tls: repl,
                    ..ReplicationSpec::default()
                });
                validate_group("g", "default", &s)
            };
        // A CA alone means verify-identity.
        let c = with(
            Some(MysqlTlsSpec {
                ca_file: Some("/pki/ca.crt".into()),
                ..MysqlTlsSpec::default()
            }),
            Some("[::1]:3400"),
            Some(ReplicationTlsSpec {
                mode: Some(TlsMode::VerifyIdentity),
                ca_file: Some("/etc/mysql/ca.crt".into()),
            }),
        )
        .unwrap();
        assert_eq!(c.sites[0].mysql_tls.mode, TlsMode::VerifyIdentity);
        assert_eq!(
            (
                c.sites[0].replication_host.as_str(),
                c.sites[0].replication_port
            ),
            ("::1", 3400)
        );
        assert_eq!(c.replication_tls.mode, TlsMode::VerifyIdentity);
        for (tls, addr, repl, field) in [
            (
                Some(MysqlTlsSpec {
                    mode: Some(TlsMode::VerifyIdentity),
                    ..MysqlTlsSpec::default()
                }),
                None,
                None,
                "spec.sites[0].mysql.tls.caFile",
            ),
            (
                Some(MysqlTlsSpec {
                    mode: Some(TlsMode::Required),
                    server_name: Some("db".into()),
                    ..MysqlTlsSpec::default()
                }),
                None,
                None,
                "spec.sites[0].mysql.tls.serverName",
            ),
            (
                None,
                Some("no-port"),
                None,
                "spec.sites[0].mysql.replicationAddress",
            ),
            (
                None,
                Some("h:0"),
                None,
                "spec.sites[0].mysql.replicationAddress",
            ),
            (
                None,
                None,
                Some(ReplicationTlsSpec {
                    mode: Some(TlsMode::VerifyIdentity),
                    ca_file: None,
                }),
                "spec.replication.tls.caFile",
            ),
            (
                None,
                None,
                Some(ReplicationTlsSpec {
                    mode: Some(TlsMode::Required),
                    ca_file: Some("/x'; DROP".into()),
                }),
                "spec.replication.tls.caFile",
            ),
        ] {
            let err = with(tls, addr, repl).unwrap_err();
            assert!(err.has(field), "{field}: {err}");
        }
        // The modes read from their names, and refuse others naming the rule.
        assert_eq!(
            "verify-identity".parse::<TlsMode>(),
            Ok(TlsMode::VerifyIdentity)
        );
        assert!(
            "VERIFY"
                .parse::<TlsMode>()
                .unwrap_err()
                .to_string()
                .contains("disabled, required or verify-identity")
        );
        let from_yaml: MysqlTlsSpec =
            serde_json::from_value(serde_json::json!({"mode": "required"})).unwrap();
        assert_eq!(from_yaml.mode, Some(TlsMode::Required));
    }

    #[test]
    fn operation_timeouts_default_and_each_has_a_floor() {
        let c = validate_group("g", "default", &spec()).unwrap();
        assert_eq!(c.operation_timeouts, OperationTimeouts::default());
        assert_eq!(
            c.operation_timeouts.planned_failover,
            Duration::from_secs(300)
        );
        let with = |t: OperationTimeoutsSpec, lag: Option<&str>| FailoverGroupSpec {
            operation_timeouts: Some(t),
            planned_failover: lag.map(|l| PlannedFailoverSpec {
                max_lag_wait: Some(l.into()),
                ..PlannedFailoverSpec::default()
            }),
            ..spec()
        };
        let set = with(
            OperationTimeoutsSpec {
                planned_failover: Some("2m".into()),
                ordered_update: Some("1h".into()),
                restore_in_place: Some("30m".into()),
                reclone: Some("10s".into()),
            },
            Some("1m"),
        );
        let c = validate_group("g", "default", &set).unwrap();
        assert_eq!(
            c.operation_timeouts,
            OperationTimeouts {
                planned_failover: Duration::from_secs(120),
                ordered_update: Duration::from_secs(3600),
                restore_in_place: Duration::from_secs(1800),
                reclone: Duration::from_secs(10),
            }
        );
        for (t, lag, field) in [
            (
                OperationTimeoutsSpec {
                    reclone: Some("9s".into()),
                    ..OperationTimeoutsSpec::default()
                },
                None,
                "spec.operationTimeouts.reclone",
            ),
            (
                OperationTimeoutsSpec {
                    ordered_update: Some("soon".into()),
                    ..OperationTimeoutsSpec::default()
                },
                None,
                "spec.operationTimeouts.orderedUpdate",
            ),
            (
                OperationTimeoutsSpec {
                    planned_failover: Some("1m".into()),
                    ..OperationTimeoutsSpec::default()
                },
                Some("10m"),
                "spec.operationTimeouts.plannedFailover",
            ),
        ] {
            let err = validate_group("g", "default", &with(t, lag)).unwrap_err();
            assert!(err.has(field), "{field}: {err}");
        }
        // Unset, the planned failover's bound follows a longer maxLagWait.
        let c = validate_group(
            "g",
            "default",
            &with(OperationTimeoutsSpec::default(), Some("10m")),
        )
        .unwrap();
        assert_eq!(
            c.operation_timeouts.planned_failover,
            Duration::from_secs(600)
        );
        // Drift compares what a user configures: the restore request a command wrote is not it.
        let mut stored = spec();
        stored.restore_in_place = Some(RestoreInPlaceSpec {
            confirm: "2027-01-01T00:00:00Z".into(),
            source: "/dump.sql".into(),
            target: None,
        });
        assert_eq!(stored.configured(), spec().configured());
        assert_ne!(
            with(OperationTimeoutsSpec::default(), Some("1m")).configured(),
            spec()
        );
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
        // The names a component certificate gives the other parties.
        for name in ["operator", "router"] {
            let mut s = spec();
            s.sites[2].name = name.into();
            let err = validate_group("g", "default", &s).unwrap_err();
            assert!(err.has("spec.sites[2].name"), "{name}: {err}");
        }
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
