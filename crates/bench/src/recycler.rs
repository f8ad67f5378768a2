//! gw-recycler: one full recycle (drain delay 0) against the floor of its unavoidable API and gRPC
//! round trips, each measured in the same run on the same kube-sims and sidecars; and N gateway
//! pairs recycled at once against one. The real processes run: a hub and two worker kube-sims
//! whose kubelet runs the `router-sidecar` and `gw-sidecar` binaries on their pod IPs, and one
//! `gw-recycler` binary per worker (binaries, as the other suites: what a user runs, and immune to
//! the library's internals changing).
//!
//! The floor, the recycle's unavoidable round trips each measured in the same run, is in [`floor`].

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::worker::{State, WorkerSliceGwRecycler};
use capstan_proto::router::VerifyRouteAddRequest;
use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_testkit::kubeslice;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint};

mod floor;

use kube_sim::accounting::RequestStats;

use crate::cluster::{Cluster, Controller, MachineCpu, bench_config, by_verb, of_client};
use crate::programs::{self, ProgramCpu};
use crate::report::{Report, median};
use floor::Floor;

#[derive(clap::Args)]
pub struct Args {
    /// Gateway pairs recycled at once (compared with one recycle).
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    /// Single recycles measured one after the other (their median is "one recycle"). Nine: one
    /// recycle takes 35 to 60 ms from run to run on a 2-core machine, and each costs only that.
    #[arg(long, default_value_t = 9)]
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
/// The client name gw-recycler's requests carry (its User-Agent's product).
const RECYCLER_AGENT: &str = "gw-recycler";
/// gw-recycler's binary, and the program name its processes have.
const RECYCLER_BIN: &str = "gw-recycler";

/// Where the floor's objects live: a namespace gw-recycler does not watch.
const FLOOR_NS: &str = "capstan-bench-floor";
const SLICE: &str = "red";
const TIMEOUT: Duration = Duration::from_secs(120);
/// gw-recycler's own CPU per recycle, both processes: half of what it was at 4922afb.
const RECYCLER_CPU_TARGET_MS: f64 = 7.0;

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
    for bin in [RECYCLER_BIN, "gw-sidecar", "router-sidecar"] {
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

    let clusters = [&hub, &server, &client];
    let mut made = RequestStats::default();
    let (mut singles, mut single_cpu) = (Vec::new(), Vec::new());
    let mut singles_by_program: BTreeMap<String, Duration> = BTreeMap::new();
    for k in 0..args.singles.max(1) {
        let instance = (k % args.instances as usize) as u32;
        let before = snapshot(&clusters);
        let took = recycle(&hub, &mut pairs[..], instance).await?;
        add_recycler_requests(&mut made, &clusters, &before);
        eprintln!(
            "recycler bench: single recycle {}: {:.2?}, {} ms of CPU",
            k + 1,
            took.wall,
            took.cpu.as_millis()
        );
        singles.push(took.wall);
        single_cpu.push(took.cpu);
        for (program, cpu) in took.by_program {
            *singles_by_program.entry(program).or_default() += cpu;
        }
    }
    let (one, one_cpu) = (median(&singles), median(&single_cpu));

    eprintln!("recycler bench: {} more pairs", args.pairs);
    let mut many: Vec<Pair> = (1..=args.pairs)
        .map(|index| Pair {
            index,
            generations: vec![0; args.instances as usize],
        })
        .collect();
    add_gateways(&server, &client, &many).await?;
    wait_serving(&server, &client, &many, args.instances).await?;
    let before = snapshot(&clusters);
    let Recycled {
        wall: concurrent,
        cpu: concurrent_cpu,
        by_program: concurrent_by_program,
    } = recycle(&hub, &mut many, 0).await?;
    add_recycler_requests(&mut made, &clusters, &before);
    eprintln!(
        "recycler bench: {} pairs at once: {concurrent:.2?}, {} ms of CPU",
        args.pairs,
        concurrent_cpu.as_millis()
    );
    for recycler in recyclers {
        recycler.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("recycler bench: {GATEWAY_STARTS} gateway process starts");
    let gateway_start = gateway_start_cpu(&bin_dir, GATEWAY_STARTS).await?;

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
    // What the machine allows: N recycles need N times one recycle's CPU, spread over its cores.
    // Near 1x, N at once is bound by CPU alone (nothing waits on anything but a core).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu_bound = one_cpu * u32::try_from(args.pairs).unwrap_or(u32::MAX) / cores as u32;
    report.ratio(
        &format!("{} pairs at once vs their CPU bound", args.pairs),
        concurrent,
        cpu_bound,
        "<= 1.3x",
    );
    if let Some(row) = report.rows.last_mut() {
        row.note = format!(
            "bound: {} x one recycle's CPU over {cores} cores; near 1x nothing waits but for a core",
            args.pairs
        );
    }
    // The part of N recycles no API server or controller work can remove: each recycle starts
    // a gateway pod on both workers, a gw-sidecar process each. Their CPU alone, over the cores,
    // against the time the "N at once <= 3x one" target allows: at 1x or more the target cannot
    // be met on this machine even if everything else cost nothing.
    report.row(
        "gw-sidecar process start and stop, CPU",
        format!("{:.2} ms", gateway_start.as_secs_f64() * 1e3),
        format!(
            "median of {GATEWAY_STARTS} starts of the gateway binary as its pod template runs it, \
             to its listening line and SIGTERM; the processes' own user + system time"
        ),
    );
    let starts = gateway_start * u32::try_from(2 * args.pairs).unwrap_or(u32::MAX) / cores as u32;
    report.ratio(
        &format!(
            "{} pairs' gateway starts alone vs the time 3x one recycle allows",
            args.pairs
        ),
        starts,
        one * 3,
        "-",
    );
    if let Some(row) = report.rows.last_mut() {
        row.note = format!(
            "{} gw-sidecar processes over {cores} cores; 1x or more: the 3x target is out of \
             this machine's reach",
            2 * args.pairs
        );
    }
    report.row(
        "CPU per recycle, every process (one alone)",
        format!("{:.1} ms", one_cpu.as_secs_f64() * 1e3),
        format!(
            "median of the singles; machine-wide busy time (/proc/stat, steal left out), {:.2} cores busy",
            one_cpu.as_secs_f64() / one.as_secs_f64()
        ),
    );
    report.row(
        format!("CPU per recycle, every process ({} at once)", args.pairs),
        format!(
            "{:.1} ms",
            concurrent_cpu.as_secs_f64() * 1e3 / args.pairs.max(1) as f64
        ),
        format!(
            "{:.2} of {cores} cores busy while they ran",
            concurrent_cpu.as_secs_f64() / concurrent.as_secs_f64()
        ),
    );
    // Who spends it. The programs other than gw-recycler are the simulated clusters (kube-sims,
    // kubelets, workload simulation) and the pods' processes: what N recycles cost this machine
    // whatever gw-recycler does. Over the cores, against the time "N at once <= 3x one" allows:
    // at 1x or more no gw-recycler can meet that target here.
    let singles_count = singles.len();
    report.row(
        "CPU per recycle by program (one alone, mean)",
        format!(
            "{:.1} ms",
            total(&singles_by_program).as_secs_f64() * 1e3 / singles_count as f64
        ),
        programs::summary(&singles_by_program, singles_count),
    );
    report.row(
        format!("CPU per recycle by program ({} at once)", args.pairs),
        format!(
            "{:.1} ms",
            total(&concurrent_by_program).as_secs_f64() * 1e3 / args.pairs.max(1) as f64
        ),
        programs::summary(&concurrent_by_program, args.pairs),
    );
    // gw-recycler's own share, both sides' processes: what this repository can make cheaper.
    let recycler_cpu = |by_program: &BTreeMap<String, Duration>, recycles: usize| {
        let cpu = by_program.get(RECYCLER_BIN).copied().unwrap_or_default();
        cpu.as_secs_f64() * 1e3 / recycles.max(1) as f64
    };
    report.row(
        "gw-recycler CPU per recycle, both sides (one alone, mean)",
        format!("{:.1} ms", recycler_cpu(&singles_by_program, singles_count)),
        format!("target <= {RECYCLER_CPU_TARGET_MS} ms: half of the ~14 ms measured at 4922afb (issue 38)"),
    );
    report.row(
        format!(
            "gw-recycler CPU per recycle, both sides ({} at once)",
            args.pairs
        ),
        format!("{:.1} ms", recycler_cpu(&concurrent_by_program, args.pairs)),
        format!("target <= {RECYCLER_CPU_TARGET_MS} ms"),
    );
    let others = total(&concurrent_by_program).saturating_sub(
        concurrent_by_program
            .get(RECYCLER_BIN)
            .copied()
            .unwrap_or_default(),
    );
    report.ratio(
        &format!(
            "{} pairs' CPU outside gw-recycler vs the time 3x one recycle allows",
            args.pairs
        ),
        others / cores as u32,
        one * 3,
        "-",
    );
    if let Some(row) = report.rows.last_mut() {
        row.note = format!(
            "every program but gw-recycler, over {cores} cores; 1x or more: the 3x target is \
             out of this machine's reach whatever gw-recycler does"
        );
    }
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
    let recycles = (singles.len() + args.pairs) as f64;
    let failed = made.count_where(|k| k.code >= 400);
    let per_recycle: Vec<String> = made
        .by_verb_resource_code()
        .into_iter()
        .map(|(what, n)| format!("{what} {:.1}", n as f64 / recycles))
        .collect();
    report.row(
        "gw-recycler API requests per recycle",
        format!("{:.1}", made.total() as f64 / recycles),
        format!(
            "both sides, all three clusters: {} in all; per recycle by verb, resource and code: {}",
            by_verb(&made),
            per_recycle.join(", ")
        ),
    );
    let failures = made
        .by_verb_resource_code()
        .into_iter()
        .filter(|(what, _)| what.rsplit(' ').next().is_some_and(|code| code >= "400"))
        .map(|(what, n)| format!("{what} x{n}"))
        .collect::<Vec<_>>();
    report.row(
        "gw-recycler failed API requests per recycle",
        format!("{:.2}", failed as f64 / recycles),
        if failures.is_empty() {
            "none".to_string()
        } else {
            failures.join(", ")
        },
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

fn total(by_program: &BTreeMap<String, Duration>) -> Duration {
    by_program.values().sum()
}

/// Every cluster's request counters now.
fn snapshot(clusters: &[&Cluster]) -> Vec<RequestStats> {
    clusters.iter().map(|c| c.sim.requests()).collect()
}

/// Adds gw-recycler's requests to `clusters` since `before` to `made`.
fn add_recycler_requests(made: &mut RequestStats, clusters: &[&Cluster], before: &[RequestStats]) {
    for (cluster, before) in clusters.iter().zip(before) {
        let since = of_client(&cluster.sim.requests().since(before), RECYCLER_AGENT);
        for (key, n) in since.counts {
            *made.counts.entry(key).or_default() += n;
        }
    }
}

/// A kube-sim with Capstan's CRDs and the bench's namespaces; a worker (with `octet`) also runs
/// workloads, the sidecar binaries as containers, and the slice router pod.
async fn start_cluster(
    scratch: &Path,
    name: &str,
    octet: Option<u8>,
    bin_dir: &Path,
) -> Result<Cluster> {
    let mut config = bench_config();
    if let Some(octet) = octet {
        config.simulate_workloads = true;
        config.workloads.pod_cidr = format!("127.{octet}.0.0/16");
        config.kubelet.exec_images = vec![(IMAGE.to_string(), bin_dir.to_path_buf())];
    }
    let cluster = Cluster::start_with(scratch, name, config).await?;
    let client = cluster.client.clone();
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
        let image = format!("{IMAGE}:bench");
        let router = kubeslice::slice_router_pod(NS, SLICE, &image, &["--log-level", "warn"]);
        pods.create(&PostParams::default(), &router).await?;
    }
    Ok(cluster)
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
        &bin_dir.join(RECYCLER_BIN),
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
            let subnet = subnet(octet, pair.index);
            kubeslice::create_slice_gateway(&cluster.client, NS, SLICE, &name, host, &subnet)
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

/// One round of recycles: the time from the first create until the last CR reads `end`, and the
/// CPU every process of the machine spent meanwhile.
struct Recycled {
    wall: Duration,
    cpu: Duration,
    /// The same time split by program (see [`ProgramCpu`]).
    by_program: BTreeMap<String, Duration>,
}

/// Recycles `instance` of every pair at once (the CRs a trigger creates).
async fn recycle(hub: &Cluster, pairs: &mut [Pair], instance: u32) -> Result<Recycled> {
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
    let programs_before = ProgramCpu::now().await?;
    let (started, cpu_before) = (Instant::now(), MachineCpu::now()?);
    futures::future::try_join_all(crs.iter().map(|cr| api.create(&create, cr))).await?;
    let timelines = ended.await.context("recycle watch")??;
    let took = Recycled {
        wall: started.elapsed(),
        cpu: MachineCpu::now()?.since(&cpu_before).busy,
        by_program: ProgramCpu::now().await?.since(&programs_before),
    };
    eprintln!("recycler bench: {}", Timeline::summary(&timelines, started));
    for pair in pairs.iter_mut() {
        let generation = &mut pair.generations[instance as usize];
        *generation = 1 - *generation;
    }
    Ok(took)
}

/// gw-sidecar starts measured for the CPU of one gateway process.
const GATEWAY_STARTS: usize = 15;

/// The median CPU (user + system) one gw-sidecar process takes from exec to serving and then to
/// its exit on SIGTERM: what a gateway pod's container costs the machine whatever else a recycle
/// does. Run with the gateway template's backend and arguments, on loopback.
async fn gateway_start_cpu(bin_dir: &Path, starts: usize) -> Result<Duration> {
    use nix::sys::resource::UsageWho;
    use tokio::io::{AsyncBufReadExt, BufReader};
    // Only the reaped children count: the gw-sidecar processes reaped here (the bench's other
    // children, gw-recycler and the pods, have exited or still run; none is reaped meanwhile).
    let children_cpu = || programs::usage(UsageWho::RUSAGE_CHILDREN);
    let mut samples = Vec::new();
    for _ in 0..starts.max(1) {
        let before = children_cpu()?;
        let mut child = tokio::process::Command::new(bin_dir.join("gw-sidecar"))
            .args(["--backend", "memory", "--listen", "127.0.0.1:0"])
            .args(["--metrics-addr", "127.0.0.1:0", "--nsm-ip", "127.0.0.1"])
            .args(["--tunnel-interface", "tun0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting gw-sidecar")?;
        let stdout = child.stdout.take().context("gw-sidecar's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let listening = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await? {
                if line.contains("grpc server listening") {
                    return Ok(());
                }
            }
            bail!("gw-sidecar exited before it listened")
        })
        .await
        .context("gw-sidecar did not listen within 10 s")?;
        listening?;
        let pid = child.id().context("gw-sidecar's pid")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        child.wait().await?;
        samples.push(children_cpu()?.saturating_sub(before));
    }
    Ok(median(&samples))
}

/// When one recycle's CR was first seen in each state and with each client response, so the
/// bench can say which step the time went to.
#[derive(Default)]
struct Timeline {
    steps: Vec<(String, Instant)>,
}

impl Timeline {
    fn see(&mut self, cr: &WorkerSliceGwRecycler, at: Instant) {
        let response = cr.response().map(|r| format!("client {r}"));
        for step in std::iter::once(cr.state().to_string()).chain(response) {
            if !self.steps.iter().any(|(s, _)| *s == step) {
                self.steps.push((step, at));
            }
        }
    }

    /// Per step (in the order first seen), the median and the slowest time from the start of
    /// the recycle(s) until the step was seen.
    fn summary(timelines: &[Timeline], started: Instant) -> String {
        let mut order: Vec<&str> = Vec::new();
        for t in timelines {
            for (step, _) in &t.steps {
                if !order.contains(&step.as_str()) {
                    order.push(step);
                }
            }
        }
        let parts: Vec<String> = order
            .iter()
            .map(|step| {
                let seen: Vec<Duration> = timelines
                    .iter()
                    .filter_map(|t| t.steps.iter().find(|(s, _)| s == step))
                    .map(|(_, at)| at.saturating_duration_since(started))
                    .collect();
                let slowest = seen.iter().max().copied().unwrap_or_default();
                format!("{step} {:.0?}/{slowest:.0?}", median(&seen))
            })
            .collect();
        format!("steps seen at (median/slowest): {}", parts.join(", "))
    }
}

/// Resolves when every CR of `names` reads `end` with the timeline of each; fails on
/// `error_state`.
fn wait_ended(
    api: Api<WorkerSliceGwRecycler>,
    mut names: HashSet<String>,
) -> tokio::task::JoinHandle<Result<Vec<Timeline>>> {
    tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut timelines: BTreeMap<String, Timeline> = BTreeMap::new();
        while !names.is_empty() {
            let next = tokio::time::timeout_at(deadline, events.next())
                .await
                .with_context(|| format!("recycles not ended after {TIMEOUT:?}: {names:?}"))?;
            let Some(cr) = next.transpose()? else {
                bail!("watch ended")
            };
            if names.contains(&cr.name_any()) {
                timelines
                    .entry(cr.name_any())
                    .or_default()
                    .see(&cr, Instant::now());
            }
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
        Ok(timelines.into_values().collect())
    })
}

/// A lazily connected channel to a sidecar on `ip`, set up as gw-recycler's.
fn channel(ip: &str) -> Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{ip}:5000"))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy())
}

fn from_json<K: DeserializeOwned>(value: Value) -> Result<K> {
    Ok(serde_json::from_value(value)?)
}
