//! Three kube-sims (hub, server worker, client worker) with Capstan's CRDs, a SliceGateway and a
//! slice router pod on each worker, and a stand-in kubelet that runs each pod's sidecar
//! (router-sidecar or gw-sidecar, memory backend, sidecar-shim's library) on the pod's IP:5000
//! until kube-sim runs containers itself.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit::process::contract::wait_ready;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube_sim::workloads::WorkloadOptions;
use kube_sim::{Config, KubeSim};
use prometheus_client::registry::Registry;
use serde_json::json;
use sidecar_shim::gw::memory::{MemoryGw, MemoryGwStatus, MemoryTunnel};
use sidecar_shim::gw::{GwSidecar, PeerConfig, PodIdentity};
use sidecar_shim::metrics::GrpcMetrics;
use sidecar_shim::router::RouterSidecar;
use sidecar_shim::router::memory::MemoryRouter;
use tempfile::NamedTempFile;
use tokio::sync::oneshot;

pub const BIN: &str = env!("CARGO_BIN_EXE_gw-recycler");
pub const HUB_NS: &str = "kubeslice-red";
pub const NS: &str = "kubeslice-system";
pub const SLICE: &str = "red";
pub const SERVER_GW: &str = "red-a-b";
pub const CLIENT_GW: &str = "red-b-a";
/// The remote subnets each side's router routes via its gateways.
pub const SERVER_REMOTE_SUBNET: &str = "10.2.0.0/16";
pub const CLIENT_REMOTE_SUBNET: &str = "10.1.0.0/16";

pub struct Cluster {
    pub sim: KubeSim,
    pub client: kube::Client,
    pub kubeconfig: NamedTempFile,
}

impl Cluster {
    /// kube-sim with workload simulation (pod IPs from `pod_cidr`), every Capstan CRD, and `namespace`.
    pub async fn start(pod_cidr: &str, namespace: &str) -> Self {
        let sim = KubeSim::start(Config {
            simulate_workloads: true,
            workloads: WorkloadOptions {
                pod_cidr: pod_cidr.into(),
                ..WorkloadOptions::default()
            },
            ..Config::default()
        })
        .await
        .expect("kube-sim starts");
        let client = sim.client().expect("client");
        capstan_testkit::install_capstan_crds(&client)
            .await
            .expect("Capstan's CRDs installed and Established");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("ns");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
        let kubeconfig = NamedTempFile::new().expect("temp file");
        sim.write_kubeconfig(kubeconfig.path())
            .expect("kubeconfig written");
        Self {
            sim,
            client,
            kubeconfig,
        }
    }

    pub fn kubeconfig_path(&self) -> &str {
        self.kubeconfig.path().to_str().expect("utf-8 temp path")
    }
}

/// A worker cluster with one SliceGateway of `host_type`, the slice router pod and the stand-in
/// kubelet.
pub struct Worker {
    pub cluster: Cluster,
    pub gateway: &'static str,
    pub remote_subnet: &'static str,
    pub kubelet: Kubelet,
}

impl Worker {
    pub async fn start(
        pod_cidr: &str,
        gateway: &'static str,
        host_type: &str,
        remote_subnet: &'static str,
    ) -> Self {
        let cluster = Cluster::start(pod_cidr, NS).await;
        let kubelet = Kubelet::start(cluster.client.clone());
        let gateways: Api<capstan_apis::networking::SliceGateway> =
            Api::namespaced(cluster.client.clone(), NS);
        let gw = serde_json::from_value(json!({
            "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
            "metadata": {"name": gateway, "namespace": NS},
            "spec": {"sliceName": SLICE}
        }))
        .expect("slicegateway");
        gateways
            .create(&PostParams::default(), &gw)
            .await
            .expect("SliceGateway created");
        let status = json!({"status": {"config": {
            "sliceName": SLICE, "sliceGatewayName": gateway, "sliceGatewayHostType": host_type,
            "sliceGatewayRemoteSubnet": remote_subnet
        }}});
        gateways
            .patch_status(gateway, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("SliceGateway status");
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
        let router = serde_json::from_value(json!({
            "metadata": {"name": "vl3-slice-router-red", "namespace": NS,
                         "labels": {"networkservicemesh.io/impl": "vl3-service-red"}},
            "spec": {"containers": [{"name": "kubeslice-router-sidecar", "image": "router"}]}
        }))
        .expect("router pod");
        pods.create(&PostParams::default(), &router)
            .await
            .expect("router pod created");
        Self {
            cluster,
            gateway,
            remote_subnet,
            kubelet,
        }
    }

    /// Spawns this worker's gw-recycler against `hub` and waits until it is ready.
    pub async fn spawn_recycler(&self, hub: &Cluster, extra: &[&str]) -> BinaryUnderTest {
        let mut args = vec![
            "--kubeconfig",
            self.cluster.kubeconfig_path(),
            "--hub-kubeconfig",
            hub.kubeconfig_path(),
            "--hub-namespace",
            HUB_NS,
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-level",
            "info,gw_recycler=debug",
        ];
        args.extend_from_slice(extra);
        let bin = BinaryUnderTest::spawn(BIN, &args)
            .await
            .expect("gw-recycler starts");
        wait_ready(&bin).await;
        bin
    }

    /// The router's next hops towards the remote subnet (empty: no route, or no router yet).
    pub fn next_hops(&self) -> BTreeSet<IpAddr> {
        let subnet = self.remote_subnet.parse().expect("cidr");
        self.kubelet
            .routers()
            .iter()
            .find_map(|r| r.routes().get(&subnet).cloned())
            .unwrap_or_default()
    }

    /// IPs of the Running pods of gateway deployment `deployment`.
    pub async fn pod_ips_of(&self, deployment: &str) -> BTreeSet<IpAddr> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.client.clone(), NS);
        let list = pods
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("kubeslice.io/slice-gw-dep={deployment}")),
            )
            .await
            .expect("pods");
        list.items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.status.as_ref()?.pod_ip.as_ref()?.parse().ok())
            .collect()
    }
}

/// Per pod uid: the stop signal of its sidecar and, for the router, its route table.
type Running = HashMap<String, (oneshot::Sender<()>, Option<Arc<MemoryRouter>>)>;

/// Plays kubelet for the sidecar containers: a router-sidecar for the slice router pod, a
/// gw-sidecar (memory backend, as the gateway template configures it: NSM IP = pod IP, tunnel
/// `tun0` UP) for each gateway pod, on `<podIP>:5000`, stopped when the pod goes.
pub struct Kubelet {
    running: Arc<Mutex<Running>>,
    /// Router pod uid -> its sidecar address.
    router_addrs: Arc<Mutex<HashMap<String, SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    fn start(client: kube::Client) -> Self {
        let running: Arc<Mutex<Running>> = Arc::default();
        let router_addrs: Arc<Mutex<HashMap<String, SocketAddr>>> = Arc::default();
        let state = running.clone();
        let addrs = router_addrs.clone();
        let task = tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client, NS);
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        Self::apply(&state, &addrs, &pod).await;
                    }
                    Ok(watcher::Event::Delete(pod)) => Self::stop(&state, &pod),
                    _ => {}
                }
            }
        });
        Self {
            running,
            router_addrs,
            task,
        }
    }

    fn key(pod: &Pod) -> String {
        pod.metadata.uid.clone().unwrap_or_default()
    }

    fn stop(state: &Mutex<Running>, pod: &Pod) {
        if let Some((stop, _)) = state.lock().expect("lock").remove(&Self::key(pod)) {
            let _ = stop.send(());
        }
    }

    async fn apply(
        state: &Mutex<Running>,
        router_addrs: &Mutex<HashMap<String, SocketAddr>>,
        pod: &Pod,
    ) {
        if pod.metadata.deletion_timestamp.is_some() {
            return Self::stop(state, pod);
        }
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            return;
        };
        if state.lock().expect("lock").contains_key(&Self::key(pod)) {
            return;
        }
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let addr: SocketAddr = format!("{ip}:5000").parse().expect("addr");
        let mut listener = None;
        for _ in 0..100 {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    listener = Some(l);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let listener = listener.expect("pod IP:5000 bindable");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let mut router = None;
        if labels.contains_key("networkservicemesh.io/impl") {
            let backend = Arc::new(MemoryRouter::new(Vec::new()));
            router = Some(backend.clone());
            serve_router(listener, backend, shutdown);
            router_addrs
                .lock()
                .expect("lock")
                .insert(Self::key(pod), addr);
        } else if labels.get("kubeslice.io/pod-type").map(String::as_str) == Some("slicegateway") {
            let backend = Arc::new(MemoryGw::new(MemoryGwStatus {
                nsm_ip: ip.clone(),
                tunnel: Some(MemoryTunnel {
                    net_interface: "tun0".into(),
                    ..MemoryTunnel::default()
                }),
            }));
            let identity = PodIdentity {
                node_ip: String::new(),
                pod_ip: ip.clone(),
                pod_name: pod.metadata.name.clone().unwrap_or_default(),
            };
            let service = GwSidecar::new(backend, identity, PeerConfig::default()).into_server();
            let metrics = GrpcMetrics::register(&mut Registry::default());
            tokio::spawn(sidecar_shim::server::serve(
                listener, service, metrics, None, shutdown,
            ));
        } else {
            return;
        }
        state
            .lock()
            .expect("lock")
            .insert(Self::key(pod), (stop, router));
    }

    /// Makes the router sidecar unreachable for `outage` (its route table survives, as in a
    /// network partition), then serves it again on the same address.
    pub async fn router_outage(&self, outage: Duration) {
        let (uid, router) = {
            let mut running = self.running.lock().expect("lock");
            let uid = running
                .iter()
                .find(|(_, (_, r))| r.is_some())
                .map(|(uid, _)| uid.clone())
                .expect("a router runs");
            let (stop, router) = running.remove(&uid).expect("router entry");
            let _ = stop.send(());
            (uid, router.expect("router backend"))
        };
        let addr = *self
            .router_addrs
            .lock()
            .expect("lock")
            .get(&uid)
            .expect("router addr");
        tokio::time::sleep(outage).await;
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let (stop, stopped) = oneshot::channel::<()>();
        serve_router(listener, router.clone(), async move {
            let _ = stopped.await;
        });
        self.running
            .lock()
            .expect("lock")
            .insert(uid, (stop, Some(router)));
    }

    /// The memory routers of the Running router pods.
    pub fn routers(&self) -> Vec<Arc<MemoryRouter>> {
        self.running
            .lock()
            .expect("lock")
            .values()
            .filter_map(|(_, r)| r.clone())
            .collect()
    }
}

fn serve_router(
    listener: tokio::net::TcpListener,
    backend: Arc<MemoryRouter>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let metrics = GrpcMetrics::register(&mut Registry::default());
    let service = RouterSidecar::new(backend).into_server();
    tokio::spawn(sidecar_shim::server::serve(
        listener, service, metrics, None, shutdown,
    ));
}

/// Polls `check` until it returns `Some`, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
