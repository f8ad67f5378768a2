//! `telemetry::init` with an OTLP endpoint really exports spans over gRPC: a local collector
//! receives the span, with the service name as resource and the trace id `trace_id()` reported.
//! (One test per file: `init` installs the process-global subscriber.)

use std::time::Duration;

use capstan_runtime::cli::{CommonArgs, LeaderElectionArgs, LogFormat};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::mpsc;

struct Collector(mpsc::UnboundedSender<ExportTraceServiceRequest>);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_otlp_collector() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let args = CommonArgs {
        kubeconfig: None,
        metrics_addr: "127.0.0.1:0".parse().expect("address"),
        log_format: LogFormat::Json,
        log_level: "info".into(),
        otlp_endpoint: Some(format!("http://{addr}")),
        leader: LeaderElectionArgs {
            leader_elect: false,
            lease_name: None,
            lease_namespace: "default".into(),
            lease_duration_seconds: 15,
            lease_grace_seconds: 5,
            identity: None,
        },
    };
    let guard = capstan_runtime::telemetry::init("otlp-test-service", &args).expect("installs");
    assert!(guard.exports_traces());

    let trace_id = {
        let span = tracing::info_span!("reconcile", object = "default/machine-1");
        let _entered = span.enter();
        tracing::info!("reconciling");
        capstan_runtime::telemetry::trace_id().expect("traced")
    };
    // Shutdown flushes the batch.
    guard.shutdown().await;

    let request = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("export arrives")
        .expect("collector alive");
    let resource_spans = &request.resource_spans[0];
    let service_name = resource_spans
        .resource
        .as_ref()
        .expect("resource")
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone());
    assert_eq!(
        service_name,
        Some(Value::StringValue("otlp-test-service".into()))
    );
    let span = resource_spans
        .scope_spans
        .iter()
        .flat_map(|scope| &scope.spans)
        .find(|span| span.name == "reconcile")
        .expect("the reconcile span");
    let exported_trace_id: String = span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        exported_trace_id, trace_id,
        "trace_id() names the exported trace"
    );
}
