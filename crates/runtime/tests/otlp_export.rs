//! `telemetry::init` with an OTLP endpoint really exports spans over gRPC: a local collector
//! receives the span, with the service name as resource and the trace id `trace_id()` reported.
//! (One test per file: `init` installs the process-global subscriber.)

use std::time::Duration;

mod common;

use capstan_runtime::cli::LogFormat;
use capstan_testkit::otlp::{Collector, hex};
use common::common_args;
use opentelemetry_proto::tonic::common::v1::any_value::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_otlp_collector() {
    let (endpoint, mut rx) = Collector::start().await.expect("collector binds");

    let args = common_args(LogFormat::Json, Some(endpoint));
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
    assert_eq!(
        hex(&span.trace_id),
        trace_id,
        "trace_id() names the exported trace"
    );
}
