//! The HTTP face of the server: one request pipeline (parse, route, execute under the cluster lock,
//! encode), so that accounting and fault injection can hook in at a single place.

mod discovery;
mod exec;
mod openapi;
mod portforward;
mod spdy;
pub mod stream;
pub mod table;
mod watch;

use crate::cluster::{
    DeleteOptions, ListOptions, ListResult, PatchType, PreparedCreate, Sub, WriteOptions,
    field_supported,
};
use crate::error::ApiError;
use crate::registry::ResourceInfo;
use crate::request_info::RequestInfo;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::shared::Shared;
use crate::validation::{Decoded, decode_json};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const MAX_BODY: usize = 3 * 1024 * 1024;

fn json_response(code: u16, body: &Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes_response(code, Bytes::from(bytes), "application/json")
}

fn bytes_response(code: u16, body: Bytes, content_type: &str) -> Response {
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

fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status())
}

/// Query parameters (last value wins, as Go's `url.Values.Get` returns the first; clients send one).
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(q: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }
    /// Every value of a repeated parameter (exec's `command`).
    pub(crate) fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(a, _)| a == k)
            .map(|(_, v)| v.clone())
            .collect()
    }
    pub(crate) fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }
}

/// What the handlers need of a parsed request (`RequestInfo`), with the namespace as the
/// object's key sees it: a Namespace, cluster-scoped, has none of its own.
#[derive(Debug)]
struct Target {
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch: bool,
}

impl Target {
    fn of(ri: &RequestInfo) -> Self {
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let namespace_itself = ri.resource == "namespaces" && ri.api_group.is_empty();
        Self {
            namespace: if namespace_itself {
                None
            } else {
                non_empty(&ri.namespace)
            },
            name: non_empty(&ri.name),
            sub: non_empty(&ri.subresource),
            watch: ri.verb == "watch",
        }
    }
}

fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

fn wants_partial(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

/// The API pipeline every request but a pod stream's goes through, `ri` being what the request
/// asks for (parsed once, by the testbed in front).
pub async fn dispatch(shared: &Arc<Shared>, req: Request, ri: &RequestInfo) -> Response {
    let (parts, body) = req.into_parts();
    let query = Query::parse(parts.uri.query());
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                "the request body is too large",
            ));
        }
    };
    tracing::debug!(method = %parts.method, path = %ri.path, "request");
    let response = match route(shared, ri, &parts.method, &query, &parts.headers, &body) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    // A write is acknowledged once its log records are on disk (one fsync per batch of
    // concurrent writes): the ticket read after it covers every record it appended.
    if !parts.method.is_safe()
        && let Some(commit) = shared.group_commit.get()
        && let Err(why) = commit.durable(commit.appended()).await
    {
        return error_response(&ApiError::internal(why));
    }
    response
}

fn route(
    shared: &Arc<Shared>,
    ri: &RequestInfo,
    method: &Method,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let accept = accept(headers);
    if !ri.is_resource_request {
        return non_resource_request(shared, ri.path.as_str(), accept);
    }
    // Served: `resource`, `resource/name` and `resource/name/subresource`, nothing deeper.
    if ri.parts.len() > 3 {
        return Err(ApiError::resource_not_found());
    }
    let rp = Target::of(ri);
    let registry = shared.registry();
    let info = registry
        .lookup(&ri.api_group, &ri.api_version, &ri.resource)
        .ok_or_else(ApiError::resource_not_found)?;
    if info.namespaced && rp.namespace.is_none() && rp.name.is_some() {
        return Err(ApiError::resource_not_found());
    }
    if let Some(sub) = &rp.sub
        && !info.subresources.contains(sub)
    {
        return Err(ApiError::resource_not_found());
    }
    resource_request(shared, info, &rp, method, query, headers, body, accept)
}

/// Discovery, OpenAPI, version and health: the paths that name no resource.
fn non_resource_request(
    shared: &Arc<Shared>,
    path: &str,
    accept: &str,
) -> Result<Response, ApiError> {
    match path {
        "/version" | "/version/" => return Ok(json_response(200, &discovery::version())),
        "/healthz" | "/livez" | "/readyz" => {
            return Ok(bytes_response(
                200,
                Bytes::from_static(b"ok"),
                "text/plain; charset=utf-8",
            ));
        }
        "/api" | "/api/" | "/apis" | "/apis/" if discovery::wants_aggregated(accept).is_some() => {
            let media = discovery::wants_aggregated(accept).unwrap_or("application/json");
            let core = path.trim_end_matches('/') == "/api";
            let mut doc = discovery::aggregated(&shared.registry(), core);
            if media.contains("v2beta1") {
                doc["apiVersion"] = json!("apidiscovery.k8s.io/v2beta1");
            }
            let bytes = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
            return Ok(bytes_response(200, bytes, media));
        }
        "/api" | "/api/" => {
            return Ok(json_response(
                200,
                &discovery::api_versions(&shared.server_address),
            ));
        }
        "/apis" | "/apis/" => {
            return Ok(json_response(
                200,
                &discovery::api_group_list(&shared.registry()),
            ));
        }
        "/openapi/v2" => {
            let (doc, ct) = openapi::v2_document(accept.contains("protobuf"));
            return Ok(bytes_response(200, Bytes::from(doc), ct));
        }
        "/openapi/v3" | "/openapi/v3/" => {
            return Ok(json_response(200, &openapi::v3_index(&shared.registry())));
        }
        _ => {}
    }
    if path.starts_with("/livez/") || path.starts_with("/readyz/") || path.starts_with("/healthz/")
    {
        return Ok(bytes_response(
            200,
            Bytes::from_static(b"ok"),
            "text/plain; charset=utf-8",
        ));
    }
    if let Some(gv) = path.strip_prefix("/openapi/v3/") {
        let (group, version) = match gv
            .trim_matches('/')
            .split('/')
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["api", v] => (String::new(), v.to_string()),
            ["apis", g, v] => (g.to_string(), v.to_string()),
            _ => return Err(ApiError::resource_not_found()),
        };
        return openapi::v3_document(&shared.registry(), &group, &version)
            .map(|d| json_response(200, &d))
            .ok_or_else(ApiError::resource_not_found);
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", v] => discovery::resource_list(&shared.registry(), "", v)
            .map(|d| json_response(200, &d))
            .ok_or_else(ApiError::resource_not_found),
        ["apis", g] => discovery::api_group(&shared.registry(), g)
            .map(|d| json_response(200, &d))
            .ok_or_else(ApiError::resource_not_found),
        ["apis", g, v] => discovery::resource_list(&shared.registry(), g, v)
            .map(|d| json_response(200, &d))
            .ok_or_else(ApiError::resource_not_found),
        _ => Err(ApiError::resource_not_found()),
    }
}

fn decode_body(headers: &HeaderMap, body: &Bytes) -> Result<Decoded, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("protobuf") {
        // Protobuf hook: built-in kinds decode; custom kinds answer 415 as kube-apiserver does.
        return crate::protobuf::decode(body)
            .map(Decoded::without_duplicates)
            .map_err(|e| match e {
                crate::protobuf::ProtoError::NotProtobuf(_)
                | crate::protobuf::ProtoError::NoMagic => {
                    ApiError::unsupported_media_type(ct, &["application/json", "application/yaml"])
                }
                e => ApiError::bad_request(e.to_string()),
            });
    }
    if ct.contains("yaml") {
        if let Ok(decoded) = decode_json(body) {
            return Ok(decoded);
        }
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        return serde_saphyr::from_str::<Value>(text)
            .map(Decoded::without_duplicates)
            .map_err(|e| {
                ApiError::bad_request(format!("error converting YAML to JSON: yaml: {e}"))
            });
    }
    decode_json(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

fn patch_type(headers: &HeaderMap) -> Result<PatchType, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = ct.split(';').next().unwrap_or("").trim();
    match base {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        _ => Err(ApiError::unsupported_media_type(
            ct,
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "application/strategic-merge-patch+json",
            ],
        )),
    }
}

fn default_manager(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let m: String = ua
        .split('/')
        .next()
        .unwrap_or("unknown")
        .chars()
        .take(128)
        .collect();
    if m.is_empty() { "unknown".into() } else { m }
}

fn write_options(
    query: &Query,
    headers: &HeaderMap,
    default_manager_for_apply: bool,
) -> WriteOptions {
    let field_manager = match query.get("fieldManager") {
        Some(m) if !m.is_empty() => m.to_string(),
        _ if default_manager_for_apply => String::new(),
        _ => default_manager(headers),
    };
    WriteOptions {
        dry_run: query.get("dryRun") == Some("All"),
        field_manager,
        field_validation: query.get("fieldValidation").unwrap_or("").to_string(),
        force: query.flag("force"),
    }
}

fn list_options(info: &ResourceInfo, query: &Query) -> Result<ListOptions, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""), |f| {
        field_supported(info, f)
    })
    .map_err(|e| ApiError::bad_request(format!("{}: {e}", field_error_prefix(info))))?;
    let limit = match query.get("limit") {
        Some(l) if !l.is_empty() => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request("invalid limit"))?,
        ),
        _ => None,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit: limit.filter(|l| *l > 0).map(|l| l as usize),
        continue_token: query
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(String::from),
        resource_version_exact: None,
    })
}

/// `resourceVersion`/`resourceVersionMatch` rules of a list: `NotOlderThan` (and no match) is
/// served from the current state, `Exact` at that version (from the event history; `410` once
/// it is out of it, see `Cluster::list`); a version newer than the server's cannot be honoured.
/// Returns the exact version asked for.
fn check_list_resource_version(query: &Query, current: u64) -> Result<Option<u64>, ApiError> {
    let rv = query.get("resourceVersion").unwrap_or("");
    let rv_match = query.get("resourceVersionMatch").unwrap_or("");
    if rv_match.is_empty() {
        return Ok(None);
    }
    let invalid = |detail: &str| {
        ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::error::FieldError::forbidden(
                "resourceVersionMatch",
                detail,
            )],
        )
    };
    if rv.is_empty() {
        return Err(invalid(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if !matches!(rv_match, "Exact" | "NotOlderThan") {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::error::FieldError::not_supported(
                "resourceVersionMatch",
                &json!(rv_match),
                &[json!("Exact"), json!("NotOlderThan"), json!("")],
            )],
        ));
    }
    let n: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: \"{rv}\"")))?;
    if rv_match == "Exact" && n == 0 {
        return Err(invalid(
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    if n > current {
        return Err(ApiError::new(504, "Timeout", format!("Too large resource version: {n}, current: {current}"))
            .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1})));
    }
    Ok((rv_match == "Exact").then_some(n))
}

fn field_error_prefix(info: &ResourceInfo) -> String {
    format!("\"{}\" is not a known field selector", info.plural)
}

fn list_meta(result: &ListResult) -> Value {
    let mut m = json!({"resourceVersion": result.resource_version.to_string()});
    if let Some(c) = &result.continue_token {
        m["continue"] = json!(c);
        m["remainingItemCount"] = json!(result.remaining.unwrap_or(0));
    }
    m
}

/// Serializes a list without cloning items into one big `Value`.
fn list_bytes(info: &ResourceInfo, result: &ListResult, partial: bool) -> Bytes {
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

fn partial_object(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}

fn object_response(
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
fn is_plain_json(accept: &str) -> bool {
    !wants_table(accept) && !wants_partial(accept) && !crate::protobuf::wants_protobuf(accept)
}

/// Protobuf hook: answers in protobuf when the client asks for it first and the kind has a
/// message (built-in kinds), else in JSON (client-go's `*/*` fallback for custom resources).
fn protobuf_or_json(code: u16, obj: &Value, accept: &str) -> Response {
    if crate::protobuf::wants_protobuf(accept)
        && let Ok(body) = crate::protobuf::encode(obj)
    {
        return bytes_response(code, Bytes::from(body), crate::protobuf::MEDIA_TYPE);
    }
    json_response(code, obj)
}

fn delete_options(
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        propagation: query.get("propagationPolicy").map(String::from),
        dry_run: query.get("dryRun") == Some("All"),
        ..Default::default()
    };
    if !body.is_empty() {
        let v = decode_body(headers, body)?.value;
        if let Some(p) = v["propagationPolicy"].as_str() {
            opts.propagation = Some(p.into());
        }
        if v["orphanDependents"] == json!(true) {
            opts.propagation = Some("Orphan".into());
        }
        opts.precondition_uid = v["preconditions"]["uid"].as_str().map(String::from);
        opts.precondition_rv = v["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from);
        if v["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "All"))
        {
            opts.dry_run = true;
        }
    }
    if let Some(p) = &opts.propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        return Err(ApiError::invalid(
            "",
            "DeleteOptions",
            "",
            &[crate::error::FieldError::not_supported(
                "propagationPolicy",
                &json!(p),
                &[
                    json!("Foreground"),
                    json!("Background"),
                    json!("Orphan"),
                    json!("nil"),
                ],
            )],
        ));
    }
    Ok(opts)
}

#[allow(clippy::too_many_arguments)]
fn resource_request(
    shared: &Arc<Shared>,
    info: &ResourceInfo,
    rp: &Target,
    method: &Method,
    query: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    accept: &str,
) -> Result<Response, ApiError> {
    let ns = rp.namespace.clone().unwrap_or_default();
    let sub = match rp.sub.as_deref() {
        Some("status") => Sub::Status,
        _ => Sub::Main,
    };
    match (method, &rp.name) {
        (&Method::GET, None) if rp.watch => watch(shared, info, rp, query, accept),
        (&Method::GET, None) => {
            let mut opts = list_options(info, query)?;
            let cluster = shared.lock();
            opts.resource_version_exact =
                check_list_resource_version(query, cluster.store.resource_version())?;
            let result = cluster.list(info, rp.namespace.as_deref(), &opts)?;
            drop(cluster);
            if wants_table(accept) {
                let include = query.get("includeObject").unwrap_or("Metadata");
                let t = table::to_table(info, &result.values(), list_meta(&result), true, include);
                return Ok(json_response(200, &t));
            }
            let body = list_bytes(info, &result, wants_partial(accept));
            if crate::protobuf::wants_protobuf(accept) && !info.custom {
                let list: Value = serde_json::from_slice(&body).unwrap_or_default();
                return Ok(protobuf_or_json(200, &list, accept));
            }
            Ok(bytes_response(200, body, "application/json"))
        }
        (&Method::GET, Some(name)) => {
            let obj = shared.lock().get(info, &ns, name)?;
            if rp.sub.as_deref() == Some("scale") {
                return Ok(json_response(200, &scale_of(&obj)));
            }
            Ok(object_response(200, info, &obj, accept, query))
        }
        (&Method::POST, None) => {
            let raw = body;
            let Decoded {
                value: mut body,
                duplicates,
            } = decode_body(headers, raw)?;
            let warnings = validate_builtin(info, &mut body, &duplicates, query)?;
            let opts = write_options(query, headers, false);
            // Everything that reads nothing of the cluster happens before its lock is taken.
            let prepared = PreparedCreate::new(info, &ns, body, &opts, shared.random())?;
            let (created, stored) = write(shared, |c| c.create_prepared(info, prepared, &opts))?;
            let response = match stored {
                // The JSON the store wrote is the answer: not serialized again.
                Some(json) if is_plain_json(accept) => {
                    bytes_response(201, json.to_bytes(), "application/json")
                }
                _ => object_response(201, info, &created, accept, query),
            };
            Ok(with_warnings(response, &warnings))
        }
        (&Method::POST, Some(name)) if rp.sub.as_deref() == Some("eviction") => {
            write(shared, |c| {
                c.delete(info, &ns, name, &DeleteOptions::default())
            })?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::PUT, Some(name)) => {
            let raw = body;
            let Decoded {
                value: mut body,
                duplicates,
            } = decode_body(headers, raw)?;
            let warnings = validate_builtin(info, &mut body, &duplicates, query)?;
            let opts = write_options(query, headers, false);
            if rp.sub.as_deref() == Some("scale") {
                let replicas = body["spec"]["replicas"].clone();
                let obj = write(shared, |cluster| {
                    let cur = cluster.get(info, &ns, name)?;
                    let mut updated = (*cur).clone();
                    updated["spec"]["replicas"] = replicas;
                    if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
                        updated["metadata"]["resourceVersion"] = json!(rv);
                    }
                    cluster.update(info, &ns, name, updated, Sub::Main, &opts)
                })?;
                return Ok(json_response(200, &scale_of(&obj)));
            }
            let obj = write(shared, |c| c.update(info, &ns, name, body, sub, &opts))?;
            Ok(with_warnings(
                object_response(200, info, &obj, accept, query),
                &warnings,
            ))
        }
        (&Method::PATCH, Some(name)) => {
            let pt = patch_type(headers)?;
            let raw = body;
            let Decoded {
                value: mut patch,
                duplicates,
            } = decode_body(headers, raw)?;
            let warnings = if pt == PatchType::Json {
                vec![]
            } else {
                validate_builtin(info, &mut patch, &duplicates, query)?
            };
            let opts = write_options(query, headers, pt == PatchType::Apply);
            if rp.sub.as_deref() == Some("scale") {
                let obj = write(shared, |cluster| {
                    let cur = cluster.get(info, &ns, name)?;
                    let mut scale = scale_of(&cur);
                    match pt {
                        PatchType::Json => crate::patch::json_patch(&mut scale, &patch),
                        _ => crate::patch::merge_patch(&mut scale, &patch),
                    }
                    .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?;
                    let mut updated = (*cur).clone();
                    updated["spec"]["replicas"] = scale["spec"]["replicas"].clone();
                    cluster.update(info, &ns, name, updated, Sub::Main, &opts)
                })?;
                return Ok(json_response(200, &scale_of(&obj)));
            }
            let (obj, created) =
                write(shared, |c| c.patch(info, &ns, name, pt, &patch, sub, &opts))?;
            Ok(with_warnings(
                object_response(if created { 201 } else { 200 }, info, &obj, accept, query),
                &warnings,
            ))
        }
        (&Method::DELETE, Some(name)) => {
            let opts = delete_options(query, headers, body)?;
            let obj = write(shared, |c| c.delete(info, &ns, name, &opts))?;
            let pending = !obj["metadata"]["deletionTimestamp"].is_null()
                && obj["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
            if !pending && !returns_deleted_object(info) {
                return Ok(json_response(200, &deleted_status(info, &obj)));
            }
            Ok(object_response(
                if pending { 202 } else { 200 },
                info,
                &obj,
                accept,
                query,
            ))
        }
        (&Method::DELETE, None) => {
            let opts = delete_options(query, headers, body)?;
            let list = list_options(info, query)?;
            let result = write(shared, |c| {
                c.delete_collection(info, rp.namespace.as_deref(), &list, &opts)
            })?;
            Ok(json_response(200, &result))
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// Runs a write under the cluster lock. A write the store could not make durable (persistence
/// refused its event) fails the request with a 500: nothing is acknowledged that a restart
/// would not find.
fn write<T>(
    shared: &Shared,
    op: impl FnOnce(&mut crate::cluster::Cluster) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let mut cluster = shared.lock();
    // A refusal left by a background write (workload simulation) is not this request's.
    let _ = cluster.store.take_failure();
    let done = op(&mut cluster);
    match cluster.store.take_failure() {
        Some(why) => Err(ApiError::internal(why)),
        None => done,
    }
}

/// Field validation hook (`crate::validation`): built-in kinds are checked against their
/// declared fields by the body's own apiVersion/kind (a Scale for `/scale`), else the resource's.
fn validate_builtin(
    info: &ResourceInfo,
    body: &mut Value,
    duplicates: &[String],
    query: &Query,
) -> Result<Vec<String>, ApiError> {
    let mode = crate::validation::Mode::parse(query.get("fieldValidation"))?;
    if info.custom {
        return Ok(vec![]);
    }
    let api_version = body["apiVersion"]
        .as_str()
        .map_or_else(|| info.api_version(), String::from);
    let kind = body["kind"]
        .as_str()
        .map_or_else(|| info.kind.clone(), String::from);
    crate::validation::admit(&api_version, &kind, body, duplicates, mode)
}

/// kube-apiserver's `Warning: 299 - "..."` headers, one per warning.
fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
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
fn returns_deleted_object(info: &ResourceInfo) -> bool {
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

fn deleted_status(info: &ResourceInfo, obj: &Value) -> Value {
    let mut details = serde_json::Map::new();
    details.insert("name".into(), obj["metadata"]["name"].clone());
    if !info.group.is_empty() {
        details.insert("group".into(), json!(info.group));
    }
    details.insert("kind".into(), json!(info.plural));
    details.insert("uid".into(), obj["metadata"]["uid"].clone());
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn scale_of(obj: &Value) -> Value {
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

fn watch(
    shared: &Arc<Shared>,
    info: &ResourceInfo,
    rp: &Target,
    query: &Query,
    accept: &str,
) -> Result<Response, ApiError> {
    let opts = list_options(info, query)?;
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .unwrap_or(1800);
    let filter = watch::WatchFilter {
        info: info.clone(),
        namespace: rp.namespace.clone().filter(|_| info.namespaced),
        labels: opts.labels,
        fields: opts.fields,
        table: wants_table(accept),
        protobuf: crate::protobuf::wants_protobuf(accept) && !info.custom,
    };
    let send_initial_events = query.flag("sendInitialEvents");
    if send_initial_events && query.get("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[crate::error::FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        ));
    }
    let req = watch::WatchRequest {
        resource_version: query.get("resourceVersion").map(String::from),
        send_initial_events,
        allow_bookmarks: query.flag("allowWatchBookmarks"),
        timeout: Duration::from_secs(timeout),
        bookmark_interval: shared.bookmark_interval,
    };
    let stream = {
        let cluster = shared.lock();
        let ends = watch::Ends {
            shutdown: shared.shutdown.clone(),
            ended: shared.watch_ends(),
        };
        watch::start(&cluster, filter, &req, ends)?
    };
    let mut r = Response::new(Body::from_stream(stream));
    let content_type = if crate::protobuf::wants_protobuf(accept) && !info.custom {
        "application/vnd.kubernetes.protobuf;stream=watch"
    } else {
        "application/json"
    };
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache, private"),
    );
    Ok(r.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: &str, path: &str) -> Target {
        Target::of(&RequestInfo::parse(method, path, None))
    }

    #[test]
    fn targets_follow_request_info() {
        let t = target("GET", "/api/v1/namespaces/default/pods/web/status");
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_deref(), t.sub.as_deref()),
            (Some("default"), Some("web"), Some("status"))
        );
        // A Namespace is cluster-scoped: its key has no namespace, though RequestInfo names one.
        let t = target("GET", "/api/v1/namespaces/kube-system");
        assert_eq!(
            (t.namespace, t.name.as_deref()),
            (None, Some("kube-system"))
        );
        let t = target("PUT", "/api/v1/namespaces/x/status");
        assert_eq!(
            (t.name.as_deref(), t.sub.as_deref()),
            (Some("x"), Some("status"))
        );
        let t = target("GET", "/apis/example.com/v1/watch/namespaces/a/widgets");
        assert!(t.watch);
        assert_eq!(t.namespace.as_deref(), Some("a"));
        assert!(!target("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles").watch);
    }
}
