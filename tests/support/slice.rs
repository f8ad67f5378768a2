//! A KubeSlice testbed for the gw-recycler scenarios: three kube-sims (hub, server worker, client
//! worker) with workload simulation and container execution (`--exec-images`), a SliceGateway and
//! a slice router pod running the real `router-sidecar` on each worker, the gateway pods the
//! recycler creates running the real `gw-sidecar`, each on its own loopback pod IP; and the real
//! `gw-recycler` binary per worker. Routers and gateways are asked over gRPC, as the recycler does.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_gw_recycler::trigger::TriggerArgs;
use capstan_proto::router::VerifyRouteAddRequest;
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_testkit::eventually;
use capstan_testkit::kubeslice::{self, SIDECAR_PORT};
use capstan_testkit::process::{BinaryUnderTest, http_get, http_put_json};
use capstan_testkit_sim::{SimCluster, wait_ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_sim::Config;
use kube_sim::faults::{ErrorRule, FaultConfig};
use kube_sim::kubelet::KubeletConfig;
use kube_sim::workloads::WorkloadOptions;
use tonic::transport::{Channel, Endpoint};

use crate::tools::binary;

pub const HUB_NS: &str = "kubeslice-red";
pub const NS: &str = "kubeslice-system";
pub const SLICE: &str = "red";
pub const SERVER_GW: &str = "red-a-b";
pub const CLIENT_GW: &str = "red-b-a";
/// Each worker's gateway deployments before a recycle of instance 0 and after it: the recycled
/// instance's deployment flips from `-0` to `-1`, the other instance keeps its own.
pub const SERVER_BEFORE: [&str; 2] = ["red-a-b-0-0", "red-a-b-1-0"];
pub const SERVER_AFTER: [&str; 2] = ["red-a-b-0-1", "red-a-b-1-0"];
pub const CLIENT_BEFORE: [&str; 2] = ["red-b-a-0-0", "red-b-a-1-0"];
pub const CLIENT_AFTER: [&str; 2] = ["red-b-a-0-1", "red-b-a-1-0"];
/// The image the gateway and router pods run (`--gateway-image`; tag ignored by kube-sim).
pub const IMAGE: &str = "capstan-e2e/capstan:test";
/// The slice router pod of each worker (the reference's label selects it).
pub const ROUTER_POD: &str = "vl3-slice-router-red";
/// How long a scenario waits for a condition that should come.
pub const WAIT: Duration = Duration::from_secs(60);

/// The directory holding the built `gw-sidecar` and `router-sidecar` (the "image" contents).
fn sidecar_dir() -> PathBuf {
    let gw = binary("sidecar-shim", "gw-sidecar");
    binary("sidecar-shim", "router-sidecar");
    gw.parent().expect("binary directory").to_path_buf()
}

/// The built `gw-recycler`.
pub fn recycler_binary() -> PathBuf {
    binary("gw-recycler", "gw-recycler")
}

/// kube-sim with workload simulation (pod IPs from `pod_cidr`), containers of [`IMAGE`] run
/// from `exec_dir`, every Capstan CRD, and `namespace`.
pub async fn start_cluster(pod_cidr: &str, namespace: &str, exec_dir: &Path) -> SimCluster {
    let cluster = SimCluster::start_with(Config {
        simulate_workloads: true,
        workloads: WorkloadOptions {
            pod_cidr: pod_cidr.into(),
            ..WorkloadOptions::default()
        },
        kubelet: KubeletConfig {
            exec_images: vec![(
                kube_sim::kubelet::image_name(IMAGE).to_owned(),
                exec_dir.to_path_buf(),
            )],
            restart_backoff: Duration::from_millis(200),
            max_restart_backoff: Duration::from_secs(1),
            ..KubeletConfig::default()
        },
        ..Config::default()
    })
    .await;
    cluster.create_namespaces(&[namespace]).await;
    cluster
}

/// Successful Deployment creations `cluster` has answered.
pub fn deployments_created(cluster: &SimCluster) -> u64 {
    cluster
        .sim
        .requests()
        .count_where(|k| k.verb == "create" && k.resource == "deployments" && k.code == 201)
}

/// A worker cluster with one SliceGateway of `host_type` and the slice router pod.
pub struct Worker {
    pub cluster: SimCluster,
    pub gateway: &'static str,
    pub remote_subnet: &'static str,
}

impl Worker {
    pub async fn start(
        pod_cidr: &str,
        exec_dir: &Path,
        gateway: &'static str,
        host_type: &str,
        remote_subnet: &'static str,
    ) -> Self {
        let cluster = start_cluster(pod_cidr, NS, exec_dir).await;
        kubeslice::create_slice_gateway(
            &cluster.client,
            NS,
            SLICE,
            gateway,
            host_type,
            remote_subnet,
        )
        .await
        .expect("SliceGateway created");
        let worker = Self {
            cluster,
            gateway,
            remote_subnet,
        };
        worker.create_router().await;
        worker
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.cluster.client.clone(), NS)
    }

    /// The slice router pod: `router-sidecar` (memory backend) on its pod IP:5000.
    pub async fn create_router(&self) {
        let mut router = kubeslice::slice_router_pod(NS, SLICE, IMAGE, &["--log-level", "info"]);
        if let Some(spec) = router.spec.as_mut() {
            // Deleted within the scenario's waits (the default is 30 s).
            spec.termination_grace_period_seconds = Some(2);
        }
        self.pods()
            .create(&PostParams::default(), &router)
            .await
            .expect("router pod created");
    }

    /// Deletes the router pod (kube-sim stops its process) and waits until it is gone.
    pub async fn delete_router(&self) {
        self.pods()
            .delete(ROUTER_POD, &DeleteParams::default())
            .await
            .expect("router pod deleted");
        eventually("the router pod gone", WAIT, || async {
            self.pods()
                .get_opt(ROUTER_POD)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// The router pod's IP while it runs.
    pub async fn router_ip(&self) -> Option<String> {
        let pod = self.pods().get_opt(ROUTER_POD).await.ok()??;
        if pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let status = pod.status?;
        (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
    }

    /// Asks the router sidecar (`GetRouteInKernel`) whether it routes the remote subnet via
    /// `nsm_ip`; `None` when the router does not answer.
    pub async fn routes_via(&self, nsm_ip: &str) -> Option<bool> {
        let router = self.router_ip().await?;
        route_present(&router, self.remote_subnet, nsm_ip).await
    }

    /// IPs of the live pods of gateway deployment `deployment`.
    pub async fn pod_ips_of(&self, deployment: &str) -> BTreeSet<String> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(&format!("kubeslice.io/slice-gw-dep={deployment}")))
            .await
            .expect("pods");
        list.items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .collect()
    }

    /// The NSM IPs the gateway sidecars of `deployment` report (`GetStatus`).
    pub async fn nsm_ips_of(&self, deployment: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for ip in self.pod_ips_of(deployment).await {
            if let Some(nsm) = gateway_nsm_ip(&ip).await {
                out.insert(nsm);
            }
        }
        out
    }

    /// Names of the Deployments not being deleted.
    pub async fn deployment_names(&self) -> BTreeSet<String> {
        let api: Api<Deployment> = Api::namespaced(self.cluster.client.clone(), NS);
        api.list(&ListParams::default())
            .await
            .expect("deployments")
            .items
            .into_iter()
            .filter(|d| d.metadata.deletion_timestamp.is_none())
            .filter_map(|d| d.metadata.name)
            .collect()
    }

    pub async fn intermediate(&self) -> Vec<String> {
        let api: Api<SliceGateway> = Api::namespaced(self.cluster.client.clone(), NS);
        api.get(self.gateway)
            .await
            .expect("gateway")
            .intermediate_deployments()
            .to_vec()
    }

    /// Waits until this worker runs exactly `deployments`, each gateway sidecar reports an NSM
    /// IP, and the router routes via exactly those NSM IPs among `also_absent` and theirs.
    pub async fn wait_steady(
        &self,
        deployments: &[&str],
        also_absent: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        let what = format!("{} serving via {deployments:?} only", self.gateway);
        let wanted: BTreeSet<String> = deployments.iter().map(|d| d.to_string()).collect();
        eventually(&what, WAIT, || async {
            if self.deployment_names().await != wanted {
                return None;
            }
            let mut nsm = BTreeSet::new();
            for d in deployments {
                let ips = self.nsm_ips_of(d).await;
                if ips.len() != 1 {
                    return None;
                }
                nsm.extend(ips);
            }
            for ip in &nsm {
                if self.routes_via(ip).await != Some(true) {
                    return None;
                }
            }
            for ip in also_absent.difference(&nsm) {
                if self.routes_via(ip).await != Some(false) {
                    return None;
                }
            }
            Some(nsm)
        })
        .await
    }

    /// Spawns this worker's gw-recycler against `hub` and waits until it is ready.
    pub async fn spawn_recycler(&self, hub: &SimCluster, extra: &[&str]) -> BinaryUnderTest {
        let mut args = vec![
            "--kubeconfig",
            self.cluster.kubeconfig_path(),
            "--hub-kubeconfig",
            hub.kubeconfig_path(),
            "--hub-namespace",
            HUB_NS,
            "--metrics-addr",
            "127.0.0.1:0",
            "--gateway-image",
            IMAGE,
            "--log-level",
            "info,gw_recycler=debug",
        ];
        args.extend_from_slice(extra);
        let bin = BinaryUnderTest::spawn(recycler_binary(), &args)
            .await
            .expect("gw-recycler starts");
        wait_ready(&bin).await;
        bin
    }
}

/// A channel to the sidecar on `ip`:5000, connected lazily and kept per address (reconnects by
/// itself when the sidecar restarts), so sampling a router costs one round trip.
fn sidecar_channel(ip: &str) -> Option<Channel> {
    static CHANNELS: OnceLock<Mutex<HashMap<String, Channel>>> = OnceLock::new();
    let mut channels = CHANNELS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(channel) = channels.get(ip) {
        return Some(channel.clone());
    }
    let channel = Endpoint::from_shared(format!("http://{ip}:{SIDECAR_PORT}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect_lazy();
    channels.insert(ip.to_owned(), channel.clone());
    Some(channel)
}

/// `GetRouteInKernel` on the router at `router_ip`; `None` when it does not answer.
pub async fn route_present(router_ip: &str, subnet: &str, nsm_ip: &str) -> Option<bool> {
    let reply = SliceRouterSidecarServiceClient::new(sidecar_channel(router_ip)?)
        .get_route_in_kernel(VerifyRouteAddRequest {
            nsm_ip: nsm_ip.to_owned(),
            dst_ip: subnet.to_owned(),
        })
        .await
        .ok()?;
    Some(reply.into_inner().is_route_present)
}

/// The NSM IP the gateway sidecar at `pod_ip` reports (`GetStatus`); `None` when it does not
/// answer or reports none.
pub async fn gateway_nsm_ip(pod_ip: &str) -> Option<String> {
    let status = GwSidecarServiceClient::new(sidecar_channel(pod_ip)?)
        .get_status(())
        .await
        .ok()?
        .into_inner();
    let nsm = status.nsm_intf_status?.nsm_ip;
    (!nsm.is_empty()).then_some(nsm)
}

/// Hub, server worker (gateway `red-a-b`, host type Server) and client worker (`red-b-a`).
pub struct Testbed {
    pub hub: SimCluster,
    pub server: Worker,
    pub client: Worker,
}

impl Testbed {
    /// `octet`: pod IPs come from 127.<octet>.0.0/16 and the next two, distinct per scenario so
    /// scenarios running at once never share a pod IP.
    pub async fn start(octet: u8) -> Self {
        let dir = sidecar_dir();
        let cidr = |n: u8| format!("127.{}.0.0/16", octet + n);
        Self {
            hub: start_cluster(&cidr(0), HUB_NS, &dir).await,
            server: Worker::start(&cidr(1), &dir, SERVER_GW, "Server", "10.2.0.0/16").await,
            client: Worker::start(&cidr(2), &dir, CLIENT_GW, "Client", "10.1.0.0/16").await,
        }
    }

    pub fn recyclers(&self) -> Api<WorkerSliceGwRecycler> {
        Api::namespaced(self.hub.client.clone(), HUB_NS)
    }

    /// The recycle of instance 0 (named after the old server deployment).
    pub async fn recycle(&self) -> Option<WorkerSliceGwRecycler> {
        self.recyclers().get_opt("red-a-b-0-0").await.ok()?
    }

    /// Waits until the recycle of instance 0 is in `state`.
    pub async fn wait_state(&self, state: &str) {
        let what = format!("the recycle in {state}");
        eventually(&what, WAIT, || async {
            (self.recycle().await?.state().as_str() == state).then_some(())
        })
        .await;
    }

    /// Waits until the client has answered `response` on the recycle of instance 0.
    pub async fn wait_response(&self, response: &str) {
        let what = format!("the client response {response}");
        eventually(&what, WAIT, || async {
            let cr = self.recycle().await?;
            (cr.response().map(|r| r.to_string()).as_deref() == Some(response)).then_some(())
        })
        .await;
    }

    /// Runs `gw-recycler trigger` for the pair with `extra` arguments.
    pub async fn trigger(&self, extra: &[&str]) -> std::process::Output {
        let args = TriggerArgs::new(
            self.hub.kubeconfig_path(),
            HUB_NS,
            SLICE,
            SERVER_GW,
            CLIENT_GW,
        )
        .to_args();
        let run = tokio::process::Command::new(recycler_binary())
            .args(&args)
            .args(extra)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true)
            .output();
        tokio::time::timeout(WAIT * 2, run)
            .await
            .expect("trigger finishes in time")
            .expect("trigger runs")
    }
}

/// Hub writes of one side of the recycler pair fail (500) while this is the hub's fault config:
/// the server writes the CR itself (`workerslicegwrecyclers`), the client its status.
pub fn block_writes(resource: &str) -> FaultConfig {
    FaultConfig {
        errors: vec![ErrorRule {
            verbs: vec!["patch".into(), "update".into()],
            resources: vec![resource.into()],
            rate: 1.0,
            code: 500,
            retry_after_seconds: 1,
        }],
        ..FaultConfig::default()
    }
}

/// The server's CR writes (spec.state / spec.request).
pub const SERVER_WRITES: &str = "workerslicegwrecyclers";
/// The client's CR writes (status.client.response).
pub const CLIENT_WRITES: &str = "workerslicegwrecyclers/status";

/// Hub writes to `resource` (as in [`block_writes`]) that failed so far.
pub fn failed_writes(hub: &SimCluster, resource: &str) -> u64 {
    let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
    hub.sim.requests().count_where(|k| {
        (k.verb == "patch" || k.verb == "update")
            && k.resource == res
            && k.subresource == sub
            && k.code == 500
    })
}

/// The nodes of the Running gateway pods of SliceGateway `gateway` in `namespace` (`--rebalance`
/// counts them per node).
pub async fn gateway_pod_nodes(
    client: &kube::Client,
    namespace: &str,
    gateway: &str,
) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&format!("kubeslice.io/slice-gw={gateway}"));
    let list = pods.list(&lp).await.expect("pods");
    list.items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect()
}

/// The label `--rebalance` counts usable gateway nodes by.
const GATEWAY_NODE_LABEL: (&str, &str) = ("kubeslice.io/node-type", "gateway");

/// Labels the existing Node `name` a gateway node.
pub async fn label_gateway_node(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let (key, value) = GATEWAY_NODE_LABEL;
    let label = serde_json::json!({"metadata": {"labels": {key: value}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("node labelled");
}

/// Creates Node `name`, labelled a gateway node.
pub async fn add_gateway_node(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let (key, value) = GATEWAY_NODE_LABEL;
    let node: Node = serde_json::from_value(
        serde_json::json!({"metadata": {"name": name, "labels": {key: value}}}),
    )
    .expect("node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("gateway node created");
}

/// The WorkerSliceGwRecycler CRD's schema as kubeslice-controller ships it
/// (`config/crd/bases/worker.kubeslice.io_workerslicegwrecyclers.yaml`): the reference's fields
/// only, no `status.conditions`, no printer columns, so the hub prunes everything else.
fn kubeslice_controller_recycler_schema() -> serde_json::Value {
    let string = || serde_json::json!({"type": "string"});
    let strings = || serde_json::json!({"type": "array", "items": {"type": "string"}});
    serde_json::json!({
        "type": "object",
        "properties": {
            "apiVersion": string(),
            "kind": string(),
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {
                "gwPair": {"type": "object", "properties": {
                    "clientId": string(), "serverId": string()
                }},
                "request": string(),
                "sliceGwClient": string(),
                "sliceGwServer": string(),
                "sliceName": string(),
                "state": string()
            }},
            "status": {"type": "object", "properties": {
                "client": {"type": "object", "properties": {
                    "recycledClient": string(), "response": string()
                }},
                "recycledServers": strings(),
                "serversToRecycle": strings()
            }}
        }
    })
}

/// Replaces the hub's WorkerSliceGwRecycler CRD with kubeslice-controller's (see
/// [`kubeslice_controller_recycler_schema`]): the hub a real KubeSlice install has.
pub async fn use_kubeslice_controller_crd(hub: &SimCluster) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(hub.client.clone());
    let name = "workerslicegwrecyclers.worker.kubeslice.io";
    let mut crd = api.get(name).await.expect("the recycler CRD");
    for version in &mut crd.spec.versions {
        version.schema = Some(
            serde_json::from_value(serde_json::json!({
                "openAPIV3Schema": kubeslice_controller_recycler_schema()
            }))
            .expect("schema"),
        );
        version.additional_printer_columns = None;
    }
    api.replace(name, &PostParams::default(), &crd)
        .await
        .expect("kubeslice-controller's CRD replaces Capstan's");
}

/// The memory gw-sidecar's admin route for its reported status (on the pod IP's admin port).
const STATUS_PATH: &str = "/memory/gw/status";
pub const SIDECAR_ADMIN_PORT: u16 = 8080;

/// Edits the status the memory gw-sidecar at `pod_ip` reports (`GET`, change, `PUT`).
pub async fn edit_sidecar_status(pod_ip: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let admin: SocketAddr = format!("{pod_ip}:{SIDECAR_ADMIN_PORT}")
        .parse()
        .expect("admin address");
    let current = http_get(admin, STATUS_PATH).await.expect("sidecar status");
    assert_eq!(current.status, 200, "{}", current.body);
    let mut status: serde_json::Value = serde_json::from_str(&current.body).expect("status json");
    edit(&mut status);
    let put = http_put_json(admin, STATUS_PATH, &status)
        .await
        .expect("status replaced");
    assert_eq!(put.status, 200, "{}", put.body);
}

/// Sets the `down` flag of the tunnel the memory gw-sidecar at `pod_ip` reports.
pub async fn set_tunnel_down(pod_ip: &str, down: bool) {
    edit_sidecar_status(pod_ip, |status| {
        status["tunnel"]["down"] = serde_json::Value::Bool(down);
    })
    .await;
}

/// The Events in the hub's project namespace (where gw-recycler announces a recycle's steps).
pub async fn events_on_hub(hub: &SimCluster) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(hub.client.clone(), HUB_NS);
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
}

/// How many times the hub's Events announced `reason`: an Event repeated by the kube recorder
/// is one object with a series count.
pub async fn announced(hub: &SimCluster, reason: &str) -> i32 {
    events_on_hub(hub)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// Plays the VPN: the tunnel of the memory gw-sidecar at `pod_ip` reaches the gateway pod at
/// `peer_ip` (reported as the tunnel's peer, and where `GetSliceGwRemotePodName` asks).
pub async fn set_tunnel_peer(pod_ip: &str, peer_ip: &str) {
    edit_sidecar_status(pod_ip, |status| {
        let peer = serde_json::Value::String(peer_ip.to_owned());
        status["tunnel"]["peerIP"] = peer.clone();
        status["peerAddress"] = peer;
    })
    .await;
}

/// The name and IP of the one live pod of gateway deployment `deployment` in [`NS`], once it has
/// an IP.
pub async fn gateway_pod(client: &kube::Client, deployment: &str) -> Option<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().labels(&format!("kubeslice.io/slice-gw-dep={deployment}")))
        .await
        .ok()?;
    let live: Vec<_> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    match live.as_slice() {
        [pod] => Some((
            pod.metadata.name.clone()?,
            pod.status.as_ref()?.pod_ip.clone()?,
        )),
        _ => None,
    }
}

/// Gives the server worker's SliceGateway its peer gateway and remote VPN IP, as
/// kubeslice-controller configures them (rebalancing names the client gateway, and its gateway
/// sidecars are asked their peers at that IP; memory sidecars answer through the peer addresses
/// [`pair_gateways`] sets instead).
pub async fn configure_remote(server: &kube::Client) {
    let gateways: Api<SliceGateway> = Api::namespaced(server.clone(), NS);
    let remote = serde_json::json!({"status": {"config": {
        "sliceGatewayRemoteGatewayId": CLIENT_GW,
        "sliceGatewayRemoteVpnIp": "10.0.0.2",
    }}});
    gateways
        .patch_status(SERVER_GW, &PatchParams::default(), &Patch::Merge(&remote))
        .await
        .expect("remote gateway id and VPN IP");
}

/// Plays the VPN between two workers: for each `(server deployment, client deployment)`, the
/// server pod's tunnel reaches that client pod. Returns the pods' names, pair by pair.
pub async fn pair_gateways(
    server: &kube::Client,
    client: &kube::Client,
    pairs: &[(&str, &str)],
) -> Vec<(String, String)> {
    let pod = |cluster: &kube::Client, deployment: &str| {
        let (cluster, deployment) = (cluster.clone(), deployment.to_owned());
        async move {
            eventually(&format!("the pod of {deployment}"), WAIT, || {
                gateway_pod(&cluster, &deployment)
            })
            .await
        }
    };
    let mut names = Vec::new();
    for (server_dep, client_dep) in pairs {
        let (server_pod, server_ip) = pod(server, server_dep).await;
        let (client_pod, client_ip) = pod(client, client_dep).await;
        set_tunnel_peer(&server_ip, &client_ip).await;
        names.push((server_pod, client_pod));
    }
    names
}

/// Makes the memory gw-sidecar at `pod_ip` fail `GetStatus` with UNAVAILABLE (or answer again).
pub async fn set_unavailable(pod_ip: &str, unavailable: bool) {
    edit_sidecar_status(pod_ip, |status| {
        status["unavailable"] = serde_json::Value::Bool(unavailable);
    })
    .await;
}
