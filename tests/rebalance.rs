//! `--rebalance` against kube-sim: the server worker's two gateway pods run on one node; a second
//! node labelled `kubeslice.io/node-type=gateway` appears, so that node holds more than its share
//! (ceil(2/2) = 1) and the real binary starts exactly one recycle, with the trigger's names and
//! labels, and no second one while it runs. The tunnels pair the instances crosswise (server 0
//! with client 1), as a client's choice of node port can: the recycle's client is the peer the
//! server pod's sidecar names, not the client deployment of the same instance. A failed recycle
//! of the gateway is left alone for `--retention` (one Warning `RebalanceHeld`), then retried once.

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::{State, WorkerSliceGwRecycler};
use capstan_gw_recycler::recycler::{ANNOTATION_FAILURE, ANNOTATION_REBALANCE_HELD_UNTIL};
use capstan_gw_recycler::trigger::new_recycler;
use capstan_testkit::process::BinaryUnderTest;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use capstan_scenarios::slice::{
    CLIENT_GW, HUB_NS, NS, SERVER_GW, SLICE, Testbed, WAIT, add_gateway_node, announced,
    configure_remote, gateway_pod_nodes, label_gateway_node, pair_gateways,
};
use capstan_testkit::eventually;

async fn recyclers(bed: &Testbed) -> Vec<WorkerSliceGwRecycler> {
    bed.recyclers()
        .list(&ListParams::default())
        .await
        .expect("recyclers")
        .items
}

/// A testbed whose gateway pods are paired crosswise (server instance 0's tunnel reaches client
/// instance 1, and the other way round), each server pod's peer published, with the server's
/// gw-recycler running `--rebalance` and `extra` and the client's running too. All gateway pods
/// are on kube-sim's one node, not yet labelled a gateway node.
struct Paired {
    bed: Testbed,
    _server: BinaryUnderTest,
    _client: BinaryUnderTest,
}

impl Paired {
    async fn start(octet: u8, extra: &[&str]) -> Self {
        let bed = Testbed::start(octet).await;
        let gateways: Api<SliceGateway> = Api::namespaced(bed.server.cluster.client.clone(), NS);
        configure_remote(&bed.server.cluster.client).await;
        let args: Vec<&str> = ["--rebalance"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let server = bed.server.spawn_recycler(&bed.hub, &args).await;
        let client = bed.client.spawn_recycler(&bed.hub, &[]).await;

        let pairs = pair_gateways(
            &bed.server.cluster.client,
            &bed.client.cluster.client,
            &[
                ("red-a-b-0-0", "red-b-a-1-0"),
                ("red-a-b-1-0", "red-b-a-0-0"),
            ],
        )
        .await;
        let (server_0, client_1) = pairs[0].clone();
        assert_ne!(pairs[0].1, pairs[1].1);
        eventually("the server pods' peers published", WAIT, || async {
            let gateway = gateways.get(SERVER_GW).await.ok()?;
            (gateway.peer_of(&server_0) == Some(client_1.as_str())
                && gateway.gateway_pods().len() == 2
                && gateway
                    .gateway_pods()
                    .iter()
                    .all(|i| i.peer_pod_name.is_some()))
            .then_some(())
        })
        .await;
        Self {
            bed,
            _server: server,
            _client: client,
        }
    }

    /// Makes the pods' node a gateway node, then adds a second one: the first now holds 2 >
    /// ceil(2/2).
    async fn crowd(&self) {
        let client = &self.bed.server.cluster.client;
        let crowded = eventually("two gateway pods on one node", WAIT, || async {
            let nodes = gateway_pod_nodes(client, NS, SERVER_GW).await;
            (nodes.len() == 2 && nodes[0] == nodes[1]).then(|| nodes[0].clone())
        })
        .await;
        label_gateway_node(client, &crowded).await;
        add_gateway_node(client, "gateway-2").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_more_than_its_share_of_gateway_pods_gets_one_recycle() {
    let paired = Paired::start(88, &[]).await;
    let bed = &paired.bed;
    paired.crowd().await;

    let cr = eventually("a rebalancing recycle on the hub", WAIT, || async {
        recyclers(bed).await.into_iter().next()
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
    let deployments: Api<Deployment> = Api::namespaced(bed.server.cluster.client.clone(), NS);
    eventually("the recycle's new gateway deployment", WAIT, || async {
        deployments.get_opt("red-a-b-0-1").await.ok().flatten()
    })
    .await;
    let all = recyclers(bed).await;
    assert_eq!(
        all.len(),
        1,
        "at most one recycle per SliceGateway: {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rebalancing_recycle_is_held_for_its_retention_then_retried_once() {
    const RETENTION_SECS: u64 = 8;
    let retention = format!("{RETENTION_SECS}s");
    let paired = Paired::start(112, &["--retention", &retention]).await;
    let bed = &paired.bed;
    // The recycle rebalancing would start has failed before (as if there was no room elsewhere).
    let mut failed = new_recycler(
        HUB_NS,
        SLICE,
        SERVER_GW,
        CLIENT_GW,
        "red-a-b-0-0",
        "red-b-a-1-0",
    );
    failed.spec.state = Some(State::Error);
    failed.annotations_mut().insert(
        ANNOTATION_FAILURE.into(),
        "step new_deployment_created_state timed out: no room on another gateway node".into(),
    );
    let failed = bed
        .recyclers()
        .create(&PostParams::default(), &failed)
        .await
        .expect("a failed recycle");
    paired.crowd().await;

    // Held: said once, marked on the failed recycle, which stays as it is.
    eventually("a RebalanceHeld Warning", WAIT, || async {
        (announced(&bed.hub, "RebalanceHeld").await >= 1).then_some(())
    })
    .await;
    let held = eventually("the hold marked on the failed recycle", WAIT, || async {
        let cr = bed.recyclers().get("red-a-b-0-0").await.ok()?;
        cr.annotations()
            .contains_key(ANNOTATION_REBALANCE_HELD_UNTIL)
            .then_some(cr)
    })
    .await;
    assert_eq!(held.uid(), failed.uid(), "the failed recycle is kept");
    assert_eq!(held.state(), State::Error);

    // Its retention (from its creation) passes: replaced by one new recycle of the same pair.
    let retried = eventually("the failed recycle replaced by a new one", WAIT, || async {
        let cr = bed.recyclers().get("red-a-b-0-0").await.ok()?;
        (cr.uid() != failed.uid()).then_some(cr)
    })
    .await;
    let pair = retried.spec.gw_pair.clone().expect("gwPair");
    assert_eq!(pair.client_id.as_deref(), Some("red-b-a-1-0"));
    assert_ne!(retried.state(), State::Error);
    let created = |cr: &WorkerSliceGwRecycler| {
        cr.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .expect("created")
    };
    let (failed_at, created_after) = (created(&failed), created(&retried));
    assert!(
        created_after.duration_since(failed_at).as_secs() >= RETENTION_SECS as i64 - 1,
        "retried only after the retention: failed at {failed_at}, retried at {created_after}"
    );
    assert_eq!(
        announced(&bed.hub, "RebalanceHeld").await,
        1,
        "the hold is said once"
    );
    assert_eq!(recyclers(bed).await.len(), 1, "one recycle of the gateway");
}
