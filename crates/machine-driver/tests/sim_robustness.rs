//! The simulated provider under bad input and API faults: an out-of-range `providerSpec.simulate`
//! is refused naming the field (it used to panic the process), and a VM whose Node registration
//! failed is not reported as created, so a retried CreateMachine finishes it.

use std::time::Duration;

use capstan_apis::machine::{Code, Machine, MachineClass};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube_sim::faults::{ErrorRule, FaultConfig};
use machine_driver::sim::{SimConfig, SimDriver};
use machine_driver::{Driver, MachineRequest};
use serde_json::json;

async fn sim() -> (kube_sim::KubeSim, kube::Client) {
    let sim = kube_sim::KubeSim::start(kube_sim::Config::default())
        .await
        .expect("kube-sim starts");
    let client = sim.client().expect("client");
    (sim, client)
}

fn driver(client: &kube::Client) -> SimDriver {
    SimDriver::new(
        client.clone(),
        SimConfig {
            namespace: "default".into(),
            ready_delay: Duration::from_millis(100),
        },
    )
}

fn request(machine: &str, provider_spec: serde_json::Value) -> MachineRequest {
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": machine, "namespace": "default"},
        "spec": {"class": {"kind": "MachineClass", "name": "mc"}}
    }))
    .expect("machine");
    let class: MachineClass = serde_json::from_value(json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
        "metadata": {"name": "mc", "namespace": "default"},
        "providerSpec": provider_spec
    }))
    .expect("class");
    MachineRequest {
        machine,
        class,
        secret_data: Default::default(),
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_simulate_numbers_are_invalid_arguments_naming_the_field() {
    let (_sim, client) = sim().await;
    let driver = driver(&client);
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
    let driver = driver(&client);
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
            .is_some_and(|n| is_ready(&n))
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
    let driver = driver(&client);
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
        !is_ready(&nodes.get("m-2").await.expect("node")),
        "the fault held the node back"
    );
    sim.clear_faults();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if is_ready(&nodes.get("m-2").await.expect("node")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node never turned Ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
