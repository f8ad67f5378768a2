//! gRPC request metrics as a tower layer: calls started and handled (by code),
//! and handling latency, per service and method, in a prometheus-client registry.
//! Names follow go-grpc-prometheus (`grpc_server_started_total`,
//! `grpc_server_handled_total{grpc_code}`, `grpc_server_handling_seconds`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub grpc_service: String,
    pub grpc_method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandledLabels {
    pub grpc_service: String,
    pub grpc_method: String,
    pub grpc_code: String,
}

type LatencyFamily = Family<MethodLabels, Histogram, fn() -> Histogram>;

/// The metric handles; cheap to clone.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    started: Family<MethodLabels, Counter>,
    handled: Family<HandledLabels, Counter>,
    latency: LatencyFamily,
}

impl GrpcMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            started: Family::default(),
            handled: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
            }),
        };
        registry.register(
            "grpc_server_started",
            "gRPC calls started on the server",
            metrics.started.clone(),
        );
        registry.register(
            "grpc_server_handled",
            "gRPC calls completed on the server, by status code",
            metrics.handled.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "Time from a call's arrival to its status",
            metrics.latency.clone(),
        );
        metrics
    }

    /// Calls handled so far with this service, method and code name (for tests).
    pub fn handled_count(&self, service: &str, method: &str, code: &str) -> u64 {
        self.handled
            .get_or_create(&HandledLabels {
                grpc_service: service.into(),
                grpc_method: method.into(),
                grpc_code: code.into(),
            })
            .get()
    }
}

/// The layer; `known_services` bounds label values (other paths count as "unknown").
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    metrics: GrpcMetrics,
    known_services: Arc<[String]>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: GrpcMetrics, known_services: impl IntoIterator<Item = String>) -> Self {
        Self {
            metrics,
            known_services: known_services.into_iter().collect(),
        }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    layer: GrpcMetricsLayer,
}

/// `/pkg.Service/Method` split into labels, or "unknown" for paths of other services.
fn method_labels(path: &str, known: &[String]) -> MethodLabels {
    let parts = path
        .strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .filter(|(service, method)| known.iter().any(|k| k == service) && !method.contains('/'));
    match parts {
        Some((service, method)) => MethodLabels {
            grpc_service: service.to_owned(),
            grpc_method: method.to_owned(),
        },
        None => MethodLabels {
            grpc_service: "unknown".into(),
            grpc_method: "unknown".into(),
        },
    }
}

/// gRPC code names as Go's `codes.Code.String()` spells them.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

fn status_code(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(tonic::Code::from(value.trim().parse::<i32>().ok()?))
}

/// One call being measured; recorded exactly once.
#[derive(Debug)]
struct Observation {
    metrics: GrpcMetrics,
    labels: MethodLabels,
    start: Instant,
}

impl Observation {
    fn finish(self, code: tonic::Code) {
        let handled = HandledLabels {
            grpc_service: self.labels.grpc_service.clone(),
            grpc_method: self.labels.grpc_method.clone(),
            grpc_code: code_name(code).to_owned(),
        };
        self.metrics.handled.get_or_create(&handled).inc();
        self.metrics
            .latency
            .get_or_create(&self.labels)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body + Unpin,
{
    type Response = http::Response<MetricsBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let labels = method_labels(request.uri().path(), &self.layer.known_services);
        self.layer.metrics.started.get_or_create(&labels).inc();
        let observation = Observation {
            metrics: self.layer.metrics.clone(),
            labels,
            start: Instant::now(),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // Errors come as trailers-only responses (status in the headers);
            // successes carry the status in the trailers after the body.
            let observation = match status_code(response.headers()) {
                Some(code) => {
                    observation.finish(code);
                    None
                }
                None => Some(observation),
            };
            Ok(response.map(|inner| MetricsBody { inner, observation }))
        })
    }
}

/// A response body that records the call when its trailers (or its end) go by.
#[derive(Debug)]
pub struct MetricsBody<B> {
    inner: B,
    observation: Option<Observation>,
}

impl<B> MetricsBody<B> {
    fn finish(&mut self, code: tonic::Code) {
        if let Some(observation) = self.observation.take() {
            observation.finish(code);
        }
    }
}

impl<B: Body + Unpin> Body for MetricsBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    this.finish(status_code(trailers).unwrap_or(tonic::Code::Unknown));
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(tonic::Code::Unknown),
            Poll::Ready(None) => this.finish(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for MetricsBody<B> {
    fn drop(&mut self) {
        // The client went away before the status was sent.
        self.finish(tonic::Code::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_only_for_known_services() {
        let known = ["router.SliceRouterSidecarService".to_string()];
        let labels = method_labels("/router.SliceRouterSidecarService/UpdateEcmpRoutes", &known);
        assert_eq!(labels.grpc_service, "router.SliceRouterSidecarService");
        assert_eq!(labels.grpc_method, "UpdateEcmpRoutes");
        for other in [
            "/evil.Service/X",
            "/",
            "",
            "/router.SliceRouterSidecarService/a/b",
        ] {
            assert_eq!(
                method_labels(other, &known).grpc_service,
                "unknown",
                "{other}"
            );
        }
    }

    #[test]
    fn status_header_parsing() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(status_code(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        assert_eq!(status_code(&headers), Some(tonic::Code::InvalidArgument));
        assert_eq!(code_name(tonic::Code::Cancelled), "Canceled");
    }
}
