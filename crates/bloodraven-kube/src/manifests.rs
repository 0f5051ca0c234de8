//! `bloodraven manifests`: the Helm chart's install (`charts/bloodraven`) rendered without
//! Helm, from the same values (the chart's `values.yaml` as defaults, a user's values file
//! merged over them as Helm merges), as typed `k8s-openapi` objects. A test renders both for
//! representative values and requires the same objects.
//!
//! The chart stays the reference: a change to a template needs the same change here, and the
//! equality test says where they differ.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, LocalObjectReference,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::rbac::{Scope, policy_rules};

/// The chart's default values, the base every render starts from.
pub const DEFAULT_VALUES: &str = include_str!("../../../charts/bloodraven/values.yaml");
/// The chart's `appVersion`: the operator's version.
pub const APP_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The Grafana dashboard the chart ships.
pub const DASHBOARD: &str =
    include_str!("../../../charts/bloodraven/files/bloodraven-dashboard.json");

/// Why the values cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ManifestsError {
    #[error("values file: {0}")]
    Parse(String),
    #[error("{field}: {rule}")]
    Invalid { field: String, rule: String },
    #[error("cannot encode the manifests: {0}")]
    Encode(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Values {
    pub image: Image,
    pub image_pull_secrets: Vec<LocalObjectReference>,
    pub replica_count: i32,
    pub watch_namespace: String,
    pub leader_election: LeaderElection,
    pub topology_key: ExistingSecret,
    #[serde(rename = "componentTLS")]
    pub component_tls: ExistingSecret,
    pub auxiliary: Auxiliary,
    pub restore: RestoreValues,
    pub resources: Option<ResourceRequirements>,
    pub pod_annotations: BTreeMap<String, String>,
    pub pod_labels: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub affinity: Option<Affinity>,
    pub priority_class_name: String,
    pub service: ServiceValues,
    pub service_monitor: ServiceMonitorValues,
    pub prometheus_rule: PrometheusRuleValues,
    pub pod_monitor: PodMonitorValues,
    pub network_policy: NetworkPolicyValues,
    pub grafana_dashboard: DashboardValues,
}

/// `restore`: the claim holding restore-in-place's dumps, mounted read-only.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreValues {
    #[serde(default)]
    pub existing_claim: String,
    pub mount_path: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub pull_policy: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderElection {
    pub lease_duration: String,
    pub renew_deadline: String,
    pub retry_period: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExistingSecret {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub existing_secret: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Auxiliary {
    #[serde(rename = "deployAPI")]
    pub deploy_api: Enabled,
    #[serde(rename = "escrowTLS")]
    pub escrow_tls: ExistingSecret,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Enabled {
    pub enabled: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceValues {
    #[serde(rename = "type")]
    pub type_: String,
    pub http_port: i32,
    pub https_port: i32,
    pub component_port: i32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMonitorValues {
    pub enabled: bool,
    pub interval: String,
    pub labels: BTreeMap<String, String>,
}

/// `prometheusRule`: the alerts as a `PrometheusRule`, tuned per alert.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusRuleValues {
    pub enabled: bool,
    pub labels: BTreeMap<String, String>,
    #[serde(rename = "runbookURL")]
    pub runbook_url: String,
    pub alerts: BTreeMap<String, AlertValues>,
}

/// `prometheusRule.alerts.<name>`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertValues {
    #[serde(rename = "for")]
    pub for_: Option<String>,
    /// A number, or a string holding one (Helm renders either the same).
    pub threshold: Option<Value>,
    pub window: Option<String>,
    #[serde(default)]
    pub disabled: bool,
}

impl AlertValues {
    fn tuning(&self) -> bloodraven_core::alerts::Tuning {
        bloodraven_core::alerts::Tuning {
            for_: self.for_.clone(),
            threshold: self.threshold.as_ref().map(|t| match t {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }),
            window: self.window.clone(),
            disabled: self.disabled,
        }
    }
}

/// `podMonitor`: the sidecars' `/metrics`, scraped in the MySQL Pods.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodMonitorValues {
    pub enabled: bool,
    pub interval: String,
    pub labels: BTreeMap<String, String>,
    pub selector: BTreeMap<String, String>,
    pub namespaces: Vec<String>,
    pub port: String,
    /// A Secret (key `ca.crt`) with the component CA the sidecars' TLS is verified with.
    #[serde(default)]
    pub ca_secret: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyValues {
    pub enabled: bool,
    pub http_from: Vec<NetworkPolicyPeer>,
    pub https_from: Vec<NetworkPolicyPeer>,
    pub component_from: Vec<NetworkPolicyPeer>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DashboardValues {
    pub enabled: bool,
    pub labels: BTreeMap<String, String>,
}

/// Merges `over` into `base` as Helm merges values files: maps key by key, anything else
/// replaced.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// The chart's defaults with `user` (a values file's text, if any) merged over them, checked.
pub fn values(user: Option<&str>) -> Result<Values, ManifestsError> {
    let mut v: Value = serde_saphyr::from_str(DEFAULT_VALUES)
        .map_err(|e| ManifestsError::Parse(format!("the chart's values.yaml: {e}")))?;
    if let Some(text) = user {
        let over: Value =
            serde_saphyr::from_str(text).map_err(|e| ManifestsError::Parse(e.to_string()))?;
        if !over.is_null() {
            if !over.is_object() {
                return Err(ManifestsError::Parse("the values must be a mapping".into()));
            }
            merge(&mut v, over);
        }
    }
    let values: Values =
        serde_json::from_value(v).map_err(|e| ManifestsError::Parse(e.to_string()))?;
    check(&values)?;
    Ok(values)
}

fn invalid(field: &str, rule: &str) -> ManifestsError {
    ManifestsError::Invalid {
        field: field.into(),
        rule: rule.into(),
    }
}

/// The rules of `values.schema.json` and the chart's `bloodraven.validate`, with the same
/// messages.
fn check(v: &Values) -> Result<(), ManifestsError> {
    if v.auxiliary.deploy_api.enabled && !v.auxiliary.escrow_tls.enabled {
        return Err(invalid(
            "auxiliary.deployAPI.enabled",
            "requires auxiliary.escrowTLS.enabled with auxiliary.escrowTLS.existingSecret (a kubernetes.io/tls Secret): the deploy API is served only over TLS on :8443",
        ));
    }
    if v.auxiliary.escrow_tls.enabled && v.auxiliary.escrow_tls.existing_secret.is_empty() {
        return Err(invalid(
            "auxiliary.escrowTLS.enabled",
            "requires auxiliary.escrowTLS.existingSecret: the name of a kubernetes.io/tls Secret (tls.crt, tls.key) in the release's namespace",
        ));
    }
    if v.pod_monitor.enabled && v.pod_monitor.selector.is_empty() {
        return Err(invalid(
            "podMonitor.enabled",
            "requires podMonitor.selector: the labels of the MySQL Pods that run the sidecar container",
        ));
    }
    bloodraven_core::alerts::check(&alert_tuning(v), "prometheusRule.alerts").map_err(|e| {
        ManifestsError::Invalid {
            field: e.field,
            rule: e.rule,
        }
    })?;
    if !(1..=5).contains(&v.replica_count) {
        return Err(invalid("replicaCount", "must be between 1 and 5"));
    }
    if !["Always", "IfNotPresent", "Never"].contains(&v.image.pull_policy.as_str()) {
        return Err(invalid(
            "image.pullPolicy",
            "must be Always, IfNotPresent or Never",
        ));
    }
    if !["ClusterIP", "NodePort", "LoadBalancer"].contains(&v.service.type_.as_str()) {
        return Err(invalid(
            "service.type",
            "must be ClusterIP, NodePort or LoadBalancer",
        ));
    }
    for (field, port) in [
        ("service.httpPort", v.service.http_port),
        ("service.httpsPort", v.service.https_port),
        ("service.componentPort", v.service.component_port),
    ] {
        if !(1..=65535).contains(&port) {
            return Err(invalid(field, "must be a port between 1 and 65535"));
        }
    }
    let digest_ok = v.image.digest.len() == 71
        && v.image.digest.starts_with("sha256:")
        && v.image.digest[7..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !v.image.digest.is_empty() && !digest_ok {
        return Err(invalid(
            "image.digest",
            "must be sha256: and 64 lowercase hex digits",
        ));
    }
    Ok(())
}

fn alert_tuning(v: &Values) -> BTreeMap<String, bloodraven_core::alerts::Tuning> {
    v.prometheus_rule
        .alerts
        .iter()
        .map(|(name, a)| (name.clone(), a.tuning()))
        .collect()
}

/// The release: its name and namespace, as `helm install NAME -n NAMESPACE` gives them.
#[derive(Clone, Debug)]
pub struct Release {
    pub name: String,
    pub namespace: String,
}

impl Release {
    /// The name of the release's objects (the chart's `bloodraven.fullname`).
    pub fn fullname(&self) -> String {
        let n = if self.name.contains("bloodraven") {
            self.name.clone()
        } else {
            format!("{}-bloodraven", self.name)
        };
        n.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches('-')
            .to_string()
    }

    fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/name".into(), "bloodraven".into()),
            ("app.kubernetes.io/instance".into(), self.name.clone()),
        ])
    }

    fn labels(&self) -> BTreeMap<String, String> {
        let mut l = self.selector();
        l.insert("app.kubernetes.io/version".into(), APP_VERSION.into());
        l.insert("app.kubernetes.io/part-of".into(), "bloodraven".into());
        l
    }

    fn meta(&self, name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: namespace.map(str::to_string),
            labels: Some(self.labels()),
            ..ObjectMeta::default()
        }
    }
}

fn to_value<T: serde::Serialize>(
    kind: &str,
    api_version: &str,
    o: &T,
) -> Result<Value, ManifestsError> {
    let mut v = serde_json::to_value(o).map_err(|e| ManifestsError::Encode(e.to_string()))?;
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(v)
}

/// Where the operator's component TLS Secret is mounted.
pub const COMPONENT_TLS_DIR: &str = "/var/run/secrets/bloodraven/component-tls";

/// The operator's configuration file, as the chart's `ConfigMap` holds it.
pub fn operator_config(v: &Values, r: &Release) -> String {
    use std::fmt::Write;
    let mut s = String::from(
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: /var/lib/bloodraven\nlisten:\n  http: 0.0.0.0:8082\n  https: 0.0.0.0:8443\n",
    );
    // Writing into a String cannot fail.
    if v.auxiliary.escrow_tls.enabled {
        let _ = writeln!(
            s,
            "tls:\n  secretName: {}",
            v.auxiliary.escrow_tls.existing_secret
        );
    }
    if !v.component_tls.existing_secret.is_empty() {
        let _ = writeln!(
            s,
            "componentTLS:\n  listen: 0.0.0.0:8444\n  certFile: {COMPONENT_TLS_DIR}/tls.crt\n  keyFile: {COMPONENT_TLS_DIR}/tls.key\n  caFile: {COMPONENT_TLS_DIR}/ca.crt"
        );
    }
    if !v.topology_key.existing_secret.is_empty() {
        let _ = writeln!(
            s,
            "topologySigningKeySecret: {}",
            v.topology_key.existing_secret
        );
    }
    let _ = writeln!(
        s,
        "deployAPI:\n  enabled: {}\nstore:\n  backend: kubernetes",
        v.auxiliary.deploy_api.enabled
    );
    if !v.watch_namespace.is_empty() {
        let _ = writeln!(s, "  namespace: {}", v.watch_namespace);
    }
    let _ = writeln!(
        s,
        "  operatorNamespace: {}\n  leaderElection:\n    leaseDuration: {}\n    renewDeadline: {}\n    retryPeriod: {}",
        r.namespace,
        v.leader_election.lease_duration,
        v.leader_election.renew_deadline,
        v.leader_election.retry_period
    );
    s
}

fn subject(r: &Release) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: r.fullname(),
        namespace: Some(r.namespace.clone()),
        ..Subject::default()
    }]
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

const RBAC: &str = "rbac.authorization.k8s.io/v1";

/// A `Role` `name` in `namespace` with `rules`, and its `RoleBinding` to the release's service
/// account.
fn role_and_binding(
    r: &Release,
    name: &str,
    namespace: &str,
    rules: Vec<PolicyRule>,
) -> Result<[Value; 2], ManifestsError> {
    let ns = Some(namespace);
    Ok([
        to_value(
            "Role",
            RBAC,
            &Role {
                metadata: r.meta(name, ns),
                rules: Some(rules),
            },
        )?,
        to_value(
            "RoleBinding",
            RBAC,
            &RoleBinding {
                metadata: r.meta(name, ns),
                role_ref: role_ref("Role", name),
                subjects: Some(subject(r)),
            },
        )?,
    ])
}

/// A `ClusterRole` `name` with `rules`, and its `ClusterRoleBinding` to the release's service
/// account.
fn cluster_role_and_binding(
    r: &Release,
    name: &str,
    rules: Vec<PolicyRule>,
) -> Result<[Value; 2], ManifestsError> {
    Ok([
        to_value(
            "ClusterRole",
            RBAC,
            &ClusterRole {
                metadata: r.meta(name, None),
                rules: Some(rules),
                ..ClusterRole::default()
            },
        )?,
        to_value(
            "ClusterRoleBinding",
            RBAC,
            &ClusterRoleBinding {
                metadata: r.meta(name, None),
                role_ref: role_ref("ClusterRole", name),
                subjects: Some(subject(r)),
            },
        )?,
    ])
}

fn rbac(v: &Values, r: &Release) -> Result<Vec<Value>, ManifestsError> {
    let full = r.fullname();
    let cluster_name = format!("{}-{full}", r.namespace);
    let deploy_api = v.auxiliary.deploy_api.enabled;
    let mut out = Vec::new();
    out.extend(role_and_binding(
        r,
        &full,
        &r.namespace,
        policy_rules(Scope::Operator, deploy_api),
    )?);
    let watched = policy_rules(Scope::Watched, deploy_api);
    if v.watch_namespace.is_empty() {
        let name = format!("{cluster_name}-watched");
        out.extend(cluster_role_and_binding(r, &name, watched)?);
    } else {
        let name = format!("{full}-watched");
        out.extend(role_and_binding(r, &name, &v.watch_namespace, watched)?);
    }
    if deploy_api {
        let name = format!("{cluster_name}-tokenreview");
        out.extend(cluster_role_and_binding(
            r,
            &name,
            policy_rules(Scope::Cluster, true),
        )?);
    }
    Ok(out)
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn non_empty_map(m: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!m.is_empty()).then(|| m.clone())
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// The operator's Deployment. Over 100 lines: one literal object (its pod, container,
/// probes, volumes and security context), which reads best whole, as the chart's template does.
fn deployment(v: &Values, r: &Release) -> Deployment {
    let image = if v.image.digest.is_empty() {
        let tag = if v.image.tag.is_empty() {
            APP_VERSION
        } else {
            &v.image.tag
        };
        format!("{}:{tag}", v.image.repository)
    } else {
        format!("{}@{}", v.image.repository, v.image.digest)
    };
    let mut ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: 8082,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }];
    if v.auxiliary.deploy_api.enabled {
        ports.push(ContainerPort {
            name: Some("https".into()),
            container_port: 8443,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    let component = !v.component_tls.existing_secret.is_empty();
    if component {
        ports.push(ContainerPort {
            name: Some("component".into()),
            container_port: 8444,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    let mut pod_labels = r.labels();
    pod_labels.extend(v.pod_labels.clone());
    let mount = |name: &str, path: &str, ro: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: ro.then_some(true),
        ..VolumeMount::default()
    };
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let container = Container {
        name: "operator".into(),
        image: Some(image),
        image_pull_policy: Some(v.image.pull_policy.clone()),
        args: Some(
            ["operator", "--config", "/etc/bloodraven/operator.yaml"]
                .map(String::from)
                .to_vec(),
        ),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(ports),
        readiness_probe: Some(probe("/readyz", 5, 3)),
        liveness_probe: Some(probe("/healthz", 10, 6)),
        resources: v.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(
            [
                mount("config", "/etc/bloodraven", true),
                mount("data", "/var/lib/bloodraven", false),
                mount("tmp", "/tmp", false),
            ]
            .into_iter()
            .chain(
                (!v.restore.existing_claim.is_empty())
                    .then(|| mount("restore", &v.restore.mount_path, true)),
            )
            .chain(component.then(|| mount("component-tls", COMPONENT_TLS_DIR, true)))
            .collect(),
        ),
        ..Container::default()
    };
    Deployment {
        metadata: r.meta(&r.fullname(), Some(&r.namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(v.replica_count),
            selector: LabelSelector {
                match_labels: Some(r.selector()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: non_empty_map(&v.pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(r.fullname()),
                    image_pull_secrets: non_empty(v.image_pull_secrets.clone()),
                    priority_class_name: (!v.priority_class_name.is_empty())
                        .then(|| v.priority_class_name.clone()),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        fs_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(
                        vec![
                            Volume {
                                name: "config".into(),
                                config_map: Some(ConfigMapVolumeSource {
                                    name: r.fullname(),
                                    ..ConfigMapVolumeSource::default()
                                }),
                                ..Volume::default()
                            },
                            empty("data"),
                            empty("tmp"),
                        ]
                        .into_iter()
                        .chain((!v.restore.existing_claim.is_empty()).then(|| Volume {
                            name: "restore".into(),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: v.restore.existing_claim.clone(),
                                read_only: Some(true),
                            }),
                            ..Volume::default()
                        }))
                        .chain(component.then(|| Volume {
                            name: "component-tls".into(),
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(v.component_tls.existing_secret.clone()),
                                ..SecretVolumeSource::default()
                            }),
                            ..Volume::default()
                        }))
                        .collect::<Vec<_>>(),
                    ),
                    node_selector: non_empty_map(&v.node_selector),
                    affinity: v.affinity.clone().filter(|a| a != &Affinity::default()),
                    tolerations: non_empty(v.tolerations.clone()),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn service(r: &Release, name: &str, type_: &str, leader: bool, ports: &[(&str, i32)]) -> Service {
    let mut selector = r.selector();
    if leader {
        selector.insert(
            bloodraven_core::contract::labels::LEADER.into(),
            "true".into(),
        );
    }
    let mut metadata = r.meta(name, Some(&r.namespace));
    if !leader {
        metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert("app.kubernetes.io/component".into(), "metrics".into());
    }
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            cluster_ip: (!leader).then(|| "None".into()),
            selector: Some(selector),
            ports: Some(
                ports
                    .iter()
                    .map(|(name, port)| ServicePort {
                        name: Some((*name).into()),
                        port: *port,
                        target_port: Some(IntOrString::String((*name).into())),
                        protocol: Some("TCP".into()),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn network_policy(v: &Values, r: &Release) -> NetworkPolicy {
    let rule = |port: i32, from: &[NetworkPolicyPeer]| NetworkPolicyIngressRule {
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".into()),
            ..NetworkPolicyPort::default()
        }]),
        from: non_empty(from.to_vec()),
    };
    let mut ingress = vec![rule(8082, &v.network_policy.http_from)];
    if !v.component_tls.existing_secret.is_empty() {
        ingress.push(rule(8444, &v.network_policy.component_from));
    }
    if v.auxiliary.deploy_api.enabled {
        ingress.push(rule(8443, &v.network_policy.https_from));
    }
    NetworkPolicy {
        metadata: r.meta(&r.fullname(), Some(&r.namespace)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(r.selector()),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// Every object of the install, in the chart's order, CRDs first when `with_crds`. Over 100
/// lines: the list of the chart's objects in their order, each a call; splitting it would
/// hide the order.
pub fn render(v: &Values, r: &Release, with_crds: bool) -> Result<Vec<Value>, ManifestsError> {
    let mut out = Vec::new();
    if with_crds {
        for crd in crate::crd::all() {
            out.push(serde_json::to_value(crd).map_err(|e| ManifestsError::Encode(e.to_string()))?);
        }
    }
    let full = r.fullname();
    let ns = Some(r.namespace.as_str());
    out.push(to_value(
        "ServiceAccount",
        "v1",
        &ServiceAccount {
            metadata: r.meta(&full, ns),
            ..ServiceAccount::default()
        },
    )?);
    out.push(to_value(
        "ConfigMap",
        "v1",
        &ConfigMap {
            metadata: r.meta(&full, ns),
            data: Some(BTreeMap::from([(
                "operator.yaml".into(),
                operator_config(v, r),
            )])),
            ..ConfigMap::default()
        },
    )?);
    if v.grafana_dashboard.enabled {
        let mut meta = r.meta(&format!("{full}-dashboard"), ns);
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .extend(v.grafana_dashboard.labels.clone());
        out.push(to_value(
            "ConfigMap",
            "v1",
            &ConfigMap {
                metadata: meta,
                data: Some(BTreeMap::from([(
                    "bloodraven.json".into(),
                    DASHBOARD.trim_end().to_string(),
                )])),
                ..ConfigMap::default()
            },
        )?);
    }
    out.extend(rbac(v, r)?);
    // One Service for the leader: :8082, and :8443 with the deploy API (seed 01's pipelines
    // call https://bloodraven.<namespace>.svc:8443).
    let mut leader_ports = vec![("http", v.service.http_port)];
    if v.auxiliary.deploy_api.enabled {
        leader_ports.push(("https", v.service.https_port));
    }
    if !v.component_tls.existing_secret.is_empty() {
        leader_ports.push(("component", v.service.component_port));
    }
    out.push(to_value(
        "Service",
        "v1",
        &service(r, &full, &v.service.type_, true, &leader_ports),
    )?);
    out.push(to_value(
        "Service",
        "v1",
        &service(
            r,
            &format!("{full}-metrics"),
            "ClusterIP",
            false,
            &[("http", 8082)],
        ),
    )?);
    out.push(to_value("Deployment", "apps/v1", &deployment(v, r))?);
    if v.network_policy.enabled {
        out.push(to_value(
            "NetworkPolicy",
            "networking.k8s.io/v1",
            &network_policy(v, r),
        )?);
    }
    if v.service_monitor.enabled {
        // Not a k8s-openapi type: the Prometheus Operator's CRD.
        let mut labels = r.labels();
        labels.extend(v.service_monitor.labels.clone());
        let mut selector = r.selector();
        selector.insert("app.kubernetes.io/component".into(), "metrics".into());
        out.push(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": full, "namespace": r.namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": selector},
                "endpoints": [{"port": "http", "path": "/metrics", "interval": v.service_monitor.interval}],
            },
        }));
    }
    if v.prometheus_rule.enabled {
        let mut labels = r.labels();
        labels.extend(v.prometheus_rule.labels.clone());
        let rules =
            bloodraven_core::alerts::rules(&alert_tuning(v), &v.prometheus_rule.runbook_url);
        out.push(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": full, "namespace": r.namespace, "labels": labels},
            "spec": {"groups": [{"name": bloodraven_core::alerts::GROUP_NAME, "rules": rules}]},
        }));
    }
    if v.pod_monitor.enabled {
        let mut labels = r.labels();
        labels.extend(v.pod_monitor.labels.clone());
        let namespaces = if v.pod_monitor.namespaces.is_empty() {
            vec![r.namespace.clone()]
        } else {
            v.pod_monitor.namespaces.clone()
        };
        out.push(json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": {"name": format!("{full}-sidecars"), "namespace": r.namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": v.pod_monitor.selector},
                "namespaceSelector": {"matchNames": namespaces},
                "podMetricsEndpoints": [{
                    "port": v.pod_monitor.port,
                    "path": "/metrics",
                    "interval": v.pod_monitor.interval,
                    "scheme": "https",
                    "tlsConfig": if v.pod_monitor.ca_secret.is_empty() {
                        json!({"insecureSkipVerify": true})
                    } else {
                        json!({"ca": {"secret": {"name": v.pod_monitor.ca_secret, "key": "ca.crt"}}})
                    },
                }],
            },
        }));
    }
    Ok(out)
}

/// The objects as one multi-document YAML stream.
pub fn yaml(objects: &[Value]) -> Result<String, ManifestsError> {
    serde_saphyr::to_string_multiple(objects).map_err(|e| ManifestsError::Encode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_render_and_bad_values_name_the_field() {
        let r = Release {
            name: "bloodraven".into(),
            namespace: "ops".into(),
        };
        let v = values(None).unwrap();
        let objs = render(&v, &r, true).unwrap();
        assert!(objs.iter().any(|o| o["kind"] == "Deployment"));
        let err = values(Some("auxiliary: {deployAPI: {enabled: true}}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("auxiliary.deployAPI.enabled: requires auxiliary.escrowTLS.enabled"),
            "{err}"
        );
        let err = values(Some("replicaCount: 0")).unwrap_err().to_string();
        assert!(err.starts_with("replicaCount:"), "{err}");
        let err = values(Some("replicas: 3")).unwrap_err().to_string();
        assert!(err.contains("replicas"), "{err}");
    }
}
