//! The reference's helper operations on the local worker cluster, performing one
//! [`Work`] of the decisions: CreateNewDeployment, MarkGwRouteForDeletion,
//! TriggerGwDeploymentDeletion. Each is idempotent; list edits carry the resourceVersion they
//! were computed from, so a concurrent edit fails with a conflict and is redone on the next pass.
//! Every write goes through the [`World`]'s stand-ins: the next pass (and the gateway
//! reconciler, woken at once) sees it before its watch event arrives.

use capstan_apis::networking::{LABEL_EXCLUDE_GW_ROUTE, LABEL_MARKED_FOR_DELETION, SliceGateway};
use gw_recycler_core::decide::Work;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::ReconcileError;
use crate::sidecars::Sidecars;
use crate::world::{World, pod_ip, remote_subnet, slice_of};
use capstan_runtime::lean::LeanApi;

/// The local side of a recycle: its cluster, namespace and SliceGateway.
pub struct LocalSide<'a> {
    pub client: &'a kube::Client,
    pub namespace: &'a str,
    pub gateway: &'a str,
    pub world: &'a World,
    pub sidecars: &'a Sidecars,
    pub manager: &'a str,
}

impl LocalSide<'_> {
    pub async fn perform(&self, work: &Work) -> Result<(), ReconcileError> {
        match work {
            Work::CreateNewDeployment { deployment } => {
                self.edit_intermediate(|list| {
                    if !list.contains(deployment) {
                        list.push(deployment.clone());
                    }
                })
                .await
            }
            Work::MarkGwRouteForDeletion { deployment, nsm_ip } => {
                self.mark_route_for_deletion(deployment, nsm_ip.as_deref())
                    .await
            }
            Work::TriggerGwDeploymentDeletion { old, new } => {
                // Independent writes: the gateway reconciler deletes a marked deployment once
                // another of its instance stays, whatever the intermediate list says.
                let regular = self.edit_intermediate(|list| list.retain(|d| d != new));
                let mark = async {
                    let Some(deployment) = self.world.deployment(old) else {
                        return Ok(());
                    };
                    let deployments = LeanApi::new(Api::<Deployment>::namespaced(
                        self.client.clone(),
                        self.namespace,
                    ));
                    let patch =
                        json!({"metadata": {"labels": {LABEL_MARKED_FOR_DELETION: "true"}}});
                    let params = self.params();
                    let patch = Patch::Merge(&patch);
                    let write = deployments.patch(old, &params, &patch);
                    self.world
                        .deployments
                        .write(&deployment, write)
                        .await
                        .map(drop)
                        .map_err(|source| ReconcileError::MarkForDeletion {
                            deployment: old.clone(),
                            source,
                        })
                };
                futures::try_join!(regular, mark).map(drop)
            }
        }
    }

    fn params(&self) -> PatchParams {
        write_params(self.manager)
    }

    /// Edits `status.config.sliceGatewayIntermediateDeployments` of the current SliceGateway, as
    /// the cache holds it: one request, guarded by the cached resourceVersion. A cache behind
    /// the server fails with a conflict, which the controller retries soon (the watch brings
    /// the newer object); an edit the cache already shows writes nothing.
    async fn edit_intermediate(
        &self,
        edit: impl FnOnce(&mut Vec<String>),
    ) -> Result<(), ReconcileError> {
        let gateway = self
            .world
            .gateway(self.gateway)
            .ok_or_else(|| ReconcileError::GatewayMissing(self.gateway.to_owned()))?;
        let before = gateway.intermediate_deployments().to_vec();
        let mut list = before.clone();
        edit(&mut list);
        if list == before {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"resourceVersion": gateway.metadata.resource_version},
            "status": {"config": {"sliceGatewayIntermediateDeployments": list}}
        });
        let api = LeanApi::new(Api::<SliceGateway>::namespaced(
            self.client.clone(),
            self.namespace,
        ));
        let params = self.params();
        let patch = Patch::Merge(&patch);
        let write = api.patch_status(self.gateway, &params, &patch);
        self.world
            .gateways
            .write(&gateway, write)
            .await
            .map_err(|source| ReconcileError::EditIntermediate {
                gateway: self.gateway.to_owned(),
                source,
            })?;
        Ok(())
    }

    async fn mark_route_for_deletion(
        &self,
        deployment: &str,
        nsm_ip: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let pods = LeanApi::new(Api::<Pod>::namespaced(self.client.clone(), self.namespace));
        for pod in self.world.deployment_pods(deployment) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let patch = json!({"metadata": {"labels": {LABEL_EXCLUDE_GW_ROUTE: "true"}}});
            let params = self.params();
            let patch = Patch::Merge(&patch);
            let write = pods.patch(&name, &params, &patch);
            self.world
                .pods
                .write(&pod, write)
                .await
                .map_err(|source| ReconcileError::ExcludeGatewayPod { pod: name, source })?;
        }
        let Some(nsm_ip) = nsm_ip else {
            return Ok(());
        };
        let gateway = self
            .world
            .gateway(self.gateway)
            .ok_or_else(|| ReconcileError::GatewayMissing(self.gateway.to_owned()))?;
        let (router, subnet) = self.router_and_subnet(&gateway)?;
        self.sidecars
            .withdraw_route(&router, &subnet, nsm_ip)
            .await
            .map_err(|source| ReconcileError::WithdrawRoute {
                router,
                nsm_ip: nsm_ip.to_owned(),
                source,
            })?;
        Ok(())
    }

    /// The slice router's IP and the remote subnet of `gateway`.
    pub fn router_and_subnet(
        &self,
        gateway: &SliceGateway,
    ) -> Result<(String, String), ReconcileError> {
        let field = |field| ReconcileError::GatewayField {
            gateway: self.gateway.to_owned(),
            field,
        };
        let slice = slice_of(gateway).ok_or_else(|| field("slice name"))?;
        let subnet = remote_subnet(gateway)
            .ok_or_else(|| field("status.config.sliceGatewayRemoteSubnet"))?;
        let router = self
            .world
            .router_ip(&slice)
            .ok_or(ReconcileError::RouterMissing(slice))?;
        Ok((router, subnet))
    }
}

/// The NSM IP of gateway pod `pod` as `gateway` publishes it in `gatewayPodStatus` (`None`: not
/// published yet, or empty), where the reference's recycler reads it too
/// (`GetNsmIPsForGwDeployment`). The gateway reconciler publishes each sidecar's `GetStatus`
/// answer there, and keeps the last good one while the sidecar is away, so a sick gateway's route
/// is still known by it. A recycle never asks the sidecar itself: the route via a new gateway
/// (what its step waits for next) is pushed only once the gateway reconciler has that answer,
/// published in the same pass, and that write wakes the recycle.
pub fn published_nsm_ip(pod: &Pod, gateway: Option<&SliceGateway>) -> Option<String> {
    let ip = pod_ip(pod)?;
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    gateway?
        .published_pod(name, &ip)?
        .nsm_ip()
        .map(str::to_owned)
}

/// Merge-patch parameters naming our field manager.
pub fn write_params(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    }
}
