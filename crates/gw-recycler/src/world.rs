//! What the recycler and the gateway reconciler observe: watch-fed caches of the hub's
//! WorkerSliceGwRecyclers and the worker's SliceGateways, gateway Deployments and Pods, plus
//! lookups over them. Every watch event wakes the reconcile loop through one `Notify`.

use std::sync::Arc;

use capstan_apis::networking::{
    LABEL_EXCLUDE_GW_ROUTE, LABEL_MARKED_FOR_DELETION, LABEL_NSM_IMPL, LABEL_POD_TYPE,
    LABEL_SLICE_GW, LABEL_SLICE_GW_DEP, POD_TYPE_SLICEGATEWAY, SliceGateway,
    slice_router_impl_label,
};
use capstan_apis::worker::WorkerSliceGwRecycler;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

/// The caches, cheap to clone.
#[derive(Clone)]
pub struct World {
    pub recyclers: Store<WorkerSliceGwRecycler>,
    pub gateways: Store<SliceGateway>,
    pub deployments: Store<Deployment>,
    pub pods: Store<Pod>,
}

fn watch<K>(api: Api<K>, config: watcher::Config, wake: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(error) = event {
                tracing::warn!(%error, "watch error (retrying)");
            }
            wake.notify_one();
        }
    });
    reader
}

impl World {
    /// Starts the watches: recyclers in `hub_namespace` on the hub, the rest in `namespace` on
    /// the worker.
    pub fn watch(
        hub: &kube::Client,
        hub_namespace: &str,
        worker: &kube::Client,
        namespace: &str,
        wake: Arc<Notify>,
    ) -> Self {
        let gateway_deployments =
            watcher::Config::default().labels(&format!("{LABEL_POD_TYPE}={POD_TYPE_SLICEGATEWAY}"));
        Self {
            recyclers: watch(
                Api::namespaced(hub.clone(), hub_namespace),
                watcher::Config::default(),
                wake.clone(),
            ),
            gateways: watch(
                Api::namespaced(worker.clone(), namespace),
                watcher::Config::default(),
                wake.clone(),
            ),
            deployments: watch(
                Api::namespaced(worker.clone(), namespace),
                gateway_deployments,
                wake.clone(),
            ),
            pods: watch(
                Api::namespaced(worker.clone(), namespace),
                watcher::Config::default(),
                wake,
            ),
        }
    }

    /// Waits until every cache holds its first list.
    pub async fn ready(&self) -> anyhow::Result<()> {
        self.recyclers.wait_until_ready().await?;
        self.gateways.wait_until_ready().await?;
        self.deployments.wait_until_ready().await?;
        self.pods.wait_until_ready().await?;
        Ok(())
    }

    pub fn gateway(&self, name: &str) -> Option<Arc<SliceGateway>> {
        self.gateways
            .state()
            .into_iter()
            .find(|g| g.metadata.name.as_deref() == Some(name))
    }

    pub fn deployment(&self, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .state()
            .into_iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
    }

    /// The Running, not deleting pods labelled `key=value`.
    fn running_pods(&self, key: &str, value: &str) -> Vec<Arc<Pod>> {
        let mut pods: Vec<_> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| label(p.as_ref(), key) == Some(value) && is_running(p))
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pods
    }

    /// The Running pods of gateway deployment `deployment`.
    pub fn deployment_pods(&self, deployment: &str) -> Vec<Arc<Pod>> {
        self.running_pods(LABEL_SLICE_GW_DEP, deployment)
    }

    /// The Running gateway pods of SliceGateway `slicegw`.
    pub fn gateway_pods(&self, slicegw: &str) -> Vec<Arc<Pod>> {
        self.running_pods(LABEL_SLICE_GW, slicegw)
    }

    /// The IP of the slice's Running router pod.
    pub fn router_ip(&self, slice: &str) -> Option<String> {
        self.router(slice).map(|(_, ip)| ip)
    }

    /// The uid and IP of the slice's Running router pod (a replaced pod may reuse the IP).
    pub fn router(&self, slice: &str) -> Option<(String, String)> {
        self.running_pods(LABEL_NSM_IMPL, &slice_router_impl_label(slice))
            .into_iter()
            .find_map(|p| Some((p.metadata.uid.clone().unwrap_or_default(), pod_ip(&p)?)))
    }
}

pub fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

fn is_running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod_ip(pod).is_some()
}

pub fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

pub fn is_excluded(pod: &Pod) -> bool {
    label(pod, LABEL_EXCLUDE_GW_ROUTE) == Some("true")
}

pub fn is_marked_for_deletion(deployment: &Deployment) -> bool {
    label(deployment, LABEL_MARKED_FOR_DELETION) == Some("true")
}

/// The slice of a SliceGateway (`status.config.sliceName`, else `spec.sliceName`).
pub fn slice_of(gateway: &SliceGateway) -> Option<String> {
    gateway
        .config()
        .and_then(|c| c.slice_name.clone())
        .or_else(|| gateway.spec.slice_name.clone())
}

/// `status.config.sliceGatewayRemoteSubnet`.
pub fn remote_subnet(gateway: &SliceGateway) -> Option<String> {
    gateway
        .config()
        .and_then(|c| c.slice_gateway_remote_subnet.clone())
        .filter(|s| !s.is_empty())
}
