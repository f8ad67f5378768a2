//! The simulated provider reads its VMs and Nodes from its watches, not with GETs, and still sees
//! its own writes at once; a restarted driver finds the VMs the API holds.

mod common;

use std::time::Duration;

use capstan_apis::machine::Code;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::wait::await_condition;
use machine_driver::Driver;
use serde_json::json;

use common::{ready, request, sim, sim_driver};

/// GETs of VM ConfigMaps and Nodes kube-sim answered since `before`.
fn gets_since(sim: &kube_sim::KubeSim, before: &kube_sim::accounting::RequestStats) -> u64 {
    let delta = sim.requests().since(before);
    delta.count("get", "configmaps") + delta.count("get", "nodes")
}

async fn node_ready(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let condition = |node: Option<&Node>| node.and_then(ready).as_deref() == Some("True");
    tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(nodes, name, condition),
    )
    .await
    .expect("the node turns Ready")
    .expect("watch");
}

#[tokio::test]
async fn status_reads_the_cache_and_sees_the_drivers_own_writes() {
    let (sim, client) = sim().await;
    let driver = sim_driver(&client, Duration::ZERO);
    driver.cache_synced().await;
    let before = sim.requests();
    let req = request("m-1", json!({}));

    let missing = driver
        .get_machine_status(&req)
        .await
        .expect_err("no VM yet");
    assert_eq!(missing.code, Code::NotFound);
    driver.create_machine(&req).await.expect("created");
    // Right after the create, before the watch need have delivered anything.
    let status = driver
        .get_machine_status(&req)
        .await
        .expect("found at once");
    assert_eq!(
        (status.provider_id.as_str(), status.node_name.as_str()),
        ("sim:///default/m-1", "m-1")
    );
    // The watch-based wait makes no GETs of its own.
    node_ready(&client, "m-1").await;
    let status = driver.get_machine_status(&req).await.expect("found");
    assert_eq!(status.provider_id, "sim:///default/m-1");
    let delta = sim.requests().since(&before);
    assert_eq!(
        gets_since(&sim, &before),
        0,
        "status and the Ready task read the cache: {:?}",
        delta.by_verb_resource_code()
    );
    assert_eq!(delta.count("create", "configmaps"), 1, "one VM record");
    assert_eq!(
        delta.count("patch", "nodes/status"),
        2,
        "NotReady, then Ready"
    );

    // A deleted VM is gone at once for the driver that deleted it.
    driver.delete_machine(&req).await.expect("deleted");
    let gone = driver.get_machine_status(&req).await.expect_err("deleted");
    assert_eq!(gone.code, Code::NotFound);
}

#[tokio::test]
async fn a_restarted_driver_finds_the_vms_in_the_api_and_confirms_a_recorded_vm_is_gone() {
    let (sim, client) = sim().await;
    let first = sim_driver(&client, Duration::ZERO);
    let (req_a, req_b) = (request("m-a", json!({})), request("m-b", json!({})));
    first.create_machine(&req_a).await.expect("created");
    first.create_machine(&req_b).await.expect("created");
    node_ready(&client, "m-a").await;
    drop(first);

    let restarted = sim_driver(&client, Duration::ZERO);
    restarted.cache_synced().await;
    let before = sim.requests();
    let status = restarted.get_machine_status(&req_a).await.expect("resumed");
    assert_eq!(
        (status.provider_id.as_str(), status.node_name.as_str()),
        ("sim:///default/m-a", "m-a")
    );
    assert_eq!(
        gets_since(&sim, &before),
        0,
        "read from the re-listed cache"
    );

    // Someone else deletes m-b's VM record: a Machine that records the providerID gets NotFound
    // (from the watch, or from the API when the watch has not delivered the deletion yet).
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    vms.delete("sim-vm-m-b", &DeleteParams::default())
        .await
        .expect("deleted behind the driver's back");
    let mut recorded = req_b.clone();
    recorded.machine.spec.provider_id = Some("sim:///default/m-b".into());
    let gone = restarted
        .get_machine_status(&recorded)
        .await
        .expect_err("the VM is gone");
    assert_eq!(gone.code, Code::NotFound);
}
