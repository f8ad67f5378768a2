//! gRPC calls are traced on both sides: with `TraceLayer::grpc_client` on a tonic channel and
//! `TraceLayer::grpc_server` on a tonic server, one call makes a client span (a child of the
//! span that made it) and a server span that continues the caller's trace through the W3C
//! `traceparent` header, both exported over OTLP with the RPC's service, method and status.
//! (One test per file: `telemetry::init` installs the process-global subscriber.)

mod common;

use std::time::Duration;

use capstan_runtime::cli::LogFormat;
use capstan_runtime::http_trace::TraceLayer;
use capstan_testkit::otlp::{Collector, attributes, collect_spans, hex};
use common::common_args;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use tower::Layer;
use tracing::Instrument;

/// Any unary gRPC service does; the OTLP trace service is at hand (its receiver is unused).
async fn traced_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    let (service, _unused) = Collector::new();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(TraceLayer::grpc_server())
            .add_service(TraceServiceServer::new(service))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_makes_a_client_span_and_a_server_span_in_one_trace() {
    let (endpoint, mut exports) = Collector::start().await.expect("collector binds");
    let guard = capstan_runtime::telemetry::init(
        "grpc-span-test",
        &common_args(LogFormat::Json, Some(endpoint)),
    )
    .expect("installs");
    let server = traced_server().await;
    let channel = tonic::transport::Endpoint::from_shared(server)
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut client = TraceServiceClient::new(TraceLayer::grpc_client().layer(channel));
    client
        .export(ExportTraceServiceRequest::default())
        .instrument(tracing::info_span!("caller"))
        .await
        .expect("the call succeeds");
    // Shutdown flushes the batch.
    guard.shutdown().await;

    let spans = collect_spans(&mut exports, Duration::from_secs(2)).await;
    let names: Vec<_> = spans.iter().map(|s| (&s.name, s.kind)).collect();
    let path = "opentelemetry.proto.collector.trace.v1.TraceService/Export";
    let of_kind = |kind: SpanKind| {
        spans
            .iter()
            .find(|s| s.name == path && s.kind == kind as i32)
            .unwrap_or_else(|| panic!("no {kind:?} span {path} among {names:?}"))
    };
    let caller = spans
        .iter()
        .find(|s| s.name == "caller")
        .unwrap_or_else(|| panic!("no caller span among {names:?}"));
    let client_span = of_kind(SpanKind::Client);
    let server_span = of_kind(SpanKind::Server);
    for span in [client_span, server_span] {
        let attrs = attributes(span);
        assert_eq!(attrs["rpc.system"], "grpc");
        assert_eq!(
            attrs["rpc.service"],
            "opentelemetry.proto.collector.trace.v1.TraceService"
        );
        assert_eq!(attrs["rpc.method"], "Export");
    }
    assert_eq!(
        hex(&client_span.parent_span_id),
        hex(&caller.span_id),
        "the client span is a child of the span that made the call"
    );
    assert_eq!(
        hex(&server_span.trace_id),
        hex(&client_span.trace_id),
        "the server continues the caller's trace"
    );
    assert_eq!(
        hex(&server_span.parent_span_id),
        hex(&client_span.span_id),
        "the server span's parent is the client span (traceparent sent and read)"
    );
}
