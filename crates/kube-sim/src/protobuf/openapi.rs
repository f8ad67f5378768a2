//! OpenAPI v3 component schemas of built-in kinds, derived from the same field table as the wire
//! codec: every field with its JSON type, nested kinds as `$ref`s named as kube-apiserver names
//! its definitions (`io.k8s.api.apps.v1.DeploymentSpec`), so `kubectl explain` walks built-ins.

use serde_json::{Map, Value, json};

use super::json::special;
use super::schema::{Field, Label, Ty, schema};

/// `k8s.io.api.apps.v1.Deployment` -> `io.k8s.api.apps.v1.Deployment`.
pub fn definition_name(message: &str) -> String {
    let rest = message.strip_prefix("k8s.io.").unwrap_or(message);
    format!("io.k8s.{rest}")
        .replace("apiextensions_apiserver", "apiextensions-apiserver")
        .replace("kube_aggregator", "kube-aggregator")
}

fn special_schema(kind: &str) -> Value {
    match kind {
        "Time" | "MicroTime" => json!({"type": "string", "format": "date-time"}),
        "Duration" => json!({"type": "string"}),
        "IntOrString" => json!({"x-kubernetes-int-or-string": true, "format": "int-or-string"}),
        "Quantity" => json!({"x-kubernetes-int-or-string": true, "format": "quantity"}),
        "RawExtension" | "FieldsV1" => json!({"type": "object"}),
        _ => json!({"x-kubernetes-preserve-unknown-fields": true}),
    }
}

fn element_schema(ty: &Ty, pending: &mut Vec<String>) -> Value {
    match ty {
        Ty::String => json!({"type": "string"}),
        Ty::Bytes => json!({"type": "string", "format": "byte"}),
        Ty::Bool => json!({"type": "boolean"}),
        Ty::Int32 => json!({"type": "integer", "format": "int32"}),
        Ty::Int64 => json!({"type": "integer", "format": "int64"}),
        Ty::Double => json!({"type": "number", "format": "double"}),
        Ty::Message(m) => match special(m) {
            Some(kind) => special_schema(kind),
            None => {
                pending.push(m.clone());
                json!({"$ref": format!("#/components/schemas/{}", definition_name(m))})
            }
        },
    }
}

fn field_schema(field: &Field, pending: &mut Vec<String>) -> Value {
    let element = element_schema(&field.ty, pending);
    match field.label {
        Label::Optional if element.get("$ref").is_some() => json!({"allOf": [element]}),
        Label::Optional => element,
        Label::Repeated => json!({"type": "array", "items": element}),
        Label::Map => json!({"type": "object", "additionalProperties": element}),
    }
}

/// The component schemas of a kind and every message it reaches, keyed by definition name;
/// `None` for kinds without a message (custom resources).
pub fn components(api_version: &str, kind: &str) -> Option<(String, Map<String, Value>)> {
    let s = schema();
    let root = s.message_of(api_version, kind)?.to_string();
    let mut out = Map::new();
    let mut pending = vec![root.clone()];
    while let Some(name) = pending.pop() {
        let def = definition_name(&name);
        if out.contains_key(&def) {
            continue;
        }
        let Some(msg) = s.message(&name) else {
            continue;
        };
        let mut properties = Map::new();
        for f in &msg.fields {
            properties.insert(f.json.clone(), field_schema(f, &mut pending));
        }
        out.insert(def, json!({"type": "object", "properties": properties}));
    }
    Some((definition_name(&root), out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_reaches_its_pod_spec_with_upstream_definition_names() {
        let (root, defs) = components("apps/v1", "Deployment").expect("built-in");
        assert_eq!(root, "io.k8s.api.apps.v1.Deployment");
        assert_eq!(
            defs[&root]["properties"]["spec"],
            json!({"allOf": [{"$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"}]})
        );
        let pod_spec = &defs["io.k8s.api.core.v1.PodSpec"]["properties"];
        assert_eq!(pod_spec["hostNetwork"], json!({"type": "boolean"}));
        assert_eq!(pod_spec["containers"]["type"], "array");
        let strategy = &defs["io.k8s.api.apps.v1.RollingUpdateDeployment"]["properties"];
        assert_eq!(strategy["maxSurge"]["x-kubernetes-int-or-string"], true);
        assert!(defs.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        assert!(components("example.com/v1", "Widget").is_none());
    }
}
