//! The pod subresources a kubelet serves through kube-apiserver: `pods/log` (plain or `follow`
//! streaming), `pods/exec` and `pods/attach` (WebSocket channel protocols, see `exec`),
//! `pods/portforward` (SPDY or WebSocket, see `portforward`).
//! Taken before the request pipeline (`dispatch`), so that the pipeline stays request/response.

use crate::error::ApiError;
use crate::http::{Query, Shared};
use crate::kubelet::Kubelet;
use crate::kubelet::logs::{self, LogRequest};
use crate::request_info::RequestInfo;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{Method, header};
use serde_json::Value;
use std::sync::Arc;

/// Serves a request the API server hands to a kubelet (a pod's log, exec, attach or
/// port-forward); any other goes to the API pipeline, [`super::dispatch`].
pub async fn serve(
    shared: &Arc<Shared>,
    kubelet: &Kubelet,
    req: Request,
    info: &RequestInfo,
) -> Response {
    match pod_subresource(info) {
        Some((ns, name, sub)) => pod_stream(shared, kubelet, req, ns, name, sub).await,
        None => super::dispatch(shared, req, info).await,
    }
}

/// `(namespace, pod, subresource)` of `/api/v1/namespaces/{ns}/pods/{name}/{sub}`, read from
/// the request's parsed path (no second look at the path on every request).
fn pod_subresource(info: &RequestInfo) -> Option<(&str, &str, &str)> {
    let stream = info.is_resource_request
        && info.api_group.is_empty()
        && info.api_version == "v1"
        && info.resource == "pods"
        && info.parts.len() == 3
        && !info.namespace.is_empty()
        // `/api/v1/watch/namespaces/...` is a watch, never a stream.
        && info.verb != "watch"
        && matches!(
            info.subresource.as_str(),
            "log" | "exec" | "attach" | "portforward"
        );
    stream
        .then_some((&info.namespace, &info.name, &info.subresource))
        .map(|(ns, name, sub)| (ns.as_str(), name.as_str(), sub.as_str()))
}

async fn pod_stream(
    shared: &Shared,
    kubelet: &Kubelet,
    req: Request,
    ns: &str,
    name: &str,
    sub: &str,
) -> Response {
    let query = Query::parse(req.uri().query());
    let pod = match get_pod(shared, ns, name) {
        Ok(p) => p,
        Err(e) => return crate::testbed::status_response(&e),
    };
    let result = match (sub, req.method()) {
        ("log", &Method::GET) => pod_log(kubelet, &pod, &query).await,
        ("exec" | "attach", &Method::GET | &Method::POST) => {
            super::exec::serve(kubelet, &pod, sub, &query, req).await
        }
        ("portforward", &Method::GET | &Method::POST) => {
            super::portforward::serve(&pod, &query, req).await
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    };
    result.unwrap_or_else(|e| crate::testbed::status_response(&e))
}

fn get_pod(shared: &Shared, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
    let cluster = shared.lock();
    let info = cluster
        .registry
        .lookup("", "v1", "pods")
        .cloned()
        .ok_or_else(ApiError::resource_not_found)?;
    cluster.get(&info, ns, name)
}

/// The container a request names, with kube-apiserver's errors for a missing or unknown one.
pub(crate) fn container_name(pod: &Value, query: &Query) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match query.get("container").filter(|c| !c.is_empty()) {
        Some(c) if names.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if names.len() == 1 => Ok(names[0].to_string()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

fn text_response(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

async fn pod_log(kubelet: &Kubelet, pod: &Value, query: &Query) -> Result<Response, ApiError> {
    let container = container_name(pod, query)?;
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let req = LogRequest {
        previous: query.flag("previous"),
        follow: query.flag("follow"),
        tail_lines: match query.get("tailLines") {
            Some(t) => Some(t.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("invalid tailLines {t:?}: expected an integer"))
            })?)
            .filter(|n| *n >= 0)
            .map(|n| n as usize),
            None => None,
        },
    };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let run = kubelet
        .pod(uid)
        .and_then(|run| run.container(Some(&container)))
        .filter(|c| c.is_process());
    let Some(run) = run else {
        // A simulated container writes nothing.
        if req.previous {
            return Err(ApiError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
            )));
        }
        return Ok(text_response(Body::empty()));
    };
    let Some(instance) = logs::instance(&run, req.previous) else {
        return Err(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
        )));
    };
    let stream = logs::open(run, instance, &req)
        .await
        .map_err(|e| ApiError::new(500, "InternalError", format!("reading the log: {e}")))?;
    Ok(text_response(Body::from_stream(stream)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pod_streaming_subresources_are_taken() {
        let of = |method: &str, path: &str| {
            let info = RequestInfo::parse(method, path, None);
            pod_subresource(&info).map(|(ns, name, sub)| format!("{ns} {name} {sub}"))
        };
        assert_eq!(
            of("GET", "/api/v1/namespaces/default/pods/web/log").as_deref(),
            Some("default web log")
        );
        assert!(of("POST", "/api/v1/namespaces/default/pods/web/exec").is_some());
        assert!(of("GET", "/api/v1/namespaces/default/pods/web/status").is_none());
        assert!(of("GET", "/api/v1/namespaces/default/pods/web").is_none());
        assert!(of("GET", "/api/v1/namespaces/default/pods/web/log/more").is_none());
        assert!(of("GET", "/api/v1/pods/web/log").is_none());
        assert!(of("GET", "/api/v1/watch/namespaces/default/pods/web/log").is_none());
        assert!(of("GET", "/apis/x/v1/namespaces/default/pods/web/log").is_none());
        assert!(of("GET", "/api/v1/namespaces/default/configmaps/web/log").is_none());
    }
}
