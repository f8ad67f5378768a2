//! OpenAPI documents: enough for `kubectl apply` (server-side field validation is detected from the
//! v3 PATCH operations) and `kubectl explain` (CRD schemas as v3 components).

use crate::registry::{Registry, ResourceInfo};
use serde_json::{Map, Value, json};
use std::hash::{DefaultHasher, Hash, Hasher};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The component name kube-apiserver uses (`com.example.v1.Widget`).
pub fn definition_name(info: &ResourceInfo) -> String {
    if !info.custom {
        let g = if info.group.is_empty() {
            "core".to_string()
        } else {
            info.group.split('.').next().unwrap_or_default().to_string()
        };
        return format!("io.k8s.api.{g}.{}.{}", info.version, info.kind);
    }
    let reversed: Vec<&str> = info.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), info.version, info.kind)
}

fn gv_list(registry: &Registry) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    for r in registry.all() {
        let gv = (r.group.clone(), r.version.clone());
        if !out.contains(&gv) {
            out.push(gv);
        }
    }
    out
}

/// A content hash so clients re-fetch documents after CRD changes.
fn doc_hash(registry: &Registry, group: &str, version: &str) -> String {
    let mut h = DefaultHasher::new();
    for r in registry
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        r.plural.hash(&mut h);
        r.kind.hash(&mut h);
        r.schema.as_deref().map(Value::to_string).hash(&mut h);
    }
    format!("{:016X}", h.finish())
}

pub fn v3_index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, v) in gv_list(registry) {
        let p = gv_path(&g, &v);
        paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", doc_hash(registry, &g, &v))}));
    }
    json!({"paths": paths})
}

fn object_meta_schema() -> Value {
    json!({"description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
    "type": "object", "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
        "generateName": {"type": "string", "description": "GenerateName is an optional prefix, used by the server, to generate a unique name."},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Map of string keys and values that can be used to organize and categorize (scope and select) objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}, "description": "Annotations is an unstructured key value map stored with a resource."},
        "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "description": "Must be empty before the object is deleted from the registry."},
        "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "List of objects depended by this object."},
        "uid": {"type": "string"}, "resourceVersion": {"type": "string"}, "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time"}, "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
    }})
}

fn gvk(info: &ResourceInfo) -> Value {
    json!({"group": info.group, "version": info.version, "kind": info.kind})
}

fn kind_schema(info: &ResourceInfo) -> Value {
    let mut schema =
        info.schema.as_deref().cloned().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    if schema.get("description").is_none() {
        schema["description"] = json!(format!(
            "{} is the Schema for the {} API",
            info.kind, info.plural
        ));
    }
    if !schema["properties"].is_object() {
        schema["properties"] = json!({});
    }
    schema["properties"]["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    schema["properties"]["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    schema["properties"]["metadata"] = json!({"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "default": {}, "description": "Standard object's metadata."});
    schema["x-kubernetes-group-version-kind"] = json!([gvk(info)]);
    schema
}

fn operation(
    info: &ResourceInfo,
    action: &str,
    def: &str,
    params: &[&str],
    body_types: &[&str],
) -> Value {
    let mut op = json!({
        "operationId": format!("{action}{}", info.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(info),
        "parameters": params.iter().map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}})).collect::<Vec<_>>(),
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{def}")}}}}}
    });
    if !body_types.is_empty() {
        let content: Map<String, Value> = body_types
            .iter()
            .map(|t| {
                (
                    t.to_string(),
                    json!({"schema": {"$ref": format!("#/components/schemas/{def}")}}),
                )
            })
            .collect();
        op["requestBody"] = json!({"content": content, "required": true});
    }
    op
}

pub fn v3_document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    if !registry.has_group_version(group, version) {
        return None;
    }
    let mut schemas = Map::new();
    schemas.insert(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta".into(),
        object_meta_schema(),
    );
    schemas.insert("io.k8s.apimachinery.pkg.apis.meta.v1.Patch".into(), json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}));
    let mut paths = Map::new();
    let write = ["dryRun", "fieldManager", "fieldValidation"];
    for info in registry
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let def = definition_name(info);
        // Built-in kinds: their full schemas, from the protobuf field table.
        let builtin = (!info.custom)
            .then(|| crate::protobuf::openapi::components(&info.api_version(), &info.kind))
            .flatten();
        match builtin {
            Some((root, components)) => {
                for (name, mut schema) in components {
                    if name == root {
                        schema["x-kubernetes-group-version-kind"] = json!([gvk(info)]);
                    }
                    schemas.entry(name).or_insert(schema);
                }
                if root != def {
                    schemas.insert(
                        def.clone(),
                        json!({"allOf": [{"$ref": format!("#/components/schemas/{root}")}]}),
                    );
                }
            }
            None => {
                schemas.insert(def.clone(), kind_schema(info));
            }
        }
        let base = format!("/{}", gv_path(group, version));
        let collection = if info.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", info.plural)
        } else {
            format!("{base}/{}", info.plural)
        };
        paths.insert(collection.clone(), json!({
            "get": operation(info, "list", &def, &["labelSelector", "fieldSelector", "limit", "continue", "watch"], &[]),
            "post": operation(info, "post", &def, &write, &["*/*"]),
            "delete": operation(info, "deletecollection", &def, &["labelSelector"], &[]),
        }));
        let patch_types: &[&str] = &[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ];
        paths.insert(format!("{collection}/{{name}}"), json!({
            "get": operation(info, "get", &def, &[], &[]),
            "put": operation(info, "put", &def, &write, &["*/*"]),
            "patch": operation(info, "patch", &def, &["dryRun", "fieldManager", "fieldValidation", "force"], patch_types),
            "delete": operation(info, "delete", &def, &["dryRun", "gracePeriodSeconds", "propagationPolicy"], &[]),
        }));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

/// A minimal OpenAPI v2 document, as JSON or as the gnostic protobuf client-go asks for.
pub fn v2_document(protobuf: bool) -> (Vec<u8>, &'static str) {
    if protobuf {
        // openapi_v2.Document{swagger: "2.0", info: {title: "Kubernetes", version: "v1.33.0"}}
        let mut info = vec![0x0a, 10];
        info.extend_from_slice(b"Kubernetes");
        info.extend_from_slice(&[0x32, 7]);
        info.extend_from_slice(b"v1.33.0");
        let mut doc = vec![0x0a, 3];
        doc.extend_from_slice(b"2.0");
        doc.push(0x12);
        doc.push(info.len() as u8);
        doc.extend_from_slice(&info);
        return (
            doc,
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        );
    }
    let doc = json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": {}, "definitions": {}});
    (
        serde_json::to_vec(&doc).unwrap_or_default(),
        "application/json",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_with_widgets() -> Registry {
        let crd = json!({"spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "description": "Size."}}}}}}}]}});
        let mut reg = Registry::default();
        reg.rebuild([crd].iter());
        reg
    }

    #[test]
    fn v3_documents_carry_what_kubectl_apply_and_explain_look_for() {
        let reg = registry_with_widgets();
        let index = v3_index(&reg);
        let url = index["paths"]["apis/example.com/v1"]["serverRelativeURL"]
            .as_str()
            .expect("listed");
        assert!(url.starts_with("/openapi/v3/apis/example.com/v1?hash="));
        assert!(index["paths"]["api/v1"].is_object());

        let doc = v3_document(&reg, "example.com", "v1").expect("served group version");
        // kubectl's QueryParamVerifierV3: a PATCH for the GVK accepting fieldValidation.
        let patch =
            &doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "example.com", "version": "v1", "kind": "Widget"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .expect("params")
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        // No strategic merge for custom resources.
        assert!(
            patch["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_none()
        );
        // kubectl explain: the schema as a component tagged with its GVK.
        let schema = &doc["components"]["schemas"]["com.example.v1.Widget"];
        assert_eq!(
            schema["properties"]["spec"]["properties"]["size"]["description"],
            "Size."
        );
        assert_eq!(
            schema["x-kubernetes-group-version-kind"][0]["kind"],
            "Widget"
        );
        assert!(v3_document(&reg, "example.com", "v9").is_none());
    }

    #[test]
    fn v2_protobuf_is_a_minimal_gnostic_document() {
        let (bytes, content_type) = v2_document(true);
        assert!(content_type.contains("protobuf"));
        assert_eq!(&bytes[..5], b"\x0a\x032.0");
        let (json_bytes, _) = v2_document(false);
        let doc: Value = serde_json::from_slice(&json_bytes).expect("json");
        assert_eq!(doc["swagger"], "2.0");
    }
}
