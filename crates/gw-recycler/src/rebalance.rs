//! The edge of rebalancing (`--rebalance`, server side only): observe where the SliceGateway's
//! gateway pods run and how many gateway nodes are usable, let `gw-recycler-core` pick the
//! crowded deployment, and create its recycle on the hub with the trigger's names and labels. A
//! finished recycle holding the name makes way (the reference's rebalancing deletes finished CRs
//! too; Capstan otherwise deletes them after `--retention`). **Decision**: a failed recycle of the
//! SliceGateway is retried at most once per `--retention` after its failure, said in a Warning
//! Event `RebalanceHeld` (the reference deletes and recreates it on every pass, losing why it
//! failed). The client deployment is read from the peer its gateway sidecar named in
//! `gatewayPodStatus[].peerPodName`, never guessed from the instance number (see
//! [`gw_recycler_core::rebalance`]).

use capstan_apis::networking::{HostType, LABEL_SLICE_GW_DEP, SliceGateway};
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_runtime::kube_errors::is_not_found;
use gw_recycler_core::rebalance::{
    FailedRecycle, PodPlacement, Rebalance, RebalanceFacts, failed_recycle, pick_pair_to_rebalance,
};
use gw_recycler_core::{State, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use crate::error::ReconcileError;
use crate::recycler::{Recycler, state_since};
use crate::trigger::new_recycler;
use crate::world::{World, label, slice_of};

/// The facts rebalancing decides on for `gateway`, whose peers are `remote`'s pods.
pub fn observe(world: &World, gateway: &SliceGateway, remote: &str) -> RebalanceFacts {
    let name = gateway.name_any();
    let gateway_nodes = world.nodes.as_ref().map_or(0, |nodes| {
        nodes
            .state()
            .iter()
            .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true))
            .count()
    });
    let pods = world
        .gateway_pods(&name)
        .iter()
        .filter_map(|pod| {
            Some(PodPlacement {
                deployment: label(pod.as_ref(), LABEL_SLICE_GW_DEP)?.to_owned(),
                node: pod.spec.as_ref()?.node_name.clone().unwrap_or_default(),
                peer_pod: gateway.peer_of(&pod.name_any()).map(str::to_owned),
            })
        })
        .collect();
    RebalanceFacts {
        pods,
        gateway_nodes,
        recycle_in_progress: world.recycle_in_progress(&name).is_some(),
        remote_gateway: remote.to_owned(),
    }
}

/// Starts a recycle of `gateway`'s crowded deployment, if any (server-side gateways only: the
/// server owns the recycle).
pub async fn reconcile(
    world: &World,
    recycler: &Recycler,
    gateway: &SliceGateway,
) -> Result<(), ReconcileError> {
    if gateway.host_type() != Some(&HostType::Server) {
        return Ok(());
    }
    let name = gateway.name_any();
    let field = |field| ReconcileError::GatewayField {
        gateway: name.clone(),
        field,
    };
    let remote = gateway
        .config()
        .and_then(|c| c.slice_gateway_remote_gateway_id.clone())
        .filter(|r| !r.is_empty());
    let decision =
        pick_pair_to_rebalance(&observe(world, gateway, remote.as_deref().unwrap_or("")));
    let (deployment, client, remote) = match (decision, remote) {
        (Rebalance::Stay, _) => return Ok(()),
        // Without it no peer can be told apart; a pair to recycle needs one.
        (_, None) => return Err(field("status.config.sliceGatewayRemoteGatewayId")),
        (Rebalance::PeerUnknown { node }, Some(_)) => {
            tracing::debug!(%node, "rebalancing: the node holds more than its share, but no gateway pod there has a peerPodName yet (its sidecar's GetSliceGwRemotePodName)");
            return Ok(());
        }
        (Rebalance::Recycle { server, client }, Some(remote)) => (server, client, remote),
    };
    let slice = slice_of(gateway).ok_or_else(|| field("slice name"))?;
    let cr = new_recycler(
        &recycler.hub_namespace,
        &slice,
        &name,
        &remote,
        &deployment,
        &client,
    );
    let api: Api<WorkerSliceGwRecycler> =
        Api::namespaced(recycler.hub.clone(), &recycler.hub_namespace);
    let failed = |source| ReconcileError::TriggerRebalance {
        deployment: deployment.clone(),
        source,
    };
    let recyclers = world.recyclers.state();
    // A failed recycle of this gateway: left alone for a retention, then replaced.
    let failure = recyclers
        .iter()
        .find(|c| c.state() == State::Error && c.involves(&name));
    if let Some(failure) = failure {
        let now = Timestamp::now();
        match failed_recycle(state_since(failure), recycler.timing.retention, now) {
            FailedRecycle::Hold { until } => {
                return recycler
                    .hold_rebalancing(world, failure, &deployment, until)
                    .await;
            }
            FailedRecycle::Retry => {
                tracing::info!(failed = %failure.name_any(), %deployment, "rebalancing: the failed recycle's retention has passed, retrying");
                delete_exactly(&api, failure).await.map_err(failed)?;
            }
        }
    }
    // A finished recycle of the same deployment holds the name: it makes way.
    if let Some(finished) = recyclers
        .iter()
        .find(|c| c.name_any() == deployment && c.state() == State::End)
    {
        delete_exactly(&api, finished).await.map_err(failed)?;
    }
    // A conflict (someone else started it first, or the deletion is still pending) fails this
    // pass too: the retry sees the recycle, or the name free.
    api.create(&PostParams::default(), &cr)
        .await
        .map_err(failed)?;
    tracing::info!(%deployment, %client, "rebalancing: recycle created");
    Ok(())
}

/// Deletes `cr` itself (uid and resourceVersion as preconditions): never a recycle someone
/// created under its name since the cache saw it.
async fn delete_exactly(
    api: &Api<WorkerSliceGwRecycler>,
    cr: &WorkerSliceGwRecycler,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: cr.uid(),
            resource_version: cr.resource_version(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&cr.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}
