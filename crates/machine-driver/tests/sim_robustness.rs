//! The simulated provider under bad input and API faults: an out-of-range `providerSpec.simulate`
//! is refused naming the field (it used to panic the process), and a VM whose Node registration
//! failed is not reported as created, so a retried CreateMachine finishes it.

mod common;

use std::time::Duration;

use capstan_apis::machine::Code;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube_sim::faults::{ErrorRule, FaultConfig};
use machine_driver::Driver;
use serde_json::json;

use common::{ready, request, sim, sim_driver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_simulate_numbers_are_invalid_arguments_naming_the_field() {
    let (_sim, client) = sim().await;
    let driver = sim_driver(&client, Duration::from_millis(100));
    for bad in [json!(1e300), json!(-5), json!(1e6), json!("soon")] {
        let req = request("m-bad", json!({"simulate": {"readyDelaySeconds": bad}}));
        let err = driver.create_machine(&req).await.expect_err("refused");
        assert_eq!(err.code, Code::InvalidArgument, "{bad}");
        assert!(
            err.message
                .starts_with("providerSpec.simulate.readyDelaySeconds: "),
            "{}",
            err.message
        );
        let err = driver.get_machine_status(&req).await.expect_err("refused");
        assert_eq!(err.code, Code::InvalidArgument);
    }
    // Nothing was made for the refused requests.
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(vms.get_opt("sim-vm-m-bad").await.expect("get").is_none());
    // Deletion is never blocked by a bad block.
    let req = request("m-bad", json!({"simulate": {"readyDelaySeconds": 1e300}}));
    assert_eq!(
        driver.delete_machine(&req).await.expect_err("no VM").code,
        Code::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_without_its_node_is_not_created_and_a_retried_create_finishes_it() {
    let (sim, client) = sim().await;
    let driver = sim_driver(&client, Duration::from_millis(100));
    let req = request("m-1", json!({}));
    // Every Node write fails: the VM is recorded, its Node is not.
    sim.set_faults(FaultConfig {
        errors: vec![ErrorRule {
            verbs: vec!["create".into(), "patch".into()],
            resources: vec!["nodes".into(), "nodes/status".into()],
            rate: 1.0,
            code: 500,
            retry_after_seconds: 0,
        }],
        ..FaultConfig::default()
    });
    let err = driver
        .create_machine(&req)
        .await
        .expect_err("node write fails");
    assert_eq!(err.code, Code::Unavailable);
    assert!(err.message.contains("register node"), "{}", err.message);
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(vms.get_opt("sim-vm-m-1").await.expect("get").is_some());
    assert_eq!(
        driver
            .get_machine_status(&req)
            .await
            .expect_err("a VM without its Node is not created")
            .code,
        Code::NotFound
    );

    sim.clear_faults();
    driver.create_machine(&req).await.expect("created on retry");
    driver.get_machine_status(&req).await.expect("now created");
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if nodes
            .get_opt("m-1")
            .await
            .expect("get")
            .is_some_and(|n| ready(&n).as_deref() == Some("True"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node never turned Ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_ready_survives_transient_errors() {
    let (sim, client) = sim().await;
    let driver = sim_driver(&client, Duration::from_millis(100));
    let req = request("m-2", json!({}));
    driver.create_machine(&req).await.expect("created");
    // Status writes fail for a while after creation: the Ready step keeps trying.
    sim.set_faults(FaultConfig {
        errors: vec![ErrorRule {
            verbs: vec!["patch".into()],
            resources: vec!["nodes/status".into()],
            rate: 1.0,
            code: 429,
            retry_after_seconds: 0,
        }],
        ..FaultConfig::default()
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(
        ready(&nodes.get("m-2").await.expect("node")).as_deref() != Some("True"),
        "the fault held the node back"
    );
    sim.clear_faults();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if ready(&nodes.get("m-2").await.expect("node")).as_deref() == Some("True") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node never turned Ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
