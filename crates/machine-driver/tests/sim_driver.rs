//! The simulated provider against kube-sim, in process and through the gRPC client/server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::machine::Code;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use machine_driver::grpc::{GrpcDriver, serve};
use machine_driver::{Driver, ListMachinesRequest};
use serde_json::json;

use common::{ready, request, sim, sim_driver};

async fn lifecycle(driver: &dyn Driver, client: &kube::Client) {
    let req = request("m-1", json!({"simulate": {"readyDelaySeconds": 0.5}}));
    assert_eq!(
        driver
            .get_machine_status(&req)
            .await
            .expect_err("no VM yet")
            .code,
        Code::NotFound
    );
    let created = driver.create_machine(&req).await.expect("created");
    assert_eq!(created.provider_id, "sim:///default/m-1");
    assert_eq!(created.node_name, "m-1");
    assert!(created.addresses.iter().any(|a| a.type_ == "InternalIP"));
    // Idempotent for the same machine.
    assert_eq!(
        driver
            .create_machine(&req)
            .await
            .expect("again")
            .provider_id,
        created.provider_id
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("m-1").await.expect("node registered");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some("sim:///default/m-1")
    );
    assert_eq!(ready(&node).as_deref(), Some("False"), "NotReady at first");
    let mut turned_ready = false;
    for _ in 0..50 {
        if ready(&nodes.get("m-1").await.expect("node")).as_deref() == Some("True") {
            turned_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(turned_ready, "node turns Ready after the delay");

    let status = driver.get_machine_status(&req).await.expect("found");
    assert_eq!(
        (status.provider_id.as_str(), status.node_name.as_str()),
        ("sim:///default/m-1", "m-1")
    );
    let list = driver
        .list_machines(&ListMachinesRequest {
            class: req.class.clone(),
            secret_data: Default::default(),
        })
        .await
        .expect("listed");
    assert_eq!(
        list.get("sim:///default/m-1").map(String::as_str),
        Some("m-1")
    );
    assert_eq!(
        driver
            .initialize_machine(&req)
            .await
            .expect_err("no init")
            .code,
        Code::Unimplemented
    );

    driver.delete_machine(&req).await.expect("deleted");
    assert_eq!(
        driver
            .get_machine_status(&req)
            .await
            .expect_err("gone")
            .code,
        Code::NotFound
    );
    assert_eq!(
        driver
            .delete_machine(&req)
            .await
            .expect_err("already gone")
            .code,
        Code::NotFound
    );
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(vms.get_opt("sim-vm-m-1").await.expect("get").is_none());
}

async fn injected(driver: &dyn Driver) {
    let req = request(
        "m-2",
        json!({"simulate": {"createError": "ResourceExhausted", "initializeError": "Uninitialized"}}),
    );
    let err = driver.create_machine(&req).await.expect_err("injected");
    assert_eq!(err.code, Code::ResourceExhausted);
    assert!(err.message.contains("CreateMachine"), "{}", err.message);
    assert_eq!(
        driver
            .initialize_machine(&req)
            .await
            .expect_err("injected")
            .code,
        Code::Uninitialized
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_provider_in_process() {
    let (_sim, client) = sim().await;
    let driver = sim_driver(&client, Duration::from_secs(1));
    lifecycle(&driver, &client).await;
    injected(&driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_provider_over_grpc_keeps_codes_and_data() {
    let (_sim, client) = sim().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        Arc::new(sim_driver(&client, Duration::from_secs(1))),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let endpoint = GrpcDriver::endpoint_of(&format!("grpc://{addr}")).expect("endpoint");
    let remote = GrpcDriver::connect_lazy(&endpoint).expect("client");
    lifecycle(&remote, &client).await;
    injected(&remote).await;
    let _ = stop.send(());
    server.await.expect("joined").expect("served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_is_down_reports_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let remote = GrpcDriver::connect_lazy(&format!("http://{addr}")).expect("client");
    let err = remote
        .get_machine_status(&request("m", json!({})))
        .await
        .expect_err("down");
    assert_eq!(err.code, Code::Unavailable, "{err}");
}
