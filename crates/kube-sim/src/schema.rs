//! Structural-schema handling of custom resources, as kube-apiserver's apiextensions does it:
//! pruning of unknown fields, defaulting, and validation against `openAPIV3Schema`.
//! Pure functions over `serde_json::Value`.

use crate::error::FieldError;
use serde_json::{Map, Value};

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

/// The schema of a property, looking into `allOf`/`anyOf`/`oneOf` branches as a structural schema allows.
fn property_schema<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema["properties"]
        .get(key)
        .or_else(|| match &schema["additionalProperties"] {
            Value::Object(_) => Some(&schema["additionalProperties"]),
            _ => None,
        })
}

/// Removes fields not declared in the schema; returns the pruned paths (for `fieldValidation`).
/// At the root, `apiVersion`, `kind` and `metadata` are always kept.
pub fn prune(schema: &Value, value: &mut Value) -> Vec<String> {
    let mut pruned = vec![];
    prune_at(schema, value, "", true, &mut pruned);
    pruned
}

fn prune_at(schema: &Value, value: &mut Value, path: &str, root: bool, pruned: &mut Vec<String>) {
    let embedded = schema["x-kubernetes-embedded-resource"].as_bool() == Some(true);
    match value {
        Value::Object(map) => {
            let keep_all =
                preserves_unknown(schema) || schema["additionalProperties"].as_bool() == Some(true);
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if (root || embedded) && matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                {
                    continue;
                }
                let p = child_path(path, &key);
                match property_schema(schema, &key) {
                    Some(sub) => {
                        if let Some(v) = map.get_mut(&key) {
                            prune_at(sub, v, &p, false, pruned);
                        }
                    }
                    None if keep_all => {}
                    None => {
                        map.remove(&key);
                        pruned.push(p);
                    }
                }
            }
        }
        Value::Array(items) if schema["items"].is_object() => {
            for (i, item) in items.iter_mut().enumerate() {
                prune_at(
                    &schema["items"],
                    item,
                    &format!("{path}[{i}]"),
                    false,
                    pruned,
                );
            }
        }
        _ => {}
    }
}

/// Applies `default:` values to missing properties (and to nulls of non-nullable ones,
/// which are dropped first), recursively.
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (key, sub) in props {
                    let nullable = sub["nullable"].as_bool() == Some(true);
                    if map.get(key).is_some_and(Value::is_null) && !nullable {
                        map.remove(key);
                    }
                    if !map.contains_key(key)
                        && let Some(d) = sub.get("default")
                    {
                        map.insert(key.clone(), d.clone());
                    }
                    if let Some(v) = map.get_mut(key) {
                        apply_defaults(sub, v);
                    }
                }
            }
            if let Value::Object(_) = &schema["additionalProperties"] {
                for v in map.values_mut() {
                    apply_defaults(&schema["additionalProperties"], v);
                }
            }
        }
        Value::Array(items) if schema["items"].is_object() => {
            for item in items {
                apply_defaults(&schema["items"], item);
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_ok(expected: &str, v: &Value) -> bool {
    match expected {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

fn go_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// Validates a value against a structural schema; `path` is the field path of `value`.
pub fn validate(schema: &Value, value: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = vec![];
    validate_at(schema, value, path, &mut errs);
    errs
}

fn validate_at(schema: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        if schema["nullable"].as_bool() == Some(true) || schema.get("type").is_none() {
            return;
        }
        let t = schema["type"].as_str().unwrap_or_default();
        errs.push(FieldError::type_invalid(
            path,
            "null",
            &format!("{path} in body must be of type {t}: \"null\""),
        ));
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if !(is_integer(v) || v.is_string()) {
            errs.push(FieldError::type_invalid(
                path,
                type_name(v),
                &format!(
                    "{path} in body must be of type integer,string: \"{}\"",
                    type_name(v)
                ),
            ));
            return;
        }
    } else if let Some(t) = schema["type"].as_str()
        && !type_ok(t, v)
    {
        errs.push(FieldError::type_invalid(
            path,
            type_name(v),
            &format!("{path} in body must be of type {t}: \"{}\"", type_name(v)),
        ));
        return;
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(v)
    {
        errs.push(FieldError::not_supported(path, v, options));
    }
    match v {
        Value::Number(n) => validate_number(schema, v, n.as_f64().unwrap_or_default(), path, errs),
        Value::String(s) => validate_string(schema, v, s, path, errs),
        Value::Array(items) => {
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                errs.push(FieldError::too_many(path, items.len(), max));
            }
            if let Some(min) = schema["minItems"].as_u64()
                && (items.len() as u64) < min
            {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body should have at least {min} items"),
                ));
            }
            if schema["uniqueItems"].as_bool() == Some(true)
                || schema["x-kubernetes-list-type"] == "set"
            {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        errs.push(FieldError {
                            reason: "FieldValueDuplicate",
                            field: format!("{path}[{i}]"),
                            message: format!("Duplicate value: {}", crate::error::go_value(item)),
                        });
                    }
                }
            }
            if schema["items"].is_object() {
                for (i, item) in items.iter().enumerate() {
                    validate_at(&schema["items"], item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(map) => validate_object(schema, v, map, path, errs),
        _ => {}
    }
    for branch in schema["allOf"].as_array().into_iter().flatten() {
        validate_at(branch, v, path, errs);
    }
    if let Some(branches) = schema["anyOf"].as_array()
        && !branches.iter().any(|b| validate(b, v, path).is_empty())
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body must match at least one schema in anyOf"),
        ));
    }
    if let Some(branches) = schema["oneOf"].as_array()
        && branches
            .iter()
            .filter(|b| validate(b, v, path).is_empty())
            .count()
            != 1
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body must match exactly one schema in oneOf"),
        ));
    }
    if schema["not"].is_object() && validate(&schema["not"], v, path).is_empty() {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should not match the schema in not"),
        ));
    }
}

fn validate_number(schema: &Value, v: &Value, n: f64, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(min) = schema["minimum"].as_f64() {
        if schema["exclusiveMinimum"].as_bool() == Some(true) {
            if n <= min {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body should be greater than {}", go_float(min)),
                ));
            }
        } else if n < min {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!(
                    "{path} in body should be greater than or equal to {}",
                    go_float(min)
                ),
            ));
        }
    }
    if let Some(max) = schema["maximum"].as_f64() {
        if schema["exclusiveMaximum"].as_bool() == Some(true) {
            if n >= max {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body should be less than {}", go_float(max)),
                ));
            }
        } else if n > max {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!(
                    "{path} in body should be less than or equal to {}",
                    go_float(max)
                ),
            ));
        }
    }
    if let Some(m) = schema["multipleOf"].as_f64()
        && m != 0.0
        && (n / m).fract() != 0.0
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should be a multiple of {}", go_float(m)),
        ));
    }
    match schema["format"].as_str() {
        Some("int32") if n < f64::from(i32::MIN) || n > f64::from(i32::MAX) => {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!("{path} in body must be of type int32: {}", go_float(n)),
            ));
        }
        _ => {}
    }
}

fn validate_string(schema: &Value, v: &Value, s: &str, path: &str, errs: &mut Vec<FieldError>) {
    let len = s.chars().count() as u64;
    if let Some(max) = schema["maxLength"].as_u64()
        && len > max
    {
        errs.push(FieldError::too_long(path, max));
    }
    if let Some(min) = schema["minLength"].as_u64()
        && len < min
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{path} in body should match '{pattern}'"),
                ));
            }
            _ => {}
        }
    }
    if let Some(format) = schema["format"].as_str()
        && !format_ok(format, s)
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!(
                "{path} in body must be of type {format}: {}",
                crate::error::go_value(v)
            ),
        ));
    }
}

fn validate_object(
    schema: &Value,
    v: &Value,
    map: &Map<String, Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    for req in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(req) {
            errs.push(FieldError::required(&child_path(path, req)));
        }
    }
    if let Some(max) = schema["maxProperties"].as_u64()
        && map.len() as u64 > max
    {
        errs.push(FieldError::too_many(path, map.len(), max));
    }
    if let Some(min) = schema["minProperties"].as_u64()
        && (map.len() as u64) < min
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should have at least {min} properties"),
        ));
    }
    let props = schema["properties"].as_object();
    for (key, child) in map {
        let p = child_path(path, key);
        if let Some(sub) = props.and_then(|p| p.get(key)) {
            validate_at(sub, child, &p, errs);
        } else if let Value::Object(_) = &schema["additionalProperties"] {
            validate_at(&schema["additionalProperties"], child, &p, errs);
        }
    }
}

/// The string formats Kubernetes validates (`k8s.io/kube-openapi/pkg/validation/strfmt`).
pub fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "date-time" | "datetime" => crate::util::parse_rfc3339(s).is_some(),
        "date" => crate::util::parse_rfc3339(&format!("{s}T00:00:00Z")).is_some() && s.len() == 10,
        "byte" => is_base64(s),
        "uuid" | "uuid3" | "uuid4" | "uuid5" => {
            let parts: Vec<&str> = s.split('-').collect();
            parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
                && parts
                    .iter()
                    .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 128)
        }),
        "hostname" => {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => s
            .split_once('@')
            .is_some_and(|(a, b)| !a.is_empty() && b.contains('.')),
        "duration" => is_go_duration(s),
        "mac" => {
            let parts: Vec<&str> = s.split([':', '-']).collect();
            parts.len() == 6
                && parts
                    .iter()
                    .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
        }
        _ => true,
    }
}

/// The `byte` format: standard base64 that decodes, as Go's `base64.StdEncoding` checks it.
fn is_base64(s: &str) -> bool {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).is_ok()
}

fn is_go_duration(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    if s == "0" {
        return true;
    }
    let re = regex::Regex::new(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|w))+$");
    re.is_ok_and(|re| re.is_match(s))
}

/// Structural checks of a CRD's own spec (names, versions) before it is accepted.
pub fn validate_crd(crd: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group"));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural"));
    }
    if spec["names"]["kind"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        errs.push(FieldError::required("spec.names.kind"));
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &Value::String(name.into()),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced") | Some("Cluster") => {}
        Some(_) => errs.push(FieldError::not_supported(
            "spec.scope",
            &spec["scope"],
            &[Value::from("Cluster"), Value::from("Namespaced")],
        )),
        None => errs.push(FieldError::required("spec.scope")),
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            &spec["versions"],
            "must have exactly one version marked as storage version",
        ));
    } else if versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count()
        != 1
    {
        errs.push(FieldError::invalid(
            "spec.versions",
            &Value::Array(vec![]),
            "must have exactly one version marked as storage version",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if v["schema"]["openAPIV3Schema"].is_null() {
            errs.push(FieldError::required(&format!(
                "spec.versions[{i}].schema.openAPIV3Schema"
            )));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget_schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "port": {"x-kubernetes-int-or-string": true},
                "when": {"type": "string", "format": "date-time"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {"type": "array", "maxItems": 2, "items": {"type": "object",
                    "properties": {"n": {"type": "integer", "default": 7}}}}
            }},
            "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
        }})
    }

    #[test]
    fn prunes_unknown_fields_but_keeps_preserved_ones() {
        let mut v = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1, "bogus": 1, "extra": {"anything": {"deep": true}},
                     "items": [{"n": 1, "junk": 2}], "tags": {"a": "b"}}, "top": 1});
        let pruned = prune(&widget_schema(), &mut v);
        assert_eq!(pruned, vec!["spec.bogus", "spec.items[0].junk", "top"]);
        assert_eq!(v["spec"]["extra"]["anything"]["deep"], true);
        assert_eq!(v["metadata"]["name"], "w");
    }

    #[test]
    fn defaults_missing_fields_and_list_items() {
        let mut v = json!({"spec": {"size": 2, "items": [{}], "color": null}});
        apply_defaults(&widget_schema(), &mut v);
        assert_eq!(v["spec"]["color"], "red");
        assert_eq!(v["spec"]["items"][0]["n"], 7);
        assert!(v.get("status").is_none());
    }

    #[test]
    fn reports_every_cause_like_kube_apiserver() {
        let v = json!({"spec": {"size": 0, "color": "pink", "name": "ABCDEFG", "port": true,
            "when": "yesterday", "items": [{}, {}, {}], "tags": {"a": 1}}});
        let errs = validate(&widget_schema(), &v, "");
        let rendered: Vec<String> = errs.iter().map(FieldError::render).collect();
        assert!(rendered.contains(&"spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1".to_string()), "{rendered:?}");
        assert!(
            rendered.contains(
                &"spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\""
                    .to_string()
            )
        );
        assert!(
            rendered.contains(&"spec.name: Too long: may not be more than 5 bytes".to_string())
        );
        assert!(
            rendered.contains(
                &"spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'"
                    .to_string()
            )
        );
        assert!(rendered.contains(&"spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"".to_string()));
        assert!(rendered.contains(&"spec.when: Invalid value: \"yesterday\": spec.when in body must be of type date-time: \"yesterday\"".to_string()));
        assert!(
            rendered.contains(&"spec.items: Too many: 3: must have at most 2 items".to_string())
        );
        assert!(rendered.contains(&"spec.tags.a: Invalid value: \"integer\": spec.tags.a in body must be of type string: \"integer\"".to_string()));
        let missing = validate(&widget_schema(), &json!({"spec": {}}), "");
        assert_eq!(missing, vec![FieldError::required("spec.size")]);
        assert!(
            validate(
                &widget_schema(),
                &json!({"spec": {"size": 3, "port": "http"}}),
                ""
            )
            .is_empty()
        );
    }

    #[test]
    fn formats() {
        assert!(format_ok("date-time", "2024-01-02T03:04:05Z"));
        assert!(!format_ok("date-time", "2024-01-02"));
        assert!(format_ok("date", "2024-01-02"));
        assert!(format_ok("byte", "aGVsbG8="));
        assert!(!format_ok("byte", "not base64!"));
        assert!(format_ok("duration", "1h30m"));
        assert!(format_ok("cidr", "10.0.0.0/8"));
        assert!(!format_ok("ipv4", "300.1.1.1"));
    }

    #[test]
    fn crd_names_must_agree() {
        let crd = json!({"metadata": {"name": "wrong"}, "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}});
        let errs = validate_crd(&crd);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.name");
    }
}
