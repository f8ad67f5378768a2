//! Writing a response: JSON or protobuf as the client accepts, lists streamed from stored bytes,
//! Table and PartialObjectMetadata views, warnings, and what a DELETE answers.

use super::request::{Query, wants_partial, wants_table};
use super::table;
use crate::cluster::ListResult;
use crate::error::ApiError;
use crate::registry::ResourceInfo;
use axum::body::{Body, Bytes};
use axum::response::Response;
use http::{StatusCode, header};
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) fn json_response(code: u16, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes_response(code, Bytes::from(bytes), "application/json")
}

pub(super) fn bytes_response(code: u16, body: Bytes, content_type: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache, private"),
    );
    r
}

pub(super) fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

pub(super) fn list_meta(result: &ListResult) -> Value {
    let mut m = json!({"resourceVersion": result.resource_version.to_string()});
    if let Some(c) = &result.continue_token {
        m["continue"] = json!(c);
        if let Some(remaining) = result.remaining {
            m["remainingItemCount"] = json!(remaining);
        }
    }
    m
}

/// Serializes a list without cloning items into one big `Value`.
pub(super) fn list_bytes(info: &ResourceInfo, result: &ListResult, partial: bool) -> Bytes {
    let mut out = Vec::with_capacity(
        64 + result
            .items
            .iter()
            .map(|i| i.json().len() + 1)
            .sum::<usize>(),
    );
    let (kind, api_version) = if partial {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (info.list_kind.clone(), info.api_version())
    };
    out.extend_from_slice(
        format!(
            "{{\"kind\":{},\"apiVersion\":{},\"metadata\":",
            json!(kind),
            json!(api_version)
        )
        .as_bytes(),
    );
    out.extend_from_slice(list_meta(result).to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in result.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if partial {
            let _ = serde_json::to_writer(&mut out, &partial_object(&item.value()));
        } else {
            // Stored bytes, copied: a list is not re-serialized.
            out.extend_from_slice(item.json());
        }
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

pub(super) fn partial_object(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

pub(super) fn object_response(
    code: u16,
    info: &ResourceInfo,
    obj: &Value,
    accept: &str,
    query: &Query,
) -> Response {
    if wants_table(accept) {
        let include = query.get("includeObject").unwrap_or("Metadata");
        let t = table::to_table(
            info,
            &[Arc::new(obj.clone())],
            json!({"resourceVersion": obj["metadata"]["resourceVersion"]}),
            true,
            include,
        );
        return json_response(code, &t);
    }
    if wants_partial(accept) {
        return json_response(code, &partial_object(obj));
    }
    protobuf_or_json(code, obj, accept)
}

/// Whether `object_response` would answer with the object's own JSON (no Table, partial
/// metadata or protobuf asked for).
pub(super) fn is_plain_json(accept: &str) -> bool {
    !wants_table(accept) && !wants_partial(accept) && !crate::protobuf::wants_protobuf(accept)
}

/// Protobuf hook: answers in protobuf when the client asks for it first and the kind has a
/// message (built-in kinds), else in JSON (client-go's `*/*` fallback for custom resources).
pub(super) fn protobuf_or_json(code: u16, obj: &Value, accept: &str) -> Response {
    if crate::protobuf::wants_protobuf(accept)
        && let Ok(body) = crate::protobuf::encode(obj)
    {
        return bytes_response(code, Bytes::from(body), crate::protobuf::MEDIA_TYPE);
    }
    json_response(code, obj)
}
/// kube-apiserver's `Warning: 299 - "..."` headers, one per warning.
pub(super) fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

/// Kinds whose registry sets `ReturnDeletedObject` answer a completed DELETE with the object;
/// the others with a `Status` Success naming it.
pub(super) fn returns_deleted_object(info: &ResourceInfo) -> bool {
    info.custom
        || matches!(
            (info.group.as_str(), info.plural.as_str()),
            (
                "",
                "pods"
                    | "services"
                    | "namespaces"
                    | "nodes"
                    | "replicationcontrollers"
                    | "persistentvolumes"
                    | "persistentvolumeclaims"
            ) | (
                "apps" | "batch" | "policy" | "networking.k8s.io" | "autoscaling",
                _
            ) | ("apiextensions.k8s.io", _)
                | ("storage.k8s.io", _)
        )
}

pub(super) fn deleted_status(info: &ResourceInfo, obj: &Value) -> Value {
    let mut details = serde_json::Map::new();
    details.insert("name".into(), obj["metadata"]["name"].clone());
    if !info.group.is_empty() {
        details.insert("group".into(), json!(info.group));
    }
    details.insert("kind".into(), json!(info.plural));
    details.insert("uid".into(), obj["metadata"]["uid"].clone());
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

pub(super) fn scale_of(obj: &Value) -> Value {
    let m = &obj["metadata"];
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                     "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector}
    })
}
