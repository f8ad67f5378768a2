//! A tower layer that makes one span per outgoing Kubernetes API request and per gRPC call
//! (client or server side), so a reconcile's trace shows the work it caused. Add it to the kube
//! client (`CommonArgs::kube_client` does), to a tonic `Channel` and to a tonic `Server`.
//!
//! gRPC calls (span `grpc`, `otel.kind` client or server) carry the W3C `traceparent` header: the client injects the current span's
//! context, the server continues that trace. A 403 from the API server is logged at warn level
//! naming the verb, resource and namespace the ServiceAccount lacks (RBAC problems are otherwise
//! invisible: the reconcile only sees "forbidden").

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Which kind of request the layer traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    KubeApi,
    GrpcClient,
    GrpcServer,
}

/// Makes a span per request; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct TraceLayer {
    side: Side,
}

impl TraceLayer {
    /// For a kube client: span `kube_api` with verb, resource, namespace, name and status.
    pub fn kube_api() -> Self {
        Self {
            side: Side::KubeApi,
        }
    }

    /// For a tonic client channel: span `grpc` (kind client), trace context sent along.
    pub fn grpc_client() -> Self {
        Self {
            side: Side::GrpcClient,
        }
    }

    /// For a tonic server: span `grpc` (kind server), continuing the caller's trace.
    pub fn grpc_server() -> Self {
        Self {
            side: Side::GrpcServer,
        }
    }
}

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Traced {
            inner,
            side: self.side,
        }
    }
}

/// The service [`TraceLayer`] wraps around another.
#[derive(Clone, Debug)]
pub struct Traced<S> {
    inner: S,
    side: Side,
}

impl<S, B, R> tower::Service<Request<B>> for Traced<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let side = self.side;
        let api = (side == Side::KubeApi)
            .then(|| ApiRequest::parse(request.method(), request.uri()))
            .flatten();
        let span = match side {
            Side::KubeApi => kube_span(api.as_ref(), request.method(), request.uri()),
            Side::GrpcClient => {
                let span = grpc_span("client", request.uri());
                let context = span.context();
                TraceContextPropagator::new()
                    .inject_context(&context, &mut HeaderInjector(request.headers_mut()));
                span
            }
            Side::GrpcServer => {
                let span = grpc_span("server", request.uri());
                let parent =
                    TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
                let _ = span.set_parent(parent);
                span
            }
        };
        // Entered while calling: a buffered inner service (the kube client) carries it over.
        let future = span.in_scope(|| self.inner.call(request));
        let record = span.clone();
        Box::pin(
            async move {
                let result = future.await;
                if let Ok(response) = &result {
                    observe(&record, side, api.as_ref(), response);
                }
                result
            }
            .instrument(span),
        )
    }
}

fn kube_span(api: Option<&ApiRequest>, method: &Method, uri: &Uri) -> tracing::Span {
    let (verb, resource) = api.map_or(("request", uri.path()), |a| (a.verb, a.resource.as_str()));
    tracing::info_span!(
        "kube_api",
        otel.name = %format!("{verb} {resource}"),
        otel.kind = "client",
        http.request.method = %method,
        url.path = uri.path(),
        k8s.verb = verb,
        k8s.resource = resource,
        k8s.namespace = api.and_then(|a| a.namespace.as_deref()).unwrap_or(""),
        k8s.name = api.and_then(|a| a.name.as_deref()).unwrap_or(""),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

fn grpc_span(kind: &'static str, uri: &Uri) -> tracing::Span {
    // `/package.Service/Method`
    let path = uri.path().trim_start_matches('/');
    let (service, method) = path.split_once('/').unwrap_or((path, ""));
    tracing::info_span!(
        "grpc",
        otel.name = path,
        otel.kind = kind,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

fn observe<R>(span: &tracing::Span, side: Side, api: Option<&ApiRequest>, response: &Response<R>) {
    let status = response.status().as_u16();
    match side {
        Side::KubeApi => {
            span.record("http.response.status_code", status);
            if status >= 400 {
                span.record("otel.status_code", "ERROR");
            }
            if status == 403
                && let Some(api) = api
            {
                let scope = api.namespace.as_deref().map_or_else(
                    || "cluster-wide".to_owned(),
                    |ns| format!("in namespace {ns}"),
                );
                tracing::warn!(
                    verb = api.verb,
                    resource = %api.qualified_resource(),
                    namespace = api.namespace.as_deref().unwrap_or(""),
                    "forbidden: the ServiceAccount may not {} {} {scope}; grant it in the RBAC rules",
                    api.verb,
                    api.qualified_resource(),
                );
            }
        }
        Side::GrpcClient | Side::GrpcServer => {
            // Trailers-only errors carry `grpc-status` in the headers; streamed ones are not seen.
            if let Some(code) = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
            {
                span.record("rpc.grpc.status_code", code);
                if code != 0 {
                    span.record("otel.status_code", "ERROR");
                }
            }
        }
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// What a Kubernetes API request asks for, read from its method and path (the RBAC terms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: &'static str,
    /// API group; empty for the core group.
    pub group: String,
    /// Resource, with `/subresource` when there is one (`machines/status`).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl ApiRequest {
    /// `None` for non-resource paths (`/version`, `/apis`, discovery).
    pub fn parse(method: &Method, uri: &Uri) -> Option<Self> {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => (String::new(), rest),
            ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                (Some((*namespace).to_owned()), rest)
            }
            _ => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, subresource, ..] => (*resource, Some(*name), Some(*subresource)),
            [] => return None,
        };
        let watch = uri.query().is_some_and(|query| {
            query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
        let verb = match (method.as_str(), name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => "request",
        };
        Some(Self {
            verb,
            group,
            resource: match subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            },
            namespace,
            name: name.map(str::to_owned),
        })
    }

    /// `resource.group` as RBAC error messages spell it (`nodeslos.slo.koordinator.sh`).
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: &str, uri: &str) -> Option<ApiRequest> {
        ApiRequest::parse(&method.parse().expect("method"), &uri.parse().expect("uri"))
    }

    #[test]
    fn reads_rbac_terms_from_resource_paths() {
        let create = parse("POST", "/apis/slo.koordinator.sh/v1alpha1/nodeslos").expect("api");
        assert_eq!(
            (
                create.verb,
                create.qualified_resource(),
                create.namespace,
                create.name
            ),
            (
                "create",
                "nodeslos.slo.koordinator.sh".to_owned(),
                None,
                None
            )
        );
        let status = parse(
            "PATCH",
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines/m-1/status",
        )
        .expect("api");
        assert_eq!(status.verb, "patch");
        assert_eq!(status.resource, "machines/status");
        assert_eq!(status.namespace.as_deref(), Some("default"));
        assert_eq!(status.name.as_deref(), Some("m-1"));
        let watch = parse("GET", "/api/v1/nodes?watch=true&resourceVersion=5").expect("api");
        assert_eq!((watch.verb, watch.resource.as_str()), ("watch", "nodes"));
        let list = parse("GET", "/api/v1/namespaces/kube-system/pods").expect("api");
        assert_eq!(list.verb, "list");
        assert_eq!(list.namespace.as_deref(), Some("kube-system"));
    }

    #[test]
    fn a_namespace_object_is_cluster_scoped() {
        let get = parse("GET", "/api/v1/namespaces/default").expect("api");
        assert_eq!(get.verb, "get");
        assert_eq!(get.resource, "namespaces");
        assert_eq!(get.namespace, None);
        assert_eq!(get.name.as_deref(), Some("default"));
        let delete_all = parse("DELETE", "/api/v1/namespaces/ns/configmaps").expect("api");
        assert_eq!(delete_all.verb, "deletecollection");
    }

    #[test]
    fn non_resource_paths_are_not_api_requests() {
        assert_eq!(parse("GET", "/version"), None);
        assert_eq!(parse("GET", "/apis"), None);
        assert_eq!(parse("GET", "/api/v1"), None);
    }
}
