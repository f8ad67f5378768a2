//! The floor of one recycle: its critical path, which runs through the client side (the server waits
//! for each client response before its next state), as one sum:
//! - 8 hub writes, each seen by the other side's watch: the trigger's create, the server's 4 state
//!   writes (new_deployment_created, slicerouter_updated, old_deployment_deleted, end) and the
//!   client's 3 responses. Each is what hands the recycle from one process to the other.
//! - 3 SliceGateway status writes seen by a watch: the server's and the client's intermediate
//!   deployment append (CreateNewDeployment), the client's removal (TriggerGwDeploymentDeletion).
//! - 1 gateway start: Deployment create until its pod is Running and its `gw-sidecar` answers
//!   `GetStatus` with an NSM IP (GetNsmIPForNewDeployment cannot succeed sooner).
//! - 4 router gRPC calls: `UpdateSliceGwConnectionContext` (the new next hop), `GetRouteInKernel`
//!   (route present), `UpdateEcmpRoutes` (old hop withdrawn), `GetRouteInKernel` (route gone).
//! - 1 Pod label (exclude-gw-route), 1 Deployment label (marked-for-deletion) and the Deployment
//!   delete, each seen by a watch.
//!
//! Each round trip type is the median of `--samples` measurements, taken with the same clients
//! (kube, tonic) the controller uses, against the client worker's kube-sim and sidecars.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{FLOOR_NS, IMAGE, SLICE, TIMEOUT, channel, from_json, running_ip, running_pod_ips};
use crate::cluster::Cluster;
use crate::report::median;

/// The recycle's unavoidable round trips, each the median of its samples.
pub struct Floor {
    hub_write: Duration,
    gateway_status_write: Duration,
    gateway_start: Duration,
    set_next_hops: Duration,
    route_check: Duration,
    withdraw_route: Duration,
    pod_label: Duration,
    deployment_label: Duration,
    deployment_delete: Duration,
}

impl Floor {
    /// Each part as (what, how many in a recycle, median time).
    pub fn parts(&self) -> [(&'static str, u32, Duration); 9] {
        [
            (
                "hub WorkerSliceGwRecycler write seen by a watch",
                8,
                self.hub_write,
            ),
            (
                "SliceGateway status write seen by a watch",
                3,
                self.gateway_status_write,
            ),
            (
                "gateway Deployment create to GetStatus answered",
                1,
                self.gateway_start,
            ),
            (
                "router UpdateSliceGwConnectionContext",
                1,
                self.set_next_hops,
            ),
            ("router GetRouteInKernel", 2, self.route_check),
            ("router UpdateEcmpRoutes", 1, self.withdraw_route),
            ("Pod label seen by a watch", 1, self.pod_label),
            ("Deployment label seen by a watch", 1, self.deployment_label),
            (
                "Deployment delete seen by a watch",
                1,
                self.deployment_delete,
            ),
        ]
    }

    pub fn sum(&self) -> Duration {
        self.parts().iter().map(|(_, n, took)| *took * *n).sum()
    }

    /// Measures every part `samples` times on the client worker (and the hub), in a namespace
    /// gw-recycler does not watch, against the worker's real router sidecar.
    pub async fn measure(hub: &Cluster, worker: &Cluster, samples: usize) -> Result<Self> {
        let recyclers: Api<WorkerSliceGwRecycler> = Api::namespaced(hub.client.clone(), FLOOR_NS);
        let scratch = from_json::<WorkerSliceGwRecycler>(json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": "floor", "namespace": FLOOR_NS},
            "spec": {"sliceGwServer": "floor-s", "sliceGwClient": "floor-c",
                     "gwPair": {"serverId": "floor-s-0-0", "clientId": "floor-c-0-0"},
                     "state": "init", "request": "none", "sliceName": SLICE}
        }))?;
        recyclers.create(&PostParams::default(), &scratch).await?;
        let gateways: Api<SliceGateway> = Api::namespaced(worker.client.clone(), FLOOR_NS);
        let gw = json!({
            "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
            "metadata": {"name": "floor", "namespace": FLOOR_NS}, "spec": {"sliceName": SLICE}
        });
        gateways
            .create(&PostParams::default(), &from_json(gw)?)
            .await?;
        let router_ip = running_pod_ips(worker)
            .await?
            .remove("router")
            .context("router pod not Running")?;
        let mut router = SliceRouterSidecarServiceClient::new(channel(&router_ip)?);
        let deployments: Api<Deployment> = Api::namespaced(worker.client.clone(), FLOOR_NS);
        let pods: Api<Pod> = Api::namespaced(worker.client.clone(), FLOOR_NS);

        let mut parts: [Vec<Duration>; 9] = Default::default();
        for k in 0..samples.max(1) {
            let name = format!("floor-{k}");
            let subnet = format!("10.250.{k}.0/24");
            let (start, pod, ip) = gateway_start(&deployments, &pods, &name).await?;
            parts[2].push(start);
            let timed = Instant::now();
            router
                .update_slice_gw_connection_context(SliceGwConContext {
                    remote_slice_gw_nsm_subnet: subnet.clone(),
                    local_nsm_gw_peer_ip_list: vec![ip.clone()],
                    ..SliceGwConContext::default()
                })
                .await?;
            parts[3].push(timed.elapsed());
            let timed = Instant::now();
            let present = router
                .get_route_in_kernel(VerifyRouteAddRequest {
                    nsm_ip: ip.clone(),
                    dst_ip: subnet.clone(),
                })
                .await?
                .into_inner()
                .is_route_present;
            parts[4].push(timed.elapsed());
            if !present {
                bail!("the router does not route {subnet} via {ip} after setting it");
            }
            let label = |key: &str| json!({"metadata": {"labels": {key: "true"}}});
            let params = PatchParams::default();
            let exclude = label("kubeslice.io/exclude-gw-route");
            parts[6].push(
                observed(
                    &pods,
                    &pod,
                    pods.patch(&pod, &params, &Patch::Merge(&exclude)),
                )
                .await?,
            );
            let timed = Instant::now();
            router
                .update_ecmp_routes(EcmpUpdateInfo {
                    remote_slice_gw_nsm_subnet: subnet.clone(),
                    nsm_ip_to_remove: ip.clone(),
                })
                .await?;
            parts[5].push(timed.elapsed());
            let marked = label("kubeslice.io/marked-for-deletion");
            parts[7].push(
                observed(
                    &deployments,
                    &name,
                    deployments.patch(&name, &params, &Patch::Merge(&marked)),
                )
                .await?,
            );
            let intermediate = json!({"status": {"config": {
                "sliceGatewayIntermediateDeployments": [name.clone()]}}});
            parts[1].push(
                observed(
                    &gateways,
                    "floor",
                    gateways.patch_status("floor", &params, &Patch::Merge(&intermediate)),
                )
                .await?,
            );
            let state = json!({"spec": {"state": if k % 2 == 0 { "new_deployment_created_state" } else { "init" }}});
            parts[0].push(
                observed(
                    &recyclers,
                    "floor",
                    recyclers.patch("floor", &params, &Patch::Merge(&state)),
                )
                .await?,
            );
            parts[8].push(
                observed(
                    &deployments,
                    &name,
                    deployments.delete(&name, &DeleteParams::default()),
                )
                .await?,
            );
        }
        let [a, b, c, d, e, f, g, h, i] = parts.map(|samples| median(&samples));
        Ok(Self {
            hub_write: a,
            gateway_status_write: b,
            gateway_start: c,
            set_next_hops: d,
            route_check: e,
            withdraw_route: f,
            pod_label: g,
            deployment_label: h,
            deployment_delete: i,
        })
    }
}

/// Creates a gateway Deployment like gw-recycler's template (one replica running `gw-sidecar` on
/// the pod IP) and returns the time until its sidecar answers `GetStatus` with an NSM IP, the
/// pod's name and IP.
async fn gateway_start(
    deployments: &Api<Deployment>,
    pods: &Api<Pod>,
    name: &str,
) -> Result<(Duration, String, String)> {
    let labels = json!({"kubeslice.io/slice": SLICE, "kubeslice.io/pod-type": "slicegateway",
        "kubeslice.io/slicegw": "floor", "kubeslice.io/slice-gw": "floor",
        "kubeslice.io/slice-gw-dep": name});
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": FLOOR_NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"kubeslice.io/slice-gw-dep": name}},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "kubeslice-sidecar", "image": format!("{IMAGE}:bench"),
                "command": ["gw-sidecar"],
                "args": ["--backend", "memory", "--listen", "$(POD_IP):5000",
                         "--metrics-addr", "$(POD_IP):8080", "--nsm-ip", "$(POD_IP)",
                         "--tunnel-interface", "tun0", "--log-level", "warn"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
            }]}}
        }
    });
    let config = watcher::Config::default().labels(&format!("kubeslice.io/slice-gw-dep={name}"));
    let mut events = std::pin::pin!(
        watcher(pods.clone(), config)
            .default_backoff()
            .applied_objects()
    );
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &from_json(deployment)?)
        .await?;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let (pod, ip) = loop {
        let next = tokio::time::timeout_at(deadline, events.next())
            .await
            .with_context(|| format!("pod of {name} not Running"))?;
        let Some(pod) = next.transpose()? else {
            bail!("watch ended")
        };
        if let Some(ip) = running_ip(&pod) {
            break (pod.name_any(), ip);
        }
    };
    // The sidecar binds its port a moment after the process starts: retry as the recycler's
    // short backoff does, on a fresh channel per try (as the recycler's first call to a new pod).
    loop {
        let answer = GwSidecarServiceClient::new(channel(&ip)?)
            .get_status(())
            .await;
        if let Ok(status) = answer
            && status
                .into_inner()
                .nsm_intf_status
                .is_some_and(|n| !n.nsm_ip.is_empty())
        {
            return Ok((started.elapsed(), pod, ip));
        }
        if tokio::time::Instant::now() > deadline {
            bail!("gw-sidecar of {name} at {ip} never answered GetStatus");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The time from starting `write` until a watch already open on `name` sees its event.
async fn observed<K>(
    api: &Api<K>,
    name: &str,
    write: impl Future<Output = Result<impl Sized, kube::Error>>,
) -> Result<Duration>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let current = api.get(name).await?;
    let version = current.resource_version().unwrap_or_default();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = api.watch(&params, &version).await?.boxed();
    let started = Instant::now();
    write.await?;
    loop {
        let next = tokio::time::timeout(TIMEOUT, events.next())
            .await
            .with_context(|| format!("no watch event for {name}"))?;
        match next {
            Some(Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_))) => {
                return Ok(started.elapsed());
            }
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            Some(Ok(WatchEvent::Error(e))) => bail!("watch of {name}: {e:?}"),
            Some(Err(e)) => return Err(e.into()),
            None => bail!("watch of {name} ended"),
        }
    }
}
