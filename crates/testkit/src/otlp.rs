//! An in-process OTLP/gRPC trace collector: a test points a binary's (or the runtime's)
//! `--otlp-endpoint` at it and reads back every exported span, to assert what a trace backend
//! would show.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

/// Every export request the collector received, whole (resource, scope and spans).
pub type Exports = mpsc::UnboundedReceiver<ExportTraceServiceRequest>;

/// The OTLP trace service: answers every export with success and hands the request to the test.
#[derive(Clone, Debug)]
pub struct Collector(mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// A collector and the receiving end of what it is sent (not yet served).
    pub fn new() -> (Self, Exports) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), rx)
    }

    /// Serves a collector on 127.0.0.1:0; returns its endpoint (`http://127.0.0.1:PORT`) and the
    /// export requests it receives. It runs until the test's runtime ends.
    pub async fn start() -> std::io::Result<(String, Exports)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (collector, exports) = Self::new();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Ok((format!("http://{addr}"), exports))
    }
}

/// The spans of one export request, in order.
pub fn spans(request: ExportTraceServiceRequest) -> impl Iterator<Item = Span> {
    request
        .resource_spans
        .into_iter()
        .flat_map(|resource| resource.scope_spans)
        .flat_map(|scope| scope.spans)
}

/// Receives spans until none arrives for `quiet` (the exporter has flushed).
pub async fn collect_spans(exports: &mut Exports, quiet: std::time::Duration) -> Vec<Span> {
    let mut received = Vec::new();
    while let Ok(Some(request)) = tokio::time::timeout(quiet, exports.recv()).await {
        received.extend(spans(request));
    }
    received
}

/// A span's scalar attributes as strings (`k8s.verb` -> `create`, status codes as numbers).
pub fn attributes(span: &Span) -> BTreeMap<String, String> {
    span.attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), value))
        })
        .collect()
}

/// A trace or span id as the lowercase hex that logs print.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
