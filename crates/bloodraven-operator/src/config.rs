//! The operator's configuration file: YAML documents shaped like the CRDs
//! (`MysqlFailoverGroup`, `MysqlDatabase`) plus one `OperatorConfig` document.
//!
//! Everything is validated here, once: unknown fields, rule violations, duplicate objects,
//! missing files. Each problem names the document (its position, kind and name), the field and
//! the rule, and all problems are reported together. Nothing downstream sees an invalid value.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bloodraven_core::config::{FailoverGroupSpec, GroupConfig, validate_group};
use bloodraven_core::contract::DEPLOY_AUDIENCE;
use bloodraven_core::names::{check_dns1123_label, check_dns1123_subdomain};
use bloodraven_core::resources::{
    API_VERSION, DatabaseBody, DatabaseSpec, KIND_DATABASE, KIND_GROUP, ObjectMeta,
};
use bloodraven_store::Durability;
use serde::Deserialize;
use serde_json::Value;

/// `kind` of the operator's own settings document.
pub const KIND_OPERATOR_CONFIG: &str = "OperatorConfig";

/// One problem in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// e.g. `document 2 (MysqlFailoverGroup default/playground)`.
    pub document: String,
    /// e.g. `spec.sidecar.leaseTimeout`.
    pub field: String,
    pub rule: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.document, self.rule)
        } else {
            write!(f, "{}: {}: {}", self.document, self.field, self.rule)
        }
    }
}

/// The configuration file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path} is not valid YAML: {reason}")]
    Yaml { path: String, reason: String },
    #[error("{path} has {} problem(s):\n  - {}", problems.len(), problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  - "))]
    Invalid {
        path: String,
        problems: Vec<ConfigProblem>,
    },
}

impl ConfigError {
    pub fn problems(&self) -> &[ConfigProblem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}

/// Where the deploy API's TLS certificate and key come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) in the operator's namespace,
    /// reloaded when it changes (Kubernetes mode).
    Secret {
        name: String,
    },
}

/// Where the topology signing key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    File(PathBuf),
    /// Key `topology.key` of a Secret in the operator's namespace, reloaded when it changes
    /// (Kubernetes mode).
    Secret {
        name: String,
    },
}

/// The deploy API's settings (only when enabled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeployApiSettings {
    pub listen: SocketAddr,
    pub tls: TlsSource,
    /// Embedded mode: the key of `bloodraven token issue`. Kubernetes mode authenticates by
    /// TokenReview and needs none.
    pub token_key_file: Option<PathBuf>,
    pub audience: String,
}

/// Where the operator keeps its objects: which platform it runs on (see `crate::platform`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreBackend {
    /// The SQLite file in the data directory; groups and databases come from this file.
    Embedded,
    /// A Kubernetes API server; groups and databases are the cluster's custom resources.
    Kubernetes(KubernetesSettings),
    /// An etcd v3 cluster (`store.etcd`); groups and databases come from this file, written
    /// into etcd by whichever operator leads.
    Etcd(bloodraven_etcd::EtcdSettings),
}

impl StoreBackend {
    /// `store.backend` as written.
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreBackend::Embedded => "embedded",
            StoreBackend::Kubernetes(_) => "kubernetes",
            StoreBackend::Etcd(_) => "etcd",
        }
    }

    /// Whether configuration may name Secrets (`secretName`, `topologySigningKeySecret`).
    pub fn reads_secrets(&self) -> bool {
        matches!(self, StoreBackend::Kubernetes(_))
    }

    /// Whether deploy tokens are the operator's own (checked with `tokenSigningKeyFile`) rather
    /// than the platform's (TokenReview).
    pub fn issues_tokens(&self) -> bool {
        matches!(self, StoreBackend::Embedded | StoreBackend::Etcd(_))
    }

    /// Whether the groups and databases are documents of the configuration file.
    pub fn groups_in_file(&self) -> bool {
        matches!(self, StoreBackend::Embedded | StoreBackend::Etcd(_))
    }
}

/// `store.backend: kubernetes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// The one namespace watched; `None` watches every namespace.
    pub namespace: Option<String>,
    /// Where the operator's own objects live: its leader-election Lease and the Secrets its
    /// configuration names (`store.operatorNamespace`; default the Pod's namespace from
    /// `POD_NAMESPACE`, else the watched namespace, else `default`).
    pub operator_namespace: String,
    /// This replica's Pod (`POD_NAME`, from the downward API): labelled while it leads.
    pub pod_name: Option<String>,
    /// Leader election on a Lease in `operator_namespace`.
    pub leader_election: LeaderElection,
    /// A kubeconfig file; in-cluster configuration (or `KUBECONFIG`) when absent.
    pub kubeconfig: Option<PathBuf>,
    /// A context of that kubeconfig; its current one when absent.
    pub context: Option<String>,
}

/// Kubernetes mode: leader election on a `coordination.k8s.io/v1` Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    pub lease_name: String,
    /// How long a holder's lease lasts without renewal; a follower takes over only after the
    /// holder's Lease has gone unrenewed this long, as it observed it.
    pub lease_duration: std::time::Duration,
    /// A leader that could not renew for this long steps down (and stops acting before).
    pub renew_deadline: std::time::Duration,
    /// How often the leader renews and followers try.
    pub retry_period: std::time::Duration,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            lease_name: "bloodraven-operator-leader".into(),
            lease_duration: std::time::Duration::from_secs(15),
            renew_deadline: std::time::Duration::from_secs(10),
            retry_period: std::time::Duration::from_secs(2),
        }
    }
}

/// `componentTLS`: the listener the other components call (sidecars, routers), over mutual
/// TLS with certificates of the installation's component CA (docs/security.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentTlsSettings {
    pub listen: SocketAddr,
    /// The operator's component certificate (naming `…/<group>/operator` for each group it
    /// runs), its key, and the component CA bundle; re-read when they change.
    pub files: bloodraven_runtime::mtls::TlsFiles,
}

/// The operator's own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorSettings {
    pub store: StoreBackend,
    pub data_dir: PathBuf,
    pub http_listen: SocketAddr,
    pub deploy_api: Option<DeployApiSettings>,
    /// The component listener (`componentTLS`); without it no sidecar can reach this operator
    /// as such, and strict fencing has no facts.
    pub component_tls: Option<ComponentTlsSettings>,
    pub durability: Durability,
    /// The Ed25519 key every served active-site view is signed with
    /// (`topologySigningKeyFile` or, in Kubernetes mode, `topologySigningKeySecret`).
    pub topology_key: Option<KeySource>,
}

/// A validated group.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDoc {
    pub metadata: ObjectMeta,
    pub spec: FailoverGroupSpec,
    pub config: GroupConfig,
}

/// A validated database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseDoc {
    pub metadata: ObjectMeta,
    pub spec: DatabaseSpec,
}

/// A whole validated configuration file.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedConfig {
    pub settings: OperatorSettings,
    pub groups: Vec<GroupDoc>,
    pub databases: Vec<DatabaseDoc>,
    /// The directory relative paths are resolved against (the file's own).
    pub base: PathBuf,
}

/// The groups and databases of a file given to `bloodraven apply`, as written (paths are
/// resolved by each operator on its own machine).
#[derive(Clone, Debug, PartialEq)]
pub struct Documents {
    pub groups: Vec<GroupDoc>,
    pub databases: Vec<DatabaseDoc>,
}

/// How [`parse`] reads a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// An operator's configuration: one `OperatorConfig`; credential paths resolved here and
    /// checked to exist.
    Operator,
    /// Documents for the store (`bloodraven apply`): an `OperatorConfig` in the same file is
    /// skipped; paths are kept as written.
    Documents,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OperatorDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    data_dir: String,
    #[serde(default)]
    listen: ListenDoc,
    #[serde(default)]
    tls: Option<TlsDoc>,
    #[serde(default)]
    token_signing_key_file: Option<String>,
    #[serde(default)]
    topology_signing_key_file: Option<String>,
    /// Kubernetes mode: a Secret (key `topology.key`) in the operator's namespace.
    #[serde(default)]
    topology_signing_key_secret: Option<String>,
    #[serde(default, rename = "deployAPI")]
    deploy_api: DeployApiDoc,
    #[serde(default)]
    store: StoreDoc,
    #[serde(default, rename = "componentTLS")]
    component_tls: Option<ComponentTlsDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ComponentTlsDoc {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    ca_file: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListenDoc {
    #[serde(default)]
    http: Option<String>,
    #[serde(default)]
    https: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TlsDoc {
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    /// Kubernetes mode: a `kubernetes.io/tls` Secret in the operator's namespace.
    #[serde(default)]
    secret_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DeployApiDoc {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    audience: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElectionDoc {
    #[serde(default)]
    lease_name: Option<String>,
    #[serde(default)]
    lease_duration: Option<String>,
    #[serde(default)]
    renew_deadline: Option<String>,
    #[serde(default)]
    retry_period: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StoreDoc {
    /// `embedded` (the default) or `kubernetes`.
    #[serde(default)]
    backend: Option<String>,
    /// Kubernetes: the one namespace to watch (every namespace when absent).
    #[serde(default)]
    namespace: Option<String>,
    /// Kubernetes: a kubeconfig file (in-cluster configuration when absent).
    #[serde(default)]
    kubeconfig: Option<String>,
    /// Kubernetes: a context of the kubeconfig.
    #[serde(default)]
    context: Option<String>,
    /// Kubernetes: the operator's own namespace (leader Lease, Secrets of this file).
    #[serde(default)]
    operator_namespace: Option<String>,
    /// Kubernetes: leader election on a Lease.
    #[serde(default)]
    leader_election: Option<LeaderElectionDoc>,
    /// A string; YAML 1.1 readers turn a bare `off` into `false`, so booleans are accepted too.
    #[serde(default)]
    durability: Option<Value>,
    /// etcd: the members, TLS, credentials, prefix and lease TTL.
    #[serde(default)]
    etcd: Option<bloodraven_etcd::EtcdConfig>,
}

/// The metadata a configuration file may give an object.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConfigMeta {
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    /// `bloodraven apply`: the stored version the change is meant for (refused when the
    /// store holds another).
    #[serde(default)]
    resource_version: Option<String>,
}

impl From<ConfigMeta> for ObjectMeta {
    fn from(m: ConfigMeta) -> Self {
        ObjectMeta {
            labels: m.labels,
            annotations: m.annotations,
            resource_version: m.resource_version.unwrap_or_default(),
            ..ObjectMeta::named(&m.namespace, &m.name)
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupObjectDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: ConfigMeta,
    spec: FailoverGroupSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DatabaseObjectDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: ConfigMeta,
    spec: DatabaseSpec,
}

fn typed<T: for<'de> Deserialize<'de>>(v: &Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        (path, e.into_inner().to_string())
    })
}

/// A non-empty environment variable (the downward API's `POD_NAME`, `POD_NAMESPACE`).
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Reads and validates a configuration file.
pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let base = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    parse(&text, &path.display().to_string(), &base)
}

/// Reads the groups and databases of a file for `bloodraven apply` (an `OperatorConfig`
/// document in it is skipped, so an operator's own file can be applied).
pub fn load_documents(path: &Path) -> Result<Documents, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let (_, groups, databases) = read(
        &text,
        &path.display().to_string(),
        Path::new("."),
        Reading::Documents,
    )?;
    Ok(Documents { groups, databases })
}

/// Resolves the credential files `spec` names against `base` (what an operator does with a
/// spec, from its file or from the store): every problem as `(field, rule)`, with `check`
/// also a file that does not exist.
pub fn resolve_credentials(
    spec: &mut FailoverGroupSpec,
    base: &Path,
    check: bool,
) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut refs: Vec<(String, &mut bloodraven_core::config::CredentialsRef)> = spec
        .sites
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            (
                format!("spec.sites[{i}].mysql.credentials"),
                &mut s.mysql.credentials,
            )
        })
        .collect();
    if let Some(r) = spec
        .replication
        .as_mut()
        .and_then(|r| r.credentials.as_mut())
    {
        refs.push(("spec.replication.credentials".into(), r));
    }
    if let Some(r) = spec.clone.as_mut().and_then(|c| c.credentials.as_mut()) {
        refs.push(("spec.clone.credentials".into(), r));
    }
    for (field, r) in refs {
        if r.secret_name.is_some() {
            problems.push((
                format!("{field}.secretName"),
                "needs the Kubernetes back-end; outside it use file".into(),
            ));
        }
        if let Some(f) = r.file.as_mut() {
            let p = resolve(base, f);
            if check && !p.is_file() {
                problems.push((
                    format!("{field}.file"),
                    format!("file {} does not exist", p.display()),
                ));
            }
            *f = p.display().to_string();
        }
    }
    problems
}

/// Validates configuration text; relative paths are resolved against `base`.
pub fn parse(text: &str, path: &str, base: &Path) -> Result<LoadedConfig, ConfigError> {
    let (settings, groups, databases) = read(text, path, base, Reading::Operator)?;
    // `read` refuses an operator's configuration without its settings; said again here.
    let Some(settings) = settings else {
        return Err(ConfigError::Invalid {
            path: path.to_string(),
            problems: vec![ConfigProblem {
                document: path.to_string(),
                field: String::new(),
                rule: format!("needs one {KIND_OPERATOR_CONFIG} document (with at least dataDir)"),
            }],
        });
    };
    Ok(LoadedConfig {
        settings,
        groups,
        databases,
        base: base.to_path_buf(),
    })
}

type Read = (Option<OperatorSettings>, Vec<GroupDoc>, Vec<DatabaseDoc>);

/// Reads every document of `text` (see [`Reading`]), then checks what holds across them
/// (databases name groups of the file; with the operator's settings, that the store and the
/// listeners fit the groups). Every problem is reported together.
fn read(text: &str, path: &str, base: &Path, reading: Reading) -> Result<Read, ConfigError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ConfigError::Yaml {
        path: path.to_string(),
        reason: e.to_string(),
    })?;
    let mut gathered = Gathered::default();
    for (i, doc) in docs.iter().enumerate() {
        gathered.read_document(i + 1, doc, base, reading);
    }
    gathered.check_database_groups();
    if reading == Reading::Documents {
        if !gathered.problems.is_empty() {
            return Err(ConfigError::Invalid {
                path: path.to_string(),
                problems: gathered.problems,
            });
        }
        return Ok((None, gathered.groups, gathered.databases));
    }
    gathered.into_operator_config(path)
}

/// What [`read`] has gathered from the documents so far: the valid objects and every problem.
#[derive(Default)]
struct Gathered {
    problems: Vec<ConfigProblem>,
    settings: Option<OperatorSettings>,
    groups: Vec<GroupDoc>,
    databases: Vec<DatabaseDoc>,
    /// `(kind, namespace, name)` of every object read, to refuse duplicates.
    seen: BTreeSet<(&'static str, String, String)>,
}

/// How problems name document `n`: its kind, and its namespace and name when it has one.
fn document_label(n: usize, doc: &Value) -> String {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let namespace = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    if name.is_empty() {
        format!(
            "document {n} ({})",
            if kind.is_empty() { "no kind" } else { kind }
        )
    } else {
        format!("document {n} ({kind} {namespace}/{name})")
    }
}

impl Gathered {
    /// One problem of the document `label` names.
    fn problem(&mut self, label: &str, field: &str, rule: String) {
        self.problems.push(ConfigProblem {
            document: label.to_string(),
            field: field.to_string(),
            rule,
        });
    }

    /// Document `n` (counted from 1): a mapping of this `apiVersion`, read by its kind.
    fn read_document(&mut self, n: usize, doc: &Value, base: &Path, reading: Reading) {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        let label = document_label(n, doc);
        if !doc.is_object() {
            self.problem(
                &label,
                "",
                "must be a mapping with apiVersion and kind".into(),
            );
            return;
        }
        let api_version = doc
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if api_version != API_VERSION {
            self.problem(
                &label,
                "apiVersion",
                format!("must be {API_VERSION} (got {api_version:?})"),
            );
            return;
        }
        match kind {
            KIND_OPERATOR_CONFIG if reading == Reading::Documents => {}
            KIND_OPERATOR_CONFIG => self.read_operator_config(&label, doc, base),
            KIND_GROUP => self.read_group(&label, doc, base, reading),
            KIND_DATABASE => self.read_database(&label, doc),
            other => self.problem(
                &label,
                "kind",
                format!(
                    "must be one of {KIND_OPERATOR_CONFIG}, {KIND_GROUP}, {KIND_DATABASE} (got {other:?})"
                ),
            ),
        }
    }

    /// The one `OperatorConfig` document: the operator's own settings.
    fn read_operator_config(&mut self, label: &str, doc: &Value, base: &Path) {
        if self.settings.is_some() {
            self.problem(
                label,
                "kind",
                "only one OperatorConfig document is allowed".into(),
            );
            return;
        }
        match typed::<OperatorDoc>(doc) {
            Err((field, rule)) => self.problem(label, &field, rule),
            Ok(d) => match operator_settings(&d, base) {
                Ok(s) => self.settings = Some(s),
                Err(list) => {
                    for (field, rule) in list {
                        self.problem(label, &field, rule);
                    }
                }
            },
        }
    }

    /// A `MysqlFailoverGroup` document: a name that is a DNS-1123 label and unique across
    /// namespaces, credential files that exist (an operator's own file), a valid spec.
    fn read_group(&mut self, label: &str, doc: &Value, base: &Path, reading: Reading) {
        let mut d = match typed::<GroupObjectDoc>(doc) {
            Err((field, rule)) => return self.problem(label, &field, rule),
            Ok(d) => d,
        };
        if d.metadata.namespace.is_empty() {
            d.metadata.namespace = "default".into();
        }
        if let Err(rule) = check_dns1123_label(&d.metadata.name) {
            // Group names appear in label values and object names: a label.
            self.problem(
                label,
                "metadata.name",
                format!("{rule} (a group name is a DNS-1123 label)"),
            );
            return;
        }
        if !self.seen.insert((
            KIND_GROUP,
            d.metadata.namespace.clone(),
            d.metadata.name.clone(),
        )) {
            self.problem(
                label,
                "metadata.name",
                "duplicate MysqlFailoverGroup".into(),
            );
            return;
        }
        if self
            .groups
            .iter()
            .any(|g| g.metadata.name == d.metadata.name)
        {
            self.problem(
                label,
                "metadata.name",
                "group names must be unique across namespaces (the deploy API addresses groups by name)".into(),
            );
            return;
        }
        // Credential files are read by the operator: resolve them against the
        // configuration's directory and check they exist now, not at the first poll.
        if reading == Reading::Operator {
            for (field, rule) in resolve_credentials(&mut d.spec, base, true) {
                self.problem(label, &field, rule);
            }
        }
        match validate_group(&d.metadata.name, &d.metadata.namespace, &d.spec) {
            Ok(config) => self.groups.push(GroupDoc {
                metadata: d.metadata.into(),
                spec: d.spec,
                config,
            }),
            Err(errs) => {
                for e in errs.0 {
                    self.problem(label, &e.field, e.rule);
                }
            }
        }
    }

    /// A `MysqlDatabase` document: unique in its namespace, a valid spec.
    fn read_database(&mut self, label: &str, doc: &Value) {
        let mut d = match typed::<DatabaseObjectDoc>(doc) {
            Err((field, rule)) => return self.problem(label, &field, rule),
            Ok(d) => d,
        };
        if d.metadata.namespace.is_empty() {
            d.metadata.namespace = "default".into();
        }
        if !self.seen.insert((
            KIND_DATABASE,
            d.metadata.namespace.clone(),
            d.metadata.name.clone(),
        )) {
            self.problem(label, "metadata.name", "duplicate MysqlDatabase".into());
            return;
        }
        match d.spec.validate(&d.metadata.name, &d.metadata.namespace) {
            Ok(()) => self.databases.push(DatabaseDoc {
                metadata: d.metadata.into(),
                spec: d.spec,
            }),
            Err(errs) => {
                for e in errs.0 {
                    self.problem(label, &e.field, e.rule);
                }
            }
        }
    }

    /// Every database names a group of the file, in its own namespace.
    fn check_database_groups(&mut self) {
        for db in &self.databases {
            let target = &db.spec.failover_group_ref.name;
            let exists = self.groups.iter().any(|g| {
                &g.metadata.name == target && g.metadata.namespace == db.metadata.namespace
            });
            if !exists {
                self.problems.push(ConfigProblem {
                    document: format!(
                        "{KIND_DATABASE} {}/{}",
                        db.metadata.namespace, db.metadata.name
                    ),
                    field: "spec.failoverGroupRef.name".into(),
                    rule: format!(
                        "names no MysqlFailoverGroup {target:?} in namespace {:?}",
                        db.metadata.namespace
                    ),
                });
            }
        }
    }

    /// An operator's configuration: its settings are there, its store takes groups from the
    /// file (when it has any), and strict fencing has the component listener it needs.
    fn into_operator_config(mut self, path: &str) -> Result<Read, ConfigError> {
        let Some(settings) = self.settings.take() else {
            self.problems.push(ConfigProblem {
                document: path.to_string(),
                field: String::new(),
                rule: format!("needs one {KIND_OPERATOR_CONFIG} document (with at least dataDir)"),
            });
            return Err(ConfigError::Invalid {
                path: path.to_string(),
                problems: self.problems,
            });
        };
        let documents = !(self.groups.is_empty() && self.databases.is_empty());
        if documents && !settings.store.groups_in_file() {
            self.problems.push(ConfigProblem {
                document: path.to_string(),
                field: "store.backend".into(),
                rule: "with the kubernetes backend, groups and databases are MysqlFailoverGroup and MysqlDatabase resources in the cluster (kubectl apply), not documents of this file".into(),
            });
        }
        // Strict fencing's facts come only from sidecars this operator verified: without a
        // component listener there are none, and no strict promotion could ever be proven.
        if settings.component_tls.is_none() {
            for g in self
                .groups
                .iter()
                .filter(|g| g.config.fencing == bloodraven_core::config::FencingMode::Strict)
            {
                self.problems.push(ConfigProblem {
                    document: format!(
                        "{KIND_GROUP} {}/{}",
                        g.metadata.namespace, g.metadata.name
                    ),
                    field: "spec.emergencyFailover.fencing".into(),
                    rule: "strict needs the operator's componentTLS: its proofs are what sidecars said over mutual TLS".into(),
                });
            }
        }
        if !self.problems.is_empty() {
            return Err(ConfigError::Invalid {
                path: path.to_string(),
                problems: self.problems,
            });
        }
        Ok((Some(settings), self.groups, self.databases))
    }
}

/// The `OperatorConfig` document checked into [`OperatorSettings`]: every problem as
/// `(field, rule)`.
fn operator_settings(
    d: &OperatorDoc,
    base: &Path,
) -> Result<OperatorSettings, Vec<(String, String)>> {
    let mut errs = Vec::new();
    if d.data_dir.trim().is_empty() {
        errs.push(("dataDir".to_string(), "must not be empty".to_string()));
    }
    let http_listen = listen_addr(
        "listen.http",
        d.listen.http.as_deref(),
        "0.0.0.0:8082",
        &mut errs,
    );
    let https_listen = listen_addr(
        "listen.https",
        d.listen.https.as_deref(),
        "0.0.0.0:8443",
        &mut errs,
    );
    let durability = store_durability(d.store.durability.as_ref(), &mut errs);
    let store = store_backend(&d.store, base, &mut errs);
    let deploy_api = deploy_api(d, &store, https_listen, base, &mut errs);
    let component_tls = d
        .component_tls
        .as_ref()
        .and_then(|c| component_tls(c, base, &mut errs));
    let topology_key = topology_key(d, &store, base, &mut errs);
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(OperatorSettings {
        store,
        data_dir: resolve(base, &d.data_dir),
        http_listen,
        deploy_api,
        component_tls,
        durability,
        topology_key,
    })
}

/// `listen.http` and `listen.https`: a socket address, `default` when not given.
fn listen_addr(
    field: &str,
    v: Option<&str>,
    default: &str,
    errs: &mut Vec<(String, String)>,
) -> SocketAddr {
    let raw = v.map_or_else(|| default.to_string(), str::to_string);
    raw.parse::<SocketAddr>().unwrap_or_else(|_| {
        errs.push((
            field.to_string(),
            format!("must be an address such as 0.0.0.0:8082 (got {raw:?})"),
        ));
        SocketAddr::from(([0, 0, 0, 0], 0))
    })
}

/// `store.durability`: `full` (the default), `normal` or `off`; a YAML 1.1 boolean counts
/// as `full` or `off`.
fn store_durability(value: Option<&Value>, errs: &mut Vec<(String, String)>) -> Durability {
    let durability_text = match value {
        None => None,
        Some(Value::Bool(false)) => Some("off".to_string()),
        Some(Value::Bool(true)) => Some("full".to_string()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    match durability_text.as_deref() {
        None | Some("full") => Durability::Full,
        Some("normal") => Durability::Normal,
        Some("off") => Durability::Off,
        Some(other) => {
            errs.push((
                "store.durability".into(),
                format!("must be full, normal or off (got {other:?})"),
            ));
            Durability::Full
        }
    }
}

/// `store.backend` and the settings of that back-end; the settings of another back-end are
/// refused.
fn store_backend(store: &StoreDoc, base: &Path, errs: &mut Vec<(String, String)>) -> StoreBackend {
    if store.etcd.is_some() && store.backend.as_deref() != Some("etcd") {
        errs.push((
            "store.etcd".into(),
            "applies only with store.backend: etcd".into(),
        ));
    }
    match store.backend.as_deref() {
        Some("etcd") => {
            refuse_kubernetes_only(store, errs);
            etcd_backend(store.etcd.as_ref(), base, errs)
        }
        None | Some("embedded") => {
            refuse_kubernetes_only(store, errs);
            StoreBackend::Embedded
        }
        Some("kubernetes") => kubernetes_backend(store, base, errs),
        Some(other) => {
            errs.push((
                "store.backend".into(),
                format!("must be embedded, kubernetes or etcd (got {other:?})"),
            ));
            StoreBackend::Embedded
        }
    }
}

/// The `store` settings that only the kubernetes back-end reads are refused with any other.
fn refuse_kubernetes_only(store: &StoreDoc, errs: &mut Vec<(String, String)>) {
    let kubernetes_only = [
        ("store.namespace", store.namespace.is_some()),
        ("store.kubeconfig", store.kubeconfig.is_some()),
        ("store.context", store.context.is_some()),
        (
            "store.operatorNamespace",
            store.operator_namespace.is_some(),
        ),
        ("store.leaderElection", store.leader_election.is_some()),
    ];
    for (field, set) in kubernetes_only {
        if set {
            errs.push((
                field.into(),
                "applies only with store.backend: kubernetes".into(),
            ));
        }
    }
}

/// `store.etcd`: required with the etcd back-end; its files resolved against `base`.
fn etcd_backend(
    etcd: Option<&bloodraven_etcd::EtcdConfig>,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> StoreBackend {
    let Some(e) = etcd else {
        errs.push((
            "store.etcd".into(),
            "store.backend: etcd needs store.etcd (at least endpoints)".into(),
        ));
        return StoreBackend::Embedded;
    };
    let mut e = e.clone();
    let rel = |p: &Option<PathBuf>| p.as_ref().map(|p| resolve(base, &p.display().to_string()));
    e.ca_file = rel(&e.ca_file);
    e.cert_file = rel(&e.cert_file);
    e.key_file = rel(&e.key_file);
    e.password_file = rel(&e.password_file);
    match e.resolve() {
        Ok(settings) => StoreBackend::Etcd(settings),
        Err(broken) => {
            errs.push((format!("store.etcd.{}", broken.field), broken.rule));
            StoreBackend::Embedded
        }
    }
}

/// The kubernetes back-end: the watched namespace, the operator's own namespace (from the
/// file, the pod, the watched namespace, or `default`), leader election and the kubeconfig.
fn kubernetes_backend(
    store: &StoreDoc,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> StoreBackend {
    if let Some(ns) = &store.namespace
        && let Err(rule) = check_dns1123_label(ns)
    {
        errs.push(("store.namespace".into(), rule.into()));
    }
    let operator_namespace = store
        .operator_namespace
        .clone()
        .or_else(|| env_var("POD_NAMESPACE"))
        .or_else(|| store.namespace.clone())
        .unwrap_or_else(|| "default".into());
    if let Err(rule) = check_dns1123_label(&operator_namespace) {
        errs.push(("store.operatorNamespace".into(), rule.into()));
    }
    StoreBackend::Kubernetes(KubernetesSettings {
        namespace: store.namespace.clone(),
        operator_namespace,
        leader_election: leader_election(store.leader_election.as_ref(), errs),
        pod_name: env_var("POD_NAME"),
        kubeconfig: store.kubeconfig.as_ref().map(|k| resolve(base, k)),
        context: store.context.clone(),
    })
}

/// `deployAPI`: when enabled, served on `listen.https` over TLS ([`deploy_api_tls`]) with the
/// store's way of checking tokens ([`token_signing_key`]).
fn deploy_api(
    d: &OperatorDoc,
    store: &StoreBackend,
    https_listen: SocketAddr,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> Option<DeployApiSettings> {
    if !d.deploy_api.enabled {
        return None;
    }
    let tls = deploy_api_tls(d.tls.as_ref(), store, base, errs);
    let token_key = token_signing_key(d.token_signing_key_file.as_ref(), store, base, errs);
    tls.map(|tls| DeployApiSettings {
        listen: https_listen,
        tls,
        token_key_file: token_key,
        audience: d
            .deploy_api
            .audience
            .clone()
            .unwrap_or_else(|| DEPLOY_AUDIENCE.to_string()),
    })
}

/// `tls` for the deploy API: a certificate and key file that exist, or (Kubernetes mode) a
/// Secret's name.
fn deploy_api_tls(
    tls: Option<&TlsDoc>,
    store: &StoreBackend,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> Option<TlsSource> {
    match tls {
        None => {
            errs.push((
                "tls".into(),
                "deployAPI.enabled needs tls (certFile and keyFile, or secretName in Kubernetes mode): the deploy API is served only over TLS".into(),
            ));
            None
        }
        Some(TlsDoc {
            secret_name: Some(name),
            cert_file: None,
            key_file: None,
        }) => {
            if !store.reads_secrets() {
                errs.push((
                    "tls.secretName".into(),
                    "applies only with store.backend: kubernetes".into(),
                ));
            }
            if let Err(rule) = check_dns1123_subdomain(name) {
                errs.push(("tls.secretName".into(), rule.into()));
            }
            Some(TlsSource::Secret { name: name.clone() })
        }
        Some(TlsDoc {
            secret_name: None,
            cert_file: Some(c),
            key_file: Some(k),
        }) => {
            let (cert, key) = (resolve(base, c), resolve(base, k));
            for (field, p) in [("tls.certFile", &cert), ("tls.keyFile", &key)] {
                if !p.is_file() {
                    errs.push((field.into(), format!("file {} does not exist", p.display())));
                }
            }
            Some(TlsSource::Files { cert, key })
        }
        Some(_) => {
            errs.push((
                "tls".into(),
                "must set certFile and keyFile, or only secretName".into(),
            ));
            None
        }
    }
}

/// `tokenSigningKeyFile`: required (and must exist) when this operator issues deploy tokens;
/// refused when the store checks tokens itself (Kubernetes `TokenReview`).
fn token_signing_key(
    file: Option<&String>,
    store: &StoreBackend,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> Option<PathBuf> {
    match (file, store.issues_tokens()) {
        (Some(key), true) => {
            let p = resolve(base, key);
            if !p.is_file() {
                errs.push((
                    "tokenSigningKeyFile".into(),
                    format!("file {} does not exist", p.display()),
                ));
            }
            Some(p)
        }
        (None, true) => {
            errs.push((
                "tokenSigningKeyFile".into(),
                "deployAPI.enabled needs a token signing key file (create one with `bloodraven token keygen`)".into(),
            ));
            None
        }
        (Some(_), false) => {
            errs.push((
                "tokenSigningKeyFile".into(),
                "does not apply with store.backend: kubernetes (deploy tokens are projected ServiceAccount tokens, checked by TokenReview)".into(),
            ));
            None
        }
        (None, false) => None,
    }
}

/// `topologySigningKeyFile` (a key that loads) or, in Kubernetes mode,
/// `topologySigningKeySecret`; never both.
fn topology_key(
    d: &OperatorDoc,
    store: &StoreBackend,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> Option<KeySource> {
    match (&d.topology_signing_key_file, &d.topology_signing_key_secret) {
        (Some(_), Some(_)) => {
            errs.push((
                "topologySigningKeySecret".into(),
                "set either topologySigningKeyFile or topologySigningKeySecret".into(),
            ));
            None
        }
        (None, Some(name)) => {
            if !store.reads_secrets() {
                errs.push((
                    "topologySigningKeySecret".into(),
                    "applies only with store.backend: kubernetes".into(),
                ));
            }
            Some(KeySource::Secret { name: name.clone() })
        }
        (Some(k), None) => {
            let p = resolve(base, k);
            if p.is_file() {
                if let Err(e) = bloodraven_runtime::topology::SigningKey::load(&p) {
                    errs.push(("topologySigningKeyFile".into(), e.to_string()));
                }
            } else {
                errs.push((
                    "topologySigningKeyFile".into(),
                    format!(
                        "file {} does not exist (create one with `bloodraven topology keygen`)",
                        p.display()
                    ),
                ));
            }
            Some(KeySource::File(p))
        }
        (None, None) => None,
    }
}

/// `componentTLS`: every field given, the files a component identity.
fn component_tls(
    c: &ComponentTlsDoc,
    base: &Path,
    errs: &mut Vec<(String, String)>,
) -> Option<ComponentTlsSettings> {
    use bloodraven_runtime::mtls::{Material, MtlsError, TlsFiles};
    let mut need = |field: &str, v: &Option<String>| {
        let v = v.as_deref().map(str::trim).filter(|v| !v.is_empty());
        if v.is_none() {
            errs.push((
                format!("componentTLS.{field}"),
                "is required: the component listener serves sidecars and routers over mutual TLS"
                    .into(),
            ));
        }
        v.map(str::to_string)
    };
    let listen = need("listen", &c.listen);
    let cert = need("certFile", &c.cert_file);
    let key = need("keyFile", &c.key_file);
    let ca = need("caFile", &c.ca_file);
    let listen = listen?.parse::<SocketAddr>().map_err(|_| {
        errs.push((
            "componentTLS.listen".into(),
            "must be an address such as 0.0.0.0:8444".into(),
        ));
    });
    let files = TlsFiles {
        cert: resolve(base, &cert?),
        key: resolve(base, &key?),
        ca: resolve(base, &ca?),
    };
    let listen = listen.ok()?;
    if let Err(e) = Material::load(&files, 0) {
        let field = match &e {
            MtlsError::Read { path, .. } | MtlsError::Empty { path, .. }
                if *path == files.ca.display().to_string() =>
            {
                "caFile"
            }
            MtlsError::Read { path, .. } | MtlsError::Empty { path, .. }
                if *path == files.key.display().to_string() =>
            {
                "keyFile"
            }
            MtlsError::KeyMismatch { .. } => "keyFile",
            MtlsError::NotIssuedByCa { .. } => "caFile",
            _ => "certFile",
        };
        errs.push((format!("componentTLS.{field}"), e.to_string()));
        return None;
    }
    Some(ComponentTlsSettings { listen, files })
}

/// `store.leaderElection`, defaults filled; the durations must keep
/// `retryPeriod < renewDeadline < leaseDuration`.
fn leader_election(
    doc: Option<&LeaderElectionDoc>,
    errs: &mut Vec<(String, String)>,
) -> LeaderElection {
    let mut le = LeaderElection::default();
    let Some(doc) = doc else { return le };
    if let Some(n) = &doc.lease_name {
        if let Err(rule) = check_dns1123_subdomain(n) {
            errs.push(("store.leaderElection.leaseName".into(), rule.into()));
        }
        le.lease_name.clone_from(n);
    }
    for (field, value, slot) in [
        ("leaseDuration", &doc.lease_duration, &mut le.lease_duration),
        ("renewDeadline", &doc.renew_deadline, &mut le.renew_deadline),
        ("retryPeriod", &doc.retry_period, &mut le.retry_period),
    ] {
        if let Some(v) = value {
            match bloodraven_core::duration::parse_duration(v) {
                Ok(d) => *slot = d,
                Err(e) => errs.push((format!("store.leaderElection.{field}"), e.to_string())),
            }
        }
    }
    if !(le.retry_period < le.renew_deadline && le.renew_deadline < le.lease_duration) {
        errs.push((
            "store.leaderElection".into(),
            "must keep retryPeriod < renewDeadline < leaseDuration".into(),
        ));
    }
    le
}

/// A minimal database body for storing.
pub fn database_body(spec: &DatabaseSpec) -> DatabaseBody {
    DatabaseBody { spec: spec.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: OperatorConfig
dataDir: data
listen: {http: "127.0.0.1:0"}
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlFailoverGroup
metadata: {name: playground, namespace: default}
spec:
  sites:
    - name: iad
      mysql: {host: 127.0.0.1, port: 3307, credentials: {file: iad.cred}}
      sidecar: {url: "http://127.0.0.1:18080"}
    - name: pdx
      mysql: {host: 127.0.0.1, port: 3308, credentials: {file: pdx.cred}}
      sidecar: {url: "http://127.0.0.1:18081"}
  sidecar: {leaseTimeout: 20s, peerCheckInterval: 5s}
---
apiVersion: bloodraven.shipstream.io/v1alpha1
kind: MysqlDatabase
metadata: {name: counter-app, namespace: default}
spec:
  failoverGroupRef: {name: playground}
  deploymentClients: [{namespace: ci, serviceAccount: deployer}]
"#;

    fn base() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in ["iad.cred", "pdx.cred"] {
            std::fs::write(d.path().join(f), "username=u\npassword=p\n").unwrap();
        }
        d
    }

    #[test]
    fn the_kubernetes_store_takes_its_groups_from_the_cluster() {
        let b = base();
        let only_operator = "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\nstore: {backend: kubernetes, namespace: db}\n";
        let c = parse(only_operator, "cfg.yaml", b.path()).unwrap();
        assert_eq!(
            c.settings.store,
            StoreBackend::Kubernetes(KubernetesSettings {
                namespace: Some("db".into()),
                operator_namespace: "db".into(),
                leader_election: LeaderElection::default(),
                pod_name: None,
                kubeconfig: None,
                context: None
            })
        );
        // With group documents: refused, naming the setting.
        let with_groups = GOOD.replacen(
            "listen: {http: \"127.0.0.1:0\"}",
            "listen: {http: \"127.0.0.1:0\"}\nstore: {backend: kubernetes}",
            1,
        );
        let err = parse(&with_groups, "cfg.yaml", b.path()).unwrap_err();
        assert!(
            err.problems().iter().any(|p| p.field == "store.backend"),
            "{err}"
        );
        // Bad values name their field; Kubernetes-only fields need the backend.
        for (doc, field) in [
            ("store: {backend: mongo}", "store.backend"),
            ("store: {backend: etcd}", "store.etcd"),
            (
                "store: {backend: etcd, etcd: {endpoints: []}}",
                "store.etcd.endpoints",
            ),
            (
                "store: {backend: etcd, etcd: {endpoints: [\"127.0.0.1:2379\"], prefix: nope}}",
                "store.etcd.prefix",
            ),
            (
                "store: {etcd: {endpoints: [\"127.0.0.1:2379\"]}}",
                "store.etcd",
            ),
            (
                "store: {backend: etcd, namespace: db, etcd: {endpoints: [\"127.0.0.1:2379\"]}}",
                "store.namespace",
            ),
            (
                "store: {backend: kubernetes, namespace: Bad_NS}",
                "store.namespace",
            ),
            ("store: {namespace: db}", "store.namespace"),
        ] {
            let text = format!(
                "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\n{doc}\n"
            );
            let err = parse(&text, "cfg.yaml", b.path()).unwrap_err();
            assert!(
                err.problems().iter().any(|p| p.field == field),
                "{doc}: {err}"
            );
        }
    }

    #[test]
    fn the_etcd_store_takes_its_groups_from_this_file_and_resolves_its_paths_here() {
        let b = base();
        std::fs::write(b.path().join("etcd-ca.crt"), "x").unwrap();
        let text = GOOD.replacen(
            "listen: {http: \"127.0.0.1:0\"}",
            "listen: {http: \"127.0.0.1:0\"}\nstore: {backend: etcd, etcd: {endpoints: [\"127.0.0.1:2379\", \"127.0.0.1:22379\"], caFile: etcd-ca.crt, leaseTTL: 4s}}",
            1,
        );
        let c = parse(&text, "cfg.yaml", b.path()).unwrap();
        let StoreBackend::Etcd(e) = &c.settings.store else {
            panic!("{:?}", c.settings.store);
        };
        assert_eq!(e.prefix, "/bloodraven/");
        assert_eq!(e.lease_ttl, std::time::Duration::from_secs(4));
        assert_eq!(e.leader_key(), "/bloodraven/leader");
        assert_eq!(e.client.endpoints, ["127.0.0.1:2379", "127.0.0.1:22379"]);
        assert_eq!(
            e.client.ca_file.as_deref(),
            Some(b.path().join("etcd-ca.crt").as_path())
        );
        assert!(!c.groups.is_empty(), "groups come from the file");
        assert!(c.settings.store.issues_tokens());
    }

    #[test]
    fn good_config_loads() {
        let b = base();
        let c = parse(GOOD, "cfg.yaml", b.path()).unwrap();
        assert_eq!(c.settings.data_dir, b.path().join("data"));
        assert_eq!(
            c.groups[0].spec.sites[0].mysql.credentials.file.as_deref(),
            Some(b.path().join("iad.cred").to_str().unwrap()),
            "credential paths are resolved against the configuration's directory"
        );
        assert_eq!(c.settings.http_listen.to_string(), "127.0.0.1:0");
        assert!(c.settings.deploy_api.is_none());
        assert_eq!(c.groups.len(), 1);
        assert_eq!(c.groups[0].config.sites.len(), 2);
        assert_eq!(
            c.databases[0].spec.deployment_clients[0].service_account,
            "deployer"
        );
    }

    #[test]
    fn unknown_field_names_document_and_field() {
        let bad = GOOD.replace("sidecar: {leaseTimeout", "sidecar: {leaseTimout");
        let b = base();
        let err = parse(&bad, "cfg.yaml", b.path()).unwrap_err();
        let p = &err.problems()[0];
        assert_eq!(
            p.document,
            "document 2 (MysqlFailoverGroup default/playground)"
        );
        assert_eq!(p.field, "spec.sidecar.leaseTimout");
        assert!(p.rule.contains("leaseTimout"), "{p}");
    }

    #[test]
    fn rule_violations_are_reported_together() {
        let bad = GOOD
            .replace("peerCheckInterval: 5s", "peerCheckInterval: 10s")
            .replace(
                "name: playground}\n  deploymentClients",
                "name: nope}\n  deploymentClients",
            );
        let b = base();
        let err = parse(&bad, "cfg.yaml", b.path()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("spec.sidecar.leaseTimeout"), "{text}");
        assert!(text.contains("spec.failoverGroupRef.name"), "{text}");
        assert_eq!(err.problems().len(), 2, "{text}");
    }

    #[test]
    fn missing_credential_files_and_secrets_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let err = parse(GOOD, "cfg.yaml", d.path()).unwrap_err();
        assert!(
            err.problems()
                .iter()
                .any(|p| p.field == "spec.sites[0].mysql.credentials.file"
                    && p.rule.contains("does not exist")),
            "{err}"
        );
        let b = base();
        let bad = GOOD.replace(
            "credentials: {file: iad.cred}",
            "credentials: {secretName: iad-mysql}",
        );
        let err = parse(&bad, "cfg.yaml", b.path()).unwrap_err();
        assert!(
            err.problems()
                .iter()
                .any(|p| p.field.ends_with("secretName")),
            "{err}"
        );
    }

    #[test]
    fn store_durability_reads_a_bare_off() {
        let b = base();
        for (text, want) in [
            ("off", Durability::Off),
            ("\"off\"", Durability::Off),
            ("normal", Durability::Normal),
            ("full", Durability::Full),
        ] {
            let cfg = GOOD.replace(
                "dataDir: data",
                &format!("dataDir: data\nstore: {{durability: {text}}}"),
            );
            assert_eq!(
                parse(&cfg, "cfg.yaml", b.path())
                    .unwrap()
                    .settings
                    .durability,
                want,
                "{text}"
            );
        }
        let cfg = GOOD.replace("dataDir: data", "dataDir: data\nstore: {durability: fast}");
        let err = parse(&cfg, "cfg.yaml", b.path()).unwrap_err();
        assert!(
            err.problems().iter().any(|p| p.field == "store.durability"),
            "{err}"
        );
    }

    #[test]
    fn deploy_api_needs_tls_and_key() {
        let bad = GOOD.replace("dataDir: data", "dataDir: data\ndeployAPI: {enabled: true}");
        let err = parse(&bad, "cfg.yaml", Path::new(".")).unwrap_err();
        assert!(err.problems().iter().any(|p| p.field == "tls"), "{err}");
    }

    #[test]
    fn duplicates_kinds_and_versions() {
        let mut bad = GOOD.to_string();
        bad.push_str("---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlDatabase\nmetadata: {name: counter-app}\nspec: {failoverGroupRef: {name: playground}}\n");
        bad.push_str("---\napiVersion: v1\nkind: Secret\nmetadata: {name: x}\n");
        bad.push_str("---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: Widget\n");
        let b = base();
        let err = parse(&bad, "cfg.yaml", b.path()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("duplicate MysqlDatabase"), "{text}");
        assert!(text.contains("apiVersion"), "{text}");
        assert!(text.contains("kind"), "{text}");
    }

    #[test]
    fn missing_operator_config_and_bad_yaml() {
        let only_group = GOOD.split("---").nth(1).unwrap();
        let err = parse(only_group, "cfg.yaml", Path::new(".")).unwrap_err();
        assert!(err.to_string().contains("OperatorConfig"));
        let err = parse("a: [", "cfg.yaml", Path::new(".")).unwrap_err();
        assert!(matches!(err, ConfigError::Yaml { .. }));
        let err = load(Path::new("/nonexistent/cfg.yaml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
    }
}
