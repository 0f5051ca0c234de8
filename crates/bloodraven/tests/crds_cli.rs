//! `bloodraven crds` prints both CRDs as a YAML stream that reads back as
//! `CustomResourceDefinitions`, with the CEL rules of `spec.sidecar`.

use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

const BIN: &str = env!("CARGO_BIN_EXE_bloodraven");

#[test]
fn crds_print_as_yaml_that_reads_back() {
    let out = Command::new(BIN).arg("crds").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = text
        .split("\n---")
        .map(str::trim)
        .filter(|d| !d.is_empty() && *d != "---")
        .map(|d| serde_saphyr::from_str(d.trim_start_matches("---")).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{text}");
    let crds: Vec<CustomResourceDefinition> = docs
        .into_iter()
        .map(|d| serde_json::from_value(d).unwrap())
        .collect();
    let names: Vec<&str> = crds.iter().map(|c| c.spec.names.kind.as_str()).collect();
    assert_eq!(names, ["MysqlFailoverGroup", "MysqlDatabase"]);
    let schema = serde_json::to_value(&crds[0].spec.versions[0].schema).unwrap();
    let rules = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["sidecar"]["x-kubernetes-validations"];
    assert!(rules.to_string().contains("3 * "), "{rules}");
}
