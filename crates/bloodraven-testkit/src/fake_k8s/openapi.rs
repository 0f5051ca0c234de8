//! What a Kubernetes API server does to a custom resource before it stores it, in its order:
//! prune the fields the structural schema does not know, apply the schema's defaults, check
//! the `OpenAPI` keywords, then evaluate the `x-kubernetes-validations` (CEL, through kube's
//! client-side evaluator). Failures come back as the API server's causes: a field path and a
//! message.
//!
//! Keywords checked: `type` (with `nullable`), `required`, `properties`, `items`, `enum`,
//! `pattern`, `minLength`/`maxLength`, `minimum`/`maximum`, `minItems`/`maxItems`,
//! `x-kubernetes-list-type` (`set` and `map` uniqueness), `x-kubernetes-preserve-unknown-fields`.
//! Not modelled: `format` checks, `oneOf`/`anyOf`/`not`, `x-kubernetes-int-or-string`,
//! `additionalProperties` maps with schemas (kept as given), CEL transition rules (`oldSelf`),
//! and the CEL cost budget (checked separately by the CRD tests).

use serde_json::{Map, Value};

/// One refusal: where, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub field: String,
    pub message: String,
}

/// Prunes, defaults and validates `object` (a whole custom resource) against the CRD's
/// `openAPIV3Schema`. Returns the object as it would be stored, or the causes.
pub fn admit(schema: &Value, object: &Value) -> Result<Value, Vec<Cause>> {
    let mut pruned = object.clone();
    prune(schema, &mut pruned, true);
    let defaulted = kube::core::cel::apply_defaults(schema, &pruned);
    let mut causes = Vec::new();
    check(schema, &defaulted, "", &mut causes);
    if causes.is_empty()
        && let Err(errs) = kube::core::cel::Validator::new().validate(schema, &defaulted, None)
    {
        for e in &errs {
            causes.push(Cause {
                field: e.field_path.clone(),
                message: e.message.clone(),
            });
        }
    }
    if causes.is_empty() {
        Ok(defaulted)
    } else {
        Err(causes)
    }
}

/// Drops the fields the schema does not declare. At the root, `apiVersion`, `kind` and
/// `metadata` are the API server's own and always kept.
fn prune(schema: &Value, v: &mut Value, root: bool) {
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    match v {
        Value::Object(map) => {
            let Some(Value::Object(props)) = schema.get("properties") else {
                return;
            };
            map.retain(|k, _| {
                props.contains_key(k)
                    || (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            });
            for (k, child) in map.iter_mut() {
                if let Some(s) = props.get(k) {
                    prune(s, child, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for item in items {
                    prune(s, item, false);
                }
            }
        }
        _ => {}
    }
}

fn push(causes: &mut Vec<Cause>, path: &str, message: String) {
    causes.push(Cause {
        field: if path.is_empty() {
            ".".into()
        } else {
            path.trim_start_matches('.').into()
        },
        message,
    });
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => true,
    }
}

fn check(schema: &Value, v: &Value, path: &str, causes: &mut Vec<Cause>) {
    if v.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) && !path.is_empty() {
            push(causes, path, "Invalid value: null: must not be null".into());
        }
        return;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str)
        && !type_matches(t, v)
    {
        push(
            causes,
            path,
            format!("Invalid value: {v}: must be of type {t}"),
        );
        return;
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        push(
            causes,
            path,
            format!(
                "Unsupported value: {v}: supported values: {}",
                list.join(", ")
            ),
        );
    }
    match v {
        Value::String(s) => check_string(schema, s, path, causes),
        Value::Number(n) => check_number(schema, n.as_f64().unwrap_or(0.0), path, causes),
        Value::Array(items) => check_array(schema, items, path, causes),
        Value::Object(map) => check_object(schema, map, path, causes),
        _ => {}
    }
}

fn check_string(schema: &Value, s: &str, path: &str, causes: &mut Vec<Cause>) {
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        push(
            causes,
            path,
            format!("Too long: may not be more than {max} bytes"),
        );
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        push(
            causes,
            path,
            format!("Invalid value: {s:?}: should be at least {min} chars long"),
        );
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(p) {
            Ok(re) if !re.is_match(s) => push(
                causes,
                path,
                format!("Invalid value: {s:?}: should match '{p}'"),
            ),
            Ok(_) => {}
            Err(e) => push(
                causes,
                path,
                format!("the schema's pattern does not compile: {e}"),
            ),
        }
    }
}

fn check_number(schema: &Value, n: f64, path: &str, causes: &mut Vec<Cause>) {
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && n > max
    {
        push(
            causes,
            path,
            format!("Invalid value: {n}: should be less than or equal to {max}"),
        );
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && n < min
    {
        push(
            causes,
            path,
            format!("Invalid value: {n}: should be greater than or equal to {min}"),
        );
    }
}

fn check_array(schema: &Value, items: &[Value], path: &str, causes: &mut Vec<Cause>) {
    let n = items.len() as u64;
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && n > max
    {
        push(
            causes,
            path,
            format!("Too many: {n}: must have at most {max} items"),
        );
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && n < min
    {
        push(
            causes,
            path,
            format!("Invalid value: {n}: should have at least {min} items"),
        );
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            for (i, item) in items.iter().enumerate() {
                if items[..i].contains(item) {
                    push(
                        causes,
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: {item}"),
                    );
                }
            }
        }
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let key_of = |item: &Value| -> Vec<Value> {
                keys.iter()
                    .map(|k| item.get(*k).cloned().unwrap_or(Value::Null))
                    .collect()
            };
            for (i, item) in items.iter().enumerate() {
                let k = key_of(item);
                if items[..i].iter().any(|o| key_of(o) == k) {
                    let shown: Vec<String> = k.iter().map(Value::to_string).collect();
                    push(
                        causes,
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: map[{}]", shown.join(" ")),
                    );
                }
            }
        }
        _ => {}
    }
    if let Some(s) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(s, item, &format!("{path}[{i}]"), causes);
        }
    }
}

fn check_object(schema: &Value, map: &Map<String, Value>, path: &str, causes: &mut Vec<Cause>) {
    if let Some(Value::Array(required)) = schema.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                push(causes, &format!("{path}.{r}"), "Required value".into());
            }
        }
    }
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (k, child) in map {
            if let Some(s) = props.get(k) {
                check(s, child, &format!("{path}.{k}"), causes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_defaults_and_names_the_field() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
                        "n": {"type": "integer", "minimum": 1, "default": 2},
                        "tags": {"type": "array", "x-kubernetes-list-type": "set",
                                 "items": {"type": "string"}}
                    },
                    "x-kubernetes-validations": [{"rule": "self.n < 10", "message": "n too big"}]
                }
            }
        });
        let ok = admit(
            &schema,
            &json!({"kind": "X", "spec": {"name": "ab", "junk": 1}}),
        )
        .unwrap();
        assert_eq!(ok["spec"], json!({"name": "ab", "n": 2}));
        assert_eq!(ok["kind"], "X");
        let bad = admit(
            &schema,
            &json!({"spec": {"name": "ABCD", "tags": ["a", "a"]}}),
        )
        .unwrap_err();
        let fields: Vec<&str> = bad.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"spec.name"), "{bad:?}");
        assert!(fields.contains(&"spec.tags[1]"), "{bad:?}");
        let cel = admit(&schema, &json!({"spec": {"name": "ab", "n": 12}})).unwrap_err();
        assert!(
            cel.iter().any(|c| c.message.contains("n too big")),
            "{cel:?}"
        );
        let missing = admit(&schema, &json!({"spec": {}})).unwrap_err();
        assert_eq!(missing[0].field, "spec.name");
    }
}
