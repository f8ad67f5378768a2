//! The NodeSLO controller's reconcilers run in-process against kube-sim (the test kit's
//! `InProcess` harness): a node gets its NodeSLO, a deleted NodeSLO comes back, and the controller
//! drains and returns when its shutdown is triggered. No process, so a panic in a reconcile fails
//! this test with its own message.

mod common;

use std::time::Duration;

use capstan_apis::slo::NodeSlo;
use capstan_nodeslo_controller::controller::{NodeSloController, Settings};
use capstan_nodeslo_controller::metrics::SloMetrics;
use capstan_runtime::admin::Readiness;
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_testkit::eventually;
use capstan_testkit::objects::node;
use capstan_testkit_sim::InProcess;
use common::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use prometheus_client::registry::Registry;

const WAIT: Duration = Duration::from_secs(20);

fn controller(client: kube::Client) -> std::sync::Arc<NodeSloController> {
    let mut registry = Registry::default();
    NodeSloController::new(
        client,
        Settings {
            config_namespace: "koordinator-system".into(),
            config_name: "slo-controller-config".into(),
            workers: 2,
            conflict_retry: Duration::from_millis(50),
            manager: "nodeslo-controller".into(),
        },
        SloMetrics::register(&mut registry),
        ControllerMetrics::register(&mut registry, "nodeslo-controller"),
        BackoffConfig::default(),
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcilers_run_in_process_and_drain_on_shutdown() {
    let cluster = Cluster::start().await;
    let readiness = Readiness::new();
    let ready = readiness.clone();
    let running = InProcess::start(cluster.client.clone(), |client, shutdown| {
        controller(client).run(
            readiness,
            LeaderHandle::always_leader(shutdown.clone()),
            shutdown,
        )
    });
    eventually("caches synced (ready)", WAIT, || async {
        ready.is_ready().then_some(())
    })
    .await;

    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let slos: Api<NodeSlo> = Api::all(cluster.client.clone());
    nodes
        .create(&PostParams::default(), &node("in-process", &[]))
        .await
        .expect("node created");
    let first = eventually("the NodeSLO of in-process", WAIT, || async {
        slos.get_opt("in-process").await.expect("get")
    })
    .await;
    slos.delete("in-process", &DeleteParams::default())
        .await
        .expect("NodeSLO deleted");
    eventually("the NodeSLO recreated", WAIT, || async {
        let slo = slos.get_opt("in-process").await.expect("get")?;
        (slo.metadata.uid != first.metadata.uid).then_some(())
    })
    .await;
    assert!(!running.is_finished(), "runs until shutdown");
    running.stop().await;
}
