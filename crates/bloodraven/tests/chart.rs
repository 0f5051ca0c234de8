//! The Helm chart (`charts/bloodraven`) with the real Helm 4 binary (`BLOODRAVEN_HELM`,
//! installed by `scripts/test`): `helm lint` clean and `helm template` for representative
//! values, every rendered object decoded into its `k8s-openapi` type and encoded back
//! unchanged (so no field is misspelt or misplaced); `bloodraven manifests` renders the same
//! objects; the rights equal `bloodraven_kube::rbac::RULES`; the CRDs equal `bloodraven crds`;
//! the dashboard uses only contract metrics; the snippets users paste are valid.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bloodraven_kube::rbac::{RULES, Scope};
use common::BIN;
use serde_json::Value;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/bloodraven")
}

fn helm() -> String {
    std::env::var("BLOODRAVEN_HELM").unwrap_or_else(|_| {
        panic!("BLOODRAVEN_HELM is not set: run the tests with scripts/test, which installs Helm, or point it at a Helm 4 binary")
    })
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// The representative values: defaults; the deploy API on (with its TLS, a topology key, one
/// watched namespace); `ServiceMonitor` and `NetworkPolicy` on.
const CASES: [(&str, &str); 6] = [
    ("defaults", ""),
    (
        "deploy-api",
        "auxiliary:\n  deployAPI: {enabled: true}\n  escrowTLS: {enabled: true, existingSecret: bloodraven-tls}\ntopologyKey: {existingSecret: bloodraven-topology}\nwatchNamespace: databases\nimage: {digest: \"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}\n",
    ),
    (
        "monitoring",
        "serviceMonitor: {enabled: true, labels: {release: prometheus}}\nnetworkPolicy:\n  enabled: true\n  httpFrom:\n    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: databases}}\n    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}\ngrafanaDashboard: {labels: {grafana_dashboard: \"1\", team: dba}}\nresources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}\ntolerations: [{key: dedicated, operator: Equal, value: ops, effect: NoSchedule}]\n",
    ),
    ("restore", "restore: {existingClaim: mysql-dumps}\n"),
    (
        "component-tls",
        "componentTLS: {existingSecret: bloodraven-component-tls}\nservice: {componentPort: 9444}\nnetworkPolicy:\n  enabled: true\n  componentFrom:\n    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: databases}}\npodMonitor: {enabled: true, selector: {app: mysql}, caSecret: bloodraven-component-ca}\n",
    ),
    (
        "alerts",
        "prometheusRule:\n  enabled: true\n  labels: {release: prometheus}\n  runbookURL: https://wiki.example/bloodraven/runbook\n  alerts:\n    BloodravenRecoveryPending: {for: 1h}\n    BloodravenLeaderChanges: {threshold: 5, window: 30m}\n    BloodravenDeployAPISlow: {threshold: \"0.5\"}\n    BloodravenSidecarNotScraped: {disabled: true}\npodMonitor: {enabled: true, selector: {app: mysql}, namespaces: [databases], labels: {release: prometheus}}\n",
    ),
];

fn values_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn docs(yaml: &str) -> Vec<Value> {
    let all: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    all.into_iter().filter(|d| !d.is_null()).collect()
}

fn template(values: &Path) -> Vec<Value> {
    rendered(
        "helm template",
        Command::new(helm())
            .args(["template", "bloodraven"])
            .arg(chart())
            .args(["--namespace", "ops", "--include-crds", "-f"])
            .arg(values),
    )
}

fn manifests(values: &Path) -> Vec<Value> {
    let release = ["--release-name", "bloodraven", "--namespace", "ops", "-f"];
    rendered(
        "bloodraven manifests",
        Command::new(BIN).arg("manifests").args(release).arg(values),
    )
}

/// The objects `cmd` (named `what`) prints, asserted to succeed.
fn rendered(what: &str, cmd: &mut Command) -> Vec<Value> {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    docs(&String::from_utf8(out.stdout).unwrap())
}

/// Decodes `o` into `T` and encodes it back: equal only when every field is one `T` knows, in
/// its place and of its type.
fn round_trips<T: serde::de::DeserializeOwned + serde::Serialize>(o: &Value) {
    let typed: T = serde_json::from_value(o.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", o["kind"], o["metadata"]["name"]));
    let mut back = serde_json::to_value(&typed).unwrap();
    back["apiVersion"] = o["apiVersion"].clone();
    back["kind"] = o["kind"].clone();
    assert_eq!(
        &back, o,
        "{} {} does not round-trip",
        o["kind"], o["metadata"]["name"]
    );
}

fn decode(o: &Value) {
    use k8s_openapi::api::{apps, core, networking, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    match o["kind"].as_str().unwrap() {
        "Deployment" => round_trips::<apps::v1::Deployment>(o),
        "Service" => round_trips::<core::v1::Service>(o),
        "ServiceAccount" => round_trips::<core::v1::ServiceAccount>(o),
        "ConfigMap" => round_trips::<core::v1::ConfigMap>(o),
        "Role" => round_trips::<rbac::v1::Role>(o),
        "RoleBinding" => round_trips::<rbac::v1::RoleBinding>(o),
        "ClusterRole" => round_trips::<rbac::v1::ClusterRole>(o),
        "ClusterRoleBinding" => round_trips::<rbac::v1::ClusterRoleBinding>(o),
        "NetworkPolicy" => round_trips::<networking::v1::NetworkPolicy>(o),
        "CustomResourceDefinition" => round_trips::<CustomResourceDefinition>(o),
        // The Prometheus Operator's CRD has no k8s-openapi type: its shape is checked here.
        "ServiceMonitor" => {
            assert_eq!(o["apiVersion"], "monitoring.coreos.com/v1");
            assert_eq!(o["spec"]["endpoints"][0]["port"], "http");
            assert_eq!(o["spec"]["endpoints"][0]["path"], "/metrics");
            assert!(o["spec"]["selector"]["matchLabels"].is_object());
        }
        "PodMonitor" => {
            assert_eq!(o["apiVersion"], "monitoring.coreos.com/v1");
            let e = &o["spec"]["podMetricsEndpoints"][0];
            assert_eq!(e["port"], "sidecar");
            assert_eq!(e["path"], "/metrics");
            assert!(
                !o["spec"]["selector"]["matchLabels"]
                    .as_object()
                    .unwrap()
                    .is_empty()
            );
            assert!(o["spec"]["namespaceSelector"]["matchNames"].is_array());
        }
        // Every rule has what Prometheus needs and what a page needs; promtool checks the
        // rules themselves (tests/alerts.rs).
        "PrometheusRule" => {
            assert_eq!(o["apiVersion"], "monitoring.coreos.com/v1");
            let rules = o["spec"]["groups"][0]["rules"].as_array().unwrap();
            assert!(!rules.is_empty());
            for r in rules {
                for field in ["alert", "expr", "for"] {
                    assert!(r[field].is_string(), "{field} in {r}");
                }
                assert!(!r["expr"].as_str().unwrap().contains('$'), "{r}");
                for a in ["summary", "description", "runbook_url"] {
                    assert!(r["annotations"][a].is_string(), "{a} in {r}");
                }
                assert!(r["labels"]["severity"].is_string(), "{r}");
            }
        }
        other => panic!("an unexpected kind was rendered: {other}"),
    }
}

/// Objects by (kind, namespace, name), with the config maps' YAML and JSON payloads parsed, so
/// equal objects compare equal whatever their text layout.
fn by_key(objs: Vec<Value>) -> BTreeMap<String, Value> {
    objs.into_iter()
        .map(|mut o| {
            let key = format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap()
            );
            if let Some(data) = o.get_mut("data").and_then(Value::as_object_mut) {
                for (k, v) in data.iter_mut() {
                    let text = v.as_str().unwrap().to_string();
                    *v = if k == "bloodraven.json" {
                        serde_json::from_str(&text).unwrap()
                    } else {
                        serde_saphyr::from_str(&text).unwrap()
                    };
                }
            }
            (key, o)
        })
        .collect()
}

/// A directory laid out as the component TLS Secret's volume: `tls.crt`, `tls.key`, `ca.crt`.
fn component_secret(dir: &Path) -> PathBuf {
    let d = dir.join("component-tls");
    let op = bloodraven_testkit::pki::pki().operator();
    std::fs::create_dir_all(&d).unwrap();
    for (from, to) in [
        (&op.cert, "tls.crt"),
        (&op.key, "tls.key"),
        (&op.ca, "ca.crt"),
    ] {
        std::fs::copy(from, d.join(to)).unwrap();
    }
    d
}

/// The component TLS Secret, when named, is mounted read-only, served on `component`
/// (:8444, the Service's `componentPort`), named in the operator's configuration, and admitted
/// by the network policy; the `PodMonitor` scrapes the sidecars over TLS.
#[test]
fn the_component_tls_secret_is_mounted_served_and_configured() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in CASES {
        let objs = template(&values_file(dir.path(), name, text));
        let on = name == "component-tls";
        let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let port = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "component")
            .cloned();
        assert_eq!(port.is_some(), on, "{name}");
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "component-tls")
            .cloned();
        assert_eq!(mount.is_some(), on, "{name}");
        let cm = objs
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["data"]["operator.yaml"].is_string())
            .unwrap();
        let config = cm["data"]["operator.yaml"].as_str().unwrap();
        assert_eq!(config.contains("componentTLS:"), on, "{name}");
        if !on {
            continue;
        }
        assert_eq!(port.unwrap()["containerPort"], 8444);
        let mount = mount.unwrap();
        assert_eq!(mount["readOnly"], true);
        assert_eq!(
            mount["mountPath"],
            bloodraven_kube::manifests::COMPONENT_TLS_DIR
        );
        assert!(config.contains("listen: 0.0.0.0:8444"), "{config}");
        let svc = objs
            .iter()
            .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "bloodraven")
            .unwrap();
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "component" && p["port"] == 9444),
            "{svc}"
        );
        let np = objs.iter().find(|o| o["kind"] == "NetworkPolicy").unwrap();
        assert!(
            np["spec"]["ingress"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["ports"][0]["port"] == 8444 && r["from"].is_array()),
            "{np}"
        );
        let pm = objs.iter().find(|o| o["kind"] == "PodMonitor").unwrap();
        let ep = &pm["spec"]["podMetricsEndpoints"][0];
        assert_eq!(ep["scheme"], "https");
        assert_eq!(
            ep["tlsConfig"]["ca"]["secret"]["name"],
            "bloodraven-component-ca"
        );
    }
}

#[test]
fn helm_lint_and_template_decode_and_bloodraven_manifests_renders_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in CASES {
        let values = values_file(dir.path(), name, text);
        let lint = run(Command::new(helm())
            .arg("lint")
            .arg(chart())
            .arg("-f")
            .arg(&values));
        let said = String::from_utf8_lossy(&lint.stdout);
        assert!(
            lint.status.success() && !said.contains("[ERROR]") && !said.contains("[WARNING]"),
            "helm lint ({name}): {said}{}",
            String::from_utf8_lossy(&lint.stderr)
        );
        let rendered = template(&values);
        for o in &rendered {
            decode(o);
        }
        let kinds: Vec<&str> = rendered.iter().filter_map(|o| o["kind"].as_str()).collect();
        for k in [
            "CustomResourceDefinition",
            "Deployment",
            "Service",
            "ServiceAccount",
            "Role",
        ] {
            assert!(kinds.contains(&k), "{name}: no {k}");
        }
        // The operator's configuration the chart writes loads as the operator loads it.
        let cm = rendered
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["data"]["operator.yaml"].is_string())
            .unwrap();
        let config = dir.path().join(format!("{name}-operator.yaml"));
        // The component TLS Secret, where the kubelet would mount it: a real certificate.
        let text = cm["data"]["operator.yaml"].as_str().unwrap().replace(
            bloodraven_kube::manifests::COMPONENT_TLS_DIR,
            &component_secret(dir.path()).display().to_string(),
        );
        std::fs::write(&config, text).unwrap();
        if let Err(e) = bloodraven_operator::config::load(&config) {
            panic!("{name}: the chart's operator configuration is refused: {e}");
        }
        let ours = manifests(&values);
        let (helm, ours) = (by_key(rendered), by_key(ours));
        assert_eq!(
            helm.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "{name}: the same objects"
        );
        for (k, h) in &helm {
            assert_eq!(
                h, &ours[k],
                "{name}: {k} differs between helm template and bloodraven manifests"
            );
        }
    }
}

/// Seed 01's pipelines call `https://bloodraven.bloodraven.svc:8443/deploy/v1/...`: the
/// `bloodraven` Service selects the leader and serves `:8082` always and `:8443` with the
/// deploy API; no other Service selects the leader. Checked on both renderings.
#[test]
fn the_bloodraven_service_serves_the_seeds_deploy_url() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in CASES {
        let values = values_file(dir.path(), name, text);
        let deploy_api = text.contains("deployAPI: {enabled: true}");
        for (how, objs) in [
            ("helm template", template(&values)),
            ("bloodraven manifests", manifests(&values)),
        ] {
            let services: Vec<&Value> = objs.iter().filter(|o| o["kind"] == "Service").collect();
            let leader: Vec<&&Value> = services
                .iter()
                .filter(|s| s["spec"]["selector"]["bloodraven.shipstream.io/leader"] == "true")
                .collect();
            assert_eq!(
                leader
                    .iter()
                    .map(|s| s["metadata"]["name"].as_str().unwrap())
                    .collect::<Vec<_>>(),
                ["bloodraven"],
                "{name}, {how}: one Service selects the leader"
            );
            let ports: Vec<(String, i64, String)> = leader[0]["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().to_string(),
                        p["port"].as_i64().unwrap(),
                        p["targetPort"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let mut want = vec![("http".to_string(), 8082, "http".to_string())];
            if deploy_api {
                want.push(("https".to_string(), 8443, "https".to_string()));
            }
            // The component listener, what the sidecars call (`--operator https://…:8444`).
            if text.contains("componentTLS") {
                want.push(("component".to_string(), 9444, "component".to_string()));
            }
            assert_eq!(ports, want, "{name}, {how}: the bloodraven Service's ports");
            // The container names those ports.
            let deployment = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
            let container_ports: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"]
                [0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            for (port, _, _) in &want {
                assert!(
                    container_ports.contains(&port.as_str()),
                    "{name}, {how}: the container has no port {port}"
                );
            }
        }
    }
}

#[test]
fn the_deploy_api_without_escrow_tls_is_refused_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    for (text, names) in [
        (
            "auxiliary: {deployAPI: {enabled: true}}\n",
            "auxiliary.deployAPI.enabled requires auxiliary.escrowTLS.enabled",
        ),
        (
            "auxiliary: {deployAPI: {enabled: true}, escrowTLS: {enabled: true}}\n",
            "auxiliary.escrowTLS.enabled requires auxiliary.escrowTLS.existingSecret",
        ),
    ] {
        let values = values_file(dir.path(), "bad", text);
        let out = run(Command::new(helm())
            .args(["template", "bloodraven"])
            .arg(chart())
            .arg("-f")
            .arg(&values));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(names), "helm: {err}");
        let out = run(Command::new(BIN).args(["manifests", "-f"]).arg(&values));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&names.replacen(" requires", ": requires", 1)),
            "manifests: {err}"
        );
        assert!(out.stdout.is_empty(), "nothing is printed");
    }
    // A value the schema does not know is refused by both.
    let values = values_file(dir.path(), "typo", "replicas: 3\n");
    let out = run(Command::new(helm())
        .args(["template", "bloodraven"])
        .arg(chart())
        .arg("-f")
        .arg(&values));
    assert!(!out.status.success());
    let out = run(Command::new(BIN).args(["manifests", "-f"]).arg(&values));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("replicas"));
}

/// The chart's rules, scope by scope, as (group, resource, verb) triples.
fn chart_rules(objs: &[Value]) -> BTreeMap<&'static str, Vec<(String, String, String)>> {
    let mut out: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for o in objs {
        let name = o["metadata"]["name"].as_str().unwrap_or("");
        let scope = match (o["kind"].as_str(), name) {
            (Some("Role"), n) if n.ends_with("-watched") => "watched",
            (Some("ClusterRole"), n) if n.ends_with("-watched") => "watched",
            (Some("Role"), _) => "operator",
            (Some("ClusterRole"), _) => "cluster",
            _ => continue,
        };
        for rule in o["rules"].as_array().unwrap() {
            for g in rule["apiGroups"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    for v in rule["verbs"].as_array().unwrap() {
                        out.entry(scope).or_default().push((
                            g.as_str().unwrap().into(),
                            r.as_str().unwrap().into(),
                            v.as_str().unwrap().into(),
                        ));
                    }
                }
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[test]
fn the_charts_rights_are_exactly_the_operators_rules() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in CASES {
        let deploy_api = text.contains("deployAPI: {enabled: true}");
        let rendered = template(&values_file(dir.path(), name, text));
        let got = chart_rules(&rendered);
        let mut want: BTreeMap<&str, Vec<(String, String, String)>> = BTreeMap::new();
        for r in RULES.iter().filter(|r| deploy_api || !r.deploy_api_only) {
            let scope = match r.scope {
                Scope::Watched => "watched",
                Scope::Operator => "operator",
                Scope::Cluster => "cluster",
            };
            for v in r.verbs {
                want.entry(scope).or_default().push((
                    r.api_group.into(),
                    r.resource.into(),
                    (*v).into(),
                ));
            }
        }
        for v in want.values_mut() {
            v.sort();
        }
        assert_eq!(got, want, "{name}");
        assert!(
            !serde_json::to_string(&rendered).unwrap().contains("\"*\""),
            "no wildcard"
        );
    }
}

#[test]
fn the_charts_crds_are_bloodraven_crds() {
    let shipped = std::fs::read_to_string(chart().join("crds/bloodraven-crds.yaml")).unwrap();
    assert_eq!(
        shipped,
        bloodraven_kube::crd::yaml().unwrap(),
        "charts/bloodraven/crds drifted: regenerate it with `bloodraven crds > charts/bloodraven/crds/bloodraven-crds.yaml`"
    );
}

#[test]
fn the_dashboard_uses_only_contract_metrics() {
    use bloodraven_core::contract::metrics as m;
    let text = std::fs::read_to_string(chart().join("files/bloodraven-dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let re = regex::Regex::new(r"bloodraven_[a-z_]+").unwrap();
    let known: Vec<&str> = bloodraven_core::contract::metrics::OPERATOR
        .iter()
        .chain(bloodraven_core::contract::metrics::SIDECAR)
        .copied()
        .collect();
    let mut used = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            for m in re.find_iter(t["expr"].as_str().unwrap()) {
                let name = m.as_str();
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|b| known.contains(b))
                    .unwrap_or(name);
                assert!(
                    known.contains(&base),
                    "the dashboard uses {name}, not a contract metric"
                );
                used.push(base.to_string());
            }
        }
    }
    // What the dashboard is for: active site, generation, site states, lag, failovers,
    // deferrals, leases, fences.
    for name in [
        m::ACTIVE_SITE,
        m::TOPOLOGY_GENERATION,
        m::SITE_STATE,
        m::REPLICATION_LAG_SECONDS,
        m::FAILOVERS_TOTAL,
        m::PLANNED_FAILOVERS_DEFERRED_TOTAL,
        m::DEPLOY_LEASES_ACTIVE,
        m::FENCES_TOTAL,
        m::SIDECAR_FENCES_TOTAL,
    ] {
        assert!(
            used.iter().any(|u| u == name),
            "the dashboard does not show {name}"
        );
    }
}

/// Restore-in-place's dumps: the claim is mounted read-only into the operator, only when named.
#[test]
fn the_restore_claim_is_mounted_read_only_only_when_named() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, mounted) in [("restore", CASES[3].1, true), ("defaults", "", false)] {
        let values = values_file(dir.path(), name, text);
        let objs = template(&values);
        let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let spec = &d["spec"]["template"]["spec"];
        let mount = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "restore")
            .cloned();
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "restore")
            .cloned();
        assert_eq!(mount.is_some(), mounted, "{name}");
        assert_eq!(volume.is_some(), mounted, "{name}");
        if let (Some(m), Some(v)) = (mount, volume) {
            assert_eq!(m["mountPath"], "/var/lib/bloodraven/restore");
            assert_eq!(m["readOnly"], true);
            assert_eq!(v["persistentVolumeClaim"]["claimName"], "mysql-dumps");
            assert_eq!(v["persistentVolumeClaim"]["readOnly"], true);
        }
    }
}

#[test]
fn the_snippets_users_paste_are_valid() {
    use k8s_openapi::api::core::v1::{Container, Pod};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes");
    let sidecar: Container = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("sidecar-container.yaml")).unwrap(),
    )
    .unwrap();
    // The sidecar-only binary the image installs (scripts/image, the Dockerfile).
    assert_eq!(
        sidecar.command.as_deref(),
        Some(&["/usr/local/bin/bloodraven-sidecar".to_string()][..])
    );
    let args = sidecar.args.unwrap();
    // Every flag is one `bloodraven-sidecar` knows, and the required ones are there.
    let help = String::from_utf8(
        run(Command::new(env!("CARGO_BIN_EXE_bloodraven-sidecar")).arg("--help")).stdout,
    )
    .unwrap();
    for a in &args {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "bloodraven-sidecar has no {flag}"
        );
    }
    for required in [
        "--site",
        "--group",
        "--operator",
        "--mysql-credentials-file",
        "--operator-public-key",
        "--peer",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
    ] {
        assert!(
            args.iter().any(|a| a.starts_with(&format!("{required}="))),
            "{required}"
        );
    }
    assert!(
        !args.iter().any(|a| a.contains("token")),
        "sidecars never carry a deploy token"
    );
    // Every party over mutual TLS; the probes speak TLS to the sidecar.
    for a in args
        .iter()
        .filter(|a| a.starts_with("--operator=") || a.starts_with("--peer="))
    {
        assert!(a.contains("=https://"), "{a}");
    }
    for probe in [&sidecar.readiness_probe, &sidecar.liveness_probe] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
    }
    // The Services that follow the roles select the label the operator sets, with a value
    // it sets.
    let services: Vec<k8s_openapi::api::core::v1::Service> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(dir.join("services.yaml")).unwrap())
            .unwrap();
    let mut roles: Vec<String> = services
        .iter()
        .map(|s| {
            let sel = s.spec.as_ref().unwrap().selector.as_ref().unwrap();
            assert!(sel.len() >= 2, "the role label and the Pods' own label");
            sel["bloodraven.shipstream.io/role"].clone()
        })
        .collect();
    roles.sort();
    assert_eq!(roles, ["primary", "replica"]);
    for r in &roles {
        assert!(bloodraven_core::routing::RoleLabel::parse(r).is_some());
    }
    // The site's StatefulSet is one the ordered update accepts: OnDelete, matchLabels only,
    // and its Pods are the ones the Services select.
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("site-statefulset.yaml")).unwrap(),
    )
    .unwrap();
    let sts_spec = sts.spec.unwrap();
    assert_eq!(
        sts_spec.update_strategy.unwrap().type_.as_deref(),
        Some("OnDelete")
    );
    assert!(sts_spec.selector.match_expressions.is_none());
    let pod_labels = sts_spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in sts_spec.selector.match_labels.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v), "the template carries {k}");
    }
    for s in &services {
        for (k, v) in s.spec.as_ref().unwrap().selector.as_ref().unwrap() {
            if k != "bloodraven.shipstream.io/role" {
                assert_eq!(
                    pod_labels.get(k),
                    Some(v),
                    "a Service selects the site's Pods"
                );
            }
        }
    }
    let pod: Pod =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("pipeline-pod.yaml")).unwrap())
            .unwrap();
    let spec = pod.spec.unwrap();
    let projected = spec
        .volumes
        .unwrap()
        .into_iter()
        .find_map(|v| v.projected)
        .unwrap();
    let token = projected.sources.unwrap()[0]
        .service_account_token
        .clone()
        .unwrap();
    assert_eq!(token.audience.as_deref(), Some("bloodraven-deploy"));
    let c = &spec.containers[0];
    let args = c.args.clone().unwrap();
    let help =
        String::from_utf8(run(Command::new(BIN).args(["deploy", "migrate", "--help"])).stdout)
            .unwrap();
    let cut = args.iter().position(|a| a == "--").unwrap();
    assert_eq!(&args[..2], ["deploy", "migrate"]);
    for a in &args[2..cut] {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "bloodraven deploy migrate has no {flag}"
        );
    }
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "bloodraven-token")
        .unwrap();
    assert!(args.contains(&format!("--token-file={}/{}", mount.mount_path, token.path)));
}

/// The chart's alert table is the one `bloodraven alerts` renders (regenerate it with
/// `BLOODRAVEN_WRITE_CHART=1 cargo test -p bloodraven --test chart alert_table`), and the
/// chart's tuning and refusals are the operator's: a tuned `PrometheusRule` renders as
/// `bloodraven manifests` renders it (in the test above), an unknown alert is refused by both.
#[test]
fn the_charts_alert_table_is_bloodravens_and_bad_tuning_is_refused_by_both() {
    let path = chart().join("files/bloodraven-alerts.json");
    let want = serde_json::to_string_pretty(&bloodraven_core::alerts::chart_data()).unwrap() + "\n";
    if std::env::var_os("BLOODRAVEN_WRITE_CHART").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not bloodraven_core::alerts::chart_data(); regenerate it with BLOODRAVEN_WRITE_CHART=1 cargo test -p bloodraven --test chart alert_table",
        path.display()
    );
    let dir = tempfile::tempdir().unwrap();
    for (name, text, says) in [
        (
            "unknown-alert",
            "prometheusRule: {enabled: true, alerts: {BloodravenNope: {for: 1m}}}\n",
            "prometheusRule.alerts.BloodravenNope: no such alert",
        ),
        (
            "no-threshold",
            "prometheusRule: {enabled: true, alerts: {BloodravenNoPrimary: {threshold: 2}}}\n",
            "prometheusRule.alerts.BloodravenNoPrimary.threshold: BloodravenNoPrimary has no threshold",
        ),
        (
            "pod-monitor-without-selector",
            "podMonitor: {enabled: true}\n",
            "podMonitor.enabled requires podMonitor.selector",
        ),
    ] {
        let values = values_file(dir.path(), name, text);
        let out = Command::new(helm())
            .arg("template")
            .arg("t")
            .arg(chart())
            .arg("-f")
            .arg(&values)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "helm ({name}): {err}"
        );
        let text = std::fs::read_to_string(&values).unwrap();
        let ours = bloodraven_kube::manifests::values(Some(&text))
            .map(|_| ())
            .unwrap_err()
            .to_string()
            .replacen(": requires", " requires", 1);
        assert!(ours.contains(says), "bloodraven manifests ({name}): {ours}");
    }
}
