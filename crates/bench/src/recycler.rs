//! gw-recycler: one full recycle (drain delay 0) against the floor of its unavoidable API and gRPC
//! round trips, each measured in the same run on the same kube-sims and sidecars; and N gateway
//! pairs recycled at once against one. The real processes run: a hub and two worker kube-sims
//! whose kubelet runs the `router-sidecar` and `gw-sidecar` binaries on their pod IPs, and one
//! `gw-recycler` binary per worker (binaries, as the other suites: what a user runs, and immune to
//! the library's internals changing).
//!
//! The floor is the recycle's critical path, which runs through the client side (the server waits
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

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::{State, WorkerSliceGwRecycler};
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::WatchParams;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{Cluster, Controller};
use crate::report::Report;

#[derive(clap::Args)]
pub struct Args {
    /// Gateway pairs recycled at once (compared with one recycle).
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    /// Single recycles measured one after the other (their median is "one recycle").
    #[arg(long, default_value_t = 5)]
    singles: usize,
    /// Measurements of each round trip type of the floor (their median counts).
    #[arg(long, default_value_t = 7)]
    samples: usize,
    /// Gateway instances per SliceGateway (gw-recycler's `--gateway-instances`).
    #[arg(long, default_value_t = 2)]
    instances: u32,
}

/// The image the gateway template and the router pod name; the kubelet runs its commands from
/// the binaries folder.
const IMAGE: &str = "ghcr.io/capstan/capstan";
const HUB_NS: &str = "kubeslice-red";
const NS: &str = "kubeslice-system";
/// Where the floor's objects live: a namespace gw-recycler does not watch.
const FLOOR_NS: &str = "capstan-bench-floor";
const SLICE: &str = "red";
const TIMEOUT: Duration = Duration::from_secs(120);

/// One server/client SliceGateway pair and the current generation of each instance.
struct Pair {
    index: usize,
    generations: Vec<u32>,
}

impl Pair {
    fn server(&self) -> String {
        format!("{SLICE}-s{:02}", self.index)
    }
    fn client(&self) -> String {
        format!("{SLICE}-c{:02}", self.index)
    }
    fn deployment(gateway: &str, instance: u32, generation: u32) -> String {
        format!("{gateway}-{instance}-{generation}")
    }
}

pub async fn run(bin_dir: &Path, args: &Args) -> Result<Report> {
    let bin_dir = bin_dir
        .canonicalize()
        .with_context(|| format!("binaries folder {}", bin_dir.display()))?;
    for bin in ["gw-recycler", "gw-sidecar", "router-sidecar"] {
        if !bin_dir.join(bin).exists() {
            bail!(
                "{} missing (build it with cargo xtask bench recycler)",
                bin_dir.join(bin).display()
            );
        }
    }
    let scratch =
        std::env::temp_dir().join(format!("capstan-bench-recycler-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    // Pod IPs: two /16s of 127/8 per run, apart from those the tests use.
    let octet = 100 + (std::process::id() % 60) as u8 * 2;
    eprintln!(
        "recycler bench: {} single recycles, {} pairs at once, {} instances per gateway",
        args.singles, args.pairs, args.instances
    );
    let hub = start_cluster(&scratch, "hub", None, &bin_dir).await?;
    let server = start_cluster(&scratch, "server", Some(octet), &bin_dir).await?;
    let client = start_cluster(&scratch, "client", Some(octet + 1), &bin_dir).await?;
    let mut recyclers = Vec::new();
    for worker in [&server, &client] {
        recyclers.push(spawn_recycler(&bin_dir, worker, &hub, args.instances)?);
    }

    let mut pairs = vec![Pair {
        index: 0,
        generations: vec![0; args.instances as usize],
    }];
    add_gateways(&server, &client, &pairs).await?;
    wait_serving(&server, &client, &pairs, args.instances).await?;

    eprintln!(
        "recycler bench: floor round trips ({} samples each)",
        args.samples
    );
    let floor = Floor::measure(&hub, &client, args.samples).await?;

    let mut singles = Vec::new();
    for k in 0..args.singles.max(1) {
        let instance = (k % args.instances as usize) as u32;
        let took = recycle(&hub, &mut pairs[..], instance).await?;
        eprintln!("recycler bench: single recycle {}: {took:.2?}", k + 1);
        singles.push(took);
    }
    let one = median(singles.clone());

    eprintln!("recycler bench: {} more pairs", args.pairs);
    let mut many: Vec<Pair> = (1..=args.pairs)
        .map(|index| Pair {
            index,
            generations: vec![0; args.instances as usize],
        })
        .collect();
    add_gateways(&server, &client, &many).await?;
    wait_serving(&server, &client, &many, args.instances).await?;
    let concurrent = recycle(&hub, &mut many, 0).await?;
    eprintln!(
        "recycler bench: {} pairs at once: {concurrent:.2?}",
        args.pairs
    );
    for recycler in recyclers {
        recycler.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&scratch);

    let mut report = Report::new(format!(
        "gw-recycler, drain delay 0, {} gateway instances",
        args.instances
    ));
    report.ratio(
        "one recycle (median) vs its round trips",
        one,
        floor.sum(),
        "<= 2x",
    );
    report.ratio(
        &format!("{} pairs recycled at once vs one recycle", args.pairs),
        concurrent,
        one,
        "<= 3x",
    );
    report.row(
        "single recycles",
        format!("{}", singles.len()),
        format!(
            "each: {}",
            singles
                .iter()
                .map(|d| format!("{d:.2?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    for (part, count, took) in floor.parts() {
        report.row(
            format!("floor part: {part}"),
            format!("{took:?}"),
            format!("x{count} in the floor"),
        );
    }
    Ok(report)
}

/// A kube-sim with Capstan's CRDs and the bench's namespaces; a worker (with `octet`) also runs
/// workloads, the sidecar binaries as containers, and the slice router pod.
async fn start_cluster(
    scratch: &Path,
    name: &str,
    octet: Option<u8>,
    bin_dir: &Path,
) -> Result<Cluster> {
    let mut config = kube_sim::Config {
        history_size: 100_000,
        ..kube_sim::Config::default()
    };
    if let Some(octet) = octet {
        config.simulate_workloads = true;
        config.workloads.pod_cidr = format!("127.{octet}.0.0/16");
        config.kubelet.exec_images = vec![(IMAGE.to_string(), bin_dir.to_path_buf())];
    }
    let sim = kube_sim::KubeSim::start(config).await?;
    let client = sim.client()?;
    capstan_testkit::install_capstan_crds(&client).await?;
    let kubeconfig = scratch.join(format!("{name}.kubeconfig"));
    sim.write_kubeconfig(&kubeconfig)?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let own = if octet.is_some() { NS } else { HUB_NS };
    for ns in [own, FLOOR_NS] {
        namespaces
            .create(
                &PostParams::default(),
                &from_json(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    if octet.is_some() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let router = json!({
            "metadata": {"name": "vl3-slice-router-red", "namespace": NS,
                         "labels": {"networkservicemesh.io/impl": format!("vl3-service-{SLICE}")}},
            "spec": {"containers": [{
                "name": "kubeslice-router-sidecar", "image": format!("{IMAGE}:bench"),
                "command": ["router-sidecar"],
                "args": ["--backend", "memory", "--listen", "$(POD_IP):5000",
                         "--metrics-addr", "$(POD_IP):8080", "--log-level", "warn"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
            }]}
        });
        pods.create(&PostParams::default(), &from_json(router)?)
            .await?;
    }
    Ok(Cluster {
        sim,
        client,
        kubeconfig,
    })
}

fn spawn_recycler(
    bin_dir: &Path,
    worker: &Cluster,
    hub: &Cluster,
    instances: u32,
) -> Result<Controller> {
    let kubeconfig = worker.kubeconfig.to_string_lossy().into_owned();
    let hub_kubeconfig = hub.kubeconfig.to_string_lossy().into_owned();
    let instances = instances.to_string();
    Controller::spawn(
        &bin_dir.join("gw-recycler"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--hub-kubeconfig",
            &hub_kubeconfig,
            "--hub-namespace",
            HUB_NS,
            "--drain-delay",
            "0s",
            "--step-timeout",
            "2m",
            "--gateway-instances",
            &instances,
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ],
    )
}

/// Creates each pair's SliceGateways: the server one on `server`, the client one on `client`,
/// each with its own remote subnet.
async fn add_gateways(server: &Cluster, client: &Cluster, pairs: &[Pair]) -> Result<()> {
    for pair in pairs {
        for (cluster, name, host, octet) in [
            (server, pair.server(), "Server", 2),
            (client, pair.client(), "Client", 1),
        ] {
            let api: Api<SliceGateway> = Api::namespaced(cluster.client.clone(), NS);
            let gw = json!({
                "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
                "metadata": {"name": name, "namespace": NS}, "spec": {"sliceName": SLICE}
            });
            api.create(&PostParams::default(), &from_json(gw)?).await?;
            let status = json!({"status": {"config": {
                "sliceName": SLICE, "sliceGatewayName": name, "sliceGatewayHostType": host,
                "sliceGatewayRemoteSubnet": subnet(octet, pair.index)
            }}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
    }
    Ok(())
}

fn subnet(octet: u8, index: usize) -> String {
    format!("10.{octet}.{index}.0/24")
}

/// Waits until every instance of every gateway of `pairs` runs its current deployment and the
/// router routes the gateway's remote subnet via that pod.
async fn wait_serving(
    server: &Cluster,
    client: &Cluster,
    pairs: &[Pair],
    instances: u32,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    for (cluster, octet, server_side) in [(server, 2, true), (client, 1, false)] {
        let mut router: Option<SliceRouterSidecarServiceClient<Channel>> = None;
        let mut waiting: Vec<(String, String)> = pairs
            .iter()
            .flat_map(|pair| {
                let gateway = if server_side {
                    pair.server()
                } else {
                    pair.client()
                };
                (0..instances).map(move |i| {
                    (
                        Pair::deployment(&gateway, i, pair.generations[i as usize]),
                        subnet(octet, pair.index),
                    )
                })
            })
            .collect();
        while !waiting.is_empty() {
            if Instant::now() > deadline {
                bail!("gateways not serving after {TIMEOUT:?}: {waiting:?}");
            }
            let ips = running_pod_ips(cluster).await?;
            if router.is_none()
                && let Some(ip) = ips.get("router")
            {
                router = Some(SliceRouterSidecarServiceClient::new(channel(ip)?));
            }
            if let Some(router) = router.as_mut() {
                let mut still = Vec::new();
                for (deployment, subnet) in waiting {
                    let present = match ips.get(&deployment) {
                        Some(ip) => router
                            .get_route_in_kernel(VerifyRouteAddRequest {
                                nsm_ip: ip.clone(),
                                dst_ip: subnet.clone(),
                            })
                            .await
                            .is_ok_and(|r| r.into_inner().is_route_present),
                        None => false,
                    };
                    if !present {
                        still.push((deployment, subnet));
                    }
                }
                waiting = still;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// IPs of the Running pods in the gateway namespace: gateway pods by deployment, the router as
/// `router`.
async fn running_pod_ips(cluster: &Cluster) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let mut ips = BTreeMap::new();
    for pod in pods.list(&ListParams::default()).await? {
        let Some(ip) = running_ip(&pod) else { continue };
        let labels = pod.labels();
        let key = if labels.contains_key("networkservicemesh.io/impl") {
            "router".to_string()
        } else if let Some(deployment) = labels.get("kubeslice.io/slice-gw-dep") {
            deployment.clone()
        } else {
            continue;
        };
        ips.insert(key, ip);
    }
    Ok(ips)
}

fn running_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    (pod.metadata.deletion_timestamp.is_none() && status.phase.as_deref() == Some("Running"))
        .then(|| status.pod_ip.clone())
        .flatten()
}

/// Recycles `instance` of every pair at once (the CRs a trigger creates) and returns the time
/// from the first create until the last CR reads `end`.
async fn recycle(hub: &Cluster, pairs: &mut [Pair], instance: u32) -> Result<Duration> {
    let api: Api<WorkerSliceGwRecycler> = Api::namespaced(hub.client.clone(), HUB_NS);
    let mut crs = Vec::new();
    for pair in pairs.iter() {
        let generation = pair.generations[instance as usize];
        let server = Pair::deployment(&pair.server(), instance, generation);
        let client = Pair::deployment(&pair.client(), instance, generation);
        // A finished recycle of the same name (an earlier round) stays for --retention.
        match api.delete(&server, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        crs.push(from_json::<WorkerSliceGwRecycler>(json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": server, "namespace": HUB_NS,
                         "labels": {"slice_name": SLICE, "slicegw_name": pair.server()}},
            "spec": {"sliceGwServer": pair.server(), "sliceGwClient": pair.client(),
                     "gwPair": {"serverId": server, "clientId": client},
                     "state": "init", "request": "none", "sliceName": SLICE}
        }))?);
    }
    let names: HashSet<String> = crs.iter().map(|cr| cr.name_any()).collect();
    let ended = wait_ended(api.clone(), names);
    let create = PostParams::default();
    let started = Instant::now();
    futures::future::try_join_all(crs.iter().map(|cr| api.create(&create, cr))).await?;
    ended.await.context("recycle watch")??;
    let took = started.elapsed();
    for pair in pairs.iter_mut() {
        let generation = &mut pair.generations[instance as usize];
        *generation = 1 - *generation;
    }
    Ok(took)
}

/// Resolves when every CR of `names` reads `end`; fails on `error_state`.
fn wait_ended(
    api: Api<WorkerSliceGwRecycler>,
    mut names: HashSet<String>,
) -> tokio::task::JoinHandle<Result<()>> {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while !names.is_empty() {
            let next = tokio::time::timeout_at(deadline, events.next())
                .await
                .with_context(|| format!("recycles not ended after {TIMEOUT:?}: {names:?}"))?;
            let Some(cr) = next.transpose()? else {
                bail!("watch ended")
            };
            match cr.state() {
                State::End => {
                    names.remove(&cr.name_any());
                }
                State::Error => bail!(
                    "recycle {} ended in error_state: {:?}",
                    cr.name_any(),
                    cr.status
                ),
                _ => {}
            }
        }
        Ok(())
    })
}

/// The recycle's unavoidable round trips, each the median of its samples.
struct Floor {
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
    fn parts(&self) -> [(&'static str, u32, Duration); 9] {
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

    fn sum(&self) -> Duration {
        self.parts().iter().map(|(_, n, took)| *took * *n).sum()
    }

    /// Measures every part `samples` times on the client worker (and the hub), in a namespace
    /// gw-recycler does not watch, against the worker's real router sidecar.
    async fn measure(hub: &Cluster, worker: &Cluster, samples: usize) -> Result<Self> {
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
        let [a, b, c, d, e, f, g, h, i] = parts.map(median);
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

/// A lazily connected channel to a sidecar on `ip`, set up as gw-recycler's.
fn channel(ip: &str) -> Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{ip}:5000"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy())
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn from_json<K: DeserializeOwned>(value: Value) -> Result<K> {
    Ok(serde_json::from_value(value)?)
}
