//! `--rebalance` against kube-sim: the server worker's two gateway pods run on one node; a second
//! node labelled `kubeslice.io/node-type=gateway` appears, so that node holds more than its share
//! (ceil(2/2) = 1) and the real binary starts exactly one recycle, with the trigger's names and
//! labels, and no second one while it runs. The tunnels pair the instances crosswise (server 0
//! with client 1), as a client's choice of node port can: the recycle's client is the peer the
//! server pod's sidecar names, not the client deployment of the same instance.

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use capstan_scenarios::slice::{
    CLIENT_GW, HUB_NS, NS, SERVER_GW, Testbed, WAIT, Worker, add_gateway_node, gateway_pod_nodes,
    label_gateway_node, set_tunnel_peer,
};
use capstan_testkit::eventually;
use capstan_testkit_sim::SimCluster;

async fn pod(worker: &Worker, deployment: &str) -> (String, String) {
    eventually(&format!("the pod of {deployment}"), WAIT, || {
        worker.pod_of(deployment)
    })
    .await
}

async fn recyclers(hub: &SimCluster) -> Vec<WorkerSliceGwRecycler> {
    let api: Api<WorkerSliceGwRecycler> = Api::namespaced(hub.client.clone(), HUB_NS);
    api.list(&ListParams::default())
        .await
        .expect("recyclers")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_more_than_its_share_of_gateway_pods_gets_one_recycle() {
    let Testbed {
        hub,
        server,
        client,
    } = Testbed::start(88).await;
    let gateways: Api<SliceGateway> = Api::namespaced(server.cluster.client.clone(), NS);
    // As kubeslice-controller configures it; the memory sidecars reach their peers through the
    // tunnel peer IPs set below, not this address.
    let remote = json!({"status": {"config": {
        "sliceGatewayRemoteGatewayId": CLIENT_GW,
        "sliceGatewayRemoteVpnIp": "10.0.0.2",
    }}});
    gateways
        .patch_status(SERVER_GW, &PatchParams::default(), &Patch::Merge(&remote))
        .await
        .expect("remote gateway id and VPN IP");
    let _recycler = server.spawn_recycler(&hub, &["--rebalance"]).await;
    let _client_recycler = client.spawn_recycler(&hub, &[]).await;

    // Server instance 0's tunnel reaches client instance 1 and the other way round; the server's
    // gateway reconciler publishes each pod's peer as its sidecar names it.
    let (server_0, server_0_ip) = pod(&server, "red-a-b-0-0").await;
    let (_, server_1_ip) = pod(&server, "red-a-b-1-0").await;
    let (client_0, client_0_ip) = pod(&client, "red-b-a-0-0").await;
    let (client_1, client_1_ip) = pod(&client, "red-b-a-1-0").await;
    set_tunnel_peer(&server_0_ip, &client_1_ip).await;
    set_tunnel_peer(&server_1_ip, &client_0_ip).await;
    eventually("the server pods' peers published", WAIT, || async {
        let gateway = gateways.get(SERVER_GW).await.ok()?;
        let peer = |pod: &str| {
            gateway
                .gateway_pods()
                .iter()
                .find(|i| i.pod_name.as_deref() == Some(pod))
                .and_then(|i| i.peer_pod_name.clone())
        };
        (peer(&server_0).as_deref() == Some(client_1.as_str())
            && gateway
                .gateway_pods()
                .iter()
                .all(|i| i.peer_pod_name.is_some()))
        .then_some(())
    })
    .await;
    assert_ne!(client_0, client_1);

    // Both gateway pods land on kube-sim's only node; label it a gateway node: one usable node,
    // no rebalancing.
    let crowded = eventually("two gateway pods on one node", WAIT, || async {
        let nodes = gateway_pod_nodes(&server.cluster.client, NS, SERVER_GW).await;
        (nodes.len() == 2 && nodes[0] == nodes[1]).then(|| nodes[0].clone())
    })
    .await;
    label_gateway_node(&server.cluster.client, &crowded).await;

    // A second gateway node: the first now holds 2 > ceil(2/2).
    add_gateway_node(&server.cluster.client, "gateway-2").await;

    let cr = eventually("a rebalancing recycle on the hub", WAIT, || async {
        recyclers(&hub).await.into_iter().next()
    })
    .await;
    assert_eq!(cr.metadata.name.as_deref(), Some("red-a-b-0-0"));
    assert_eq!(cr.spec.slice_gw_server.as_deref(), Some("red-a-b"));
    assert_eq!(cr.spec.slice_gw_client.as_deref(), Some("red-b-a"));
    let pair = cr.spec.gw_pair.clone().expect("gwPair");
    assert_eq!(pair.server_id.as_deref(), Some("red-a-b-0-0"));
    assert_eq!(
        pair.client_id.as_deref(),
        Some("red-b-a-1-0"),
        "the client is server 0's peer, as its sidecar named it"
    );
    let labels = cr.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("slice_name").map(String::as_str), Some("red"));
    assert_eq!(
        labels.get("slicegw_name").map(String::as_str),
        Some("red-a-b")
    );

    // The recycle runs (the server asks for the new deployment and the gateway reconciler
    // creates it: more events on the gateway) and no second recycle starts meanwhile.
    let deployments: Api<Deployment> = Api::namespaced(server.cluster.client.clone(), NS);
    eventually("the recycle's new gateway deployment", WAIT, || async {
        deployments.get_opt("red-a-b-0-1").await.ok().flatten()
    })
    .await;
    let all = recyclers(&hub).await;
    assert_eq!(
        all.len(),
        1,
        "at most one recycle per SliceGateway: {all:?}"
    );
}
