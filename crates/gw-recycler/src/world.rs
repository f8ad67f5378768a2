//! What the recycler and the gateway reconciler observe: watch-fed caches of the hub's
//! WorkerSliceGwRecyclers and the worker's SliceGateways, gateway Deployments and Pods, plus
//! lookups over them, including which objects a change of another concerns.

use std::collections::HashSet;
use std::sync::Arc;

use capstan_apis::networking::{
    LABEL_EXCLUDE_GW_ROUTE, LABEL_MARKED_FOR_DELETION, LABEL_NSM_IMPL, LABEL_POD_TYPE,
    LABEL_SLICE_GW, LABEL_SLICE_GW_DEP, POD_TYPE_SLICEGATEWAY, SliceGateway,
    slice_router_impl_label,
};
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_runtime::own_writes::OwnWrites;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

/// The caches, cheap to clone. The controllers' watches fill them (see `run_controllers`).
/// Each kind this process writes shows its own last write until the watch brings it back, so a
/// pass right after a write (of either controller) decides on what was written, not on the
/// version before it.
#[derive(Clone)]
pub struct World {
    /// The worker namespace the SliceGateways, Deployments and Pods are watched in.
    pub namespace: String,
    pub recyclers: Arc<OwnWrites<WorkerSliceGwRecycler>>,
    pub gateways: Arc<OwnWrites<SliceGateway>>,
    pub deployments: Arc<OwnWrites<Deployment>>,
    pub pods: Arc<OwnWrites<Pod>>,
    /// The worker's Nodes, watched only with `--rebalance`.
    pub nodes: Option<Store<Node>>,
}

/// The watch of the gateway Deployments: only those labelled as gateway pods' deployments.
pub fn gateway_deployments() -> watcher::Config {
    watcher::Config::default().labels(&format!("{LABEL_POD_TYPE}={POD_TYPE_SLICEGATEWAY}"))
}

impl World {
    /// Waits until every cache the recycles need holds its first list. Not the Nodes: until they
    /// are listed (or when the ServiceAccount may not list them) rebalancing sees no usable
    /// node and does nothing, while everything else works.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.recyclers.store().wait_until_ready().await?;
        self.gateways.store().wait_until_ready().await?;
        self.deployments.store().wait_until_ready().await?;
        self.pods.store().wait_until_ready().await?;
        Ok(())
    }

    /// The SliceGateways a pod concerns: a gateway pod its own, a slice router every gateway of
    /// its slice (their next hops go to it).
    pub fn gateways_of_pod(&self, pod: &Pod) -> Vec<String> {
        if let Some(gateway) = label(pod, LABEL_SLICE_GW) {
            return vec![gateway.to_owned()];
        }
        let Some(router_of) = label(pod, LABEL_NSM_IMPL) else {
            return Vec::new();
        };
        self.gateways
            .state()
            .iter()
            .filter(|g| slice_of(g).is_some_and(|s| slice_router_impl_label(&s) == router_of))
            .filter_map(|g| g.metadata.name.clone())
            .collect()
    }

    /// The unfinished recycles naming one of `gateways` as their server or client SliceGateway. A
    /// finished one waits only for its retention (a timer), so gateway changes need not wake it.
    pub fn recyclers_of(&self, gateways: &[String]) -> Vec<ObjectRef<WorkerSliceGwRecycler>> {
        self.recyclers
            .state()
            .iter()
            .filter(|cr| gateways.iter().any(|g| cr.in_progress_for(g)))
            .map(|cr| ObjectRef::from_obj(cr.as_ref()))
            .collect()
    }

    /// The unfinished recycle of SliceGateway `gateway`, if any.
    pub fn recycle_in_progress(&self, gateway: &str) -> Option<Arc<WorkerSliceGwRecycler>> {
        self.recyclers
            .state()
            .into_iter()
            .find(|cr| cr.in_progress_for(gateway))
    }

    pub fn gateway(&self, name: &str) -> Option<Arc<SliceGateway>> {
        self.gateways
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    pub fn deployment(&self, name: &str) -> Option<Arc<Deployment>> {
        self.deployments
            .get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The IPs of every pod in the cache, whatever its phase: the sidecars worth a channel.
    pub fn pod_ips(&self) -> HashSet<String> {
        self.pods.state().iter().filter_map(|p| pod_ip(p)).collect()
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

    /// The incarnation and IP of the slice's Running router pod (a replaced pod may reuse the IP).
    pub fn router(&self, slice: &str) -> Option<(String, String)> {
        self.running_pods(LABEL_NSM_IMPL, &slice_router_impl_label(slice))
            .into_iter()
            .find_map(|p| Some((incarnation(&p), pod_ip(&p)?)))
    }
}

/// What changes whenever the pod's processes may have lost their state: its uid (a replaced pod)
/// and its containers' restart counts (a container restarted in place, e.g. after kill -9, starts
/// with an empty memory backend), so next hops are pushed again to a fresh router.
pub fn incarnation(pod: &Pod) -> String {
    let restarts: i64 = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| cs.iter().map(|c| i64::from(c.restart_count)).sum());
    format!(
        "{}/{restarts}",
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

pub fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

/// Running, not deleting, with an IP: the pods the decisions see.
pub fn is_running(pod: &Pod) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, restarts: &[i32]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "router", "uid": uid},
            "status": {"containerStatuses": restarts.iter().map(|r| serde_json::json!({
                "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": r
            })).collect::<Vec<_>>()}
        }))
        .expect("pod")
    }

    fn recycle(name: &str, state: &str) -> WorkerSliceGwRecycler {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": name, "namespace": "hub"},
            "spec": {"sliceGwServer": "red-s", "sliceGwClient": "red-c", "state": state}
        }))
        .expect("recycle")
    }

    fn store_of<K>(objects: Vec<K>) -> Arc<OwnWrites<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (reader, mut writer) = reflector::store();
        for obj in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(obj));
        }
        Arc::new(OwnWrites::new(
            reader,
            capstan_runtime::own_writes::DEFAULT_TTL,
        ))
    }

    #[test]
    fn gateway_changes_wake_only_unfinished_recycles() {
        let world = World {
            namespace: "ns".to_string(),
            recyclers: store_of(vec![
                recycle("running", "slicerouter_updated_state"),
                recycle("ended", "end"),
                recycle("failed", "error_state"),
            ]),
            gateways: store_of(vec![]),
            deployments: store_of(vec![]),
            pods: store_of(vec![]),
            nodes: None,
        };
        for side in ["red-s", "red-c"] {
            let woken: Vec<String> = world
                .recyclers_of(&[side.to_string()])
                .into_iter()
                .map(|r| r.name)
                .collect();
            assert_eq!(woken, ["running"], "a change of {side}");
        }
        assert!(world.recyclers_of(&["blue-s".to_string()]).is_empty());
    }

    fn gateway_pod(name: &str, rv: &str, labels: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        }))
        .expect("pod")
    }

    #[tokio::test]
    async fn a_label_this_process_wrote_is_seen_before_its_watch_event() {
        let dep = serde_json::json!({LABEL_SLICE_GW_DEP: "red-s-0-0"});
        let world = World {
            namespace: "ns".to_string(),
            recyclers: store_of(vec![]),
            gateways: store_of(vec![]),
            deployments: store_of(vec![]),
            pods: store_of(vec![gateway_pod("gw", "5", dep.clone())]),
            nodes: None,
        };
        let excluded = |world: &World| {
            world
                .deployment_pods("red-s-0-0")
                .iter()
                .map(|p| is_excluded(p))
                .collect::<Vec<_>>()
        };
        assert_eq!(excluded(&world), [false]);
        let mut labels = dep;
        labels[LABEL_EXCLUDE_GW_ROUTE] = "true".into();
        let cached = gateway_pod("gw", "5", serde_json::json!({}));
        let answered = gateway_pod("gw", "6", labels);
        world
            .pods
            .write(&cached, async {
                Ok::<_, std::convert::Infallible>(answered)
            })
            .await
            .expect("write");
        assert_eq!(
            excluded(&world),
            [true],
            "the pass after the write sees the label, not the cached pod"
        );
    }

    #[test]
    fn lookups_by_name_find_the_objects_of_the_worker_namespace() {
        let deployment = |name: &str, ns: &str| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns}
            }))
            .expect("deployment")
        };
        let world = World {
            namespace: "ns".to_string(),
            recyclers: store_of(vec![]),
            gateways: store_of(vec![]),
            deployments: store_of(vec![
                deployment("red-s-0-0", "ns"),
                deployment("other", "elsewhere"),
            ]),
            pods: store_of(vec![]),
            nodes: None,
        };
        assert!(world.deployment("red-s-0-0").is_some());
        assert!(world.deployment("red-s-0-1").is_none());
        assert!(world.deployment("other").is_none(), "another namespace's");
        assert!(world.gateway("red-s").is_none());
    }

    #[test]
    fn a_container_restart_or_a_new_pod_is_a_new_incarnation() {
        let first = incarnation(&pod("u1", &[0, 0]));
        assert_eq!(first, incarnation(&pod("u1", &[0, 0])));
        assert_ne!(first, incarnation(&pod("u1", &[0, 1])));
        assert_ne!(first, incarnation(&pod("u2", &[0, 0])));
    }
}
