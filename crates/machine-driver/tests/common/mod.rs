//! What the machine-driver suites share: kube-sim in this process, the request the machineclass
//! controller sends for a Machine, and a Node's Ready status as the simulated kubelet reports it.

#![allow(dead_code)]

use std::time::Duration;

use capstan_apis::machine::{Machine, MachineClass};
use k8s_openapi::api::core::v1::Node;
use machine_driver::MachineRequest;
use machine_driver::sim::{SimConfig, SimDriver};
use serde_json::json;

/// The simulated provider on `client`, in `default`, its Nodes turning Ready after `ready_delay`.
pub fn sim_driver(client: &kube::Client, ready_delay: Duration) -> SimDriver {
    SimDriver::new(
        client.clone(),
        SimConfig {
            namespace: "default".into(),
            ready_delay,
        },
    )
}

/// kube-sim with its defaults and its admin client.
pub async fn sim() -> (kube_sim::KubeSim, kube::Client) {
    let sim = kube_sim::KubeSim::start(kube_sim::Config::default())
        .await
        .expect("kube-sim starts");
    let client = sim.client().expect("client");
    (sim, client)
}

/// The request for Machine `default/<machine>` of MachineClass `default/mc` with
/// `provider_spec`, and a one-key credentials Secret (the simulator reads none of it; over gRPC it
/// travels all the same).
pub fn request(machine: &str, provider_spec: serde_json::Value) -> MachineRequest {
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
        secret_data: [("token".to_owned(), b"t".to_vec())].into(),
    }
}

/// The status of `node`'s Ready condition (`"True"`, `"False"`), if it has one.
pub fn ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}
