//! The custom resources `MysqlFailoverGroup` (`mfg`) and `MysqlDatabase` (`mydb`) in
//! `bloodraven.shipstream.io/v1alpha1`, and their CRDs.
//!
//! The schemas are generated from the domain types (`FailoverGroupSpec`, `GroupStatus`,
//! `DatabaseSpec`) with kube's structural-schema settings; the bounds, defaults and CEL rules
//! come from `bloodraven_core::schema`, next to the checks they restate. One pass here then
//! bounds whatever is left unbounded (a string gets `maxLength` [`STRING_BOUND`], a list
//! `maxItems` [`LIST_BOUND`]), so that a real API server's CEL cost estimate accepts the CRDs.
//!
//! The CRDs are assembled by hand (no `kube-derive`): what they say is all in this file.

use std::borrow::Cow;

use bloodraven_core::config::FailoverGroupSpec;
use bloodraven_core::resources::{API_VERSION, DatabaseSpec, KIND_DATABASE, KIND_GROUP};
use bloodraven_core::status::GroupStatus;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;
use kube_core::dynamic::ApiResource;
use kube_core::{NamespaceResourceScope, ObjectMeta, Resource};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, transform};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The API group.
pub const GROUP: &str = "bloodraven.shipstream.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `maxLength` of a string the domain types leave unbounded (status messages, reasons).
pub const STRING_BOUND: u64 = 32_768;
/// `maxItems` of a list the domain types leave unbounded (status conditions).
pub const LIST_BOUND: u64 = 64;

/// A `MysqlFailoverGroup`: the spec the operator acts on and the status it reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MysqlFailoverGroup {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: FailoverGroupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GroupStatus>,
}

/// A `MysqlDatabase`: which group a schema lives in and who may coordinate its deployments.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MysqlDatabase {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: DatabaseSpec,
}

impl MysqlFailoverGroup {
    pub fn new(namespace: &str, name: &str, spec: FailoverGroupSpec) -> Self {
        MysqlFailoverGroup {
            api_version: API_VERSION.into(),
            kind: KIND_GROUP.into(),
            metadata: meta(namespace, name),
            spec,
            status: None,
        }
    }
}

impl MysqlDatabase {
    pub fn new(namespace: &str, name: &str, spec: DatabaseSpec) -> Self {
        MysqlDatabase {
            api_version: API_VERSION.into(),
            kind: KIND_DATABASE.into(),
            metadata: meta(namespace, name),
            spec,
        }
    }
}

fn meta(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..ObjectMeta::default()
    }
}

/// What differs between the two resources' CRDs.
struct Names {
    kind: &'static str,
    plural: &'static str,
    short: &'static str,
}

const GROUP_NAMES: Names = Names {
    kind: KIND_GROUP,
    plural: "mysqlfailovergroups",
    short: "mfg",
};
const DATABASE_NAMES: Names = Names {
    kind: KIND_DATABASE,
    plural: "mysqldatabases",
    short: "mydb",
};

macro_rules! resource {
    ($ty:ty, $names:expr) => {
        impl Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind((): &()) -> Cow<'_, str> {
                $names.kind.into()
            }
            fn group((): &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version((): &()) -> Cow<'_, str> {
                VERSION.into()
            }
            fn plural((): &()) -> Cow<'_, str> {
                $names.plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource!(MysqlFailoverGroup, GROUP_NAMES);
resource!(MysqlDatabase, DATABASE_NAMES);

impl CustomResourceExt for MysqlFailoverGroup {
    fn crd() -> CustomResourceDefinition {
        let columns = json!([
            {"name": "Active", "type": "string", "jsonPath": ".status.activeSite",
             "description": "The site that accepts writes"},
            {"name": "Generation", "type": "integer", "jsonPath": ".status.topologyGeneration",
             "description": "topologyGeneration: bumped on every change of active site"},
            {"name": "Ready", "type": "string",
             "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]);
        let root = object(
            &["spec"],
            &json!({
                "spec": schema_for::<FailoverGroupSpec>(),
                "status": schema_for::<GroupStatus>(),
            }),
        );
        build(&GROUP_NAMES, root, &columns, true)
    }

    fn crd_name() -> &'static str {
        "mysqlfailovergroups.bloodraven.shipstream.io"
    }

    fn api_resource() -> ApiResource {
        ApiResource::erase::<Self>(&())
    }

    fn shortnames() -> &'static [&'static str] {
        &["mfg"]
    }
}

impl CustomResourceExt for MysqlDatabase {
    fn crd() -> CustomResourceDefinition {
        let columns = json!([
            {"name": "Group", "type": "string", "jsonPath": ".spec.failoverGroupRef.name",
             "description": "The MysqlFailoverGroup the schema lives in"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]);
        let root = object(&["spec"], &json!({ "spec": schema_for::<DatabaseSpec>() }));
        build(&DATABASE_NAMES, root, &columns, false)
    }

    fn crd_name() -> &'static str {
        "mysqldatabases.bloodraven.shipstream.io"
    }

    fn api_resource() -> ApiResource {
        ApiResource::erase::<Self>(&())
    }

    fn shortnames() -> &'static [&'static str] {
        &["mydb"]
    }
}

/// Both CRDs, groups first.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![MysqlFailoverGroup::crd(), MysqlDatabase::crd()]
}

/// Both CRDs as one YAML stream (`bloodraven crds`), ready for `kubectl apply -f -`.
pub fn yaml() -> Result<String, serde_saphyr::ser::Error> {
    let docs: Vec<Value> = all()
        .iter()
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    serde_saphyr::to_string_multiple(&docs)
}

/// The schema of `T` with kube's structural-schema settings, every subschema inlined.
fn schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(transform::AddNullable::default())
        .with_transform(kube_core::schema::StructuralSchemaRewriter)
        .with_transform(kube_core::schema::OptionalEnum)
        .with_transform(kube_core::schema::OptionalIntOrString)
        .into_generator();
    let mut v = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(o) = &mut v {
        o.remove("title");
    }
    v
}

fn object(required: &[&str], properties: &Value) -> Value {
    json!({ "type": "object", "required": required, "properties": properties })
}

/// Adds the catch-all bounds to every string and list that has none.
fn bound(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    match o.get("type").and_then(Value::as_str) {
        Some("string") if !o.contains_key("maxLength") && !o.contains_key("enum") => {
            o.insert("maxLength".into(), json!(STRING_BOUND));
        }
        Some("array") if !o.contains_key("maxItems") => {
            o.insert("maxItems".into(), json!(LIST_BOUND));
        }
        _ => {}
    }
    for key in ["properties", "items", "additionalProperties"] {
        match o.get_mut(key) {
            Some(Value::Object(children)) if key == "properties" => {
                children.values_mut().for_each(bound);
            }
            Some(child @ Value::Object(_)) => bound(child),
            _ => {}
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = o.get_mut(key) {
            list.iter_mut().for_each(bound);
        }
    }
}

fn build(
    names: &Names,
    mut root: Value,
    columns: &Value,
    status: bool,
) -> CustomResourceDefinition {
    bound(&mut root);
    let mut version = json!({
        "name": VERSION,
        "served": true,
        "storage": true,
        "schema": { "openAPIV3Schema": root },
        "additionalPrinterColumns": columns,
    });
    if status {
        version["subresources"] = json!({ "status": {} });
    }
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{GROUP}", names.plural),
            "labels": { "app.kubernetes.io/part-of": "bloodraven" },
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": names.kind,
                "listKind": format!("{}List", names.kind),
                "plural": names.plural,
                "singular": names.kind.to_ascii_lowercase(),
                "shortNames": [names.short],
                "categories": ["bloodraven"],
            },
            "scope": "Namespaced",
            "versions": [version],
        },
    });
    // The value is built above from literals and schemars output; a mismatch with the
    // k8s-openapi type is a bug this crate's tests catch, never user input.
    serde_json::from_value(crd).unwrap_or_default()
}
