//! What the controller tells the outside about its work: with `--otlp-endpoint`, each reconcile
//! is an exported span carrying the controller, the object and the outcome, with a child span per
//! Kubernetes API request it made; and kube-sim's request accounting names the controller by its
//! User-Agent (`nodeslo-controller/0.1.0`), not "unknown".

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use capstan_testkit::eventually;
use common::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

/// An OTLP/gRPC trace collector that hands every exported span to the test.
struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn start_collector() -> (String, mpsc::UnboundedReceiver<Span>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (format!("http://{addr}"), rx)
}

fn attributes(span: &Span) -> BTreeMap<String, String> {
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

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_are_exported_as_spans_with_their_api_requests_as_children() {
    let (endpoint, mut spans) = start_collector().await;
    let cluster = Cluster::start().await;
    let mut controller = cluster
        .spawn_controller(&[
            "--otlp-endpoint",
            &endpoint,
            // The write is logged at debug level, inside the reconcile span.
            "--log-level",
            "info,capstan_nodeslo_controller=debug",
        ])
        .await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    nodes
        .create(&PostParams::default(), &node("traced-node"))
        .await
        .expect("node created");
    eventually(
        "the NodeSLO of traced-node",
        Duration::from_secs(20),
        || async {
            let slos: Api<capstan_apis::slo::NodeSlo> = Api::all(cluster.client.clone());
            slos.get_opt("traced-node").await.ok().flatten()
        },
    )
    .await;
    // The drain flushes the batch exporter.
    controller.sigterm().expect("SIGTERM");
    controller
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("exits");

    let mut received = Vec::new();
    while let Ok(Some(span)) = tokio::time::timeout(Duration::from_secs(2), spans.recv()).await {
        received.push(span);
    }
    let reconcile = received
        .iter()
        .find(|span| {
            let attrs = attributes(span);
            span.name == "reconcile NodeSLO"
                && attrs.get("object.name").map(String::as_str) == Some("traced-node")
                && received.iter().any(|child| {
                    child.parent_span_id == span.span_id
                        && attributes(child).get("k8s.verb").map(String::as_str) == Some("create")
                })
        })
        .unwrap_or_else(|| {
            let names: Vec<_> = received.iter().map(|s| (&s.name, attributes(s))).collect();
            panic!("no reconcile span of traced-node with a create child among {names:#?}")
        });
    let attrs = attributes(reconcile);
    assert_eq!(attrs["controller"], "nodeslo-controller");
    assert_eq!(attrs["object.kind"], "NodeSLO");
    assert_eq!(attrs["object.namespace"], "");
    assert_eq!(attrs["outcome"], "ok");
    let trace_id: String = reconcile
        .trace_id
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        attrs["trace_id"], trace_id,
        "the logged trace id is the span's"
    );
    let create = received
        .iter()
        .find(|child| {
            child.parent_span_id == reconcile.span_id
                && attributes(child).get("k8s.verb").map(String::as_str) == Some("create")
        })
        .expect("create child");
    assert_eq!(create.trace_id, reconcile.trace_id, "same trace");
    let create_attrs = attributes(create);
    assert_eq!(create.name, "create nodeslos");
    assert_eq!(create_attrs["k8s.resource"], "nodeslos");
    assert_eq!(create_attrs["http.request.method"], "POST");
    assert_eq!(create_attrs["http.response.status_code"], "201");
    let logs = controller.output().join("\n");
    assert!(
        logs.contains(&trace_id),
        "the reconcile's log lines carry its trace id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_carry_the_controller_user_agent() {
    let cluster = Cluster::start().await;
    // Only the controller talks to the cluster from here on.
    cluster.sim.reset_requests();
    let controller = cluster.spawn_controller(&[]).await;
    let stats = cluster.sim.requests();
    let by_controller = stats.count_where(|key| key.client == "nodeslo-controller");
    assert!(
        by_controller > 0,
        "kube-sim counted the controller's requests: {:?}",
        stats.by_verb_resource_code()
    );
    assert_eq!(
        stats.count_where(|key| key.client == "unknown"),
        0,
        "every request named its client"
    );
    drop(controller);
    assert_eq!(
        capstan_runtime::cli::user_agent("nodeslo-controller"),
        "nodeslo-controller/0.1.0"
    );
}
