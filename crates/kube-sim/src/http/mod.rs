//! The HTTP face of the server: one request pipeline (parse, route, execute under the cluster lock,
//! encode), so that accounting and fault injection can hook in at a single place.

mod discovery;
mod exec;
mod openapi;
mod portforward;
mod request;
mod response;
mod spdy;
pub mod stream;
pub mod table;
mod watch;

pub(crate) use request::Query;
use request::{
    accept, check_list_resource_version, decode_body, delete_options, list_options, patch_type,
    wants_partial, wants_table, write_options,
};
use response::{
    bytes_response, deleted_status, error_response, is_plain_json, json_response, list_bytes,
    list_meta, object_response, protobuf_or_json, returns_deleted_object, scale_of, with_warnings,
};

use crate::cluster::{DeleteOptions, PatchType, PreparedCreate, Sub};
use crate::error::ApiError;
use crate::journal::WriteRequest;
use crate::registry::ResourceInfo;
use crate::request_info::RequestInfo;
use crate::shared::Shared;
use crate::validation::Decoded;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, header};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const MAX_BODY: usize = 3 * 1024 * 1024;

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
    // A write as the write journal records it; only called while a resource is journaled.
    let journaled = |verb: &'static str, name: Option<&str>| WriteRequest {
        verb,
        subresource: rp.sub.clone().unwrap_or_default(),
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        target: name.map(|name| {
            let ns = if info.namespaced { ns.as_str() } else { "" };
            (info.storage_key(), (ns.to_string(), name.to_string()))
        }),
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
            let (created, stored) = write(
                shared,
                || journaled("create", None),
                |c| c.create_prepared(info, prepared, &opts),
            )?;
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
            write(
                shared,
                || journaled("delete", Some(name)),
                |c| c.delete(info, &ns, name, &DeleteOptions::default()),
            )?;
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
                let obj = write(
                    shared,
                    || journaled("update", Some(name)),
                    |cluster| {
                        let cur = cluster.get(info, &ns, name)?;
                        let mut updated = (*cur).clone();
                        updated["spec"]["replicas"] = replicas;
                        if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
                            updated["metadata"]["resourceVersion"] = json!(rv);
                        }
                        cluster.update(info, &ns, name, updated, Sub::Main, &opts)
                    },
                )?;
                return Ok(json_response(200, &scale_of(&obj)));
            }
            let obj = write(
                shared,
                || journaled("update", Some(name)),
                |c| c.update(info, &ns, name, body, sub, &opts),
            )?;
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
                let obj = write(
                    shared,
                    || journaled("patch", Some(name)),
                    |cluster| {
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
                    },
                )?;
                return Ok(json_response(200, &scale_of(&obj)));
            }
            let (obj, created) = write(
                shared,
                || journaled("patch", Some(name)),
                |c| c.patch(info, &ns, name, pt, &patch, sub, &opts),
            )?;
            Ok(with_warnings(
                object_response(if created { 201 } else { 200 }, info, &obj, accept, query),
                &warnings,
            ))
        }
        (&Method::DELETE, Some(name)) => {
            let opts = delete_options(query, headers, body)?;
            let obj = write(
                shared,
                || journaled("delete", Some(name)),
                |c| c.delete(info, &ns, name, &opts),
            )?;
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
            // Each item is named by the cluster as it deletes it.
            let result = write(
                shared,
                || journaled("delete", None),
                |c| c.delete_collection(info, rp.namespace.as_deref(), &list, &opts),
            )?;
            Ok(json_response(200, &result))
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// Runs a write under the cluster lock. A write the store could not make durable (persistence
/// refused its event) fails the request with a 500: nothing is acknowledged that a restart
/// would not find. While a resource is journaled, the write journal sees the request as
/// `journaled` describes it and records its changes if it succeeds.
fn write<T>(
    shared: &Shared,
    journaled: impl FnOnce() -> WriteRequest,
    op: impl FnOnce(&mut crate::cluster::Cluster) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let mut cluster = shared.lock();
    // A refusal left by a background write (workload simulation) is not this request's.
    let _ = cluster.store.take_failure();
    if let Some(journal) = cluster.store.journal_mut() {
        journal.begin(journaled());
    }
    let done = op(&mut cluster);
    let done = match cluster.store.take_failure() {
        Some(why) => Err(ApiError::internal(why)),
        None => done,
    };
    if let Some(journal) = cluster.store.journal_mut() {
        journal.end(done.is_ok());
    }
    done
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
