//! The CRDs: names, subresources, printer columns, bounds on every string and list, and the CEL
//! rules evaluated client-side by kube's CEL validator — each case also judged by the
//! operator's own validation, which must agree.

use bloodraven_core::config::{
    FailoverGroupSpec, SidecarSpec, SiteRole, SiteSpec, SplitBrainPolicy, validate_group,
};
use bloodraven_kube::crd::{self, MysqlDatabase, MysqlFailoverGroup};
use kube::core::CustomResourceExt;
use kube::core::cel::{ScopeContext, WarningKind, analyze_rule, compile_schema};
use serde_json::{Value, json};

/// A site as a manifest writes it: its server and sidecar behind the namespace's Services,
/// credentials from one Secret.
fn site(name: &str, role: SiteRole) -> SiteSpec {
    serde_json::from_value(json!({
        "name": name,
        "role": role,
        "mysql": {
            "host": format!("mysql-{name}.db.svc"),
            "port": 3306,
            "credentials": {"secretName": "mysql-control"},
        },
        "sidecar": {"url": format!("http://mysql-{name}.db.svc:8080")},
    }))
    .expect("a valid site")
}

/// Two primary candidates and a reader.
fn spec() -> FailoverGroupSpec {
    let sites = [
        ("iad", SiteRole::PrimaryCandidate),
        ("pdx", SiteRole::PrimaryCandidate),
        ("reader", SiteRole::ReadOnly),
    ];
    FailoverGroupSpec {
        sites: sites.iter().map(|&(n, r)| site(n, r)).collect(),
        ..FailoverGroupSpec::default()
    }
}

fn openapi(
    c: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let v = serde_json::to_value(c).unwrap();
    v["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every node of a schema, with its path.
fn nodes(schema: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    out.push((path.to_string(), schema.clone()));
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (k, v) in props {
            nodes(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        nodes(items, &format!("{path}[]"), out);
    }
}

#[test]
fn crds_are_named_have_their_subresources_and_columns() {
    let g = MysqlFailoverGroup::crd();
    assert_eq!(
        g.metadata.name.as_deref(),
        Some("mysqlfailovergroups.bloodraven.shipstream.io")
    );
    assert_eq!(g.spec.names.short_names, Some(vec!["mfg".to_string()]));
    let v = &g.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Active", "Generation", "Ready", "Age"]);
    let d = MysqlDatabase::crd();
    assert_eq!(d.spec.names.short_names, Some(vec!["mydb".to_string()]));
    assert_eq!(d.spec.names.kind, "MysqlDatabase");
    assert_eq!(crd::all().len(), 2);
}

#[test]
fn every_string_and_list_is_bounded() {
    for c in crd::all() {
        let mut all = Vec::new();
        nodes(&openapi(&c), "", &mut all);
        for (path, n) in &all {
            match n.get("type").and_then(Value::as_str) {
                Some("string") => assert!(
                    n.get("maxLength").is_some() || n.get("enum").is_some(),
                    "{}{path} has no maxLength",
                    c.spec.names.kind
                ),
                Some("array") => assert!(
                    n.get("maxItems").is_some(),
                    "{}{path} has no maxItems",
                    c.spec.names.kind
                ),
                _ => {}
            }
        }
    }
    // The bounds the domain sets itself, not the catch-all ones.
    let g = openapi(&MysqlFailoverGroup::crd());
    assert_eq!(
        g["properties"]["spec"]["properties"]["sites"]["maxItems"],
        16
    );
    assert_eq!(
        g["properties"]["spec"]["properties"]["sites"]["x-kubernetes-list-map-keys"],
        json!(["name"])
    );
    let site = &g["properties"]["spec"]["properties"]["sites"]["items"]["properties"];
    assert_eq!(site["name"]["maxLength"], 63);
    assert_eq!(site["mysql"]["properties"]["port"]["maximum"], 65535.0);
}

#[test]
fn every_rule_compiles_and_fits_the_cost_budget() {
    let mut rules = 0;
    for c in crd::all() {
        let mut all = Vec::new();
        nodes(&openapi(&c), "", &mut all);
        for (path, n) in &all {
            let Some(Value::Array(list)) = n.get("x-kubernetes-validations") else {
                continue;
            };
            let compiled = compile_schema(n);
            assert!(
                !compiled.has_errors(),
                "{path}: {:?}",
                compiled.compilation_errors()
            );
            for r in list {
                rules += 1;
                let rule = r["rule"].as_str().unwrap();
                let warnings = analyze_rule(rule, &compiled, ScopeContext::CrdValidation);
                assert!(
                    !warnings.iter().any(|w| w.kind == WarningKind::CostExceeded),
                    "{path}: {rule}: {warnings:?}"
                );
            }
        }
    }
    assert!(rules >= 12, "only {rules} rules found");
}

/// The CEL verdict on `spec` (field paths of the failures) and the operator's.
fn verdicts(spec: &FailoverGroupSpec) -> (Vec<String>, Vec<String>) {
    let obj = MysqlFailoverGroup::new("db", "orders", spec.clone());
    let cel = match kube::core::cel::validate_cel(&obj) {
        Ok(()) => Vec::new(),
        Err(errs) => errs.iter().map(|e| e.field_path.clone()).collect(),
    };
    let core = match validate_group("orders", "db", spec) {
        Ok(_) => Vec::new(),
        Err(errs) => errs.0.iter().map(|e| e.field.clone()).collect(),
    };
    (cel, core)
}

fn sidecar(lease: Option<&str>, interval: Option<&str>) -> FailoverGroupSpec {
    FailoverGroupSpec {
        sidecar: Some(SidecarSpec {
            lease_timeout: lease.map(Into::into),
            peer_check_interval: interval.map(Into::into),
        }),
        ..spec()
    }
}

#[test]
fn the_seeds_sidecar_rules_on_effective_values() {
    // (leaseTimeout, peerCheckInterval, the field the rule names, or None when valid)
    let cases = [
        (None, None, None),
        (Some("30s"), Some("10s"), None),
        (Some("3s"), Some("1s"), None),
        // The seed: "a 10 s interval alone is rejected" (20s < 3 × 10s).
        (None, Some("10s"), Some("leaseTimeout")),
        (Some("2s"), None, Some("leaseTimeout")),
        (Some("20s"), Some("500ms"), Some("peerCheckInterval")),
        (Some("60s"), Some("21s"), Some("leaseTimeout")),
        (Some("20500ms"), None, Some("leaseTimeout")),
        (Some("1m"), Some("20s"), None),
    ];
    for (lease, interval, field) in cases {
        let (cel, core) = verdicts(&sidecar(lease, interval));
        let case = format!("leaseTimeout {lease:?}, peerCheckInterval {interval:?}");
        match field {
            None => {
                assert!(cel.is_empty(), "{case}: CEL refused: {cel:?}");
                assert!(core.is_empty(), "{case}: the operator refused: {core:?}");
            }
            Some(f) => {
                assert!(
                    cel.iter().any(|p| p.ends_with(&format!("sidecar.{f}"))),
                    "{case}: CEL should name {f}: {cel:?}"
                );
                assert!(
                    core.iter().any(|p| p == &format!("spec.sidecar.{f}")),
                    "{case}: the operator should name {f}: {core:?}"
                );
            }
        }
    }
}

#[test]
fn the_groups_other_rules_agree_with_the_operator() {
    let mut both = spec();
    both.sites[0].mysql.credentials.file = Some("/etc/bloodraven/iad".into());
    let mut neither = spec();
    neither.sites[1].mysql.credentials.secret_name = None;
    let mut readers = spec();
    for s in &mut readers.sites {
        s.role = SiteRole::ReadOnly;
    }
    let mut unknown_bootstrap = spec();
    unknown_bootstrap.bootstrap_site = Some("sfo".into());
    let mut reader_bootstrap = spec();
    reader_bootstrap.bootstrap_site = Some("reader".into());
    let mut good_bootstrap = spec();
    good_bootstrap.bootstrap_site = Some("pdx".into());
    let mut unknown_priority = spec();
    unknown_priority.split_brain_policy = Some(SplitBrainPolicy {
        site_priorities: vec!["pdx".into(), "sfo".into()],
    });
    // (case, spec, the field both must name, or None when valid)
    let cases = [
        ("both credential sources", both, Some("credentials")),
        ("no credential source", neither, Some("credentials")),
        ("no primary candidate", readers, Some("sites")),
        (
            "unknown bootstrapSite",
            unknown_bootstrap,
            Some("bootstrapSite"),
        ),
        (
            "a reader as bootstrapSite",
            reader_bootstrap,
            Some("bootstrapSite"),
        ),
        ("a candidate as bootstrapSite", good_bootstrap, None),
        (
            "unknown site in sitePriorities",
            unknown_priority,
            Some("sitePriorities"),
        ),
    ];
    for (case, s, field) in cases {
        let (cel, core) = verdicts(&s);
        match field {
            None => assert!(
                cel.is_empty() && core.is_empty(),
                "{case}: {cel:?} / {core:?}"
            ),
            Some(f) => {
                assert!(cel.iter().any(|p| p.contains(f)), "{case}: CEL: {cel:?}");
                assert!(
                    core.iter().any(|p| p.contains(f)),
                    "{case}: operator: {core:?}"
                );
            }
        }
    }
}

#[test]
fn the_crds_print_as_one_yaml_stream() {
    let text = crd::yaml().unwrap();
    assert_eq!(text.matches("kind: CustomResourceDefinition").count(), 2);
    assert!(text.contains("name: mysqlfailovergroups.bloodraven.shipstream.io"));
    assert!(text.contains("x-kubernetes-validations"));
}
