//! What the controller tells the outside about its work: with `--otlp-endpoint`, each reconcile
//! is an exported span carrying the controller, the object and the outcome, with a child span per
//! Kubernetes API request it made; and kube-sim's request accounting names the controller by its
//! User-Agent (`nodeslo-controller/0.1.0`), not "unknown".

mod common;

use std::time::Duration;

use capstan_testkit::eventually;
use capstan_testkit::objects::node;
use capstan_testkit::otlp::{Collector, attributes, collect_spans, hex};
use common::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_are_exported_as_spans_with_their_api_requests_as_children() {
    let (endpoint, mut exports) = Collector::start().await.expect("collector binds");
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
        .create(&PostParams::default(), &node("traced-node", &[]))
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

    let received = collect_spans(&mut exports, Duration::from_secs(2)).await;
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
    let trace_id = hex(&reconcile.trace_id);
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
